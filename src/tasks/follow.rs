//! Following an upstream's own task (docs/design.md §25 "The 2025-11-25 task dialect",
//! upstream half): creating it task-augmented on a pinned session (or child), then a
//! loop of `tasks/get` at the upstream's `pollInterval` (within the gateway's bounds),
//! its `statusMessage` as progress, the input requests the upstream delivers through
//! `tasks/result`, and the result through `tasks/result` once a `tasks/get` says the
//! task is terminal. Cancelling the gateway's task cancels the upstream task; a
//! gateway that stops leaves it to the upstream, and the next start (or a replica
//! taking over) re-attaches to it through the recorded session (HTTP only: a stdio
//! task lives in its child and fails with it).
//!
//! The follower is an upstream call like any other to the rest of the engine: its
//! events go to the call's channel (`Pending`). Writing the gateway's task for a new
//! call is `upstream_task.rs`'s; a task re-attached after a restart or a takeover is
//! handed to the driver here (`resume_following`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::driver::{self, Driven};
use super::engine::Engine;
use super::events::Pending;
use super::repo::TaskRepo;
use crate::auth::Principal;
use crate::config::TasksConfig;
use crate::limits::Limits;
use crate::limits::gate::Permit;
use crate::protocol::legacy::LegacyTaskMethod;
use crate::protocol::task_shapes::{ToolResult, UpstreamTask};
use crate::protocol::{ClientCaps, META_RELATED_TASK, RpcError};
use crate::store::{RequestRoute, StoreError, TaskStatus, UpstreamTaskRoute, now_ms};
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, SessionRef, TaskChannel, Upstream, UpstreamError, UpstreamSet,
};

/// The fastest the gateway polls an upstream task, whatever its `pollInterval` says.
const MIN_UPSTREAM_POLL: Duration = Duration::from_millis(100);
/// The upstream's `pollInterval` when it gives none.
const DEFAULT_UPSTREAM_POLL: Duration = Duration::from_millis(1000);
/// Consecutive transport failures of the follower's requests before the task fails.
const MAX_POLL_FAILURES: u32 = 5;
/// How long a forwarded `tasks/cancel` may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a gateway task followed an upstream task that its restart re-attached to.
const REATTACHED: &str =
    "re-attached to the upstream task after a gateway restart or a replica takeover";

/// A request of the follower, in the upstream task's own vocabulary.
fn spec(method: LegacyTaskMethod, task_id: &str) -> CallSpec {
    let mut params = Map::new();
    params.insert("taskId".into(), Value::from(task_id));
    CallSpec {
        method: method.as_str().into(),
        tool: None,
        params,
        want_progress: false,
        tenant: None,
        session: None,
    }
}

/// The upstream's `CreateTaskResult`: `{task: {taskId, status, ttl, pollInterval, …}}`
/// (MCP 2025-11-25 "Tasks", "Creating Tasks").
pub(super) struct Created2025 {
    pub(super) task_id: String,
    pub(super) ttl_ms: Option<u64>,
    pub(super) poll: Option<u64>,
    pub(super) status_message: Option<String>,
}

fn created_task(v: &Value) -> Option<Created2025> {
    let t = UpstreamTask::created(v)?;
    Some(Created2025 {
        task_id: t.task_id?.to_string(),
        ttl_ms: t.ttl_ms,
        poll: t.poll_interval_ms,
        status_message: t.status_message.map(str::to_string),
    })
}

/// What the request route keeps of an upstream task (`store::UpstreamTaskRoute`).
pub(super) fn route_entry(
    channel: &dyn TaskChannel,
    task_id: &str,
    caps: &ClientCaps,
    answer_undeclared: bool,
) -> UpstreamTaskRoute {
    let session = channel.session();
    UpstreamTaskRoute {
        task_id: task_id.to_string(),
        session_version: session.as_ref().and_then(|s| s.version.clone()),
        session: session.map(|s| s.id),
        caps: caps.clone(),
        answer_undeclared,
    }
}

/// The upstream's `pollInterval` within the gateway's bounds.
pub(super) fn bounded_poll(cfg: &TasksConfig, ms: Option<u64>) -> Duration {
    let max = cfg.max_poll_interval.max(MIN_UPSTREAM_POLL);
    ms.map_or(DEFAULT_UPSTREAM_POLL, Duration::from_millis)
        .clamp(MIN_UPSTREAM_POLL, max)
}

