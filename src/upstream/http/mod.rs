//! Legacy Streamable HTTP upstream transport (MCP 2025-11-25 "Transports", "Streamable HTTP"; docs/design.md §14 "Upstream sessions").
//!
//! One [`HttpUpstream`] is one upstream MCP session over plain `http://`. Guarantees:
//!
//! - **Start never blocks on the upstream.** [`HttpUpstream::start`] returns at once and
//!   runs `initialize` in the background; an unreachable upstream is retried with
//!   backoff (200 ms doubling to 5 s) for as long as the transport lives, so the
//!   gateway starts regardless and calls succeed once the upstream is back.
//! - **One handshake at a time.** Callers, the background supervisor and session-expiry
//!   recovery share a single `initialize` attempt; the handshake runs in its own task,
//!   so a caller giving up never leaves a half-initialised session behind.
//! - **Session headers only.** Every request after `initialize` carries
//!   `Mcp-Session-Id` (when issued), `MCP-Protocol-Version` and the static headers from
//!   the configuration — never anything from a client.
//! - **Redirects.** 307/308 are followed (the body is re-sent) and the new URL is
//!   remembered, so `/mcp` → `/mcp/` costs one round trip once.
//! - **No lost answers.** A call's SSE stream may start with a priming event and be
//!   closed after `retry:` (2025-11-25 polling); the transport waits and resumes with
//!   `GET` + `Last-Event-ID` until the response arrives. A stream that ends without an
//!   id to resume from fails the call with [`UpstreamError::Broken`].
//! - **Session expiry.** A 404 on a request that carried a session id re-runs
//!   `initialize` without one and retries *that* request once (it never reached a live
//!   session, so repeating it cannot execute it twice). A 400 whose body mentions the
//!   session counts as expiry too (python-sdk ≤ 1.9 answers unknown sessions that way).
//! - **Errors** follow whether the request may have reached the upstream (docs/design.md
//!   §12 "HTTP front", "Retry safety of upstream failures"). Never sent →
//!   [`UpstreamError::Unavailable`]: connection refused / connect failure before the
//!   request was written (the session is dropped and the supervisor re-initialises
//!   with backoff), no session could be initialised, or the session was refused (404)
//!   again right after re-initialising. Sent, then failed: any HTTP 5xx answered to
//!   the written request — 502/503/504 included, since a proxy or the server may have
//!   started it — or a broken stream → [`UpstreamError::Broken`]; 4xx, bad JSON,
//!   oversized messages → [`UpstreamError::Protocol`]. Any other send error (the
//!   connection broke while or after writing) counts as sent. Reasons carry the
//!   status and a snippet of the body.
//! - **Attribution.** Log messages and server→client requests are only ever attributed
//!   to the call whose POST stream carried them. Requests arriving on the standalone
//!   `GET` stream are answered by [`crate::upstream::unowned_request_answer`]. Progress
//!   is attributed by its token instead, on whichever stream of the session it arrives:
//!   the tokens are the gateway's own, minted per call and never reused by this
//!   transport (docs/design.md §14 "Upstream sessions"), so a token names exactly one call. Some servers
//!   (python-sdk 1.9, `tests/upstream_mcp194.rs`) send a call's progress on the GET stream.
//! - **Cancellation.** Dropping a [`LegacyTransport::call`] future once its request may
//!   have reached the upstream (sending started, answer not complete) POSTs
//!   `notifications/cancelled` (spawned); late answers vanish with the dropped stream.
//!   A call that fails mid-stream is cancelled the same way, so the upstream stops work
//!   nobody will read. After `shutdown` nothing more is sent.
//! - **A broken session is never reused.** A transport-level failure on a session —
//!   the connection reset or closed while or after the request was written, a body or
//!   stream that breaks or ends without the response, an answer that is not JSON-RPC,
//!   a message POST that fails or stalls — makes the session *suspect*: it stops being
//!   the current session, new calls run `initialize` again and go to a fresh one, and
//!   the supervisor starts that handshake at once. Calls still in flight on the old
//!   session carry on there (it may be healthy after all); once the last of them ends,
//!   its GET stream is stopped and it is ended with `DELETE`. An HTTP error status is
//!   an answer, not a broken session, and keeps it. The failed call itself is not
//!   retried: its request was written and may have run, and the gateway never sends
//!   a call twice by itself.
//! - **A cancel is verified.** Cancelling a running call is when some servers break
//!   the whole session: python-sdk 1.9.4 answers `{"error":{"code":0}}` and then every
//!   later POST in that session gets SSE headers and a truncated chunked body, every
//!   later GET headers and then nothing (`tests/upstream_mcp194.rs`).
//!   So after `notifications/cancelled` the transport sends a `ping` in that session;
//!   until it is answered (any JSON-RPC answer will do) new calls wait for the verdict
//!   rather than being sent into a session that may be dead. No answer within
//!   `VERIFY_TIMEOUT` (cancel and ping together) — a transport failure or a stall —
//!   makes the session suspect. Calls in flight are not affected by a verification.
//! - **Bounds.** No exchange the transport starts on its own waits forever: the
//!   handshake is bounded by `INIT_TIMEOUT`, message POSTs (notifications, answers)
//!   by `MESSAGE_TIMEOUT`, a verification by `VERIFY_TIMEOUT`, a `DELETE` by
//!   `DELETE_TIMEOUT`. A call's own stream has no idle limit — a legacy server may be
//!   silent on it for the whole run of a long tool (python-sdk 1.9 sends progress on
//!   the GET stream) — so a call is bounded by its caller (`call_timeout_ms`,
//!   `sync_timeout_ms`, the task's ttl); dropping it cancels it, and the verification
//!   that follows finds a session that stopped answering.
//! - **Bounded memory.** A JSON body or SSE event larger than `max_message_bytes` fails
//!   the call with [`UpstreamError::Protocol`].
//! - **No panics on upstream input.** Every upstream-controlled path returns an error.

