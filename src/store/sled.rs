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
//!   (policy 1) — a failed flush never hands one out (policy 16).
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
//! Measured reason (issue #5): in sled 0.34.7 every transaction and every batch
//! *rolls the log buffer twice* (`PageCache::pin_log`), and every rolled buffer is
//! written at once by a sled I/O thread with `pwrite` + a waited `sync_file_range`.
//! With a transaction per create and per terminal state the gateway did ~2 synchronous
//! log writes per store change, spawned hundreds of short-lived `sled-io` threads and
//! spent ~700 µs of CPU per promoted task; plain writes only fill the log buffer, and
//! one group-commit round writes it once (create+flush 8.3k → 25.5k durable ops/s in
//! `tests::group_commit_throughput`, same run).
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
//!   * `create`: request route → expiry entry → live entry → task (compare-and-swap:
//!     an existing id is refused) → `meta/idem_of` → idempotency claim. A route always
//!     exists before its task, so start-up recovery ([`TaskStore::routes`]) finds every
//!     task a crash may have left `working`; its expiry entry exists too, so it expires.
//!     A losing claim undoes in reverse order, task first.
//!   * `update`: (only when the expiry got earlier) new expiry entry → task → old
//!     expiry entry removed → live entry removed/added when the status crosses
//!     terminal.
//!   * `expire`: tombstone → task removed (compare-and-swap) → `meta/idem_of` →
//!     seen mark → expiry entry → live entry. The owner never sees "not found" in
//!     between; whether the removed seen mark was there is the answer's `seen`.
//!   * `mark_seen`: seen mark → task re-checked, and the mark removed again if the
//!     task is gone. Against a concurrent `expire` either the mark lands before
//!     `expire` removes it (and counts as seen) or the re-check, which runs after the
//!     task's removal, finds the task gone and removes the mark: no mark outlives its
//!     task. (The second case counts the read as unread, as does a mark lost in a
//!     crash: a lost mark can only over-count.)
//!   * `sweep_tombstones`: idempotency entry → seen mark (only if the task is gone)
//!     → tombstone.
//! * **Repairs of what a cut-short operation leaves:** an expiry entry whose task is
//!   gone, or whose task now expires at another time, is dropped or moved by
//!   [`TaskStore::expired`] (with a gone task's `idem_of`); an idempotency entry whose
//!   task and tombstone are both missing reads as absent and is taken over by the next
//!   `create` with that key; live entries of tasks
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
//! version ([`SCHEMA_VERSION`]); a record with a *higher* `v` than this build knows is
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
//! | `upstream_identity` | upstream name (UTF-8)                      | [`UpstreamIdentity`] JSON: `{"v", "protocol_version", "server_info", "capabilities", "instructions"?}`, the upstream's last `initialize` result; `server_info` and `capabilities` byte-exact as the upstream sent them (key order and number text kept) |
//! | `meta`        | `schema`                                         | 4-byte big-endian schema version of the store as a whole |
//! | `meta`        | `secret/<name>`                                  | 32 raw random bytes (see [`TaskStore::secret`]) |
//! | `meta`        | `layout/live_index`                              | `[1]`: the `live` tree is built (stores without it are migrated at open) |
//! | `meta`        | `idem_of/<task id>`                              | raw idempotency index key of a keyed live task; moved into the tombstone's `idempotency_index_key` on expiry |
//! | `meta`        | `layout/seen_since`                              | 8-byte big-endian ms since the epoch from which this store tracks reads: `0` for a store created with the `seen` tree, the time of the first open by a gateway that has it for an older store. A task that turned terminal (`last_updated_at_ms`) before it counts as seen at expiry, since whether it was read is unknown |
//! | `seen`        | task id                                          | `{"v", "at_ms"}`: the task's owner received its terminal snapshot (a `tasks/get` or a `notifications/tasks`), first at `at_ms`. Only the key's presence matters (a newer `v` is still a mark); written once per task by [`TaskStore::mark_seen`], so a read never rewrites the task record |
//!
//! Lifetimes: a task, its `expiry` entry and its `seen` mark live until
//! [`TaskStore::expire`]; its idempotency entry lives as long as the task *and* its
//! tombstone (policy 9) and is deleted by [`TaskStore::sweep_tombstones`] together
//! with the tombstone. Request routes live until [`TaskStore::remove_route`]. An
//! upstream identity is rewritten only when an `initialize` answers differently and is
//! never deleted (an upstream removed from the configuration leaves one small record).
//!
//! # Performance (measured by `tests::group_commit_throughput`)
//!
//! 64 concurrent tokio tasks × 200 × (`create` with idempotency key + `flush().await`),
//! release build, 2 shared cores, ext4 on virtio, 2026-11-30:
//!
//! | mode                   | durable ops/s | p50     | p99     | waiters/round | µs/round |
//! |------------------------|---------------|---------|---------|---------------|----------|
//! | normal, HighThroughput | 20.0k         | 3.05 ms | 6.03 ms | 49.8          | 322      |
//! | normal, LowSpace       | 20.8k         | 2.89 ms | 6.59 ms | 49.8          | 310      |
//! | strict, HighThroughput | 21.1k         | 2.88 ms | 5.40 ms | 49.2          | 608      |
//! | strict, LowSpace       | 19.9k         | 3.03 ms | 6.99 ms | 47.8          | 615      |
//!
//! Before (one sled transaction per create, no yield before a round; same machine,
//! earlier the same day): 8.3k / 8.6k / 9.8k / 9.1k durable ops/s, p99 17–20 ms,
//! 7–14 waiters per round. With transactions gone the bottleneck is the CPU cost of
//! the single-key writes themselves (sled copies a leaf node on every write); a
//! round's `sync_file_range` is ≈ 0.3 ms, a strict round's extra `fsync` ≈ 0.3 ms more
//! and is shared by ~50 waiters, so strict mode costs little under concurrency (each
//! lone flush still pays a full fsync). See `SLED_MODE` for the mode choice.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rand::RngCore;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use super::{
    BoxFuture, Created, Expired, IdempotencyEntry, RequestRoute, SCHEMA_VERSION, StoreError,
    TaskRecord, TaskStore, Tombstone, Update, UpstreamIdentity,
};
use crate::config::StoreConfig;

/// sled storage mode. Measured with `tests::group_commit_throughput` (64 × 200
/// create+flush, 5 alternating runs on a shared, loaded 2-core machine), durable ops/s:
/// normal mode HighThroughput 5.7k/8.1k/9.5k/6.4k/9.4k vs LowSpace
/// 5.1k/8.8k/11.1k/6.3k/9.8k; strict mode HighThroughput 4.8k/6.7k/10.9k/5.8k/6.3k vs
/// LowSpace 4.8k/6.2k/8.7k/5.2k/10.5k (measured when each create was a sled
/// transaction; without them both modes give ~20k, see the module docs). No consistent
/// winner: the spread between runs exceeds the difference between modes. HighThroughput is kept:
/// sled's mode for write-heavy use (LowSpace trades write speed for disk space).
const SLED_MODE: sled::Mode = sled::Mode::HighThroughput;

/// How long `open` waits for sled's directory lock (see `open_with_mode`).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