/// The upstream's `tasks/result` for a terminal task, as the gateway records it.
/// A `failed` task whose result is a `CallToolResult` is a tool error (`isError`);
/// one without is the upstream's failure, with its `statusMessage`. The upstream's
/// `related-task` key names its id, not the gateway's, so it goes.
fn terminal_outcome(status: &str, message: &str, r: CallOutcome) -> CallOutcome {
    match r {
        CallOutcome::Result(mut v) => {
            if let Some(meta) = v.get_mut("_meta").and_then(Value::as_object_mut) {
                meta.remove(META_RELATED_TASK);
                if meta.is_empty()
                    && let Some(o) = v.as_object_mut()
                {
                    o.remove("_meta");
                }
            }
            match (status, ToolResult::read(&v).has_content) {
                ("completed", _) => CallOutcome::Result(v),
                (_, true) => {
                    if let Some(o) = v.as_object_mut() {
                        o.insert("isError".into(), Value::Bool(true));
                    }
                    CallOutcome::Result(v)
                }
                _ => CallOutcome::Error(upstream_failed(message)),
            }
        }
        // A failed task's `tasks/result` may be an error about the missing result
        // (TS SDK servers: `-32603`): the status message says more.
        CallOutcome::Error(e) if status == "failed" && !message.is_empty() => CallOutcome::Error(
            upstream_failed(message)
                .with_data(json!({ "upstream_error": { "code": e.code, "message": e.message } })),
        ),
        CallOutcome::Error(e) => CallOutcome::Error(e),
    }
}

fn upstream_failed(message: &str) -> RpcError {
    let m = if message.is_empty() {
        "the upstream task failed".to_string()
    } else {
        format!("the upstream task failed: {message}")
    };
    RpcError::internal(m)
}

/// Forwards the cancel of a gateway task to the upstream task it follows, unless the
/// follower ends first (the upstream task reached a terminal state) or the gateway is
/// stopping or lost its lease: then the upstream task is left running, for the next
/// start (or the replica taking over) to re-attach to.
pub(super) struct CancelUpstream {
    engine: Arc<Engine>,
    channel: Arc<dyn TaskChannel>,
    task_id: String,
    live: bool,
}

impl CancelUpstream {
    /// Armed: dropping it cancels `task_id` unless [`ended`](Self::ended) or
    /// [`disarmed`](Self::disarm).
    pub(super) fn new(engine: &Arc<Engine>, channel: &Arc<dyn TaskChannel>, task_id: &str) -> Self {
        Self {
            engine: engine.clone(),
            channel: channel.clone(),
            task_id: task_id.to_string(),
            live: true,
        }
    }

    /// The upstream task is over: nothing to cancel, and its session may go.
    fn ended(&mut self) {
        if std::mem::take(&mut self.live) {
            self.channel.task_ended();
        }
    }

    /// The gateway's task recorded the upstream task: its follower owns it from here.
    pub(super) fn disarm(&mut self) {
        self.live = false;
    }
}

impl Drop for CancelUpstream {
    fn drop(&mut self) {
        if !self.live || self.engine.calls.shutting_down() || !self.engine.replica.lease_held() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let channel = self.channel.clone();
        let id = std::mem::take(&mut self.task_id);
        rt.spawn(async move {
            let (tx, _rx) = mpsc::channel(1);
            let cancel = channel.call(spec(LegacyTaskMethod::Cancel, &id), tx);
            match tokio::time::timeout(CANCEL_TIMEOUT, cancel).await {
                Ok(Ok(_)) => tracing::debug!(upstream_task = %id, "upstream task cancelled"),
                Ok(Err(e)) => tracing::warn!(upstream_task = %id, error = %e, "cancelling the upstream task failed"),
                Err(_) => tracing::warn!(upstream_task = %id, "cancelling the upstream task timed out"),
            }
            channel.task_ended();
        });
    }
}

/// Count a transport failure of the follower's request; `Err` once there were too
/// many in a row, or the gateway is stopping.
fn retry(failures: &mut u32, task_id: &str, e: UpstreamError) -> Result<(), UpstreamError> {
    *failures += 1;
    if *failures >= MAX_POLL_FAILURES || matches!(e, UpstreamError::ShuttingDown) {
        return Err(e);
    }
    tracing::debug!(upstream_task = %task_id, error = %e, "upstream task poll failed; retrying");
    Ok(())
}

/// Why a task failed whose upstream asked for input that never reached the gateway.
const INPUT_LOST: &str = "the upstream task asks for input, but its request never reached \
     the gateway within input_timeout_ms (an upstream delivers a request once: one \
     delivered to a gateway process that has since stopped is lost)";

