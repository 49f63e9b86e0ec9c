//! One call: its POST, the answer as JSON or an SSE stream (with resumption), and
//! the guard that cancels it when dropped.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::consts::{
    ACCEPT_POST, ACCEPT_SSE, DEFAULT_RESUME_DELAY_MS, MAX_EMPTY_RESUMES, MAX_RESUME_DELAY_MS,
};
use super::handshake::Trigger;
use super::inbound::{CallCtx, ProgressRoute, split_batch};
use super::request::{
    ReadError, SendError, body_snippet, error_chain, is_event_stream, read_capped, snippet,
};
use super::retire::Lease;
use super::session::Session;
use super::state::HttpUpstream;
use crate::upstream::sse::SseParser;
use crate::upstream::{CallEvent, CallOutcome, CallSpec, UpstreamError, legacy_messages};

impl HttpUpstream {
    /// One call in the current session, or in `pinned` (an upstream task's session,
    /// which is never replaced: a session the server no longer knows fails the call).
    pub(super) async fn call_inner(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
        pinned: Option<&Session>,
    ) -> Result<CallOutcome, UpstreamError> {
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token_id = spec
            .want_progress
            .then(|| self.next_token.fetch_add(1, Ordering::Relaxed));
        let token = token_id.map(Value::from);
        let mut params = spec.params;
        if let Some(t) = &token {
            // Next to the trace context the registry may have put there.
            crate::protocol::trace::with_meta(&mut params, |m| {
                m.insert("progressToken".into(), t.clone());
            });
        }
        // Removes the token's route however this call ends (answer, error, drop).
        let route = token_id.map(|token| ProgressRoute {
            upstream: self,
            token,
        });
        let msg = legacy_messages::request(request_id, &spec.method, params);
        let body = Bytes::from(serde_json::to_vec(&msg).map_err(|e| self.protocol(e.to_string()))?);
        let mut guard = CancelGuard {
            upstream: self.me.clone(),
            request_id,
            sent: None,
            stop: self.stop.clone(),
        };
        for attempt in 0..2 {
            let session = match pinned {
                Some(s) => s.clone(),
                None => self.ensure_session().await?,
            };
            if let Some(r) = &route {
                // Per attempt: a retry after re-initialisation runs in a new session.
                r.register(session.generation, &events);
            }
            // From here on the request may reach the upstream: dropping us cancels it.
            guard.arm(self, &session);
            let resp = match self
                .send(
                    Method::POST,
                    Some(body.clone()),
                    Some(&session),
                    ACCEPT_POST,
                    None,
                )
                .await
            {
                Ok(r) => r,
                Err(SendError::Unreachable(reason)) => {
                    guard.disarm();
                    self.lose_session(&session, &reason);
                    return Err(self.unavailable(reason));
                }
                // Reset or closed while or after the request was written.
                Err(SendError::Failed(reason)) => {
                    let e = self.broken(reason);
                    return Err(self.session_failure(&session, &spec.method, e));
                }
            };
            let status = resp.status();
            if !status.is_success() {
                // Nothing runs upstream for a refused request: no cancellation needed.
                guard.disarm();
                let (expired, detail) = match status {
                    // python-sdk ≤ 1.9 answers an unknown session id with 400 and a body
                    // naming the session instead of 404; treat it the same.
                    StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST => {
                        let text = body_snippet(resp.into_body()).await;
                        let expired = status == StatusCode::NOT_FOUND
                            || text.to_ascii_lowercase().contains("session");
                        (expired, text)
                    }
                    _ => return Err(self.status_error(&spec.method, resp).await),
                };
                if expired && pinned.is_some() {
                    // Only this session holds the upstream task: it is gone with it.
                    return Err(self.broken(format!(
                        "{}: the upstream session holding the task is gone: HTTP {status}: {detail}",
                        spec.method
                    )));
                }
                if expired && session.id.is_some() {
                    if attempt == 0 {
                        // The session expired: the request never reached a live session,
                        // so sending it once more in a fresh one is safe.
                        tracing::info!(upstream = %self.name, %status, "session expired, re-initializing");
                        self.initialize_shared(Trigger::Expired(session.generation))
                            .await?;
                        continue;
                    }
                    // A session issued moments ago refused it too: it never ran.
                    break;
                }
                return Err(self.protocol(format!("{}: HTTP {status}: {detail}", spec.method)));
            }
            let mut ctx = CallCtx::new(
                &spec.method,
                request_id,
                token.clone(),
                Some(&events),
                session,
            );
            let outcome = self.read_answer(resp, &mut ctx).await?;
            guard.disarm();
            return Ok(outcome);
        }
        guard.disarm();
        // Both sessions refused the request as unknown before running it: never sent.
        Err(self.unavailable(
            "session expired again right after re-initialization; the request was not accepted",
        ))
    }

