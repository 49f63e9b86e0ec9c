//! Every statement the PostgreSQL store runs on its pool and its publishing
//! connection, each with the struct of its parameters (see `sql.rs`; the migrations'
//! own are in `migrate.rs`). Tables: ARCHITECTURE.md "PostgreSQL schema".

use super::sql::statements;

/// The fence of a write from an in-flight call: route `$route_id` still exists and names
/// a seat whose lease is live (a takeover deletes the route; a new epoch or a lapsed
/// lease leaves it naming a dead seat). Part of `update_read` and `update_write`, each
/// of which declares `route_id` among its own parameters.
macro_rules! fence {
    () => {
        "EXISTS (SELECT 1 FROM request_routes rr JOIN replicas p
            ON p.replica_id = rr.replica_id AND p.epoch = rr.epoch
            WHERE rr.route_id = $route_id AND p.lease_until > now())"
    };
}

/// The tenant's live tasks, as `live_tasks` counts them: a CTE of the creations that
/// take a quota (`max_live`), each declaring `tenant` and `max_live`.
macro_rules! live_cte {
    () => {
        "live AS (SELECT count(*) AS n FROM task_routes
            WHERE tenant = $tenant AND status IN ('working', 'input_required'))"
    };
}

/// A creation's condition: no quota, or the tenant under it.
macro_rules! within_quota {
    () => {
        "($max_live::bigint IS NULL OR (SELECT n FROM live) < $max_live)"
    };
}

/// The count the quota was checked against (NULL without one), as column `live`.
macro_rules! live_count {
    () => {
        "CASE WHEN $max_live::bigint IS NULL THEN NULL ELSE (SELECT n FROM live) END AS live"
    };
}

