//! 2025-era client sessions (docs/design.md §22 "Clients of the 2025 era"): the
//! `sessions` tree and its `session_owner` index (module docs, "Schema" and the write
//! orders).

use super::codec::{OwnerPrefix, decode, encode, upgrade_none};
use super::schema::{session_owner_key, session_owner_prefix, split_session_owner_key};
use super::{Cas, SledStore};
use crate::store::{
    Corruption, OwnedSession, SCHEMA_VERSION, SessionCreated, SessionRecord, StoreError, probe,
};

/// The fields of a stored session the index work needs, without decoding the rest.
#[derive(serde::Deserialize)]
struct SessionProbe {
    tenant: String,
    subject: String,
    last_seen_at_ms: u64,
}

fn probe_session(key: &[u8], bytes: &[u8]) -> Result<SessionProbe, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = format!("sessions/{}: {e}", String::from_utf8_lossy(key));
        StoreError::Corrupt(Corruption::from(what).caused_by(e))
    })
}

impl SledStore {
    /// Write order (module docs): owner entry, then the session. The store's session
    /// lock makes the count and the write one step.
    pub(crate) fn create_session(
        &self,
        session: &SessionRecord,
        cap: usize,
    ) -> Result<SessionCreated, StoreError> {
        let mut rec = session.clone();
        rec.v = SCHEMA_VERSION;
        let bytes = encode("sessions", &rec.session_id, &rec)?;
        let id = rec.session_id.as_bytes();
        let duplicate = || {
            StoreError::Corrupt(
                format!(
                    "sessions/{}: a session with this id already exists",
                    rec.session_id
                )
                .into(),
            )
        };
        let _one_at_a_time = self.session_create.lock();
        if self
            .sessions
            .contains_key(id)
            .map_err(|e| self.read_failed("get session", e))?
        {
            return Err(duplicate());
        }
        let prefix = session_owner_prefix(&rec.tenant, &rec.subject);
        let mut held = 0usize;
        for k in self.session_owner.scan_prefix(&prefix).keys() {
            k.map_err(|e| self.read_failed("scan session owners", e))?;
            held += 1;
        }
        if held >= cap {
            // Entries whose session is gone are leftovers of a cut-short write: they
            // do not count.
            let sessions = self.principal_sessions(&prefix)?;
            if sessions.len() >= cap {
                return Ok(SessionCreated::AtCap(sessions));
            }
        }
        let owner = session_owner_key(&rec.tenant, &rec.subject, &rec.session_id);
        self.put(
            &self.session_owner,
            "create session: owner entry",
            &owner,
            &[],
        )?;
        let r = self
            .sessions
            .compare_and_swap(id, None as Option<&[u8]>, Some(bytes));
        if let Cas::Lost(current) = self.cas("create session", r)? {
            // Only a writer outside this store's lock could get here: keep the entry
            // if it names the session that is there.
            let same_owner = match current {
                Some(b) => {
                    let p = probe_session(id, &b)?;
                    p.tenant == rec.tenant && p.subject == rec.subject
                }
                None => false,
            };
            if !same_owner {
                self.del(
                    &self.session_owner,
                    "create session: undo owner entry",
                    &owner,
                )?;
            }
            return Err(duplicate());
        }
        Ok(SessionCreated::New)
    }

