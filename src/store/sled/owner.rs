//! The owner index (`owner` tree): each principal's tasks per upstream in creation
//! order, for `tasks/list` (docs/design.md §25), its entries, the pages read from it,
//! and building it once for a store written before it existed.

use super::SledStore;
use super::codec::{decode, upgrade_task};
use super::schema::{
    META_OWNER_INDEX, key_str, owner_key, owner_prefix, owner_principal_prefix, split_owner_key,
};
use crate::store::{Corruption, OwnerCursor, StoreError, TaskRecord};

/// The fields of a stored task its owner entry is made of, without decoding the rest.
#[derive(serde::Deserialize)]
struct OwnerProbe {
    tenant: String,
    subject: String,
    upstream: String,
    created_at_ms: u64,
}

/// The `owner` key of a task record.
pub(super) fn owner_entry(rec: &TaskRecord) -> Vec<u8> {
    owner_key(
        &rec.tenant,
        &rec.subject,
        &rec.upstream,
        rec.created_at_ms,
        &rec.task_id,
    )
}

impl SledStore {
    /// One page of the index under `(tenant, subject, upstream)`: a range scan from
    /// just after `after`, each entry's task read and checked against its key. An
    /// entry whose task is gone is skipped, never removed here: a `create` writes the
    /// entry before its task, so a reader cannot tell a leftover from a creation under
    /// way (leftovers are dropped by `expired` and `expire`; module docs).
    pub(crate) fn list_owned(
        &self,
        tenant: &str,
        subject: &str,
        upstream: &str,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let prefix = owner_prefix(tenant, subject, upstream);
        let from = match after {
            Some(c) => std::ops::Bound::Excluded(owner_key(
                tenant,
                subject,
                upstream,
                c.created_at_ms,
                &c.task_id,
            )),
            None => std::ops::Bound::Included(prefix.clone()),
        };
        let mut out = Vec::new();
        for k in self.owner.range((from, std::ops::Bound::Unbounded)).keys() {
            if out.len() >= limit {
                break;
            }
            let k = k.map_err(|e| self.read_failed("scan owner index", e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let (created_at_ms, id) = split_owner_key(&k).ok_or_else(|| {
                StoreError::Corrupt(format!("owner: malformed key {:?}", k.as_ref()).into())
            })?;
            let Some(bytes) = self
                .tasks
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get task", e))?
            else {
                continue;
            };
            let rec: TaskRecord = decode("tasks", id.as_bytes(), &bytes, upgrade_task)?;
            // Only an update that changed a keyed field (none does) could leave an
            // entry the record disagrees with; the record's own entry is listed.
            if rec.created_at_ms == created_at_ms
                && rec.tenant == tenant
                && rec.subject == subject
                && rec.upstream == upstream
            {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Drop the owner entry of `task_id`, whose record is gone, if its tombstone says
    /// whose it was: a repair of an `expire` cut short (module docs). The principal's
    /// entries on every upstream are scanned for the id, which only this repair does.
    pub(super) fn drop_owner_entry_of_gone(&self, task_id: &str) -> Result<(), StoreError> {
        let Some(tomb) = self.tombstone(task_id)? else {
            return Ok(());
        };
        let prefix = owner_principal_prefix(&tomb.tenant, &tomb.subject);
        for k in self.owner.scan_prefix(&prefix).keys() {
            let k = k.map_err(|e| self.read_failed("scan owner index", e))?;
            if split_owner_key(&k).is_some_and(|(_, id)| id == task_id) {
                self.del(&self.owner, "drop stale owner entry", &k)?;
            }
        }
        Ok(())
    }

    /// At open: build the owner index once for a store written before it existed
    /// (`meta/layout/owner_index` says it is built).
    pub(super) fn build_owner_index(&self) -> Result<(), StoreError> {
        self.build_index(META_OWNER_INDEX, &self.owner, "owner", |k, id, v| {
            let p: OwnerProbe = serde_json::from_slice(v).map_err(|e| {
                StoreError::Corrupt(
                    Corruption::from(format!("tasks/{}: {e}", key_str(k))).caused_by(e),
                )
            })?;
            Ok(owner_key(
                &p.tenant,
                &p.subject,
                &p.upstream,
                p.created_at_ms,
                id,
            ))
        })
    }

    /// Build the index `tree` from every task record, once (`marker` in `meta`
    /// says it is built): `entry` makes a task's key from its id and stored bytes.
    /// The entries go first and the marker last, so a crash in between builds it
    /// again (the writes are idempotent), and the flush makes both durable before
    /// the store is used.
    pub(super) fn build_index(
        &self,
        marker: &[u8],
        tree: &sled::Tree,
        name: &str,
        entry: impl Fn(&[u8], &str, &[u8]) -> Result<Vec<u8>, StoreError>,
    ) -> Result<(), StoreError> {
        let built = self
            .meta
            .get(marker)
            .map_err(|e| self.read_failed("get meta/layout", e))?
            .is_some();
        if built {
            return Ok(());
        }
        let mut entries = 0u64;
        for kv in self.tasks.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan tasks", e))?;
            let id = std::str::from_utf8(&k).map_err(|_| {
                StoreError::Corrupt(format!("tasks: key {:?} is not UTF-8", k.as_ref()).into())
            })?;
            let key = entry(&k, id, &v)?;
            self.put(tree, "build an index", &key, &[])?;
            entries += 1;
        }
        self.put(&self.meta, "write meta/layout", marker, &[1])?;
        self.flush_blocking()?;
        if entries > 0 {
            tracing::info!(path = %self.path.display(), index = name, entries, "index built");
        }
        Ok(())
    }
}
