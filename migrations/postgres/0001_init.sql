-- taskgate PostgreSQL schema, version 1.
--
-- Applied by the gateway at start-up inside one transaction under an advisory lock,
-- with search_path set to the configured schema (so names here are unqualified).
-- Every record is kept as the exact bytes of its JSON (bytea, never jsonb: jsonb
-- reorders keys and rewrites numbers); the other columns are copies of record fields
-- that queries filter or sort on. Each row with a `version` is updated only by
-- compare-and-swap on it.

-- Task records: live until their expiry.
CREATE TABLE task_routes (
    task_id       text   PRIMARY KEY,
    tenant        text   NOT NULL,
    subject       text   NOT NULL,
    status        text   NOT NULL,
    expires_at_ms bigint NOT NULL,
    -- The idempotency key this task claimed (moved into its tombstone at expiry).
    idem_key      bytea,
    version       bigint NOT NULL,
    record        bytea  NOT NULL
);
-- The expiry index: the sweeper reads it oldest first.
CREATE INDEX task_routes_expiry ON task_routes (expires_at_ms, task_id);
-- The tenant quota counts live tasks.
CREATE INDEX task_routes_live ON task_routes (tenant)
    WHERE status IN ('working', 'input_required');

-- In-flight upstream calls: gone when the call ends. A separate table from the task
-- records on purpose (two lifetimes). replica_id/epoch name the replica holding the
-- call, for fencing once replicas hold leases.
CREATE TABLE request_routes (
    route_id   text   PRIMARY KEY,
    task_id    text,
    upstream   text   NOT NULL,
    replica_id text,
    epoch      bigint,
    version    bigint NOT NULL,
    record     bytea  NOT NULL
);
CREATE INDEX request_routes_task ON request_routes (task_id) WHERE task_id IS NOT NULL;

-- Which task a caller's idempotency key produced. Lives as long as the task and then
-- its tombstone.
CREATE TABLE idempotency (
    key              bytea PRIMARY KEY,
    task_id          text  NOT NULL,
    args_fingerprint text  NOT NULL
);

-- What remains of an expired task, for its owner only.
CREATE TABLE tombstones (
    task_id       text   PRIMARY KEY,
    tenant        text   NOT NULL,
    subject       text   NOT NULL,
    idem_key      bytea,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX tombstones_expiry ON tombstones (expires_at_ms);

-- Whether the owner received a task's terminal snapshot. A mark never outlives its
-- task: the foreign key deletes it with the task, and refuses a mark for a task that
-- is gone.
CREATE TABLE seen_marks (
    task_id text PRIMARY KEY REFERENCES task_routes (task_id) ON DELETE CASCADE
);

-- Secrets the gateway generates once and shares (the MRTR requestState key).
CREATE TABLE store_secrets (
    name   text  PRIMARY KEY,
    secret bytea NOT NULL
);

-- Each upstream's last initialize result as clients see it.
CREATE TABLE upstream_identities (
    name   text  PRIMARY KEY,
    record bytea NOT NULL
);

-- Cancels, input answers and MRTR retries received by a replica that does not hold
-- the call, waiting for the replica that does.
CREATE TABLE pending_relays (
    relay_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id        text,
    route_id       text,
    kind           text   NOT NULL,
    target_replica text,
    target_epoch   bigint,
    created_at_ms  bigint NOT NULL,
    payload        bytea  NOT NULL
);
CREATE INDEX pending_relays_target ON pending_relays (target_replica, relay_id);

-- Live replicas and their leases (times from the database clock).
CREATE TABLE replicas (
    replica_id  text        PRIMARY KEY,
    epoch       bigint      NOT NULL,
    lease_until timestamptz NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);