    /// The sessions of the principal whose owner entries start with `prefix`, with
    /// their last-seen times; entries whose session is gone are dropped. The caller
    /// holds the session lock.
    fn principal_sessions(&self, prefix: &[u8]) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for k in self.session_owner.scan_prefix(prefix).keys() {
            let k = k.map_err(|e| self.read_failed("scan session owners", e))?;
            let Some(id) = split_session_owner_key(&k) else {
                continue;
            };
            match self
                .sessions
                .get(id.as_bytes())
                .map_err(|e| self.read_failed("get session", e))?
            {
                Some(b) => out.push((
                    id.to_string(),
                    probe_session(id.as_bytes(), &b)?.last_seen_at_ms,
                )),
                None => {
                    self.del(&self.session_owner, "drop session owner leftover", &k)?;
                }
            }
        }
        Ok(out)
    }

    /// One read whatever the id is; only the owner's record is decoded (see
    /// [`OwnerPrefix`]).
    pub(crate) fn session_owned(
        &self,
        session_id: &str,
        tenant: &str,
        subject: &str,
    ) -> Result<OwnedSession, StoreError> {
        let key = session_id.as_bytes();
        let owner = OwnerPrefix::session(session_id, tenant, subject);
        probe::read();
        let Some(b) = self
            .sessions
            .get(key)
            .map_err(|e| self.read_failed("get session", e))?
        else {
            return Ok(OwnedSession::Unknown);
        };
        let rec: SessionRecord = match owner.owns(&b) {
            Some(false) => return Ok(OwnedSession::Unknown),
            Some(true) => decode("sessions", key, &b, upgrade_none)?,
            // Another version: only a decode tells its owner.
            None => {
                let rec: SessionRecord = decode("sessions", key, &b, upgrade_none)?;
                if rec.tenant != tenant || rec.subject != subject {
                    return Ok(OwnedSession::Unknown);
                }
                rec
            }
        };
        Ok(OwnedSession::Record(Box::new(rec)))
    }

    /// A compare-and-swap loop like the tasks' `update`; the id and owner are kept.
    pub(crate) fn update_session(
        &self,
        session_id: &str,
        f: &mut dyn FnMut(&mut SessionRecord) -> bool,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let key = session_id.as_bytes();
        loop {
            let Some(bytes) = self
                .sessions
                .get(key)
                .map_err(|e| self.read_failed("get session", e))?
            else {
                return Ok(None);
            };
            let old: SessionRecord = decode("sessions", key, &bytes, upgrade_none)?;
            let mut rec = old.clone();
            if !f(&mut rec) {
                return Ok(Some(old));
            }
            rec.v = SCHEMA_VERSION;
            rec.session_id = old.session_id;
            rec.tenant = old.tenant;
            rec.subject = old.subject;
            let new_bytes = encode("sessions", session_id, &rec)?;
            let r = self
                .sessions
                .compare_and_swap(key, Some(&bytes), Some(new_bytes));
            if let Cas::Done = self.cas("update session", r)? {
                return Ok(Some(rec));
            }
        }
    }

    /// Delete a session (only while last seen before `last_seen_before_ms`, when
    /// given); returns whether it was deleted. Session first, then its owner entry.
    pub(crate) fn delete_session(
        &self,
        session_id: &str,
        last_seen_before_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        let key = session_id.as_bytes();
        loop {
            let Some(bytes) = self
                .sessions
                .get(key)
                .map_err(|e| self.read_failed("get session", e))?
            else {
                return Ok(false);
            };
            let p = probe_session(key, &bytes)?;
            if last_seen_before_ms.is_some_and(|before| p.last_seen_at_ms >= before) {
                return Ok(false);
            }
            let r = self
                .sessions
                .compare_and_swap(key, Some(&bytes), None as Option<&[u8]>);
            if let Cas::Lost(_) = self.cas("delete session", r)? {
                continue;
            }
            let owner = session_owner_key(&p.tenant, &p.subject, session_id);
            self.del(&self.session_owner, "delete session: owner entry", &owner)?;
            return Ok(true);
        }
    }

    /// One pass over the sessions (bounded by principals × cap, at the sweep
    /// interval: an index by last-seen time would cost a write per touch), after
    /// dropping the owner entries whose session is gone.
    pub(crate) fn idle_sessions(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.drop_session_owner_leftovers()?;
        let mut idle = Vec::new();
        for kv in self.sessions.iter() {
            let (k, v) = kv.map_err(|e| self.read_failed("scan sessions", e))?;
            let last_seen = probe_session(&k, &v)?.last_seen_at_ms;
            if last_seen < before_ms {
                idle.push((last_seen, String::from_utf8_lossy(&k).into_owned()));
            }
        }
        idle.sort();
        Ok(idle.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    /// Owner entries without their session: what a create or delete cut short by a
    /// crash leaves. Under the session lock, so a create between its two writes is
    /// never mistaken for one.
    fn drop_session_owner_leftovers(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.session_create.lock();
        for k in self.session_owner.iter().keys() {
            let k = k.map_err(|e| self.read_failed("scan session owners", e))?;
            let gone = match split_session_owner_key(&k) {
                Some(id) => !self
                    .sessions
                    .contains_key(id.as_bytes())
                    .map_err(|e| self.read_failed("get session", e))?,
                None => true,
            };
            if gone {
                self.del(&self.session_owner, "drop session owner leftover", &k)?;
            }
        }
        Ok(())
    }

    pub(crate) fn count_sessions(&self) -> Result<u64, StoreError> {
        Ok(self.sessions.len() as u64)
    }
}
