//! Legacy Streamable HTTP upstream transport (spec C3, design.md policy 14).
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
//! - **Errors** follow whether the request may have reached the upstream (design.md
//!   "HTTP status of upstream failures follows retry safety"). Never sent →
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
//!   transport (design.md policy 14), so a token names exactly one call. Some servers
//!   (python-sdk 1.9, see shared/peers.md) send a call's progress on the GET stream.
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value};
use tokio::sync::{Notify, broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::identity::Identity;
use super::legacy_messages::{self, Inbound};
use super::sse::SseParser;
use super::{
    BoxFuture, CallEvent, CallOutcome, CallSpec, InputAnswer, InputRequest, LegacyTransport,
    SessionNotification, TransportState, UpstreamError, UpstreamInfo,
};
use crate::protocol::RpcError;

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
}

const ACCEPT_POST: &str = "application/json, text/event-stream";
const ACCEPT_SSE: &str = "text/event-stream";
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";

const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A caller arriving this soon after a failed handshake gets the failure instead of a
/// new attempt, so a burst of calls against a dead upstream is not a burst of connects.
const FAIL_FAST: Duration = Duration::from_millis(250);
const INIT_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A notification or response POST is answered `202` at once by any live server.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// `notifications/cancelled` plus the `ping` that verifies the session afterwards;
/// new calls wait at most this long for the verdict.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_REDIRECTS: usize = 5;
/// When a stream ends without `retry:` but with an id, wait this long before resuming.
const DEFAULT_RESUME_DELAY_MS: u64 = 500;
/// Cap on a server-supplied `retry:` so a hostile value cannot park a call forever.
const MAX_RESUME_DELAY_MS: u64 = 60_000;
/// Consecutive resumptions that deliver no event at all before the call is abandoned.
const MAX_EMPTY_RESUMES: u32 = 5;
const SNIPPET_BYTES: usize = 512;

/// The identity of one live upstream session.
#[derive(Debug, Clone)]
struct Session {
    /// `Mcp-Session-Id`, when the server issued one.
    id: Option<String>,
    /// Negotiated version; `None` only while the handshake itself runs.
    version: Option<String>,
    /// Increments with every successful `initialize`; tells a stale session apart.
    generation: u64,
    /// Shared by every clone: whether the session is still trusted, and who uses it.
    live: Arc<Liveness>,
}

impl Session {
    fn new(id: Option<String>, version: Option<String>) -> Self {
        Self {
            id,
            version,
            generation: 0,
            live: Arc::new(Liveness::default()),
        }
    }

    /// Count a user (call, verification) of this session until the lease drops.
    fn lease(&self, upstream: &HttpUpstream) -> Lease {
        self.live.users.fetch_add(1, Ordering::SeqCst);
        Lease {
            upstream: upstream.me.clone(),
            session: self.clone(),
        }
    }
}

/// What a session's users need to know about its health (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
struct Health {
    /// Verifications (cancel + ping) in progress; new calls wait while this is > 0.
    verifying: usize,
    /// No longer the current session: new calls go elsewhere.
    retired: bool,
}

#[derive(Debug)]
struct Liveness {
    health: watch::Sender<Health>,
    /// Calls and verifications using the session right now.
    users: AtomicUsize,
    /// Whether ending a retired session sends `DELETE` (not when the server already
    /// forgot it or cannot be reached).
    delete_when_closed: AtomicBool,
    /// Set once the session was ended (at most once).
    closed: AtomicBool,
    /// Cancelled when the session is ended: stops its GET stream.
    ended: CancellationToken,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            health: watch::Sender::new(Health::default()),
            users: AtomicUsize::new(0),
            delete_when_closed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            ended: CancellationToken::new(),
        }
    }
}

impl Liveness {
    fn health(&self) -> Health {
        *self.health.borrow()
    }

    /// A verification starts; callers that arrive now wait for its verdict.
    fn begin_verify(self: &Arc<Self>) -> Verifying {
        self.health.send_modify(|h| h.verifying += 1);
        Verifying(self.clone())
    }
}

/// One verification in progress; its end (however it ends) releases the waiters.
struct Verifying(Arc<Liveness>);

impl Drop for Verifying {
    fn drop(&mut self) {
        self.0
            .health
            .send_modify(|h| h.verifying = h.verifying.saturating_sub(1));
    }
}

