//! The tenant index (`tenant_status` tree): each tenant's tasks per status in creation
//! order, for the operator API (docs/design.md §24 "Operations"), its entries, the
//! pages and counts read from it, and building it once for a store written before it
//! existed. It follows the owner index's rules (`owner.rs`): an entry goes in before
//! its task, a reader skips an entry its record disagrees with.

use std::collections::BTreeMap;

use super::SledStore;
use super::codec::{decode, probe, upgrade_task};
use super::schema::{
    META_TENANT_INDEX, split_tenant_status_key, tenant_status_key, tenant_status_prefix,
};
use crate::store::{OwnerCursor, StoreError, TaskRecord, TaskStatus, TenantCount};

/// The `tenant_status` key of a task record.
pub(super) fn tenant_entry(rec: &TaskRecord) -> Vec<u8> {
    tenant_status_key(
        &rec.tenant,
        rec.status.as_str(),
        rec.created_at_ms,
        &rec.task_id,
    )
}

impl SledStore {
    /// One page under `(tenant, status)`: a range scan from just after `after`, each
    /// entry's task read and checked against its key. An entry whose task is gone
    /// and tombstoned is a leftover of a cut-short `expire` and is dropped here; one
    /// without a tombstone may be a creation under way and is only skipped.
    pub(crate) fn list_tenant(
        &self,
        tenant: &str,
        status: TaskStatus,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let prefix = tenant_status_prefix(tenant, status.as_str());
        let from = match after {
            Some(c) => std::ops::Bound::Excluded(tenant_status_key(
                tenant,
                status.as_str(),
                c.created_at_ms,
                &c.task_id,
            )),
            None => std::ops::Bound::Included(prefix.clone()),
        };
        let mut out = Vec::new();
        for k in self
            .tenant_status
            .range((from, std::ops::Bound::Unbounded))
            .keys()
        {
            if out.len() >= limit {
                break;
            }
            let k = k.map_err(|e| self.read_failed("scan tenant index", e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let (_, _, created_at_ms, id) = split_tenant_status_key(&k).ok_or_else(|| {
                StoreError::Corrupt(format!("tenant_status: malformed key {:?}", k.as_ref()).into())
            })?;
            let Some(bytes) = self
                .tasks
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get task", e))?
            else {
                if self
                    .tombstones
                    .contains_key(id.as_bytes())
                    .map_err(|e| self.read_failed("get tombstone", e))?
                {
                    self.del(&self.tenant_status, "drop stale tenant entry", &k)?;
                }
                continue;
            };
            let rec: TaskRecord = decode("tasks", id.as_bytes(), &bytes, upgrade_task)?;
            if rec.created_at_ms == created_at_ms && rec.tenant == tenant && rec.status == status {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Every tenant's tasks by status, counted from the index's keys alone. An entry
    /// a crash left behind counts until a list drops it (rare: only a crash inside an
    /// `update` or an `expire` leaves one).
    pub(crate) fn tenant_counts(&self) -> Result<Vec<TenantCount>, StoreError> {
        let mut counts: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        for k in self.tenant_status.iter().keys() {
            let k = k.map_err(|e| self.read_failed("scan tenant index", e))?;
            let (tenant, status, _, _) = split_tenant_status_key(&k).ok_or_else(|| {
                StoreError::Corrupt(format!("tenant_status: malformed key {:?}", k.as_ref()).into())
            })?;
            let Some(status) = TaskStatus::parse(status) else {
                continue;
            };
            *counts
                .entry((tenant.to_string(), status.as_str()))
                .or_insert(0) += 1;
        }
        Ok(counts
            .into_iter()
            .filter_map(|((tenant, status), tasks)| {
                Some(TenantCount {
                    tenant,
                    status: TaskStatus::parse(status)?,
                    tasks,
                })
            })
            .collect())
    }

    /// At open: build the tenant index once for a store written before it existed
    /// (`meta/layout/tenant_index` says it is built).
    pub(super) fn build_tenant_index(&self) -> Result<(), StoreError> {
        self.build_index(
            META_TENANT_INDEX,
            &self.tenant_status,
            "tenant_status",
            |k, id, v| {
                let p = probe(k, v)?;
                Ok(tenant_status_key(
                    &p.tenant,
                    p.status.as_str(),
                    p.created_at_ms,
                    id,
                ))
            },
        )
    }
}
