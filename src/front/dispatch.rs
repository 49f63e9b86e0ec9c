//! The JSON-RPC steps of the request path, the innermost service of the stack (`build`
//! in `mod.rs`): wire validation of the body (`wire.rs`), then the capability and limit
//! checks and the routing of a validated request to what serves it: the front itself
//! (`server/discover`, `subscriptions/listen`), the tasks methods, or the upstream.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::Instrument;

use super::era::{Era, ParsedBody};
use super::gateway::Gateway;
use super::inline::{self, Inline, InlineTiming};
use super::legacy;
use super::relay;
use super::reply::{self, Body};
use super::stack::{LogFields, ReadRequest, Received, Resp, RespFuture, Target};
use super::wire::{self, ValidRequest};
use crate::auth::Principal;
use crate::protocol::params::{Field, Forward, Params, ToolCallParams};
use crate::protocol::{
    self, Method, PROTOCOL_VERSION, Request, RpcError, TASKS_EXTENSION, results,
};
use crate::tasks::call::{Caller, Retry, ToolCallRequest, mrtr_retry};
use crate::tasks::failure::{CallFailure, Failure};
use crate::tasks::outcome::{Reply, ToolReply};
use crate::telemetry;
use crate::upstream::{Upstream, UpstreamInfo};

/// The JSON-RPC service over a request whose body has been read: parse → envelope →
/// headers vs body → `_meta` → version → method ([`wire::validate`]), then capability
/// → rate limits → params and ownership ([`dispatch`]).
#[derive(Clone)]
pub(super) struct Rpc(pub(super) Arc<Gateway>);

impl tower::Service<ReadRequest> for Rpc {
    type Response = Resp;
    type Error = Infallible;
    type Future = RespFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ReadRequest) -> Self::Future {
        let gw = self.0.clone();
        Box::pin(async move { Ok(serve_rpc(&gw, req).await) })
    }
}

async fn serve_rpc(gw: &Gateway, req: ReadRequest) -> Resp {
    let (mut parts, bytes) = req.into_parts();
    // A body the era step parsed to decide is not parsed again.
    let parsed = parts.extensions.remove::<ParsedBody>();
    let ext = &parts.extensions;
    // The path and auth steps put these in the extensions of every request they pass
    // on; a request without them never left those steps.
    let (Some(Target(upstream)), Some(principal)) = (
        ext.get::<Target>().cloned(),
        ext.get::<Principal>().cloned(),
    ) else {
        tracing::error!("a request reached the JSON-RPC service without its route or principal");
        return reply::rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            &RpcError::internal("internal error"),
        );
    };
    let received = ext.get::<Received>().map_or_else(Instant::now, |r| r.0);
    // The 2025-era paths, like the heavy arms of `dispatch`, are boxed: a future is as
    // large as its largest state and is moved whole into the box the service returns,
    // so unboxed, every `tasks/get` would carry and copy the 48 KB state of a
    // `tools/call` (ARCHITECTURE.md "The request path").
    // The method gate passed a GET or DELETE only for a 2025-era session.
    if parts.method == http::Method::GET {
        return Box::pin(legacy::serve_get(gw, &upstream, principal, &parts)).await;
    }
    if parts.method == http::Method::DELETE {
        return Box::pin(legacy::serve_delete(gw, &upstream, principal, &parts)).await;
    }
    // The era the era step decided (docs/design.md §22 "Clients of the 2025 era").
    let tool_headers = || upstream.tool_headers_to_check();
    if ext.get::<Era>() == Some(&Era::Legacy) {
        let body = match parsed {
            Some(ParsedBody(p)) => p,
            None => wire::parse(&bytes),
        };
        return match body {
            Ok(v) => {
                let post = legacy::serve_post(gw, &upstream, principal, &parts, v, received);
                Box::pin(post).await
            }
            Err(rej) => reply::rpc_error(rej.status, rej.id.as_ref(), &rej.error),
        };
    }
    let validated = match parsed {
        Some(ParsedBody(Ok(v))) => wire::validate_parsed(v, &parts.headers, &tool_headers),
        Some(ParsedBody(Err(rej))) => Err(rej),
        None => wire::validate_with(&bytes, &parts.headers, &tool_headers),
    };
    let valid = match validated {
        Ok(wire::Incoming::Notification) => return reply::empty(StatusCode::ACCEPTED),
        Ok(wire::Incoming::Request(r)) => r,
        Err(rej) => return reply::rpc_error(rej.status, rej.id.as_ref(), &rej.error),
    };
    if let Some(log) = ext.get::<LogFields>() {
        log.update(|l| {
            l.method = Some(valid.method);
            if valid.method.is_task_method() {
                l.task_id = valid.params.task_id().map(|t| t.chars().take(64).collect());
            }
        });
    }
    // Without traces the request is served exactly as before they existed.
    if !telemetry::enabled() {
        return dispatch(gw, &upstream, principal, *valid, received).await;
    }
    let target = valid
        .params
        .forward()
        .and_then(|f| telemetry::target_of(valid.method.as_str(), f.upstream.as_map()));
    let span = telemetry::server_span(telemetry::Incoming {
        method: valid.method.as_str(),
        target,
        protocol_version: &valid.meta.protocol_version,
        session: None,
        request_id: &valid.id,
        headers: &parts.headers,
        meta: &valid.meta.trace,
    });
    telemetry::record_principal_of(&span, &principal.tenant, &principal.subject);
    Box::pin(dispatch(gw, &upstream, principal, *valid, received).instrument(span)).await
}

