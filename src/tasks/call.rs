//! One engine entry for every `tools/call`, of either era
//! ([`Engine::call_tool`]): whether the call runs inline or becomes a task, what a
//! client that cannot take a task is refused, MRTR retries, and — for a call that may
//! become a task — the deadline race: the upstream call starts at once; an answer
//! within `promote_after_ms` goes back inline, otherwise the task is written and
//! flushed *before* its id goes out, and the call carries on in the background.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::driver::{key_inputs, progress_message, split_inputs};
use super::engine::Engine;
use super::events::{Event, Notice, Pending, Timers, queue_status};
use super::failure::Failure;
use super::handles::Handle;
use super::inputs::{self, InlineTiming, InputVerdict};
use super::mrtr::{Holds, Resumed};
use super::outcome::{Reply, answer_of};
use super::promote::Promotion;
use super::tool_call::{
    self, ToolCall, arguments_fingerprint, launch, new_record, new_route, store_failed_after_send,
    store_failure,
};
use super::upstream_task;
use crate::auth::Principal;
use crate::config::{OnInput, PlainClients, TaskMode};
use crate::protocol::params::{Field, Forward, ToolCallParams};
use crate::protocol::{Request, RpcError, error};
use crate::store::{Created, QuotaCreated, TaskRecord};
use crate::upstream::{Upstream, UpstreamError};

/// The race's one timer: `promote_after_ms` passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Promote;

/// Who calls a tool, as far as what becomes of the call differs by it
/// (docs/design.md §1 "Promotion", §2, §22 "Clients of the 2025 era", §25).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A 2026-07-28 client that declared the tasks extension: the deadline race.
    Tasks,
    /// A 2026-07-28 client without it: inline, or `-32021` for a call that could
    /// only be a task.
    Plain,
    /// A 2025-11-25 session's task-augmented call (`params.task`): a task at once.
    SessionTask,
    /// Any other call of a 2025-era session (named, for its upstream session): inline;
    /// a tool the upstream runs only as its own task is followed inline.
    Session(String),
}

/// One `tools/call`, of either era, as the front hands it to the engine. It borrows
/// what the front keeps for rendering the answer (the principal, `serverInfo`), so
/// the call copies neither.
pub struct ToolCallRequest<'a> {
    pub upstream: &'a Arc<Upstream>,
    pub principal: &'a Principal,
    pub req: Request<ToolCallParams>,
    /// The upstream's `serverInfo`, for the answers it goes into.
    pub server_info: &'a Value,
    pub caller: Caller,
    /// When the HTTP request arrived: a lookup before an inline call is bounded by the
    /// same `sync_timeout_ms` the call is.
    pub received: Instant,
    pub timing: InlineTiming,
    /// The endpoint answers plain callers of a handle-mode tool with a handle at the
    /// deadline (docs/design.md §28): configured, and no upstream tool shadows the
    /// task tools.
    pub handles: bool,
}

fn invalid(why: impl Into<String>) -> ToolReply {
    Reply::Complete(Err(RpcError::invalid_params(why))).into()
}

/// A call that could only be a task, from a 2026 client that cannot take one
/// (docs/design.md §2): 400 `-32021`.
fn needs_extension(why: String) -> ToolReply {
    Reply::Failed(Failure::refused(RpcError::tasks_extension_required(why))).into()
}

