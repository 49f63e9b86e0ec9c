//! What the engine answers a request with — a domain outcome, not HTTP. The front
//! renders it (status, headers, JSON or SSE); the engine never builds a response.

use std::sync::Arc;

use serde_json::Value;

use super::failure::{CallFailure, Failure, failure};
use crate::protocol::{Method, RpcError, results};
use crate::store::TaskRecord;
use crate::upstream::{CallOutcome, UpstreamError};

/// A joined upstream call: the task running it may have ended without a result.
pub type JoinedCall = Result<Result<CallOutcome, UpstreamError>, tokio::task::JoinError>;

/// The answer to one request.
#[derive(Debug)]
pub enum Reply {
    /// The call's answer inline: a 2026 result, or the (mapped) JSON-RPC error the
    /// upstream answered with — either way the request's outcome.
    Complete(Result<Value, RpcError>),
    /// The call became a task (or an idempotent replay found one), durable: each era
    /// renders its own `CreateTaskResult` from the record.
    Task(Arc<TaskRecord>),
    /// An MRTR round: the `input_required` result the client answers by retrying.
    InputRequired(Value),
    /// No answer from the upstream, or a refusal: the error and its retry class.
    Failed(Failure),
}

/// The inline answer of a finished upstream call for `method` to `upstream`.
pub fn answer_of(method: Method, upstream: &str, server_info: &Value, r: JoinedCall) -> Reply {
    match r {
        Ok(Ok(CallOutcome::Result(v))) => {
            Reply::Complete(Ok(results::complete(method, v, server_info)))
        }
        Ok(Ok(CallOutcome::Error(e))) => Reply::Complete(Err(results::map_error(e))),
        Ok(Err(e)) => Reply::Failed(failure(upstream, CallFailure::Upstream(&e))),
        Err(_) => Reply::Failed(failure(upstream, CallFailure::Ended)),
    }
}
