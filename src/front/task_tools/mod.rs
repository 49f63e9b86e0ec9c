//! The task tools of a plain client (docs/design.md §28 "Task handles for plain
//! clients"): on an endpoint where a tool answers plain clients with a handle, their
//! `tools/list` carries `<prefix>task_status`, `<prefix>task_cancel` and
//! `<prefix>task_list`, and a `tools/call` of one is answered here, from the store —
//! task plane, not upstream plane: no upstream queue slot, whatever the upstream's
//! state. A tasks client never sees them: its calls of those names go to the upstream
//! like any other name.
//!
//! `rows.rs` says what each answer is, `listing.rs` what the list becomes,
//! `status.rs` how a status call waits.

pub(super) mod listing;
mod rows;
mod status;

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::Value;

use super::answer::{self, Final};
use super::answers::{Answers, Ctx, Envelope, HeldCall, Listed};
use super::held::{Deadline, Promote, Promoted};
use super::relay;
use super::reply::{self, Body};
use crate::protocol::param_headers::{ParamHeader, ToolHeaders};
use crate::protocol::params::{Params, TaskRef, ToolCallParams};
use crate::protocol::{Request, RequestId, RpcError, ValidRequest};
use crate::store::TaskRecord;
use crate::tasks::{Adopted, Engine, Handle, Pending, Reply, Retry};
use crate::upstream::Upstream;
pub(crate) use rows::TaskTool;
use status::StatusCall;

/// The most tasks `task_list` shows.
const LIST_MOST: usize = 20;

/// Whether `upstream`'s endpoint offers handles to plain clients now: configured, and
/// no tool of the upstream bears a task tool's name (then nothing is shadowed and the
/// endpoint holds, docs/design.md §28).
pub(super) fn offered(ctx: &Ctx<'_>) -> bool {
    ctx.upstream.cfg.offers_handles() && !ctx.gw.task_tools_shadowed(ctx.upstream)
}

/// The task tool a request calls, when it is one a plain client of this endpoint may
/// call.
pub(super) fn called<A: Answers>(ctx: &Ctx<'_>, req: &ValidRequest, era: &A) -> Option<TaskTool> {
    let Params::ToolsCall(p) = &req.params else {
        return None;
    };
    let name = p.name.valid()?;
    let tool = TaskTool::named(&ctx.gw.cfg.tasks.task_tools_prefix, name)?;
    (era.plain(req) && offered(ctx)).then_some(tool)
}

/// The header map a 2026 `tools/call` of `tool` is checked against: the upstream's,
/// but for `task_status` on an endpoint that offers handles, whose `taskId` travels as
/// `Mcp-Param-Task-Id` (SEP-2243). Only that call builds a map of its own.
pub(super) fn tool_headers(
    gw: &super::gateway::Gateway,
    upstream: &Upstream,
    tool: &str,
) -> Option<Arc<ToolHeaders>> {
    let prefix = &gw.cfg.tasks.task_tools_prefix;
    if TaskTool::named(prefix, tool) != Some(TaskTool::Status)
        || !upstream.cfg.offers_handles()
        || gw.task_tools_shadowed(upstream)
    {
        return upstream.tool_headers_to_check();
    }
    let mut map = ToolHeaders::default();
    map.insert(
        tool.to_string(),
        vec![ParamHeader {
            name: TaskTool::TASK_ID_HEADER.into(),
            property: "taskId".into(),
        }],
    );
    Some(Arc::new(map))
}

/// Serve a call of a task tool (see [`called`]).
pub(super) async fn serve<A: Answers>(
    ctx: &Ctx<'_>,
    req: ValidRequest,
    tool: TaskTool,
    era: &A,
) -> Response<Body> {
    let gw = ctx.gw;
    // They count toward the request rate like any request (docs/design.md §8).
    if let Err(t) = gw.limits.check_request(&ctx.principal) {
        return answer::render(&req.id, Reply::Failed(crate::tasks::Failure::throttled(t)));
    }
    let server_info = ctx.upstream.identity().server_info.clone();
    let (req, params) = req.split();
    let Params::ToolsCall(p) = params else {
        return reply::rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(&req.id),
            &RpcError::internal("not a tools/call"),
        );
    };
    let req = req.with(p);
    match tool {
        TaskTool::Status => task_status(ctx, req, server_info, era).await,
        TaskTool::Cancel => task_cancel(ctx, &req, &server_info, era).await,
        TaskTool::List => task_list(ctx, &req.id, &server_info, era).await,
    }
}