/// The upstream task is `input_required`: its `tasks/result` delivers the request (and
/// returns once the task moves on). `None` when no request came within `limit` — one
/// delivered to a previous gateway process is not delivered again, and the task would
/// wait for an answer nobody can give until its ttl.
async fn wait_for_input(
    channel: &dyn TaskChannel,
    task_id: &str,
    events: &mpsc::Sender<CallEvent>,
    limit: Duration,
) -> Option<Result<(), UpstreamError>> {
    let (tx, mut rx) = mpsc::channel(32);
    let result = channel.call(spec(LegacyTaskMethod::Result, task_id), tx);
    tokio::pin!(result);
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let mut delivered = false;
    let mut open = true;
    let r = loop {
        tokio::select! {
            biased;
            ev = rx.recv(), if open => match ev {
                Some(ev) => {
                    delivered |= matches!(ev, CallEvent::Input(_));
                    let _ = events.send(ev).await;
                }
                None => open = false,
            },
            r = &mut result => break r.map(|_| ()),
            () = &mut deadline, if !delivered => return None,
        }
    };
    while let Ok(ev) = rx.try_recv() {
        let _ = events.send(ev).await;
    }
    Some(r)
}

/// Follow the upstream task `task_id` on `channel` until a `tasks/get` says it is
/// terminal, then fetch its result. Statuses and input requests go to `events`.
pub(super) async fn follow(
    engine: Arc<Engine>,
    channel: Arc<dyn TaskChannel>,
    task_id: String,
    mut poll: Duration,
    events: mpsc::Sender<CallEvent>,
    _admitted: Option<Permit>,
) -> Result<CallOutcome, UpstreamError> {
    let mut guard = CancelUpstream::new(&engine, &channel, &task_id);
    let mut failures = 0;
    let mut last_message = String::new();
    loop {
        let task = match channel
            .call(spec(LegacyTaskMethod::Get, &task_id), events.clone())
            .await
        {
            Ok(CallOutcome::Result(v)) => v,
            // The upstream no longer knows the task (expired, or its session's state
            // is gone): nothing more will come of it.
            Ok(CallOutcome::Error(e)) => {
                guard.ended();
                return Ok(CallOutcome::Error(e));
            }
            Err(e) => {
                retry(&mut failures, &task_id, e)?;
                tokio::time::sleep(poll).await;
                continue;
            }
        };
        failures = 0;
        let shown = UpstreamTask::read(&task);
        if let Some(p) = shown.poll_interval_ms {
            poll = bounded_poll(&engine.cfg.tasks, Some(p));
        }
        let message = shown.status_message.unwrap_or_default().to_string();
        if !message.is_empty() && message != last_message {
            let mut p = Map::new();
            p.insert("message".into(), Value::from(message.clone()));
            let _ = events.send(CallEvent::Progress(p)).await;
        }
        last_message = message;
        let status = shown.status.unwrap_or("");
        match status {
            "working" => tokio::time::sleep(poll).await,
            // The upstream delivers its request through `tasks/result`, which returns
            // once the task moves on (MCP 2025-11-25 "Tasks", "Input Required Status").
            // What it returns then may not be final (a "resuming" result): only a
            // terminal `tasks/get` ends the task, so the loop asks again.
            "input_required" => {
                let wait = engine.cfg.tasks.input_timeout;
                match wait_for_input(channel.as_ref(), &task_id, &events, wait).await {
                    Some(Ok(())) => {}
                    Some(Err(e)) => {
                        retry(&mut failures, &task_id, e)?;
                        tokio::time::sleep(poll).await;
                    }
                    // `guard` cancels the upstream task, which nobody can answer.
                    None => return Ok(CallOutcome::Error(RpcError::internal(INPUT_LOST))),
                }
            }
            "completed" | "failed" => {
                let r = channel
                    .call(spec(LegacyTaskMethod::Result, &task_id), events.clone())
                    .await?;
                guard.ended();
                return Ok(terminal_outcome(status, &last_message, r));
            }
            "cancelled" => {
                guard.ended();
                let why = if last_message.is_empty() {
                    "the upstream cancelled its task".to_string()
                } else {
                    format!("the upstream cancelled its task: {last_message}")
                };
                return Ok(CallOutcome::Error(RpcError::internal(why)));
            }
            other => {
                return Err(UpstreamError::Protocol {
                    upstream: String::new(),
                    reason: format!("tasks/get answered an unknown task status {other:?}"),
                });
            }
        }
    }
}

/// Start following an upstream task: the call the driver consumes.
pub(super) fn follower(
    engine: &Arc<Engine>,
    channel: Arc<dyn TaskChannel>,
    task_id: String,
    poll: Duration,
    admitted: Option<Permit>,
) -> Pending {
    let (tx, rx) = mpsc::channel(32);
    let task = tokio::spawn(follow(engine.clone(), channel, task_id, poll, tx, admitted));
    Pending::new(task, rx, engine.cfg.tasks.input_gather)
}

