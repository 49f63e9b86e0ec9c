//! Serving one request inline from the upstream (the synchronous path, design.md
//! policy 2 and policy 12 "JSON or SSE").
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
//! a call that produced no answer is reported is decided in [`super::failure`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::failure::{CallFailure, failure};
use super::reply::{self, Body};
use super::results;
use super::wire::ValidRequest;
use crate::auth::Principal;
use crate::mrtr::{Holds, Pending};
use crate::protocol::meta::{InputKind, log_level_rank};
use crate::protocol::{self, ClientCaps, RpcError};
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, InputAnswer, InputRequest, Upstream, UpstreamError,
};

type CallResult = Result<Result<CallOutcome, UpstreamError>, tokio::task::JoinError>;

/// Timing knobs for one inline call.
#[derive(Debug, Clone, Copy)]
pub struct InlineTiming {
    pub keepalive: Duration,
    pub sync_timeout: Duration,
    pub input_gather: Duration,
}

/// The final answer for the client: HTTP status + JSON-RPC message.
pub struct Final {
    pub status: StatusCode,
    pub message: Value,
    /// `Retry-After` seconds (only for calls that were never sent).
    pub retry_after_s: Option<u64>,
}

impl Final {
    fn ok(message: Value) -> Self {
        Self {
            status: StatusCode::OK,
            message,
            retry_after_s: None,
        }
    }

