//! Durable task state.
//!
//! Two tables with two lifetimes: *task routes* (task records, live until TTL expiry)
//! and *request routes* (in-flight upstream calls, gone when the call ends), plus an
//! idempotency index, an expiry index, an owner index (each principal's tasks per
//! upstream, for `tasks/list`), owner-only tombstones, read marks
//! (whether the owner received a task's terminal snapshot) and the last known identity
//! of each upstream (what the task plane shows while that upstream is not ready:
//! README "Task plane and upstream plane") with the `Mcp-Param-*` header map of its
//! tools (what the front checks a `tools/call` against), and the 2025-era client
//! sessions (docs/design.md §22). The engine talks to the
//! [`TaskStore`] trait (async, so a backend may sit across a network); `sled/` is the
//! embedded single-replica backend, `postgres/` the one several replicas share, and
//! `memory.rs` an in-process one (tests, demos: it keeps nothing across a restart).
//! All pass the same contract suite
//! (`contract.rs`), which a new backend joins with one line.
//!
//! Durability contract: a write is durable once a [`TaskStore::flush`] call that
//! started after it has resolved `Ok`. The engine never hands out a task id before
//! that.

pub mod cluster;
#[cfg(test)]
mod contract;
mod error;
#[cfg(test)]
pub(crate) mod faulty;
pub mod idempotency;
pub mod memory;
pub mod postgres;
pub(crate) mod probe;
mod purge;
pub mod sled;
#[cfg(test)]
pub(crate) mod test_records;
pub mod transfer;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use error::{Corruption, IoError, SetupError, StoreError};
pub use purge::{PurgeCounts, Purged, PurgedTask};

use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;

/// Schema version written into every stored record; a newer gateway reads older ones.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Every status, in the order the operator API reports them.
    pub const ALL: [TaskStatus; 5] = [
        Self::Working,
        Self::InputRequired,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The status named by [`as_str`](Self::as_str)'s spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A task record (the *task routes* table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub v: u32,
    pub task_id: String,
    pub tenant: String,
    pub subject: String,
    pub upstream: String,
    pub tool: String,
    /// Hex SHA-256 of the canonical tool arguments (idempotency conflict check).
    pub args_fingerprint: String,
    pub idempotency_key: Option<String>,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub created_at_ms: u64,
    pub last_updated_at_ms: u64,
    pub ttl_ms: u64,
    pub poll_interval_ms: u64,
    /// `createdAt + ttlMs`; the expiry index is keyed by it.
    pub expires_at_ms: u64,
    /// The upstream `CallToolResult`, only when `completed`.
    pub result: Option<Value>,
    /// The JSON-RPC error object, only when `failed`.
    pub error: Option<Value>,
    /// Outstanding input requests by key: `{method, params}`.
    pub input_requests: Map<String, Value>,
    /// Every input key ever issued for this task (keys are never reused).
    pub issued_keys: Vec<String>,
    pub cancel_requested: bool,
    /// The W3C `traceparent` of the span that created the task, when traces are on:
    /// its settle span and its polls link to it, on any replica (docs/design.md §24
    /// "Operations"). Absent in records of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

/// An in-flight upstream call (the *request routes* table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRoute {
    pub v: u32,
    pub route_id: String,
    pub upstream: String,
    pub tenant: String,
    pub subject: String,
    pub method: String,
    pub started_at_ms: u64,
    pub deadline_ms: u64,
    pub task_id: Option<String>,
    /// The upstream's own task this call follows (docs/design.md §25 "The 2025-11-25
    /// task dialect"): what a restart or a takeover needs to re-attach to it. Absent
    /// for an ordinary call (and in routes of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_task: Option<UpstreamTaskRoute>,
}

/// Where an upstream task lives and how its driver was set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamTaskRoute {
    /// The upstream's task id.
    pub task_id: String,
    /// The upstream session (`Mcp-Session-Id`) holding it; `None` over stdio, where
    /// the task lives in a child and cannot outlive the gateway.
    pub session: Option<String>,
    /// The protocol version negotiated in that session.
    #[serde(default)]
    pub session_version: Option<String>,
    /// The capabilities the client declared, which screen the task's input requests.
    #[serde(default)]
    pub caps: crate::protocol::ClientCaps,
    /// A 2025-era client's task: undeclared input is answered by the gateway.
    #[serde(default)]
    pub answer_undeclared: bool,
}

/// What remains of an expired task: only its owner may learn that it expired.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tombstone {
    pub v: u32,
    pub task_id: String,
    pub tenant: String,
    pub subject: String,
    /// Idempotency index key to drop together with the tombstone.
    pub idempotency_index_key: Option<Vec<u8>>,
    pub expires_at_ms: u64,
}