/// A slot of the upstream's admission gate, held for the upstream task's life.
pub(super) async fn admit_task(
    limits: &Limits,
    up: &Upstream,
    p: &Principal,
) -> Result<Permit, UpstreamError> {
    limits
        .admit(up.name(), up.cfg.max_concurrency, p, |_| {})
        .await
        .map_err(|_| UpstreamError::QueueFull {
            upstream: up.name().to_string(),
        })
}

/// Pin a session (or child), create the upstream task there and return it with its
/// `CreateTaskResult`; `Err` carries the call's answer when the upstream did not
/// create a task (an error, or a plain result).
pub(super) async fn create_upstream_task(
    cfg: &TasksConfig,
    up: &Upstream,
    p: &Principal,
    mut call: CallSpec,
) -> Result<(Arc<dyn TaskChannel>, Created2025), Result<CallOutcome, UpstreamError>> {
    let scope = crate::upstream::Scope {
        principal: p,
        session: call.session.as_deref(),
    };
    let channel = up.pin(scope).await.map_err(Err)?;
    let ttl = crate::config::as_millis(cfg.ttl);
    call.params.insert("task".into(), json!({ "ttl": ttl }));
    call.tenant = Some(p.tenant.clone());
    let (tx, _rx) = mpsc::channel(1);
    let limit = cfg.sync_timeout;
    let answered = match tokio::time::timeout(limit, channel.call(call, tx)).await {
        Ok(r) => r,
        Err(_) => Err(UpstreamError::TimedOut {
            upstream: up.name().to_string(),
            after_ms: crate::config::as_millis(limit),
        }),
    };
    match answered {
        Ok(CallOutcome::Result(v)) => match created_task(&v) {
            Some(t) => {
                channel.task_started();
                tracing::debug!(upstream = %up.name(), upstream_task = %t.task_id, "upstream task created");
                Ok((channel, t))
            }
            // The server ran the call without a task after all.
            None => Err(Ok(CallOutcome::Result(v))),
        },
        other => Err(other),
    }
}

/// The upstream keeps its task for `ttl_ms`: a task that outlived it could show
/// nothing, so its `ttlMs` says the shorter time.
pub(super) async fn shorten_ttl(
    tasks: &TaskRepo,
    route: &RequestRoute,
    created_at_ms: u64,
    ttl_ms: u64,
) {
    let Some(task_id) = &route.task_id else {
        return;
    };
    let r = tasks
        .update(task_id, Some(&route.route_id), &mut |rec| {
            if rec.status.is_terminal() || rec.ttl_ms <= ttl_ms {
                return false;
            }
            rec.ttl_ms = ttl_ms;
            rec.expires_at_ms = created_at_ms + ttl_ms;
            true
        })
        .await;
    if let Err(e) = r {
        tracing::warn!(task = %task_id, error = %e, "shortening the task's ttl to the upstream's failed");
    }
}

/// A `required` upstream task tool called by a 2025-era session without task
/// augmentation: the upstream task is followed inline, as one long call (its input
/// requests reach the session like any inline call's).
pub(super) fn start_inline(
    engine: &Arc<Engine>,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    call: CallSpec,
) -> Pending {
    let (tx, rx) = mpsc::channel::<CallEvent>(32);
    let gather = engine.cfg.tasks.input_gather;
    let engine = engine.clone();
    let up = upstream.clone();
    let p = principal.clone();
    let task = tokio::spawn(async move {
        let admitted = admit_task(&engine.limits, &up, &p).await?;
        match create_upstream_task(&engine.cfg.tasks, &up, &p, call).await {
            Ok((channel, created)) => {
                let poll = bounded_poll(&engine.cfg.tasks, created.poll);
                follow(engine, channel, created.task_id, poll, tx, Some(admitted)).await
            }
            Err(r) => r,
        }
    });
    Pending::new(task, rx, gather)
}

/// Re-attach to the upstream task of a route a previous process left (HTTP: its
/// session outlives the gateway). `false` when it cannot be reached again, so the
/// caller fails the task as for any call that was in flight.
pub(super) async fn reattach(
    engine: &Arc<Engine>,
    upstreams: &Arc<UpstreamSet>,
    route: &RequestRoute,
) -> Result<bool, StoreError> {
    let _ = engine.upstreams.set(upstreams.clone());
    let Some(channel) = adopt_session(upstreams, route) else {
        return Ok(false);
    };
    // This process holds the route now (a new seat, when replicas share a store).
    engine.tasks.put_route(route).await?;
    resume_following(engine, route, channel).await
}

