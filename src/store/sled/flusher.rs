//! Group commit (module docs): the flusher task and one flush round, with the
//! strict-mode fsyncs.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::{SledStore, Waiter};
use crate::store::{IoError, StoreError};

impl SledStore {
    /// Group-commit rounds run so far, the waiters they released and the µs they took
    /// (for `benches/store_throughput.rs`).
    #[doc(hidden)]
    pub fn flush_round_stats(&self) -> (u64, u64, u64) {
        (
            self.rounds.load(Ordering::Relaxed),
            self.round_waiters.load(Ordering::Relaxed),
            self.round_micros.load(Ordering::Relaxed),
        )
    }

    /// One flush round: sled `flush()` plus, in strict mode, fsync of the files.
    /// Blocking; runs on a `spawn_blocking` thread (or, for `secret`, inline).
    pub(super) fn flush_blocking(&self) -> Result<(), StoreError> {
        let res = self
            .db
            .flush()
            .map(|_| ())
            .map_err(|e| IoError::Flush {
                path: self.path.clone(),
                source: Arc::new(e),
            })
            .and_then(|()| {
                if self.strict_fsync {
                    self.fsync_files().map_err(|e| IoError::Fsync {
                        path: self.path.clone(),
                        source: Arc::new(e),
                    })
                } else {
                    Ok(())
                }
            });
        res.map_err(|e| {
            self.healthy.store(false, Ordering::SeqCst);
            tracing::error!("{e}");
            e.into()
        })
    }

    /// Strict mode: fsync every data file, new/grown blob files and the directories.
    pub(super) fn fsync_files(&self) -> io::Result<()> {
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

    pub(super) fn fsync_blobs(&self, dir: &Path) -> io::Result<()> {
        let mut synced = self.synced_blobs.lock();
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
}

/// fsync one file or directory; a file that vanished meanwhile (sled removes old
/// snapshots and blobs) is skipped.
pub(super) fn sync_path(p: &Path) -> io::Result<()> {
    match File::open(p) {
        Ok(f) => f.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Scheduler yields before a round takes its waiters (see `run_flusher`).
pub(super) const LINGER_YIELDS: usize = 1;

/// The group-commit flusher task (see the module docs).
pub(super) async fn run_flusher(mut rx: mpsc::UnboundedReceiver<Waiter>, store: Weak<SledStore>) {
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
                .unwrap_or_else(|e| Err(IoError::FlushTask(Arc::new(e)).into()))
            }
        };
        for w in round.drain(..) {
            let _ = w.send(result.clone());
        }
    }
}