statements! {
    /// The store's statements, numbered once when the store is built.
    pub(super) struct Statements;

    // Tasks.

    /// A creation with an idempotency key, in one statement: claim the key, insert the
    /// task, insert its request route; or, if the key is taken, the entry holding it.
    /// With `max_live`, only while the tenant has fewer live tasks (the count is run
    /// only then: `OR` and `CASE` stop at a NULL `max_live`, and `live` is a CTE
    /// evaluated on its first read).
    create_keyed: CreateKeyed<'a> {
        key: &'a [u8],
        task_id: &'a str,
        args_fingerprint: &'a str,
        tenant: &'a str,
        subject: &'a str,
        status: &'a str,
        expires_at_ms: i64,
        record: &'a [u8],
        route_id: &'a str,
        route_task_id: Option<&'a str>,
        upstream: &'a str,
        route_record: &'a [u8],
        replica_id: Option<&'a str>,
        epoch: Option<i64>,
        task_upstream: &'a str,
        created_at_ms: i64,
        max_live: Option<i64>,
    } = concat!("
WITH ", live_cte!(), ", claim AS (
    INSERT INTO idempotency (key, task_id, args_fingerprint)
    SELECT $key, $task_id, $args_fingerprint WHERE ", within_quota!(), "
    ON CONFLICT (key) DO NOTHING
    RETURNING task_id
), task AS (
    INSERT INTO task_routes (task_id, tenant, subject, status, expires_at_ms, idem_key, version, record,
        upstream, created_at_ms)
    SELECT $task_id, $tenant, $subject, $status, $expires_at_ms, $key, 1, $record,
        $task_upstream, $created_at_ms FROM claim
    RETURNING task_id
), route AS (
    INSERT INTO request_routes (route_id, task_id, upstream, replica_id, epoch, version, record)
    SELECT $route_id, $route_task_id, $upstream, $replica_id, $epoch, 1, $route_record FROM task
    RETURNING route_id
)
SELECT (SELECT count(*) FROM route) AS created, i.task_id, i.args_fingerprint, ", live_count!(), "
FROM (SELECT 1) AS one LEFT JOIN idempotency AS i ON i.key = $key");

    /// A creation without an idempotency key: the task and its request route; with
    /// `max_live`, only while the tenant has fewer live tasks (as `create_keyed`).
    create_plain: CreatePlain<'a> {
        task_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
        status: &'a str,
        expires_at_ms: i64,
        record: &'a [u8],
        route_id: &'a str,
        route_task_id: Option<&'a str>,
        upstream: &'a str,
        route_record: &'a [u8],
        replica_id: Option<&'a str>,
        epoch: Option<i64>,
        task_upstream: &'a str,
        created_at_ms: i64,
        max_live: Option<i64>,
    } = concat!("
WITH ", live_cte!(), ", task AS (
    INSERT INTO task_routes (task_id, tenant, subject, status, expires_at_ms, idem_key, version, record,
        upstream, created_at_ms)
    SELECT $task_id, $tenant, $subject, $status, $expires_at_ms, NULL, 1, $record,
        $task_upstream, $created_at_ms WHERE ", within_quota!(), "
    RETURNING task_id
), route AS (
    INSERT INTO request_routes (route_id, task_id, upstream, replica_id, epoch, version, record)
    SELECT $route_id, $route_task_id, $upstream, $replica_id, $epoch, 1, $route_record FROM task
    RETURNING route_id
)
SELECT (SELECT count(*) FROM route) AS created, ", live_count!());

    get_task: GetTask<'a> { task_id: &'a str }
        = "SELECT record FROM task_routes WHERE task_id = $task_id";

    /// The read of a compare-and-swap update, with whether the fence holds (`route_id`
    /// NULL: an unfenced write).
    update_read: UpdateRead<'a> { task_id: &'a str, route_id: Option<&'a str> }
        = concat!(
            "SELECT version, record, ($route_id::text IS NULL OR ", fence!(), ")
             FROM task_routes WHERE task_id = $task_id"
        );

    /// The write of a compare-and-swap update: only at the version read, and only while
    /// the fence still holds, so a takeover between read and write still wins. With
    /// `release` (a call's terminal write), the request route goes in the same statement
    /// when the write went through: one commit, so the route goes exactly when the
    /// outcome is durable. Returns `(written, route removed)`.
    update_write: UpdateWrite<'a> {
        task_id: &'a str,
        version: i64,
        tenant: &'a str,
        subject: &'a str,
        status: &'a str,
        expires_at_ms: i64,
        record: &'a [u8],
        route_id: Option<&'a str>,
        upstream: &'a str,
        created_at_ms: i64,
        release: bool,
    } = concat!(
        "WITH w AS (
    UPDATE task_routes SET tenant = $tenant, subject = $subject, status = $status,
        expires_at_ms = $expires_at_ms, record = $record, upstream = $upstream,
        created_at_ms = $created_at_ms, version = version + 1
    WHERE task_id = $task_id AND version = $version
      AND ($route_id::text IS NULL OR ", fence!(), ")
    RETURNING 1
), d AS (
    DELETE FROM request_routes
    WHERE $release AND route_id = $route_id AND EXISTS (SELECT 1 FROM w)
    RETURNING 1
)
SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM d)"
    );

    count_by_status: CountByStatus {}
        = "SELECT status, count(*) FROM task_routes GROUP BY status ORDER BY status";

    expired: ExpiredTasks { now_ms: i64, limit: i64 }
        = "SELECT task_id FROM task_routes WHERE expires_at_ms <= $now_ms
           ORDER BY expires_at_ms, task_id LIMIT $limit";

    /// Delete a task that is due, with its read mark, leaving its tombstone; returns the
    /// record and whether it was seen.
    expire: Expire<'a> { task_id: &'a str, now_ms: i64, tombstone_until_ms: i64 } = "