/// `arguments.taskId`, well-formed, or the `-32602` `tasks/get` gives (no store read).
fn task_id_of(p: &ToolCallParams) -> Result<String, RpcError> {
    let id = p
        .arguments()
        .into_valid()
        .and_then(|a| a.get("taskId"))
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params("arguments.taskId must be a string"))?;
    if !crate::tasks::is_well_formed(id) {
        return Err(RpcError::invalid_params("malformed task id"));
    }
    Ok(id.to_string())
}

/// `arguments.waitSeconds`: absent is 0; anything but a non-negative integer is
/// `-32602`.
fn wait_seconds_of(p: &ToolCallParams) -> Result<u64, RpcError> {
    match p
        .arguments()
        .into_valid()
        .and_then(|a| a.get("waitSeconds"))
    {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_u64().ok_or_else(|| {
            RpcError::invalid_params("arguments.waitSeconds must be a non-negative integer")
        }),
    }
}

fn invalid(id: &RequestId, e: RpcError) -> Response<Body> {
    answer::render(id, Reply::Complete(Err(e)))
}

/// A task tool's answer, as the era writes an inline `tools/call` result.
fn tool_result<A: Answers>(
    era: &A,
    id: &RequestId,
    v: Value,
    server_info: &Value,
) -> Response<Body> {
    let v = (era.tool_result_envelope())(v, server_info);
    Final::ok(crate::protocol::response(id, v)).into_response()
}

async fn task_status<A: Answers>(
    ctx: &Ctx<'_>,
    req: Request<ToolCallParams>,
    server_info: Value,
    era: &A,
) -> Response<Body> {
    let gw = ctx.gw;
    let name = ctx.upstream.name();
    // The retry of an MRTR round this call asked: it resumes the held call with the
    // client's answers.
    let pending = match gw
        .engine
        .mrtr_retry(name, &ctx.principal, &req, &server_info)
    {
        Some(Retry::Resumed(pending)) => pending,
        Some(Retry::Answer(r)) => return answer::render(&req.id, r),
        Some(Retry::Elsewhere(replica)) => {
            return relay::retry_at(gw, &replica, ctx.upstream, &ctx.principal, &req).await;
        }
        None => {
            let task_id = match task_id_of(&req.params) {
                Ok(t) => t,
                Err(e) => return invalid(&req.id, e),
            };
            let wait_s = match wait_seconds_of(&req.params) {
                Ok(w) => w,
                Err(e) => return invalid(&req.id, e),
            };
            let max_wait = gw.cfg.tasks.max_status_wait;
            let Some(slot) = gw.limits.enter_status(&ctx.principal, &task_id) else {
                // More at once than the poll burst: a hint a model can act on.
                crate::metrics::throttled(crate::limits::Reason::PollInterval.as_str());
                let after = rows::seconds(crate::config::as_millis(gw.cfg.tasks.poll_interval));
                return tool_result(era, &req.id, rows::polled_too_often(after), &server_info);
            };
            let call = StatusCall {
                engine: gw.engine.clone(),
                limits: gw.limits.clone(),
                principal: ctx.principal.clone(),
                upstream: name.to_string(),
                task_id,
                wait: std::time::Duration::from_secs(wait_s).min(max_wait),
                max_wait,
                caps: era.input_caps(&req),
                prefix: gw.cfg.tasks.task_tools_prefix.clone(),
                _slot: slot,
            };
            call.start(gw.cfg.tasks.input_gather)
        }
    };
    let (req, params) = req.split();
    let call = HeldCall {
        ctx,
        req: req.with(params.fwd),
        pending,
        server_info,
        promote: None,
    };
    era.held(call).await
}

async fn task_cancel<A: Answers>(
    ctx: &Ctx<'_>,
    req: &Request<ToolCallParams>,
    server_info: &Value,
    era: &A,
) -> Response<Body> {
    let task_id = match task_id_of(&req.params) {
        Ok(t) => t,
        Err(e) => return invalid(&req.id, e),
    };
    let engine = &ctx.gw.engine;
    let name = ctx.upstream.name();
    let task = TaskRef::to(&task_id);
    let cancelled = Box::pin(engine.cancel(&ctx.principal, name, &task, server_info)).await;
    let read = match cancelled {
        Ok(_) => engine.resolve(&ctx.principal, name, &task).await,
        Err(f) => Err(f),
    };
    let v = match read {
        Ok(rec) => rows::cancelled(&task_id, rec.status),
        Err(f) if matches!(f.class, crate::tasks::ErrorClass::RetryLater(_)) => {
            return answer::render(&req.id, Reply::Failed(f));
        }
        Err(f) if crate::tasks::is_expired(&f) => rows::expired(&task_id),
        Err(_) => rows::not_found(),
    };
    tool_result(era, &req.id, v, server_info)
}

