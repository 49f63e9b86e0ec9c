//! Task handles for plain clients (docs/design.md §28): a plain client's call of a
//! tool in handle mode is an inline call like any until its deadline (`call.rs`
//! decides it has one, and the front's held-call responder relays its input the
//! era's way); at the deadline the responder hands it back here ([`adopt`]) and it
//! becomes a task exactly as a tasks client's call does in the deadline race — owner,
//! ttl, quota, written and flushed before the handle goes out.

use std::sync::Arc;

use serde_json::Value;
use tokio::time::Instant;

use super::engine::Engine;
use super::events::Pending;
use super::outcome::Reply;
use super::promote::Promotion;
use super::tool_call::{
    ToolCall, arguments_fingerprint, launch, new_record, new_route, store_failed_after_send,
};
use crate::auth::Principal;
use crate::protocol::Request;
use crate::protocol::params::ToolCallParams;
use crate::store::TaskRecord;
use crate::upstream::Upstream;

/// A running inline call that becomes a task at its deadline: the call's parts, kept
/// past the request that borrowed them.
pub struct Handle {
    at: Instant,
    upstream: Arc<Upstream>,
    principal: Principal,
    server_info: Value,
    req: Request<ToolCallParams>,
    tool: String,
    promotion: Promotion,
    answer_undeclared: bool,
}

impl Handle {
    pub(super) fn new(at: Instant, c: ToolCall<'_>) -> Self {
        Self {
            at,
            upstream: c.upstream.clone(),
            principal: c.principal.clone(),
            server_info: c.server_info.clone(),
            req: c.req,
            tool: c.tool,
            promotion: c.promotion,
            answer_undeclared: c.answer_undeclared,
        }
    }

    /// When the call becomes a task.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// What [`Engine::adopt`](crate::tasks::Engine::adopt) made of a call at its deadline.
pub enum Adopted {
    /// A task, durable: the handle goes out.
    Task(Arc<TaskRecord>),
    /// It cannot become a task now (the tenant is at its live-task quota, or being
    /// purged): the call is held on, as in hold mode.
    Kept(Pending),
    /// Its task could not be stored after the call was sent: the call is cancelled
    /// and this is the answer.
    Failed(Reply),
}

/// The deadline passed: make the held call a task. A store failure now, with the call
/// sent, is the call's outcome and cancels it (docs/design.md §16).
pub(super) async fn adopt(engine: &Arc<Engine>, h: Box<Handle>, pending: Pending) -> Adopted {
    let Handle {
        upstream,
        principal,
        server_info,
        req,
        tool,
        promotion,
        answer_undeclared,
        ..
    } = *h;
    let c = ToolCall {
        upstream: &upstream,
        principal: &principal,
        req,
        tool,
        server_info: &server_info,
        promotion,
        answer_undeclared,
        handle: true,
    };
    // A purge of the tenant is running: no task it could miss.
    let Some(_in_flight) = engine.tenant_calls.enter(&c.principal.tenant) else {
        return Adopted::Kept(pending);
    };
    match engine.tasks.live_tasks(&c.principal.tenant).await {
        Ok(live) if engine.limits.check_quota(live).is_ok() => {}
        // At the quota, or uncounted: held on rather than refused mid-call.
        _ => return Adopted::Kept(pending),
    }
    let fp = arguments_fingerprint(&c.req.params);
    let rec = new_record(engine, &c, &c.tool, fp, None);
    let route = new_route(engine, &c, &rec.task_id);
    let _creating = engine.calls.creating(&rec.task_id);
    let stored = match engine.tasks.create(&rec, &route, None).await {
        Ok(_) => engine.flush().await,
        Err(e) => Err(e),
    };
    if let Err(e) = stored {
        pending.abort();
        return Adopted::Failed(store_failed_after_send(c.upstream.name(), e));
    }
    launch(engine, &c, &rec, &route, pending, Vec::new());
    crate::metrics::promoted(c.upstream.name(), &rec.task_id, c.client_kind());
    Adopted::Task(Arc::new(rec))
}