/// The one entry for a `tools/call` of either era: the params checks, then what
/// becomes of the call by who makes it ([`Caller`]). The upstream's
/// `execution.taskSupport` is looked up once, here.
pub(super) async fn call_tool(engine: &Arc<Engine>, r: ToolCallRequest<'_>) -> ToolReply {
    if r.caller == Caller::SessionTask && r.req.params.task == Field::Invalid {
        return invalid("params.task must be an object");
    }
    let Field::Valid(tool) = r.req.params.name.clone() else {
        return invalid("params.name must be a string");
    };
    if r.req.params.arguments() == Field::Invalid {
        return invalid("params.arguments must be an object");
    }
    let mut promotion = Promotion::resolve(&engine.cfg.tasks, &r.upstream.cfg, &tool);
    let plain = matches!(r.caller, Caller::Plain | Caller::Session(_));
    if plain && r.handles && promotion.plain_clients == PlainClients::Handle {
        return handle_call(engine, r, tool, promotion).await;
    }
    match r.caller.clone() {
        Caller::Tasks if promotion.mode != TaskMode::Never => {
            let c = to_tool_call(r, tool, promotion, false);
            retry_or_call(engine, c).await
        }
        Caller::Tasks | Caller::Plain => plain_call(engine, r, &tool, &promotion).await,
        Caller::SessionTask => {
            if promotion.mode == TaskMode::Never {
                return Reply::Complete(Err(RpcError::new(
                    error::METHOD_NOT_FOUND,
                    format!("tool {tool:?} does not run as a task"),
                )))
                .into();
            }
            // The task exists before the call starts, and its input goes through
            // `tasks/result`, never an MRTR round this client cannot make.
            promotion.promote_after = std::time::Duration::ZERO;
            promotion.on_input = OnInput::Task;
            tools_call(engine, to_tool_call(r, tool, promotion, true))
                .await
                .into()
        }
        Caller::Session(session) => {
            // A tool the upstream runs only as its own task, called without
            // augmentation: followed inline (docs/design.md §25).
            let upstream_task = r
                .upstream
                .upstream_task_support(r.principal, &tool)
                .await
                .as_deref()
                == Some("required");
            let want_progress = r.req.meta.progress_token.is_some();
            let mut spec = inputs::upstream_spec(r.req.method, &r.req.params.fwd, want_progress);
            spec.session = Some(session);
            let pending = if upstream_task {
                engine.start_upstream_task_inline(r.upstream, r.principal, spec)
            } else {
                engine.start_call(r.upstream, r.principal, spec)
            };
            ToolReply::Inline {
                pending,
                req: r.req,
                handle: None,
            }
        }
    }
}

/// A 2026 call served inline (a client without the extension, or a tool that
/// never runs as a task): refused with `-32021` when it could only be a task,
/// resumed when it is an MRTR retry.
async fn plain_call(
    engine: &Arc<Engine>,
    r: ToolCallRequest<'_>,
    tool: &str,
    promotion: &Promotion,
) -> ToolReply {
    if r.caller == Caller::Plain {
        if is_keyed(&r, promotion) {
            return needs_extension(
                "an idempotency key makes the call a task; declare the tasks extension".into(),
            );
        }
        // Only a client without the extension is refused for a tool that runs
        // only as a task, so only its calls look the tool up (a `tools/list`
        // upstream when the cache is cold), bounded by the request's
        // `sync_timeout_ms`: past it the inline call answers at once.
        if runs_only_as_task(&r, tool, promotion).await {
            return needs_extension(format!(
                "tool {tool:?} runs only as a task; declare the tasks extension"
            ));
        }
    }
    match mrtr_retry(
        &engine.holds,
        r.upstream.name(),
        r.principal,
        &r.req,
        r.server_info,
    ) {
        None => {
            let fwd = &r.req.params.fwd;
            let spec =
                inputs::upstream_spec(r.req.method, fwd, r.req.meta.progress_token.is_some());
            let pending = engine.start_call(r.upstream, r.principal, spec);
            ToolReply::Inline {
                pending,
                req: r.req,
                handle: None,
            }
        }
        Some(Retry::Resumed(pending)) => ToolReply::Inline {
            pending,
            req: r.req,
            handle: None,
        },
        Some(Retry::Elsewhere(replica)) => ToolReply::Elsewhere {
            replica,
            req: r.req,
        },
        Some(Retry::Answer(reply)) => reply.into(),
    }
}

