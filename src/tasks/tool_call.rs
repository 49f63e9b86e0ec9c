//! One `tools/call` that may become a task ([`ToolCall`]) and what every way of making
//! it one shares: its record and request route, the answer to a duplicate idempotency
//! key, a failed durable write, and the launch of the promoted call to its driver. The
//! call race (`call.rs`) and the upstream-task calls (`upstream_task.rs`) both build on
//! this file, so neither names the other's (ARCHITECTURE.md "Layers").

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::driver::{self, Driven};
use super::engine::Engine;
use super::events::Pending;
use super::failure::Failure;
use super::fingerprint::fingerprint;
use super::ids;
use super::outcome::Reply;
use super::promote::Promotion;
use crate::auth::Principal;
use crate::protocol::params::{TaskRef, ToolCallParams};
use crate::protocol::{Request, RpcError};
use crate::store::{RequestRoute, SCHEMA_VERSION, TaskRecord, TaskStatus, now_ms};
use crate::upstream::{InputAnswer, Upstream};

/// One `tools/call` that may become a task.
pub(super) struct ToolCall<'a> {
    pub(super) upstream: &'a Arc<Upstream>,
    pub(super) principal: &'a Principal,
    pub(super) req: Request<ToolCallParams>,
    /// `params.name`, which `call::call_tool` checked is a string.
    pub(super) tool: String,
    pub(super) server_info: &'a Value,
    pub(super) promotion: Promotion,
    /// A 2025-era client's task: input it did not declare is answered here, as its
    /// inline calls' is (`inputs::answer_undeclared`), rather than failing the task.
    pub(super) answer_undeclared: bool,
    /// A plain caller's task, answered with a handle (docs/design.md §28).
    pub(super) handle: bool,
}

impl ToolCall<'_> {
    /// The client kind of the metrics: `handle` for a plain caller's task.
    pub(super) fn client_kind(&self) -> &'static str {
        if self.handle { "handle" } else { "tasks" }
    }
}

/// A new task's record for `c`, `working` from its creation.
pub(super) fn new_record(
    engine: &Engine,
    c: &ToolCall<'_>,
    tool: &str,
    fp: String,
    idem: Option<String>,
) -> TaskRecord {
    let now = now_ms();
    let ttl = crate::config::as_millis(engine.cfg.tasks.ttl);
    TaskRecord {
        v: SCHEMA_VERSION,
        task_id: ids::new_task_id(),
        tenant: c.principal.tenant.clone(),
        subject: c.principal.subject.clone(),
        upstream: c.upstream.name().to_string(),
        tool: tool.to_string(),
        args_fingerprint: fp,
        idempotency_key: idem,
        status: TaskStatus::Working,
        status_message: Some("working".into()),
        created_at_ms: now,
        last_updated_at_ms: now,
        ttl_ms: ttl,
        poll_interval_ms: crate::config::as_millis(engine.cfg.tasks.poll_interval),
        expires_at_ms: now + ttl,
        result: None,
        error: None,
        input_requests: Default::default(),
        issued_keys: Vec::new(),
        cancel_requested: false,
        // The request span is current here (the front instruments its dispatch).
        trace: crate::telemetry::current_traceparent(),
    }
}

/// The request route of `task_id`, the call of `c` that this process runs.
pub(super) fn new_route(engine: &Engine, c: &ToolCall<'_>, task_id: &str) -> RequestRoute {
    let now = now_ms();
    RequestRoute {
        v: SCHEMA_VERSION,
        route_id: ids::new_route_id(),
        upstream: c.upstream.name().to_string(),
        tenant: c.principal.tenant.clone(),
        subject: c.principal.subject.clone(),
        method: c.req.method.as_str().to_string(),
        started_at_ms: now,
        deadline_ms: now + crate::config::as_millis(engine.cfg.tasks.ttl),
        task_id: Some(task_id.to_string()),
        upstream_task: None,
    }
}

/// The reply to a duplicate idempotency key: the existing task, or `-32602` when
/// the arguments differ. The task may come from a concurrent create whose flush is
/// still running, so its id goes out only once it is durable (docs/design.md §1
/// "Promotion").
pub(super) async fn existing(
    engine: &Engine,
    c: &ToolCall<'_>,
    entry: crate::store::IdempotencyEntry,
    fp: &str,
) -> Reply {
    if entry.args_fingerprint != fp {
        return Reply::Complete(Err(RpcError::invalid_params(
            "Idempotency-Key was already used with different arguments",
        )));
    }
    if let Err(e) = engine.flush().await {
        return store_failure(e);
    }
    let task = TaskRef::to(&entry.task_id);
    match engine.resolve(c.principal, c.upstream.name(), &task).await {
        Ok(rec) => {
            // It may have finished meanwhile: its status shows once durable.
            match engine.tasks.durable(&rec).await {
                Ok(()) => Reply::Task(rec),
                // Nothing was sent for this duplicate: retry-safe.
                Err(e) => store_failure(e),
            }
        }
        Err(f) => Reply::Failed(f),
    }
}

/// Register a promoted call and hand it to its driver.
pub(super) fn launch(
    engine: &Arc<Engine>,
    c: &ToolCall<'_>,
    rec: &TaskRecord,
    route: &RequestRoute,
    call: Pending,
    responders: Vec<(String, oneshot::Sender<InputAnswer>)>,
) {
    engine.calls.register(&rec.task_id, call.abort_handle());
    let awaiting_input = !responders.is_empty();
    for (key, tx) in responders {
        engine.calls.add_responder(&rec.task_id, key, tx);
    }
    let engine = engine.clone();
    tokio::spawn(driver::drive(
        engine,
        Driven {
            task_id: rec.task_id.clone(),
            route_id: route.route_id.clone(),
            upstream: c.upstream.name().to_string(),
            caps: c.req.meta.caps.clone(),
            answer_undeclared: c.answer_undeclared,
            call,
            awaiting_input,
        },
    ));
}

pub(super) fn store_failure(e: impl std::fmt::Display) -> Reply {
    Reply::Failed(Failure::retry_later(RpcError::internal(format!(
        "the task could not be stored durably: {e}"
    ))))
}

/// A store failure once the upstream call may have been sent (docs/design.md §16
/// "Durability, store failures and upgrades"): no task id, HTTP 200 + `-32603` saying
/// what happened.
pub(super) fn store_failed_after_send(upstream: &str, e: impl std::fmt::Display) -> Reply {
    crate::metrics::fail_closed("store_failed_after_send");
    tracing::warn!(upstream, error = %e, "storing a promoted task failed after its call was sent; call cancelled");
    Reply::Failed(Failure::outcome(
        RpcError::internal(format!(
            "the task could not be stored durably after the call was sent to upstream \
             {upstream}; the call was cancelled upstream: {e}"
        ))
        .with_data(json!({ "upstream": upstream })),
    ))
}

/// The fingerprint of a call's arguments (`{}` when absent), which an idempotency
/// record keeps to tell a replay from a conflicting reuse of its key.
pub(super) fn arguments_fingerprint(p: &ToolCallParams) -> String {
    match p.arguments().into_valid() {
        Some(args) => fingerprint(args),
        None => fingerprint(&json!({})),
    }
}
