//! Serving one request inline from the upstream (the synchronous path, docs/design.md
//! §2 "Clients without the tasks extension" and §12 "HTTP front", JSON or SSE).
//!
//! The upstream call runs in its own task. Response headers are held for up to
//! `keepalive_ms`: a fast answer to a request that asked for no progress or log
//! notifications goes out as `application/json`; otherwise the response becomes an SSE
//! stream with keep-alive comments, notifications, and the final answer. The abort
//! guard travels with whatever currently represents the client (the handler future,
//! then the SSE body), so a client that goes away cancels the upstream call.
//!
//! `sync_timeout_ms` counts from the request's arrival and is raced in both phases:
//! while headers are still held it answers HTTP 400 `-32021`, once the SSE stream is
//! open `-32021` is the final event; either way the upstream call is cancelled. How
//! a call that produced no answer is reported is decided in [`crate::tasks::failure`].

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::held;
use super::reply::{self, Body};
use crate::auth::Principal;
use crate::protocol::meta::log_level_rank;
use crate::protocol::params::Forward;
use crate::protocol::{self, Request};
use crate::tasks::Engine;
use crate::tasks::events::{Notice, Pending};
use crate::tasks::failure::{CallFailure, ErrorClass, failure};
pub use crate::tasks::inputs::InlineTiming;
use crate::tasks::inputs::{self, InputVerdict};
use crate::tasks::mrtr::Holds;
use crate::tasks::outcome::{JoinedCall, Reply, answer_of};
use crate::upstream::{InputRequest, Upstream, UpstreamError};

/// The final answer for the client: HTTP status + JSON-RPC message.
pub struct Final {
    pub status: StatusCode,
    pub message: Value,
    /// `Retry-After` seconds (only for calls that were never sent).
    pub retry_after_s: Option<u64>,
}

impl Final {
    pub(super) fn ok(message: Value) -> Self {
        Self {
            status: StatusCode::OK,
            message,
            retry_after_s: None,
        }
    }

    /// The answer to a call that produced no upstream answer; status and error come
    /// from the one classification in [`failure`].
    pub fn failed(id: &Value, upstream: &str, f: CallFailure<'_>) -> Self {
        Self::of(id, Reply::Failed(failure(upstream, f)))
    }

    /// Render an engine [`Reply`] that is no task handle to request `id` (a handle's
    /// answer names the upstream: [`Final::of_call`]).
    pub fn of(id: &Value, r: Reply) -> Self {
        Self::of_call(id, r, &Value::Null)
    }

