//! Session setup: the shared `initialize` handshake, re-initialisation and the
//! background supervisor that keeps a session.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::consts::{
    ACCEPT_POST, FAIL_FAST, INIT_TIMEOUT, INITIAL_BACKOFF, MAX_BACKOFF, SESSION_HEADER,
    VERIFY_TIMEOUT,
};
use super::get_stream::listen;
use super::inbound::CallCtx;
use super::request::SendError;
use super::retire::Retire;
use super::session::Session;
use super::state::HttpUpstream;
use crate::upstream::{CallOutcome, TransportState, UpstreamError, UpstreamInfo, legacy_messages};

/// Who asks for a handshake; decides whether a recent failure is reused.
#[derive(Clone, Copy)]
pub(super) enum Trigger {
    Caller,
    Supervisor,
    /// The session with this generation answered 404.
    Expired(u64),
}

impl HttpUpstream {
    /// The current session, running a (shared) handshake when there is none. While a
    /// cancel in the current session is being verified, waits for the verdict (bounded
    /// by the verification's own bound) so a call is not sent into a session the cancel
    /// may have broken.
    pub(super) async fn ensure_session(&self) -> Result<Session, UpstreamError> {
        if self.is_shutting_down() {
            return Err(UpstreamError::ShuttingDown);
        }
        if let Some(s) = self.current_session() {
            if s.live.health().verifying == 0 {
                return Ok(s);
            }
            let mut health = s.live.health.subscribe();
            let verdict = health.wait_for(|h| h.verifying == 0 || h.retired);
            // A verification cannot outlive VERIFY_TIMEOUT; the slack only covers
            // scheduling, so a lost verdict delays a call, never parks it.
            let _ = tokio::time::timeout(VERIFY_TIMEOUT + Duration::from_secs(1), verdict).await;
            // A suspect session was replaced meanwhile: use whatever is current now.
            if let Some(s) = self.current_session() {
                return Ok(s);
            }
        }
        self.initialize_shared(Trigger::Caller).await
    }

    /// Run a handshake in its own task so the caller may be dropped without aborting it.
    pub(super) async fn initialize_shared(
        &self,
        trigger: Trigger,
    ) -> Result<Session, UpstreamError> {
        let me = self.me.upgrade().ok_or(UpstreamError::ShuttingDown)?;
        match tokio::spawn(async move { me.initialize_locked(trigger).await }).await {
            Ok(r) => r,
            Err(e) => Err(self.unavailable(format!("initialize task failed: {e}"))),
        }
    }

    pub(super) async fn initialize_locked(
        &self,
        trigger: Trigger,
    ) -> Result<Session, UpstreamError> {
        let _guard = self.init_lock.lock().await;
        if self.is_shutting_down() {
            return Err(UpstreamError::ShuttingDown);
        }
        let expired = {
            let inner = self.inner();
            match (&inner.session, trigger) {
                // Someone else already replaced the expired session: use theirs.
                (Some(s), Trigger::Expired(g)) if s.generation != g => return Ok(s.clone()),
                (Some(s), Trigger::Caller | Trigger::Supervisor) => return Ok(s.clone()),
                (Some(s), Trigger::Expired(_)) => Some(s.clone()),
                (None, _) => None,
            }
        };
        if let Some(s) = expired {
            // The server no longer knows it: nothing to DELETE.
            self.retire(&s, Retire::Gone);
        }
        if let (Trigger::Caller, Some((at, reason))) = (trigger, &self.inner().last_failure)
            && at.elapsed() < FAIL_FAST
        {
            return Err(self.unavailable(reason.clone()));
        }
        let result = match tokio::time::timeout(INIT_TIMEOUT, self.handshake()).await {
            Ok(r) => r,
            Err(_) => Err(format!("initialize timed out after {INIT_TIMEOUT:?}")),
        };
        match result {
            Ok((mut session, info)) => {
                if let Some(id) = &self.identity {
                    id.learned(&info);
                }
                let session = {
                    let mut inner = self.inner();
                    inner.generation += 1;
                    session.generation = inner.generation;
                    inner.session = Some(session.clone());
                    inner.info = Some(Arc::new(info));
                    inner.state = TransportState::Ready;
                    inner.last_failure = None;
                    session
                };
                tracing::info!(
                    upstream = %self.name,
                    session = session.id.as_deref().unwrap_or("-"),
                    version = session.version.as_deref().unwrap_or("-"),
                    "upstream initialized"
                );
                if session.generation > 1 {
                    crate::metrics::upstream_restart(&self.name, "http_reinit");
                }
                tokio::spawn(listen(self.me.clone(), session.clone(), self.stop.clone()));
                Ok(session)
            }
            Err(reason) => {
                tracing::warn!(upstream = %self.name, "initialize failed: {reason}");
                {
                    let mut inner = self.inner();
                    inner.state = TransportState::Down(reason.clone());
                    inner.last_failure = Some((Instant::now(), reason.clone()));
                }
                // Make sure the supervisor keeps retrying in the background.
                self.session_lost.notify_one();
                Err(self.unavailable(reason))
            }
        }
    }

    /// `initialize` + `notifications/initialized` (MCP 2025-11-25 "Lifecycle"). The session's generation
    /// is filled in by the caller.
    pub(super) async fn handshake(&self) -> Result<(Session, UpstreamInfo), String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = Bytes::from(
            serde_json::to_vec(&legacy_messages::initialize_request(id))
                .map_err(|e| e.to_string())?,
        );
        let resp = self
            .send(Method::POST, Some(body), None, ACCEPT_POST, None)
            .await
            .map_err(SendError::reason)?;
        if !resp.status().is_success() {
            return Err(self.status_error("initialize", resp).await.to_string());
        }
        let session_id = resp
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .map(str::to_string);
        // Requests the server sends before answering (ping) are answered within the
        // new session; the version is not known yet.
        let provisional = Session::new(session_id, None);
        let mut ctx = CallCtx::new("initialize", id, None, None, provisional.clone());
        let outcome = self
            .read_answer(resp, &mut ctx)
            .await
            .map_err(|e| e.to_string())?;
        let result = match outcome {
            CallOutcome::Result(v) => v,
            CallOutcome::Error(e) => return Err(format!("initialize was refused: {e}")),
        };
        let info = legacy_messages::parse_initialize_result(&result)?;
        let session = Session {
            version: Some(info.protocol_version.clone()),
            ..provisional
        };
        if let Err(e) = self
            .post_message(&session, &legacy_messages::initialized_notification())
            .await
        {
            // Never current, but the server may hold it: end it.
            self.retire(&session, Retire::Suspect);
            return Err(format!("notifications/initialized: {e}"));
        }
        Ok((session, info))
    }
}

/// Background supervisor: (re-)initialises whenever there is no session, with backoff.
pub(super) async fn supervise(me: Weak<HttpUpstream>, lost: Arc<Notify>, stop: CancellationToken) {
    let mut backoff = INITIAL_BACKOFF;
    loop {
        let attempt = {
            let Some(up) = me.upgrade() else { return };
            if up.current_session().is_some() || up.is_shutting_down() {
                None
            } else {
                Some(tokio::select! {
                    _ = stop.cancelled() => return,
                    r = up.initialize_locked(Trigger::Supervisor) => r,
                })
            }
        };
        match attempt {
            Some(Err(UpstreamError::ShuttingDown)) => return,
            Some(Err(_)) => {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            Some(Ok(_)) | None => backoff = INITIAL_BACKOFF,
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = lost.notified() => {}
        }
    }
}
