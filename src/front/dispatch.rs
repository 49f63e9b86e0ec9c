//! The dispatch both eras share (docs/design.md §12 "Order of checks", §22 "Clients
//! of the 2025 era"): a typed request (`protocol::Request<Params>`, of either era)
//! passes the capability and limit checks — the poll limiter and the queue room
//! included — and goes to what serves it: the front itself (`server/discover`,
//! `subscriptions/listen`), the tasks methods, the engine's one entry for a tool call,
//! or the upstream. What differs by era once a request is typed is how a few answers
//! are written (`Answers`): `Modern` here, the session's in `legacy/`.

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::answer::{self, Final};
pub(super) use super::answers::{Answers, Ctx, Envelope, HeldCall, Listed};
use super::gateway::Gateway;
use super::inline::{self, Inline, InlineTiming};
use super::relay;
use super::reply::{self, Body};
use super::wire::ValidRequest;
use crate::auth::Principal;
use crate::protocol::meta::ClientCaps;
use crate::protocol::params::{Field, Forward, Params, TaskRef, ToolCallParams};
use crate::protocol::{
    self, Method, PROTOCOL_VERSION, Request, RequestId, RpcError, TASKS_EXTENSION, results,
};
use crate::store::TaskRecord;
use crate::tasks::{CallFailure, Failure};
use crate::tasks::{Caller, Retry, ToolCallRequest};
use crate::tasks::{Reply, ToolReply};
use crate::upstream::{CallOutcome, Scope, Upstream, UpstreamError, UpstreamInfo};

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

/// A 2026-07-28 client.
pub(super) struct Modern;

impl Answers for Modern {
    fn declares_tasks(&self, req: &ValidRequest) -> bool {
        req.meta.caps.declares_tasks()
    }

    /// 404, matching `server/discover` (docs/design.md §14 "Upstream sessions").
    fn missing_method_status(&self) -> StatusCode {
        StatusCode::NOT_FOUND
    }

    fn caller(&self, req: &Request<ToolCallParams>) -> Caller {
        if req.meta.caps.declares_tasks() {
            Caller::Tasks
        } else {
            Caller::Plain
        }
    }

    fn plain(&self, req: &ValidRequest) -> bool {
        !req.meta.caps.declares_tasks()
    }

    fn input_caps(&self, req: &Request<ToolCallParams>) -> ClientCaps {
        req.meta.caps.clone()
    }

    /// `resultType` and `serverInfo`, as an upstream's result gets them.
    fn tool_result_envelope(&self) -> Envelope {
        |result, server_info| results::complete(Method::ToolsCall, result, server_info)
    }

    fn scope<'a>(&'a self, principal: &'a Principal) -> Scope<'a> {
        principal.into()
    }

    fn session(&self) -> Option<String> {
        None
    }

    fn tools_listed(
        &self,
        id: &RequestId,
        mut list: Value,
        server_info: &Value,
        extra: Listed,
    ) -> Response<Body> {
        extra.append_to(&mut list);
        if extra.private
            && let Some(o) = list.as_object_mut()
        {
            // Whatever the upstream said: the list differs by client kind.
            o.insert("cacheScope".into(), Value::from("private"));
        }
        reply::json(
            StatusCode::OK,
            &protocol::response(id, results::complete(Method::ToolsList, list, server_info)),
        )
    }

    fn list_error(&self, e: RpcError) -> RpcError {
        results::map_error(e)
    }

    /// `-32021` naming the tasks extension (README "Tasks walkthrough": clients
    /// without the extension are held up to `sync_timeout_ms`).
    fn sync_timed_out(&self, ctx: &Ctx<'_>, id: &RequestId) -> Final {
        let after = ctx.gw.cfg.tasks.sync_timeout;
        Final::failed(id, ctx.upstream.name(), CallFailure::SyncTimeout(after))
    }

    async fn task_created(
        &self,
        _ctx: &Ctx<'_>,
        id: &RequestId,
        rec: &TaskRecord,
        server_info: &Value,
    ) -> Response<Body> {
        reply::json(
            StatusCode::OK,
            &protocol::response(id, crate::tasks::create_result(rec, server_info)),
        )
    }

    async fn held(&self, call: HeldCall<'_>) -> Response<Body> {
        let ctx = call.ctx;
        let c = Inline {
            engine: ctx.gw.engine.clone(),
            upstream: ctx.upstream.clone(),
            principal: ctx.principal.clone(),
            req: call.req,
            server_info: call.server_info,
            timing: ctx.gw.inline_timing(),
            received: ctx.received,
        };
        inline::serve(c, call.pending, call.promote).await
    }

