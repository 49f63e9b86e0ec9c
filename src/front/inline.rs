//! Serving one request inline from the upstream (the synchronous path, design.md
//! policy 2 and policy 12 "JSON or SSE").
//!
//! The upstream call runs in its own task. Response headers are held for up to
//! `keepalive_ms`: a fast answer to a request that asked for no progress or log
//! notifications goes out as `application/json`; otherwise the response becomes an SSE
//! stream with keep-alive comments, notifications, and the final answer. The abort
//! guard travels with whatever currently represents the client (the handler future,
//! then the SSE body), so a client that goes away cancels the upstream call.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::reply::{self, Body};
use super::results;
use super::wire::ValidRequest;
use crate::auth::Principal;
use crate::protocol::meta::{InputKind, log_level_rank};
use crate::protocol::{self, ClientCaps, RpcError};
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, InputAnswer, InputRequest, Upstream, UpstreamError,
};

/// Aborts the upstream call task when dropped (client gone, or answer decided).
pub struct AbortOnDrop(pub tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type CallResult = Result<Result<CallOutcome, UpstreamError>, tokio::task::JoinError>;

/// Timing knobs for one inline call.
#[derive(Debug, Clone, Copy)]
pub struct InlineTiming {
    pub keepalive: Duration,
    pub sync_timeout: Duration,
}

/// The final answer for the client: HTTP status + JSON-RPC message.
pub struct Final {
    pub status: StatusCode,
    pub message: Value,
    pub retry_after: bool,
}

impl Final {
    fn ok(message: Value) -> Self {
        Self {
            status: StatusCode::OK,
            message,
            retry_after: false,
        }
    }

    fn error(status: StatusCode, id: &Value, err: &RpcError) -> Self {
        Self {
            status,
            message: protocol::error_response(Some(id), err),
            retry_after: status == StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let mut r = reply::json(self.status, &self.message);
        if self.retry_after {
            r.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        r
    }
}

/// Map an upstream transport failure to the client-facing error (design.md "Upstream
/// unavailable").
pub fn upstream_failure(id: &Value, upstream: &str, err: &UpstreamError) -> Final {
    let status = match err {
        UpstreamError::Protocol { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let rpc = RpcError::internal(err.to_string()).with_data(json!({ "upstream": upstream }));
    Final::error(status, id, &rpc)
}

pub fn final_of(req: &ValidRequest, upstream: &Upstream, server_info: &Value, r: CallResult) -> Final {
    match r {
        Ok(Ok(CallOutcome::Result(v))) => Final::ok(protocol::response(
            &req.id,
            results::complete(&req.method, v, server_info),
        )),
        Ok(Ok(CallOutcome::Error(e))) => Final::ok(protocol::error_response(
            Some(&req.id),
            &results::map_error(e),
        )),
        Ok(Err(e)) => upstream_failure(&req.id, upstream.name(), &e),
        Err(_) => Final::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &req.id,
            &RpcError::internal("upstream call task ended unexpectedly"),
        ),
    }
}

/// What the front does with an upstream server→client request.
enum InputVerdict {
    /// The client did not declare this kind: cancel and answer `-32021` (policy 5).
    Missing(RpcError),
    /// Answered upstream already (e.g. with an error until MRTR handles it).
    Handled,
}

/// The `requiredCapabilities` an input request needs that `caps` lacks, if any.
pub fn missing_capability(
    caps: &ClientCaps,
    method: &str,
    params: Option<&Value>,
) -> Option<RpcError> {
    let kind = InputKind::of_method(method)?;
    if !caps.declares(kind) {
        return Some(RpcError::missing_capability(
            format!(
                "the upstream needs the client capability `{}`",
                kind.capability()
            ),
            json!({ kind.capability(): {} }),
        ));
    }
    if kind == InputKind::Elicitation {
        let mode = params
            .and_then(|p| p.get("mode"))
            .and_then(Value::as_str)
            .unwrap_or("form");
        if !caps.elicitation_allows_mode(mode) {
            return Some(RpcError::missing_capability(
                format!("the upstream needs elicitation mode `{mode}`"),
                json!({ "elicitation": { mode: {} } }),
            ));
        }
    }
    None
}

fn screen_input(req: &ValidRequest, upstream: &str, ir: InputRequest) -> InputVerdict {
    if let Some(err) = missing_capability(&req.meta.caps, &ir.method, ir.params.as_ref()) {
        let _ = ir.respond.send(InputAnswer::Error(RpcError::internal(
            "the client did not declare this capability",
        )));
        return InputVerdict::Missing(err);
    }
    tracing::warn!(
        upstream,
        method = %ir.method,
        "upstream input request on the synchronous path is answered with an error"
    );
    let _ = ir.respond.send(InputAnswer::Error(RpcError::internal(
        "the gateway cannot relay this input request to the client",
    )));
    InputVerdict::Handled
}

/// A progress or log notification for the client, or `None` when the request did not
/// opt in (spec A10).
fn client_notification(req: &ValidRequest, ev: CallEvent) -> Option<Value> {
    match ev {
        CallEvent::Progress(mut p) => {
            let token = req.meta.progress_token.clone()?;
            let mut params = Map::with_capacity(p.len() + 1);
            params.insert("progressToken".into(), token);
            params.append(&mut p);
            Some(protocol::notification(
                "notifications/progress",
                Value::Object(params),
            ))
        }
        CallEvent::Log(p) => {
            let want = log_level_rank(req.meta.log_level.as_deref()?)?;
            let level = p
                .get("level")
                .and_then(Value::as_str)
                .and_then(log_level_rank)?;
            (level >= want)
                .then(|| protocol::notification("notifications/message", Value::Object(p)))
        }
        CallEvent::Input(_) => None,
    }
}

/// Run `req` against `upstream` and answer inline.
pub async fn run(
    upstream: Arc<Upstream>,
    principal: Principal,
    req: ValidRequest,
    server_info: Value,
    timing: InlineTiming,
) -> Response<Body> {
    let spec = CallSpec {
        method: req.method.clone(),
        params: req.params.clone(),
        want_progress: req.meta.progress_token.is_some(),
    };
    let (ev_tx, mut ev_rx) = mpsc::channel::<CallEvent>(32);
    let call_upstream = upstream.clone();
    let mut call: JoinHandle<Result<CallOutcome, UpstreamError>> =
        tokio::spawn(async move { call_upstream.call(&principal, spec, ev_tx).await });
    let guard = AbortOnDrop(call.abort_handle());
    let sync_deadline = Instant::now() + timing.sync_timeout;

    let wants_stream = req.meta.progress_token.is_some() || req.meta.log_level.is_some();
    if !wants_stream {
        let hold = tokio::time::sleep(timing.keepalive);
        tokio::pin!(hold);
        let mut events_open = true;
        loop {
            tokio::select! {
                r = &mut call => {
                    return final_of(&req, &upstream, &server_info, r).into_response();
                }
                ev = ev_rx.recv(), if events_open => match ev {
                    Some(CallEvent::Input(ir)) => {
                        if let InputVerdict::Missing(err) = screen_input(&req, upstream.name(), ir) {
                            drop(guard);
                            return reply::rpc_error(StatusCode::BAD_REQUEST, Some(&req.id), &err);
                        }
                    }
                    Some(_) => {}
                    None => events_open = false,
                },
                () = &mut hold => break,
            }
        }
    }

    // SSE from here on: errors travel in-stream (spec D22).
    let (tx, rx) = mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(timing.keepalive);
        ticker.tick().await;
        let sync_timer = tokio::time::sleep_until(sync_deadline);
        tokio::pin!(sync_timer);
        let mut events_open = true;
        loop {
            tokio::select! {
                r = &mut call => {
                    // Notifications queued before the answer go first.
                    while let Ok(ev) = ev_rx.try_recv() {
                        if let Some(n) = client_notification(&req, ev) {
                            let _ = tx.send(reply::sse_event(&n)).await;
                        }
                    }
                    let f = final_of(&req, &upstream, &server_info, r);
                    let _ = tx.send(reply::sse_event(&f.message)).await;
                    break;
                }
                ev = ev_rx.recv(), if events_open => match ev {
                    Some(CallEvent::Input(ir)) => {
                        if let InputVerdict::Missing(err) = screen_input(&req, upstream.name(), ir) {
                            call.abort();
                            let msg = protocol::error_response(Some(&req.id), &err);
                            let _ = tx.send(reply::sse_event(&msg)).await;
                            break;
                        }
                    }
                    Some(ev) => {
                        if let Some(n) = client_notification(&req, ev)
                            && tx.send(reply::sse_event(&n)).await.is_err() {
                                break;
                            }
                    }
                    None => events_open = false,
                },
                _ = ticker.tick() => {
                    if tx.send(reply::sse_keepalive()).await.is_err() {
                        break;
                    }
                }
                () = &mut sync_timer => {
                    call.abort();
                    let err = RpcError::tasks_extension_required(format!(
                        "the call did not finish within sync_timeout_ms ({} ms); declare the tasks extension to run it as a task",
                        timing.sync_timeout.as_millis()
                    ));
                    let _ = tx.send(reply::sse_event(&protocol::error_response(Some(&req.id), &err))).await;
                    break;
                }
            }
        }
    });
    reply::sse(rx, guard)
}
