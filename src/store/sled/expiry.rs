//! Expiry, tombstones and seen marks, and the repairs of cut-short operations that
//! `expired` and `sweep_tombstones` carry (module docs, "Concurrency contract").

use super::codec::{
    OwnerPrefix, StoredSeen, decode, decode_idempotency, encode, probe, upgrade_task,
    upgrade_tombstone,
};
use super::owner::owner_entry;
use super::schema::{META_IDEM_OF, expiry_key, meta_key};
use super::tenant::tenant_entry;
use super::{Cas, SledStore};
use crate::store::probe;
use crate::store::{Expired, Owned, SCHEMA_VERSION, StoreError, TaskRecord, Tombstone};

impl SledStore {
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
            let (k, _) = kv.map_err(|e| self.read_failed("scan expiry", e))?;
            let parsed = k.get(..8).zip(k.get(8..)).and_then(|(at, id)| {
                let at = u64::from_be_bytes(<[u8; 8]>::try_from(at).ok()?);
                Some((at, std::str::from_utf8(id).ok()?))
            });
            let Some((at, id)) = parsed else {
                return Err(StoreError::Corrupt(
                    format!("expiry: malformed key {:?}", k.as_ref()).into(),
                ));
            };
            let actual = match self
                .tasks
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get task", e))?
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
                        .map_err(|e| self.read_failed("get task", e))?
                        && probe(id.as_bytes(), &v)?.expires_at_ms == at
                    {
                        self.put(&self.expiry, "repair expiry entry", &k, &[])?;
                    }
                }
                None => {
                    // The task is gone: so are the leftovers of its indexes.
                    self.del(&self.seen, "drop stale seen mark", id.as_bytes())?;
                    self.drop_owner_entry_of_gone(id)?;
                    self.del(&self.expiry, "drop stale expiry entry", &k)?;
                    let idem_of = meta_key(META_IDEM_OF, id.as_bytes());
                    self.del(&self.meta, "drop stale idem_of", &idem_of)?;
                }
            }
        }
        Ok(out)
    }

    /// Tombstone first, then the task: the owner never sees "not found" in between.
    /// The seen mark and the owner entry go before the expiry entry, so a crash in
    /// between leaves the entry that lets [`TaskStore::expired`] drop them.
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
                .map_err(|e| self.read_failed("get idem_of", e))?;
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
            self.del(&self.owner, "expire: owner entry", &owner_entry(&rec))?;
            let tenant = tenant_entry(&rec);
            self.del(&self.tenant_status, "expire: tenant entry", &tenant)?;
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

    /// See [`TaskStore::lookup_owned`](crate::store::TaskStore::lookup_owned): both
    /// trees are read on every path, and a record is decoded only once its owner is
    /// known to be the caller ([`OwnerPrefix`]).
    pub(crate) fn lookup_owned(
        &self,
        task_id: &str,
        tenant: &str,
        subject: &str,
    ) -> Result<Owned, StoreError> {
        let key = task_id.as_bytes();
        let owner = OwnerPrefix::new(task_id, tenant, subject);
        probe::read();
        let task = self
            .tasks
            .get(key)
            .map_err(|e| self.read_failed("get task", e))?;
        probe::read();
        let tomb = self
            .tombstones
            .get(key)
            .map_err(|e| self.read_failed("get tombstone", e))?;
        let owns =
            |rec_tenant: &str, rec_subject: &str| rec_tenant == tenant && rec_subject == subject;
        if let Some(b) = task {
            return Ok(match owner.owns(&b) {
                Some(false) => Owned::Unknown,
                Some(true) => Owned::Record(Box::new(decode("tasks", key, &b, upgrade_task)?)),
                // A record of an older version: only a decode tells its owner.
                None => {
                    let rec: TaskRecord = decode("tasks", key, &b, upgrade_task)?;
                    if owns(&rec.tenant, &rec.subject) {
                        Owned::Record(Box::new(rec))
                    } else {
                        Owned::Unknown
                    }
                }
            });
        }
        let Some(b) = tomb else {
            return Ok(Owned::Unknown);
        };
        let expired = match owner.owns(&b) {
            Some(owned) => owned,
            None => {
                let t: Tombstone = decode("tombstones", key, &b, upgrade_tombstone)?;
                owns(&t.tenant, &t.subject)
            }
        };
        Ok(if expired {
            Owned::Expired
        } else {
            Owned::Unknown
        })
    }

    pub(crate) fn tombstone(&self, task_id: &str) -> Result<Option<Tombstone>, StoreError> {
        match self.tombstones.get(task_id.as_bytes()) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                decode("tombstones", task_id.as_bytes(), &b, upgrade_tombstone).map(Some)
            }
            Err(e) => Err(self.read_failed("get tombstone", e)),
        }
    }

    /// Idempotency entry and seen mark first, then the tombstone: a crash in between
    /// leaves a tombstone that the next sweep removes again.
    pub(crate) fn sweep_tombstones(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut due = Vec::new();
        for kv in self.tombstones.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan tombstones", e))?;
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
                    .map_err(|e| self.read_failed("get idempotency entry", e))?
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
                .map_err(|e| self.read_failed("get task", e))?
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
        let at_ms = crate::store::now_ms();
        for id in task_ids {
            let key = id.as_bytes();
            let has = |tree: &sled::Tree, what: &str| {
                tree.contains_key(key)
                    .map_err(|e| self.read_failed(what, e))
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
}