    /// Render an engine [`Reply`] to a request of the upstream whose `serverInfo` is
    /// `server_info`: every answer is HTTP 200 but an error whose retry class says
    /// otherwise; a task handle is the 2026 `CreateTaskResult`.
    pub fn of_call(id: &Value, r: Reply, server_info: &Value) -> Self {
        match r {
            Reply::Complete(Ok(v)) | Reply::InputRequired(v) => Self::ok(protocol::response(id, v)),
            Reply::Task(rec) => Self::ok(protocol::response(
                id,
                crate::tasks::snapshot::create_result(&rec, server_info),
            )),
            Reply::Complete(Err(e)) => {
                crate::telemetry::record_rpc_error(e.code);
                Self::ok(protocol::error_response(Some(id), &e))
            }
            Reply::Failed(f) => {
                crate::telemetry::record_rpc_error(f.error.code);
                let (status, retry_after_s) = match f.class {
                    ErrorClass::Outcome => (StatusCode::OK, None),
                    ErrorClass::RetryLater(s) => (StatusCode::SERVICE_UNAVAILABLE, Some(s)),
                    ErrorClass::Refused => (StatusCode::BAD_REQUEST, None),
                    ErrorClass::Throttled(t) => {
                        crate::metrics::throttled(t.reason.as_str());
                        let status = match t.reason {
                            crate::limits::Reason::QueueFull => StatusCode::SERVICE_UNAVAILABLE,
                            _ => StatusCode::TOO_MANY_REQUESTS,
                        };
                        (status, Some(t.retry_after_s()))
                    }
                };
                Self {
                    status,
                    message: protocol::error_response(Some(id), &f.error),
                    retry_after_s,
                }
            }
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let mut r = reply::json(self.status, &self.message);
        if let Some(s) = self.retry_after_s
            && let Ok(v) = http::HeaderValue::from_str(&s.max(1).to_string())
        {
            r.headers_mut().insert(http::header::RETRY_AFTER, v);
        }
        r
    }
}

/// Map an upstream transport failure to the client-facing answer (the retry-safety
/// rule lives in `tasks::failure`).
pub fn upstream_failure(id: &Value, upstream: &str, err: &UpstreamError) -> Final {
    Final::failed(id, upstream, CallFailure::Upstream(err))
}

/// A progress or log notification for the client, or `None` when the request did not
/// opt in (MCP 2026-07-28 "Progress": a `progressToken`; "Logging": a `logLevel`).
fn client_notification<P>(req: &Request<P>, notice: Notice) -> Option<Value> {
    match notice {
        Notice::Progress(mut p) => {
            let token = req.meta.progress_token.clone()?;
            let mut params = Map::with_capacity(p.len() + 1);
            params.insert("progressToken".into(), token);
            params.append(&mut p);
            Some(protocol::notification(
                "notifications/progress",
                Value::Object(params),
            ))
        }
        Notice::Log(p) => {
            let want = log_level_rank(req.meta.log_level.as_deref()?)?;
            let level = protocol::fields::log_level(&p)?;
            (level >= want)
                .then(|| protocol::notification("notifications/message", Value::Object(p)))
        }
        // Queue-position reports are for task status, not client progress.
        Notice::Queue(_) => None,
    }
}

/// Everything one inline request needs.
pub struct Inline {
    pub engine: Arc<Engine>,
    pub upstream: Arc<Upstream>,
    pub principal: Principal,
    pub req: Request<Forward>,
    pub server_info: Value,
    pub timing: InlineTiming,
    pub holds: Arc<Holds>,
    /// When the HTTP request arrived: `sync_timeout_ms` counts from here
    /// (docs/design.md §2 "Clients without the tasks extension").
    pub received: Instant,
}

/// Run `req` against the upstream and answer inline.
pub async fn run(c: Inline) -> Response<Body> {
    let pending = c.engine.start_inline(&c.upstream, &c.principal, &c.req);
    serve(c, pending).await
}

/// Aborts the call when dropped unless disarmed; clones share the state, so the SSE
/// body can own one while the forwarder disarms another when it holds the call.
#[derive(Clone)]
pub(super) struct CallGuard(Arc<parking_lot::Mutex<Option<tokio::task::AbortHandle>>>);

impl CallGuard {
    pub(super) fn new(h: tokio::task::AbortHandle) -> Self {
        Self(Arc::new(parking_lot::Mutex::new(Some(h))))
    }
    pub(super) fn disarm(&self) {
        {
            let mut g = self.0.lock();
            *g = None;
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        // Only the last clone decides.
        if Arc::strong_count(&self.0) == 1
            && let Some(h) = self.0.lock().take()
        {
            h.abort();
        }
    }
}

/// Wait for a running call and answer inline (JSON, or SSE once it takes longer
/// than `keepalive_ms` or the client asked for notifications): the one held-call
/// responder (`held.rs`), with what a 2026 client makes of each event.
pub async fn serve(c: Inline, pending: Pending) -> Response<Body> {
    let wants_stream = c.req.meta.progress_token.is_some() || c.req.meta.log_level.is_some();
    let t = held::Timing {
        hold_until: Some(Instant::now() + c.timing.keepalive),
        held: !wants_stream,
        sync_at: c.received + c.timing.sync_timeout,
        keepalive: c.timing.keepalive,
        opening_comment: false,
    };
    held::serve(c, pending, t).await
}

impl held::Site for Inline {
    fn finished(&mut self, r: JoinedCall) -> Final {
        final_of(self, r)
    }

    /// `-32021` naming the tasks extension (docs/design.md §2 "Clients without the
    /// tasks extension").
    fn sync_timed_out(&self) -> Final {
        sync_timeout(self)
    }

    fn notice(&mut self, n: Notice) -> Option<Value> {
        client_notification(&self.req, n)
    }

    /// Input the client cannot give ends the call; input it can is an MRTR round.
    fn inputs(&mut self, batch: Vec<InputRequest>) -> held::Inputs {
        match screen(self, batch) {
            InputVerdict::Missing(err) => held::Inputs::Done(Final::of(
                &self.req.id,
                Reply::Failed(crate::tasks::failure::Failure::refused(err)),
            )),
            InputVerdict::Relay(batch) => held::Inputs::Hold(batch),
            InputVerdict::Refused => held::Inputs::Nothing,
        }
    }

    fn hold(&mut self, pending: Pending, batch: Vec<InputRequest>) -> Final {
        Final::ok(protocol::response(
            &self.req.id,
            hold_call(self, pending, batch),
        ))
    }
}

fn screen(c: &Inline, batch: Vec<InputRequest>) -> InputVerdict {
    inputs::screen(&c.req.meta.caps, c.req.method, c.upstream.name(), batch)
}

/// The HTTP response for an engine [`Reply`] to request `id`.
pub fn render(id: &Value, r: Reply) -> Response<Body> {
    Final::of(id, r).into_response()
}

fn final_of(c: &Inline, r: JoinedCall) -> Final {
    Final::of(
        &c.req.id,
        answer_of(c.req.method, c.upstream.name(), &c.server_info, r),
    )
}

/// The answer once `sync_timeout_ms` passed (docs/design.md §2 "Clients without the
/// tasks extension"): `-32021` naming the tasks extension.
fn sync_timeout(c: &Inline) -> Final {
    Final::failed(
        &c.req.id,
        c.upstream.name(),
        CallFailure::SyncTimeout(c.timing.sync_timeout),
    )
}

fn hold_call(c: &Inline, pending: Pending, batch: Vec<InputRequest>) -> Value {
    c.holds.hold(
        pending,
        batch,
        &c.principal,
        c.upstream.name(),
        c.req.method,
        &c.req.params,
        &c.server_info,
    )
}
