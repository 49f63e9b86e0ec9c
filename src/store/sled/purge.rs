//! A tenant purge on sled (docs/design.md §27 "Tenant purge";
//! [`TaskStore::purge_tenant`](crate::store::TaskStore::purge_tenant)).
//!
//! Found by index, never by a scan of every task: the tenant's tasks through the
//! `tenant_status`, `owner` and `live` trees (each keyed by the tenant first), its
//! claims by their key prefix, its sessions through `session_owner`. Tombstones,
//! request routes and `meta/idem_of` entries carry no tenant in their keys: they are
//! scanned, as the sweeper scans tombstones each round.
//!
//! Write order per task: what is keyed by the task id alone (read mark, `idem_of` and
//! its claim, expiry entry), then the task, then the entries keyed by the tenant
//! (`live`, `owner`, `tenant_status`). A crash in between leaves only entries a re-run
//! finds again through the tenant's prefixes. An expiry entry that is not at its
//! record's time (an expiry moved later keeps its earlier entry) is found after the
//! batch's records, by one range scan between their creation and expiry times; one a
//! crash leaves there names a task that is gone, which `expired` drops when it comes
//! due.

use std::collections::BTreeMap;

use super::codec::{decode, decode_idempotency, upgrade_task};
use super::schema::{
    META_IDEM_OF, expiry_key, indexed_task_id, live_key, meta_key, split_session_owner_key,
    tenant_part,
};
use super::{SledStore, owner::owner_entry, tenant::tenant_entry};
use crate::store::idempotency;
use crate::store::purge::Budget;
use crate::store::{Corruption, Purged, PurgedTask, StoreError, TaskRecord};

/// The owner of a tombstone or route record, whatever its version.
#[derive(serde::Deserialize)]
struct TenantProbe {
    tenant: String,
}

fn tenant_of(tree: &str, key: &[u8], bytes: &[u8]) -> Result<String, StoreError> {
    serde_json::from_slice::<TenantProbe>(bytes)
        .map(|p| p.tenant)
        .map_err(|e| {
            let what = format!("{tree}/{}: {e}", String::from_utf8_lossy(key));
            StoreError::Corrupt(Corruption::from(what).caused_by(e))
        })
}

/// The index trees keyed by tenant first, with how many length-prefixed parts lead
/// their keys.
#[derive(Clone, Copy)]
enum Index {
    Live,
    Owner,
    TenantStatus,
}

impl SledStore {
    pub(crate) fn purge_tenant(&self, tenant: &str, limit: usize) -> Result<Purged, StoreError> {
        let mut out = Purged::default();
        let mut budget = Budget::new(limit);
        self.purge_routes(tenant, &mut budget, &mut out)?;
        self.purge_tasks(tenant, limit, &mut budget, &mut out)?;
        self.purge_tombstones(tenant, &mut budget, &mut out)?;
        self.purge_claims(tenant, &mut budget, &mut out)?;
        self.purge_sessions(tenant, &mut budget, &mut out)?;
        out.more = budget.exhausted;
        Ok(out)
    }

    fn purge_routes(
        &self,
        tenant: &str,
        budget: &mut Budget,
        out: &mut Purged,
    ) -> Result<(), StoreError> {
        out.counts.routes +=
            self.drop_matching(&self.routes, self.routes.iter(), budget, |k, v| {
                Ok(tenant_of("routes", k, v)? == tenant)
            })?;
        Ok(())
    }

    /// Delete each entry of `entries` (of `tree`) that `ours` accepts, while the budget
    /// lasts; how many were deleted.
    fn drop_matching(
        &self,
        tree: &sled::Tree,
        entries: sled::Iter,
        budget: &mut Budget,
        ours: impl Fn(&[u8], &[u8]) -> Result<bool, StoreError>,
    ) -> Result<u64, StoreError> {
        let mut removed = 0;
        for kv in entries {
            let (k, v) = kv.map_err(|e| self.read_failed("purge: scan", e))?;
            if !ours(&k, &v)? {
                continue;
            }
            if !budget.take() {
                break;
            }
            removed += u64::from(self.del(tree, "purge: entry", &k)?);
        }
        Ok(removed)
    }