    /// Read the answer to one request: a JSON body or an SSE stream (with resumption).
    pub(super) async fn read_answer(
        &self,
        resp: Response<Incoming>,
        ctx: &mut CallCtx<'_>,
    ) -> Result<CallOutcome, UpstreamError> {
        if is_event_stream(&resp) {
            return self.read_stream(resp.into_body(), ctx).await;
        }
        // Every failure below but an oversized body (our own limit) means the session
        // did not speak JSON-RPC or the transport broke: the session is suspect.
        if resp.status() == StatusCode::ACCEPTED {
            let e = self.protocol("upstream answered a request with 202 and no response");
            return Err(self.session_failure(&ctx.session, ctx.what, e));
        }
        let body = match read_capped(resp.into_body(), self.max_message_bytes).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => {
                return Err(self.protocol(format!(
                    "response body exceeds max_message_bytes ({})",
                    self.max_message_bytes
                )));
            }
            Err(ReadError::Io(e)) => {
                let e = self.broken(format!("reading response body: {e}"));
                return Err(self.session_failure(&ctx.session, ctx.what, e));
            }
        };
        let value: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                let e = self.protocol(format!("invalid JSON response: {e}: {}", snippet(&body)));
                return Err(self.session_failure(&ctx.session, ctx.what, e));
            }
        };
        for msg in split_batch(value) {
            if let Some(outcome) = self.handle_inbound(msg, ctx).await {
                return Ok(outcome);
            }
        }
        let e = self.protocol("JSON answer does not contain the response to the request");
        Err(self.session_failure(&ctx.session, ctx.what, e))
    }

    pub(super) async fn read_stream(
        &self,
        body: Incoming,
        ctx: &mut CallCtx<'_>,
    ) -> Result<CallOutcome, UpstreamError> {
        let mut empty_resumes = 0u32;
        // `None` after a failed resumption attempt: nothing to read this round.
        let mut body = Some(body);
        loop {
            let mut parser = SseParser::new(self.max_message_bytes);
            let mut saw_event = false;
            let end = loop {
                let Some(stream) = body.as_mut() else {
                    break "resumption failed".to_string();
                };
                let frame = match stream.frame().await {
                    None => break "the stream ended".to_string(),
                    Some(Err(e)) => break format!("the stream broke: {}", error_chain(&e)),
                    Some(Ok(frame)) => frame,
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let events = parser
                    .feed(&data)
                    .map_err(|e| self.protocol(format!("{e} (max_message_bytes)")))?;
                for ev in events {
                    saw_event = true;
                    if let Some(id) = ev.id.filter(|id| !id.is_empty()) {
                        ctx.last_event_id = Some(id);
                    }
                    if ev.data.is_empty() {
                        continue; // priming event: only its id matters
                    }
                    let value: Value = match serde_json::from_str(&ev.data) {
                        Ok(v) => v,
                        Err(e) => {
                            let e = self.protocol(format!(
                                "invalid JSON in SSE event: {e}: {}",
                                snippet(ev.data.as_bytes())
                            ));
                            return Err(self.session_failure(&ctx.session, ctx.what, e));
                        }
                    };
                    for msg in split_batch(value) {
                        if let Some(outcome) = self.handle_inbound(msg, ctx).await {
                            return Ok(outcome);
                        }
                    }
                }
            };
            // `retry:` may arrive in a block the server never terminated before closing.
            if let Some(ms) = parser.reconnect_ms() {
                ctx.retry_ms = Some(ms);
            }
            if saw_event {
                empty_resumes = 0;
            } else {
                empty_resumes += 1;
            }
            // A stream that broke or ended for good without the response: the
            // session is suspect (python-sdk 1.9 ends every stream of a session it
            // broke this way).
            let Some(last_id) = ctx.last_event_id.clone() else {
                let e = self.broken(format!(
                    "{end} before the response arrived (no event id to resume from)"
                ));
                return Err(self.session_failure(&ctx.session, ctx.what, e));
            };
            if empty_resumes > MAX_EMPTY_RESUMES {
                let e = self.broken(format!(
                    "{end}; {MAX_EMPTY_RESUMES} resumptions brought nothing new"
                ));
                return Err(self.session_failure(&ctx.session, ctx.what, e));
            }
            let delay = ctx
                .retry_ms
                .unwrap_or(DEFAULT_RESUME_DELAY_MS)
                .min(MAX_RESUME_DELAY_MS);
            tracing::debug!(upstream = %self.name, last_id = %last_id, delay, "{end}; resuming with GET");
            tokio::time::sleep(Duration::from_millis(delay)).await;
            match self
                .send(
                    Method::GET,
                    None,
                    Some(&ctx.session),
                    ACCEPT_SSE,
                    Some(&last_id),
                )
                .await
            {
                Ok(resp) if resp.status().is_success() && is_event_stream(&resp) => {
                    body = Some(resp.into_body());
                }
                Ok(resp) => {
                    return Err(self
                        .status_error("resuming the stream", resp)
                        .await
                        .into_broken());
                }
                Err(e) => {
                    // The upstream may be restarting; a later resumption may succeed.
                    tracing::debug!(upstream = %self.name, "resumption failed: {}", e.reason());
                    // No body: the next round ends at once and counts as no progress.
                    body = None;
                }
            }
        }
    }
}

