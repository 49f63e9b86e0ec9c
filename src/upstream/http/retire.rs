//! What happens to a session that stops being trusted: leases, suspicion, losing it,
//! retiring it, ending it once its last user is done, and the cancel verification
//! that may make it suspect (module docs, "A broken session is never reused", "A
//! cancel is verified").

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Map;

use super::consts::{ACCEPT_POST, DELETE_TIMEOUT, VERIFY_TIMEOUT};
use super::inbound::CallCtx;
use super::request::{PostError, body_snippet};
use super::session::Session;
use super::state::HttpUpstream;
use crate::upstream::{TransportState, UpstreamError, legacy_messages};

/// One user of a session. The last lease of a retired session ends it.
pub(super) struct Lease {
    pub(super) upstream: Weak<HttpUpstream>,
    pub(super) session: Session,
}

impl Lease {
    /// Count a user (call, verification) of `session` until the lease drops.
    pub(super) fn new(upstream: &HttpUpstream, session: &Session) -> Self {
        session.live.users.fetch_add(1, Ordering::SeqCst);
        Self {
            upstream: upstream.me.clone(),
            session: session.clone(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let live = &self.session.live;
        if live.users.fetch_sub(1, Ordering::SeqCst) == 1
            && live.health().retired
            && let Some(up) = self.upstream.upgrade()
        {
            up.end_session(&self.session);
        }
    }
}

/// How a session stopped being current.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Retire {
    /// A transport failure: the server may still hold it, so it is ended with DELETE.
    Suspect,
    /// Unreachable, or the server said it no longer knows it: nothing to DELETE.
    Gone,
}

impl HttpUpstream {
    /// Forget `session` (if still current) after the upstream could not be reached or
    /// said it no longer knows the session: the supervisor re-initialises with backoff,
    /// and callers within `FAIL_FAST` get this failure instead of a new attempt.
    pub(super) fn lose_session(&self, session: &Session, reason: &str) {
        if self.retire(session, Retire::Gone) {
            {
                let mut inner = self.inner();
                inner.state = TransportState::Down(reason.to_string());
                inner.last_failure = Some((Instant::now(), reason.to_string()));
            }
            self.session_lost.notify_one();
        }
    }

    /// A transport-level failure on `session` (module docs): new calls go to a fresh
    /// session, which the supervisor starts initialising at once. Not a reason to
    /// refuse calls: the upstream answered the connection, so no `FAIL_FAST`.
    pub(super) fn suspect(&self, session: &Session, reason: &str) {
        // Our own DELETE at shutdown breaks the streams: not the session's fault.
        if self.is_shutting_down() {
            return;
        }
        if self.retire(session, Retire::Suspect) {
            tracing::warn!(
                upstream = %self.name,
                session = session.id.as_deref().unwrap_or("-"),
                "upstream session is suspect, new calls use a fresh session: {reason}"
            );
            self.session_lost.notify_one();
        }
    }

    /// Stop sending new calls to `session`; it ends once its last user is done.
    /// Returns whether it was the current session.
    pub(super) fn retire(&self, session: &Session, how: Retire) -> bool {
        let was_current = {
            let mut inner = self.inner();
            let current = inner
                .session
                .as_ref()
                .is_some_and(|s| s.generation == session.generation);
            if current {
                inner.session = None;
            }
            current
        };
        let live = &session.live;
        if how == Retire::Suspect {
            live.delete_when_closed.store(true, Ordering::SeqCst);
        }
        let mut newly = false;
        live.health.send_modify(|h| {
            newly = !h.retired;
            h.retired = true;
        });
        // Either this sees no users, or the last lease to go sees `retired`.
        if newly && live.users.load(Ordering::SeqCst) == 0 {
            self.end_session(session);
        }
        was_current
    }