/// One user of a session. The last lease of a retired session ends it.
struct Lease {
    upstream: Weak<HttpUpstream>,
    session: Session,
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
enum Retire {
    /// A transport failure: the server may still hold it, so it is ended with DELETE.
    Suspect,
    /// Unreachable, or the server said it no longer knows it: nothing to DELETE.
    Gone,
}

struct Inner {
    /// Current endpoint (updated when a 307/308 redirect is followed).
    url: String,
    session: Option<Session>,
    info: Option<UpstreamInfo>,
    state: TransportState,
    generation: u64,
    last_failure: Option<(Instant, String)>,
}

/// Why a request could not be exchanged.
enum SendError {
    /// Nothing reached the upstream (connection refused, connect timeout, …).
    Unreachable(String),
    /// The exchange failed after the request may have been sent.
    Failed(String),
}

impl SendError {
    fn reason(self) -> String {
        match self {
            Self::Unreachable(r) | Self::Failed(r) => r,
        }
    }
}

/// Why a notification or response POST failed.
#[derive(Debug, thiserror::Error)]
enum PostError {
    /// Nothing reached the upstream.
    #[error("{0}")]
    Unreachable(String),
    /// The exchange broke or stalled: a transport-level failure of the session.
    #[error("{0}")]
    Transport(String),
    /// The upstream answered with an error status.
    #[error("HTTP {0}: {1}")]
    Status(StatusCode, String),
}

/// Who asks for a handshake; decides whether a recent failure is reused.
#[derive(Clone, Copy)]
enum Trigger {
    Caller,
    Supervisor,
    /// The session with this generation answered 404.
    Expired(u64),
}

/// A legacy Streamable HTTP client session (spec C3). See the module docs.
pub struct HttpUpstream {
    me: Weak<HttpUpstream>,
    name: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    max_message_bytes: usize,
    identity: Option<Arc<Identity>>,
    client: Client<HttpConnector, Full<Bytes>>,
    inner: Mutex<Inner>,
    /// Serialises handshakes (first start, recovery, re-init after 404).
    init_lock: tokio::sync::Mutex<()>,
    notifications: broadcast::Sender<SessionNotification>,
    next_id: AtomicU64,
    next_token: AtomicU64,
    /// Progress token → the call that owns it, for progress arriving on a stream other
    /// than the call's own (see the module docs). Entries live exactly as long as the
    /// call ([`ProgressRoute`]).
    progress_routes: Mutex<HashMap<u64, ProgressTarget>>,
    /// Wakes the supervisor when the session was lost.
    session_lost: Arc<Notify>,
    stop: CancellationToken,
    shutting_down: AtomicBool,
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
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
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
        });
        tokio::spawn(supervise(
            Arc::downgrade(&this),
            this.session_lost.clone(),
            this.stop.clone(),
        ));
        this
    }

    /// The endpoint currently used (after any remembered redirect).
    pub fn url(&self) -> String {
        self.inner().url.clone()
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave `Inner` inconsistent (every
        // critical section is a few plain assignments), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    fn current_session(&self) -> Option<Session> {
        self.inner().session.clone()
    }

    fn unavailable(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Unavailable {
            upstream: self.name.clone(),
            reason: reason.into(),
        }
    }

    fn broken(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Broken {
            upstream: self.name.clone(),
            reason: reason.into(),
        }
    }

    fn protocol(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Protocol {
            upstream: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// Forget `session` (if still current) after the upstream could not be reached or
    /// said it no longer knows the session: the supervisor re-initialises with backoff,
    /// and callers within `FAIL_FAST` get this failure instead of a new attempt.
    fn lose_session(&self, session: &Session, reason: &str) {
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
    fn suspect(&self, session: &Session, reason: &str) {
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
    fn retire(&self, session: &Session, how: Retire) -> bool {
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
    fn end_session(&self, session: &Session) {
        let live = &session.live;
        if live.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        live.ended.cancel();
        if !live.delete_when_closed.load(Ordering::SeqCst)
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
    fn session_failure(&self, session: &Session, what: &str, err: UpstreamError) -> UpstreamError {
        self.suspect(session, &format!("{what}: {err}"));
        err
    }

    /// Decide what a failed message POST (notification or answer) says about the
    /// session it was sent in.
    fn message_failed(&self, session: &Session, what: &str, err: &PostError) {
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

    // ----- HTTP plumbing -------------------------------------------------------------

    fn build_request(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Bytes>,
        session: Option<&Session>,
        accept: &'static str,
        last_event_id: Option<&str>,
    ) -> Result<Request<Full<Bytes>>, SendError> {
        let mut req = Request::builder().method(method.clone()).uri(url);
        if let Some(h) = req.headers_mut() {
            for (k, v) in &self.headers {
                h.append(k.clone(), v.clone());
            }
            // Protocol headers go last and replace any static header of the same name.
            h.insert(ACCEPT, HeaderValue::from_static(accept));
            if body.is_some() {
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            if let Some(s) = session {
                if let Some(id) = &s.id
                    && let Ok(v) = HeaderValue::from_str(id)
                {
                    h.insert(SESSION_HEADER, v);
                }
                if let Some(ver) = &s.version
                    && let Ok(v) = HeaderValue::from_str(ver)
                {
                    h.insert(VERSION_HEADER, v);
                }
            }
            if let Some(id) = last_event_id
                && let Ok(v) = HeaderValue::from_str(id)
            {
                h.insert(LAST_EVENT_ID, v);
            }
        }
        req.body(Full::new(body.cloned().unwrap_or_default()))
            .map_err(|e| SendError::Unreachable(format!("cannot build request for {url}: {e}")))
    }

    /// One exchange, following 307/308 redirects (and remembering where they lead).
    async fn send(
        &self,
        method: Method,
        body: Option<Bytes>,
        session: Option<&Session>,
        accept: &'static str,
        last_event_id: Option<&str>,
    ) -> Result<Response<Incoming>, SendError> {
        let mut url = self.url();
        for _ in 0..=MAX_REDIRECTS {
            let req =
                self.build_request(&method, &url, body.as_ref(), session, accept, last_event_id)?;
            let resp = self.client.request(req).await.map_err(|e| {
                let reason = format!("{url}: {}", error_chain(&e));
                if e.is_connect() {
                    SendError::Unreachable(reason)
                } else {
                    SendError::Failed(reason)
                }
            })?;
            let status = resp.status();
            if status != StatusCode::TEMPORARY_REDIRECT && status != StatusCode::PERMANENT_REDIRECT
            {
                return Ok(resp);
            }
            let next = resp
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|loc| resolve_location(&url, loc))
                .ok_or_else(|| {
                    SendError::Failed(format!(
                        "{url}: HTTP {status} without a usable http Location"
                    ))
                })?;
            tracing::debug!(upstream = %self.name, from = %url, to = %next, "following redirect");
            {
                let mut inner = self.inner();
                if inner.url == url {
                    inner.url = next.clone();
                }
            }
            url = next;
        }
        Err(SendError::Failed(format!("{url}: too many redirects")))
    }

    /// An HTTP error status answered to a written request, as a transport error with a
    /// snippet of the body. Never `Unavailable`: even a 502/503/504 comes after the
    /// request was written, and a proxy (or the server) may have started it, so the
    /// client must not be told that a retry is safe.
    async fn status_error(&self, what: &str, resp: Response<Incoming>) -> UpstreamError {
        let status = resp.status();
        let snippet = body_snippet(resp.into_body()).await;
        let reason = format!("{what}: HTTP {status}: {snippet}");
        if status.is_server_error() {
            self.broken(reason)
        } else {
            self.protocol(reason)
        }
    }

    /// POST a notification or response; expects 202 (any 2xx is accepted). Bounded by
    /// `MESSAGE_TIMEOUT`: a live server acknowledges a message at once.
    async fn post_message(&self, session: &Session, msg: &Value) -> Result<(), PostError> {
        let body =
            Bytes::from(serde_json::to_vec(msg).map_err(|e| PostError::Transport(e.to_string()))?);
        let send = self.send(Method::POST, Some(body), Some(session), ACCEPT_POST, None);
        let resp = match tokio::time::timeout(MESSAGE_TIMEOUT, send).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(SendError::Unreachable(reason))) => return Err(PostError::Unreachable(reason)),
            Ok(Err(SendError::Failed(reason))) => return Err(PostError::Transport(reason)),
            Err(_) => {
                return Err(PostError::Transport(format!(
                    "not acknowledged within {MESSAGE_TIMEOUT:?}"
                )));
            }
        };
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(PostError::Status(
                status,
                body_snippet(resp.into_body()).await,
            ))
        }
    }

    /// Answer an upstream server→client request once `answer` resolves. Runs detached
    /// and holds only a weak reference, so a gateway that never answers leaks nothing
    /// but a parked task.
    fn spawn_answer<F>(&self, session: Session, id: Value, answer: F)
    where
        F: Future<Output = InputAnswer> + Send + 'static,
    {
        let me = self.me.clone();
        tokio::spawn(async move {
            let answer = answer.await;
            let Some(me) = me.upgrade() else { return };
            if me.is_shutting_down() {
                return;
            }
            let msg = legacy_messages::answer(&id, &answer);
            if let Err(e) = me.post_message(&session, &msg).await {
                tracing::warn!(upstream = %me.name, id = %id, "answering upstream request failed: {e}");
                me.message_failed(&session, "answering an upstream request", &e);
            }
        });
    }

    /// Cancel `request_id` in `session`, then make sure the session still answers
    /// (module docs, "A cancel is verified"). Both steps together are bounded by
    /// `VERIFY_TIMEOUT`; callers waiting in [`Self::ensure_session`] are released when
    /// this returns (by the caller's `Verifying` guard).
    async fn cancel_and_verify(&self, session: &Session, request_id: u64) {
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
    async fn ping(&self, session: &Session) -> Result<(), String> {
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

    // ----- session lifecycle ---------------------------------------------------------

    /// The current session, running a (shared) handshake when there is none. While a
    /// cancel in the current session is being verified, waits for the verdict (bounded
    /// by the verification's own bound) so a call is not sent into a session the cancel
    /// may have broken.
    async fn ensure_session(&self) -> Result<Session, UpstreamError> {
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
    async fn initialize_shared(&self, trigger: Trigger) -> Result<Session, UpstreamError> {
        let me = self.me.upgrade().ok_or(UpstreamError::ShuttingDown)?;
        match tokio::spawn(async move { me.initialize_locked(trigger).await }).await {
            Ok(r) => r,
            Err(e) => Err(self.unavailable(format!("initialize task failed: {e}"))),
        }
    }

    async fn initialize_locked(&self, trigger: Trigger) -> Result<Session, UpstreamError> {
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
                    inner.info = Some(info);
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

    /// `initialize` + `notifications/initialized` (spec C2). The session's generation
    /// is filled in by the caller.
    async fn handshake(&self) -> Result<(Session, UpstreamInfo), String> {
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

    // ----- calls ---------------------------------------------------------------------

    async fn call_inner(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token_id = spec
            .want_progress
            .then(|| self.next_token.fetch_add(1, Ordering::Relaxed));
        let token = token_id.map(Value::from);
        let mut params = spec.params;
        if let Some(t) = &token {
            let mut meta = Map::new();
            meta.insert("progressToken".into(), t.clone());
            params.insert("_meta".into(), Value::Object(meta));
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
            let session = self.ensure_session().await?;
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
    async fn read_answer(
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

    async fn read_stream(
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

    /// Route one message received on a call's stream. Returns the call's outcome when
    /// this is the final response.
    async fn handle_inbound(&self, msg: Value, ctx: &mut CallCtx<'_>) -> Option<CallOutcome> {
        let inbound = match legacy_messages::classify(msg) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(upstream = %self.name, "ignoring malformed message: {e}");
                return None;
            }
        };
        match inbound {
            Inbound::Response { id, outcome } => {
                if id_matches(&id, ctx.request_id) {
                    return Some(outcome);
                }
                tracing::debug!(upstream = %self.name, id = %id, "ignoring response to another request");
            }
            Inbound::Request { id, method, params } => match (method.as_str(), ctx.events) {
                ("elicitation/create" | "sampling/createMessage" | "roots/list", Some(events)) => {
                    let (respond, rx) = oneshot::channel();
                    let req = InputRequest {
                        method,
                        params,
                        respond,
                    };
                    // If the receiver is gone the request (and `respond`) is dropped,
                    // which the answer task below turns into an error answer.
                    let _ = events.send(CallEvent::Input(req)).await;
                    self.spawn_answer(ctx.session.clone(), id, async move {
                        rx.await.unwrap_or_else(|_| {
                            InputAnswer::Error(RpcError::internal(
                                "the gateway could not obtain an answer for this request",
                            ))
                        })
                    });
                }
                _ => {
                    let answer = super::unowned_request_answer(&method);
                    self.spawn_answer(ctx.session.clone(), id, std::future::ready(answer));
                }
            },
            Inbound::Notification { method, params } => match method.as_str() {
                "notifications/progress" => {
                    if let Some((t, rest)) = legacy_messages::split_progress(params) {
                        match (ctx.events, &ctx.token) {
                            (Some(events), Some(token)) if &t == token => {
                                let _ = events.send(CallEvent::Progress(rest)).await;
                            }
                            // Another call's token on this stream: route it by token.
                            _ => self.route_progress(ctx.session.generation, &t, rest),
                        }
                    }
                }
                "notifications/message" => {
                    if let Some(events) = ctx.events {
                        let p = match params {
                            Some(Value::Object(m)) => m,
                            _ => Map::new(),
                        };
                        let _ = events.send(CallEvent::Log(p)).await;
                    }
                }
                "notifications/cancelled" => {}
                _ => self.broadcast(method, params),
            },
        }
        None
    }

    fn progress_routes(&self) -> MutexGuard<'_, HashMap<u64, ProgressTarget>> {
        // Critical sections are single map operations: poisoning cannot leave the map
        // inconsistent, so it is ignored.
        self.progress_routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Deliver progress that arrived on a stream other than its call's own POST stream
    /// (the standalone GET stream, or another call's stream) to the call its token
    /// names, if that call is in flight in the session (`generation`) that carried it.
    /// Never waits: the caller may be the GET stream reader, which serves every call
    /// of the session; when the call's event queue is full this report is dropped,
    /// which loses nothing a later report will not replace.
    fn route_progress(&self, generation: u64, token: &Value, params: Map<String, Value>) {
        let target = token.as_u64().and_then(|t| {
            self.progress_routes()
                .get(&t)
                .filter(|r| r.generation == generation)
                .and_then(|r| r.events.upgrade())
        });
        let Some(events) = target else {
            tracing::debug!(upstream = %self.name, token = %token, "progress for no call in flight dropped");
            return;
        };
        if events.try_send(CallEvent::Progress(params)).is_err() {
            tracing::debug!(upstream = %self.name, token = %token, "progress dropped: the call's event queue is full or closed");
        }
    }

    fn broadcast(&self, method: String, params: Option<Value>) {
        // No receivers is normal (nobody listening): not an error.
        let _ = self
            .notifications
            .send(SessionNotification { method, params });
    }
}

/// Per-call routing context.
struct CallCtx<'a> {
    /// The request's method, for what the logs say about a failure.
    what: &'a str,
    request_id: u64,
    token: Option<Value>,
    events: Option<&'a mpsc::Sender<CallEvent>>,
    session: Session,
    last_event_id: Option<String>,
    retry_ms: Option<u64>,
}

impl<'a> CallCtx<'a> {
    fn new(
        what: &'a str,
        request_id: u64,
        token: Option<Value>,
        events: Option<&'a mpsc::Sender<CallEvent>>,
        session: Session,
    ) -> Self {
        Self {
            what,
            request_id,
            token,
            events,
            session,
            last_event_id: None,
            retry_ms: None,
        }
    }
}

/// Where progress for one token goes. The sender is weak so the route never keeps a
/// finished call's event channel open (receivers see the channel close when the call
/// ends, as with any other transport).
struct ProgressTarget {
    generation: u64,
    events: mpsc::WeakSender<CallEvent>,
}

/// A call's entry in [`HttpUpstream::progress_routes`]; removed on drop, so the token
/// stops routing as soon as the call is answered, fails or is cancelled.
struct ProgressRoute<'a> {
    upstream: &'a HttpUpstream,
    token: u64,
}

impl ProgressRoute<'_> {
    fn register(&self, generation: u64, events: &mpsc::Sender<CallEvent>) {
        self.upstream.progress_routes().insert(
            self.token,
            ProgressTarget {
                generation,
                events: events.downgrade(),
            },
        );
    }
}

impl Drop for ProgressRoute<'_> {
    fn drop(&mut self) {
        self.upstream.progress_routes().remove(&self.token);
    }
}

/// Sends `notifications/cancelled` when a call is dropped while its request may be at
/// the upstream (`sent` is `Some`), then verifies the session (module docs). Holds the
/// call's lease on that session, so a retired session is not ended under the call.
struct CancelGuard {
    upstream: Weak<HttpUpstream>,
    request_id: u64,
    sent: Option<(Session, Lease)>,
    stop: CancellationToken,
}

impl CancelGuard {
    /// The request is about to be sent in `session`.
    fn arm(&mut self, upstream: &HttpUpstream, session: &Session) {
        self.sent = Some((session.clone(), session.lease(upstream)));
    }

    /// Nothing of the request is left upstream (answered or refused).
    fn disarm(&mut self) {
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

impl LegacyTransport for HttpUpstream {
    fn ensure_ready(&self) -> BoxFuture<'_, Result<UpstreamInfo, UpstreamError>> {
        Box::pin(async move {
            self.ensure_session().await?;
            self.info()
                .ok_or_else(|| self.unavailable("upstream is not initialized"))
        })
    }

    fn info(&self) -> Option<UpstreamInfo> {
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
        Box::pin(async move {
            if self.is_shutting_down() {
                return Err(UpstreamError::ShuttingDown);
            }
            let stop = self.stop.clone();
            tokio::select! {
                _ = stop.cancelled() => Err(UpstreamError::ShuttingDown),
                r = self.call_inner(spec, events) => {
                    // A stream broken by our own DELETE is a shutdown, not a failure.
                    if r.is_err() && self.is_shutting_down() {
                        Err(UpstreamError::ShuttingDown)
                    } else {
                        r
                    }
                }
            }
        })
    }

    fn notifications(&self) -> broadcast::Receiver<SessionNotification> {
        self.notifications.subscribe()
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
            if let Some(s) = session.filter(|s| s.id.is_some()) {
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

impl UpstreamError {
    fn into_broken(self) -> Self {
        match self {
            Self::Protocol { upstream, reason } => Self::Broken { upstream, reason },
            other => other,
        }
    }
}

/// Background supervisor: (re-)initialises whenever there is no session, with backoff.
async fn supervise(me: Weak<HttpUpstream>, lost: Arc<Notify>, stop: CancellationToken) {
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

/// The standalone GET stream of one session: unsolicited notifications, requests no
/// call owns, and progress that some servers send here for a call (routed by token).
/// Reconnects with backoff while that session is current; stops on 405.
async fn listen(me: Weak<HttpUpstream>, session: Session, stop: CancellationToken) {
    let mut backoff = INITIAL_BACKOFF;
    let mut last_id: Option<String> = None;
    // Ended with the session (retired and unused): a dead session's GET stream may
    // stay open without a byte forever (python-sdk 1.9), so waiting for it to close
    // would leak the connection.
    let ended = session.live.ended.clone();
    loop {
        let (resp, max) = {
            let Some(up) = me.upgrade() else { return };
            let current = up
                .current_session()
                .is_some_and(|s| s.generation == session.generation);
            if !current || up.is_shutting_down() {
                return;
            }
            let resp = tokio::select! {
                _ = stop.cancelled() => return,
                _ = ended.cancelled() => return,
                r = up.send(Method::GET, None, Some(&session), ACCEPT_SSE, last_id.as_deref()) => r,
            };
            match resp {
                Ok(r) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                    tracing::debug!(upstream = %up.name, "upstream offers no GET stream");
                    return;
                }
                Ok(r) if r.status() == StatusCode::NOT_FOUND && session.id.is_some() => {
                    up.lose_session(&session, "session expired (404 on GET stream)");
                    return;
                }
                Ok(r) if r.status().is_success() && is_event_stream(&r) => {
                    (Some(r), up.max_message_bytes)
                }
                Ok(r) if r.status().is_success() => {
                    tracing::debug!(upstream = %up.name, "GET answered without an event stream; not listening");
                    return;
                }
                Ok(r) => {
                    let status = r.status();
                    tracing::debug!(upstream = %up.name, %status, "GET stream refused");
                    (None, 0)
                }
                Err(e) => {
                    tracing::debug!(upstream = %up.name, "GET stream failed: {}", e.reason());
                    (None, 0)
                }
            }
        };
        if let Some(resp) = resp {
            backoff = INITIAL_BACKOFF;
            let mut body = resp.into_body();
            let mut parser = SseParser::new(max);
            loop {
                let frame = tokio::select! {
                    _ = stop.cancelled() => return,
                _ = ended.cancelled() => return,
                    f = body.frame() => f,
                };
                let Some(Ok(frame)) = frame else { break };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let Ok(events) = parser.feed(&data) else {
                    if let Some(up) = me.upgrade() {
                        tracing::warn!(upstream = %up.name, "oversized event on GET stream; reconnecting");
                    }
                    break;
                };
                for ev in events {
                    if let Some(id) = ev.id.filter(|id| !id.is_empty()) {
                        last_id = Some(id);
                    }
                    if ev.data.is_empty() {
                        continue;
                    }
                    let Some(up) = me.upgrade() else { return };
                    let Ok(value) = serde_json::from_str::<Value>(&ev.data) else {
                        tracing::warn!(upstream = %up.name, "invalid JSON on GET stream");
                        continue;
                    };
                    for msg in split_batch(value) {
                        match legacy_messages::classify(msg) {
                            Ok(Inbound::Request { id, method, .. }) => {
                                let answer = super::unowned_request_answer(&method);
                                up.spawn_answer(session.clone(), id, std::future::ready(answer));
                            }
                            Ok(Inbound::Notification { method, params }) => match method.as_str() {
                                // Progress names its call by our token (module docs).
                                "notifications/progress" => {
                                    if let Some((t, rest)) = legacy_messages::split_progress(params)
                                    {
                                        up.route_progress(session.generation, &t, rest);
                                    }
                                }
                                "notifications/message" | "notifications/cancelled" => {
                                    tracing::debug!(upstream = %up.name, %method, "unattributed notification dropped");
                                }
                                _ => up.broadcast(method, params),
                            },
                            Ok(Inbound::Response { .. }) | Err(_) => {}
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
                _ = ended.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

// ----- small helpers -------------------------------------------------------------------

fn id_matches(id: &Value, ours: u64) -> bool {
    id.as_u64() == Some(ours) || id.as_str().is_some_and(|s| s == ours.to_string())
}

/// 2025-03-26 allowed batches; later revisions send single messages.
fn split_batch(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items,
        other => vec![other],
    }
}

fn is_event_stream<B>(resp: &Response<B>) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// Resolve a `Location` header against the URL it answered. Only `http` targets.
fn resolve_location(base: &str, loc: &str) -> Option<String> {
    let loc = loc.trim();
    if loc.starts_with("http://") {
        return Some(loc.to_string());
    }
    if loc.contains("://") {
        return None; // https or anything else: out of scope (no TLS)
    }
    let uri: http::Uri = base.parse().ok()?;
    let authority = uri.authority()?.as_str();
    if let Some(rest) = loc.strip_prefix("//") {
        return Some(format!("http://{rest}"));
    }
    if loc.starts_with('/') {
        return Some(format!("http://{authority}{loc}"));
    }
    let path = uri.path();
    let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
    Some(format!("http://{authority}{dir}{loc}"))
}

enum ReadError {
    TooLarge,
    Io(String),
}

async fn read_capped(mut body: Incoming, max: usize) -> Result<Bytes, ReadError> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Io(error_chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Up to [`SNIPPET_BYTES`] of an error body, for error messages.
async fn body_snippet(mut body: Incoming) -> String {
    let mut buf = Vec::new();
    let read = async {
        while buf.len() < SNIPPET_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
    snippet(&buf)
}

fn snippet(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(SNIPPET_BYTES)];
    let s = String::from_utf8_lossy(cut).trim().to_string();
    if s.is_empty() {
        "(empty body)".into()
    } else {
        s
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    //! Against a small real legacy Streamable HTTP server (hyper, 127.0.0.1:0).

    use super::*;
    use crate::upstream::{Delivery, LegacyTransport};
    use futures_util::StreamExt;
    use http_body_util::StreamBody;
    use http_body_util::combinators::UnsyncBoxBody;
    use hyper::body::Frame;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use serde_json::json;
    use std::collections::{HashMap, HashSet};
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use tokio::net::TcpListener;

    /// Response bodies may fail, which makes hyper cut a chunked body short.
    type Body = UnsyncBoxBody<Bytes, std::io::Error>;

    #[derive(Debug, Clone)]
    struct Recorded {
        method: String,
        path: String,
        headers: HashMap<String, String>,
        body: Option<Value>,
    }

    impl Recorded {
        fn rpc_method(&self) -> Option<&str> {
            self.body.as_ref()?.get("method")?.as_str()
        }
        fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).map(String::as_str)
        }
    }

    #[derive(Default)]
    struct MockState {
        log: Mutex<Vec<Recorded>>,
        issued: AtomicU64,
        valid: Mutex<HashSet<String>>,
        /// Server→client request id → waiter for the client's response.
        pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
        /// Responses held back for `GET` + `Last-Event-ID` (polling).
        parked: Mutex<HashMap<String, Value>>,
        /// Serve at `/mcp/` and redirect `/mcp` there with 307.
        redirect: bool,
        /// Offer a standalone GET stream (otherwise 405).
        get_stream: bool,
        /// Answer an unknown session id with 400 (python-sdk ≤ 1.9) instead of 404.
        unknown_session_400: bool,
        /// The open standalone GET stream, for tools that talk on it.
        get_tx: Mutex<Option<mpsc::Sender<Bytes>>>,
        /// Lets the `get_progress` tool answer.
        release: Notify,
        /// Answer every `tools/call` with 404, as if its session had just expired.
        forget_sessions: AtomicBool,
        /// What `notifications/cancelled` does to its session (python-sdk 1.9: breaks it).
        on_cancel: OnCancel,
        /// Sessions broken that way: POSTs get SSE headers and a truncated body, GETs get
        /// headers and then nothing.
        broken: Mutex<HashSet<String>>,
        /// Sessions that stopped answering: every request gets headers, then nothing.
        stalled: Mutex<HashSet<String>>,
        /// Standalone GET streams the client has closed.
        get_closed: AtomicU64,
    }

    #[derive(Default, Clone, Copy, PartialEq, Eq)]
    enum OnCancel {
        #[default]
        Nothing,
        Break,
        Stall,
    }

    impl MockState {
        fn records(&self) -> Vec<Recorded> {
            self.log.lock().unwrap().clone()
        }
        fn count(&self, rpc_method: &str) -> usize {
            self.records()
                .iter()
                .filter(|r| r.rpc_method() == Some(rpc_method))
                .count()
        }
    }

    fn sse_headers(b: http::response::Builder) -> http::response::Builder {
        b.header(CONTENT_TYPE, "text/event-stream")
            .header("cache-control", "no-cache")
    }

    fn full(b: impl Into<Bytes>) -> Body {
        Full::new(b.into())
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    fn json_body(v: &Value) -> Body {
        full(v.to_string())
    }

    fn empty() -> Body {
        full(Bytes::new())
    }

    /// SSE headers, then `first` (if any), then the body fails: hyper closes the
    /// connection without the terminating chunk.
    fn truncated(first: Option<Bytes>) -> Response<Body> {
        let items: Vec<Result<Frame<Bytes>, std::io::Error>> = first
            .into_iter()
            .map(|b| Ok(Frame::data(b)))
            .chain([Err(std::io::Error::other("cut short"))])
            .collect();
        // Paced, so hyper flushes headers and data before the failure (as a server
        // whose session died mid-answer does), rather than never answering at all.
        let paced = futures_util::stream::iter(items).then(|item| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            item
        });
        let body = StreamBody::new(paced.boxed());
        sse_headers(Response::builder())
            .body(body.boxed_unsync())
            .unwrap()
    }

    /// SSE headers, then nothing, never.
    fn stalled() -> Response<Body> {
        let (tx, body) = channel_body();
        tokio::spawn(async move { tx.closed().await });
        sse_headers(Response::builder()).body(body).unwrap()
    }

    /// A streaming body fed through a channel; dropping the sender ends the stream.
    fn channel_body() -> (mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, std::io::Error>(Frame::data(b)), rx))
        });
        (tx, StreamBody::new(stream.boxed()).boxed_unsync())
    }

    fn event(id: Option<&str>, msg: &Value) -> Bytes {
        let mut s = String::new();
        if let Some(id) = id {
            s.push_str(&format!("id: {id}\n"));
        }
        s.push_str(&format!("data: {msg}\n\n"));
        Bytes::from(s)
    }

    fn result(id: &Value, result: Value) -> Value {
        json!({"jsonrpc":"2.0","id":id,"result":result})
    }

    /// Aborts the connection a request came on (with RST: linger 0).
    type Abort = Arc<Mutex<Option<oneshot::Sender<()>>>>;

    async fn handle(
        st: Arc<MockState>,
        abort: Abort,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let path = req.uri().path().to_string();
        if st.redirect && path == "/mcp" {
            st.log.lock().unwrap().push(Recorded {
                method: req.method().to_string(),
                path: path.clone(),
                headers: HashMap::new(),
                body: None,
            });
            return Ok(Response::builder()
                .status(307)
                .header(LOCATION, "/mcp/")
                .body(empty())
                .unwrap());
        }
        let method = req.method().clone();
        let headers: HashMap<String, String> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let rec = Recorded {
            method: method.to_string(),
            path,
            headers: headers.clone(),
            body: body.clone(),
        };
        st.log.lock().unwrap().push(rec);
        let session_ok = headers
            .get(SESSION_HEADER)
            .is_some_and(|s| st.valid.lock().unwrap().contains(s));
        let reply = |status: u16| Ok(Response::builder().status(status).body(empty()).unwrap());

        if method == Method::DELETE {
            return reply(200);
        }
        let sid = headers.get(SESSION_HEADER).cloned().unwrap_or_default();
        let dead =
            st.broken.lock().unwrap().contains(&sid) || st.stalled.lock().unwrap().contains(&sid);
        if method == Method::GET {
            if !session_ok {
                return reply(404);
            }
            if dead {
                return Ok(stalled());
            }
            if let Some(last) = headers.get(LAST_EVENT_ID) {
                if last == "busy-1" {
                    return reply(503);
                }
                let Some(resp) = st.parked.lock().unwrap().remove(last) else {
                    return reply(404);
                };
                let (tx, body) = channel_body();
                tokio::spawn(async move {
                    let _ = tx.send(event(Some("after-resume"), &resp)).await;
                });
                return Ok(sse_headers(Response::builder()).body(body).unwrap());
            }
            if !st.get_stream {
                return reply(405);
            }
            let (tx, body) = channel_body();
            *st.get_tx.lock().unwrap() = Some(tx.clone());
            let st = st.clone();
            tokio::spawn(async move {
                let _ = tx
                    .send(event(
                        None,
                        &json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
                    ))
                    .await;
                let _ = tx
                    .send(event(
                        None,
                        &json!({"jsonrpc":"2.0","id":"gp-1","method":"ping"}),
                    ))
                    .await;
                tx.closed().await;
                st.get_closed.fetch_add(1, Ordering::SeqCst);
            });
            return Ok(sse_headers(Response::builder()).body(body).unwrap());
        }

        let Some(body) = body else { return reply(400) };
        let rpc_method = body
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = body.get("id").cloned();
        if rpc_method.as_deref() == Some("initialize") {
            let n = st.issued.fetch_add(1, Ordering::SeqCst) + 1;
            let sid = format!("s-{n}");
            st.valid.lock().unwrap().insert(sid.clone());
            let res = result(
                &id.unwrap_or(Value::Null),
                json!({"protocolVersion":"2025-11-25","capabilities":{"tools":{}},
                       "serverInfo":{"name":"mock","version":"1"}}),
            );
            return Ok(Response::builder()
                .header(CONTENT_TYPE, "application/json")
                .header("MCP-Session-Id", sid)
                .body(json_body(&res))
                .unwrap());
        }
        if !session_ok {
            if st.unknown_session_400 {
                return Ok(Response::builder()
                    .status(400)
                    .body(full("Bad Request: No valid session ID provided"))
                    .unwrap());
            }
            return reply(404);
        }
        if st.forget_sessions.load(Ordering::SeqCst) && rpc_method.as_deref() == Some("tools/call")
        {
            return reply(404);
        }
        if st.stalled.lock().unwrap().contains(&sid) {
            return Ok(stalled());
        }
        if st.broken.lock().unwrap().contains(&sid) {
            return Ok(truncated(None));
        }
        match rpc_method.as_deref() {
            Some("notifications/cancelled") => {
                match st.on_cancel {
                    OnCancel::Nothing => {}
                    OnCancel::Break => {
                        st.broken.lock().unwrap().insert(sid);
                    }
                    OnCancel::Stall => {
                        st.stalled.lock().unwrap().insert(sid);
                    }
                }
                return reply(202);
            }
            Some("ping") => {
                let res = result(&id.unwrap_or(Value::Null), json!({}));
                return Ok(Response::builder()
                    .header(CONTENT_TYPE, "application/json")
                    .body(json_body(&res))
                    .unwrap());
            }
            _ => {}
        }
        if rpc_method.is_none() {
            // A response to one of our server→client requests.
            if let Some(id) = id.as_ref().and_then(Value::as_str)
                && let Some(tx) = st.pending.lock().unwrap().remove(id)
            {
                let _ = tx.send(body.clone());
            }
            return reply(202);
        }
        let Some(id) = id else { return reply(202) };
        let tool = body["params"]["name"].as_str().unwrap_or("").to_string();
        match tool.as_str() {
            "json" => {
                let res = result(
                    &id,
                    json!({"content":[{"type":"text","text":"hi"}],"args":body["params"]["arguments"]}),
                );
                Ok(Response::builder()
                    .header(CONTENT_TYPE, "application/json")
                    .body(json_body(&res))
                    .unwrap())
            }
            "sse" => {
                let token = body["params"]["_meta"]["progressToken"].clone();
                let (tx, out) = channel_body();
                let (answer_tx, answer_rx) = oneshot::channel();
                st.pending
                    .lock()
                    .unwrap()
                    .insert("elic-1".into(), answer_tx);
                tokio::spawn(async move {
                    let progress = json!({"jsonrpc":"2.0","method":"notifications/progress",
                        "params":{"progressToken":token,"progress":1,"total":2,"message":"half"}});
                    let other = json!({"jsonrpc":"2.0","method":"notifications/progress",
                        "params":{"progressToken":"someone-else","progress":9}});
                    let log = json!({"jsonrpc":"2.0","method":"notifications/message",
                        "params":{"level":"info","data":"working"}});
                    let elicit = json!({"jsonrpc":"2.0","id":"elic-1","method":"elicitation/create",
                        "params":{"message":"sure?","requestedSchema":{"type":"object"}}});
                    for m in [progress, other, log, elicit] {
                        let _ = tx.send(event(None, &m)).await;
                    }
                    let Ok(answer) = answer_rx.await else { return };
                    let _ = tx
                        .send(event(
                            None,
                            &result(&id, json!({"content":[],"elicited":answer["result"]})),
                        ))
                        .await;
                });
                Ok(sse_headers(Response::builder()).body(out).unwrap())
            }
            "poll" => {
                st.parked.lock().unwrap().insert(
                    "prime-1".into(),
                    result(&id, json!({"content":[{"type":"text","text":"polled"}]})),
                );
                // Priming event, then a retry hint, then the connection closes.
                let chunk = Bytes::from("id: prime-1\ndata:\n\nretry: 50\n\n");
                Ok(sse_headers(Response::builder()).body(full(chunk)).unwrap())
            }
            "broken" => {
                // A notification, then the stream ends: no id, no response.
                let note = json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"bye"}});
                Ok(sse_headers(Response::builder())
                    .body(full(event(None, &note)))
                    .unwrap())
            }
            "get_progress" => {
                // python-sdk 1.9: the call's progress goes out on the GET stream (after
                // a report for a token nobody holds); the answer waits for `release`.
                let token = body["params"]["_meta"]["progressToken"].clone();
                let get = st.get_tx.lock().unwrap().clone().unwrap();
                for t in [json!("someone-else"), json!(987_654), token] {
                    let p = json!({"jsonrpc":"2.0","method":"notifications/progress",
                        "params":{"progressToken":t,"progress":1,"message":"on GET"}});
                    let _ = get.send(event(None, &p)).await;
                }
                let (tx, out) = channel_body();
                tokio::spawn(async move {
                    st.release.notified().await;
                    let res = result(&id, json!({"content":[{"type":"text","text":"released"}]}));
                    let _ = tx.send(event(None, &res)).await;
                });
                Ok(sse_headers(Response::builder()).body(out).unwrap())
            }
            // A proxy (or the server) that is overloaded, after reading the request.
            "busy" => Ok(Response::builder()
                .status(503)
                .body(full("overloaded"))
                .unwrap()),
            // The stream closes after priming; the resumption GET is answered 503.
            "busy_resume" => {
                let chunk = Bytes::from("id: busy-1\ndata:\n\nretry: 50\n\n");
                Ok(sse_headers(Response::builder()).body(full(chunk)).unwrap())
            }
            // An SSE comment, then the chunked body is cut short.
            "truncated" => Ok(truncated(Some(Bytes::from(": working\n\n")))),
            // The connection is reset before any answer.
            "reset" => {
                if let Some(tx) = abort.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                std::future::pending::<()>().await;
                reply(500)
            }
            // Something in front of the server answered, but not in JSON-RPC.
            "garbage" => Ok(Response::builder()
                .header(CONTENT_TYPE, "application/json")
                .body(full("<html>bad gateway</html>"))
                .unwrap()),
            // Answers once `release` is notified.
            "held" => {
                let (tx, out) = channel_body();
                tokio::spawn(async move {
                    st.release.notified().await;
                    let res = result(&id, json!({"content":[{"type":"text","text":"held"}]}));
                    let _ = tx.send(event(None, &res)).await;
                });
                Ok(sse_headers(Response::builder()).body(out).unwrap())
            }
            "hang" => {
                let (tx, out) = channel_body();
                tokio::spawn(async move {
                    let _ = tx.send(Bytes::from("id: h-1\ndata:\n\n")).await;
                    tx.closed().await;
                });
                Ok(sse_headers(Response::builder()).body(out).unwrap())
            }
            _ => Ok(Response::builder()
                .status(500)
                .body(json_body(&json!({"error":"unknown tool"})))
                .unwrap()),
        }
    }

    async fn serve(listener: TcpListener, st: Arc<MockState>) {
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    // A second handle on the socket, to turn an abort into a reset.
                    let Ok(std_stream) = stream.into_std() else {
                        return;
                    };
                    let Ok(dup) = std_stream.try_clone() else {
                        return;
                    };
                    let Ok(stream) = tokio::net::TcpStream::from_std(std_stream) else {
                        return;
                    };
                    let (abort_tx, mut abort_rx) = oneshot::channel();
                    let abort: Abort = Arc::new(Mutex::new(Some(abort_tx)));
                    let svc = service_fn(move |req| handle(st.clone(), abort.clone(), req));
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = &mut conn => {}
                        Ok(()) = &mut abort_rx => {
                            // Linger 0: closing sends RST instead of FIN. The connection
                            // (the last handle) closes when this task ends.
                            if let Ok(d) = tokio::net::TcpStream::from_std(dup) {
                                let _ = d.set_zero_linger();
                            }
                        }
                    }
                });
            }
        });
    }

    async fn mock(st: MockState) -> (SocketAddr, Arc<MockState>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let st = Arc::new(st);
        serve(listener, st.clone()).await;
        (addr, st)
    }

    fn opts(url: String) -> HttpOptions {
        HttpOptions {
            name: "mock".into(),
            url,
            headers: vec![("X-Api-Key".into(), "k".into())],
            max_message_bytes: 64 * 1024,
            identity: None,
        }
    }

    fn spec(tool: &str, want_progress: bool) -> CallSpec {
        let mut params = Map::new();
        params.insert("name".into(), json!(tool));
        params.insert("arguments".into(), json!({"x": 1}));
        CallSpec {
            method: "tools/call".into(),
            params,
            want_progress,
            tenant: None,
        }
    }

    /// Poll `cond` every 20 ms for up to 10 s.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting for {what}");
    }

    fn ok_result(r: Result<CallOutcome, UpstreamError>) -> Value {
        match r {
            Ok(CallOutcome::Result(v)) => v,
            other => panic!("expected a result, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn initialize_with_session_and_json_answer() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let info = up.ensure_ready().await.unwrap();
        assert_eq!(info.protocol_version, "2025-11-25");
        assert_eq!(up.state(), TransportState::Ready);
        assert_eq!(up.info().unwrap().server_info["name"], "mock");

        let (tx, _rx) = mpsc::channel(8);
        let v = ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(v["content"][0]["text"], "hi");
        assert_eq!(v["args"], json!({"x": 1}));

        let recs = st.records();
        assert_eq!(st.count("initialize"), 1);
        let init = recs
            .iter()
            .find(|r| r.rpc_method() == Some("initialize"))
            .unwrap();
        assert_eq!(init.header("accept"), Some(ACCEPT_POST));
        assert_eq!(init.header("content-type"), Some("application/json"));
        assert_eq!(init.header(SESSION_HEADER), None);
        assert_eq!(init.header("x-api-key"), Some("k"));
        let initialized = recs
            .iter()
            .find(|r| r.rpc_method() == Some("notifications/initialized"))
            .unwrap();
        assert_eq!(initialized.header(SESSION_HEADER), Some("s-1"));
        let call = recs
            .iter()
            .find(|r| r.rpc_method() == Some("tools/call"))
            .unwrap();
        assert_eq!(call.header(SESSION_HEADER), Some("s-1"));
        assert_eq!(call.header(VERSION_HEADER), Some("2025-11-25"));
        assert_eq!(call.header("x-api-key"), Some("k"));
        let body = call.body.as_ref().unwrap();
        assert!(body["id"].is_u64(), "gateway-minted numeric id");
        assert!(
            body["params"].get("_meta").is_none(),
            "no progress token unless asked"
        );
        up.shutdown().await;
        eventually("DELETE", || {
            st.records().iter().any(|r| r.method == "DELETE")
        })
        .await;
        let del = st
            .records()
            .into_iter()
            .find(|r| r.method == "DELETE")
            .unwrap();
        assert_eq!(del.header(SESSION_HEADER), Some("s-1"));
        let (tx, _rx) = mpsc::channel(8);
        assert!(matches!(
            up.call(spec("json", false), tx).await,
            Err(UpstreamError::ShuttingDown)
        ));
    }

    #[tokio::test]
    async fn sse_answer_with_progress_log_and_elicitation() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, mut rx) = mpsc::channel(8);
        let gateway = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(ev) = rx.recv().await {
                match ev {
                    CallEvent::Progress(p) => seen.push(json!({"progress": p})),
                    CallEvent::Log(l) => seen.push(json!({"log": l})),
                    CallEvent::Queue(_) => {}
                    CallEvent::Input(req) => {
                        seen.push(json!({"input": req.method, "params": req.params}));
                        let _ = req.respond.send(InputAnswer::Result(
                            json!({"action":"accept","content":{"ok":true}}),
                        ));
                    }
                }
            }
            seen
        });
        let v = ok_result(up.call(spec("sse", true), tx).await);
        assert_eq!(
            v["elicited"],
            json!({"action":"accept","content":{"ok":true}})
        );
        let seen = gateway.await.unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(
            seen[0],
            json!({"progress":{"progress":1,"total":2,"message":"half"}})
        );
        assert_eq!(seen[1]["log"]["data"], "working");
        assert_eq!(seen[2]["input"], "elicitation/create");
        assert_eq!(seen[2]["params"]["message"], "sure?");

        let recs = st.records();
        let call = recs
            .iter()
            .find(|r| r.rpc_method() == Some("tools/call"))
            .unwrap();
        let token = &call.body.as_ref().unwrap()["params"]["_meta"]["progressToken"];
        assert!(!token.is_null(), "gateway-minted progress token");
        let answer = recs
            .iter()
            .find(|r| r.body.as_ref().is_some_and(|b| b["id"] == "elic-1"))
            .unwrap();
        assert_eq!(answer.header(SESSION_HEADER), Some("s-1"));
        assert_eq!(answer.header(VERSION_HEADER), Some("2025-11-25"));
    }

    #[tokio::test]
    async fn dropped_event_receiver_answers_input_with_error() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, rx) = mpsc::channel(8);
        drop(rx);
        let v = ok_result(up.call(spec("sse", false), tx).await);
        assert!(v["elicited"].is_null());
        let recs = st.records();
        let answer = recs
            .iter()
            .find(|r| r.body.as_ref().is_some_and(|b| b["id"] == "elic-1"))
            .unwrap();
        assert!(answer.body.as_ref().unwrap().get("error").is_some());
    }

    #[tokio::test]
    async fn priming_close_after_retry_and_get_resumption() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        let v = ok_result(up.call(spec("poll", false), tx).await);
        assert_eq!(v["content"][0]["text"], "polled");
        let recs = st.records();
        let resume = recs
            .iter()
            .find(|r| r.method == "GET" && r.header(LAST_EVENT_ID).is_some())
            .unwrap();
        assert_eq!(resume.header(LAST_EVENT_ID), Some("prime-1"));
        assert_eq!(resume.header(SESSION_HEADER), Some("s-1"));
        assert_eq!(resume.header("accept"), Some(ACCEPT_SSE));
    }

    #[tokio::test]
    async fn expired_session_reinitializes_and_retries_once() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        st.valid.lock().unwrap().clear();
        // Concurrent callers share one re-initialisation.
        let (tx, _rx) = mpsc::channel(8);
        let (a, b) = tokio::join!(
            up.call(spec("json", false), tx.clone()),
            up.call(spec("json", false), tx)
        );
        ok_result(a);
        ok_result(b);
        assert_eq!(st.count("initialize"), 2);
        let calls: Vec<_> = st
            .records()
            .into_iter()
            .filter(|r| r.rpc_method() == Some("tools/call"))
            .collect();
        assert_eq!(calls.len(), 4, "each call sent once per session");
        assert!(
            calls[2..]
                .iter()
                .all(|c| c.header(SESSION_HEADER) == Some("s-2"))
        );
        let reinit = st
            .records()
            .into_iter()
            .filter(|r| r.rpc_method() == Some("initialize"))
            .nth(1)
            .unwrap();
        assert_eq!(reinit.header(SESSION_HEADER), None);
    }

    #[tokio::test]
    async fn unknown_session_400_is_treated_as_expiry() {
        let (addr, st) = mock(MockState {
            unknown_session_400: true,
            ..MockState::default()
        })
        .await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        st.valid.lock().unwrap().clear();
        let (tx, _rx) = mpsc::channel(8);
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(st.count("initialize"), 2);
    }

    #[tokio::test]
    async fn stream_ending_without_response_or_id_is_broken() {
        let (addr, _st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, mut rx) = mpsc::channel(8);
        let err = up.call(spec("broken", false), tx).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Broken { .. }), "{err:?}");
        assert!(matches!(rx.recv().await, Some(CallEvent::Log(_))));
    }

    #[tokio::test]
    async fn gateway_error_status_after_the_request_was_written_is_sent_then_failed() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        for tool in ["busy", "busy_resume"] {
            let err = up.call(spec(tool, false), tx.clone()).await.unwrap_err();
            assert!(
                matches!(err, UpstreamError::Broken { .. }),
                "{tool}: {err:?}"
            );
            assert_eq!(err.delivery(), Delivery::SentThenFailed, "{tool}");
            assert!(err.to_string().contains("503"), "{tool}: {err}");
        }
        assert_eq!(st.count("tools/call"), 2);
        // The session was kept: the next call goes through without a new handshake.
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(st.count("initialize"), 1);
    }

    #[tokio::test]
    async fn connection_refused_before_writing_is_never_sent() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        // Point the session at a port nobody listens on: the connect fails before any
        // byte of the request is written.
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = probe.local_addr().unwrap();
        drop(probe);
        up.inner().url = format!("http://{dead}/mcp");
        let (tx, _rx) = mpsc::channel(8);
        let err = up.call(spec("json", false), tx).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Unavailable { .. }), "{err:?}");
        assert_eq!(err.delivery(), Delivery::NeverSent);
        assert_eq!(st.count("tools/call"), 0);
    }

    #[tokio::test]
    async fn session_refused_twice_is_never_sent() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        // Every session is unknown to the server by the time the call arrives.
        st.forget_sessions.store(true, Ordering::SeqCst);
        let (tx, _rx) = mpsc::channel(8);
        let err = up.call(spec("json", false), tx).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Unavailable { .. }), "{err:?}");
        assert_eq!(err.delivery(), Delivery::NeverSent);
    }

    #[tokio::test]
    async fn shutdown_fails_in_flight_calls() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        let caller = up.clone();
        let call = tokio::spawn(async move { caller.call(spec("hang", false), tx).await });
        eventually("tools/call", || st.count("tools/call") == 1).await;
        up.shutdown().await;
        let r = call.await.unwrap();
        assert!(matches!(r, Err(UpstreamError::ShuttingDown)), "{r:?}");
        assert!(matches!(up.state(), TransportState::Down(_)));
        assert_eq!(
            st.count("notifications/cancelled"),
            0,
            "no cancel after DELETE"
        );
        assert!(st.records().iter().any(|r| r.method == "DELETE"));
    }

    #[tokio::test]
    async fn follows_307_to_slash_url_and_remembers_it() {
        let (addr, st) = mock(MockState {
            redirect: true,
            ..MockState::default()
        })
        .await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        ok_result(up.call(spec("json", false), tx.clone()).await);
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(up.url(), format!("http://{addr}/mcp/"));
        let recs = st.records();
        assert_eq!(recs.iter().filter(|r| r.path == "/mcp").count(), 1);
        assert_eq!(st.count("tools/call"), 2);
    }

    #[tokio::test]
    async fn unavailable_at_start_then_recovers() {
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let err = up.ensure_ready().await.unwrap_err();
        assert!(matches!(err, UpstreamError::Unavailable { .. }), "{err:?}");
        let (tx, _rx) = mpsc::channel(8);
        let err = up.call(spec("json", false), tx.clone()).await.unwrap_err();
        assert_eq!(err.delivery(), Delivery::NeverSent, "{err:?}");
        assert!(matches!(up.state(), TransportState::Down(_)));

        // The upstream comes up on the same port; the supervisor reconnects.
        let listener = TcpListener::bind(addr).await.unwrap();
        let st = Arc::new(MockState::default());
        serve(listener, st.clone()).await;
        eventually("Ready", || up.state() == TransportState::Ready).await;
        ok_result(up.call(spec("json", false), tx).await);
    }

    #[tokio::test]
    async fn dropping_the_call_sends_cancelled() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        let call = up.call(spec("hang", false), tx);
        // Drop the future once the upstream has the request.
        tokio::select! {
            r = call => panic!("the hanging call must not resolve: {r:?}"),
            _ = eventually("tools/call", || st.count("tools/call") == 1) => {}
        }
        eventually("notifications/cancelled", || {
            st.count("notifications/cancelled") == 1
        })
        .await;
        let recs = st.records();
        let sent = recs
            .iter()
            .find(|r| r.rpc_method() == Some("tools/call"))
            .unwrap();
        let cancel = recs
            .iter()
            .find(|r| r.rpc_method() == Some("notifications/cancelled"))
            .unwrap();
        let cb = cancel.body.as_ref().unwrap();
        assert_eq!(cb["params"]["requestId"], sent.body.as_ref().unwrap()["id"]);
        assert_eq!(cancel.header(SESSION_HEADER), Some("s-1"));
    }

    #[tokio::test]
    async fn standalone_get_stream_relays_and_answers_ping() {
        let (addr, st) = mock(MockState {
            get_stream: true,
            ..MockState::default()
        })
        .await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let mut notes = up.notifications();
        up.ensure_ready().await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), notes.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.method, "notifications/tools/list_changed");
        eventually("ping answer", || {
            st.records().iter().any(|r| {
                r.body
                    .as_ref()
                    .is_some_and(|b| b["id"] == "gp-1" && b["result"] == json!({}))
            })
        })
        .await;
    }

    #[tokio::test]
    async fn progress_on_get_stream_reaches_the_call_by_token() {
        let (addr, st) = mock(MockState {
            get_stream: true,
            ..MockState::default()
        })
        .await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        eventually("GET stream", || st.get_tx.lock().unwrap().is_some()).await;
        let (tx, mut rx) = mpsc::channel(8);
        let caller = up.clone();
        let call = tokio::spawn(async move { caller.call(spec("get_progress", true), tx).await });
        let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("progress from the GET stream");
        // Reports for tokens no call holds were dropped, not delivered in its place.
        match ev {
            Some(CallEvent::Progress(p)) => {
                assert_eq!(
                    p,
                    json!({"progress":1,"message":"on GET"})
                        .as_object()
                        .cloned()
                        .unwrap()
                );
            }
            other => panic!("expected progress, got {other:?}"),
        }
        st.release.notify_one();
        let v = ok_result(call.await.unwrap());
        assert_eq!(v["content"][0]["text"], "released");
        // The route held no sender: the channel closes with the call, nothing else came.
        let rest = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        assert!(matches!(rest, Ok(None)), "{rest:?}");
        assert!(
            up.progress_routes().is_empty(),
            "route removed with the call"
        );
    }

    #[tokio::test]
    async fn oversized_json_is_a_protocol_error() {
        let (addr, _st) = mock(MockState::default()).await;
        let mut o = opts(format!("http://{addr}/mcp"));
        o.max_message_bytes = 1024;
        let up = HttpUpstream::start(o);
        let mut s = spec("json", false);
        s.params
            .insert("arguments".into(), json!({"big": "x".repeat(4096)}));
        let (tx, _rx) = mpsc::channel(8);
        let err = up.call(s, tx).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Protocol { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn http_error_carries_status_and_snippet() {
        let (addr, _st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        let err = up.call(spec("nope", false), tx).await.unwrap_err();
        let UpstreamError::Broken { reason, .. } = err else {
            panic!("expected Broken, got {err:?}")
        };
        assert!(
            reason.contains("500") && reason.contains("unknown tool"),
            "{reason}"
        );
    }

    // ----- a broken session is never reused (module docs) -----------------------------

    fn sent_in<'a>(recs: &'a [Recorded], rpc_method: &str) -> Vec<&'a Recorded> {
        recs.iter()
            .filter(|r| r.rpc_method() == Some(rpc_method))
            .collect()
    }

    fn deleted(st: &MockState, sid: &str) -> bool {
        st.records()
            .iter()
            .any(|r| r.method == "DELETE" && r.header(SESSION_HEADER) == Some(sid))
    }

    /// `tool` fails the call it answers; the next call runs `initialize` again and goes
    /// to a new session, and the old one is ended with DELETE.
    async fn next_call_after(tool: &str) -> UpstreamError {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        ok_result(up.call(spec("json", false), tx.clone()).await);
        let err = up.call(spec(tool, false), tx.clone()).await.unwrap_err();
        assert_eq!(err.delivery(), Delivery::SentThenFailed, "{tool}: {err:?}");
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(st.count("initialize"), 2, "{tool}: a fresh session");
        let recs = st.records();
        let calls = sent_in(&recs, "tools/call");
        assert_eq!(calls.len(), 3, "{tool}: the failed call is not re-sent");
        assert_eq!(calls[1].header(SESSION_HEADER), Some("s-1"), "{tool}");
        assert_eq!(calls[2].header(SESSION_HEADER), Some("s-2"), "{tool}");
        eventually("DELETE of the suspect session", || deleted(&st, "s-1")).await;
        assert_eq!(up.state(), TransportState::Ready);
        err
    }

    #[tokio::test]
    async fn truncated_chunked_body_makes_the_session_suspect() {
        let err = next_call_after("truncated").await;
        assert!(matches!(err, UpstreamError::Broken { .. }), "{err:?}");
        assert!(err.to_string().contains("the stream broke"), "{err}");
    }

    #[tokio::test]
    async fn connection_reset_makes_the_session_suspect() {
        let err = next_call_after("reset").await;
        assert!(matches!(err, UpstreamError::Broken { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn non_jsonrpc_answer_makes_the_session_suspect() {
        let err = next_call_after("garbage").await;
        assert!(matches!(err, UpstreamError::Protocol { .. }), "{err:?}");
        assert!(err.to_string().contains("invalid JSON"), "{err}");
    }

    #[tokio::test]
    async fn calls_in_flight_on_a_suspect_session_finish_there() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        let (tx, _rx) = mpsc::channel(8);
        let caller = up.clone();
        let held_tx = tx.clone();
        let held = tokio::spawn(async move { caller.call(spec("held", false), held_tx).await });
        eventually("the held call", || st.count("tools/call") == 1).await;
        up.call(spec("truncated", false), tx.clone())
            .await
            .unwrap_err();
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(st.count("initialize"), 2);
        assert!(!deleted(&st, "s-1"), "s-1 still serves a call");
        st.release.notify_one();
        let v = ok_result(held.await.unwrap());
        assert_eq!(v["content"][0]["text"], "held");
        eventually("DELETE once its last call ended", || deleted(&st, "s-1")).await;
    }

    /// Drop a `hang` call once the upstream has it, and wait until its cancel arrived.
    async fn cancel_a_running_call(up: &HttpUpstream, st: &MockState) {
        let (tx, _rx) = mpsc::channel(8);
        let before = st.count("tools/call");
        tokio::select! {
            r = up.call(spec("hang", false), tx) => panic!("the hanging call resolved: {r:?}"),
            _ = eventually("tools/call", || st.count("tools/call") == before + 1) => {}
        }
        eventually("notifications/cancelled", || {
            st.count("notifications/cancelled") == 1
        })
        .await;
    }

    #[tokio::test]
    async fn a_cancel_that_breaks_the_session_is_caught_before_the_next_call() {
        // python-sdk 1.9: a cancel breaks the session; later POSTs get a truncated
        // body, and its GET stream stays open without a byte.
        let (addr, st) = mock(MockState {
            on_cancel: OnCancel::Break,
            get_stream: true,
            ..MockState::default()
        })
        .await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        eventually("GET stream", || st.get_tx.lock().unwrap().is_some()).await;
        cancel_a_running_call(&up, &st).await;
        let (tx, _rx) = mpsc::channel(8);
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(st.count("ping"), 1, "the cancel was verified");
        assert_eq!(st.count("initialize"), 2);
        let recs = st.records();
        let calls = sent_in(&recs, "tools/call");
        assert_eq!(calls.last().unwrap().header(SESSION_HEADER), Some("s-2"));
        eventually("the dead session's GET stream let go", || {
            st.get_closed.load(Ordering::SeqCst) >= 1
        })
        .await;
        eventually("DELETE of the dead session", || deleted(&st, "s-1")).await;
    }

    #[tokio::test]
    async fn a_cancel_on_a_healthy_session_keeps_it() {
        let (addr, st) = mock(MockState::default()).await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        cancel_a_running_call(&up, &st).await;
        let (tx, _rx) = mpsc::channel(8);
        ok_result(up.call(spec("json", false), tx).await);
        assert_eq!(st.count("ping"), 1, "the cancel was verified");
        assert_eq!(st.count("initialize"), 1, "and the session kept");
        assert!(!deleted(&st, "s-1"));
    }

    #[tokio::test]
    async fn a_session_that_stops_answering_after_a_cancel_is_replaced() {
        let (addr, st) = mock(MockState {
            on_cancel: OnCancel::Stall,
            ..MockState::default()
        })
        .await;
        let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
        up.ensure_ready().await.unwrap();
        cancel_a_running_call(&up, &st).await;
        let (tx, _rx) = mpsc::channel(8);
        let started = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(20), up.call(spec("json", false), tx))
            .await
            .expect("a call after the cancel hung on the stalled session");
        ok_result(r);
        assert!(
            started.elapsed() < VERIFY_TIMEOUT + Duration::from_secs(5),
            "waited {:?}",
            started.elapsed()
        );
        assert_eq!(st.count("initialize"), 2);
    }

    #[test]
    fn location_resolution() {
        let base = "http://h:1/a/mcp";
        assert_eq!(
            resolve_location(base, "/mcp/").as_deref(),
            Some("http://h:1/mcp/")
        );
        assert_eq!(
            resolve_location(base, "mcp/").as_deref(),
            Some("http://h:1/a/mcp/")
        );
        assert_eq!(
            resolve_location(base, "http://o:2/x").as_deref(),
            Some("http://o:2/x")
        );
        assert_eq!(resolve_location(base, "https://o/x"), None);
    }
}
