//! The 2025-era client sessions (docs/design.md §22 "Clients of the 2025 era"): the
//! engine part that owns them (ARCHITECTURE.md "The engine's parts"). The front never
//! reaches the store; it opens, resolves, updates and closes sessions here.
//!
//! - A session is bound to the principal that opened it, and another principal's
//!   session reads like one never issued (`resolve` and `close` answer alike).
//! - At `[legacy] max_sessions_per_principal` the session least recently seen that is
//!   not *active* on this replica is closed to make room; when every one is active the
//!   new one is refused. *Active* is in memory ([`SessionRepo::activity`]): a live
//!   stream or a call in flight here. Another replica's activity shows only through
//!   `last_seen_at_ms`.
//! - `last_seen_at_ms` is rewritten coarsely (at most every `max(idle / 30, 10 s)`,
//!   and at least twice per idle period), not on every request; the sweeper closes
//!   sessions idle for `session_idle_ms`, and refreshes those active here instead.
//! - A session closed here (DELETE, expiry, eviction) is announced on
//!   [`SessionRepo::ended`] and ends its [`ActiveGuard::ended`], so this replica's
//!   streams of it can end. Another replica finds it gone at its next read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::ids::{is_well_formed_session, new_session_id};
use crate::auth::Principal;
use crate::config::{LegacyConfig, as_millis};
use crate::store::{
    OwnedSession, SCHEMA_VERSION, SessionCreated, SessionRecord, StoreError, TaskStore, now_ms,
};

/// What a client refused at the cap is told to wait before it tries again: the cap is
/// held by sessions in use, and one of them ending is what makes room.
pub const REFUSED_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The shortest interval between two rewrites of a session's `last_seen_at_ms`.
const MIN_TOUCH_EVERY: Duration = Duration::from_secs(10);

/// Idle sessions the sweeper takes per store read.
const SWEEP_BATCH: usize = 512;

/// Ids announced on [`SessionRepo::ended`] that a slow receiver may fall behind by.
const ENDED_CAPACITY: usize = 1024;

/// Why a session could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionError {
    /// The principal holds `max_sessions_per_principal` sessions and every one is in
    /// use on this replica.
    #[error("every session of this principal is in use (legacy.max_sessions_per_principal)")]
    Refused { retry_after: Duration },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a session ended on this replica (metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Expired,
    Evicted,
    Deleted,
}

impl Ending {
    fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Evicted => "evicted",
            Self::Deleted => "deleted",
        }
    }
}

/// The sessions in use on this replica: how many guards each has, and the token that
/// ends them when the session is closed here.
#[derive(Default)]
struct ActiveSessions {
    by_id: Mutex<HashMap<String, Active>>,
}

struct Active {
    guards: usize,
    ended: CancellationToken,
}

impl ActiveSessions {
    fn is_active(&self, id: &str) -> bool {
        self.by_id.lock().contains_key(id)
    }

    fn end(&self, id: &str) {
        if let Some(a) = self.by_id.lock().get(id) {
            a.ended.cancel();
        }
    }
}

/// Marks a session as in use on this replica while held (a live stream, a call in
/// flight): eviction passes it over and the sweeper keeps it alive. Dropping the last
/// guard of a session ends that.
pub struct ActiveGuard {
    active: Arc<ActiveSessions>,
    id: String,
    ended: CancellationToken,
}

impl ActiveGuard {
    /// The session this guard marks.
    pub fn session_id(&self) -> &str {
        &self.id
    }

    /// Resolves once the session is closed on this replica (DELETE, idle expiry,
    /// eviction): what a stream of it selects on to end.
    pub fn ended(&self) -> WaitForCancellationFutureOwned {
        self.ended.clone().cancelled_owned()
    }

    /// Whether the session was closed on this replica.
    pub fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut by_id = self.active.by_id.lock();
        if let Some(a) = by_id.get_mut(&self.id) {
            a.guards = a.guards.saturating_sub(1);
            if a.guards == 0 {
                by_id.remove(&self.id);
            }
        }
    }
}

/// See the module documentation.
pub struct SessionRepo {
    store: Arc<dyn TaskStore>,
    cap: usize,
    idle: Duration,
    touch_every: Duration,
    active: Arc<ActiveSessions>,
    ended: broadcast::Sender<String>,
}