/// `server/discover` synthesised from the upstream's `initialize` result (MCP 2026-07-28
/// "server/discover").
pub fn discover_result(info: &UpstreamInfo) -> Value {
    let mut caps = info.capabilities.clone();
    // The legacy 2025-11-25 `tasks` capability is a different feature and must not be
    // advertised next to the extension (SEP-2663, which replaced it with the
    // MCP Tasks extension).
    caps.remove("tasks");
    let ext = caps
        .entry("extensions")
        .or_insert_with(|| Value::Object(Map::new()));
    if !ext.is_object() {
        *ext = Value::Object(Map::new());
    }
    if let Value::Object(e) = ext {
        e.insert(TASKS_EXTENSION.into(), json!({}));
    }
    let mut r = Map::new();
    r.insert("supportedVersions".into(), json!([PROTOCOL_VERSION]));
    r.insert("capabilities".into(), Value::Object(caps));
    if let Some(i) = &info.instructions {
        r.insert("instructions".into(), Value::from(i.clone()));
    }
    results::complete(Method::ServerDiscover, Value::Object(r), &info.server_info)
}

fn error_200<P>(req: &Request<P>, err: RpcError) -> Response<Body> {
    reply::rpc_error(StatusCode::OK, Some(&req.id), &err)
}

/// Serve one validated request for `upstream`; `received` is when the HTTP request
/// arrived (the start of `sync_timeout_ms`, docs/design.md §2 "Clients without the
/// tasks extension").
pub async fn dispatch(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    req: ValidRequest,
    received: Instant,
) -> Response<Body> {
    // Capability checks that need no upstream (docs/design.md §12 "Order of checks":
    // capability → limits → params and ownership).
    if req.method.is_task_method() && !req.meta.caps.declares_tasks() {
        return reply::rpc_error(
            StatusCode::BAD_REQUEST,
            Some(&req.id),
            &RpcError::tasks_extension_required(format!(
                "{} requires the tasks extension to be declared",
                req.method
            )),
        );
    }
    if let Params::Listen(listen) = &req.params
        && listen.asks_task_ids
        && !req.meta.caps.declares_tasks()
    {
        return reply::rpc_error(
            StatusCode::BAD_REQUEST,
            Some(&req.id),
            &RpcError::tasks_extension_required(
                "subscriptions/listen with taskIds requires the tasks extension",
            ),
        );
    }

    // The task plane never depends on the upstream plane (README "Task plane and
    // upstream plane"): tasks/* and listen answer from the store with the identity
    // known now, whether the upstream is down, restarting or warming up. Everything
    // else needs the upstream and gets the retry-safety 503 while it is not there
    // (tasks::failure).
    let task_plane = req.method.is_task_plane();
    // A replica that lost its lease takes no new upstream calls: another replica may
    // already be failing its calls (docs/design.md §18). Tasks stay readable.
    // Nor does one an operator drained (docs/design.md §24).
    if !task_plane && let Some(refused) = reply::not_accepting(&gw.engine, Some(&req.id)) {
        return refused;
    }
    let info = if task_plane {
        upstream.identity()
    } else {
        match Box::pin(upstream.info()).await {
            Ok(i) => i,
            Err(e) => {
                return inline::upstream_failure(&req.id, upstream.name(), &e).into_response();
            }
        }
    };

    // Methods the upstream does not declare answer 404, matching `server/discover`
    // (docs/design.md §14 "Upstream sessions").
    if let Some(cap) = req.method.capability()
        && !info.capabilities.contains_key(cap)
    {
        return reply::rpc_error(
            StatusCode::NOT_FOUND,
            Some(&req.id),
            &RpcError::method_not_found(req.method.as_str()),
        );
    }

    // ---- limits (docs/design.md §8 "Flow control") ----
    // Order: capability → rate limits → params and ownership.
    if let Err(t) = check_limits(gw, upstream, &principal, &req) {
        return inline::render(&req.id, Reply::Failed(Failure::throttled(t)));
    }
    // ---- end limits ----

    // Every awaited arm but `tasks/get` awaits its future boxed, so that
    // the state of the largest (a `tools/call`) is not the size of every request's
    // (see `serve_rpc`).
    let (req, params) = req.split();
    match params {
        Params::Discover => reply::json(
            StatusCode::OK,
            &protocol::response(&req.id, discover_result(&info)),
        ),
        Params::TaskGet(task) => {
            let r = gw
                .engine
                .get(&principal, upstream.name(), &task, &info.server_info);
            task_reply(&req, r.await)
        }
        Params::TaskUpdate(update) => {
            let r = gw
                .engine
                .update(&principal, upstream.name(), update, &info.server_info);
            task_reply(&req, Box::pin(r).await)
        }
        Params::TaskCancel(task) => {
            let r = gw
                .engine
                .cancel(&principal, upstream.name(), &task, &info.server_info);
            task_reply(&req, Box::pin(r).await)
        }
        Params::Listen(listen) => {
            super::subscriptions::open(upstream, &principal, &req.id, &listen, &info, gw)
        }
        Params::ToolsCall(p) => {
            Box::pin(tools_call(
                gw,
                upstream,
                principal,
                req.with(p),
                info.server_info.clone(),
                received,
            ))
            .await
        }
        Params::Forward(fwd) => {
            if req.method == Method::ToolsList && !fwd.asks_page() {
                // Served from the session's cache, outside the inline race: bounded by
                // the same `sync_timeout_ms` here, or a stalled upstream would hold
                // the request forever.
                let listed = Box::pin(tokio::time::timeout_at(
                    sync_deadline(gw, received),
                    upstream.tools_list(&principal),
                ));
                let Ok(listed) = listed.await else {
                    return sync_timed_out(gw, &req, upstream);
                };
                return match listed {
                    Ok(crate::upstream::CallOutcome::Result(v)) => reply::json(
                        StatusCode::OK,
                        &protocol::response(
                            &req.id,
                            results::complete(Method::ToolsList, v, &info.server_info),
                        ),
                    ),
                    Ok(crate::upstream::CallOutcome::Error(e)) => {
                        error_200(&req, results::map_error(e))
                    }
                    Err(e) => {
                        inline::upstream_failure(&req.id, upstream.name(), &e).into_response()
                    }
                };
            }
            Box::pin(inline_or_resume(
                gw,
                upstream,
                principal,
                req.with(fwd),
                info.server_info.clone(),
                received,
            ))
            .await
        }
    }
}

