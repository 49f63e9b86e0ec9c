//! Legacy upstream client: one trait, two transports (`stdio/`, `http/`).
//!
//! The gateway speaks 2025-era MCP to its upstreams (MCP 2025-03-26 to 2025-11-25,
//! "Lifecycle" and "Transports"): it runs the `initialize` handshake itself, keeps
//! session state, answers `ping`, and turns each client request into exactly one
//! upstream call. Everything the upstream says *about*
//! a call while it runs (progress, log messages, server→client input requests) arrives
//! on that call's event channel, so attribution is never guessed (docs/design.md §14
//! "Upstream sessions").
//!
//! Cancellation contract: dropping the future returned by [`LegacyTransport::call`]
//! before it resolves cancels the upstream call (`notifications/cancelled`), and any
//! late answer is discarded.

pub mod http;
pub mod identity;
pub mod legacy_messages;
pub mod registry;
pub mod sse;
pub mod stdio;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::protocol::RpcError;

pub use registry::{Scope, Upstream, UpstreamSet};

/// What the upstream told us in its `initialize` result; the store keeps the same type.
pub use crate::protocol::UpstreamInfo;

/// One request to send upstream.
#[derive(Debug, Clone)]
pub struct CallSpec {
    /// Legacy method name (`tools/call`, `resources/read`, …).
    pub method: String,
    /// `params.name` when it is a string (the tool of a `tools/call`, the prompt of a
    /// `prompts/get`), parsed once by the front: what a stdio pool throttles by.
    pub tool: Option<String>,
    /// Params as the client sent them, *without* `_meta` (the transport adds its own
    /// `_meta.progressToken` when `want_progress` is set; client tokens never go
    /// upstream).
    pub params: Map<String, Value>,
    /// Ask the upstream for progress (a gateway-minted token, unique per session).
    pub want_progress: bool,
    /// The tenant the call is made for; `None` for the gateway's own calls (such as
    /// the cached `tools/list`). A stdio pool throttles a tenant + tool whose calls
    /// keep killing its children.
    pub tenant: Option<String>,
    /// The 2025-era client session the call is made for, which picks the upstream
    /// session under `isolation = "session"` (docs/design.md §22); `None` otherwise.
    pub session: Option<String>,
}

/// Something the upstream said about an in-flight call.
#[derive(Debug)]
pub enum CallEvent {
    /// `notifications/progress` params for this call, `progressToken` removed.
    Progress(Map<String, Value>),
    /// `notifications/message` params seen while this call was in flight.
    Log(Map<String, Value>),
    /// A server→client request (`elicitation/create`, `sampling/createMessage`,
    /// `roots/list`) attributed to this call. The transport answers the upstream with
    /// whatever is sent on `respond`; if `respond` is dropped it answers with an error.
    Input(InputRequest),
    /// Not from the upstream: where the call stands in the upstream's admission queue
    /// (the engine reports it while the call waits for a slot). Task status only,
    /// never relayed to clients as progress.
    Queue(QueuePosition),
}

/// A call's place in its upstream's admission queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuePosition {
    /// Waiting, at this 1-based position.
    Waiting(usize),
    /// Admitted after waiting: the call now runs.
    Admitted,
}

#[derive(Debug)]
pub struct InputRequest {
    pub method: String,
    pub params: Option<Value>,
    pub respond: oneshot::Sender<InputAnswer>,
}

/// The gateway's answer to an upstream input request.
#[derive(Debug, Clone)]
pub enum InputAnswer {
    Result(Value),
    Error(RpcError),
}

/// How an upstream call ended when the upstream answered.
#[derive(Debug, Clone)]
pub enum CallOutcome {
    /// The JSON-RPC `result` object, untouched.
    Result(Value),
    /// The JSON-RPC `error` object the upstream sent.
    Error(RpcError),
}

/// Why an upstream call did not produce an answer.
///
/// Every variant belongs to one side of the retry-safety line (docs/design.md §12
/// "HTTP front", "Retry safety of upstream failures"), given by
/// [`UpstreamError::delivery`]: a transport picks the variant by whether the request
/// may have reached the upstream, and the front maps that to the client's status in one
/// place (`tasks::failure`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// Never sent: not started, restarting, connection refused, or the session was
    /// refused before the request could run.
    #[error("upstream {upstream} is unavailable: {reason}")]
    Unavailable { upstream: String, reason: String },
    /// Sent, then the child exited, the connection broke or the upstream answered with
    /// an HTTP error status.
    #[error("upstream {upstream} failed during the call: {reason}")]
    Broken { upstream: String, reason: String },
    /// Sent, then the upstream violated the protocol (bad framing, malformed or
    /// oversized answer, …).
    #[error("upstream {upstream} protocol error: {reason}")]
    Protocol { upstream: String, reason: String },
    /// Sent, then not answered within `call_timeout_ms` (the call was cancelled).
    #[error("upstream {upstream} did not answer within call_timeout_ms ({after_ms} ms)")]
    TimedOut { upstream: String, after_ms: u64 },
    /// Never sent: the upstream's admission queue had no room (docs/design.md §8 "Flow
    /// control": 503 + `-32005`).
    #[error("upstream {upstream} queue is full")]
    QueueFull { upstream: String },
    /// Never sent (docs/design.md §12 "HTTP front" lists it with the retryable cases):
    /// the gateway is shutting down.
    #[error("gateway is shutting down")]
    ShuttingDown,
}