/// An idempotency index entry: which task a caller key produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyEntry {
    pub task_id: String,
    pub args_fingerprint: String,
}

/// A task removed by [`TaskStore::expire`].
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    pub record: TaskRecord,
    /// Whether its owner received the terminal snapshot (README "Limits and metrics"):
    /// a read mark ([`TaskStore::mark_seen`]) was there when the task was removed, or
    /// the task turned terminal before the store tracked reads (an older store: what
    /// was read then is unknown, and an upgrade must not raise an alarm for every
    /// old task).
    pub seen: bool,
}

/// The stored form of an upstream's identity (the *upstream identities* table, one
/// record per upstream name): the record's schema version, then the
/// [`UpstreamInfo`] fields inline, so the stored JSON is
/// `{"v", "protocol_version", "server_info", "capabilities", "instructions"?}`. `I` is
/// `&UpstreamInfo` when writing and `UpstreamInfo` when reading. The fields are put
/// inline by hand through a JSON map rather than with `serde(flatten)`, which buffers
/// through serde's `Content` and loses the number text of `server_info`
/// (tests/serde_buffering.rs).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredIdentity<I> {
    pub v: u32,
    pub info: I,
}

impl Serialize for StoredIdentity<&UpstreamInfo> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut record = Map::new();
        record.insert("v".into(), Value::from(self.v));
        match serde_json::to_value(self.info).map_err(serde::ser::Error::custom)? {
            Value::Object(fields) => record.extend(fields),
            _ => return Err(serde::ser::Error::custom("not a JSON object")),
        }
        record.serialize(s)
    }
}

impl<'de> Deserialize<'de> for StoredIdentity<UpstreamInfo> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut record = Map::<String, Value>::deserialize(d)?;
        let v = record
            .remove("v")
            .ok_or_else(|| D::Error::missing_field("v"))?;
        let v = v
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| D::Error::custom(format!("schema version {v} is not a u32")))?;
        // Through the JSON text, not `serde_json::from_value`: a `Value` read back
        // through serde loses number text (`-0` comes out as `0`).
        let text = serde_json::to_string(&record).map_err(D::Error::custom)?;
        let info = serde_json::from_str(&text).map_err(D::Error::custom)?;
        Ok(Self { v, info })
    }
}

impl<'a> StoredIdentity<&'a UpstreamInfo> {
    /// `info` as a record of the current schema.
    pub(crate) fn current(info: &'a UpstreamInfo) -> Self {
        Self {
            v: SCHEMA_VERSION,
            info,
        }
    }
}

/// A 2025-era client session (docs/design.md §22 "Clients of the 2025 era"), bound to
/// the principal that opened it. Kept in the store so a restart or another replica
/// continues it. The fields up to `subject` come first and in this order: a backend
/// may tell a stored record's owner from its leading bytes, as for tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub v: u32,
    /// `mcs_` + base64url of 32 CSPRNG bytes (`tasks::ids::new_session_id`).
    pub session_id: String,
    pub tenant: String,
    pub subject: String,
    /// The upstream of the endpoint the session was opened on.
    pub upstream: String,
    /// The protocol version `initialize` negotiated.
    pub protocol_version: String,
    /// The client's `clientInfo`, byte-exact as sent (key order and number text).
    pub client_info: Value,
    /// The client's `capabilities` (which server→client requests it accepts).
    pub client_capabilities: Map<String, Value>,
    pub created_at_ms: u64,
    /// When the session was last used; rewritten coarsely, not on every request.
    pub last_seen_at_ms: u64,
    /// `notifications/initialized` was seen (informational).
    pub initialized: bool,
    /// The session's own `logging/setLevel`.
    pub log_level: Option<String>,
    /// The resource URIs the session subscribed to, restored when another replica
    /// takes the session over.
    pub subscriptions: Vec<String>,
}

/// Result of [`TaskStore::create_session`].
#[derive(Debug, Clone, PartialEq)]
pub enum SessionCreated {
    /// The session was written.
    New,
    /// The principal already holds the cap; nothing was written. Its sessions, each
    /// with its `last_seen_at_ms`, so the caller can pick one to close.
    AtCap(Vec<(String, u64)>),
}

/// What a session id is to one principal ([`TaskStore::session_owned`]).
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedSession {
    /// The principal's session.
    Record(Box<SessionRecord>),
    /// Anything else: another principal's session or an id never issued.
    Unknown,
}

/// A read-modify-write step for [`TaskStore::update_session`], like [`Update`].
pub type SessionUpdate<'a> = &'a mut (dyn FnMut(&mut SessionRecord) -> bool + Send);