    /// The tenant's task ids from its three indexes (at most `limit` of them), each
    /// with the index keys that name it.
    fn tenant_task_keys(
        &self,
        tenant: &str,
        limit: usize,
    ) -> Result<BTreeMap<String, Vec<(Index, sled::IVec)>>, StoreError> {
        let prefix = tenant_part(tenant);
        let mut found: BTreeMap<String, Vec<(Index, sled::IVec)>> = BTreeMap::new();
        for (index, tree, parts) in [
            (Index::TenantStatus, &self.tenant_status, 2),
            (Index::Owner, &self.owner, 3),
            (Index::Live, &self.live, 1),
        ] {
            for k in tree.scan_prefix(&prefix).keys() {
                let k = k.map_err(|e| self.read_failed("scan a tenant's index entries", e))?;
                let Some(id) = indexed_task_id(&k, parts) else {
                    return Err(StoreError::Corrupt(
                        format!("malformed index key {:?}", k.as_ref()).into(),
                    ));
                };
                if !found.contains_key(id) && found.len() >= limit.max(1) {
                    break;
                }
                let id = id.to_string();
                found.entry(id).or_default().push((index, k));
            }
        }
        Ok(found)
    }

    fn purge_tasks(
        &self,
        tenant: &str,
        limit: usize,
        budget: &mut Budget,
        out: &mut Purged,
    ) -> Result<(), StoreError> {
        if !budget.open() {
            return Ok(());
        }
        // Tasks whose expiry entry is not at their record's time (module docs of
        // `sled`: an expiry moved later keeps its earlier entry until it comes due).
        let mut stray: Vec<(u64, u64, String)> = Vec::new();
        for (id, keys) in self.tenant_task_keys(tenant, limit)? {
            if !budget.take() {
                break;
            }
            let key = id.as_bytes();
            let stored: Option<TaskRecord> = match self
                .tasks
                .get(key)
                .map_err(|e| self.read_failed("get task", e))?
            {
                Some(b) => Some(decode("tasks", key, &b, upgrade_task)?),
                None => None,
            };
            // A record another tenant holds under this id (an index entry a crash left
            // behind cannot make one) keeps everything keyed by the id.
            let foreign = stored.as_ref().is_some_and(|r| r.tenant != tenant);
            let rec = stored.filter(|r| r.tenant == tenant);
            let c = &mut out.counts;
            if !foreign {
                c.read_marks += u64::from(self.del(&self.seen, "purge: seen mark", key)?);
                let idem_of = meta_key(META_IDEM_OF, key);
                if let Some(claim) = self
                    .meta
                    .get(&idem_of)
                    .map_err(|e| self.read_failed("get idem_of", e))?
                {
                    c.idempotency_claims += u64::from(self.drop_claim_of(&claim, &id)?);
                    c.index_entries +=
                        u64::from(self.del(&self.meta, "purge: idem_of", &idem_of)?);
                }
            }
            if let Some(rec) = &rec {
                let exp = expiry_key(rec.expires_at_ms, &id);
                if self.del(&self.expiry, "purge: expiry entry", &exp)? {
                    c.index_entries += 1;
                } else {
                    stray.push((rec.created_at_ms, rec.expires_at_ms, id.clone()));
                }
                c.tasks += u64::from(self.del(&self.tasks, "purge: task", key)?);
                out.tasks.push(PurgedTask {
                    task_id: id.clone(),
                    status: rec.status,
                    created_at_ms: rec.created_at_ms,
                });
            }
            let mut index_keys: Vec<(Index, Vec<u8>)> =
                keys.into_iter().map(|(i, k)| (i, k.to_vec())).collect();
            if let Some(rec) = &rec {
                index_keys.push((Index::Live, live_key(tenant, &id)));
                index_keys.push((Index::Owner, owner_entry(rec)));
                index_keys.push((Index::TenantStatus, tenant_entry(rec)));
            }
            for (index, k) in index_keys {
                let removed = match index {
                    Index::Live => self.unmark_live_key(tenant, &k)?,
                    Index::Owner => self.del(&self.owner, "purge: owner entry", &k)?,
                    Index::TenantStatus => {
                        self.del(&self.tenant_status, "purge: tenant entry", &k)?
                    }
                };
                out.counts.index_entries += u64::from(removed);
            }
        }
        out.counts.index_entries += self.drop_stray_expiry(stray)?;
        Ok(())
    }