/// Whether a failed call may have reached the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing ran upstream: a client may safely retry (503 + `Retry-After`).
    NeverSent,
    /// The request was written (or may have been) and then the call failed: the
    /// upstream may have acted on it, so this is the request's outcome (200 +
    /// `-32603`), never an invitation to retry.
    SentThenFailed,
}

impl UpstreamError {
    /// A short name of the failure (a span's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "upstream_unavailable",
            Self::Broken { .. } => "upstream_broken",
            Self::Protocol { .. } => "upstream_protocol",
            Self::TimedOut { .. } => "timeout",
            Self::QueueFull { .. } => "queue_full",
            Self::ShuttingDown => "shutting_down",
        }
    }

    pub fn delivery(&self) -> Delivery {
        match self {
            Self::Unavailable { .. } | Self::QueueFull { .. } | Self::ShuttingDown => {
                Delivery::NeverSent
            }
            Self::Broken { .. } | Self::Protocol { .. } | Self::TimedOut { .. } => {
                Delivery::SentThenFailed
            }
        }
    }
}

/// Observable state of one transport instance (for `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportState {
    Starting,
    Ready,
    Down(String),
}

/// A notification the upstream sent that belongs to no call (list changes, resource
/// updates). Relayed to `subscriptions/listen` streams.
#[derive(Debug, Clone)]
pub struct SessionNotification {
    pub method: String,
    pub params: Option<Value>,
}

/// One legacy upstream session (HTTP) or child pool (stdio).
pub trait LegacyTransport: Send + Sync + 'static {
    /// Run `initialize` if not yet done (idempotent; concurrent callers share one
    /// attempt) and return the upstream's identity.
    fn ensure_ready(&self) -> BoxFuture<'_, Result<Arc<UpstreamInfo>, UpstreamError>>;

    /// The identity from the last successful `initialize`, if any. Shared, not
    /// copied: every request reads it (its capabilities decide what is answered).
    fn info(&self) -> Option<Arc<UpstreamInfo>>;

    fn state(&self) -> TransportState;

    /// Send one request and wait for its answer; events about it go to `events`.
    /// Dropping the future cancels the call upstream.
    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>>;

    /// Notifications not tied to a call (`notifications/*/list_changed`,
    /// `notifications/resources/updated`).
    fn notifications(&self) -> broadcast::Receiver<SessionNotification>;

    /// Stop: kill children / end the session. Calls in flight fail with `ShuttingDown`.
    /// An HTTP session that holds live upstream tasks is left to the server (no
    /// `DELETE`), so the next start can re-attach to them.
    fn shutdown(&self) -> BoxFuture<'_, ()>;

    /// A channel to one upstream session (HTTP) or one child (stdio), for the life of
    /// an upstream task: every request of that task goes to where it lives
    /// (docs/design.md §25 "The 2025-11-25 task dialect").
    fn pin(&self) -> BoxFuture<'_, Result<Arc<dyn TaskChannel>, UpstreamError>>;

    /// The session a previous process recorded for an upstream task, reached again
    /// without a handshake; `None` where a session cannot outlive the gateway (stdio).
    fn adopt(&self, session: &SessionRef) -> Option<Arc<dyn TaskChannel>>;

    /// Upstream tasks this transport's sessions hold right now: a transport holding
    /// any is not reaped as idle.
    fn live_tasks(&self) -> usize;
}

/// Where an upstream task's session is, as a restart needs it: the `Mcp-Session-Id`
/// and the protocol version negotiated in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRef {
    pub id: String,
    pub version: Option<String>,
}

/// One upstream session or child, pinned for the life of an upstream task.
pub trait TaskChannel: Send + Sync + 'static {
    /// Send one request in the pinned session and wait for its answer; events about
    /// it go to `events`. Dropping the future cancels the request upstream.
    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>>;

    /// The session, when a later process can reach it again (HTTP with a session id).
    fn session(&self) -> Option<SessionRef>;

    /// An upstream task now lives in this session: it is not deleted until
    /// [`TaskChannel::task_ended`] (a gateway that stops meanwhile leaves it to the
    /// server, for the next start to re-attach).
    fn task_started(&self);

    /// The upstream task reached a terminal state (or was cancelled).
    fn task_ended(&self);
}

/// Answer for upstream requests that no call owns (docs/design.md §14 "Upstream
/// sessions"): `ping` → `{}`, `roots/list` → no roots, anything else → an error.
pub fn unowned_request_answer(method: &str) -> InputAnswer {
    match method {
        "ping" => InputAnswer::Result(Value::Object(Map::new())),
        "roots/list" => InputAnswer::Result(serde_json::json!({ "roots": [] })),
        other => InputAnswer::Error(RpcError::new(
            crate::protocol::error::METHOD_NOT_FOUND,
            format!("request {other} is not attributable to a client request"),
        )),
    }
}

/// The capabilities the gateway declares to every upstream (docs/design.md §14
/// "Upstream sessions"): all three input kinds, so servers register tools that need
/// them; each kind is surfaced only to client requests that declared it.
pub fn gateway_client_capabilities() -> Value {
    serde_json::json!({
        "elicitation": { "form": {}, "url": {} },
        "sampling": {},
        "roots": {}
    })
}
