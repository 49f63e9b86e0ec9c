//! Live-task counts: the `live` index, its in-memory counts per tenant, and building
//! or repairing it at open.

use super::SledStore;
use super::codec::probe;
use super::schema::{META_LIVE, META_LIVE_INDEX, live_key, split_live_key};
use crate::store::StoreError;

impl SledStore {
    /// Enter a non-terminal task into the live index; the in-memory count follows the
    /// index (only an entry that was not there yet counts).
    pub(super) fn mark_live(&self, tenant: &str, task_id: &str) -> Result<(), StoreError> {
        let fresh = self
            .live
            .insert(live_key(tenant, task_id), &[] as &[u8])
            .map_err(|e| self.write_failed("mark task live", e))?
            .is_none();
        if fresh {
            self.count_live(tenant, 1);
        }
        Ok(())
    }

    pub(super) fn unmark_live(&self, tenant: &str, task_id: &str) -> Result<(), StoreError> {
        if self.del(&self.live, "unmark task live", &live_key(tenant, task_id))? {
            self.count_live(tenant, -1);
        }
        Ok(())
    }

    /// Remove the live-index entry `key` of `tenant` (a purge, which found the key by
    /// the tenant's prefix); the count follows as in [`Self::unmark_live`].
    pub(super) fn unmark_live_key(&self, tenant: &str, key: &[u8]) -> Result<bool, StoreError> {
        let removed = self.del(&self.live, "purge: live entry", key)?;
        if removed {
            self.count_live(tenant, -1);
        }
        Ok(removed)
    }

    /// Signed, so the order in which racing increments and decrements land does not
    /// matter: the sum is exact.
    pub(super) fn count_live(&self, tenant: &str, delta: i64) {
        let mut counts = self.live_counts.lock();
        let n = counts.entry(tenant.to_string()).or_insert(0);
        *n += delta;
        if *n == 0 {
            counts.remove(tenant);
        }
    }

    /// At open: build the live index once for a store written before it existed
    /// (such stores kept counters under `meta/live/<tenant>`), then count it, dropping
    /// entries a crash left behind (task gone or already terminal).
    pub(super) fn load_live_index(&self) -> Result<(), StoreError> {
        let built = self
            .meta
            .get(META_LIVE_INDEX)
            .map_err(|e| self.read_failed("get meta/layout", e))?
            .is_some();
        if !built {
            for kv in self.tasks.iter() {
                let (k, v) = kv.map_err(|e| self.read_failed("scan tasks", e))?;
                let p = probe(&k, &v)?;
                if !p.status.is_terminal() {
                    let id = std::str::from_utf8(&k).map_err(|_| {
                        StoreError::Corrupt(
                            format!("tasks: key {:?} is not UTF-8", k.as_ref()).into(),
                        )
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
                let (k, _) = kv.map_err(|e| self.read_failed("scan meta/live", e))?;
                self.del(&self.meta, "drop old live counter", &k)?;
            }
            self.put(&self.meta, "write meta/layout", META_LIVE_INDEX, &[1])?;
            self.flush_blocking()?;
        }
        for kv in self.live.iter() {
            let (k, _) = kv.map_err(|e| self.read_failed("scan live index", e))?;
            let (tenant, id) = split_live_key(&k).ok_or_else(|| {
                StoreError::Corrupt(format!("live: malformed key {:?}", k.as_ref()).into())
            })?;
            let live = match self
                .tasks
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get task", e))?
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

    pub(crate) fn live_tasks(&self, tenant: &str) -> Result<u64, StoreError> {
        let counts = self.live_counts.lock();
        Ok(counts
            .get(tenant)
            .map_or(0, |n| u64::try_from(*n).unwrap_or(0)))
    }
}
