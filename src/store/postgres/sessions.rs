//! 2025-era client sessions on PostgreSQL (docs/design.md §22 "Clients of the 2025
//! era"): the `legacy_sessions` table of `migrations/postgres/0003_legacy_sessions.sql`.

use tokio_postgres::error::SqlState;

use super::statements::{
    CountSessions, CreateSession, DeleteSession, ExpireSession, IdleSessions, LockSessionOwner,
    PrincipalSessions, SessionOwned, SessionRead, SessionWrite,
};
use super::{PgError, PgStore, db_message, decode, encode, ms};
use crate::store::{Corruption, OwnedSession, SCHEMA_VERSION, SessionCreated, SessionRecord};

/// The advisory lock key of one principal's session creations: the tenant's length
/// first, so no two principals share a key by concatenation (a hash collision only
/// makes two principals wait for each other).
fn owner_lock_key(tenant: &str, subject: &str) -> String {
    format!("taskgate sessions {}:{tenant}{subject}", tenant.len())
}

fn ms_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl PgStore {
    /// One transaction: the principal's advisory lock, then the insert that counts
    /// (its own statement, so its snapshot is taken after the lock and sees every
    /// creation of this principal committed before). Two replicas cannot both pass
    /// the cap.
    pub(super) async fn create_session_now(
        &self,
        session: &SessionRecord,
        cap: usize,
    ) -> Result<SessionCreated, PgError> {
        let mut rec = session.clone();
        rec.v = SCHEMA_VERSION;
        let record = encode("session record", &rec)?;
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        self.pooling.enter(&tx).await?;
        let key = owner_lock_key(&rec.tenant, &rec.subject);
        self.sql
            .lock_session_owner
            .execute(&tx, &LockSessionOwner { key: &key })
            .await?;
        let create = CreateSession {
            session_id: &rec.session_id,
            tenant: &rec.tenant,
            subject: &rec.subject,
            last_seen_ms: ms(rec.last_seen_at_ms),
            record: &record,
            cap: i64::try_from(cap).unwrap_or(i64::MAX),
        };
        let written = match self.sql.create_session.execute(&tx, &create).await {
            Ok(n) => n,
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                let what = format!(
                    "legacy_sessions/{}: a session with this id already exists ({})",
                    rec.session_id,
                    db_message(&e)
                );
                return Err(PgError::Corrupt(Corruption::from(what).caused_by(e)));
            }
            Err(e) => return Err(e.into()),
        };
        if written == 1 {
            tx.commit().await?;
            return Ok(SessionCreated::New);
        }
        let held = PrincipalSessions {
            tenant: &rec.tenant,
            subject: &rec.subject,
        };
        let rows = self.sql.principal_sessions.query(&tx, &held).await?;
        tx.commit().await?;
        let sessions = rows
            .iter()
            .map(|row| Ok((row.try_get(0)?, ms_u64(row.try_get(1)?))))
            .collect::<Result<Vec<(String, u64)>, PgError>>()?;
        Ok(SessionCreated::AtCap(sessions))
    }

    pub(super) async fn session_owned_now(
        &self,
        session_id: &str,
        tenant: &str,
        subject: &str,
    ) -> Result<OwnedSession, PgError> {
        // PostgreSQL text holds no NUL, so no row can name such an owner.
        if tenant.contains('\0') || subject.contains('\0') || session_id.contains('\0') {
            return Ok(OwnedSession::Unknown);
        }
        let c = self.pool.get().await?;
        let owned = SessionOwned {
            session_id,
            tenant,
            subject,
        };
        crate::store::probe::read();
        Ok(match self.sql.session_owned.query_opt(&c, &owned).await? {
            Some(row) => {
                let bytes: Vec<u8> = row.try_get(0)?;
                let rec = decode(&format!("legacy_sessions/{session_id}"), &bytes)?;
                OwnedSession::Record(Box::new(rec))
            }
            None => OwnedSession::Unknown,
        })
    }

    /// Compare-and-swap on `version`, like a task's update; the id and owner are kept.
    pub(super) async fn update_session_now(
        &self,
        session_id: &str,
        f: &mut (dyn FnMut(&mut SessionRecord) -> bool + Send),
    ) -> Result<Option<SessionRecord>, PgError> {
        let c = self.pool.get().await?;
        loop {
            let read = SessionRead { session_id };
            let Some(row) = self.sql.session_read.query_opt(&c, &read).await? else {
                return Ok(None);
            };
            let version: i64 = row.try_get(0)?;
            let bytes: Vec<u8> = row.try_get(1)?;
            let old: SessionRecord = decode(&format!("legacy_sessions/{session_id}"), &bytes)?;
            let mut rec = old.clone();
            if !f(&mut rec) {
                return Ok(Some(old));
            }
            rec.v = SCHEMA_VERSION;
            rec.session_id = old.session_id;
            rec.tenant = old.tenant;
            rec.subject = old.subject;
            let record = encode("session record", &rec)?;
            let write = SessionWrite {
                session_id,
                version,
                last_seen_ms: ms(rec.last_seen_at_ms),
                record: &record,
            };
            if self.sql.session_write.execute(&c, &write).await? == 1 {
                return Ok(Some(rec));
            }
            // Another writer won the round (or the session is gone): read again.
        }
    }

    pub(super) async fn delete_session_now(&self, session_id: &str) -> Result<bool, PgError> {
        let c = self.pool.get().await?;
        let delete = DeleteSession { session_id };
        Ok(self.sql.delete_session.execute(&c, &delete).await? > 0)
    }

    pub(super) async fn expire_session_now(
        &self,
        session_id: &str,
        last_seen_before_ms: u64,
    ) -> Result<bool, PgError> {
        let c = self.pool.get().await?;
        let expire = ExpireSession {
            session_id,
            before_ms: ms(last_seen_before_ms),
        };
        Ok(self.sql.expire_session.execute(&c, &expire).await? > 0)
    }

    pub(super) async fn idle_sessions_now(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, PgError> {
        let c = self.pool.get().await?;
        let idle = IdleSessions {
            before_ms: ms(before_ms),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        let rows = self.sql.idle_sessions.query(&c, &idle).await?;
        rows.iter()
            .map(|r| r.try_get::<_, String>(0).map_err(PgError::from))
            .collect()
    }

    pub(super) async fn count_sessions_now(&self) -> Result<u64, PgError> {
        let c = self.pool.get().await?;
        let n: i64 = self
            .sql
            .count_sessions
            .query_one(&c, &CountSessions {})
            .await?
            .try_get(0)?;
        Ok(ms_u64(n))
    }
}