mod call_stream;
mod consts;
mod executor;
mod get_stream;
mod handshake;
mod inbound;
mod pinned;
mod request;
mod retire;
mod session;
mod state;

#[cfg(test)]
mod mock_server;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::tls::client::https_connector;
use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue, Method};
use hyper_util::client::legacy::Client;
use parking_lot::Mutex;
use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub use self::state::HttpUpstream;

use self::consts::{ACCEPT_POST, CONNECT_TIMEOUT, DELETE_TIMEOUT};
use self::executor::ConnectionExecutor;
use self::handshake::supervise;
use self::session::Session;
use self::state::Inner;
use super::identity::Identity;
use super::{
    CallEvent, CallOutcome, CallSpec, LegacyTransport, SessionNotification, SessionRef,
    TaskChannel, TransportState, UpstreamError, UpstreamInfo,
};

/// Options for one HTTP upstream session.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Upstream name, used in errors and logs.
    pub name: String,
    /// The MCP endpoint, `http://host:port/path`.
    pub url: String,
    /// Static headers sent on every request (upstream credentials from config/env).
    pub headers: Vec<(String, String)>,
    /// Largest JSON body or SSE event accepted from the upstream.
    pub max_message_bytes: usize,
    /// Told about every completed `initialize` (the task plane's identity).
    pub identity: Option<Arc<Identity>>,
    /// How an `https://` endpoint is verified (`tls::client`); for an `http://` one,
    /// [`crate::tls::client::plaintext_only`].
    pub tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for HttpUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpUpstream")
            .field("name", &self.name)
            .field("state", &self.state())
            .finish()
    }
}