    /// The expiry entries of `stray` tasks (created at, expires at, id), which lie
    /// between their creation and their record's expiry: one range scan over the
    /// window of them all.
    fn drop_stray_expiry(&self, stray: Vec<(u64, u64, String)>) -> Result<u64, StoreError> {
        let (Some(from), Some(to)) = (
            stray.iter().map(|s| s.0).min(),
            stray.iter().map(|s| s.1).max(),
        ) else {
            return Ok(0);
        };
        let mut left: std::collections::HashSet<String> = stray.into_iter().map(|s| s.2).collect();
        let mut removed = 0;
        let end = to.saturating_add(1).to_be_bytes();
        for k in self.expiry.range(from.to_be_bytes()..end).keys() {
            if left.is_empty() {
                break;
            }
            let k = k.map_err(|e| self.read_failed("scan expiry", e))?;
            let id = k.get(8..).and_then(|id| std::str::from_utf8(id).ok());
            if let Some(id) = id
                && left.remove(id)
            {
                removed += u64::from(self.del(&self.expiry, "purge: expiry entry", &k)?);
            }
        }
        Ok(removed)
    }

    /// Remove the claim at `key` if it still names `task_id`.
    fn drop_claim_of(&self, key: &[u8], task_id: &str) -> Result<bool, StoreError> {
        let Some(b) = self
            .idempotency
            .get(key)
            .map_err(|e| self.read_failed("get idempotency entry", e))?
        else {
            return Ok(false);
        };
        if decode_idempotency(key, &b)?.task_id != task_id {
            return Ok(false);
        }
        self.del(&self.idempotency, "purge: idempotency claim", key)
    }

    fn purge_tombstones(
        &self,
        tenant: &str,
        budget: &mut Budget,
        out: &mut Purged,
    ) -> Result<(), StoreError> {
        if !budget.open() {
            return Ok(());
        }
        for kv in self.tombstones.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan tombstones", e))?;
            if tenant_of("tombstones", &k, &v)? != tenant {
                continue;
            }
            if !budget.take() {
                break;
            }
            let t: crate::store::Tombstone =
                decode("tombstones", &k, &v, super::codec::upgrade_tombstone)?;
            if let Some(claim) = &t.idempotency_index_key {
                out.counts.idempotency_claims += u64::from(self.drop_claim_of(claim, &t.task_id)?);
            }
            if !self
                .tasks
                .contains_key(&k)
                .map_err(|e| self.read_failed("get task", e))?
            {
                out.counts.read_marks += u64::from(self.del(&self.seen, "purge: seen mark", &k)?);
            }
            out.counts.tombstones +=
                u64::from(self.del(&self.tombstones, "purge: tombstone", &k)?);
        }
        Ok(())
    }

    /// Claims under the tenant's key prefix (also those whose task and tombstone are
    /// gone), then `meta/idem_of` entries that name one of its keys.
    fn purge_claims(
        &self,
        tenant: &str,
        budget: &mut Budget,
        out: &mut Purged,
    ) -> Result<(), StoreError> {
        if !budget.open() {
            return Ok(());
        }
        let prefix = idempotency::tenant_prefix(tenant);
        let entries = self.idempotency.scan_prefix(&prefix);
        out.counts.idempotency_claims +=
            self.drop_matching(&self.idempotency, entries, budget, |k, _| {
                Ok(idempotency::belongs_to(k, &prefix))
            })?;
        let entries = self.meta.scan_prefix(META_IDEM_OF);
        out.counts.index_entries += self.drop_matching(&self.meta, entries, budget, |_, v| {
            Ok(idempotency::belongs_to(v, &prefix))
        })?;
        Ok(())
    }

    /// Under the session lock, as every change of the session index: session first,
    /// then its owner entry (the order `delete_session` keeps).
    fn purge_sessions(
        &self,
        tenant: &str,
        budget: &mut Budget,
        out: &mut Purged,
    ) -> Result<(), StoreError> {
        if !budget.open() {
            return Ok(());
        }
        let _one_at_a_time = self.session_create.lock();
        for k in self.session_owner.scan_prefix(tenant_part(tenant)).keys() {
            let k = k.map_err(|e| self.read_failed("scan session owners", e))?;
            if !budget.take() {
                break;
            }
            if let Some(id) = split_session_owner_key(&k)
                && self.del(&self.sessions, "purge: session", id.as_bytes())?
            {
                out.counts.sessions += 1;
                out.sessions.push(id.to_string());
            }
            out.counts.index_entries +=
                u64::from(self.del(&self.session_owner, "purge: session owner", &k)?);
        }
        Ok(())
    }
}