const META_SCHEMA: &[u8] = b"schema";
const META_SECRET: &str = "secret/";
/// Counters of stores written before the live index (dropped when it is built).
const META_LIVE: &str = "live/";
/// Present once the `live` tree has been built for this store.
const META_LIVE_INDEX: &[u8] = b"layout/live_index";
const META_IDEM_OF: &str = "idem_of/";
/// Since when this store tracks reads (8-byte big-endian ms; module docs, "Schema").
const META_SEEN_SINCE: &[u8] = b"layout/seen_since";

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
    /// Open (create) the store at `cfg.path`. Errors name the path.
    ///
    /// Must be called inside a tokio runtime: it spawns the group-commit flusher task on
    /// it (an error, not a panic, otherwise). Blocking: it may wait up to 2 s for sled's
    /// directory lock if this process just closed the same store; a store held by
    /// another live process fails after that with [`StoreError::Locked`].
    pub fn open(cfg: &StoreConfig) -> Result<Arc<Self>, StoreError> {
        Self::open_with_mode(cfg, SLED_MODE)
    }

    fn open_with_mode(cfg: &StoreConfig, mode: sled::Mode) -> Result<Arc<Self>, StoreError> {
        let path = cfg.path.clone();
        let ctx = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Io(format!("store at {}: {what}: {e}", path.display()))
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| ctx("SledStore::open needs a tokio runtime", &e))?;
        let config = sled::Config::new()
            .path(&path)
            .cache_capacity(cfg.cache_capacity_bytes)
            .mode(mode);
        // sled locks the directory (flock on `db`). After the previous handle in this
        // process is dropped, sled's background I/O threads may hold the file open a
        // moment longer (sled's own tests block on the lock for this reason), so a lock
        // conflict is retried briefly. Another live process keeps it: then we fail.
        // A failed lock leaves the store as it was: sled only creates what is missing
        // (`blobs/`, `conf`, `db`) before it tries the lock.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                Err(e) if e.to_string().contains("could not acquire lock") => {
                    if std::time::Instant::now() >= deadline {
                        return Err(StoreError::Locked(path.clone()));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(ctx("cannot open sled database", &e)),
            }
        };
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| ctx(&format!("cannot open tree {name}"), &e))
        };
        let tasks = tree("tasks")?;
        let routes = tree("routes")?;
        let idempotency = tree("idempotency")?;
        let expiry = tree("expiry")?;
        let tombstones = tree("tombstones")?;
        let meta = tree("meta")?;
        let live = tree("live")?;
        let seen = tree("seen")?;
        let upstream_identity = tree("upstream_identity")?;

        // Store-wide schema version: refuse a store written by a newer gateway.
        match meta
            .get(META_SCHEMA)
            .map_err(|e| ctx("cannot read meta/schema", &e))?
        {
            Some(v) => {
                let v = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| {
                        StoreError::Corrupt(format!(
                            "store at {}: meta/schema is not a 4-byte version",
                            path.display()
                        ))
                    })?;
                if v > SCHEMA_VERSION {
                    return Err(StoreError::Corrupt(format!(
                        "store at {} has schema version {v}, newer than this gateway's {SCHEMA_VERSION}",
                        path.display()
                    )));
                }
                if v < SCHEMA_VERSION {
                    meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())
                        .map_err(|e| ctx("cannot write meta/schema", &e))?;
                }
            }
            None => {
                meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())
                    .map_err(|e| ctx("cannot write meta/schema", &e))?;
            }
        }

        // Read tracking starts with the first open that knows the `seen` tree; for a
        // store that already holds tasks, reads before now were never recorded.
        let (seen_since_ms, seen_since_new) = match meta
            .get(META_SEEN_SINCE)
            .map_err(|e| ctx("cannot read meta/layout/seen_since", &e))?
        {
            Some(v) => {
                let since = <[u8; 8]>::try_from(v.as_ref())
                    .map(u64::from_be_bytes)
                    .map_err(|_| {
                        StoreError::Corrupt(format!(
                            "store at {}: meta/layout/seen_since is not an 8-byte time",
                            path.display()
                        ))
                    })?;
                (since, false)
            }
            None => {
                let since = if tasks.is_empty() { 0 } else { super::now_ms() };
                meta.insert(META_SEEN_SINCE, &since.to_be_bytes())
                    .map_err(|e| ctx("cannot write meta/layout/seen_since", &e))?;
                (since, true)
            }
        };

        let (flush_tx, flush_rx) = mpsc::unbounded_channel();
        let store = Arc::new(Self {
            db,
            tasks,
            routes,
            idempotency,
            expiry,
            tombstones,
            meta,
            live,
            seen,
            seen_since_ms,
            upstream_identity,
            live_counts: Mutex::new(HashMap::new()),
            path: path.clone(),
            strict_fsync: cfg.strict_fsync,
            healthy: AtomicBool::new(true),
            synced_blobs: Mutex::new(HashMap::new()),
            flush_tx,
            rounds: Default::default(),
            round_waiters: Default::default(),
            round_micros: Default::default(),
        });
        if seen_since_new {
            // Durable at once: recomputed after a crash it would move later, and unread
            // tasks that finished in between would count as seen.
            store.flush_blocking()?;
        }
        store.load_live_index()?;
        runtime.spawn(run_flusher(flush_rx, Arc::downgrade(&store)));
        tracing::info!(
            path = %path.display(),
            strict_fsync = cfg.strict_fsync,
            "store opened"
        );
        Ok(store)
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One flush round: sled `flush()` plus, in strict mode, fsync of the files.
    /// Blocking; runs on a `spawn_blocking` thread (or, for `secret`, inline).
    fn flush_blocking(&self) -> Result<(), StoreError> {
        let res = self
            .db
            .flush()
            .map(|_| ())
            .map_err(|e| format!("flush of store at {} failed: {e}", self.path.display()))
            .and_then(|()| {
                if self.strict_fsync {
                    self.fsync_files().map_err(|e| {
                        format!("fsync of store at {} failed: {e}", self.path.display())
                    })
                } else {
                    Ok(())
                }
            });
        res.map_err(|msg| {
            self.healthy.store(false, Ordering::SeqCst);
            tracing::error!("{msg}");
            StoreError::Io(msg)
        })
    }

    /// Strict mode: fsync every data file, new/grown blob files and the directories.
    fn fsync_files(&self) -> io::Result<()> {
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            if ft.is_file() {
                sync_path(&entry.path())?;
            } else if ft.is_dir() && entry.file_name() == "blobs" {
                self.fsync_blobs(&entry.path())?;
            }
        }
        sync_path(&self.path)
    }

    fn fsync_blobs(&self, dir: &Path) -> io::Result<()> {
        let mut synced = self
            .synced_blobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut seen = HashMap::with_capacity(synced.len());
        let mut any_new = false;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if !meta.is_file() {
                continue;
            }
            let name = entry.file_name();
            let len = meta.len();
            if synced.get(&name) != Some(&len) {
                sync_path(&entry.path())?;
                any_new = true;
            }
            seen.insert(name, len);
        }
        if any_new || seen.len() != synced.len() {
            sync_path(dir)?;
        }
        *synced = seen;
        Ok(())
    }

    fn write_failed(&self, what: &str, e: &sled::Error) -> StoreError {
        self.healthy.store(false, Ordering::SeqCst);
        let msg = format!("store at {}: {what}: {e}", self.path.display());
        tracing::error!("{msg}");
        StoreError::Io(msg)
    }

    fn read_failed(&self, what: &str, e: &sled::Error) -> StoreError {
        StoreError::Io(format!("store at {}: {what}: {e}", self.path.display()))
    }
}

/// fsync one file or directory; a file that vanished meanwhile (sled removes old
/// snapshots and blobs) is skipped.
fn sync_path(p: &Path) -> io::Result<()> {
    match File::open(p) {
        Ok(f) => f.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Scheduler yields before a round takes its waiters (see `run_flusher`).
const LINGER_YIELDS: usize = 1;

/// The group-commit flusher task (see the module docs).
async fn run_flusher(mut rx: mpsc::UnboundedReceiver<Waiter>, store: Weak<SledStore>) {
    let mut round: Vec<Waiter> = Vec::new();
    while let Some(first) = rx.recv().await {
        round.push(first);
        // Let writers that are already runnable reach their flush first, so one round
        // covers them (fewer, larger rounds: each costs a log write, a
        // `sync_file_range` and two thread handoffs). Free when idle: with nothing
        // else runnable a yield returns at once.
        for _ in 0..LINGER_YIELDS {
            tokio::task::yield_now().await;
        }
        while let Ok(w) = rx.try_recv() {
            round.push(w);
        }
        // Every waiter in `round` registered before this flush starts.
        let result = match store.upgrade() {
            None => Err(StoreError::Closed),
            Some(store) => {
                let n = round.len() as u64;
                tokio::task::spawn_blocking(move || {
                    let t0 = std::time::Instant::now();
                    let r = store.flush_blocking();
                    crate::metrics::store_flush_round(n);
                    store.rounds.fetch_add(1, Ordering::Relaxed);
                    store.round_waiters.fetch_add(n, Ordering::Relaxed);
                    store.round_micros.fetch_add(
                        u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX),
                        Ordering::Relaxed,
                    );
                    r
                })
                .await
                .unwrap_or_else(|e| Err(StoreError::Io(format!("store flush task failed: {e}"))))
            }
        };
        for w in round.drain(..) {
            let _ = w.send(result.clone());
        }
    }
}

// ---------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------

fn key_str(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

fn expiry_key(expires_at_ms: u64, task_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + task_id.len());
    k.extend_from_slice(&expires_at_ms.to_be_bytes());
    k.extend_from_slice(task_id.as_bytes());
    k
}

fn meta_key(prefix: &str, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + rest.len());
    k.extend_from_slice(prefix.as_bytes());
    k.extend_from_slice(rest);
    k
}

/// Only `v` of a record, to pick the fast path.
#[derive(serde::Deserialize)]
struct VersionProbe {
    #[serde(default)]
    v: Option<Value>,
}

/// The stored form of an idempotency entry (the trait type has no `v`).
#[derive(Serialize, serde::Deserialize)]
struct StoredIdempotency {
    v: u32,
    task_id: String,
    args_fingerprint: String,
}

/// The stored form of a read mark (`seen` tree). Only its presence is read.
#[derive(Serialize)]
struct StoredSeen {
    v: u32,
    at_ms: u64,
}

/// A stored record type: it carries its schema version in `v`.
trait Record: DeserializeOwned {
    fn version(&self) -> u32;
}

macro_rules! records {
    ($($t:ty),*) => {
        $(impl Record for $t {
            fn version(&self) -> u32 {
                self.v
            }
        })*
    };
}
records!(
    TaskRecord,
    RequestRoute,
    Tombstone,
    StoredIdempotency,
    UpstreamIdentity
);

/// Decode a versioned JSON record of `tree` at `key`. A current-version record is
/// parsed once (every `tasks/get` reads one); older ones are upgraded via `upgrade`
/// (fills defaults); newer ones are `Corrupt`.
fn decode<T: Record>(
    tree: &str,
    key: &[u8],
    bytes: &[u8],
    upgrade: fn(&mut Map<String, Value>),
) -> Result<T, StoreError> {
    if let Ok(rec) = serde_json::from_slice::<T>(bytes)
        && rec.version() == SCHEMA_VERSION
    {
        return Ok(rec);
    }
    let corrupt = |why: String| StoreError::Corrupt(format!("{tree}/{}: {why}", key_str(key)));
    let probe: VersionProbe =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a JSON record: {e}")))?;
    let version = match probe.v {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| corrupt(format!("schema version {v} is not an integer")))?,
    };
    if version > u64::from(SCHEMA_VERSION) {
        return Err(corrupt(format!(
            "schema version {version} is newer than this gateway's {SCHEMA_VERSION}"
        )));
    }
    if version == u64::from(SCHEMA_VERSION) {
        return serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()));
    }
    let mut value: Value =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a JSON record: {e}")))?;
    let map = value
        .as_object_mut()
        .ok_or_else(|| corrupt("not a JSON object".into()))?;
    upgrade(map);
    map.insert("v".into(), Value::from(SCHEMA_VERSION));
    serde_json::from_value(value).map_err(|e| corrupt(format!("version {version}: {e}")))
}

/// A field name and the default an older record gets when it lacks the field.
type FieldDefault = (&'static str, fn() -> Value);

fn fill(map: &mut Map<String, Value>, defaults: &[FieldDefault]) {
    for (k, d) in defaults {
        if !map.contains_key(*k) {
            map.insert((*k).to_string(), d());
        }
    }
}

fn upgrade_task(map: &mut Map<String, Value>) {
    fill(
        map,
        &[
            ("idempotency_key", || Value::Null),
            ("status_message", || Value::Null),
            ("result", || Value::Null),
            ("error", || Value::Null),
            ("input_requests", || Value::Object(Map::new())),
            ("issued_keys", || Value::Array(Vec::new())),
            ("cancel_requested", || Value::Bool(false)),
        ],
    );
}

fn upgrade_route(map: &mut Map<String, Value>) {
    fill(map, &[("task_id", || Value::Null)]);
}

fn upgrade_tombstone(map: &mut Map<String, Value>) {
    fill(map, &[("idempotency_index_key", || Value::Null)]);
}

fn upgrade_none(_: &mut Map<String, Value>) {}

fn encode<T: Serialize>(tree: &str, key: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value)
        .map_err(|e| StoreError::Corrupt(format!("{tree}/{key}: cannot encode: {e}")))
}