/// Sends `notifications/cancelled` when a call is dropped while its request may be at
/// the upstream (`sent` is `Some`), then verifies the session (module docs). Holds the
/// call's lease on that session, so a retired session is not ended under the call.
pub(super) struct CancelGuard {
    pub(super) upstream: Weak<HttpUpstream>,
    pub(super) request_id: u64,
    pub(super) sent: Option<(Session, Lease)>,
    pub(super) stop: CancellationToken,
}

impl CancelGuard {
    /// The request is about to be sent in `session`.
    pub(super) fn arm(&mut self, upstream: &HttpUpstream, session: &Session) {
        self.sent = Some((session.clone(), Lease::new(upstream, session)));
    }

    /// Nothing of the request is left upstream (answered or refused).
    pub(super) fn disarm(&mut self) {
        self.sent = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let Some((session, lease)) = self.sent.take() else {
            return;
        };
        if self.stop.is_cancelled() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Registered before the call is gone, so a call that starts right after this
        // one was cancelled already waits for the verdict.
        let verifying = session.live.begin_verify();
        let upstream = self.upstream.clone();
        let id = self.request_id;
        rt.spawn(async move {
            let _lease = lease;
            let _verifying = verifying;
            let Some(me) = upstream.upgrade() else { return };
            if me.is_shutting_down() {
                return;
            }
            me.cancel_and_verify(&session, id).await;
        });
    }
}

impl UpstreamError {
    /// For a call whose request was sent: an answer that would be a protocol error
    /// (an error status while resuming its stream) means the call broke, and it may
    /// have run.
    fn into_broken(self) -> Self {
        match self {
            Self::Protocol { upstream, reason } => Self::Broken { upstream, reason },
            other => other,
        }
    }
}