    async fn task_get(
        &self,
        ctx: &Ctx<'_>,
        id: &RequestId,
        task: TaskRef,
        info: &UpstreamInfo,
    ) -> Response<Body> {
        let r = ctx.gw.engine.get(
            &ctx.principal,
            ctx.upstream.name(),
            &task,
            &info.server_info,
        );
        task_reply(id, r.await)
    }

    async fn task_cancel(
        &self,
        ctx: &Ctx<'_>,
        id: &RequestId,
        task: TaskRef,
        info: &UpstreamInfo,
    ) -> Response<Body> {
        let r = ctx.gw.engine.cancel(
            &ctx.principal,
            ctx.upstream.name(),
            &task,
            &info.server_info,
        );
        task_reply(id, Box::pin(r).await)
    }
}

/// Serve one validated 2026 request for `upstream`; `received` is when the HTTP
/// request arrived.
pub async fn dispatch(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    req: ValidRequest,
    received: Instant,
) -> Response<Body> {
    let ctx = Ctx {
        gw,
        upstream,
        principal,
        received,
    };
    serve(&ctx, req, &Modern).await
}

/// Serve one typed request of either era: capability → limits → what serves it
/// (docs/design.md §12 "Order of checks").
pub(super) async fn serve<A: Answers>(ctx: &Ctx<'_>, req: ValidRequest, era: &A) -> Response<Body> {
    let (gw, upstream) = (ctx.gw, ctx.upstream);
    // Capability checks that need no upstream.
    if req.method.is_task_method() && !era.declares_tasks(&req) {
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
        && !era.declares_tasks(&req)
    {
        return reply::rpc_error(
            StatusCode::BAD_REQUEST,
            Some(&req.id),
            &RpcError::tasks_extension_required(
                "subscriptions/listen with taskIds requires the tasks extension",
            ),
        );
    }

    // The task tools of a plain client are task plane (docs/design.md §28).
    if let Some(tool) = super::task_tools::called(ctx, &req, era) {
        return Box::pin(super::task_tools::serve(ctx, req, tool, era)).await;
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
                return answer::upstream_failure(&req.id, upstream.name(), &e).into_response();
            }
        }
    };

    // Methods the upstream does not declare answer `-32601` (docs/design.md §14
    // "Upstream sessions").
    if let Some(cap) = req.method.capability()
        && !info.capabilities.contains_key(cap)
    {
        return reply::rpc_error(
            era.missing_method_status(),
            Some(&req.id),
            &RpcError::method_not_found(req.method.as_str()),
        );
    }

    // ---- limits (docs/design.md §8 "Flow control") ----
    // Order: capability → rate limits → params and ownership.
    if let Err(t) = check_limits(gw, upstream, &ctx.principal, &req) {
        return answer::render(&req.id, Reply::Failed(Failure::throttled(t)));
    }
    // ---- end limits ----

    // Every awaited arm but `tasks/get` awaits its future boxed, so that the state of
    // the largest (a `tools/call`) is not the size of every request's (ARCHITECTURE.md
    // "The request path").
    let plain = era.plain(&req);
    let (req, params) = req.split();
    match params {
        Params::Discover => reply::json(
            StatusCode::OK,
            &protocol::response(&req.id, discover_result(&info)),
        ),
        Params::TaskGet(task) => era.task_get(ctx, &req.id, task, &info).await,
        Params::TaskUpdate(update) => {
            let r = gw
                .engine
                .update(&ctx.principal, upstream.name(), update, &info.server_info);
            task_reply(&req.id, Box::pin(r).await)
        }
        Params::TaskCancel(task) => Box::pin(era.task_cancel(ctx, &req.id, task, &info)).await,
        Params::Listen(listen) => {
            super::subscriptions::open(upstream, &ctx.principal, &req.id, &listen, &info, gw)
        }
        Params::ToolsCall(p) => {
            Box::pin(tools_call(ctx, req.with(p), info.server_info.clone(), era)).await
        }
        Params::Forward(fwd) => {
            if req.method == Method::ToolsList && !fwd.asks_page() {
                let list = tools_list(ctx, &req.id, &info.server_info, plain, era);
                return Box::pin(list).await;
            }
            Box::pin(forward(ctx, req.with(fwd), info.server_info.clone(), era)).await
        }
    }
}

/// The first page of `tools/list`, from the session's cache, outside the inline race:
/// bounded by the same `sync_timeout_ms` here, or a stalled upstream would hold the
/// request forever.
async fn tools_list<A: Answers>(
    ctx: &Ctx<'_>,
    id: &RequestId,
    server_info: &Value,
    plain: bool,
    era: &A,
) -> Response<Body> {
    let listed = tokio::time::timeout_at(
        ctx.received + ctx.gw.cfg.tasks.sync_timeout,
        ctx.upstream.tools_list(era.scope(&ctx.principal)),
    );
    match listed.await {
        Err(_) => era.sync_timed_out(ctx, id).into_response(),
        Ok(Ok(CallOutcome::Result(mut v))) => {
            let extra = super::task_tools::shape_list(ctx, &mut v, plain);
            era.tools_listed(id, v, server_info, extra)
        }
        Ok(Ok(CallOutcome::Error(e))) => {
            reply::rpc_error(StatusCode::OK, Some(id), &era.list_error(e))
        }
        Ok(Err(e)) => upstream_failed(ctx, id, &e),
    }
}

