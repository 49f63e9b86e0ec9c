//! Task records, request routes and idempotency claims: the synchronous operations
//! the [`TaskStore`](crate::store::TaskStore) impl runs.

use super::codec::{
    StoredIdempotency, decode, decode_idempotency, encode, encode_route, encode_task, probe,
    upgrade_route, upgrade_task,
};
use super::owner::owner_entry;
use super::schema::{META_IDEM_OF, expiry_key, meta_key};
use super::tenant::tenant_entry;
use super::{Cas, SledStore};
use crate::store::{
    Created, IdempotencyEntry, RequestRoute, SCHEMA_VERSION, StoreError, TaskRecord,
};

/// The operations themselves, synchronous: sled works on its page cache and log
/// buffer, so none of them waits for I/O worth yielding for (flushes go through the
/// group-commit flusher). The [`TaskStore`] impl below runs them; the crate's own tests
/// call them directly.
impl SledStore {
    /// Write order (module docs, "Concurrency contract"): route, expiry entry, live
    /// entry, owner entry, tenant entry, task, `idem_of`, idempotency claim.
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
            StoreError::Corrupt(
                format!("tasks/{}: a task with this id already exists", task.task_id).into(),
            )
        };
        // Refused before anything is written, so no undo can touch the other task's
        // index entries (the compare-and-swap below still guards a same-id race).
        if self
            .tasks
            .contains_key(id)
            .map_err(|e| self.read_failed("get task", e))?
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
        let owner = owner_entry(task);
        self.put(&self.owner, "create: owner entry", &owner, &[])?;
        let tenant = tenant_entry(task);
        self.put(&self.tenant_status, "create: tenant entry", &tenant, &[])?;
        let r = self
            .tasks
            .compare_and_swap(id, None as Option<&[u8]>, Some(task_bytes));
        if let Cas::Lost(_) = self.cas("create: task", r)? {
            // A same-id race: the index entries written above may be the other
            // task's own keys, so they stay; one that is not names a record that
            // disagrees with it, which readers skip (`list_owned`, `expired`).
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
                        self.del(&self.tenant_status, "create: undo tenant entry", &tenant)?;
                        self.del(&self.owner, "create: undo owner entry", &owner)?;
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
            // The engine never changes a keyed field of the owner entry; if an update
            // did, the new entry goes in before the record and the old one after it.
            let (was_owner, is_owner) = (owner_entry(&old), owner_entry(&rec));
            let moved = was_owner != is_owner;
            if moved {
                self.put(&self.owner, "update: owner entry", &is_owner, &[])?;
            }
            // A status change moves the tenant entry the same way: new before the
            // record, old after it.
            let (was_tenant, is_tenant) = (tenant_entry(&old), tenant_entry(&rec));
            let retagged = was_tenant != is_tenant;
            if retagged {
                self.put(&self.tenant_status, "update: tenant entry", &is_tenant, &[])?;
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
            if moved {
                self.del(&self.owner, "update: old owner entry", &was_owner)?;
            }
            if retagged {
                self.del(&self.tenant_status, "update: old tenant entry", &was_tenant)?;
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
            let (k, v) = kv.map_err(|e| self.read_failed("scan routes", e))?;
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
            Err(e) => return Err(self.read_failed("get idempotency entry", e)),
        };
        if self.names_nothing(&entry.task_id)? {
            return Ok(None);
        }
        Ok(Some(entry))
    }

    pub(crate) fn count_by_status(
        &self,
    ) -> Result<Vec<(crate::store::TaskStatus, u64)>, StoreError> {
        let mut counts: Vec<(crate::store::TaskStatus, u64)> = Vec::new();
        for kv in self.tasks.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan tasks", e))?;
            let status = probe(&k, &v)?.status;
            match counts.iter_mut().find(|(s, _)| *s == status) {
                Some((_, n)) => *n += 1,
                None => counts.push((status, 1)),
            }
        }
        Ok(counts)
    }
}

impl SledStore {
    /// A task's stored bytes (for a compare-and-swap against them) and its record.
    pub(super) fn read_task(
        &self,
        key: &[u8],
    ) -> Result<Option<(sled::IVec, TaskRecord)>, StoreError> {
        match self.tasks.get(key) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                let rec = decode("tasks", key, &b, upgrade_task)?;
                Ok(Some((b, rec)))
            }
            Err(e) => Err(self.read_failed("get task", e)),
        }
    }

    /// Whether an idempotency entry's task is neither stored nor tombstoned: only a
    /// crash can leave such an entry (a live create writes its task before claiming
    /// the key; expiry writes the tombstone before removing the task).
    pub(super) fn names_nothing(&self, task_id: &str) -> Result<bool, StoreError> {
        let k = task_id.as_bytes();
        let task = self
            .tasks
            .contains_key(k)
            .map_err(|e| self.read_failed("get task", e))?;
        let tomb = self
            .tombstones
            .contains_key(k)
            .map_err(|e| self.read_failed("get tombstone", e))?;
        Ok(!task && !tomb)
    }
}