/// The stored form of an upstream's `Mcp-Param-*` header map (the *upstream tool
/// headers* table, one record per upstream name): `{"v", "tools": {tool: [{"name",
/// "property"}]}}`, derived from the upstream's last `tools/list`. A record of its own,
/// so the identity record stays as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredToolHeaders {
    pub v: u32,
    pub tools: ToolHeaders,
}

impl StoredToolHeaders {
    /// `tools` as a record of the current schema.
    pub(crate) fn current(tools: &ToolHeaders) -> Self {
        Self {
            v: SCHEMA_VERSION,
            tools: tools.clone(),
        }
    }
}

/// Result of [`TaskStore::create`].
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// Task, route and (if given) idempotency entry were written.
    New,
    /// The idempotency key already maps to a task; nothing was written.
    Existing(IdempotencyEntry),
}

/// Result of [`TaskStore::create_within_quota`].
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaCreated {
    /// As [`TaskStore::create`] answered.
    Done(Created),
    /// The tenant already had `live` non-terminal tasks, at or over the quota: nothing
    /// was written (an idempotency key that names a task wins over this: `Done`).
    OverQuota { live: u64 },
}

/// What a task id is to one principal ([`TaskStore::lookup_owned`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Owned {
    /// The principal's task.
    Record(Box<TaskRecord>),
    /// The principal's task expired: only its tombstone is left.
    Expired,
    /// Anything else: another principal's task or tombstone, or an id never issued.
    Unknown,
}

/// Where a page of an owner's task list resumes: after this task in (created_at_ms,
/// task_id) order ([`TaskStore::list_owned`]). Task ids compare as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerCursor {
    pub created_at_ms: u64,
    pub task_id: String,
}

/// How many tasks one tenant holds in one status ([`TaskStore::tenant_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantCount {
    pub tenant: String,
    pub status: TaskStatus,
    pub tasks: u64,
}

/// The longest the gateway waits for one store operation before it abandons it
/// (PostgreSQL; sled works locally). An abandoned write may still land: the orphan
/// sweep leaves routes younger than this alone (docs/design.md §16).
pub const OPERATION_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A read-modify-write step for [`TaskStore::update`]: it may run more than once and
/// returns `false` to leave the record unchanged.
pub type Update<'a> = &'a mut (dyn FnMut(&mut TaskRecord) -> bool + Send);