fn upstream_failed(ctx: &Ctx<'_>, id: &RequestId, e: &UpstreamError) -> Response<Body> {
    answer::upstream_failure(id, ctx.upstream.name(), e).into_response()
}

/// Request rate, poll rate and queue room (docs/design.md §8 "Flow control"), for
/// both eras. A throttled poll costs no store read: the limiter runs before the task
/// is resolved, and only for a well-formed id (a malformed one is rejected by
/// `resolve` without a read).
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
            && crate::tasks::is_well_formed(id)
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
fn task_reply<T: serde::Serialize>(id: &RequestId, r: Result<T, Failure>) -> Response<Body> {
    match r {
        Ok(v) => reply::json(StatusCode::OK, &protocol::ResponseOf::new(id, v)),
        Err(f) => answer::render(id, Reply::Failed(f)),
    }
}

/// A `tools/call`: the engine decides ([`Engine::call_tool`]), the era renders (a task
/// handle, an inline call held open, a relayed MRTR retry).
///
/// [`Engine::call_tool`]: crate::tasks::Engine::call_tool
async fn tools_call<A: Answers>(
    ctx: &Ctx<'_>,
    req: Request<ToolCallParams>,
    server_info: Value,
    era: &A,
) -> Response<Body> {
    let gw = ctx.gw;
    let id = req.id.clone();
    let caller = era.caller(&req);
    // A caller that cannot take a task gets its handle as a tool result (§28).
    let plain = matches!(caller, Caller::Plain | Caller::Session(_));
    let call = ToolCallRequest {
        upstream: ctx.upstream,
        principal: &ctx.principal,
        caller,
        req,
        server_info: &server_info,
        received: ctx.received,
        timing: gw.inline_timing(),
        handles: plain && super::task_tools::offered(ctx),
    };
    match gw.engine.call_tool(call).await {
        ToolReply::Reply(Reply::Task(rec)) if plain => super::task_tools::handle_answer(
            ctx,
            &id,
            &rec,
            &server_info,
            era.tool_result_envelope(),
        )
        .into_response(),
        ToolReply::Reply(Reply::Task(rec)) => era.task_created(ctx, &id, &rec, &server_info).await,
        ToolReply::Reply(r) => Final::of(&id, r).into_response(),
        ToolReply::Inline {
            pending,
            req,
            handle,
        } => {
            let (req, params) = req.split();
            let promote = handle
                .map(|h| super::task_tools::promoter(ctx, req.id.clone(), h, &server_info, era));
            let call = HeldCall {
                ctx,
                req: req.with(params.fwd),
                pending,
                server_info,
                promote,
            };
            era.held(call).await
        }
        ToolReply::Elsewhere { replica, req } => {
            relay::retry_at(gw, &replica, ctx.upstream, &ctx.principal, &req).await
        }
    }
}

impl Gateway {
    pub fn inline_timing(&self) -> InlineTiming {
        InlineTiming {
            keepalive: self.cfg.server.keepalive,
            sync_timeout: self.cfg.tasks.sync_timeout,
        }
    }
}

/// Any other method the upstream answers: forwarded and held open, or resumed when
/// it is an MRTR retry.
async fn forward<A: Answers>(
    ctx: &Ctx<'_>,
    req: Request<Forward>,
    server_info: Value,
    era: &A,
) -> Response<Body> {
    let gw = ctx.gw;
    let name = ctx.upstream.name();
    let pending = match gw
        .engine
        .mrtr_retry(name, &ctx.principal, &req, &server_info)
    {
        None => {
            let want_progress = req.meta.progress_token.is_some();
            let mut spec = crate::tasks::upstream_spec(req.method, &req.params, want_progress);
            spec.session = era.session();
            gw.engine.start_call(ctx.upstream, &ctx.principal, spec)
        }
        Some(Retry::Resumed(pending)) => pending,
        Some(Retry::Answer(r)) => return answer::render(&req.id, r),
        Some(Retry::Elsewhere(replica)) => {
            return relay::retry_at(gw, &replica, ctx.upstream, &ctx.principal, &req).await;
        }
    };
    let call = HeldCall {
        ctx,
        req,
        pending,
        server_info,
        promote: None,
    };
    era.held(call).await
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