/// A plain client's call of a tool in handle mode (docs/design.md §28): held inline
/// with a deadline, at which the front's responder hands it to [`Engine::adopt`]; a
/// handle at once when it could only be a task. An MRTR retry of a 2026 call resumes
/// it, and its deadline starts again.
async fn handle_call(
    engine: &Arc<Engine>,
    r: ToolCallRequest<'_>,
    tool: String,
    mut promotion: Promotion,
) -> ToolReply {
    let session = matches!(r.caller, Caller::Session(_));
    if !session {
        match mrtr_retry(
            &engine.holds,
            r.upstream.name(),
            r.principal,
            &r.req,
            r.server_info,
        ) {
            None => {}
            Some(Retry::Resumed(pending)) => return held_to_deadline(r, tool, promotion, pending),
            Some(Retry::Elsewhere(replica)) => {
                return ToolReply::Elsewhere {
                    replica,
                    req: r.req,
                };
            }
            Some(Retry::Answer(reply)) => return reply.into(),
        }
    }
    if promotion.promote_after.is_zero() || handle_at_once(&r, &tool, &promotion).await {
        // The task exists before the call starts; its input goes through the task.
        promotion.promote_after = std::time::Duration::ZERO;
        promotion.on_input = OnInput::Task;
        return tools_call(engine, to_tool_call(r, tool, promotion, session))
            .await
            .into();
    }
    // Progress always: it becomes the task's status message once promoted; the
    // responder passes it on only to a client that asked for it.
    let mut spec = inputs::upstream_spec(r.req.method, &r.req.params.fwd, true);
    if let Caller::Session(s) = &r.caller {
        spec.session = Some(s.clone());
    }
    let pending = engine.start_call(r.upstream, r.principal, spec);
    held_to_deadline(r, tool, promotion, pending)
}

/// Whether a handle-mode call is a handle at once: keyed (its result must be
/// stored), or of a tool that runs only as a task (config, or the upstream's
/// `taskSupport`, looked up within the request's `sync_timeout_ms`).
async fn handle_at_once(r: &ToolCallRequest<'_>, tool: &str, promotion: &Promotion) -> bool {
    is_keyed(r, promotion) || runs_only_as_task(r, tool, promotion).await
}

/// Whether the tool runs only as a task: config `task = "required"`, or (unless
/// config says `never`) the upstream's `taskSupport: "required"`, looked up within the
/// request's `sync_timeout_ms` (a `tools/list` upstream when the cache is cold).
async fn runs_only_as_task(r: &ToolCallRequest<'_>, tool: &str, promotion: &Promotion) -> bool {
    promotion.mode == TaskMode::Required
        || (promotion.mode != TaskMode::Never
            && tokio::time::timeout_at(
                r.received + r.timing.sync_timeout,
                r.upstream.tool_task_support(r.principal, tool),
            )
            .await
            .ok()
            .flatten()
            .as_deref()
                == Some("required"))
}

/// Whether the call carries an idempotency key (the header, or the tool's key
/// argument).
fn is_keyed(r: &ToolCallRequest<'_>, promotion: &Promotion) -> bool {
    r.req.idempotency_key.is_some()
        || promotion.idempotency_argument.as_deref().is_some_and(|a| {
            r.req
                .params
                .arguments()
                .into_valid()
                .is_some_and(|x| x.get(a).is_some())
        })
}

/// A handle-mode call held inline until its deadline.
fn held_to_deadline(
    r: ToolCallRequest<'_>,
    tool: String,
    promotion: Promotion,
    pending: Pending,
) -> ToolReply {
    let at = Instant::now() + promotion.promote_after;
    let req = r.req.clone();
    let session = matches!(r.caller, Caller::Session(_));
    // The handle outlives the request that borrows the call's parts: it keeps copies.
    let handle = Handle::new(at, to_tool_call(r, tool, promotion, session));
    ToolReply::Inline {
        pending,
        req,
        handle: Some(Box::new(handle)),
    }
}

