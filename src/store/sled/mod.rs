//! sled 0.34.7 backend of [`TaskStore`]: the single-replica durable store.
//!
//! # Durability contract
//!
//! * Every mutating call (`create`, `update`, `put_route`, `remove_route`, `expire`,
//!   `sweep_tombstones`, `mark_seen`) is applied to sled's in-memory page cache and
//!   log buffer when it returns. It is **visible** to every later read at once, but it
//!   is **not durable** yet.
//! * A write is durable once a [`TaskStore::flush`] call *made after the write
//!   returned* has resolved `Ok`. The engine awaits that before it hands out a task id
//!   (docs/design.md §1 "Promotion") — a failed flush never hands one out (§16 "Durability,
//!   store failures and upgrades").
//! * Besides our flushes, sled flushes its log every 500 ms on its own thread
//!   (`flush_every_ms`), so un-awaited writes usually become durable within ~0.5 s, but
//!   nothing may rely on that.
//! * [`TaskStore::secret`] flushes by itself when it creates a secret (once per name),
//!   so a secret is durable before it is first returned.
//!
//! ## What "durable" means: normal vs strict mode
//!
//! On Linux sled's `flush()` writes the log and waits with `sync_file_range(2)`
//! (sled#1452), not `fsync(2)`: the data reaches the kernel and the disk queue, which
//! survives a **process crash** (`kill -9`, panic, OOM kill) but not a **power loss or
//! kernel crash** — `sync_file_range` flushes neither file metadata (e.g. a grown file
//! size) nor the drive's volatile write cache. sled also never fsyncs its blob files
//! (large values) nor the directory.
//!
//! With `[store] strict_fsync = true` every group-commit round additionally calls
//! `fsync` (`File::sync_all`) on every regular file of the store directory (`db`,
//! `conf`, `snap.*`), on every blob file in `blobs/` that is new or has grown since
//! the last round, and on the store directory and `blobs/` themselves. A flush that
//! resolved `Ok` in strict mode survives power loss (given honest drive flushes).
//! It costs one or more extra fsyncs per round; see the numbers in the tests below.
//!
//! ## Group commit
//!
//! [`TaskStore::flush`] never calls sled's flush on the caller's thread. It registers a
//! oneshot sender in an unbounded mpsc channel (registration happens synchronously,
//! inside the `flush()` call) and awaits it. One background flusher task (spawned by
//! [`SledStore::open`] on the current tokio runtime) loops:
//!
//! 1. wait for a registration, yield to the scheduler once (writers that are already
//!    runnable reach their `flush()` and join this round; with nothing else runnable
//!    the yield returns at once), then take **all** pending registrations;
//! 2. run `db.flush()` (+ the strict-mode fsyncs) in `tokio::task::spawn_blocking`;
//! 3. answer exactly the waiters taken in step 1 with the result.
//!
//! A waiter that registers while a round is running stays in the channel for the next
//! round, because its write may have missed the running flush. Every taken waiter
//! registered before the flush started, and its writes returned before it registered,
//! so the flush covers them. On error every waiter of the round gets
//! [`StoreError::Io`] and [`TaskStore::healthy`] turns (and stays) `false`.
//!
//! sled's `flush_async` is **never** used: in 0.34.7 it deadlocks with ≥ 8 concurrent
//! callers (sled#1308). The synchronous `flush()` in a blocking thread is safe.
//!
//! The flusher holds only a `Weak` reference to the store, so dropping the last
//! `Arc<SledStore>` closes the database (and releases sled's directory lock) at once,
//! unless a flush round is running, in which case it closes when that round ends. The
//! flusher task then ends because its channel is closed.
//!
//! # Concurrency contract: ordered single-key writes, no sled transactions
//!
//! Every change is a sequence of single-key sled writes (`insert`, `remove`,
//! `compare_and_swap`); no sled transaction and no `apply_batch` is used on any path.
//! Measured reason (benches/RESULTS.md, "What limits durable creation now"): in sled 0.34.7 every transaction and every batch
//! *rolls the log buffer twice* (`PageCache::pin_log`), and every rolled buffer is
//! written at once by a sled I/O thread with `pwrite` + a waited `sync_file_range`.
//! With a transaction per create and per terminal state the gateway did ~2 synchronous
//! log writes per store change, spawned hundreds of short-lived `sled-io` threads and
//! spent ~700 µs of CPU per promoted task; plain writes only fill the log buffer, and
//! one group-commit round writes it once (create+flush 8.3k → 25.5k durable ops/s in
//! `benches/store_throughput.rs`, same run).
//!
//! * **Per record: compare-and-swap.** [`TaskStore::update`] reads the task, applies
//!   `f` to a copy and swaps it in only if the stored bytes are still the ones it read;
//!   otherwise it re-reads and re-applies. So `f` **may be called more than once**
//!   (always on a fresh record) and must have no side effects other than mutating the
//!   record. There are no lost updates (`tests::concurrent_updates_lose_nothing`).
//! * **Idempotency: a compare-and-swap claim.** Concurrent `create`s with the same
//!   idempotency key produce exactly one [`Created::New`]; every other one sees
//!   [`Created::Existing`] and undoes what it wrote (its task id was never handed out).
//!   A creator writes its task *before* it claims the key, so a key never names a task
//!   that is not there yet.
//! * **Across trees: a fixed write order** that makes every prefix of an operation
//!   safe, because a crash (before the flush) can cut an operation short; sled recovers
//!   its log as a contiguous prefix (0.34.7 `LogIter::next` stops at the first torn
//!   message; `check_contiguity_in_unstable_tail` cuts the tail at the first gap).
//!   Writes are visible as they land, so the order also keeps concurrent readers safe:
//!   * `create`: request route → expiry entry → live entry → owner entry → tenant
//!     entry → task
//!     (compare-and-swap: an existing id is refused) → `meta/idem_of` → idempotency
//!     claim. A route always exists before its task, so start-up recovery
//!     ([`TaskStore::routes`]) finds every task a crash may have left `working`; its
//!     expiry entry exists too, so it expires; its owner entry too, so its owner lists
//!     it. A losing claim undoes in reverse order, task first.
//!   * `update`: (only when the expiry got earlier) new expiry entry → (only when a
//!     field of the owner key changed, which the engine never does) new owner entry →
//!     (only when the status changed) new tenant entry → task → old expiry entry
//!     removed → old owner entry removed → old tenant entry removed → live entry
//!     removed/added when the status crosses terminal. A crash before the record's
//!     swap leaves a new tenant entry the record disagrees with, which lists skip.
//!   * `expire`: tombstone → task removed (compare-and-swap) → `meta/idem_of` →
//!     seen mark → owner entry → tenant entry → expiry entry → live entry. The owner never sees "not
//!     found" in between; whether the removed seen mark was there is the answer's
//!     `seen`.
//!   * `mark_seen`: seen mark → task re-checked, and the mark removed again if the
//!     task is gone. Against a concurrent `expire` either the mark lands before
//!     `expire` removes it (and counts as seen) or the re-check, which runs after the
//!     task's removal, finds the task gone and removes the mark: no mark outlives its
//!     task. (The second case counts the read as unread, as does a mark lost in a
//!     crash: a lost mark can only over-count.)
//!   * `sweep_tombstones`: idempotency entry → seen mark (only if the task is gone)
//!     → tombstone.
//!   * `create_session` (under the store's session lock, which makes the count and
//!     the write one step): `session_owner` entry → session (compare-and-swap: an
//!     existing id is refused). `delete_session`/`expire_session`: session
//!     (compare-and-swap) → `session_owner` entry. An owner entry without its session
//!     is what a cut-short create or delete leaves: it is dropped, under the same lock,
//!     when its principal reaches the cap and by [`TaskStore::idle_sessions`].
//! * **Repairs of what a cut-short operation leaves:** an expiry entry whose task is
//!   gone, or whose task now expires at another time, is dropped or moved by
//!   [`TaskStore::expired`] (with a gone task's `idem_of`, and its owner entry when
//!   its tombstone names the owner); an idempotency entry whose
//!   task and tombstone are both missing reads as absent and is taken over by the next
//!   `create` with that key; an owner entry whose task is gone or disagrees with it is
//!   skipped by [`TaskStore::list_owned`] (which never removes one: a `create` writes
//!   the entry before its task); live entries of tasks
//!   that are gone or terminal are dropped when the store opens
//!   (`tests::crash_leftovers_are_repaired`); a seen mark whose task is gone (a crash
//!   inside `expire` or between a mark and its re-check) is dropped with the task's
//!   stale expiry entry by [`TaskStore::expired`], or else with its tombstone by
//!   [`TaskStore::sweep_tombstones`] — every removed task has a tombstone, written
//!   first (`tests::seen_mark_leftovers_are_repaired`).
//! * **Live-task counts** ([`TaskStore::live_tasks`], the tenant quota) come from the
//!   `live` tree: counted once at open, then kept in memory in step with each entry
//!   actually inserted or removed, so the count is one map lookup.
//! * All methods are synchronous and may block briefly (page-cache misses); they never
//!   wait for a disk flush. Only `flush()` is async.
//!
//! # Schema (every tree, every key)
//!
//! All values are serde_json unless stated. Every JSON record carries `"v"`, the schema
//! version ([`crate::store::SCHEMA_VERSION`]); a record with a *higher* `v` than this build knows is
//! reported as [`StoreError::Corrupt`] naming the tree and key (a downgrade is refused,
//! not guessed). Records of older versions are upgraded on read: a missing `v` counts
//! as version 0, and missing optional fields take defaults (`null` options, empty
//! `input_requests`/`issued_keys`, `cancel_requested = false`).
//!
//! | tree          | key                                              | value |
//! |---------------|--------------------------------------------------|-------|
//! | `tasks`       | task id (UTF-8)                                  | [`TaskRecord`] JSON |
//! | `routes`      | route id (UTF-8)                                 | [`RequestRoute`] JSON |
//! | `idempotency` | caller-scoped index key bytes (built by the engine from tenant, subject, upstream, tool, key) | `{"v", "task_id", "args_fingerprint"}` ([`IdempotencyEntry`] + `v`) |
//! | `expiry`      | 8-byte big-endian time ++ task id                | empty; one entry per task, at or *before* its `expires_at_ms` (a later expiry is applied lazily: [`TaskStore::expired`] moves an entry that comes due early), so a range scan up to `now` finds every expired task |
//! | `tombstones`  | task id                                          | [`Tombstone`] JSON |
//! | `live`        | 4-byte big-endian tenant length ++ tenant ++ task id | empty; one entry per non-terminal task |
//! | `owner`       | tenant, subject and upstream, each as 4-byte big-endian length ++ bytes, ++ 8-byte big-endian `created_at_ms` ++ task id | empty; one entry per task, so a range scan under one (tenant, subject, upstream) prefix pages a principal's tasks on an upstream in (created_at_ms, task id) order ([`TaskStore::list_owned`], `tasks/list`) |
//! | `tenant_status` | tenant and status (`working`, `completed`, …), each as 4-byte big-endian length ++ bytes, ++ 8-byte big-endian `created_at_ms` ++ task id | empty; one entry per task, moved when its status changes, so a range scan under one (tenant, status) prefix pages a tenant's tasks in that status in (created_at_ms, task id) order (the operator API, docs/design.md §24) |
//! | `upstream_identity` | upstream name (UTF-8)                      | `StoredIdentity` JSON: `{"v", "protocol_version", "server_info", "capabilities", "instructions"?}`, the upstream's last `initialize` result; `server_info` and `capabilities` byte-exact as the upstream sent them (key order and number text kept) |
//! | `upstream_tool_headers` | upstream name (UTF-8)                  | `{"v", "tools": {tool: [{"name", "property"}]}}`: the `Mcp-Param-*` header map derived from the upstream's last `tools/list` (docs/design.md §12 "HTTP front"); only tools with annotated parameters are listed, and a record with none still says the list is known |
//! | `meta`        | `schema`                                         | 4-byte big-endian schema version of the store as a whole |
//! | `meta`        | `secret/<name>`                                  | 32 raw random bytes (see [`TaskStore::secret`]) |
//! | `meta`        | `layout/live_index`                              | `[1]`: the `live` tree is built (stores without it are migrated at open) |
//! | `meta`        | `layout/owner_index`                             | `[1]`: the `owner` tree is built (a store written without it gets it from its task records at open, once) |
//! | `meta`        | `layout/tenant_index`                            | `[1]`: the `tenant_status` tree is built (likewise) |
//! | `meta`        | `idem_of/<task id>`                              | raw idempotency index key of a keyed live task; moved into the tombstone's `idempotency_index_key` on expiry |
//! | `meta`        | `layout/seen_since`                              | 8-byte big-endian ms since the epoch from which this store tracks reads: `0` for a store created with the `seen` tree, the time of the first open by a gateway that has it for an older store. A task that turned terminal (`last_updated_at_ms`) before it counts as seen at expiry, since whether it was read is unknown |
//! | `seen`        | task id                                          | `{"v", "at_ms"}`: the task's owner received its terminal snapshot (a `tasks/get` or a `notifications/tasks`), first at `at_ms`. Only the key's presence matters (a newer `v` is still a mark); written once per task by [`TaskStore::mark_seen`], so a read never rewrites the task record |
//! | `sessions`    | session id (UTF-8)                               | [`SessionRecord`] JSON: a 2025-era client session (docs/design.md §22 "Clients of the 2025 era"); `client_info` and `client_capabilities` byte-exact as the client sent them |
//! | `session_owner` | 4-byte big-endian tenant length ++ tenant ++ 4-byte big-endian subject length ++ subject ++ session id | empty; one entry per session, so a prefix scan counts and lists a principal's sessions |
//!
//! Lifetimes: a task, its `expiry` entry, its `owner` entry and its `seen` mark live
//! until [`TaskStore::expire`]; its idempotency entry lives as long as the task *and* its
//! tombstone (docs/design.md §9 "Idempotency") and is deleted by [`TaskStore::sweep_tombstones`] together
//! with the tombstone. Request routes live until [`TaskStore::remove_route`]. An
//! upstream identity is rewritten only when an `initialize` answers differently and is
//! never deleted (an upstream removed from the configuration leaves one small record);
//! the same holds for an upstream's tool header map and its `tools/list`.
//! A session lives until it is deleted, expired idle or evicted at its principal's cap
//! (the engine decides which); sessions are never flushed on their own, since one lost
//! to a crash only costs its client a new `initialize`.
//!
//! # Performance
//!
//! `benches/store_throughput.rs` measures durable creations per second in each mode;
//! its dated results are in benches/RESULTS.md "The sled group commit". See
//! `SLED_MODE` for the mode choice.

