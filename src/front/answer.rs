//! The final answer of a request the engine or an upstream answered, and the guard that
//! cancels a call its client no longer waits for: what every path of the front renders
//! a domain outcome with (ARCHITECTURE.md "How the layers talk": the engine never
//! builds a response). How a call that produced no answer is reported is decided in
//! the engine (`tasks/failure.rs`).

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::Value;

use super::reply::{self, Body};
use crate::protocol;
use crate::tasks::{CallFailure, ErrorClass, Reply, failure_of};
use crate::upstream::UpstreamError;

/// The final answer for the client: HTTP status + JSON-RPC message.
pub(super) struct Final {
    pub(super) status: StatusCode,
    pub(super) message: Value,
    /// `Retry-After` seconds (only for calls that were never sent).
    pub(super) retry_after_s: Option<u64>,
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
    /// from the one classification in the engine ([`failure_of`]).
    pub(super) fn failed(id: &Value, upstream: &str, f: CallFailure<'_>) -> Self {
        Self::of(id, Reply::Failed(failure_of(upstream, f)))
    }

    /// Render an engine [`Reply`] that is no task handle to request `id` (a handle's
    /// answer names the upstream: [`Final::of_call`]).
    pub(super) fn of(id: &Value, r: Reply) -> Self {
        Self::of_call(id, r, &Value::Null)
    }

    /// Render an engine [`Reply`] to a request of the upstream whose `serverInfo` is
    /// `server_info`: every answer is HTTP 200 but an error whose retry class says
    /// otherwise; a task handle is the 2026 `CreateTaskResult`.
    pub(super) fn of_call(id: &Value, r: Reply, server_info: &Value) -> Self {
        match r {
            Reply::Complete(Ok(v)) | Reply::InputRequired(v) => Self::ok(protocol::response(id, v)),
            Reply::Task(rec) => Self::ok(protocol::response(
                id,
                crate::tasks::create_result(&rec, server_info),
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

    pub(super) fn into_response(self) -> Response<Body> {
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
pub(super) fn upstream_failure(id: &Value, upstream: &str, err: &UpstreamError) -> Final {
    Final::failed(id, upstream, CallFailure::Upstream(err))
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

/// The HTTP response for an engine [`Reply`] to request `id`.
pub(super) fn render(id: &Value, r: Reply) -> Response<Body> {
    Final::of(id, r).into_response()
}