async fn task_list<A: Answers>(
    ctx: &Ctx<'_>,
    id: &RequestId,
    server_info: &Value,
    era: &A,
) -> Response<Body> {
    let engine = &ctx.gw.engine;
    let name = ctx.upstream.name();
    // The owner index runs oldest first: read it through, keeping the newest.
    let mut newest = std::collections::VecDeque::with_capacity(LIST_MOST + 1);
    let mut cursor: Option<String> = None;
    loop {
        let page = engine
            .list_owned(
                &ctx.principal,
                name,
                cursor.as_deref(),
                crate::tasks::MAX_PAGE,
            )
            .await;
        let (recs, next) = match page {
            Ok(p) => p,
            Err(f) => return answer::render(id, Reply::Failed(f)),
        };
        for r in recs {
            newest.push_back(r);
            if newest.len() > LIST_MOST {
                newest.pop_front();
            }
        }
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let recs: Vec<_> = newest.into_iter().rev().collect();
    tool_result(era, id, rows::list(&recs), server_info)
}

/// What a `tools/list` first page becomes on this endpoint (docs/design.md §28): for
/// a plain client, handle-mode tools lose their `outputSchema` and the task tools
/// follow; on an endpoint that offers handles every list is private, since lists
/// differ by client kind. A collision turns the endpoint back to hold (noted here).
pub(super) fn shape_list(ctx: &Ctx<'_>, list: &mut Value, plain: bool) -> Listed {
    if !ctx.upstream.cfg.offers_handles() {
        return Listed::default();
    }
    let prefix = &ctx.gw.cfg.tasks.task_tools_prefix;
    if listing::collides(list, prefix) {
        ctx.gw.note_task_tools_shadowed(ctx.upstream);
        return Listed::default();
    }
    if !plain {
        return Listed {
            tools: Vec::new(),
            private: true,
        };
    }
    listing::strip_output_schemas(list, &ctx.upstream.cfg);
    let max_wait_s = rows::seconds(crate::config::as_millis(ctx.gw.cfg.tasks.max_status_wait));
    Listed {
        tools: listing::definitions(prefix, max_wait_s),
        private: true,
    }
}

fn max_wait_s(ctx: &Ctx<'_>) -> u64 {
    rows::seconds(crate::config::as_millis(ctx.gw.cfg.tasks.max_status_wait))
}

/// The answer to a plain client's call that became a task: its handle, as the era
/// writes a tool result.
pub(super) fn handle_answer(
    ctx: &Ctx<'_>,
    id: &RequestId,
    rec: &TaskRecord,
    server_info: &Value,
    envelope: Envelope,
) -> Final {
    let v = rows::handle(rec, &ctx.gw.cfg.tasks.task_tools_prefix, max_wait_s(ctx));
    Final::ok(crate::protocol::response(id, envelope(v, server_info)))
}

/// The deadline of a plain client's held call of a handle-mode tool: the engine makes
/// it a task then, and its handle is the call's answer.
pub(super) fn promoter<A: Answers>(
    ctx: &Ctx<'_>,
    id: RequestId,
    handle: Box<Handle>,
    server_info: &Value,
    era: &A,
) -> Deadline {
    let at = handle.at();
    let p = HandlePromoter {
        engine: ctx.gw.engine.clone(),
        handle,
        id,
        server_info: server_info.clone(),
        prefix: ctx.gw.cfg.tasks.task_tools_prefix.clone(),
        max_wait_s: max_wait_s(ctx),
        envelope: era.tool_result_envelope(),
    };
    (at, Box::new(p))
}

struct HandlePromoter {
    engine: Arc<Engine>,
    handle: Box<Handle>,
    id: RequestId,
    server_info: Value,
    prefix: String,
    max_wait_s: u64,
    envelope: Envelope,
}

impl Promote for HandlePromoter {
    fn promote(self: Box<Self>, pending: Pending) -> Promoted {
        Box::pin(async move {
            let s = *self;
            match s.engine.adopt(s.handle, pending).await {
                Adopted::Task(rec) => {
                    let v = rows::handle(&rec, &s.prefix, s.max_wait_s);
                    Ok(Final::ok(crate::protocol::response(
                        &s.id,
                        (s.envelope)(v, &s.server_info),
                    )))
                }
                Adopted::Kept(pending) => Err(pending),
                Adopted::Failed(r) => Ok(Final::of(&s.id, r)),
            }
        })
    }
}