WITH d AS (
    DELETE FROM task_routes WHERE task_id = $task_id AND expires_at_ms <= $now_ms
    RETURNING task_id, tenant, subject, idem_key, record
), s AS (
    DELETE FROM seen_marks WHERE task_id IN (SELECT task_id FROM d) RETURNING task_id
), t AS (
    INSERT INTO tombstones (task_id, tenant, subject, idem_key, expires_at_ms)
    SELECT task_id, tenant, subject, idem_key, $tombstone_until_ms FROM d
    ON CONFLICT (task_id) DO UPDATE SET tenant = EXCLUDED.tenant,
        subject = EXCLUDED.subject, idem_key = EXCLUDED.idem_key,
        expires_at_ms = EXCLUDED.expires_at_ms
    RETURNING task_id
)
SELECT d.record, EXISTS (SELECT 1 FROM s) AS seen, (SELECT count(*) FROM t) AS tombs FROM d";

    mark_seen: MarkSeen<'a> { task_ids: &'a [String] }
        = "INSERT INTO seen_marks (task_id)
           SELECT task_id FROM task_routes WHERE task_id = ANY($task_ids)
           ON CONFLICT DO NOTHING";

    /// Both tables probed by primary key on every path, the owner matched on the
    /// columns beside the record (docs/design.md §7 "Ownership").
    lookup_owned: LookupOwned<'a> { task_id: &'a str, tenant: &'a str, subject: &'a str }
        = "SELECT r.record, t.task_id IS NOT NULL
           FROM (SELECT $task_id::text AS task_id) k
           LEFT JOIN task_routes r
             ON r.task_id = k.task_id AND r.tenant = $tenant AND r.subject = $subject
           LEFT JOIN tombstones t
             ON t.task_id = k.task_id AND t.tenant = $tenant AND t.subject = $subject";

    /// One page of a principal's tasks on one upstream (migration 4's index): after
    /// `(after_ms, after_id)` in (created_at_ms, task id as bytes) order; `(-1, '')`
    /// starts at the first (no row has a negative time), so one plan serves both.
    list_owned: ListOwned<'a> {
        tenant: &'a str,
        subject: &'a str,
        upstream: &'a str,
        after_ms: i64,
        after_id: &'a str,
        limit: i64,
    } = "SELECT record FROM task_routes
         WHERE tenant = $tenant AND subject = $subject AND upstream = $upstream
           AND (created_at_ms, task_id COLLATE \"C\") > ($after_ms, $after_id)
         ORDER BY created_at_ms, task_id COLLATE \"C\"
         LIMIT $limit";

    list_tenant: ListTenant<'a> {
        tenant: &'a str,
        status: &'a str,
        after_ms: i64,
        after_id: &'a str,
        limit: i64,
    } = "SELECT record FROM task_routes
         WHERE tenant = $tenant AND status = $status
           AND (created_at_ms, task_id COLLATE \"C\") > ($after_ms, $after_id)
         ORDER BY created_at_ms, task_id COLLATE \"C\"
         LIMIT $limit";

    tenant_counts: TenantCounts {}
        = "SELECT tenant, status, count(*) FROM task_routes
           GROUP BY tenant, status ORDER BY tenant, status";

    tombstone: GetTombstone<'a> { task_id: &'a str }
        = "SELECT tenant, subject, idem_key, expires_at_ms FROM tombstones
           WHERE task_id = $task_id";

    /// Delete tombstones past their time, with their idempotency entries.
    sweep_tombstones: SweepTombstones { now_ms: i64 } = "