mod codec;
mod expiry;
mod export;
mod flusher;
mod live;
mod meta;
mod open;
mod owner;
mod purge;
mod schema;
mod sessions;
mod tasks;
mod tenant;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{
    Created, Expired, IdempotencyEntry, IoError, Owned, OwnedSession, OwnerCursor, Purged,
    RequestRoute, SessionCreated, SessionRecord, SessionUpdate, StoreError, TaskRecord, TaskStatus,
    TaskStore, TenantCount, Tombstone, Update,
};
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use futures_util::future::BoxFuture;

pub use export::{ExportedClaim, ExportedRecord, ExportedTask, TaskColumns};

type Waiter = oneshot::Sender<Result<(), StoreError>>;

/// The sled-backed [`TaskStore`]. See the module documentation for the contract.
pub struct SledStore {
    db: sled::Db,
    tasks: sled::Tree,
    routes: sled::Tree,
    idempotency: sled::Tree,
    expiry: sled::Tree,
    tombstones: sled::Tree,
    meta: sled::Tree,
    live: sled::Tree,
    seen: sled::Tree,
    /// `meta/layout/seen_since`: tasks that turned terminal before it count as seen.
    seen_since_ms: u64,
    upstream_identity: sled::Tree,
    /// 2025-era client sessions, and each principal's session ids.
    sessions: sled::Tree,
    session_owner: sled::Tree,
    /// Held while a session is created (the count and the write are one step) and
    /// while leftovers of the owner index are dropped.
    session_create: Mutex<()>,
    upstream_tool_headers: sled::Tree,
    /// Each principal's tasks per upstream, in creation order (`tasks/list`).
    owner: sled::Tree,
    /// Each tenant's tasks per status, in creation order (the operator API).
    tenant_status: sled::Tree,
    /// Non-terminal tasks per tenant: the `live` tree counted at open, then kept in
    /// step with it.
    live_counts: Mutex<HashMap<String, i64>>,
    path: PathBuf,
    strict_fsync: bool,
    healthy: AtomicBool,
    /// Blob files already fsynced in strict mode, with the length they had then.
    synced_blobs: Mutex<HashMap<OsString, u64>>,
    flush_tx: mpsc::UnboundedSender<Waiter>,
    /// Group-commit rounds run, and waiters released by them (diagnostics).
    rounds: std::sync::atomic::AtomicU64,
    round_waiters: std::sync::atomic::AtomicU64,
    round_micros: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .field("strict_fsync", &self.strict_fsync)
            .field("healthy", &self.healthy())
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_failed(&self, what: &str, e: sled::Error) -> StoreError {
        self.healthy.store(false, Ordering::SeqCst);
        let e = self.sled_failed(what, e);
        tracing::error!("{e}");
        e.into()
    }