/// A takeover moved to this seat the route of an upstream task a lost replica
/// followed: follow it from here. One that cannot be followed stays on this seat, and
/// the orphan sweep fails its task.
pub(super) async fn follow_adopted(engine: &Arc<Engine>, route: &RequestRoute) {
    let Some(upstreams) = engine.upstreams.get() else {
        return;
    };
    let Some(channel) = adopt_session(upstreams, route) else {
        return;
    };
    if let Err(e) = resume_following(engine, route, channel).await {
        tracing::warn!(route = %route.route_id, error = %e, "re-attaching to a taken-over upstream task failed");
    }
}

/// Follow the upstream task of `route` (held by this process) on `channel`, which
/// `follow.rs` reached again after a restart or a takeover: the task is `working`
/// again and its follower goes to the driver. `false` when the task is over.
async fn resume_following(
    engine: &Arc<Engine>,
    route: &RequestRoute,
    channel: Arc<dyn TaskChannel>,
) -> Result<bool, StoreError> {
    let (Some(task_id), Some(ut)) = (&route.task_id, &route.upstream_task) else {
        return Ok(false);
    };
    // Input requests of the previous process had their answer channels there;
    // the upstream asks again through `tasks/result`.
    let live = engine
        .tasks
        .update(task_id, Some(&route.route_id), &mut |rec| {
            if rec.status.is_terminal() {
                return false;
            }
            rec.input_requests.clear();
            rec.status = TaskStatus::Working;
            rec.status_message = Some(REATTACHED.into());
            rec.last_updated_at_ms = now_ms();
            true
        })
        .await?;
    if live.is_none() {
        return Ok(false);
    }
    channel.task_started();
    let poll = bounded_poll(&engine.cfg.tasks, None);
    let follower = follower(engine, channel, ut.task_id.clone(), poll, None);
    engine.calls.register(task_id, follower.abort_handle());
    tokio::spawn(driver::drive(
        engine.clone(),
        Driven {
            task_id: task_id.clone(),
            route_id: route.route_id.clone(),
            upstream: route.upstream.clone(),
            caps: ut.caps.clone(),
            answer_undeclared: ut.answer_undeclared,
            call: follower,
            awaiting_input: false,
        },
    ));
    engine.changed(task_id);
    tracing::info!(task = %task_id, upstream = %route.upstream, upstream_task = %ut.task_id, "{REATTACHED}");
    Ok(true)
}

/// The upstream session a route's upstream task lives in, reached again.
fn adopt_session(upstreams: &UpstreamSet, route: &RequestRoute) -> Option<Arc<dyn TaskChannel>> {
    let ut = route.upstream_task.as_ref()?;
    let session = SessionRef {
        id: ut.session.clone()?,
        version: ut.session_version.clone(),
    };
    let principal = Principal {
        tenant: route.tenant.clone(),
        subject: route.subject.clone(),
    };
    upstreams
        .by_name(&route.upstream)?
        .adopt(&principal, &session)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_results_keep_tool_errors_and_drop_the_upstream_task_key() {
        let r = json!({"content": [{"type": "text", "text": "ok"}],
            "_meta": {META_RELATED_TASK: {"taskId": "up-1"}}});
        let CallOutcome::Result(v) = terminal_outcome("completed", "", CallOutcome::Result(r))
        else {
            panic!("a completed task keeps its result");
        };
        assert!(v.get("_meta").is_none(), "{v}");
        let r = json!({"content": [{"type": "text", "text": "bad"}]});
        let CallOutcome::Result(v) = terminal_outcome("failed", "x", CallOutcome::Result(r)) else {
            panic!("a failed task with a tool result is a tool error");
        };
        assert_eq!(v["isError"], true);
        // Python SDK servers answer a failed task's tasks/result with `_meta` only.
        let r = json!({"_meta": {META_RELATED_TASK: {"taskId": "up-1"}}});
        let CallOutcome::Error(e) = terminal_outcome("failed", "boom", CallOutcome::Result(r))
        else {
            panic!("a failed task without a tool result is an error");
        };
        assert!(e.message.contains("boom"), "{}", e.message);
    }

    #[test]
    fn created_tasks_are_read_from_the_2025_shape() {
        let t = created_task(&json!({"task": {"taskId": "t1", "status": "working",
            "ttl": 300000, "pollInterval": 500}}))
        .expect("a CreateTaskResult");
        assert_eq!(
            (t.task_id.as_str(), t.ttl_ms, t.poll),
            ("t1", Some(300000), Some(500))
        );
        assert!(created_task(&json!({"content": []})).is_none());
    }
}