/// Request rate, poll rate and queue room (docs/design.md §8 "Flow control"). A
/// throttled poll costs no store read: the limiter runs before the task is resolved,
/// and only for a well-formed id (a malformed one is rejected by `resolve` without a
/// read).
fn check_limits(
    gw: &Gateway,
    upstream: &Upstream,
    principal: &Principal,
    req: &ValidRequest,
) -> Result<(), crate::limits::Throttled> {
    let limits = &gw.limits;
    limits.check_request(principal)?;
    if let Params::TaskGet(task) = &req.params {
        if let Some(id) = task.task_id.valid()
            && crate::tasks::ids::is_well_formed(id)
        {
            limits.check_poll(principal, id)?;
        }
    } else if req.method.takes_queue_slot()
        && req
            .params
            .forward()
            .is_none_or(|f| f.mrtr.request_state == Field::Absent)
    {
        // An MRTR retry resumes a call that already holds its slot.
        limits.check_queue(upstream.name(), upstream.cfg.max_concurrency, principal)?;
    }
    Ok(())
}

/// The answer of a tasks method: its result written inside the JSON-RPC envelope
/// (a `tasks/get` result serializes itself from the snapshot).
fn task_reply<T: serde::Serialize>(req: &Request<()>, r: Result<T, Failure>) -> Response<Body> {
    match r {
        Ok(v) => reply::json(StatusCode::OK, &protocol::ResponseOf::new(&req.id, v)),
        Err(f) => inline::render(&req.id, Reply::Failed(f)),
    }
}