    fn read_failed(&self, what: &str, e: sled::Error) -> StoreError {
        self.sled_failed(what, e).into()
    }

    fn sled_failed(&self, what: &str, e: sled::Error) -> IoError {
        IoError::Sled {
            path: self.path.clone(),
            what: what.to_string().into(),
            source: std::sync::Arc::new(e),
        }
    }

    fn cas(&self, what: &str, r: CasResult) -> Result<Cas, StoreError> {
        match r {
            Ok(Ok(())) => Ok(Cas::Done),
            Ok(Err(e)) => Ok(Cas::Lost(e.current)),
            Err(e) => Err(self.write_failed(what, e)),
        }
    }

    fn put(&self, tree: &sled::Tree, what: &str, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        tree.insert(k, v)
            .map(|_| ())
            .map_err(|e| self.write_failed(what, e))
    }

    fn del(&self, tree: &sled::Tree, what: &str, k: &[u8]) -> Result<bool, StoreError> {
        tree.remove(k)
            .map(|old| old.is_some())
            .map_err(|e| self.write_failed(what, e))
    }
}

type CasResult = Result<Result<(), sled::CompareAndSwapError>, sled::Error>;

/// What a compare-and-swap did.
enum Cas {
    Done,
    /// Somebody else changed the key first; `current` is what is there now.
    Lost(Option<sled::IVec>),
}

