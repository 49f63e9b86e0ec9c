//! Opening the store: sled's mode and directory lock, the trees, the schema version
//! check and the read-tracking start, then the flusher, the live index and the owner
//! index.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::SledStore;
use super::flusher::run_flusher;
use super::schema::{META_SCHEMA, META_SEEN_SINCE};
use crate::config::StoreConfig;
use crate::store::{IoError, SCHEMA_VERSION, SetupError, StoreError};

/// sled storage mode. Measured with `benches/store_throughput.rs` (64 × 200
/// create+flush, 5 alternating runs on a shared, loaded 2-core machine), durable ops/s:
/// normal mode HighThroughput 5.7k/8.1k/9.5k/6.4k/9.4k vs LowSpace
/// 5.1k/8.8k/11.1k/6.3k/9.8k; strict mode HighThroughput 4.8k/6.7k/10.9k/5.8k/6.3k vs
/// LowSpace 4.8k/6.2k/8.7k/5.2k/10.5k (measured when each create was a sled
/// transaction; without them both modes give ~20k, see the module docs). No consistent
/// winner: the spread between runs exceeds the difference between modes. HighThroughput is kept:
/// sled's mode for write-heavy use (LowSpace trades write speed for disk space).
pub(super) const SLED_MODE: sled::Mode = sled::Mode::HighThroughput;

/// How long `open` waits for sled's directory lock (see `open_with_mode`).
pub(super) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
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

    /// [`Self::open`] with sled's storage mode chosen by the caller (for
    /// `benches/store_throughput.rs`, which compares the modes).
    #[doc(hidden)]
    pub fn open_with_mode(cfg: &StoreConfig, mode: sled::Mode) -> Result<Arc<Self>, StoreError> {
        let path = cfg.path.clone();
        let ctx = |what: std::borrow::Cow<'static, str>, e: sled::Error| {
            StoreError::from(IoError::Sled {
                path: path.clone(),
                what,
                source: Arc::new(e),
            })
        };
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| SetupError::NoRuntime {
            path: path.clone(),
            source: Arc::new(e),
        })?;
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
                Err(e) => return Err(ctx("cannot open sled database".into(), e)),
            }
        };
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| ctx(format!("cannot open tree {name}").into(), e))
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
        let sessions = tree("sessions")?;
        let session_owner = tree("session_owner")?;
        let upstream_tool_headers = tree("upstream_tool_headers")?;
        let owner = tree("owner")?;
        let tenant_status = tree("tenant_status")?;

        // Store-wide schema version: refuse a store written by a newer gateway.
        match meta
            .get(META_SCHEMA)
            .map_err(|e| ctx("cannot read meta/schema".into(), e))?
        {
            Some(v) => {
                let v = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| {
                        StoreError::Corrupt(
                            format!(
                                "store at {}: meta/schema is not a 4-byte version",
                                path.display()
                            )
                            .into(),
                        )
                    })?;
                if v > SCHEMA_VERSION {
                    return Err(StoreError::Corrupt(format!(
                        "store at {} has schema version {v}, newer than this gateway's {SCHEMA_VERSION}",
                        path.display()
                    ).into()));
                }
                if v < SCHEMA_VERSION {
                    meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())
                        .map_err(|e| ctx("cannot write meta/schema".into(), e))?;
                }
            }
            None => {
                meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())
                    .map_err(|e| ctx("cannot write meta/schema".into(), e))?;
            }
        }

        // Read tracking starts with the first open that knows the `seen` tree; for a
        // store that already holds tasks, reads before now were never recorded.
        let (seen_since_ms, seen_since_new) = match meta
            .get(META_SEEN_SINCE)
            .map_err(|e| ctx("cannot read meta/layout/seen_since".into(), e))?
        {
            Some(v) => {
                let since = <[u8; 8]>::try_from(v.as_ref())
                    .map(u64::from_be_bytes)
                    .map_err(|_| {
                        StoreError::Corrupt(
                            format!(
                                "store at {}: meta/layout/seen_since is not an 8-byte time",
                                path.display()
                            )
                            .into(),
                        )
                    })?;
                (since, false)
            }
            None => {
                let since = if tasks.is_empty() {
                    0
                } else {
                    crate::store::now_ms()
                };
                meta.insert(META_SEEN_SINCE, &since.to_be_bytes())
                    .map_err(|e| ctx("cannot write meta/layout/seen_since".into(), e))?;
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
            sessions,
            session_owner,
            session_create: Mutex::new(()),
            upstream_tool_headers,
            owner,
            tenant_status,
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
        store.build_owner_index()?;
        store.build_tenant_index()?;
        runtime.spawn(run_flusher(flush_rx, Arc::downgrade(&store)));
        tracing::info!(
            path = %path.display(),
            strict_fsync = cfg.strict_fsync,
            "store opened"
        );
        Ok(store)
    }
}