WITH d AS (
    DELETE FROM tombstones WHERE expires_at_ms <= $now_ms RETURNING task_id, idem_key
), i AS (
    DELETE FROM idempotency USING d
    WHERE idempotency.key = d.idem_key AND idempotency.task_id = d.task_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM i)";

    live_tasks: LiveTasks<'a> { tenant: &'a str }
        = "SELECT count(*) FROM task_routes
           WHERE tenant = $tenant AND status IN ('working', 'input_required')";

    idempotency: GetIdempotency<'a> { key: &'a [u8] }
        = "SELECT task_id, args_fingerprint FROM idempotency WHERE key = $key";

    // Request routes.

    put_route: PutRoute<'a> {
        route_id: &'a str,
        task_id: Option<&'a str>,
        upstream: &'a str,
        record: &'a [u8],
        replica_id: Option<&'a str>,
        epoch: Option<i64>,
    } = "INSERT INTO request_routes (route_id, task_id, upstream, replica_id, epoch, version, record)
         VALUES ($route_id, $task_id, $upstream, $replica_id, $epoch, 1, $record)
         ON CONFLICT (route_id) DO UPDATE SET task_id = EXCLUDED.task_id,
             upstream = EXCLUDED.upstream, record = EXCLUDED.record,
             replica_id = EXCLUDED.replica_id, epoch = EXCLUDED.epoch,
             version = request_routes.version + 1";

    remove_route: RemoveRoute<'a> { route_id: &'a str }
        = "DELETE FROM request_routes WHERE route_id = $route_id";

    /// Start-up recovery: without a seat (`replica_id` NULL: one gateway on the schema,
    /// or tests) every route; with one, those of this replica's earlier epochs and
    /// those no seat names (written before replicas held leases).
    routes: RecoverableRoutes<'a> { replica_id: Option<&'a str>, epoch: Option<i64> }
        = "SELECT route_id, record FROM request_routes
           WHERE $replica_id::text IS NULL OR replica_id IS NULL
              OR (replica_id = $replica_id AND epoch IS DISTINCT FROM $epoch)
           ORDER BY route_id";

    /// The orphan sweep: the routes of this seat (without one, those naming no seat).
    held_routes: HeldRoutes<'a> { replica_id: Option<&'a str>, epoch: Option<i64> }
        = "SELECT route_id, record FROM request_routes
           WHERE ($replica_id::text IS NULL AND replica_id IS NULL)
              OR (replica_id = $replica_id AND epoch = $epoch)
           ORDER BY route_id";

    // Upstream identities and secrets.

    upstream_identity: GetUpstreamIdentity<'a> { name: &'a str }
        = "SELECT record FROM upstream_identities WHERE name = $name";

    /// Compared as bytes: an identical record is not rewritten.
    put_upstream_identity: PutUpstreamIdentity<'a> { name: &'a str, record: &'a [u8] }
        = "INSERT INTO upstream_identities (name, record) VALUES ($name, $record)
           ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record
           WHERE upstream_identities.record IS DISTINCT FROM EXCLUDED.record";

    // The `Mcp-Param-*` header maps of the upstreams' tools (migration 2).

    upstream_tool_headers: GetUpstreamToolHeaders<'a> { name: &'a str }
        = "SELECT record FROM upstream_tool_headers WHERE name = $name";

    /// Compared as bytes: an identical record is not rewritten.
    put_upstream_tool_headers: PutUpstreamToolHeaders<'a> { name: &'a str, record: &'a [u8] }
        = "INSERT INTO upstream_tool_headers (name, record) VALUES ($name, $record)
           ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record
           WHERE upstream_tool_headers.record IS DISTINCT FROM EXCLUDED.record";

    secret: GetSecret<'a> { name: &'a str }
        = "SELECT secret FROM store_secrets WHERE name = $name";

    /// The first replica to insert wins; every replica then reads that one.
    put_secret: PutSecret<'a> { name: &'a str, secret: &'a [u8] }
        = "INSERT INTO store_secrets (name, secret) VALUES ($name, $secret)
           ON CONFLICT (name) DO NOTHING";

    // 2025-era client sessions (`sessions.rs`).

    /// Taken first in a session creation's transaction: the creations of one
    /// principal, on any replica, count and write one at a time.
    lock_session_owner: LockSessionOwner<'a> { key: &'a str }
        = "SELECT pg_advisory_xact_lock(hashtextextended($key, 0))";

    /// Insert a session while its principal holds fewer than `cap` (a statement of
    /// its own after the lock, so its snapshot sees every creation committed before).
    create_session: CreateSession<'a> {
        session_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
        last_seen_ms: i64,
        record: &'a [u8],
        cap: i64,
    } = "INSERT INTO legacy_sessions (session_id, tenant, subject, last_seen_ms, version, record)
         SELECT $session_id, $tenant, $subject, $last_seen_ms, 1, $record
         WHERE (SELECT count(*) FROM legacy_sessions
                WHERE tenant = $tenant AND subject = $subject) < $cap";

    principal_sessions: PrincipalSessions<'a> { tenant: &'a str, subject: &'a str }
        = "SELECT session_id, last_seen_ms FROM legacy_sessions
           WHERE tenant = $tenant AND subject = $subject
           ORDER BY last_seen_ms, session_id";

    /// One probe by primary key, the owner matched on the columns beside the record:
    /// another principal's session reads like an id never issued.
    session_owned: SessionOwned<'a> { session_id: &'a str, tenant: &'a str, subject: &'a str }
        = "SELECT record FROM legacy_sessions
           WHERE session_id = $session_id AND tenant = $tenant AND subject = $subject";

    session_read: SessionRead<'a> { session_id: &'a str }
        = "SELECT version, record FROM legacy_sessions WHERE session_id = $session_id";

    session_write: SessionWrite<'a> {
        session_id: &'a str,
        version: i64,
        last_seen_ms: i64,
        record: &'a [u8],
    } = "UPDATE legacy_sessions SET last_seen_ms = $last_seen_ms, record = $record,
             version = version + 1
         WHERE session_id = $session_id AND version = $version";

    delete_session: DeleteSession<'a> { session_id: &'a str }
        = "DELETE FROM legacy_sessions WHERE session_id = $session_id";

    expire_session: ExpireSession<'a> { session_id: &'a str, before_ms: i64 }
        = "DELETE FROM legacy_sessions
           WHERE session_id = $session_id AND last_seen_ms < $before_ms";

    idle_sessions: IdleSessions { before_ms: i64, limit: i64 }
        = "SELECT session_id FROM legacy_sessions WHERE last_seen_ms < $before_ms
           ORDER BY last_seen_ms, session_id LIMIT $limit";

    count_sessions: CountSessions {}
        = "SELECT count(*) FROM legacy_sessions";

    // A tenant purge (`purge.rs`, docs/design.md §27 "Tenant purge").

    /// Up to `limit` of the tenant's tasks, with their request routes, relays, claims
    /// and read marks (the cascade would take the marks too; deleting them here
    /// counts them).
    purge_tasks: PurgeTasks<'a> { tenant: &'a str, limit: i64 } = "