impl TaskStore for SledStore {
    fn create<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<Created, StoreError>> {
        Box::pin(async move { SledStore::create(self, task, route, idempotency_key) })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        // Register now: every write that returned before this call is covered by the
        // next flush round that takes this waiter.
        let (tx, rx) = oneshot::channel();
        let registered = self.flush_tx.send(tx).is_ok();
        Box::pin(async move {
            if !registered {
                return Err(StoreError::Closed);
            }
            rx.await.unwrap_or(Err(StoreError::Closed))
        })
    }

    fn get<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        Box::pin(async move { SledStore::get(self, task_id) })
    }

    fn update<'a>(
        &'a self,
        task_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        Box::pin(async move { SledStore::update(self, task_id, f) })
    }

    fn put_route<'a>(&'a self, route: &'a RequestRoute) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { SledStore::put_route(self, route) })
    }

    fn remove_route<'a>(&'a self, route_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { SledStore::remove_route(self, route_id) })
    }

    fn routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        Box::pin(async move { SledStore::routes(self) })
    }

    fn held_routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        // One gateway per sled store: every route is this process's.
        Box::pin(async move { SledStore::routes(self) })
    }

    fn idempotency_get<'a>(
        &'a self,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<IdempotencyEntry>, StoreError>> {
        Box::pin(async move { SledStore::idempotency_get(self, key) })
    }

    fn count_by_status(&self) -> BoxFuture<'_, Result<Vec<(super::TaskStatus, u64)>, StoreError>> {
        Box::pin(async move { SledStore::count_by_status(self) })
    }

    fn expired(&self, now_ms: u64, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async move { SledStore::expired(self, now_ms, limit) })
    }

    fn expire<'a>(
        &'a self,
        task_id: &'a str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Expired>, StoreError>> {
        Box::pin(async move { SledStore::expire(self, task_id, now_ms, tombstone_until_ms) })
    }

    fn mark_seen<'a>(&'a self, task_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { SledStore::mark_seen(self, task_ids) })
    }

    fn lookup_owned<'a>(
        &'a self,
        task_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<Owned, StoreError>> {
        Box::pin(async move { SledStore::lookup_owned(self, task_id, tenant, subject) })
    }

    fn tombstone<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, StoreError>> {
        Box::pin(async move { SledStore::tombstone(self, task_id) })
    }

    fn list_owned<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        upstream: &'a str,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        Box::pin(
            async move { SledStore::list_owned(self, tenant, subject, upstream, after, limit) },
        )
    }

    fn list_tenant<'a>(
        &'a self,
        tenant: &'a str,
        status: TaskStatus,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        Box::pin(async move { SledStore::list_tenant(self, tenant, status, after, limit) })
    }

    fn tenant_counts(&self) -> BoxFuture<'_, Result<Vec<TenantCount>, StoreError>> {
        Box::pin(async move { SledStore::tenant_counts(self) })
    }

    fn sweep_tombstones(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move { SledStore::sweep_tombstones(self, now_ms) })
    }

    fn live_tasks<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { SledStore::live_tasks(self, tenant) })
    }

    fn upstream_identity<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamInfo>, StoreError>> {
        Box::pin(async move { SledStore::upstream_identity(self, name) })
    }

    fn put_upstream_identity<'a>(
        &'a self,
        name: &'a str,
        identity: &'a UpstreamInfo,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { SledStore::put_upstream_identity(self, name, identity) })
    }

    fn upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ToolHeaders>, StoreError>> {
        Box::pin(async move { SledStore::upstream_tool_headers(self, name) })
    }

    fn put_upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
        headers: &'a ToolHeaders,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { SledStore::put_upstream_tool_headers(self, name, headers) })
    }

    fn secret<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<[u8; 32], StoreError>> {
        Box::pin(async move { SledStore::secret(self, name) })
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    fn create_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        cap: usize,
    ) -> BoxFuture<'a, Result<SessionCreated, StoreError>> {
        Box::pin(async move { SledStore::create_session(self, session, cap) })
    }

    fn session_owned<'a>(
        &'a self,
        session_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<OwnedSession, StoreError>> {
        Box::pin(async move { SledStore::session_owned(self, session_id, tenant, subject) })
    }

    fn update_session<'a>(
        &'a self,
        session_id: &'a str,
        f: SessionUpdate<'a>,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, StoreError>> {
        Box::pin(async move { SledStore::update_session(self, session_id, f) })
    }

    fn delete_session<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { SledStore::delete_session(self, session_id, None) })
    }

    fn expire_session<'a>(
        &'a self,
        session_id: &'a str,
        last_seen_before_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(
            async move { SledStore::delete_session(self, session_id, Some(last_seen_before_ms)) },
        )
    }

    fn idle_sessions(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async move { SledStore::idle_sessions(self, before_ms, limit) })
    }

    fn count_sessions(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { SledStore::count_sessions(self) })
    }

    fn purge_tenant<'a>(
        &'a self,
        tenant: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Purged, StoreError>> {
        Box::pin(async move { SledStore::purge_tenant(self, tenant, limit) })
    }
}