impl SessionRepo {
    pub(super) fn new(store: Arc<dyn TaskStore>, cfg: &LegacyConfig) -> Self {
        let idle = cfg.session_idle;
        Self {
            store,
            cap: cfg.max_sessions_per_principal.max(1),
            idle,
            touch_every: touch_every(idle),
            active: Arc::default(),
            ended: broadcast::channel(ENDED_CAPACITY).0,
        }
    }

    /// Open a session for `principal` on `upstream` with what its `initialize` said.
    /// At the cap the least recently seen session not active here is closed and the
    /// creation tried once more; when every session is active it is refused.
    pub async fn open(
        &self,
        principal: &Principal,
        upstream: &str,
        protocol_version: &str,
        client_info: Value,
        client_capabilities: Map<String, Value>,
    ) -> Result<SessionRecord, SessionError> {
        let now = now_ms();
        let rec = SessionRecord {
            v: SCHEMA_VERSION,
            session_id: new_session_id(),
            tenant: principal.tenant.clone(),
            subject: principal.subject.clone(),
            upstream: upstream.to_string(),
            protocol_version: protocol_version.to_string(),
            client_info,
            client_capabilities,
            created_at_ms: now,
            last_seen_at_ms: now,
            initialized: false,
            log_level: None,
            subscriptions: Vec::new(),
        };
        for retry in [false, true] {
            let held = match self.store.create_session(&rec, self.cap).await? {
                SessionCreated::New => {
                    crate::metrics::legacy_session("created");
                    crate::metrics::legacy_sessions_open(1.0);
                    return Ok(rec);
                }
                SessionCreated::AtCap(held) => held,
            };
            if retry || !self.evict_one(held).await? {
                break;
            }
        }
        crate::metrics::legacy_session("refused");
        tracing::info!(
            tenant = %principal.tenant,
            subject = %principal.subject,
            cap = self.cap,
            "legacy session refused: every session of the principal is in use"
        );
        Err(SessionError::Refused {
            retry_after: REFUSED_RETRY_AFTER,
        })
    }