/// Encode a task with `v` forced to the current schema version.
fn encode_task(task: &TaskRecord) -> Result<Vec<u8>, StoreError> {
    if task.v == SCHEMA_VERSION {
        encode("tasks", &task.task_id, task)
    } else {
        let mut t = task.clone();
        t.v = SCHEMA_VERSION;
        encode("tasks", &task.task_id, &t)
    }
}

fn encode_route(route: &RequestRoute) -> Result<Vec<u8>, StoreError> {
    if route.v == SCHEMA_VERSION {
        encode("routes", &route.route_id, route)
    } else {
        let mut r = route.clone();
        r.v = SCHEMA_VERSION;
        encode("routes", &route.route_id, &r)
    }
}

fn decode_idempotency(key: &[u8], bytes: &[u8]) -> Result<IdempotencyEntry, StoreError> {
    let s: StoredIdempotency = decode("idempotency", key, bytes, upgrade_none)?;
    Ok(IdempotencyEntry {
        task_id: s.task_id,
        args_fingerprint: s.args_fingerprint,
    })
}

/// Key of a live-index entry: 4-byte big-endian tenant length ++ tenant ++ task id (the
/// length prefix keeps any tenant string unambiguous).
fn live_key(tenant: &str, task_id: &str) -> Vec<u8> {
    let t = tenant.as_bytes();
    // A tenant claim of 4 GiB cannot pass the request size limit.
    let len = u32::try_from(t.len()).unwrap_or(u32::MAX);
    let mut k = Vec::with_capacity(4 + t.len() + task_id.len());
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(t);
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// Split a live-index key into (tenant, task id).
fn split_live_key(k: &[u8]) -> Option<(&str, &str)> {
    let len = usize::try_from(u32::from_be_bytes(k.get(..4)?.try_into().ok()?)).ok()?;
    let tenant = std::str::from_utf8(k.get(4..4usize.checked_add(len)?)?).ok()?;
    let task = std::str::from_utf8(k.get(4 + len..)?).ok()?;
    Some((tenant, task))
}

/// The few fields the index checks need, without decoding a whole record.
#[derive(serde::Deserialize)]
struct IndexProbe {
    tenant: String,
    status: super::TaskStatus,
    expires_at_ms: u64,
}

fn probe(key: &[u8], bytes: &[u8]) -> Result<IndexProbe, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Corrupt(format!("tasks/{}: {e}", key_str(key))))
}

type CasResult = Result<Result<(), sled::CompareAndSwapError>, sled::Error>;

/// What a compare-and-swap did.
enum Cas {
    Done,
    /// Somebody else changed the key first; `current` is what is there now.
    Lost(Option<sled::IVec>),
}

impl SledStore {
    fn cas(&self, what: &str, r: CasResult) -> Result<Cas, StoreError> {
        match r {
            Ok(Ok(())) => Ok(Cas::Done),
            Ok(Err(e)) => Ok(Cas::Lost(e.current)),
            Err(e) => Err(self.write_failed(what, &e)),
        }
    }

    fn put(&self, tree: &sled::Tree, what: &str, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        tree.insert(k, v)
            .map(|_| ())
            .map_err(|e| self.write_failed(what, &e))
    }

    fn del(&self, tree: &sled::Tree, what: &str, k: &[u8]) -> Result<bool, StoreError> {
        tree.remove(k)
            .map(|old| old.is_some())
            .map_err(|e| self.write_failed(what, &e))
    }

    /// Enter a non-terminal task into the live index; the in-memory count follows the
    /// index (only an entry that was not there yet counts).
    fn mark_live(&self, tenant: &str, task_id: &str) -> Result<(), StoreError> {
        let fresh = self
            .live
            .insert(live_key(tenant, task_id), &[] as &[u8])
            .map_err(|e| self.write_failed("mark task live", &e))?
            .is_none();
        if fresh {
            self.count_live(tenant, 1);
        }
        Ok(())
    }

    fn unmark_live(&self, tenant: &str, task_id: &str) -> Result<(), StoreError> {
        if self.del(&self.live, "unmark task live", &live_key(tenant, task_id))? {
            self.count_live(tenant, -1);
        }
        Ok(())
    }

    /// Signed, so the order in which racing increments and decrements land does not
    /// matter: the sum is exact.
    fn count_live(&self, tenant: &str, delta: i64) {
        let mut counts = self.live_counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(tenant.to_string()).or_insert(0);
        *n += delta;
        if *n == 0 {
            counts.remove(tenant);
        }
    }