/// The durable store behind the tasks engine: everything the engine keeps (tasks,
/// request routes, idempotency claims, expiry, tombstones, read marks, the owner
/// index, upstream identities, secrets). Every backend passes the one contract suite
/// (`store::contract`). Every method returns a boxed `Send` future, so the trait stays
/// object-safe (the engine holds an `Arc<dyn TaskStore>`) while a backend may do real
/// I/O (a network database) behind it.
pub trait TaskStore: Send + Sync + 'static {
    /// Write a new task, its request route and, if `idempotency_key` is given, the
    /// idempotency entry — unless that key already names another task, in which case
    /// nothing of this call remains and the existing entry is returned (exactly one of
    /// concurrent creators with one key wins). A task id that already exists is an
    /// error. Not durable until [`flush`](Self::flush) resolves; a crash before that
    /// may leave part of it, which the backend must tolerate (start-up recovery
    /// resolves the route).
    fn create<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<Created, StoreError>>;

    /// [`create`](Self::create) only while the task's tenant has fewer than `max_live`
    /// non-terminal tasks ([`live_tasks`](Self::live_tasks)); a key that already names a
    /// task answers `Done(Existing)` whatever the count. The count is as exact as
    /// `live_tasks` then `create` (two concurrent creations may both pass). A backend
    /// behind a network overrides this with one round trip (docs/design.md §1
    /// "Promotion": the quota is counted before anything is sent upstream).
    fn create_within_quota<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
        max_live: u64,
    ) -> BoxFuture<'a, Result<QuotaCreated, StoreError>> {
        Box::pin(async move {
            if let Some(key) = idempotency_key
                && let Some(e) = self.idempotency_get(key).await?
            {
                return Ok(QuotaCreated::Done(Created::Existing(e)));
            }
            let live = self.live_tasks(&task.tenant).await?;
            if live >= max_live {
                return Ok(QuotaCreated::OverQuota { live });
            }
            self.create(task, route, idempotency_key)
                .await
                .map(QuotaCreated::Done)
        })
    }

    /// Resolves once every write that completed before this call is durable (one
    /// group-commit flush shared by concurrent callers; plus fsync in strict mode).
    fn flush(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    fn get<'a>(&'a self, task_id: &'a str)
    -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>>;

    /// Atomic read-modify-write of one task (compare-and-swap: no lost updates; `f`
    /// may run more than once). `f` returns `false` to leave the record unchanged.
    /// [`expired`](Self::expired) finds the task once its (new) `expires_at_ms` has
    /// passed. Returns the record after the call (`None` if the task does not exist).
    fn update<'a>(
        &'a self,
        task_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>>;

    /// [`update`](Self::update) from the in-flight call of `route_id`: on a store
    /// shared by replicas it writes only while that route still names this replica's
    /// seat and its lease is live, and fails with [`StoreError::Fenced`] otherwise. A
    /// store with one gateway has nobody to fence against.
    fn update_fenced<'a>(
        &'a self,
        task_id: &'a str,
        route_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        let _ = route_id;
        self.update(task_id, f)
    }

    /// [`update_fenced`](Self::update_fenced) for a call's last write: a backend may
    /// remove request route `route_id` together with a write that leaves the record
    /// terminal, atomically, and answer `true`; the caller then has no route left to
    /// remove. The default writes and leaves the route (`false`): on sled the caller
    /// removes it after the flush that makes the outcome durable.
    fn update_fenced_releasing<'a>(
        &'a self,
        task_id: &'a str,
        route_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<(Option<TaskRecord>, bool), StoreError>> {
        Box::pin(async move { Ok((self.update_fenced(task_id, route_id, f).await?, false)) })
    }

    fn put_route<'a>(&'a self, route: &'a RequestRoute) -> BoxFuture<'a, Result<(), StoreError>>;
    fn remove_route<'a>(&'a self, route_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    /// The request routes a previous process of this gateway left in flight (at
    /// start-up): every route for a store with one gateway; on a shared store, those
    /// of this replica's earlier epochs (other replicas' are theirs, or the takeover's).
    fn routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>>;
    /// The request routes this process holds now (for the orphan sweep, docs/design.md
    /// §16): every route for a store with one gateway; on a shared store, those naming
    /// this replica's current seat.
    fn held_routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>>;

    fn idempotency_get<'a>(
        &'a self,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<IdempotencyEntry>, StoreError>>;

    /// How many tasks the store holds, by status (one pass over the records; for
    /// seeding the `taskgate_tasks` gauge in the background, not for a request path).
    fn count_by_status(&self) -> BoxFuture<'_, Result<Vec<(TaskStatus, u64)>, StoreError>>;

    /// Ids of tasks whose `expires_at_ms <= now_ms`, oldest first, at most `limit`.
    fn expired(&self, now_ms: u64, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;

    /// Delete a task whose `expires_at_ms <= now_ms` (and its expiry index entry and
    /// read mark), leaving an owner-only tombstone (written first, so the owner never
    /// sees "not found") that lives until `tombstone_until_ms`. Returns the deleted
    /// record and whether it was seen; `None` if the task is gone or — re-checked on
    /// the record itself, since an update may have extended it after
    /// [`expired`](Self::expired) listed it — not due.
    fn expire<'a>(
        &'a self,
        task_id: &'a str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Expired>, StoreError>>;

    /// Record that the owner received the terminal snapshot of each task. A small
    /// write per task that is not marked yet — never a rewrite of the task record —
    /// and no flush: a mark lost in a crash only makes an expiry count as unread.
    /// Tasks that are gone are skipped; a mark never outlives its task.
    fn mark_seen<'a>(&'a self, task_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>>;

    fn tombstone<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, StoreError>>;

    /// `task_id` as the principal `(tenant, subject)` may see it (docs/design.md §7
    /// "Ownership"). Whether the id is another principal's task, another principal's
    /// tombstone or was never issued, this makes the same reads and decodes nothing,
    /// so its cost says nothing about what exists: only the owner's record is decoded.
    fn lookup_owned<'a>(
        &'a self,
        task_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<Owned, StoreError>>;

    /// The task records of `(tenant, subject)` on `upstream` (the `tasks/list` of
    /// docs/design.md §25), in (created_at_ms, task_id) order — task ids compared as
    /// bytes — strictly after `after`, at most `limit`. Served by an owner index, never
    /// a scan of every task. Records past their expiry but not yet swept may be
    /// included; expired (swept) ones never are.
    fn list_owned<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        upstream: &'a str,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>>;

    /// The task records of `tenant` in `status` (the operator API's list,
    /// docs/design.md §24), in (created_at_ms, task_id) order — task ids compared as
    /// bytes — strictly after `after`, at most `limit`. Served by a (tenant, status,
    /// created) index, never a scan of every task; like
    /// [`list_owned`](Self::list_owned) it may include records past their expiry but
    /// not yet swept.
    fn list_tenant<'a>(
        &'a self,
        tenant: &'a str,
        status: TaskStatus,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>>;

    /// How many tasks each tenant holds, by status (the operator API): one pass over
    /// an index, never a decode of the records. Tenants in (tenant, status) order.
    fn tenant_counts(&self) -> BoxFuture<'_, Result<Vec<TenantCount>, StoreError>>;

    /// Delete tombstones past their time, with their idempotency entries.
    fn sweep_tombstones(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// Number of non-terminal tasks of a tenant (quota).
    fn live_tasks<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// The identity last stored for upstream `name` by
    /// [`put_upstream_identity`](Self::put_upstream_identity), if any.
    fn upstream_identity<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamInfo>, StoreError>>;

    /// Store `identity` for upstream `name` unless the stored record is byte-identical
    /// (so a re-initialising upstream costs a read, not a write); returns whether it
    /// wrote. Not durable until [`flush`](Self::flush) resolves.
    fn put_upstream_identity<'a>(
        &'a self,
        name: &'a str,
        identity: &'a UpstreamInfo,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The `Mcp-Param-*` header map last stored for upstream `name` by
    /// [`put_upstream_tool_headers`](Self::put_upstream_tool_headers), if any.
    fn upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ToolHeaders>, StoreError>>;

    /// Store `headers` for upstream `name` unless the stored record is byte-identical
    /// (a refilled tools cache costs a read, not a write); returns whether it wrote.
    /// Not durable until [`flush`](Self::flush) resolves.
    fn put_upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
        headers: &'a ToolHeaders,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// A 32-byte secret stored under `name`, created from the CSPRNG on first use and
    /// durable before it is first returned.
    fn secret<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<[u8; 32], StoreError>>;

    /// Whether the store is open and writable (for `/readyz`).
    fn healthy(&self) -> bool;

    // 2025-era client sessions (docs/design.md §22). None of these waits for a flush,
    // and `flush` need not cover them: a session lost to a crash only costs its client
    // a new `initialize`.

    /// Write `session` unless its principal already holds `cap` sessions (then nothing
    /// is written and their ids and last-seen times come back). The count and the
    /// write are one step: concurrent creators, on any replica, never pass the cap
    /// together. A session id that already exists is an error.
    fn create_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        cap: usize,
    ) -> BoxFuture<'a, Result<SessionCreated, StoreError>>;

    /// `session_id` as the principal `(tenant, subject)` may see it. As for
    /// [`lookup_owned`](Self::lookup_owned), another principal's session and an id
    /// never issued cost the same reads and decode nothing.
    fn session_owned<'a>(
        &'a self,
        session_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<OwnedSession, StoreError>>;

    /// Atomic read-modify-write of one session (compare-and-swap; `f` may run more
    /// than once and returns `false` to leave the record unchanged). The id and the
    /// owner stay what they were whatever `f` does. Returns the record after the call,
    /// `None` if the session does not exist.
    fn update_session<'a>(
        &'a self,
        session_id: &'a str,
        f: SessionUpdate<'a>,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, StoreError>>;

    /// Delete a session; returns whether it existed.
    fn delete_session<'a>(&'a self, session_id: &'a str)
    -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Delete a session only while its `last_seen_at_ms` is still before
    /// `last_seen_before_ms` (re-checked on the record, so a session used since it was
    /// listed stays); returns whether it was deleted.
    fn expire_session<'a>(
        &'a self,
        session_id: &'a str,
        last_seen_before_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Ids of sessions last seen before `before_ms`, least recently seen first, at
    /// most `limit`.
    fn idle_sessions(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;

    /// How many sessions the store holds (seeds `taskgate_legacy_sessions_open`).
    fn count_sessions(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Remove up to about `limit` stored items of `tenant` (docs/design.md §27 "Tenant
    /// purge"): task records with every index entry, read mark, request route, relay
    /// and idempotency claim of theirs, tombstones with their claims, claims whose task
    /// is gone, and 2025-era sessions. Other tenants' items are never touched. `more`
    /// says a limit stopped the batch: the caller flushes and calls again until it is
    /// `false`, so no one call holds the store for long. Afterwards no read of this
    /// trait tells that anything of `tenant` existed: a purged task id reads like an id
    /// never issued (no tombstone is left) and its live-task count is 0. Safe to run
    /// again after a crash: whatever a cut-short batch left is found by the next.
    /// Not durable until [`flush`](Self::flush) resolves.
    fn purge_tenant<'a>(
        &'a self,
        tenant: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Purged, StoreError>>;
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