    /// Close the least recently seen of `held` that is not active here (an older one
    /// first when a newer use beat the close); whether one was closed.
    async fn evict_one(&self, mut held: Vec<(String, u64)>) -> Result<bool, StoreError> {
        held.retain(|(id, _)| !self.active.is_active(id));
        held.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        for (id, last_seen) in held {
            // Only while it was not used since it was listed.
            if self
                .store
                .expire_session(&id, last_seen.saturating_add(1))
                .await?
            {
                self.closed(&id, Ending::Evicted);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The principal's session `id`, or `None` for an id that is malformed, unknown,
    /// another principal's or idle past `session_idle_ms` (all alike). A use: it moves
    /// `last_seen_at_ms`, coarsely.
    pub async fn resolve(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<SessionRecord>, StoreError> {
        if !is_well_formed_session(id) {
            return Ok(None);
        }
        let rec = match self
            .store
            .session_owned(id, &principal.tenant, &principal.subject)
            .await?
        {
            OwnedSession::Record(rec) => *rec,
            OwnedSession::Unknown => return Ok(None),
        };
        let now = now_ms();
        let idle_since = now.saturating_sub(as_millis(self.idle));
        if rec.last_seen_at_ms < idle_since {
            // Due for the sweeper: closed now instead of served once more.
            if self.store.expire_session(id, idle_since).await? {
                self.closed(id, Ending::Expired);
            }
            return Ok(None);
        }
        if now.saturating_sub(rec.last_seen_at_ms) < as_millis(self.touch_every) {
            return Ok(Some(rec));
        }
        self.touch_at(id, now).await
    }

    /// Mark session `id` as used now (coarsely: only when its `last_seen_at_ms` is
    /// older than the touch interval). For a stream that stays open without requests.
    /// `None` when the session is gone.
    pub async fn touch(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.touch_at(id, now_ms()).await
    }

    async fn touch_at(&self, id: &str, now: u64) -> Result<Option<SessionRecord>, StoreError> {
        let every = as_millis(self.touch_every);
        self.store
            .update_session(id, &mut |r| {
                let due = now.saturating_sub(r.last_seen_at_ms) >= every;
                if due {
                    r.last_seen_at_ms = now;
                }
                due
            })
            .await
    }

    /// Read-modify-write session `id` (compare-and-swap: `f` may run more than once and
    /// returns `false` to leave it unchanged; its id and owner stay). The record after
    /// the call, `None` when the session is gone. The caller resolved `id` for its
    /// principal first.
    pub async fn update(
        &self,
        id: &str,
        mut f: impl FnMut(&mut SessionRecord) -> bool + Send,
    ) -> Result<Option<SessionRecord>, StoreError> {
        self.store.update_session(id, &mut f).await
    }

    /// Close the principal's session `id` (DELETE); `false` for one that is
    /// malformed, unknown or another principal's (alike).
    pub async fn close(&self, principal: &Principal, id: &str) -> Result<bool, StoreError> {
        if !is_well_formed_session(id) {
            return Ok(false);
        }
        match self
            .store
            .session_owned(id, &principal.tenant, &principal.subject)
            .await?
        {
            OwnedSession::Unknown => Ok(false),
            OwnedSession::Record(_) => {
                let gone = self.store.delete_session(id).await?;
                if gone {
                    self.closed(id, Ending::Deleted);
                }
                Ok(gone)
            }
        }
    }

    /// Mark session `id` as in use on this replica until the guard is dropped.
    pub fn activity(&self, id: &str) -> ActiveGuard {
        let mut by_id = self.active.by_id.lock();
        let a = by_id.entry(id.to_string()).or_insert_with(|| Active {
            guards: 0,
            ended: CancellationToken::new(),
        });
        a.guards += 1;
        ActiveGuard {
            active: self.active.clone(),
            id: id.to_string(),
            ended: a.ended.clone(),
        }
    }

    /// Whether session `id` is in use on this replica.
    pub fn is_active(&self, id: &str) -> bool {
        self.active.is_active(id)
    }

    /// The ids of sessions closed on this replica from now on (DELETE, idle expiry,
    /// eviction). A receiver that falls more than 1024 behind gets `Lagged` and should
    /// re-check its sessions with [`resolve`](Self::resolve). Holders of an
    /// [`ActiveGuard`] can wait on [`ActiveGuard::ended`] instead.
    pub fn ended(&self) -> broadcast::Receiver<String> {
        self.ended.subscribe()
    }

    /// Close the sessions idle for `session_idle_ms` (the sweeper); those active here
    /// are refreshed instead. Returns how many were closed.
    pub async fn expire_idle(&self) -> Result<usize, StoreError> {
        let now = now_ms();
        let idle_since = now.saturating_sub(as_millis(self.idle));
        let mut closed = 0;
        let mut kept = Vec::new();
        loop {
            let ids = self.store.idle_sessions(idle_since, SWEEP_BATCH).await?;
            let batch = ids.len();
            let mut progressed = false;
            for id in ids {
                if self.active.is_active(&id) {
                    if !kept.contains(&id) {
                        self.touch_at(&id, now).await?;
                        kept.push(id);
                        progressed = true;
                    }
                    continue;
                }
                if self.store.expire_session(&id, idle_since).await? {
                    self.closed(&id, Ending::Expired);
                    closed += 1;
                }
                progressed = true;
            }
            if batch < SWEEP_BATCH || !progressed {
                break;
            }
        }
        Ok(closed)
    }

    /// Sessions a tenant purge removed from the store: closed as a DELETE closes one.
    pub(super) fn purged(&self, ids: &[String]) {
        for id in ids {
            self.closed(id, Ending::Deleted);
        }
    }

    /// Session `id` was closed here: count it and end this replica's streams of it.
    fn closed(&self, id: &str, why: Ending) {
        crate::metrics::legacy_session(why.as_str());
        crate::metrics::legacy_sessions_open(-1.0);
        tracing::debug!(session = %id, reason = why.as_str(), "legacy session closed");
        self.active.end(id);
        let _ = self.ended.send(id.to_string());
    }
}

/// How often a session's `last_seen_at_ms` may be rewritten: `max(idle / 30, 10 s)`,
/// but at most half the idle time, so a session in use never looks idle.
fn touch_every(idle: Duration) -> Duration {
    (idle / 30).max(MIN_TOUCH_EVERY).min(idle / 2)
}