    /// At open: build the live index once for a store written before it existed
    /// (such stores kept counters under `meta/live/<tenant>`), then count it, dropping
    /// entries a crash left behind (task gone or already terminal).
    fn load_live_index(&self) -> Result<(), StoreError> {
        let built = self
            .meta
            .get(META_LIVE_INDEX)
            .map_err(|e| self.read_failed("get meta/layout", &e))?
            .is_some();
        if !built {
            for kv in self.tasks.iter() {
                let (k, v) = kv.map_err(|e| self.read_failed("scan tasks", &e))?;
                let p = probe(&k, &v)?;
                if !p.status.is_terminal() {
                    let id = std::str::from_utf8(&k).map_err(|_| {
                        StoreError::Corrupt(format!("tasks: key {:?} is not UTF-8", k.as_ref()))
                    })?;
                    self.put(
                        &self.live,
                        "build live index",
                        &live_key(&p.tenant, id),
                        &[],
                    )?;
                }
            }
            for kv in self.meta.scan_prefix(META_LIVE) {
                let (k, _) = kv.map_err(|e| self.read_failed("scan meta/live", &e))?;
                self.del(&self.meta, "drop old live counter", &k)?;
            }
            self.put(&self.meta, "write meta/layout", META_LIVE_INDEX, &[1])?;
            self.flush_blocking()?;
        }
        for kv in self.live.iter() {
            let (k, _) = kv.map_err(|e| self.read_failed("scan live index", &e))?;
            let (tenant, id) = split_live_key(&k).ok_or_else(|| {
                StoreError::Corrupt(format!("live: malformed key {:?}", k.as_ref()))
            })?;
            let live = match self
                .tasks
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get task", &e))?
            {
                Some(v) => {
                    let p = probe(id.as_bytes(), &v)?;
                    !p.status.is_terminal() && p.tenant == tenant
                }
                None => false,
            };
            if live {
                self.count_live(tenant, 1);
            } else {
                self.del(&self.live, "drop stale live entry", &k)?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// TaskStore
// ---------------------------------------------------------------------------------

/// The operations themselves, synchronous: sled works on its page cache and log
/// buffer, so none of them waits for I/O worth yielding for (flushes go through the
/// group-commit flusher). The [`TaskStore`] impl below runs them; the crate's own tests
/// call them directly.
impl SledStore {
    /// Write order (module docs, "Concurrency contract"): route, expiry entry, live
    /// entry, task, `idem_of`, idempotency claim.
    pub(crate) fn create(
        &self,
        task: &TaskRecord,
        route: &RequestRoute,
        idempotency_key: Option<&[u8]>,
    ) -> Result<Created, StoreError> {
        let task_bytes = encode_task(task)?;
        let route_bytes = encode_route(route)?;
        let id = task.task_id.as_bytes();
        let route_id = route.route_id.as_bytes();
        let duplicate = || {
            StoreError::Corrupt(format!(
                "tasks/{}: a task with this id already exists",
                task.task_id
            ))
        };
        // Refused before anything is written, so no undo can touch the other task's
        // index entries (the compare-and-swap below still guards a same-id race).
        if self
            .tasks
            .contains_key(id)
            .map_err(|e| self.read_failed("get task", &e))?
        {
            return Err(duplicate());
        }

        self.put(&self.routes, "create: route", route_id, &route_bytes)?;
        // Index entries before the task: a task that a crash cuts short still expires,
        // and a task that turns terminal at once (a duplicate's cancel) is never
        // counted live after the fact. Entries without a task are dropped lazily.
        let exp = expiry_key(task.expires_at_ms, &task.task_id);
        self.put(&self.expiry, "create: expiry entry", &exp, &[])?;
        let live = !task.status.is_terminal();
        if live {
            self.mark_live(&task.tenant, &task.task_id)?;
        }
        let r = self
            .tasks
            .compare_and_swap(id, None as Option<&[u8]>, Some(task_bytes));
        if let Cas::Lost(_) = self.cas("create: task", r)? {
            self.del(&self.routes, "create: undo route", route_id)?;
            return Err(duplicate());
        }
        if let Some(k) = idempotency_key {
            let ours = encode(
                "idempotency",
                &task.task_id,
                &StoredIdempotency {
                    v: SCHEMA_VERSION,
                    task_id: task.task_id.clone(),
                    args_fingerprint: task.args_fingerprint.clone(),
                },
            )?;
            // Before the claim: expiry moves it into the tombstone, so the claim is
            // swept with it; a crash never leaves a claim its tombstone would not name.
            let idem_of = meta_key(META_IDEM_OF, id);
            self.put(&self.meta, "create: idem_of", &idem_of, k)?;
            let mut expect: Option<sled::IVec> = None;
            loop {
                let r =
                    self.idempotency
                        .compare_and_swap(k, expect.as_ref(), Some(ours.as_slice()));
                let current = match self.cas("create: idempotency entry", r)? {
                    Cas::Done => break,
                    Cas::Lost(current) => current,
                };
                match current {
                    // Removed meanwhile (its tombstone was swept): claim it afresh.
                    None => expect = None,
                    Some(v) => {
                        let entry = decode_idempotency(k, &v)?;
                        if self.names_nothing(&entry.task_id)? {
                            expect = Some(v);
                            continue;
                        }
                        // Another call owns the key: undo ours (nobody saw its id),
                        // task first so nothing names a half-removed task.
                        self.del(&self.tasks, "create: undo task", id)?;
                        self.del(&self.meta, "create: undo idem_of", &idem_of)?;
                        if live {
                            self.unmark_live(&task.tenant, &task.task_id)?;
                        }
                        self.del(&self.expiry, "create: undo expiry entry", &exp)?;
                        self.del(&self.routes, "create: undo route", route_id)?;
                        return Ok(Created::Existing(entry));
                    }
                }
            }
        }
        Ok(Created::New)
    }

    pub(crate) fn get(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.read_task(task_id.as_bytes())?.map(|(_, rec)| rec))
    }

    /// A compare-and-swap loop: `f` may run more than once (again on a freshly read
    /// record whenever another writer changed the task in between). A changed
    /// `task_id` is ignored: the record stays under its key.
    pub(crate) fn update(
        &self,
        task_id: &str,
        f: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let key = task_id.as_bytes();
        loop {
            let Some((bytes, old)) = self.read_task(key)? else {
                return Ok(None);
            };
            let mut rec = old.clone();
            if !f(&mut rec) {
                return Ok(Some(old));
            }
            rec.task_id = task_id.to_string();
            rec.v = SCHEMA_VERSION;
            let new_bytes = encode_task(&rec)?;
            // An earlier expiry needs its entry before the record says so (a crash
            // must not leave the entry late; a spare earlier entry is repaired by
            // `expired`). A later one needs no write: the old, earlier entry comes due
            // first and `expired` moves it then — every completed task moves its
            // expiry by the retention time.
            let earlier = rec.expires_at_ms < old.expires_at_ms;
            if earlier {
                let new = expiry_key(rec.expires_at_ms, task_id);
                self.put(&self.expiry, "update: expiry entry", &new, &[])?;
            }
            let r = self
                .tasks
                .compare_and_swap(key, Some(&bytes), Some(new_bytes));
            if let Cas::Lost(_) = self.cas("update task", r)? {
                continue;
            }
            if earlier {
                let gone = expiry_key(old.expires_at_ms, task_id);
                self.del(&self.expiry, "update: old expiry entry", &gone)?;
            }
            let (was, is) = (!old.status.is_terminal(), !rec.status.is_terminal());
            if was && (!is || old.tenant != rec.tenant) {
                self.unmark_live(&old.tenant, task_id)?;
            }
            if is && (!was || old.tenant != rec.tenant) {
                self.mark_live(&rec.tenant, task_id)?;
            }
            return Ok(Some(rec));
        }
    }

    pub(crate) fn put_route(&self, route: &RequestRoute) -> Result<(), StoreError> {
        let bytes = encode_route(route)?;
        self.put(&self.routes, "put route", route.route_id.as_bytes(), &bytes)
    }

    pub(crate) fn remove_route(&self, route_id: &str) -> Result<(), StoreError> {
        self.del(&self.routes, "remove route", route_id.as_bytes())
            .map(|_| ())
    }

    pub(crate) fn routes(&self) -> Result<Vec<RequestRoute>, StoreError> {
        let mut out = Vec::new();
        for kv in self.routes.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan routes", &e))?;
            out.push(decode("routes", &k, &v, upgrade_route)?);
        }
        Ok(out)
    }

    /// A claim whose task and tombstone are both gone counts as absent (the next
    /// `create` with the key takes it over): only writes lost out of order can leave
    /// one, and it must not refuse its key forever.
    pub(crate) fn idempotency_get(
        &self,
        key: &[u8],
    ) -> Result<Option<IdempotencyEntry>, StoreError> {
        let entry = match self.idempotency.get(key) {
            Ok(None) => return Ok(None),
            Ok(Some(b)) => decode_idempotency(key, &b)?,
            Err(e) => return Err(self.read_failed("get idempotency entry", &e)),
        };
        if self.names_nothing(&entry.task_id)? {
            return Ok(None);
        }
        Ok(Some(entry))
    }

    pub(crate) fn count_by_status(&self) -> Result<Vec<(super::TaskStatus, u64)>, StoreError> {
        let mut counts: Vec<(super::TaskStatus, u64)> = Vec::new();
        for kv in self.tasks.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan tasks", &e))?;
            let status = probe(&k, &v)?.status;
            match counts.iter_mut().find(|(s, _)| *s == status) {
                Some((_, n)) => *n += 1,
                None => counts.push((status, 1)),
            }
        }
        Ok(counts)
    }

    /// Also repairs the index as it goes: an entry whose task is gone, or whose task
    /// now expires at another time (a crash between an update and its index change),
    /// is replaced by the entry the record calls for.
    pub(crate) fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        let iter = match now_ms.checked_add(1) {
            Some(end) => self.expiry.range(..end.to_be_bytes()),
            None => self.expiry.iter(),
        };
        let mut out = Vec::new();
        for kv in iter {
            if out.len() >= limit {
                break;
            }
            let (k, _) = kv.map_err(|e| self.read_failed("scan expiry", &e))?;
            let parsed = k.get(..8).zip(k.get(8..)).and_then(|(at, id)| {
                let at = u64::from_be_bytes(<[u8; 8]>::try_from(at).ok()?);
                Some((at, std::str::from_utf8(id).ok()?))
            });
            let Some((at, id)) = parsed else {
                return Err(StoreError::Corrupt(format!(
                    "expiry: malformed key {:?}",
                    k.as_ref()
                )));
            };
            let actual = match self
                .tasks
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get task", &e))?
            {
                Some(v) => Some(probe(id.as_bytes(), &v)?.expires_at_ms),
                None => None,
            };
            match actual {
                Some(t) if t == at => out.push(id.to_string()),
                Some(t) => {
                    let right = expiry_key(t, id);
                    self.put(&self.expiry, "repair expiry entry", &right, &[])?;
                    self.del(&self.expiry, "drop stale expiry entry", &k)?;
                    // An update may have moved the expiry to exactly `at` meanwhile
                    // (its entry is the one just dropped): put it back then.
                    if let Some(v) = self
                        .tasks
                        .get(id.as_bytes())
                        .map_err(|e| self.read_failed("get task", &e))?
                        && probe(id.as_bytes(), &v)?.expires_at_ms == at
                    {
                        self.put(&self.expiry, "repair expiry entry", &k, &[])?;
                    }
                }
                None => {
                    // The task is gone: so are the leftovers of its indexes.
                    self.del(&self.seen, "drop stale seen mark", id.as_bytes())?;
                    self.del(&self.expiry, "drop stale expiry entry", &k)?;
                    let idem_of = meta_key(META_IDEM_OF, id.as_bytes());
                    self.del(&self.meta, "drop stale idem_of", &idem_of)?;
                }
            }
        }
        Ok(out)
    }