/// A tasks client's call: resumed when it is an MRTR retry, else the race.
async fn retry_or_call(engine: &Arc<Engine>, c: ToolCall<'_>) -> ToolReply {
    match mrtr_retry(
        &engine.holds,
        c.upstream.name(),
        c.principal,
        &c.req,
        c.server_info,
    ) {
        None => tools_call(engine, c).await.into(),
        Some(Retry::Resumed(pending)) => resume(engine, c, pending).await.into(),
        Some(Retry::Elsewhere(replica)) => ToolReply::Elsewhere {
            replica,
            req: c.req,
        },
        Some(Retry::Answer(reply)) => reply.into(),
    }
}

/// What an MRTR retry leads to.
pub enum Retry {
    /// The held call, resumed with the answers.
    Resumed(Pending),
    /// The answer now: an error, or a further round.
    Answer(Reply),
    /// Another replica holds the call: relay the retry there.
    Elsewhere(String),
}

/// An MRTR retry (`params.requestState`) of a call held in `holds`; `None` for a
/// first request (MCP 2026-07-28 "Multi Round-Trip Requests"). Every method that may
/// answer `input_required` resumes through here, a `tools/call` or not.
pub(super) fn mrtr_retry<P: AsRef<Forward>>(
    holds: &Arc<Holds>,
    upstream: &str,
    principal: &Principal,
    req: &Request<P>,
    server_info: &Value,
) -> Option<Retry> {
    let fwd = req.params.as_ref();
    let state = match &fwd.mrtr.request_state {
        Field::Absent => return None,
        _ if !req.method.is_mrtr_eligible() => return None,
        Field::Invalid => {
            return Some(Retry::Answer(Reply::Complete(Err(
                RpcError::invalid_params("requestState must be a string"),
            ))));
        }
        Field::Valid(state) => state,
    };
    Some(
        match holds.resume(state, principal, upstream, req.method, fwd, server_info) {
            Ok(Resumed::Call(p)) => Retry::Resumed(p),
            Ok(Resumed::StillWaiting(v)) => Retry::Answer(Reply::InputRequired(v)),
            Ok(Resumed::Elsewhere(replica)) => Retry::Elsewhere(replica),
            Err(e) => Retry::Answer(Reply::Complete(Err(e))),
        },
    )
}

fn to_tool_call<'a>(
    r: ToolCallRequest<'a>,
    tool: String,
    promotion: Promotion,
    session: bool,
) -> ToolCall<'a> {
    ToolCall {
        upstream: r.upstream,
        principal: r.principal,
        req: r.req,
        tool,
        server_info: r.server_info,
        promotion,
        handle: matches!(r.caller, Caller::Plain | Caller::Session(_)),
        answer_undeclared: session,
    }
}

/// What [`Engine::call_tool`] decided for one `tools/call`.
pub enum ToolReply {
    /// The answer: inline, a task handle, an MRTR round, or a refusal.
    Reply(Reply),
    /// The call runs inline and the caller waits for it: the front's held-call
    /// responder of the caller's era serves it (JSON, then SSE with keep-alives).
    Inline {
        pending: Pending,
        req: Request<ToolCallParams>,
        /// The deadline at which it becomes a task, for a plain caller of a tool in
        /// handle mode (docs/design.md §28): the responder hands it to
        /// [`Engine::adopt`] then.
        handle: Option<Box<Handle>>,
    },
    /// An MRTR retry whose call another replica holds: relay it there.
    Elsewhere {
        replica: String,
        req: Request<ToolCallParams>,
    },
}

impl From<Reply> for ToolReply {
    fn from(r: Reply) -> Self {
        Self::Reply(r)
    }
}

/// Aborts the call unless disarmed: the client still owns the call until a task
/// handle has been returned (docs/design.md §6 "Cancel").
struct Armed(Option<tokio::task::AbortHandle>);