WITH t AS (
    SELECT task_id, idem_key FROM task_routes WHERE tenant = $tenant
    ORDER BY task_id LIMIT $limit FOR UPDATE
), r AS (
    DELETE FROM request_routes WHERE task_id IN (SELECT task_id FROM t) RETURNING 1
), p AS (
    DELETE FROM pending_relays WHERE task_id IN (SELECT task_id FROM t) RETURNING 1
), i AS (
    DELETE FROM idempotency USING t
    WHERE idempotency.key = t.idem_key AND idempotency.task_id = t.task_id
    RETURNING 1
), s AS (
    DELETE FROM seen_marks WHERE task_id IN (SELECT task_id FROM t) RETURNING 1
), d AS (
    DELETE FROM task_routes WHERE task_id IN (SELECT task_id FROM t)
    RETURNING task_id, status, created_at_ms
)
SELECT d.task_id, d.status, d.created_at_ms, (SELECT count(*) FROM r),
    (SELECT count(*) FROM p), (SELECT count(*) FROM i), (SELECT count(*) FROM s)
FROM d";

    /// Up to `limit` of the tenant's tombstones, with their claims and relays (no
    /// index by tenant: a scan, as the sweep's own is bounded by the tombstones' ttl).
    purge_tombstones: PurgeTombstones<'a> { tenant: &'a str, limit: i64 } = "