impl HttpUpstream {
    /// Create the transport and start initialising in the background. Must be called
    /// inside a tokio runtime. Never fails: invalid static headers are skipped (config
    /// validation rejects them earlier) and an unreachable upstream is retried.
    pub fn start(opts: HttpOptions) -> Arc<Self> {
        let mut headers = Vec::with_capacity(opts.headers.len());
        for (k, v) in &opts.headers {
            match (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                (Ok(k), Ok(v)) => headers.push((k, v)),
                _ => {
                    tracing::warn!(upstream = %opts.name, header = %k, "skipping invalid static header")
                }
            }
        }
        let connector = https_connector(&opts.tls, CONNECT_TIMEOUT);
        let client = Client::builder(ConnectionExecutor).build(connector);
        let (notifications, _) = broadcast::channel(256);
        let this = Arc::new_cyclic(|me| HttpUpstream {
            me: me.clone(),
            name: opts.name,
            headers,
            max_message_bytes: opts.max_message_bytes.max(1),
            identity: opts.identity,
            client,
            inner: Mutex::new(Inner {
                url: opts.url,
                session: None,
                info: None,
                state: TransportState::Starting,
                generation: 0,
                last_failure: None,
            }),
            init_lock: tokio::sync::Mutex::new(()),
            notifications,
            next_id: AtomicU64::new(1),
            next_token: AtomicU64::new(1),
            progress_routes: Mutex::new(HashMap::new()),
            session_lost: Arc::new(Notify::new()),
            stop: CancellationToken::new(),
            shutting_down: AtomicBool::new(false),
            live_tasks: std::sync::atomic::AtomicUsize::new(0),
        });
        tokio::spawn(supervise(
            Arc::downgrade(&this),
            this.session_lost.clone(),
            this.stop.clone(),
        ));
        this
    }

    /// One call (in the current session, or the `pinned` one) that ends with
    /// `ShuttingDown` once the transport stops.
    async fn call_until_stopped(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
        pinned: Option<&Session>,
    ) -> Result<CallOutcome, UpstreamError> {
        if self.is_shutting_down() {
            return Err(UpstreamError::ShuttingDown);
        }
        let stop = self.stop.clone();
        tokio::select! {
            _ = stop.cancelled() => Err(UpstreamError::ShuttingDown),
            r = self.call_inner(spec, events, pinned) => {
                // A stream broken by our own DELETE is a shutdown, not a failure.
                if r.is_err() && self.is_shutting_down() {
                    Err(UpstreamError::ShuttingDown)
                } else {
                    r
                }
            }
        }
    }

    /// The endpoint currently used (after any remembered redirect).
    pub fn url(&self) -> String {
        self.inner().url.clone()
    }
}

impl LegacyTransport for HttpUpstream {
    fn ensure_ready(&self) -> BoxFuture<'_, Result<Arc<UpstreamInfo>, UpstreamError>> {
        Box::pin(async move {
            self.ensure_session().await?;
            self.info()
                .ok_or_else(|| self.unavailable("upstream is not initialized"))
        })
    }

    fn info(&self) -> Option<Arc<UpstreamInfo>> {
        self.inner().info.clone()
    }

    fn state(&self) -> TransportState {
        self.inner().state.clone()
    }

    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>> {
        Box::pin(self.call_until_stopped(spec, events, None))
    }

    fn notifications(&self) -> broadcast::Receiver<SessionNotification> {
        self.notifications.subscribe()
    }

    fn pin(&self) -> BoxFuture<'_, Result<Arc<dyn TaskChannel>, UpstreamError>> {
        Box::pin(async move {
            let session = self.ensure_session().await?;
            self.pinned(session)
        })
    }

    fn adopt(&self, session: &SessionRef) -> Option<Arc<dyn TaskChannel>> {
        let s = Session::new(Some(session.id.clone()), session.version.clone());
        self.pinned(s).ok()
    }

    fn live_tasks(&self) -> usize {
        self.live_tasks.load(Ordering::SeqCst)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.shutting_down.swap(true, Ordering::SeqCst) {
                return;
            }
            let session = {
                let mut inner = self.inner();
                inner.state = TransportState::Down("shutting down".into());
                inner.session.take()
            };
            // A session holding upstream tasks is left to the server: the next start
            // re-attaches to them (docs/design.md §25).
            if let Some(s) =
                session.filter(|s| s.id.is_some() && s.live.tasks.load(Ordering::SeqCst) == 0)
            {
                let delete = self.send(Method::DELETE, None, Some(&s), ACCEPT_POST, None);
                match tokio::time::timeout(DELETE_TIMEOUT, delete).await {
                    Ok(Ok(resp)) => {
                        tracing::debug!(upstream = %self.name, status = %resp.status(), "session deleted");
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(upstream = %self.name, "DELETE failed: {}", e.reason());
                    }
                    Err(_) => tracing::debug!(upstream = %self.name, "DELETE timed out"),
                }
            }
            self.stop.cancel();
        })
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        // Stops the supervisor and the GET stream, which only hold weak references.
        self.stop.cancel();
    }
}