    /// End a retired session nobody uses any more: stop its GET stream and, when the
    /// server may still hold it, `DELETE` it (detached, bounded) so it frees it.
    pub(super) fn end_session(&self, session: &Session) {
        let live = &session.live;
        if live.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        live.ended.cancel();
        if !live.delete_when_closed.load(Ordering::SeqCst)
            || live.tasks.load(Ordering::SeqCst) > 0
            || session.id.is_none()
            || self.is_shutting_down()
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.me.clone();
        let session = session.clone();
        rt.spawn(async move {
            let Some(me) = me.upgrade() else { return };
            let delete = me.send(Method::DELETE, None, Some(&session), ACCEPT_POST, None);
            let sid = session.id.as_deref().unwrap_or("-");
            match tokio::time::timeout(DELETE_TIMEOUT, delete).await {
                Ok(Ok(resp)) => {
                    tracing::debug!(upstream = %me.name, session = sid, status = %resp.status(), "retired session deleted");
                }
                Ok(Err(e)) => {
                    tracing::debug!(upstream = %me.name, session = sid, "DELETE of a retired session failed: {}", e.reason());
                }
                Err(_) => {
                    tracing::debug!(upstream = %me.name, session = sid, "DELETE of a retired session timed out");
                }
            }
        });
    }

    /// `err` happened to the `what` request on `session` at the transport level (module
    /// docs): the session is suspect. Returns `err` for the caller.
    pub(super) fn session_failure(
        &self,
        session: &Session,
        what: &str,
        err: UpstreamError,
    ) -> UpstreamError {
        self.suspect(session, &format!("{what}: {err}"));
        err
    }

    /// Decide what a failed message POST (notification or answer) says about the
    /// session it was sent in.
    pub(super) fn message_failed(&self, session: &Session, what: &str, err: &PostError) {
        match err {
            PostError::Unreachable(reason) => self.lose_session(session, reason),
            PostError::Transport(reason) => self.suspect(session, &format!("{what}: {reason}")),
            PostError::Status(status, _)
                if *status == StatusCode::NOT_FOUND && session.id.is_some() =>
            {
                if self.retire(session, Retire::Gone) {
                    self.session_lost.notify_one();
                }
            }
            PostError::Status(..) => {}
        }
        tracing::debug!(upstream = %self.name, "{what} failed: {err}");
    }
    /// Cancel `request_id` in `session`, then make sure the session still answers
    /// (module docs, "A cancel is verified"). Both steps together are bounded by
    /// `VERIFY_TIMEOUT`; callers waiting in [`Self::ensure_session`] are released when
    /// this returns (by the caller's `Verifying` guard).
    pub(super) async fn cancel_and_verify(&self, session: &Session, request_id: u64) {
        let msg = legacy_messages::cancelled(request_id, "request cancelled by the gateway");
        let check = async {
            if let Err(e) = self.post_message(session, &msg).await {
                self.message_failed(session, "notifications/cancelled", &e);
                // Lost or suspect is decided; an error status still asks the ping.
                if !matches!(e, PostError::Status(..)) {
                    return Ok(());
                }
            }
            if session.live.health().retired {
                return Ok(()); // nothing left to decide
            }
            self.ping(session).await
        };
        let reason = match tokio::time::timeout(VERIFY_TIMEOUT, check).await {
            Ok(Ok(())) => return,
            Ok(Err(reason)) => reason,
            Err(_) => format!("no answer to ping within {VERIFY_TIMEOUT:?}"),
        };
        self.suspect(
            session,
            &format!("after cancelling request {request_id}: {reason}"),
        );
    }

    /// `ping` in `session`. Any JSON-RPC answer — an error too — or an HTTP error status
    /// other than "unknown session" shows that the session is served.
    pub(super) async fn ping(&self, session: &Session) -> Result<(), String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = Bytes::from(
            serde_json::to_vec(&legacy_messages::request(id, "ping", Map::new()))
                .map_err(|e| e.to_string())?,
        );
        let resp = self
            .send(Method::POST, Some(body), Some(session), ACCEPT_POST, None)
            .await
            .map_err(|e| format!("ping: {}", e.reason()))?;
        let status = resp.status();
        if !status.is_success() {
            let text = body_snippet(resp.into_body()).await;
            let unknown = status == StatusCode::NOT_FOUND
                || (status == StatusCode::BAD_REQUEST
                    && text.to_ascii_lowercase().contains("session"));
            return if unknown && session.id.is_some() {
                Err(format!("ping: HTTP {status}: {text}"))
            } else {
                Ok(())
            };
        }
        let mut ctx = CallCtx::new("ping", id, None, None, session.clone());
        self.read_answer(resp, &mut ctx)
            .await
            .map(drop)
            .map_err(|e| format!("ping: {e}"))
    }
}