/// A `tools/call` of a 2026 client: the engine decides ([`Engine::call_tool`]), the
/// front renders (a task handle, an inline call held open, a relayed MRTR retry).
///
/// [`Engine::call_tool`]: crate::tasks::Engine::call_tool
async fn tools_call(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    req: Request<ToolCallParams>,
    server_info: Value,
    received: Instant,
) -> Response<Body> {
    let id = req.id.clone();
    let caller = if req.meta.caps.declares_tasks() {
        Caller::Tasks
    } else {
        Caller::Plain
    };
    let call = ToolCallRequest {
        upstream: upstream.clone(),
        principal: principal.clone(),
        req,
        server_info: server_info.clone(),
        caller,
        received,
        timing: gw.inline_timing(),
        holds: gw.holds.clone(),
    };
    match gw.engine.call_tool(call).await {
        ToolReply::Reply(r) => inline::Final::of_call(&id, r, &server_info).into_response(),
        ToolReply::Inline { pending, req } => {
            let (req, params) = req.split();
            let c = Inline {
                engine: gw.engine.clone(),
                upstream: upstream.clone(),
                principal,
                req: req.with(params.fwd),
                server_info,
                timing: gw.inline_timing(),
                holds: gw.holds.clone(),
                received,
            };
            inline::serve(c, pending).await
        }
        ToolReply::Elsewhere { replica, req } => {
            relay::retry_at(gw, &replica, upstream, &principal, &req).await
        }
    }
}

/// When `sync_timeout_ms` runs out for a request that arrived at `received` (README
/// "Tasks walkthrough": clients without the extension are held up to it).
fn sync_deadline(gw: &Gateway, received: Instant) -> Instant {
    received + gw.cfg.tasks.sync_timeout
}

/// The answer once `sync_timeout_ms` passed outside the inline race.
fn sync_timed_out<P>(gw: &Gateway, req: &Request<P>, upstream: &Upstream) -> Response<Body> {
    let after = gw.cfg.tasks.sync_timeout;
    inline::Final::failed(&req.id, upstream.name(), CallFailure::SyncTimeout(after)).into_response()
}

impl Gateway {
    pub fn inline_timing(&self) -> InlineTiming {
        InlineTiming {
            keepalive: self.cfg.server.keepalive,
            sync_timeout: self.cfg.tasks.sync_timeout,
        }
    }
}

/// Serve inline, resuming a held call when the request is an MRTR retry.
async fn inline_or_resume(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    req: Request<Forward>,
    server_info: Value,
    received: Instant,
) -> Response<Body> {
    let resumed = mrtr_retry(&gw.holds, upstream.name(), &principal, &req, &server_info);
    let c = Inline {
        engine: gw.engine.clone(),
        upstream: upstream.clone(),
        principal,
        req,
        server_info,
        timing: gw.inline_timing(),
        holds: gw.holds.clone(),
        received,
    };
    match resumed {
        None => inline::run(c).await,
        Some(Retry::Answer(r)) => inline::render(&c.req.id, r),
        Some(Retry::Elsewhere(replica)) => {
            relay::retry_at(gw, &replica, &c.upstream, &c.principal, &c.req).await
        }
        Some(Retry::Resumed(pending)) => inline::serve(c, pending).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discover_strips_legacy_tasks() {
        let info = UpstreamInfo {
            protocol_version: "2025-11-25".into(),
            capabilities: serde_json::from_value(json!({"tools":{},"tasks":{"list":{}}})).unwrap(),
            server_info: json!({"name":"u","version":"1"}),
            instructions: Some("hi".into()),
        };
        let d = discover_result(&info);
        assert!(d["capabilities"].get("tasks").is_none());
        assert_eq!(d["capabilities"]["extensions"][TASKS_EXTENSION], json!({}));
        assert_eq!(d["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(d["instructions"], "hi");
        assert_eq!(d["resultType"], "complete");
    }
}