impl Armed {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// Idempotency index key of `(tenant, subject, upstream, tool, key)` (docs/design.md
/// §9 "Idempotency"), built by the store's rule so a tenant purge finds every claim of
/// the tenant (`store::idempotency`).
pub(super) fn idempotency_index(p: &Principal, upstream: &str, tool: &str, key: &str) -> Vec<u8> {
    crate::store::idempotency::index_key(&p.tenant, &p.subject, upstream, tool, key)
}

fn start_call(
    engine: &Arc<Engine>,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    req: &Request<ToolCallParams>,
    promotion: &Promotion,
) -> Pending {
    // Progress always: it becomes the task's statusMessage once promoted.
    let spec = inputs::upstream_spec(req.method, &req.params.fwd, true);
    let (tx, rx) = mpsc::channel(32);
    let up = upstream.clone();
    let p = principal.clone();
    let limit = promotion.call_timeout;
    let name = upstream.name().to_string();
    let gather = engine.input_gather();
    let engine = engine.clone();
    // In the request's span, so the upstream call's client span is its child.
    let task = crate::telemetry::spawn_in_current_span(async move {
        let call = engine.call_upstream(&up, &p, spec, tx);
        match limit {
            None => call.await,
            // The timeout drops the call future, which cancels it upstream.
            Some(d) => tokio::time::timeout(d, call).await.unwrap_or_else(|_| {
                Err(UpstreamError::TimedOut {
                    upstream: name,
                    after_ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
                })
            }),
        }
    });
    Pending::new(task, rx, gather)
}

/// A call of a tenant whose purge is running: nothing was sent.
fn purging_refusal() -> Reply {
    Reply::Failed(Failure::retry_later(RpcError::internal(
        "the tenant's data is being purged; nothing was sent upstream",
    )))
}

/// A call a purge of its tenant cancelled: it may have reached the upstream, which got
/// `notifications/cancelled`.
fn purge_cancelled() -> Reply {
    Reply::Failed(Failure::outcome(RpcError::internal(
        "the call was cancelled: an operator is purging the tenant's data",
    )))
}

/// The tenant's live-task quota (docs/design.md §8 "Flow control"), checked before
/// the upstream call starts — after the idempotency lookup, so a duplicate still
/// gets its task.
///
/// A count the store cannot give refuses the call (503 + `Retry-After`: nothing was
/// sent): an uncounted quota is no quota (docs/design.md §16 "Fail closed").
async fn over_quota(engine: &Engine, c: &ToolCall<'_>) -> Option<Reply> {
    let live = match engine.tasks.live_tasks(&c.principal.tenant).await {
        Ok(n) => n,
        Err(e) => {
            crate::metrics::fail_closed("quota_uncounted");
            tracing::warn!(tenant = %c.principal.tenant, error = %e, "counting the tenant's live tasks failed; call refused");
            return Some(Reply::Failed(Failure::retry_later(RpcError::internal(
                format!("the tenant's live tasks could not be counted: {e}"),
            ))));
        }
    };
    engine
        .limits
        .check_quota(live)
        .err()
        .map(|t| Reply::Failed(Failure::throttled(t)))
}

/// Serve a `tools/call` from a client that declared the tasks extension. A purge
/// of the caller's tenant refuses it, or cancels it while it runs, so it never
/// writes a task the purge would miss (docs/design.md §27 "Tenant purge").
pub(super) async fn tools_call(engine: &Arc<Engine>, c: ToolCall<'_>) -> Reply {
    let Some(in_flight) = engine.tenant_calls.enter(&c.principal.tenant) else {
        return purging_refusal();
    };
    tokio::select! {
        r = tools_call_admitted(engine, c) => r,
        () = in_flight.cancelled() => purge_cancelled(),
    }
}

async fn tools_call_admitted(engine: &Arc<Engine>, c: ToolCall<'_>) -> Reply {
    let tool = c.tool.clone();
    let fp = arguments_fingerprint(&c.req.params);
    let idem = c.req.idempotency_key.clone().or_else(|| {
        let arg = c.promotion.idempotency_argument.as_deref()?;
        let args = c.req.params.arguments().into_valid()?;
        args.get(arg).and_then(Value::as_str).map(str::to_string)
    });

    if let Some(key) = &idem {
        // A keyed call is always a task, written before the upstream call starts
        // so concurrent duplicates never reach the upstream twice (docs/design.md §9
        // "Idempotency").
        let index = idempotency_index(c.principal, c.upstream.name(), &tool, key);
        match engine.tasks.idempotency_get(&index).await {
            Ok(Some(entry)) => return tool_call::existing(engine, &c, entry, &fp).await,
            Ok(None) => {}
            Err(e) => return store_failure(e),
        }
        if c.upstream
            .upstream_task_support(c.principal, &tool)
            .await
            .is_some()
        {
            if let Some(r) = over_quota(engine, &c).await {
                return r;
            }
            return upstream_task::keyed_upstream_task_call(engine, c, fp, idem, index).await;
        }
        // The quota is counted by the creation itself (one round trip).
        let rec = new_record(engine, &c, &tool, fp.clone(), idem.clone());
        return create_then_call(engine, c, rec, Some(index), fp).await;
    }
    if c.upstream
        .upstream_task_support(c.principal, &tool)
        .await
        .is_some()
    {
        if let Some(r) = over_quota(engine, &c).await {
            return r;
        }
        return upstream_task::upstream_task_call(engine, c, fp).await;
    }
    if c.promotion.promote_after.is_zero() {
        let rec = new_record(engine, &c, &tool, fp.clone(), None);
        return create_then_call(engine, c, rec, None, fp).await;
    }
    if let Some(r) = over_quota(engine, &c).await {
        return r;
    }
    let call = start_call(engine, c.upstream, c.principal, &c.req, &c.promotion);
    race(engine, c, tool, fp, call).await
}

/// Carry on with a call held for an MRTR round (`on_input = "mrtr"`): the race
/// against the deadline starts again now (MCP Tasks extension, "Task Creation":
/// MRTR first, then the task).
async fn resume(engine: &Arc<Engine>, c: ToolCall<'_>, pending: Pending) -> Reply {
    let Some(in_flight) = engine.tenant_calls.enter(&c.principal.tenant) else {
        return purging_refusal();
    };
    let tool = c.tool.clone();
    let fp = arguments_fingerprint(&c.req.params);
    tokio::select! {
        r = race(engine, c, tool, fp, pending) => r,
        () = in_flight.cancelled() => purge_cancelled(),
    }
}

/// `promote_after_ms = 0` and keyed calls: the task exists before the call starts,
/// written only while the tenant is under its live-task quota (counted by the same
/// store operation: docs/design.md §8 "Flow control").
async fn create_then_call(
    engine: &Arc<Engine>,
    c: ToolCall<'_>,
    mut rec: TaskRecord,
    index: Option<Vec<u8>>,
    fp: String,
) -> Reply {
    // A call that will wait for an upstream slot says so from the first snapshot
    // on (an estimate: the driver writes the position the queue reports).
    if let Some(msg) = engine.limits.queue_status_if_entered(
        c.upstream.name(),
        c.upstream.cfg.max_concurrency,
        c.principal,
    ) {
        rec.status_message = Some(msg);
    }
    let route = new_route(engine, &c, &rec.task_id);
    let _creating = engine.calls.creating(&rec.task_id);
    let max_live = engine.limits.max_live_per_tenant();
    match engine
        .tasks
        .create_within_quota(&rec, &route, index.as_deref(), max_live)
        .await
    {
        Ok(QuotaCreated::Done(Created::New)) => {}
        Ok(QuotaCreated::Done(Created::Existing(entry))) => {
            return tool_call::existing(engine, &c, entry, &fp).await;
        }
        Ok(QuotaCreated::OverQuota { .. }) => {
            return Reply::Failed(Failure::throttled(engine.limits.over_quota()));
        }
        Err(e) => return store_failure(e),
    }
    if let Err(e) = engine.flush().await {
        return store_failure(e);
    }
    let call = start_call(engine, c.upstream, c.principal, &c.req, &c.promotion);
    launch(engine, &c, &rec, &route, call, Vec::new());
    crate::metrics::promoted(c.upstream.name(), &rec.task_id, c.client_kind());
    Reply::Task(Arc::new(rec))
}

/// Register a promoted call and hand it to its driver.
async fn race(
    engine: &Arc<Engine>,
    c: ToolCall<'_>,
    tool: String,
    fp: String,
    pending: Pending,
) -> Reply {
    let mut call = pending;
    let mut armed = Armed(Some(call.abort_handle()));
    let mut timers = Timers::default();
    timers.set(Promote, Instant::now() + c.promotion.promote_after);
    // The latest progress or queue position: the task starts with it, so a queued
    // call says so from its CreateTaskResult on.
    let mut status_message: Option<String> = None;
    let inputs = loop {
        match call.next(&mut timers).await {
            Event::Finished(r) => {
                armed.disarm();
                crate::metrics::inline_completion(c.upstream.name());
                return answer_of(c.req.method, c.upstream.name(), c.server_info, r);
            }
            Event::Notice(Notice::Progress(p)) => {
                status_message = Some(progress_message(&p));
            }
            Event::Notice(Notice::Queue(q)) => status_message = Some(queue_status(q)),
            Event::Notice(Notice::Log(_)) => {}
            Event::Inputs(batch) => {
                match inputs::screen(&c.req.meta.caps, c.req.method, c.upstream.name(), batch) {
                    InputVerdict::Missing(err) => return Reply::Failed(Failure::refused(err)),
                    InputVerdict::Relay(batch) if c.promotion.on_input == OnInput::Mrtr => {
                        // MRTR rounds first; the retry resumes this race.
                        armed.disarm();
                        let v = engine.holds.hold(
                            call,
                            batch,
                            c.principal,
                            c.upstream.name(),
                            c.req.method,
                            &c.req.params,
                            c.server_info,
                        );
                        return Reply::InputRequired(v);
                    }
                    // Input before the deadline promotes at once (docs/design.md §1
                    // "Promotion").
                    InputVerdict::Relay(batch) => break batch,
                    InputVerdict::Refused => {}
                }
            }
            Event::Timer(Promote) => break Vec::new(),
        }
    };

    let mut rec = new_record(engine, &c, &tool, fp, None);
    if let Some(msg) = status_message {
        rec.status_message = Some(msg);
    }
    let (requests, senders) = split_inputs(inputs);
    let keys = if requests.is_empty() {
        Vec::new()
    } else {
        key_inputs(&mut rec, &requests)
    };
    let route = new_route(engine, &c, &rec.task_id);
    let _creating = engine.calls.creating(&rec.task_id);
    // The call is under way upstream: a store failure now is the request's outcome
    // (200), not a retry-safe 503, or a retry could run the call twice. Dropping
    // `armed` cancels the call upstream; a record that was written after all is
    // resolved as an orphan by the sweep (docs/design.md §16).
    let stored = match engine.tasks.create(&rec, &route, None).await {
        Ok(_) => engine.flush().await,
        Err(e) => Err(e),
    };
    if let Err(e) = stored {
        return store_failed_after_send(c.upstream.name(), e);
    }
    armed.disarm();
    launch(
        engine,
        &c,
        &rec,
        &route,
        call,
        keys.into_iter().zip(senders).collect(),
    );
    crate::metrics::promoted(c.upstream.name(), &rec.task_id, c.client_kind());
    Reply::Task(Arc::new(rec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(tenant: &str, subject: &str) -> Principal {
        Principal {
            tenant: tenant.into(),
            subject: subject.into(),
        }
    }

    #[test]
    fn idempotency_index_names_one_tuple() {
        // Unchanged for parts without NUL: keys stored by earlier versions still match.
        assert_eq!(
            idempotency_index(&principal("acme", "alice"), "demo", "slow", "k"),
            b"acme\0alice\0demo\0slow\0k"
        );
        let keys = [
            idempotency_index(&principal("a", "b\0c"), "u", "t", "k"),
            idempotency_index(&principal("a\0b", "c"), "u", "t", "k"),
            idempotency_index(&principal("a", "b"), "u", "t\0k", ""),
            idempotency_index(&principal("a", "b"), "u", "t", "\0k"),
            idempotency_index(&principal("a", "b\0"), "u", "t", "k"),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