    /// Tombstone first, then the task: the owner never sees "not found" in between.
    /// The seen mark goes before the expiry entry, so a crash in between leaves the
    /// entry that lets [`TaskStore::expired`] drop the mark.
    pub(crate) fn expire(
        &self,
        task_id: &str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> Result<Option<Expired>, StoreError> {
        let key = task_id.as_bytes();
        let idem_of_key = meta_key(META_IDEM_OF, key);
        loop {
            let Some((bytes, rec)) = self.read_task(key)? else {
                return Ok(None);
            };
            if rec.expires_at_ms > now_ms {
                return Ok(None);
            }
            let idx = self
                .meta
                .get(&idem_of_key)
                .map_err(|e| self.read_failed("get idem_of", &e))?;
            let tomb = Tombstone {
                v: SCHEMA_VERSION,
                task_id: task_id.to_string(),
                tenant: rec.tenant.clone(),
                subject: rec.subject.clone(),
                idempotency_index_key: idx.map(|i| i.to_vec()),
                expires_at_ms: tombstone_until_ms,
            };
            let tomb_bytes = encode("tombstones", task_id, &tomb)?;
            self.put(&self.tombstones, "expire: tombstone", key, &tomb_bytes)?;
            let r = self
                .tasks
                .compare_and_swap(key, Some(&bytes), None as Option<&[u8]>);
            if let Cas::Lost(_) = self.cas("expire: task", r)? {
                continue;
            }
            self.del(&self.meta, "expire: idem_of", &idem_of_key)?;
            let marked = self.del(&self.seen, "expire: seen mark", key)?;
            let exp = expiry_key(rec.expires_at_ms, task_id);
            self.del(&self.expiry, "expire: expiry entry", &exp)?;
            if !rec.status.is_terminal() {
                self.unmark_live(&rec.tenant, task_id)?;
            }
            // A terminal record is never updated again, so `last_updated_at_ms` is
            // when it turned terminal.
            let before_tracking =
                rec.status.is_terminal() && rec.last_updated_at_ms < self.seen_since_ms;
            return Ok(Some(Expired {
                seen: marked || before_tracking,
                record: rec,
            }));
        }
    }

    pub(crate) fn tombstone(&self, task_id: &str) -> Result<Option<Tombstone>, StoreError> {
        match self.tombstones.get(task_id.as_bytes()) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                decode("tombstones", task_id.as_bytes(), &b, upgrade_tombstone).map(Some)
            }
            Err(e) => Err(self.read_failed("get tombstone", &e)),
        }
    }

    /// Idempotency entry and seen mark first, then the tombstone: a crash in between
    /// leaves a tombstone that the next sweep removes again.
    pub(crate) fn sweep_tombstones(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut due = Vec::new();
        for kv in self.tombstones.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan tombstones", &e))?;
            let t: Tombstone = decode("tombstones", &k, &v, upgrade_tombstone)?;
            if t.expires_at_ms <= now_ms {
                due.push((k, v, t));
            }
        }
        let mut swept = 0;
        for (key, bytes, t) in due {
            if let Some(ik) = &t.idempotency_index_key
                && let Some(eb) = self
                    .idempotency
                    .get(ik.as_slice())
                    .map_err(|e| self.read_failed("get idempotency entry", &e))?
                // Only drop the entry if it still names this task.
                && decode_idempotency(ik, &eb)?.task_id == t.task_id
            {
                let r = self.idempotency.compare_and_swap(
                    ik.as_slice(),
                    Some(&eb),
                    None as Option<&[u8]>,
                );
                self.cas("sweep: idempotency entry", r)?;
            }
            // Only a crash leaves a mark behind its task (module docs). A tombstone
            // may also outlive an `expire` that found the task extended: the mark of
            // a task that is still there stays.
            let id = t.task_id.as_bytes();
            if !self
                .tasks
                .contains_key(id)
                .map_err(|e| self.read_failed("get task", &e))?
            {
                self.del(&self.seen, "sweep: seen mark", id)?;
            }
            let r = self
                .tombstones
                .compare_and_swap(&key, Some(&bytes), None as Option<&[u8]>);
            if let Cas::Done = self.cas("sweep: tombstone", r)? {
                swept += 1;
            }
        }
        Ok(swept)
    }

    /// Write order (module docs, "Concurrency contract"): mark, then the task
    /// re-checked. One single-key insert per task not marked yet (no batch: see the
    /// module docs); a task already marked costs a read, no write.
    pub(crate) fn mark_seen(&self, task_ids: &[String]) -> Result<(), StoreError> {
        let at_ms = super::now_ms();
        for id in task_ids {
            let key = id.as_bytes();
            let has = |tree: &sled::Tree, what: &str| {
                tree.contains_key(key)
                    .map_err(|e| self.read_failed(what, &e))
            };
            if has(&self.seen, "get seen mark")? || !has(&self.tasks, "get task")? {
                continue;
            }
            let mark = encode(
                "seen",
                id,
                &StoredSeen {
                    v: SCHEMA_VERSION,
                    at_ms,
                },
            )?;
            self.put(&self.seen, "mark seen", key, &mark)?;
            // Expired meanwhile: its `expire` may have removed the mark before this
            // one landed.
            if !has(&self.tasks, "get task")? {
                self.del(&self.seen, "drop seen mark of an expired task", key)?;
            }
        }
        Ok(())
    }

    pub(crate) fn live_tasks(&self, tenant: &str) -> Result<u64, StoreError> {
        let counts = self.live_counts.lock().unwrap_or_else(|p| p.into_inner());
        Ok(counts
            .get(tenant)
            .map_or(0, |n| u64::try_from(*n).unwrap_or(0)))
    }

    pub(crate) fn upstream_identity(
        &self,
        name: &str,
    ) -> Result<Option<UpstreamIdentity>, StoreError> {
        let key = name.as_bytes();
        match self.upstream_identity.get(key) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => decode("upstream_identity", key, &b, upgrade_none).map(Some),
            Err(e) => Err(self.read_failed("get upstream identity", &e)),
        }
    }

    pub(crate) fn put_upstream_identity(
        &self,
        name: &str,
        identity: &UpstreamIdentity,
    ) -> Result<bool, StoreError> {
        let bytes = if identity.v == SCHEMA_VERSION {
            encode("upstream_identity", name, identity)?
        } else {
            let mut i = identity.clone();
            i.v = SCHEMA_VERSION;
            encode("upstream_identity", name, &i)?
        };
        let key = name.as_bytes();
        let stored = self
            .upstream_identity
            .get(key)
            .map_err(|e| self.read_failed("get upstream identity", &e))?;
        if stored.as_deref() == Some(bytes.as_slice()) {
            return Ok(false);
        }
        self.put(
            &self.upstream_identity,
            "put upstream identity",
            key,
            &bytes,
        )?;
        Ok(true)
    }

    /// Get-or-create; creation is a compare-and-swap (concurrent first calls agree on
    /// one secret) followed by a blocking flush, so the secret is durable before it is
    /// returned the first time. Call it at start-up, not on a hot path.
    pub(crate) fn secret(&self, name: &str) -> Result<[u8; 32], StoreError> {
        let key = meta_key(META_SECRET, name.as_bytes());
        let as_secret = |v: &[u8]| {
            <[u8; 32]>::try_from(v)
                .map_err(|_| StoreError::Corrupt(format!("meta/secret/{name}: not 32 bytes")))
        };
        if let Some(v) = self
            .meta
            .get(&key)
            .map_err(|e| self.read_failed("get secret", &e))?
        {
            return as_secret(&v);
        }
        let mut fresh = [0u8; 32];
        rand::rng().fill_bytes(&mut fresh);
        let r = self
            .meta
            .compare_and_swap(&key, None as Option<&[u8]>, Some(&fresh[..]));
        let secret = match self.cas("create secret", r)? {
            Cas::Done => fresh,
            Cas::Lost(Some(v)) => as_secret(&v)?,
            Cas::Lost(None) => {
                return Err(StoreError::Corrupt(format!(
                    "meta/secret/{name}: compare-and-swap failed without a current value"
                )));
            }
        };
        self.flush_blocking()?;
        Ok(secret)
    }
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

    fn tombstone<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, StoreError>> {
        Box::pin(async move { SledStore::tombstone(self, task_id) })
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
    ) -> BoxFuture<'a, Result<Option<UpstreamIdentity>, StoreError>> {
        Box::pin(async move { SledStore::upstream_identity(self, name) })
    }

    fn put_upstream_identity<'a>(
        &'a self,
        name: &'a str,
        identity: &'a UpstreamIdentity,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { SledStore::put_upstream_identity(self, name, identity) })
    }

    fn secret<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<[u8; 32], StoreError>> {
        Box::pin(async move { SledStore::secret(self, name) })
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }
}

