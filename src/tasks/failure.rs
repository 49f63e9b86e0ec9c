//! What the client is told when a call produced no upstream answer — the one place
//! that decides the JSON-RPC error and its retry class (which the front renders as the
//! HTTP status: README "What the gateway does", retry safety).
//!
//! - **Never sent** (upstream not started, restarting, connection refused, gateway
//!   shutting down, queue full): HTTP 503 + `Retry-After` + `-32603` naming the
//!   upstream (`-32005` with `data.{retryAfterMs, reason}` for a full queue,
//!   docs/design.md §8 "Flow control"). Nothing ran upstream, so a client may retry.
//! - **Sent, then failed** (child crashed, stream broke, malformed answer, an upstream
//!   HTTP 502/503/504 after the request was written, call timeout, an internal
//!   failure): HTTP 200 + `-32603` saying what happened. The request was valid and this
//!   is its outcome; SDK clients turn any non-2xx into a transport error and the
//!   message would never reach the model. A retry could run the call twice.
//! - **Sync timeout** (docs/design.md §2 "Clients without the tasks extension"): 400
//!   `-32021` naming the tasks extension.
//!
//! The class applies only while no response header was sent: after SSE headers the
//! error is the stream's final event, and for a promoted task it is the `failed`
//! error. Every caller — inline calls, `tools/list` and `server/discover`, the
//! promotion race, the task driver — goes through [`failure`].

use std::time::Duration;

use serde_json::json;

use crate::limits::Throttled;
use crate::protocol::{RpcError, error};
use crate::upstream::{Delivery, UpstreamError};

/// `Retry-After` for a call that was never sent: the upstream is usually back (or the
/// queue has room) within a restart backoff.
const RETRY_AFTER_S: u64 = 1;

/// Why a call produced no upstream answer.
#[derive(Debug, Clone, Copy)]
pub enum CallFailure<'a> {
    /// The transport said why (its variant says whether the request was sent).
    Upstream(&'a UpstreamError),
    /// The task running the upstream call ended without a result (it panicked or was
    /// aborted from elsewhere): an internal failure after the call had started.
    Ended,
    /// A client without the tasks extension waited `sync_timeout_ms` (docs/design.md §2
    /// "Clients without the tasks extension").
    SyncTimeout(Duration),
}

/// How a JSON-RPC error answer may be retried; the front turns it into the HTTP
/// status (used only while no response header was sent) and `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request's outcome (HTTP 200): retrying could run it twice.
    Outcome,
    /// Nothing ran; retry after this many seconds (HTTP 503 + `Retry-After`).
    RetryLater(u64),
    /// The request cannot succeed as sent (HTTP 400).
    Refused,
    /// A limit refused it (HTTP 429, or 503 for a full queue, + `Retry-After`).
    Throttled(Throttled),
}

/// The client-facing answer to a [`CallFailure`], or any error answer of the engine.
#[derive(Debug, Clone)]
pub struct Failure {
    pub class: ErrorClass,
    pub error: RpcError,
}

impl Failure {
    pub fn outcome(error: RpcError) -> Self {
        Self {
            class: ErrorClass::Outcome,
            error,
        }
    }

    pub fn retry_later(error: RpcError) -> Self {
        Self {
            class: ErrorClass::RetryLater(RETRY_AFTER_S),
            error,
        }
    }

    pub fn refused(error: RpcError) -> Self {
        Self {
            class: ErrorClass::Refused,
            error,
        }
    }

    pub fn throttled(t: Throttled) -> Self {
        Self {
            class: ErrorClass::Throttled(t),
            error: t.rpc_error(),
        }
    }
}

