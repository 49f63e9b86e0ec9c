//! Task handles for plain clients (docs/design.md §28): what becomes of a call from a
//! client that cannot take a task when its tool is in handle mode. Before the
//! deadline the call is an inline call like any (the front's held-call responder
//! relays its input the era's way); at the deadline the responder hands it back here
//! ([`adopt`]) and it becomes a task exactly as a tasks client's call does — owner,
//! ttl, quota, written and flushed before the handle goes out. A call that could only
//! be a task (`required`, or keyed) is one at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::call::{
    Caller, Retry, ToolCall, ToolCallRequest, ToolReply, arguments_fingerprint, mrtr_retry,
    store_failed_after_send, to_tool_call,
};
use super::engine::Engine;
use super::events::Pending;
use super::inputs;
use super::outcome::Reply;
use super::promote::Promotion;
use crate::config::{OnInput, TaskMode};
use crate::store::TaskRecord;

/// A running inline call that becomes a task at its deadline.
pub struct Handle {
    at: Instant,
    call: ToolCall,
}

impl Handle {
    /// When the call becomes a task.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// What [`adopt`] made of a call at its deadline.
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

/// A plain client's call of a tool in handle mode (`call_tool` decided it is one).
pub(super) async fn call(
    engine: &Arc<Engine>,
    r: ToolCallRequest,
    tool: String,
    mut promotion: Promotion,
) -> ToolReply {
    let session = matches!(r.caller, Caller::Session(_));
    // An MRTR retry of a 2026 call resumes it, and its deadline starts again.
    if !session {
        match mrtr_retry(
            &r.holds,
            r.upstream.name(),
            &r.principal,
            &r.req,
            &r.server_info,
        ) {
            None => {}
            Some(Retry::Resumed(pending)) => return held(r, tool, promotion, pending),
            Some(Retry::Elsewhere(replica)) => {
                return ToolReply::Elsewhere {
                    replica,
                    req: r.req,
                };
            }
            Some(Retry::Answer(reply)) => return reply.into(),
        }
    }
    if promotion.promote_after.is_zero() || at_once(&r, &tool, &promotion).await {
        // The task exists before the call starts; its input goes through the task.
        promotion.promote_after = Duration::ZERO;
        promotion.on_input = OnInput::Task;
        let c = to_tool_call(r, tool, promotion, session);
        return engine.tools_call(c).await.into();
    }
    // Progress always: it becomes the task's status message once promoted; the
    // responder passes it on only to a client that asked for it.
    let mut spec = inputs::upstream_spec(r.req.method, &r.req.params.fwd, true);
    if let Caller::Session(s) = &r.caller {
        spec.session = Some(s.clone());
    }
    let pending = engine.start_call(&r.upstream, &r.principal, spec);
    held(r, tool, promotion, pending)
}

/// Whether the call is a handle at once: keyed (its result must be stored), or of a
/// tool that runs only as a task (config, or the upstream's `taskSupport`, looked up
/// within the request's `sync_timeout_ms`).
async fn at_once(r: &ToolCallRequest, tool: &str, promotion: &Promotion) -> bool {
    let keyed = r.req.idempotency_key.is_some()
        || promotion.idempotency_argument.as_deref().is_some_and(|a| {
            r.req
                .params
                .arguments()
                .into_valid()
                .is_some_and(|x| x.get(a).is_some())
        });
    keyed
        || promotion.mode == TaskMode::Required
        || tokio::time::timeout_at(
            r.received + r.timing.sync_timeout,
            r.upstream.tool_task_support(&r.principal, tool),
        )
        .await
        .ok()
        .flatten()
        .as_deref()
            == Some("required")
}

/// The call held inline with its deadline.
fn held(r: ToolCallRequest, tool: String, promotion: Promotion, pending: Pending) -> ToolReply {
    let at = Instant::now() + promotion.promote_after;
    let req = r.req.clone();
    let session = matches!(r.caller, Caller::Session(_));
    let call = to_tool_call(r, tool, promotion, session);
    ToolReply::Inline {
        pending,
        req,
        handle: Some(Box::new(Handle { at, call })),
    }
}

/// The deadline passed: make the held call a task (docs/design.md §28). Like the
/// deadline race of a tasks client's call (`call.rs`), the record is written and
/// flushed before the handle goes out; a store failure now, with the call sent, is
/// the call's outcome and cancels it.
pub(super) async fn adopt(engine: &Arc<Engine>, h: Box<Handle>, pending: Pending) -> Adopted {
    let c = h.call;
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
    let rec = engine.new_record(&c, &c.tool, fp, None);
    let route = engine.new_route(&c, &rec.task_id);
    let _creating = engine.calls.creating(&rec.task_id);
    let stored = match engine.tasks.create(&rec, &route, None).await {
        Ok(_) => engine.flush().await,
        Err(e) => Err(e),
    };
    if let Err(e) = stored {
        pending.abort();
        return Adopted::Failed(store_failed_after_send(c.upstream.name(), e));
    }
    engine.launch(&c, &rec, &route, pending, Vec::new());
    crate::metrics::promoted(c.upstream.name(), &rec.task_id, "handle");
    Adopted::Task(Arc::new(rec))
}