impl SledStore {
    /// A task's stored bytes (for a compare-and-swap against them) and its record.
    fn read_task(&self, key: &[u8]) -> Result<Option<(sled::IVec, TaskRecord)>, StoreError> {
        match self.tasks.get(key) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                let rec = decode("tasks", key, &b, upgrade_task)?;
                Ok(Some((b, rec)))
            }
            Err(e) => Err(self.read_failed("get task", &e)),
        }
    }

    /// Whether an idempotency entry's task is neither stored nor tombstoned: only a
    /// crash can leave such an entry (a live create writes its task before claiming
    /// the key; expiry writes the tombstone before removing the task).
    fn names_nothing(&self, task_id: &str) -> Result<bool, StoreError> {
        let k = task_id.as_bytes();
        let task = self
            .tasks
            .contains_key(k)
            .map_err(|e| self.read_failed("get task", &e))?;
        let tomb = self
            .tombstones
            .contains_key(k)
            .map_err(|e| self.read_failed("get tombstone", &e))?;
        Ok(!task && !tomb)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TaskStatus;
    use std::io::BufRead;
    use std::time::{Duration, Instant};

    fn cfg(path: &Path, strict: bool) -> StoreConfig {
        StoreConfig {
            path: path.to_path_buf(),
            strict_fsync: strict,
            cache_capacity_bytes: 64 * 1024 * 1024,
            ..StoreConfig::default()
        }
    }

    fn task(id: &str, tenant: &str, expires_at_ms: u64) -> TaskRecord {
        TaskRecord {
            v: SCHEMA_VERSION,
            task_id: id.to_string(),
            tenant: tenant.to_string(),
            subject: "alice".to_string(),
            upstream: "demo".to_string(),
            tool: "slow".to_string(),
            args_fingerprint: "fp".to_string(),
            idempotency_key: None,
            status: TaskStatus::Working,
            status_message: None,
            created_at_ms: 1,
            last_updated_at_ms: 1,
            ttl_ms: expires_at_ms.saturating_sub(1),
            poll_interval_ms: 1000,
            expires_at_ms,
            result: None,
            error: None,
            input_requests: Map::new(),
            issued_keys: Vec::new(),
            cancel_requested: false,
        }
    }

    fn route(id: &str, task_id: Option<&str>) -> RequestRoute {
        RequestRoute {
            v: SCHEMA_VERSION,
            route_id: id.to_string(),
            upstream: "demo".to_string(),
            tenant: "acme".to_string(),
            subject: "alice".to_string(),
            method: "tools/call".to_string(),
            started_at_ms: 1,
            deadline_ms: 2,
            task_id: task_id.map(str::to_string),
        }
    }

    fn complete(store: &SledStore, id: &str) {
        let r = store
            .update(id, &mut |t| {
                t.status = TaskStatus::Completed;
                t.result = Some(serde_json::json!({"content": []}));
                true
            })
            .unwrap()
            .unwrap();
        assert_eq!(r.status, TaskStatus::Completed);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn create_get_update_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let t = task("tsk_a", "acme", 1000);
        assert_eq!(
            store.create(&t, &route("r1", Some("tsk_a")), None).unwrap(),
            Created::New
        );
        store.flush().await.unwrap();
        assert_eq!(store.get("tsk_a").unwrap(), Some(t.clone()));
        assert_eq!(store.get("tsk_missing").unwrap(), None);

        let updated = store
            .update("tsk_a", &mut |t| {
                t.status = TaskStatus::InputRequired;
                t.status_message = Some("need input".into());
                t.issued_keys.push("k1".into());
                true
            })
            .unwrap()
            .unwrap();
        assert_eq!(updated.status, TaskStatus::InputRequired);
        assert_eq!(store.get("tsk_a").unwrap(), Some(updated.clone()));

        // `false` leaves the record unchanged even if the closure mutated it.
        let same = store
            .update("tsk_a", &mut |t| {
                t.status = TaskStatus::Failed;
                false
            })
            .unwrap();
        assert_eq!(same, Some(updated.clone()));
        assert_eq!(store.get("tsk_a").unwrap(), Some(updated));
        assert_eq!(store.update("tsk_missing", &mut |_| true).unwrap(), None);

        // A duplicate task id is refused, not overwritten.
        assert!(matches!(
            store.create(&t, &route("r2", None), None),
            Err(StoreError::Corrupt(_))
        ));
        assert!(store.healthy());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn idempotency_sequential_duplicate_returns_existing() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let key: &[u8] = b"acme\0alice\0demo\0slow\0key-1";
        let mut a = task("tsk_a", "acme", 1000);
        a.args_fingerprint = "fp-a".into();
        assert_eq!(
            store.create(&a, &route("ra", None), Some(key)).unwrap(),
            Created::New
        );
        let b = task("tsk_b", "acme", 1000);
        let entry = IdempotencyEntry {
            task_id: "tsk_a".into(),
            args_fingerprint: "fp-a".into(),
        };
        assert_eq!(
            store.create(&b, &route("rb", None), Some(key)).unwrap(),
            Created::Existing(entry.clone())
        );
        // Nothing of the duplicate was written.
        assert_eq!(store.get("tsk_b").unwrap(), None);
        assert_eq!(store.routes().unwrap().len(), 1);
        assert_eq!(store.expired(u64::MAX, 10).unwrap(), vec!["tsk_a"]);
        assert_eq!(store.live_tasks("acme").unwrap(), 1);
        assert_eq!(store.idempotency_get(key).unwrap(), Some(entry));
        assert_eq!(store.idempotency_get(b"other").unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn idempotency_concurrent_creates_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let key: &[u8] = b"acme\0alice\0demo\0slow\0same";
        let barrier = std::sync::Barrier::new(32);
        let results: Vec<(String, Created)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..32)
                .map(|i| {
                    let store = &store;
                    let barrier = &barrier;
                    s.spawn(move || {
                        let id = format!("tsk_{i}");
                        let t = task(&id, "acme", 1000);
                        barrier.wait();
                        let r = store
                            .create(&t, &route(&format!("r{i}"), Some(&id)), Some(key))
                            .unwrap();
                        (id, r)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<&String> = results
            .iter()
            .filter(|(_, r)| *r == Created::New)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(winners.len(), 1, "exactly one create wins");
        let winner = winners[0].clone();
        for (_, r) in &results {
            if let Created::Existing(e) = r {
                assert_eq!(e.task_id, winner);
            }
        }
        store.flush().await.unwrap();
        assert_eq!(store.tasks.len(), 1);
        assert_eq!(store.routes().unwrap().len(), 1);
        assert_eq!(store.expired(u64::MAX, 100).unwrap(), vec![winner.clone()]);
        assert_eq!(store.live_tasks("acme").unwrap(), 1);
        assert_eq!(store.idempotency_get(key).unwrap().unwrap().task_id, winner);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn update_moves_expiry_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        store
            .create(&task("tsk_a", "acme", 1000), &route("ra", None), None)
            .unwrap();
        store
            .create(&task("tsk_b", "acme", 3000), &route("rb", None), None)
            .unwrap();
        assert_eq!(store.expired(999, 10).unwrap(), Vec::<String>::new());
        assert_eq!(store.expired(1000, 10).unwrap(), vec!["tsk_a"]);
        store
            .update("tsk_a", &mut |t| {
                t.expires_at_ms = 5000;
                true
            })
            .unwrap();
        assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
        assert_eq!(store.expired(4999, 10).unwrap(), vec!["tsk_b"]);
        assert_eq!(store.expired(5000, 10).unwrap(), vec!["tsk_b", "tsk_a"]);
        assert_eq!(store.expired(5000, 1).unwrap(), vec!["tsk_b"]);
        assert_eq!(store.expired(u64::MAX, 10).unwrap().len(), 2);
        assert_eq!(store.expiry.len(), 2, "old index entry removed");
        // An earlier expiry moves the entry at once.
        store
            .update("tsk_a", &mut |t| {
                t.expires_at_ms = 2000;
                true
            })
            .unwrap();
        assert_eq!(store.expired(2000, 10).unwrap(), vec!["tsk_a"]);
        assert_eq!(store.expiry.len(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn expire_leaves_tombstone_and_sweep_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let key: &[u8] = b"acme\0alice\0demo\0slow\0k";
        store
            .create(&task("tsk_a", "acme", 1000), &route("ra", None), Some(key))
            .unwrap();
        // Not due yet (re-checked on the record): nothing happens.
        assert_eq!(store.expire("tsk_a", 999, 10_000).unwrap(), None);
        assert!(store.get("tsk_a").unwrap().is_some());
        assert_eq!(store.tombstone("tsk_a").unwrap(), None);
        let gone = store.expire("tsk_a", 1000, 10_000).unwrap().unwrap();
        assert_eq!(gone.record.task_id, "tsk_a");
        assert_eq!(store.get("tsk_a").unwrap(), None);
        assert_eq!(store.expired(u64::MAX, 10).unwrap(), Vec::<String>::new());
        assert_eq!(store.expire("tsk_a", u64::MAX, 10_000).unwrap(), None);
        let tomb = store.tombstone("tsk_a").unwrap().unwrap();
        assert_eq!(
            tomb,
            Tombstone {
                v: SCHEMA_VERSION,
                task_id: "tsk_a".into(),
                tenant: "acme".into(),
                subject: "alice".into(),
                idempotency_index_key: Some(key.to_vec()),
                expires_at_ms: 10_000,
            }
        );
        // The key lives as long as the tombstone.
        assert!(store.idempotency_get(key).unwrap().is_some());
        assert_eq!(store.sweep_tombstones(9_999).unwrap(), 0);
        assert!(store.tombstone("tsk_a").unwrap().is_some());
        assert_eq!(store.sweep_tombstones(10_000).unwrap(), 1);
        assert_eq!(store.tombstone("tsk_a").unwrap(), None);
        assert_eq!(store.idempotency_get(key).unwrap(), None);
        assert_eq!(store.meta.scan_prefix(META_IDEM_OF).count(), 0);
        assert_eq!(store.sweep_tombstones(u64::MAX).unwrap(), 0);
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A read mark is one small entry of its own (the task record is not rewritten),
    /// written once, durable with the next flush, and removed with its task.
    #[tokio::test(flavor = "multi_thread")]
    async fn seen_mark_is_a_small_entry_removed_with_its_task() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        for id in ["tsk_read", "tsk_unread", "tsk_durable"] {
            store
                .create(&task(id, "acme", 1000), &route(id, None), None)
                .unwrap();
            complete(&store, id);
        }
        let record = store.tasks.get("tsk_read").unwrap().unwrap();
        store.mark_seen(&ids(&["tsk_read", "tsk_never"])).unwrap();
        assert_eq!(
            store.tasks.get("tsk_read").unwrap().unwrap(),
            record,
            "the task record is not rewritten"
        );
        assert_eq!(store.seen.len(), 1, "no mark for a task that is not there");
        let mark = store.seen.get("tsk_read").unwrap().unwrap();
        let v: Value = serde_json::from_slice(&mark).unwrap();
        assert_eq!(v["v"], SCHEMA_VERSION, "{v}");
        assert!(mark.len() < 64, "a small entry: {} bytes", mark.len());
        // Marking again writes nothing.
        std::thread::sleep(Duration::from_millis(5));
        store.mark_seen(&ids(&["tsk_read"])).unwrap();
        assert_eq!(store.seen.get("tsk_read").unwrap().unwrap(), mark);

        let gone = store.expire("tsk_read", u64::MAX, 10).unwrap().unwrap();
        assert!(gone.seen);
        assert_eq!(gone.record.status, TaskStatus::Completed);
        assert_eq!(store.seen.len(), 0, "the mark goes with its task");
        let gone = store.expire("tsk_unread", u64::MAX, 10).unwrap().unwrap();
        assert!(!gone.seen);
        // A mark for an expired task is not written.
        store.mark_seen(&ids(&["tsk_read", "tsk_unread"])).unwrap();
        assert_eq!(store.seen.len(), 0);

        store.mark_seen(&ids(&["tsk_durable"])).unwrap();
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert!(
            store
                .expire("tsk_durable", u64::MAX, 10)
                .unwrap()
                .unwrap()
                .seen
        );
    }

    /// Marks written while their tasks expire: none outlives its task.
    #[tokio::test(flavor = "multi_thread")]
    async fn seen_marks_racing_expiry_leave_no_orphans() {
        const N: usize = 400;
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let all: Vec<String> = (0..N).map(|i| format!("tsk_{i}")).collect();
        for id in &all {
            store
                .create(&task(id, "acme", 1000), &route(id, None), None)
                .unwrap();
            complete(&store, id);
        }
        let seen = std::thread::scope(|s| {
            let marker = s.spawn(|| {
                for id in all.iter().rev() {
                    store.mark_seen(std::slice::from_ref(id)).unwrap();
                }
            });
            let sweeper = s.spawn(|| {
                all.iter()
                    .filter(|id| store.expire(id, u64::MAX, 10).unwrap().unwrap().seen)
                    .count()
            });
            marker.join().unwrap();
            sweeper.join().unwrap()
        });
        assert_eq!(store.tasks.len(), 0);
        assert_eq!(store.seen.len(), 0, "a mark outlived its task");
        assert!(seen <= N);
    }

    /// What a crash can leave of a mark (module docs, "Concurrency contract") is
    /// dropped with the task's stale expiry entry or with its tombstone.
    #[tokio::test(flavor = "multi_thread")]
    async fn seen_mark_leftovers_are_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        // `expire` cut short after the task's removal: mark and expiry entry remain.
        store.seen.insert("tsk_cut", &[]).unwrap();
        store
            .expiry
            .insert(expiry_key(500, "tsk_cut"), &[])
            .unwrap();
        assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
        assert_eq!(store.seen.get("tsk_cut").unwrap(), None);
        // A mark that landed after its task's `expire`, re-check lost: the tombstone
        // sweep takes it.
        let tomb = |id: &str| Tombstone {
            v: SCHEMA_VERSION,
            task_id: id.into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            idempotency_index_key: None,
            expires_at_ms: 10,
        };
        store
            .tombstones
            .insert(
                "tsk_late",
                encode("tombstones", "tsk_late", &tomb("tsk_late")).unwrap(),
            )
            .unwrap();
        store.seen.insert("tsk_late", &[]).unwrap();
        // A tombstone beside a task that is still there keeps the task's mark.
        store
            .create(&task("tsk_live", "acme", 1000), &route("rl", None), None)
            .unwrap();
        complete(&store, "tsk_live");
        store.mark_seen(&ids(&["tsk_live"])).unwrap();
        store
            .tombstones
            .insert(
                "tsk_live",
                encode("tombstones", "tsk_live", &tomb("tsk_live")).unwrap(),
            )
            .unwrap();
        assert_eq!(store.sweep_tombstones(10).unwrap(), 2);
        assert_eq!(store.seen.get("tsk_late").unwrap(), None);
        assert!(store.seen.get("tsk_live").unwrap().is_some());
        assert!(
            store
                .expire("tsk_live", u64::MAX, 10)
                .unwrap()
                .unwrap()
                .seen
        );
    }

    /// A store written before read tracking (no `meta/layout/seen_since`): tasks that
    /// were terminal before the upgrade count as seen, later ones are tracked.
    #[tokio::test(flavor = "multi_thread")]
    async fn read_tracking_starts_at_the_upgrade_of_an_older_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.seen_since_ms, 0, "a new store tracks every task");
        for id in ["tsk_old_done", "tsk_old_working"] {
            store
                .create(&task(id, "acme", 1000), &route(id, None), None)
                .unwrap();
        }
        complete(&store, "tsk_old_done");
        // Turn it into the older layout.
        store.meta.remove(META_SEEN_SINCE).unwrap();
        store.flush().await.unwrap();
        drop(store);

        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let since = store.seen_since_ms;
        assert!(since > 1, "{since}");
        store
            .create(&task("tsk_new", "acme", 1000), &route("rn", None), None)
            .unwrap();
        store
            .update("tsk_new", &mut |t| {
                t.status = TaskStatus::Failed;
                t.last_updated_at_ms = crate::store::now_ms();
                true
            })
            .unwrap();
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.seen_since_ms, since, "kept across opens");
        let seen = |id: &str| store.expire(id, u64::MAX, 10).unwrap().unwrap().seen;
        assert!(seen("tsk_old_done"), "terminal before tracking: unknown");
        assert!(!seen("tsk_old_working"), "never terminal");
        assert!(!seen("tsk_new"), "terminal since tracking, never read");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn routes_put_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        store
            .create(
                &task("tsk_a", "acme", 1000),
                &route("r1", Some("tsk_a")),
                None,
            )
            .unwrap();
        store.put_route(&route("r2", None)).unwrap();
        let mut r2b = route("r2", None);
        r2b.deadline_ms = 99;
        store.put_route(&r2b).unwrap();
        let mut ids: Vec<_> = store.routes().unwrap();
        ids.sort_by(|a, b| a.route_id.cmp(&b.route_id));
        assert_eq!(ids, vec![route("r1", Some("tsk_a")), r2b]);
        store.remove_route("r1").unwrap();
        store.remove_route("nope").unwrap();
        assert_eq!(store.routes().unwrap().len(), 1);
        store.remove_route("r2").unwrap();
        assert!(store.routes().unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn live_tasks_counter() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        for id in ["a1", "a2", "a3"] {
            store
                .create(&task(id, "acme", 1000), &route(id, None), None)
                .unwrap();
        }
        store
            .create(&task("b1", "beta", 1000), &route("b1", None), None)
            .unwrap();
        let mut done = task("a4", "acme", 1000);
        done.status = TaskStatus::Failed;
        store.create(&done, &route("a4", None), None).unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 3);
        assert_eq!(store.live_tasks("beta").unwrap(), 1);
        assert_eq!(store.live_tasks("nobody").unwrap(), 0);

        complete(&store, "a1");
        assert_eq!(store.live_tasks("acme").unwrap(), 2);
        // Non-status updates and terminal → terminal changes do not count.
        store
            .update("a2", &mut |t| {
                t.status = TaskStatus::InputRequired;
                true
            })
            .unwrap();
        store
            .update("a1", &mut |t| {
                t.status = TaskStatus::Cancelled;
                true
            })
            .unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 2);
        // Expiring a live task decrements, a terminal one does not.
        store.expire("a2", u64::MAX, 10).unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 1);
        store.expire("a1", u64::MAX, 10).unwrap();
        store.expire("a4", u64::MAX, 10).unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 1);
        store.expire("a3", u64::MAX, 10).unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 0);
        assert_eq!(store.live_tasks("beta").unwrap(), 1);

        // The counter is persisted.
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.live_tasks("beta").unwrap(), 1);
        assert_eq!(store.live_tasks("acme").unwrap(), 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn secret_is_stable_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let s1 = store.secret("request_state").unwrap();
        assert_eq!(store.secret("request_state").unwrap(), s1);
        let other = store.secret("other").unwrap();
        assert_ne!(s1, other);
        assert_ne!(s1, [0u8; 32]);
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.secret("request_state").unwrap(), s1);
        assert_eq!(store.secret("other").unwrap(), other);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn upstream_identity_is_byte_exact_written_only_on_change_and_durable() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.upstream_identity("demo").unwrap(), None);
        // Key order and number text exactly as the upstream sent them.
        let sent =
            r#"{"version":"1.0e0","name":"z-first","n":1.50,"big":123456789012345678901234567890}"#;
        let caps = r#"{"tools":{"listChanged":true},"experimental":{"b":1,"a":-0}}"#;
        let identity = UpstreamIdentity {
            v: SCHEMA_VERSION,
            protocol_version: "2025-06-18".into(),
            server_info: serde_json::from_str(sent).unwrap(),
            capabilities: serde_json::from_str(caps).unwrap(),
            instructions: Some("hi".into()),
        };
        assert!(store.put_upstream_identity("demo", &identity).unwrap());
        // The same answer again (a re-initialising upstream) writes nothing.
        assert!(!store.put_upstream_identity("demo", &identity).unwrap());
        let other = UpstreamIdentity {
            instructions: None,
            ..identity.clone()
        };
        assert!(store.put_upstream_identity("other", &other).unwrap());
        let raw = store.upstream_identity.get("other").unwrap().unwrap();
        let text = std::str::from_utf8(&raw).unwrap();
        assert!(!text.contains("instructions"), "{text}");
        store.flush().await.unwrap();
        drop(store);

        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let got = store.upstream_identity("demo").unwrap().unwrap();
        assert_eq!(got, identity);
        assert_eq!(serde_json::to_string(&got.server_info).unwrap(), sent);
        assert_eq!(
            serde_json::to_string(&Value::Object(got.capabilities)).unwrap(),
            caps
        );
        assert_eq!(store.upstream_identity("other").unwrap().unwrap(), other);
        // A different answer replaces the record.
        let changed = UpstreamIdentity {
            server_info: serde_json::json!({"name": "z-first", "version": "2"}),
            ..identity
        };
        assert!(store.put_upstream_identity("demo", &changed).unwrap());
        assert_eq!(store.upstream_identity("demo").unwrap().unwrap(), changed);
        // A record of a newer schema is refused, naming tree and key.
        let mut newer = serde_json::to_value(&changed).unwrap();
        newer["v"] = Value::from(SCHEMA_VERSION + 1);
        store
            .upstream_identity
            .insert("demo", serde_json::to_vec(&newer).unwrap())
            .unwrap();
        match store.upstream_identity("demo") {
            Err(StoreError::Corrupt(msg)) => {
                assert!(msg.contains("upstream_identity/demo"), "{msg}")
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn secret_concurrent_first_use_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        let all: Vec<[u8; 32]> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| store.secret("k").unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(all.iter().all(|s| *s == all[0]));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn durable_across_reopen() {
        for strict in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = SledStore::open(&cfg(dir.path(), strict)).unwrap();
            let key: &[u8] = b"k";
            let mut t = task("tsk_a", "acme", 1000);
            t.result = Some(serde_json::json!({"content": [{"type": "text", "text": "x"}]}));
            store
                .create(&t, &route("r1", Some("tsk_a")), Some(key))
                .unwrap();
            store.flush().await.unwrap();
            assert!(store.healthy());
            drop(store);
            let store = SledStore::open(&cfg(dir.path(), strict)).unwrap();
            assert_eq!(store.get("tsk_a").unwrap(), Some(t));
            assert_eq!(store.routes().unwrap().len(), 1);
            assert_eq!(
                store.idempotency_get(key).unwrap().unwrap().task_id,
                "tsk_a"
            );
            assert_eq!(store.expired(1000, 10).unwrap(), vec!["tsk_a"]);
            assert_eq!(store.live_tasks("acme").unwrap(), 1);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn strict_mode_syncs_large_blob_values() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), true)).unwrap();
        let mut t = task("tsk_big", "acme", 1000);
        t.result = Some(Value::String("x".repeat(4 * 1024 * 1024)));
        store.create(&t, &route("r", None), None).unwrap();
        store.flush().await.unwrap();
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), true)).unwrap();
        assert_eq!(store.get("tsk_big").unwrap(), Some(t));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_updates_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        store
            .create(&task("tsk_a", "acme", 1000), &route("ra", None), None)
            .unwrap();
        std::thread::scope(|s| {
            for i in 0..8 {
                let store = &store;
                s.spawn(move || {
                    for j in 0..50 {
                        store
                            .update("tsk_a", &mut |t| {
                                t.issued_keys.push(format!("k{i}-{j}"));
                                true
                            })
                            .unwrap();
                    }
                });
            }
        });
        let t = store.get("tsk_a").unwrap().unwrap();
        assert_eq!(
            t.issued_keys.len(),
            400,
            "every compare-and-swap retry re-applied"
        );
    }

    /// What a crash between two writes of one operation can leave behind (the
    /// writes are ordered, not transactional) is repaired or ignored.
    #[tokio::test(flavor = "multi_thread")]
    async fn crash_leftovers_are_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        store
            .create(&task("tsk_a", "acme", 1000), &route("ra", None), None)
            .unwrap();
        // An update whose new expiry entry never landed: only the old entry is left.
        let mut t = store.get("tsk_a").unwrap().unwrap();
        t.expires_at_ms = 5000;
        store
            .tasks
            .insert("tsk_a", encode_task(&t).unwrap())
            .unwrap();
        // An expiry entry whose task is gone.
        store
            .expiry
            .insert(expiry_key(500, "tsk_gone"), &[])
            .unwrap();
        assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
        assert_eq!(store.expiry.len(), 1, "stale entries dropped");
        assert_eq!(
            store.expired(5000, 10).unwrap(),
            vec!["tsk_a"],
            "entry repaired"
        );

        // An idempotency claim whose task (and tombstone) never landed is taken over.
        let key: &[u8] = b"acme\0alice\0demo\0slow\0k";
        let orphan = StoredIdempotency {
            v: SCHEMA_VERSION,
            task_id: "tsk_never".into(),
            args_fingerprint: "fp".into(),
        };
        store
            .idempotency
            .insert(key, serde_json::to_vec(&orphan).unwrap())
            .unwrap();
        assert_eq!(store.idempotency_get(key).unwrap(), None, "reads as absent");
        assert_eq!(
            store
                .create(&task("tsk_b", "acme", 1000), &route("rb", None), Some(key))
                .unwrap(),
            Created::New
        );
        assert_eq!(
            store.idempotency_get(key).unwrap().unwrap().task_id,
            "tsk_b"
        );
        // ...but a claim whose task expired (tombstone) still answers Existing.
        store.expire("tsk_b", u64::MAX, 10_000).unwrap();
        assert!(matches!(
            store.create(&task("tsk_c", "acme", 1000), &route("rc", None), Some(key)),
            Ok(Created::Existing(e)) if e.task_id == "tsk_b"
        ));
        assert_eq!(store.get("tsk_c").unwrap(), None);
        let mut routes: Vec<String> = store
            .routes()
            .unwrap()
            .into_iter()
            .map(|r| r.route_id)
            .collect();
        routes.sort();
        assert_eq!(routes, ["ra", "rb"], "the losing create's route is undone");

        // Live entries of tasks that are gone or terminal are dropped at open.
        store
            .create(&task("tsk_d", "acme", 1000), &route("rd", None), None)
            .unwrap();
        store.live.insert(live_key("acme", "tsk_x"), &[]).unwrap();
        let mut done = store.get("tsk_a").unwrap().unwrap();
        done.status = TaskStatus::Completed;
        store
            .tasks
            .insert("tsk_a", encode_task(&done).unwrap())
            .unwrap();
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 1, "only tsk_d is live");
        assert_eq!(store.live.len(), 1);
    }

    /// A store written before the live index kept counters in `meta/live/`: the first
    /// open builds the index from the tasks and drops the counters.
    #[tokio::test(flavor = "multi_thread")]
    async fn live_index_is_built_for_an_older_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        for (id, tenant) in [("a1", "acme"), ("a2", "acme"), ("b1", "beta")] {
            store
                .create(&task(id, tenant, 1000), &route(id, None), None)
                .unwrap();
        }
        complete(&store, "a2");
        // Turn it into the older layout.
        store.live.clear().unwrap();
        store.meta.remove(META_LIVE_INDEX).unwrap();
        store
            .meta
            .insert(meta_key(META_LIVE, b"acme"), &7u64.to_be_bytes())
            .unwrap();
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        assert_eq!(store.live_tasks("acme").unwrap(), 1);
        assert_eq!(store.live_tasks("beta").unwrap(), 1);
        assert_eq!(store.meta.scan_prefix(META_LIVE).count(), 0);
        assert!(store.meta.get(META_LIVE_INDEX).unwrap().is_some());
        // Keys with any tenant string round-trip.
        let k = live_key("te\0nant", "tsk_1");
        assert_eq!(split_live_key(&k), Some(("te\0nant", "tsk_1")));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn schema_versions() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        // A newer record is refused, naming tree and key.
        let mut newer = serde_json::to_value(task("tsk_new", "acme", 1)).unwrap();
        newer["v"] = Value::from(SCHEMA_VERSION + 1);
        store
            .tasks
            .insert("tsk_new", serde_json::to_vec(&newer).unwrap())
            .unwrap();
        match store.get("tsk_new") {
            Err(StoreError::Corrupt(msg)) => {
                assert!(msg.contains("tasks/tsk_new"), "{msg}");
                assert!(msg.contains("schema version"), "{msg}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // An older record without `v` and without optional fields is upgraded.
        let old = serde_json::json!({
            "task_id": "tsk_old", "tenant": "acme", "subject": "alice",
            "upstream": "demo", "tool": "slow", "args_fingerprint": "fp",
            "status": "working", "created_at_ms": 1, "last_updated_at_ms": 1,
            "ttl_ms": 10, "poll_interval_ms": 1000, "expires_at_ms": 11
        });
        store
            .tasks
            .insert("tsk_old", serde_json::to_vec(&old).unwrap())
            .unwrap();
        let rec = store.get("tsk_old").unwrap().unwrap();
        assert_eq!(rec.v, SCHEMA_VERSION);
        assert!(rec.input_requests.is_empty() && rec.issued_keys.is_empty());
        assert!(!rec.cancel_requested && rec.result.is_none());
        let old_route = serde_json::json!({
            "v": 0, "route_id": "r", "upstream": "demo", "tenant": "acme",
            "subject": "alice", "method": "tools/call", "started_at_ms": 1, "deadline_ms": 2
        });
        store
            .routes
            .insert("r", serde_json::to_vec(&old_route).unwrap())
            .unwrap();
        assert_eq!(store.routes().unwrap()[0].task_id, None);
        // A store written by a newer gateway is refused at open.
        store
            .meta
            .insert(META_SCHEMA, &(SCHEMA_VERSION + 1).to_be_bytes())
            .unwrap();
        store.flush().await.unwrap();
        drop(store);
        match SledStore::open(&cfg(dir.path(), false)) {
            Err(StoreError::Corrupt(msg)) => assert!(msg.contains("schema version"), "{msg}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn second_open_of_a_live_store_fails_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let _store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        match SledStore::open(&cfg(dir.path(), false)) {
            Err(e @ StoreError::Locked(_)) => {
                let msg = e.to_string();
                assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
                assert!(msg.contains("another running taskgate"), "{msg}");
            }
            other => panic!("expected Locked, got {other:?}"),
        }
    }

    #[test]
    fn open_outside_runtime_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        match SledStore::open(&cfg(dir.path(), false)) {
            Err(StoreError::Io(msg)) => {
                assert!(msg.contains(&dir.path().display().to_string()), "{msg}")
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn open_error_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let path = file.join("store");
        match SledStore::open(&cfg(&path, false)) {
            Err(StoreError::Io(msg)) => {
                assert!(msg.contains(&path.display().to_string()), "{msg}")
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }

    const CRASH_ENV: &str = "TASKGATE_STORE_CRASH_DIR";
    const CRASH_N: usize = 500;

    /// Child half of `crash_after_flush_keeps_flushed_writes`; a no-op unless the
    /// parent set `CRASH_ENV`.
    #[tokio::test(flavor = "multi_thread")]
    async fn crash_writer() {
        let Ok(dir) = std::env::var(CRASH_ENV) else {
            return;
        };
        let store = SledStore::open(&cfg(Path::new(&dir), false)).unwrap();
        for i in 0..CRASH_N {
            let id = format!("tsk_{i}");
            store
                .create(&task(&id, "acme", 1000), &route(&id, Some(&id)), None)
                .unwrap();
        }
        store.flush().await.unwrap();
        println!("FLUSHED");
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        // Keep writing (unflushed) until killed, fast enough that log buffers fill
        // and reach the file on their own, so the kill can cut a create short.
        for i in 0.. {
            let id = format!("late_{i}");
            store
                .create(&task(&id, "acme", 1000), &route(&id, Some(&id)), None)
                .unwrap();
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn crash_after_flush_keeps_flushed_writes() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args([
                "--exact",
                "store::sled::tests::crash_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_ENV, dir.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut flushed = false;
        for line in std::io::BufReader::new(stdout).lines() {
            if line.unwrap().contains("FLUSHED") {
                flushed = true;
                break;
            }
        }
        assert!(flushed, "writer exited before FLUSHED");
        tokio::time::sleep(Duration::from_millis(300)).await;
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success());
        let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
        for i in 0..CRASH_N {
            let id = format!("tsk_{i}");
            assert!(store.get(&id).unwrap().is_some(), "{id} lost after crash");
        }
        // Whatever the kill cut short is consistent: a task never exists without its
        // route (written first), live entries only for stored tasks, and the expiry
        // index names only stored tasks.
        let routes: std::collections::HashSet<String> = store
            .routes()
            .unwrap()
            .into_iter()
            .map(|r| r.route_id)
            .collect();
        let indexed: std::collections::HashSet<String> = store
            .expiry
            .iter()
            .map(|kv| String::from_utf8(kv.unwrap().0[8..].to_vec()).unwrap())
            .collect();
        for kv in store.tasks.iter() {
            let (k, _) = kv.unwrap();
            let id = String::from_utf8(k.to_vec()).unwrap();
            assert!(routes.contains(&id), "task {id} survived without its route");
            assert!(
                indexed.contains(&id),
                "task {id} survived without an expiry entry"
            );
        }
        let live = store.live_tasks("acme").unwrap() as usize;
        assert!(live >= CRASH_N && live <= store.tasks.len(), "{live}");
        for id in store.expired(u64::MAX, usize::MAX).unwrap() {
            assert!(store.get(&id).unwrap().is_some(), "{id}");
        }
        eprintln!(
            "crash test: {CRASH_N} flushed tasks survived SIGKILL ({} tasks total, incl. unflushed)",
            store.tasks.len()
        );
    }

    async fn group_commit_run(strict: bool, mode: sled::Mode, label: &str) {
        const WRITERS: usize = 64;
        const PER: usize = 200;
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open_with_mode(&cfg(dir.path(), strict), mode).unwrap();
        let start = Instant::now();
        let mut handles = Vec::new();
        for w in 0..WRITERS {
            let store = store.clone();
            handles.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(PER);
                for i in 0..PER {
                    let id = format!("tsk_{w}_{i}");
                    let key = format!("key_{w}_{i}");
                    let t0 = Instant::now();
                    let mut t = task(&id, "acme", 1000 + i as u64);
                    t.result =
                        Some(serde_json::json!({"content": [{"type": "text", "text": "ok"}]}));
                    let r = store
                        .create(&t, &route(&id, Some(&id)), Some(key.as_bytes()))
                        .unwrap();
                    assert_eq!(r, Created::New);
                    store.flush().await.unwrap();
                    lat.push(t0.elapsed());
                }
                lat
            }));
        }
        let mut lat = Vec::new();
        for h in handles {
            lat.extend(h.await.unwrap());
        }
        let elapsed = start.elapsed();
        lat.sort();
        let n = lat.len();
        let p = |q: f64| lat[((n as f64 * q) as usize).min(n - 1)];
        println!(
            "group commit [{label}]: {n} create+flush in {:.2?} = {:.0} durable ops/s; \
             p50 {:.2?}, p99 {:.2?}, max {:.2?}",
            elapsed,
            n as f64 / elapsed.as_secs_f64(),
            p(0.50),
            p(0.99),
            lat[n - 1]
        );
        let rounds = store.rounds.load(Ordering::Relaxed);
        println!(
            "    {rounds} flush rounds, {:.1} waiters/round, {:.0} µs/round",
            store.round_waiters.load(Ordering::Relaxed) as f64 / rounds as f64,
            store.round_micros.load(Ordering::Relaxed) as f64 / rounds as f64
        );
        assert_eq!(store.tasks.len(), WRITERS * PER);
        assert_eq!(store.live_tasks("acme").unwrap() as usize, WRITERS * PER);
        drop(store);
        let store = SledStore::open_with_mode(&cfg(dir.path(), strict), mode).unwrap();
        assert_eq!(store.tasks.len(), WRITERS * PER);
        assert_eq!(store.idempotency.len(), WRITERS * PER);
    }

    /// 64 concurrent writers × 200 create+flush each; prints (does not assert)
    /// throughput and latency for normal and strict mode and both sled modes.
    #[tokio::test(flavor = "multi_thread")]
    async fn group_commit_throughput() {
        group_commit_run(false, sled::Mode::HighThroughput, "normal, HighThroughput").await;
        group_commit_run(false, sled::Mode::LowSpace, "normal, LowSpace").await;
        group_commit_run(true, sled::Mode::HighThroughput, "strict, HighThroughput").await;
        group_commit_run(true, sled::Mode::LowSpace, "strict, LowSpace").await;
    }
}