WITH t AS (
    SELECT task_id, idem_key FROM tombstones WHERE tenant = $tenant
    ORDER BY task_id LIMIT $limit FOR UPDATE
), i AS (
    DELETE FROM idempotency USING t
    WHERE idempotency.key = t.idem_key AND idempotency.task_id = t.task_id
    RETURNING 1
), p AS (
    DELETE FROM pending_relays WHERE task_id IN (SELECT task_id FROM t) RETURNING 1
), d AS (
    DELETE FROM tombstones WHERE task_id IN (SELECT task_id FROM t) RETURNING 1
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM i), (SELECT count(*) FROM p)";

    /// Claims under the tenant's key prefix `[low, high)` whose byte after the prefix
    /// is not 0xFF (`store::idempotency`): a range of the primary key.
    purge_claims: PurgeClaims<'a> { low: &'a [u8], high: &'a [u8], prefix_len: i32, limit: i64 }
        = "DELETE FROM idempotency WHERE key IN (
               SELECT key FROM idempotency WHERE key >= $low AND key < $high
                 AND CASE WHEN length(key) > $prefix_len
                          THEN get_byte(key, $prefix_len) <> 255 ELSE true END
               ORDER BY key LIMIT $limit)";

    /// Routes and relays whose bytes hold `needle` (`"tenant":` and the tenant as
    /// JSON); each is decoded before it is deleted, so a coincidence keeps its row.
    route_candidates: RouteCandidates<'a> { needle: &'a [u8] }
        = "SELECT route_id, record FROM request_routes WHERE position($needle IN record) > 0";

    relay_candidates: RelayCandidates<'a> { needle: &'a [u8] }
        = "SELECT relay_id, payload FROM pending_relays WHERE position($needle IN payload) > 0";

    delete_relays: DeleteRelays<'a> { relay_ids: &'a [i64] }
        = "DELETE FROM pending_relays WHERE relay_id = ANY($relay_ids)";

    purge_sessions: PurgeSessions<'a> { tenant: &'a str, limit: i64 }
        = "DELETE FROM legacy_sessions WHERE session_id IN (
               SELECT session_id FROM legacy_sessions WHERE tenant = $tenant
               ORDER BY session_id LIMIT $limit)
           RETURNING session_id";

    // Seats, takeover and relays (`cluster.rs`).

    register: Register<'a> { replica_id: &'a str, lease_secs: f64 }
        = "INSERT INTO replicas (replica_id, epoch, lease_until)
           VALUES ($replica_id, 1, now() + make_interval(secs => $lease_secs))
           ON CONFLICT (replica_id) DO UPDATE SET epoch = replicas.epoch + 1,
               lease_until = EXCLUDED.lease_until, started_at = now()
           RETURNING epoch";

    renew: Renew<'a> { replica_id: &'a str, epoch: i64, lease_secs: f64 }
        = "UPDATE replicas SET lease_until = now() + make_interval(secs => $lease_secs)
           WHERE replica_id = $replica_id AND epoch = $epoch AND lease_until > now()";

    /// Routes no live seat holds, locked for this takeover. Routes naming no seat were
    /// written by a gateway before leases; start-up recovery resolves those.
    orphaned_routes: OrphanedRoutes { limit: i64 }
        = "SELECT rr.route_id, rr.task_id, rr.record FROM request_routes rr
           WHERE rr.replica_id IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM replicas p
               WHERE p.replica_id = rr.replica_id AND p.epoch = rr.epoch
                 AND p.lease_until > now())
           ORDER BY rr.route_id LIMIT $limit
           FOR UPDATE OF rr SKIP LOCKED";

    lock_task: LockTask<'a> { task_id: &'a str }
        = "SELECT record FROM task_routes WHERE task_id = $task_id FOR UPDATE";

    /// The takeover's write of a task it failed (the row is locked: no version check).
    take_over_task: TakeOverTask<'a> {
        task_id: &'a str,
        status: &'a str,
        expires_at_ms: i64,
        record: &'a [u8],
    } = "UPDATE task_routes SET status = $status, expires_at_ms = $expires_at_ms,
             record = $record, version = version + 1
         WHERE task_id = $task_id";

    /// A takeover re-attaching to the upstream task a route follows: the route is
    /// the taker's now (docs/design.md §25).
    reseat_route: ReseatRoute<'a> { route_id: &'a str, replica_id: Option<&'a str>, epoch: Option<i64> }
        = "UPDATE request_routes SET replica_id = $replica_id, epoch = $epoch,
               version = version + 1
           WHERE route_id = $route_id";

    remove_routes: RemoveRoutes<'a> { route_ids: &'a [String] }
        = "DELETE FROM request_routes WHERE route_id = ANY($route_ids)";

    /// Relays for a dead seat would never be taken.
    drop_dead_relays: DropDeadRelays {}
        = "DELETE FROM pending_relays pr WHERE NOT EXISTS (
               SELECT 1 FROM replicas p
               WHERE p.replica_id = pr.target_replica AND p.epoch = pr.target_epoch
                 AND p.lease_until > now())";

    holder: Holder<'a> { task_id: &'a str }
        = "SELECT replica_id, epoch FROM request_routes
           WHERE task_id = $task_id AND replica_id IS NOT NULL AND epoch IS NOT NULL
           LIMIT 1";

    seat_of: SeatOf<'a> { replica_id: &'a str }
        = "SELECT epoch FROM replicas WHERE replica_id = $replica_id AND lease_until > now()";

    send_relay: SendRelay<'a> {
        task_id: Option<&'a str>,
        kind: &'a str,
        target_replica: &'a str,
        target_epoch: i64,
        created_at_ms: i64,
        payload: &'a [u8],
    } = "INSERT INTO pending_relays
             (task_id, kind, target_replica, target_epoch, created_at_ms, payload)
         VALUES ($task_id, $kind, $target_replica, $target_epoch, $created_at_ms, $payload)";

    take_relays: TakeRelays<'a> { target_replica: &'a str, target_epoch: i64, limit: i64 }
        = "DELETE FROM pending_relays WHERE relay_id IN (
               SELECT relay_id FROM pending_relays
               WHERE target_replica = $target_replica AND target_epoch = $target_epoch
               ORDER BY relay_id LIMIT $limit FOR UPDATE SKIP LOCKED)
           RETURNING relay_id, kind, task_id, payload";

    /// On the publishing connection, never a pooled one (see `cluster.rs`).
    notify: Notify<'a> { channel: &'a str, payload: &'a str }
        = "SELECT pg_notify($channel, $payload)";
}