/// Classify a failed call to `upstream` (its configured name).
pub fn failure(upstream: &str, f: CallFailure<'_>) -> Failure {
    let data = json!({ "upstream": upstream });
    match f {
        CallFailure::Upstream(UpstreamError::QueueFull { .. }) => {
            // Every throttle answers -32005 with retry data (docs/design.md §8 "Flow
            // control").
            let rpc = RpcError::new(
                error::THROTTLED,
                format!("upstream {upstream} queue is full"),
            )
            .with_data(json!({
                "retryAfterMs": RETRY_AFTER_S * 1000,
                "reason": "queue_full",
                "upstream": upstream,
            }));
            Failure::retry_later(rpc)
        }
        CallFailure::Upstream(UpstreamError::ShuttingDown) => Failure::retry_later(
            RpcError::internal(format!(
                "the gateway is shutting down; the call was not sent to upstream {upstream}"
            ))
            .with_data(data),
        ),
        CallFailure::Upstream(e) => {
            // The other variants name the upstream in their message.
            let rpc = RpcError::internal(e.to_string()).with_data(data);
            match e.delivery() {
                Delivery::NeverSent => Failure::retry_later(rpc),
                Delivery::SentThenFailed => Failure::outcome(rpc),
            }
        }
        CallFailure::Ended => Failure::outcome(
            RpcError::internal(format!(
                "the call to upstream {upstream} ended unexpectedly inside the gateway"
            ))
            .with_data(data),
        ),
        CallFailure::SyncTimeout(after) => {
            Failure::refused(RpcError::tasks_extension_required(format!(
                "the call did not finish within sync_timeout_ms ({} ms); declare the tasks extension to run it as a task",
                after.as_millis()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(e: UpstreamError) -> Failure {
        failure("demo", CallFailure::Upstream(&e))
    }

    #[track_caller]
    fn assert_retry_later(f: &Failure, code: i64) {
        assert_eq!(f.class, ErrorClass::RetryLater(1), "{f:?}");
        assert_eq!(f.error.code, code, "{f:?}");
        assert!(
            f.error.message.contains("demo"),
            "names the upstream: {f:?}"
        );
    }

    #[track_caller]
    fn assert_outcome(f: &Failure, says: &str) {
        assert_eq!(f.class, ErrorClass::Outcome, "{f:?}");
        assert_eq!(f.error.code, error::INTERNAL_ERROR, "{f:?}");
        assert!(
            f.error.message.contains("demo"),
            "names the upstream: {f:?}"
        );
        assert!(f.error.message.contains(says), "says what happened: {f:?}");
    }

    #[test]
    fn never_sent_is_503_with_retry_after() {
        let name = || "demo".to_string();
        assert_retry_later(
            &up(UpstreamError::Unavailable {
                upstream: name(),
                reason: "connection refused".into(),
            }),
            error::INTERNAL_ERROR,
        );
        assert_retry_later(&up(UpstreamError::ShuttingDown), error::INTERNAL_ERROR);
        let full = up(UpstreamError::QueueFull { upstream: name() });
        assert_retry_later(&full, error::THROTTLED);
        let data = full.error.data.unwrap_or_default();
        assert_eq!(data["reason"], "queue_full");
        assert_eq!(data["retryAfterMs"], 1000);
    }

    #[test]
    fn sent_then_failed_is_200_saying_what_happened() {
        let name = || "demo".to_string();
        assert_outcome(
            &up(UpstreamError::Broken {
                upstream: name(),
                reason: "child exited with status 3 while the call was in flight".into(),
            }),
            "exited",
        );
        assert_outcome(
            &up(UpstreamError::Broken {
                upstream: name(),
                reason: "tools/call: HTTP 503 Service Unavailable: busy".into(),
            }),
            "503",
        );
        assert_outcome(
            &up(UpstreamError::Protocol {
                upstream: name(),
                reason: "invalid JSON response".into(),
            }),
            "invalid JSON",
        );
        assert_outcome(
            &up(UpstreamError::TimedOut {
                upstream: name(),
                after_ms: 500,
            }),
            "call_timeout_ms",
        );
        assert_outcome(&failure("demo", CallFailure::Ended), "ended unexpectedly");
    }

    #[test]
    fn sync_timeout_is_400_naming_the_tasks_extension() {
        let f = failure("demo", CallFailure::SyncTimeout(Duration::from_secs(2)));
        assert_eq!(f.class, ErrorClass::Refused);
        assert_eq!(f.error.code, error::MISSING_CLIENT_CAPABILITY);
        assert!(f.error.message.contains("2000 ms"), "{f:?}");
        let data = f.error.data.unwrap_or_default();
        assert_eq!(
            data["requiredCapabilities"],
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        );
    }
}