    /// The answer to a call that produced no upstream answer; status and error come
    /// from the one classification in [`failure`].
    pub fn failed(id: &Value, upstream: &str, f: CallFailure<'_>) -> Self {
        let f = failure(upstream, f);
        Self {
            status: f.status,
            message: protocol::error_response(Some(id), &f.error),
            retry_after_s: f.retry_after_s,
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

/// Map an upstream transport failure to the client-facing answer (design.md "HTTP
/// status of upstream failures follows retry safety"; the rule lives in
/// [`super::failure`]).
pub fn upstream_failure(id: &Value, upstream: &str, err: &UpstreamError) -> Final {
    Final::failed(id, upstream, CallFailure::Upstream(err))
}

pub fn final_of(
    req: &ValidRequest,
    upstream: &Upstream,
    server_info: &Value,
    r: CallResult,
) -> Final {
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
        Err(_) => Final::failed(&req.id, upstream.name(), CallFailure::Ended),
    }
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

/// Methods whose result may be `input_required` (spec A7).
pub fn mrtr_eligible(method: &str) -> bool {
    matches!(method, "tools/call" | "prompts/get" | "resources/read")
}

/// What to do with the upstream's input requests.
pub enum InputVerdict {
    /// The client did not declare a kind: cancel and answer `-32021` (policy 5).
    Missing(RpcError),
    /// Relay them to the client as MRTR `input_required`.
    Relay(Vec<InputRequest>),
    /// Not relayable for this method: answered upstream with an error.
    Refused,
}

/// Screen a first input request, gathering the ones that arrive within
/// `input_gather_ms` of it so they are surfaced together (policy 5).
pub async fn screen_inputs(
    req: &ValidRequest,
    upstream: &str,
    first: InputRequest,
    events: &mut mpsc::Receiver<CallEvent>,
    gather: Duration,
) -> InputVerdict {
    let mut batch = vec![first];
    while let Ok(Some(ev)) = tokio::time::timeout(gather, events.recv()).await {
        if let CallEvent::Input(ir) = ev {
            batch.push(ir);
        }
    }
    if let Some(err) = batch
        .iter()
        .find_map(|ir| missing_capability(&req.meta.caps, &ir.method, ir.params.as_ref()))
    {
        for ir in batch {
            let _ = ir.respond.send(InputAnswer::Error(RpcError::internal(
                "the client did not declare this capability",
            )));
        }
        return InputVerdict::Missing(err);
    }
    if !mrtr_eligible(&req.method) {
        tracing::warn!(upstream, method = %req.method, "upstream input request during a method that cannot return input_required");
        for ir in batch {
            let _ = ir.respond.send(InputAnswer::Error(RpcError::internal(
                "this request cannot ask the client for input",
            )));
        }
        return InputVerdict::Refused;
    }
    InputVerdict::Relay(batch)
}

/// A progress or log notification for the client, or `None` when the request did not
/// opt in (spec A10).
fn client_notification(req: &ValidRequest, ev: CallEvent) -> Option<Value> {
    match ev {
        // Queue-position reports are for task status, not client progress.
        CallEvent::Progress(p) if crate::limits::is_queue_event(&p) => None,
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

/// Everything one inline request needs.
pub struct Inline {
    pub upstream: Arc<Upstream>,
    pub principal: Principal,
    pub req: ValidRequest,
    pub server_info: Value,
    pub timing: InlineTiming,
    pub holds: Arc<Holds>,
    /// When the HTTP request arrived: `sync_timeout_ms` counts from here (policy 2).
    pub received: Instant,
}

/// The upstream request for `req`: its params minus the MRTR fields, which are the
/// gateway's business, never the upstream's.
pub fn upstream_spec(req: &ValidRequest, want_progress: bool) -> CallSpec {
    let mut params = req.params.clone();
    params.remove("inputResponses");
    params.remove("requestState");
    CallSpec {
        method: req.method.clone(),
        params,
        want_progress,
        tenant: None,
    }
}

/// Start the upstream call for `req` in its own task.
pub fn start(upstream: &Arc<Upstream>, principal: &Principal, req: &ValidRequest) -> Pending {
    let spec = upstream_spec(req, req.meta.progress_token.is_some());
    let (ev_tx, events) = mpsc::channel::<CallEvent>(32);
    let up = upstream.clone();
    let p = principal.clone();
    let call = tokio::spawn(async move { up.call(&p, spec, ev_tx).await });
    Pending { call, events }
}

/// Run `req` against the upstream and answer inline.
pub async fn run(c: Inline) -> Response<Body> {
    let pending = start(&c.upstream, &c.principal, &c.req);
    serve(c, pending).await
}

/// Aborts the call when dropped unless disarmed; clones share the state, so the SSE
/// body can own one while the forwarder disarms another when it holds the call.
#[derive(Clone)]
struct CallGuard(Arc<std::sync::Mutex<Option<tokio::task::AbortHandle>>>);

impl CallGuard {
    fn new(h: tokio::task::AbortHandle) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(h))))
    }
    fn disarm(&self) {
        if let Ok(mut g) = self.0.lock() {
            *g = None;
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        // Only the last clone decides.
        if Arc::strong_count(&self.0) == 1
            && let Some(h) = self.0.lock().ok().and_then(|mut g| g.take())
        {
            h.abort();
        }
    }
}

/// Wait for a running call and answer inline (JSON, or SSE once it takes longer
/// than `keepalive_ms` or the client asked for notifications).
pub async fn serve(c: Inline, pending: Pending) -> Response<Body> {
    let Pending {
        mut call,
        events: mut ev_rx,
    } = pending;
    let guard = CallGuard::new(call.abort_handle());
    // Armed from the request's start and raced in both phases below: while headers are
    // held (then it is a 400) and once the SSE stream is open (then it is the final
    // event). Only arming it in the SSE phase made a `sync_timeout_ms` shorter than
    // `keepalive_ms` fire after the hold window instead.
    let sync_deadline = c.received + c.timing.sync_timeout;
    let gather = c.timing.input_gather;

    let wants_stream = c.req.meta.progress_token.is_some() || c.req.meta.log_level.is_some();
    if !wants_stream {
        let hold = tokio::time::sleep(c.timing.keepalive);
        tokio::pin!(hold);
        let sync_timer = tokio::time::sleep_until(sync_deadline);
        tokio::pin!(sync_timer);
        let mut events_open = true;
        loop {
            tokio::select! {
                r = &mut call => {
                    return final_of(&c.req, &c.upstream, &c.server_info, r).into_response();
                }
                () = &mut sync_timer => {
                    // Cancels the upstream call (the guard would too, when dropped).
                    call.abort();
                    return sync_timeout(&c).into_response();
                }
                ev = ev_rx.recv(), if events_open => match ev {
                    Some(CallEvent::Input(ir)) => {
                        match screen_inputs(&c.req, c.upstream.name(), ir, &mut ev_rx, gather).await {
                            InputVerdict::Missing(err) => {
                                return reply::rpc_error(StatusCode::BAD_REQUEST, Some(&c.req.id), &err);
                            }
                            InputVerdict::Relay(batch) => {
                                guard.disarm();
                                let v = hold_call(&c, Pending { call, events: ev_rx }, batch);
                                return reply::json(StatusCode::OK, &protocol::response(&c.req.id, v));
                            }
                            InputVerdict::Refused => {}
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
    let body_guard = guard.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(c.timing.keepalive);
        ticker.tick().await;
        let sync_timer = tokio::time::sleep_until(sync_deadline);
        tokio::pin!(sync_timer);
        let mut events_open = true;
        loop {
            tokio::select! {
                r = &mut call => {
                    // Notifications queued before the answer go first.
                    while let Ok(ev) = ev_rx.try_recv() {
                        if let Some(n) = client_notification(&c.req, ev) {
                            let _ = tx.send(reply::sse_event(&n)).await;
                        }
                    }
                    let f = final_of(&c.req, &c.upstream, &c.server_info, r);
                    let _ = tx.send(reply::sse_event(&f.message)).await;
                    break;
                }
                ev = ev_rx.recv(), if events_open => match ev {
                    Some(CallEvent::Input(ir)) => {
                        match screen_inputs(&c.req, c.upstream.name(), ir, &mut ev_rx, gather).await {
                            InputVerdict::Missing(err) => {
                                call.abort();
                                let msg = protocol::error_response(Some(&c.req.id), &err);
                                let _ = tx.send(reply::sse_event(&msg)).await;
                                break;
                            }
                            InputVerdict::Relay(batch) => {
                                guard.disarm();
                                let v = hold_call(&c, Pending { call, events: ev_rx }, batch);
                                let _ = tx.send(reply::sse_event(&protocol::response(&c.req.id, v))).await;
                                break;
                            }
                            InputVerdict::Refused => {}
                        }
                    }
                    Some(ev) => {
                        if let Some(n) = client_notification(&c.req, ev)
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
                    let _ = tx.send(reply::sse_event(&sync_timeout(&c).message)).await;
                    break;
                }
            }
        }
    });
    reply::sse(rx, body_guard)
}

/// The answer once `sync_timeout_ms` passed (policy 2): `-32021` naming the tasks
/// extension.
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
        &c.req.method,
        &c.req.params,
        &c.server_info,
    )
}
