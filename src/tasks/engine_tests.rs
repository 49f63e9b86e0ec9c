//! The engine in process: the in-memory store, a scripted upstream transport and
//! paused tokio time (deadlines and timeouts cost no wall time). Expiry compares the
//! wall clock (`store::now_ms`), so those cases use a ttl of a few milliseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::Engine;
use super::call::tools_call;
use super::mrtr::Holds;
use super::outcome::Reply;
use super::promote::Promotion;
use super::tool_call::ToolCall;
use crate::auth::Principal;
use crate::config::{Config, OnInput, TaskMode};
use crate::limits::Limits;
use crate::protocol::params::{Field, TaskRef, TaskUpdate, ToolCallParams};
use crate::protocol::{ClientCaps, Request, RequestMeta};
use crate::store::faulty::FaultyStore;
use crate::store::memory::MemoryStore;
use crate::store::{StoreError, TaskStatus, TaskStore};
use crate::tasks::failure::ErrorClass;
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, InputAnswer, InputRequest, LegacyTransport,
    SessionNotification, TransportState, Upstream, UpstreamError, UpstreamInfo,
};
use futures_util::future::BoxFuture;

type Handler = Arc<
    dyn Fn(
            CallSpec,
            mpsc::Sender<CallEvent>,
        ) -> BoxFuture<'static, Result<CallOutcome, UpstreamError>>
        + Send
        + Sync,
>;

/// A legacy upstream whose every call runs `handler`; counts calls and notes calls
/// that were dropped (cancelled) before they answered.
struct Scripted {
    handler: Handler,
    calls: AtomicUsize,
    dropped: Arc<AtomicUsize>,
    notes: broadcast::Sender<SessionNotification>,
}

/// Counts a call as dropped unless it finished.
struct DropGuard(Arc<AtomicUsize>, bool);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn info() -> UpstreamInfo {
    UpstreamInfo {
        protocol_version: "2025-06-18".into(),
        capabilities: serde_json::from_value(json!({"tools": {}})).unwrap_or_default(),
        server_info: json!({"name": "scripted", "version": "1"}),
        instructions: None,
    }
}

impl LegacyTransport for Scripted {
    fn ensure_ready(&self) -> BoxFuture<'_, Result<Arc<UpstreamInfo>, UpstreamError>> {
        Box::pin(async { Ok(Arc::new(info())) })
    }
    fn info(&self) -> Option<Arc<UpstreamInfo>> {
        Some(Arc::new(info()))
    }
    fn state(&self) -> TransportState {
        TransportState::Ready
    }
    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let run = (self.handler)(spec, events);
        let dropped = self.dropped.clone();
        Box::pin(async move {
            let mut guard = DropGuard(dropped, false);
            let r = run.await;
            guard.1 = true;
            r
        })
    }
    fn notifications(&self) -> broadcast::Receiver<SessionNotification> {
        self.notes.subscribe()
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    // The scripted upstream advertises no tasks: nothing pins it.
    fn pin(&self) -> BoxFuture<'_, Result<Arc<dyn crate::upstream::TaskChannel>, UpstreamError>> {
        Box::pin(async {
            Err(UpstreamError::Unavailable {
                upstream: "scripted".into(),
                reason: "no upstream tasks".into(),
            })
        })
    }
    fn adopt(
        &self,
        _session: &crate::upstream::SessionRef,
    ) -> Option<Arc<dyn crate::upstream::TaskChannel>> {
        None
    }
    fn live_tasks(&self) -> usize {
        0
    }
}

struct Rig {
    engine: Arc<Engine>,
    store: Arc<dyn TaskStore>,
    /// The same store, to fail operations and count calls.
    faulty: Arc<FaultyStore>,
    upstream: Arc<Upstream>,
    transport: Arc<Scripted>,
    principal: Principal,
    server_info: Value,
}

const CONFIG: &str = r#"
[auth]
mode = "none"
[tasks]
promote_after_ms = 1000
input_timeout_ms = 10000
input_gather_ms = 50
[[upstream]]
name = "demo"
command = ["unused"]
"#;

fn rig(handler: Handler) -> Rig {
    rig_with(CONFIG, handler)
}

fn rig_with(config: &str, handler: Handler) -> Rig {
    let cfg = Config::parse(config).expect("config");
    let faulty = FaultyStore::new(MemoryStore::new());
    let store: Arc<dyn TaskStore> = faulty.clone();
    let limits = Limits::from_config(&cfg);
    let transport = Arc::new(Scripted {
        handler,
        calls: AtomicUsize::new(0),
        dropped: Arc::new(AtomicUsize::new(0)),
        notes: broadcast::channel(4).0,
    });
    let upstream = Upstream::from_transport(cfg.upstreams[0].clone(), transport.clone());
    let holds = Holds::new([7; 32], cfg.tasks.input_timeout, None);
    let engine = Engine::new(store.clone(), Arc::new(cfg), limits, holds);
    Rig {
        engine,
        store,
        faulty,
        upstream,
        transport,
        principal: alice(),
        server_info: json!({"name": "scripted", "version": "1"}),
    }
}

fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(CallSpec, mpsc::Sender<CallEvent>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<CallOutcome, UpstreamError>> + Send + 'static,
{
    Arc::new(move |spec, events| Box::pin(f(spec, events)))
}

fn text(s: &str) -> CallOutcome {
    CallOutcome::Result(json!({"content": [{"type": "text", "text": s}]}))
}

fn alice() -> Principal {
    Principal {
        tenant: "acme".into(),
        subject: "alice".into(),
    }
}

fn request(args: Value, key: Option<&str>) -> Request<ToolCallParams> {
    let mut params = Map::new();
    params.insert("name".into(), Value::from("tool"));
    params.insert("arguments".into(), args);
    let caps = json!({"elicitation": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}});
    Request {
        id: json!(1),
        method: crate::protocol::Method::ToolsCall,
        params: ToolCallParams::parse(params),
        meta: RequestMeta {
            protocol_version: "2026-07-28".into(),
            caps: ClientCaps(caps.as_object().cloned().unwrap_or_default()),
            client_info: None,
            log_level: None,
            progress_token: None,
            trace: Default::default(),
        },
        idempotency_key: key.map(str::to_string),
    }
}

impl Rig {
    fn call(
        &self,
        req: Request<ToolCallParams>,
        promote_after_ms: u64,
        call_timeout: Option<u64>,
    ) -> ToolCall<'_> {
        ToolCall {
            upstream: &self.upstream,
            principal: &self.principal,
            req,
            tool: "tool".into(),
            server_info: &self.server_info,
            promotion: Promotion {
                mode: TaskMode::Optional,
                promote_after: Duration::from_millis(promote_after_ms),
                on_input: OnInput::Task,
                idempotency_argument: None,
                call_timeout: call_timeout.map(Duration::from_millis),
                plain_clients: crate::config::PlainClients::Hold,
            },
            answer_undeclared: false,
            handle: false,
        }
    }

    async fn tools_call(&self, args: Value, promote_after_ms: u64) -> Reply {
        let c = self.call(request(args, None), promote_after_ms, None);
        tools_call(&self.engine, c).await
    }

    async fn status(&self, task_id: &str) -> TaskStatus {
        self.store
            .get(task_id)
            .await
            .ok()
            .flatten()
            .map(|r| r.status)
            .expect("task exists")
    }

    /// Let spawned tasks (drivers, settles) run to their next wait.
    async fn settle(&self) {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    async fn get(&self, task_id: &str) -> Result<Value, crate::protocol::RpcError> {
        let si = json!({"name": "scripted"});
        let got = self
            .engine
            .get(&alice(), "demo", &TaskRef::to(task_id), &si)
            .await
            .map_err(|f| f.error)?;
        Ok(serde_json::to_value(&got).unwrap_or_default())
    }

    async fn update(&self, task_id: &str, responses: Value) {
        let update = TaskUpdate {
            task: TaskRef::to(task_id),
            input_responses: match responses {
                Value::Object(r) => Field::Valid(r),
                _ => Field::Invalid,
            },
        };
        self.engine
            .update(&alice(), "demo", update, &json!({}))
            .await
            .expect("update");
    }

    async fn cancel(&self, task_id: &str) {
        self.engine
            .cancel(&alice(), "demo", &TaskRef::to(task_id), &json!({}))
            .await
            .expect("cancel");
    }
}

fn task_id(r: &Reply) -> String {
    match r {
        Reply::Task(rec) => rec.task_id.clone(),
        other => panic!("expected a task, got {other:?}"),
    }
}

fn sleep_then(ms: u64, answer: &'static str) -> Handler {
    handler(move |_, _| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(text(answer))
    })
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_deadline_is_inline_a_later_one_a_task() {
    let r = rig(sleep_then(500, "fast"));
    match r.tools_call(json!({}), 1000).await {
        Reply::Complete(Ok(v)) => assert_eq!(v["content"][0]["text"], "fast"),
        other => panic!("{other:?}"),
    }
    assert!(
        r.store.count_by_status().await.unwrap().is_empty(),
        "no task"
    );

    let r = rig(sleep_then(3000, "slow"));
    let id = task_id(&r.tools_call(json!({}), 1000).await);
    assert_eq!(r.status(&id).await, TaskStatus::Working);
    tokio::time::sleep(Duration::from_secs(3)).await;
    r.settle().await;
    let got = r.get(&id).await.unwrap();
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"]["content"][0]["text"], "slow", "{got}");
}

/// The answer and the deadline at the same instant: either the answer goes back
/// inline and no task exists, or a task exists and holds the answer — never a task
/// that lost it, never both.
#[tokio::test(start_paused = true)]
async fn the_promotion_race_at_the_deadline_loses_nothing() {
    for _ in 0..20 {
        let r = rig(sleep_then(1000, "tie"));
        match r.tools_call(json!({}), 1000).await {
            Reply::Complete(Ok(v)) => {
                assert_eq!(v["content"][0]["text"], "tie");
                assert!(r.store.count_by_status().await.unwrap().is_empty());
            }
            reply => {
                let id = task_id(&reply);
                tokio::time::sleep(Duration::from_millis(10)).await;
                r.settle().await;
                let got = r.get(&id).await.unwrap();
                assert_eq!(got["status"], "completed", "{got}");
                assert_eq!(got["result"]["content"][0]["text"], "tie", "{got}");
            }
        }
        assert_eq!(r.transport.calls.load(Ordering::SeqCst), 1);
    }
}

/// Two elicitations close together become one set of input requests; answering one
/// leaves the task waiting for the other; the call gets both answers.
#[tokio::test(start_paused = true)]
async fn input_requests_are_gathered_and_partial_answers_keep_waiting() {
    let ask = handler(|_, events: mpsc::Sender<CallEvent>| async move {
        let mut answers = Vec::new();
        let mut rxs = Vec::new();
        for q in ["first?", "second?"] {
            let (tx, rx) = oneshot::channel();
            let _ = events
                .send(CallEvent::Input(InputRequest {
                    method: "elicitation/create".into(),
                    params: Some(json!({"message": q, "requestedSchema": {"type": "object"}})),
                    respond: tx,
                }))
                .await;
            tokio::time::sleep(Duration::from_millis(10)).await;
            rxs.push(rx);
        }
        for rx in rxs {
            match rx.await {
                Ok(InputAnswer::Result(v)) => answers.push(v["content"]["a"].clone()),
                _ => answers.push(Value::Null),
            }
        }
        Ok(CallOutcome::Result(
            json!({"content": [], "answers": answers}),
        ))
    });
    let r = rig(ask);
    let reply = r.tools_call(json!({}), 1000).await;
    let id = task_id(&reply);
    let Reply::Task(created) = &reply else {
        unreachable!()
    };
    assert_eq!(
        created.status,
        TaskStatus::InputRequired,
        "input promotes at once: {created:?}"
    );
    let got = r.get(&id).await.unwrap();
    let keys: Vec<&String> = got["inputRequests"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["elicitation-1", "elicitation-2"], "{got}");

    r.update(
        &id,
        json!({"elicitation-2": {"action": "accept", "content": {"a": 2}}}),
    )
    .await;
    let got = r.get(&id).await.unwrap();
    assert_eq!(got["status"], "input_required", "{got}");
    let keys: Vec<&String> = got["inputRequests"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["elicitation-1"], "{got}");

    r.update(
        &id,
        json!({"elicitation-1": {"action": "accept", "content": {"a": 1}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    r.settle().await;
    let got = r.get(&id).await.unwrap();
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"]["answers"], json!([1, 2]), "{got}");
}

/// A cancel that lands while the answer arrives: the first terminal state wins and
/// stays; a cancel before the answer drops the upstream call.
#[tokio::test(start_paused = true)]
async fn cancel_racing_completion_keeps_the_first_terminal_state() {
    for _ in 0..10 {
        let r = rig(sleep_then(1000, "late"));
        let id = task_id(&r.tools_call(json!({}), 0).await);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        r.cancel(&id).await;
        r.settle().await;
        let first = r.status(&id).await;
        assert!(
            matches!(first, TaskStatus::Cancelled | TaskStatus::Completed),
            "{first:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        r.settle().await;
        assert_eq!(r.status(&id).await, first, "a terminal state never changes");
    }

    let r = rig(sleep_then(60_000, "never"));
    let id = task_id(&r.tools_call(json!({}), 0).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.cancel(&id).await;
    r.settle().await;
    assert_eq!(r.status(&id).await, TaskStatus::Cancelled);
    assert_eq!(
        r.transport.dropped.load(Ordering::SeqCst),
        1,
        "the call was cancelled"
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    r.settle().await;
    assert_eq!(r.status(&id).await, TaskStatus::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn unanswered_input_fails_the_task_after_input_timeout() {
    let ask = handler(|_, events: mpsc::Sender<CallEvent>| async move {
        let (tx, rx) = oneshot::channel();
        let _ = events
            .send(CallEvent::Input(InputRequest {
                method: "elicitation/create".into(),
                params: Some(json!({"message": "?", "requestedSchema": {"type": "object"}})),
                respond: tx,
            }))
            .await;
        let _ = rx.await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(text("unreachable"))
    });
    let r = rig(ask);
    let id = task_id(&r.tools_call(json!({}), 1000).await);
    assert_eq!(r.status(&id).await, TaskStatus::InputRequired);
    tokio::time::sleep(Duration::from_millis(10_100)).await;
    r.settle().await;
    let got = r.get(&id).await.unwrap();
    assert_eq!(got["status"], "failed", "{got}");
    let msg = got["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("input_timeout_ms"), "{got}");
    assert_eq!(r.transport.dropped.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_past_call_timeout_fails_its_task() {
    let r = rig(sleep_then(60_000, "never"));
    let c = r.call(request(json!({}), None), 0, Some(500));
    let id = task_id(&tools_call(&r.engine, c).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    r.settle().await;
    let got = r.get(&id).await.unwrap();
    assert_eq!(got["status"], "failed", "{got}");
    assert_eq!(got["error"]["code"], -32603, "{got}");
    let msg = got["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("call_timeout_ms"), "{got}");
    assert_eq!(r.transport.dropped.load(Ordering::SeqCst), 1);
}

/// Expiry (wall clock): a finished task is swept to an owner-only tombstone, and a
/// task still running when it expires has its call stopped.
#[tokio::test(start_paused = true)]
async fn expiry_leaves_a_tombstone_and_stops_a_running_call() {
    let r = rig(sleep_then(60_000, "never"));
    // Short-lived tasks: a few wall-clock milliseconds.
    let mut cfg = (*r.engine.cfg).clone();
    cfg.tasks.ttl = Duration::from_millis(5);
    cfg.tasks.result_retention = Duration::from_millis(5);
    let engine = Engine::new(
        r.store.clone(),
        Arc::new(cfg),
        r.engine.limits.clone(),
        r.engine.holds.clone(),
    );
    let r = Rig { engine, ..r };
    let id = task_id(&r.tools_call(json!({}), 0).await);
    // The call is running upstream before the task expires.
    r.settle().await;
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.engine.sweep().await.unwrap(), 1);
    r.settle().await;
    assert_eq!(
        r.transport.dropped.load(Ordering::SeqCst),
        1,
        "the call stopped"
    );
    let err = r.get(&id).await.unwrap_err();
    assert_eq!(err.message, "task expired");
    let p = TaskRef::to(&id);
    let bob = Principal {
        tenant: "acme".into(),
        subject: "bob".into(),
    };
    let err = r
        .engine
        .get(&bob, "demo", &p, &json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        err.error.message, "task not found",
        "only the owner learns of the expiry"
    );
}

/// Concurrent calls with one idempotency key share one task and one upstream call;
/// the key with other arguments is refused.
#[tokio::test(start_paused = true)]
async fn idempotent_duplicates_share_one_task() {
    let r = Arc::new(rig(sleep_then(5000, "once")));
    let mut joins = Vec::new();
    for _ in 0..4 {
        let r = r.clone();
        joins.push(tokio::spawn(async move {
            let c = r.call(request(json!({"x": 1}), Some("key-1")), 1000, None);
            task_id(&tools_call(&r.engine, c).await)
        }));
    }
    let mut ids = Vec::new();
    for j in joins {
        ids.push(j.await.unwrap());
    }
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    let c = r.call(request(json!({"x": 2}), Some("key-1")), 1000, None);
    match tools_call(&r.engine, c).await {
        Reply::Complete(Err(e)) => assert_eq!(e.code, -32602, "{e:?}"),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    r.settle().await;
    assert_eq!(r.status(&ids[0]).await, TaskStatus::Completed);
    assert_eq!(
        r.transport.calls.load(Ordering::SeqCst),
        1,
        "one upstream call"
    );
}

/// Limits and the draining flag belong to one engine: two engines in one process,
/// each with a one-slot admission gate on an upstream of the same name, do not
/// queue behind each other, and stopping one leaves the other serving.
#[tokio::test(start_paused = true)]
async fn two_engines_in_one_process_share_no_state() {
    let config = format!("{CONFIG}max_concurrency = 1\n");
    let a = rig_with(&config, sleep_then(5000, "a"));
    let b = rig_with(&config, sleep_then(5000, "b"));
    let a1 = task_id(&a.tools_call(json!({}), 1000).await);
    let b1 = task_id(&b.tools_call(json!({}), 1000).await);
    let a2 = task_id(&a.tools_call(json!({}), 1000).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.settle().await;
    b.settle().await;
    let message = |v: &Value| v["statusMessage"].as_str().unwrap_or_default().to_string();
    let queued = message(&a.get(&a2).await.unwrap());
    assert!(
        queued.contains("queue"),
        "A's second call waits for A's slot: {queued}"
    );
    let running = message(&b.get(&b1).await.unwrap());
    assert!(!running.contains("queue"), "B has its own slot: {running}");

    a.engine.begin_shutdown();
    assert!(!b.engine.shutting_down(), "draining A does not drain B");
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.settle().await;
    b.settle().await;
    assert_eq!(b.status(&b1).await, TaskStatus::Completed);
    // A stopping keeps its in-flight task for the next start to resolve.
    assert_eq!(a.status(&a1).await, TaskStatus::Working);
}

fn io_error() -> StoreError {
    crate::store::IoError::TimedOut {
        op: "test",
        after: Duration::from_secs(10),
    }
    .into()
}

/// The class and code of a failed reply.
fn failed(r: &Reply) -> (ErrorClass, i64) {
    match r {
        Reply::Failed(f) => (f.class, f.error.code),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_quota_the_store_cannot_count_refuses_the_call() {
    let r = rig(sleep_then(10, "done"));
    r.faulty.fail("live_tasks", io_error());
    // Used to count as zero live tasks and run the call past the quota.
    let reply = r.tools_call(json!({}), 1000).await;
    assert_eq!(failed(&reply), (ErrorClass::RetryLater(1), -32603));
    assert_eq!(
        r.transport.calls.load(Ordering::SeqCst),
        0,
        "nothing may be sent"
    );
    assert_eq!(
        r.faulty.calls().get("create"),
        None,
        "nothing may be written"
    );
    r.faulty.heal("live_tasks");
    let reply = r.tools_call(json!({}), 1000).await;
    assert!(matches!(reply, Reply::Complete(Ok(_))), "{reply:?}");
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_after_the_call_was_sent_is_its_outcome() {
    for op in ["create", "flush"] {
        let r = rig(sleep_then(60_000, "late"));
        r.faulty.fail(op, io_error());
        // Past the deadline the call is under way: a 503 would invite a retry that
        // runs it twice.
        let reply = r.tools_call(json!({}), 1000).await;
        assert_eq!(failed(&reply), (ErrorClass::Outcome, -32603), "{op}");
        r.settle().await;
        assert_eq!(r.transport.calls.load(Ordering::SeqCst), 1, "{op}");
        assert_eq!(
            r.transport.dropped.load(Ordering::SeqCst),
            1,
            "{op}: the upstream call was not cancelled"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_before_the_call_was_sent_is_retry_safe() {
    let r = rig(sleep_then(10, "done"));
    r.faulty.fail("create", io_error());
    // promote_after_ms = 0: the task is written before the call starts.
    let reply = r.tools_call(json!({}), 0).await;
    assert_eq!(failed(&reply), (ErrorClass::RetryLater(1), -32603));
    assert_eq!(r.transport.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unexpected_settle_error_keeps_the_route() {
    let r = rig(sleep_then(2_000, "done"));
    let id = task_id(&r.tools_call(json!({}), 0).await);
    assert_eq!(r.store.routes().await.expect("routes").len(), 1);
    let corrupt = StoreError::Corrupt("unreadable record".into());
    r.faulty.fail("update", corrupt.clone());
    r.faulty.fail("update_fenced", corrupt);
    tokio::time::sleep(Duration::from_secs(3)).await;
    r.settle().await;
    // Used to remove the route of a task that is still `working`: nothing could
    // ever resolve it then.
    assert_eq!(r.status(&id).await, TaskStatus::Working);
    let routes = r.store.routes().await.expect("routes");
    assert_eq!(
        routes.len(),
        1,
        "the route of a non-terminal task was removed"
    );
    assert_eq!(routes[0].task_id.as_deref(), Some(id.as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_foreign_id_costs_the_store_calls_of_one_never_issued() {
    let r = rig(sleep_then(60_000, "late"));
    let id = task_id(&r.tools_call(json!({}), 0).await);
    let bob = Principal {
        tenant: "acme".into(),
        subject: "bob".into(),
    };
    let mut seen = Vec::new();
    for probe in [id.as_str(), "tsk_AAAAAAAAAAAAAAAAAAAAAA"] {
        let before = r.faulty.calls();
        let p = TaskRef::to(probe);
        let err = r
            .engine
            .get(&bob, "demo", &p, &json!({}))
            .await
            .expect_err("not bob's")
            .error;
        let after = r.faulty.calls();
        let made: Vec<_> = after
            .iter()
            .filter(|(op, n)| before.get(*op) != Some(n))
            .map(|(op, n)| (*op, n - before.get(op).copied().unwrap_or(0)))
            .collect();
        seen.push((err, made));
    }
    // Used to be `get` for the foreign id and `get` + `tombstone` for the other.
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].1, vec![("lookup_owned", 1)]);
}

#[tokio::test(start_paused = true)]
async fn the_sweep_fails_an_orphaned_task_exactly_once() {
    use crate::store::test_records::{route, task};
    let r = rig(sleep_then(60_000, "late"));
    let now = crate::store::now_ms();
    // A creation whose write landed after the gateway gave up on it: a route of this
    // gateway, older than the operation limit, that no call here knows.
    let mut orphan = route("rt_orphan", Some("tsk_orphan"));
    orphan.started_at_ms = now - 60_000;
    let mut rec = task("tsk_orphan", "acme", now + 3_600_000);
    rec.status = TaskStatus::Working;
    r.store.create(&rec, &orphan, None).await.expect("create");
    // A younger one is left alone (its creation may still be under way)...
    let mut young = route("rt_young", Some("tsk_young"));
    young.started_at_ms = now;
    r.store
        .create(&task("tsk_young", "acme", now + 3_600_000), &young, None)
        .await
        .expect("create");
    // ... and so is a running call, however old its route.
    let running = task_id(&r.tools_call(json!({}), 0).await);
    let routes = r.store.routes().await.expect("routes");
    let mut old_running = routes
        .into_iter()
        .find(|rt| rt.task_id.as_deref() == Some(running.as_str()))
        .expect("route of the running call");
    old_running.started_at_ms = now - 60_000;
    r.store.put_route(&old_running).await.expect("put route");

    assert_eq!(
        super::sweeper::resolve_orphans(&r.engine)
            .await
            .expect("sweep"),
        1
    );
    assert_eq!(r.status("tsk_orphan").await, TaskStatus::Failed);
    assert_eq!(r.status("tsk_young").await, TaskStatus::Working);
    assert_eq!(r.status(&running).await, TaskStatus::Working);
    assert_eq!(
        super::sweeper::resolve_orphans(&r.engine)
            .await
            .expect("sweep"),
        0
    );
    let left: Vec<_> = r
        .store
        .routes()
        .await
        .expect("routes")
        .into_iter()
        .map(|rt| rt.route_id)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.contains(&"rt_orphan".to_string()));
}

#[tokio::test(start_paused = true)]
async fn task_methods_answer_retry_later_while_the_store_is_down() {
    let r = rig(sleep_then(60_000, "late"));
    let id = task_id(&r.tools_call(json!({}), 0).await);
    r.faulty.fail("lookup_owned", io_error());
    let p = TaskRef::to(&id);
    // Used to be the request's outcome (200 + -32603): a poll is always retry-safe.
    let si = json!({});
    let get = r.engine.get(&alice(), "demo", &p, &si).await;
    let cancel = r.engine.cancel(&alice(), "demo", &p, &json!({})).await;
    for f in [
        get.expect_err("store down"),
        cancel.expect_err("store down"),
    ] {
        assert_eq!((f.class, f.error.code), (ErrorClass::RetryLater(1), -32603));
    }
    r.faulty.heal("lookup_owned");
    // A refusal of the request as sent stays 200.
    let p = TaskRef::to("not-a-task-id");
    let f = r
        .engine
        .get(&alice(), "demo", &p, &json!({}))
        .await
        .expect_err("malformed");
    assert_eq!((f.class, f.error.code), (ErrorClass::Outcome, -32602));
    assert_eq!(r.status(&id).await, TaskStatus::Working);
}

/// A call that asks one question 10 ms in and answers with what it was told, or
/// "no answer" when its request was refused.
fn asks_once() -> Handler {
    handler(|_, events: mpsc::Sender<CallEvent>| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (tx, rx) = oneshot::channel();
        let _ = events
            .send(CallEvent::Input(InputRequest {
                method: "elicitation/create".into(),
                params: Some(json!({"message": "now?", "requestedSchema": {"type": "object"}})),
                respond: tx,
            }))
            .await;
        match rx.await {
            Ok(InputAnswer::Result(v)) => Ok(CallOutcome::Result(
                json!({"content": [], "answer": v["content"]["a"]}),
            )),
            _ => Ok(text("no answer")),
        }
    })
}

impl Rig {
    /// Wait (in paused time) until the task reads `status`.
    async fn wait_for(&self, task_id: &str, status: TaskStatus) {
        let mut waited = 0;
        while self.status(task_id).await != status {
            tokio::time::sleep(Duration::from_millis(5)).await;
            waited += 1;
            assert!(waited < 1000, "{task_id} never read {status:?}");
        }
    }

    /// Answer `elicitation-1` with 7 and read the task once its call has ended.
    async fn answer_seven(&self, task_id: &str) -> Value {
        self.update(
            task_id,
            json!({"elicitation-1": {"action": "accept", "content": {"a": 7}}}),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.settle().await;
        self.get(task_id).await.expect("get")
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_sent_as_soon_as_the_input_request_shows_is_not_lost() {
    // Promoted first, then asks: the driver records the request, then registers the
    // channel its answer goes to. The owner answers in between.
    let r = rig(asks_once());
    let id = task_id(&r.tools_call(json!({}), 0).await);
    // The write of the input request lands at once; its reply takes a second.
    r.faulty
        .answer_late("update_fenced", Duration::from_secs(1));
    r.wait_for(&id, TaskStatus::InputRequired).await;
    r.faulty.heal("update_fenced");
    // Used to be dropped (no channel yet): the task read `working` for good.
    let got = r.answer_seven(&id).await;
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"]["answer"], 7, "{got}");
}

#[tokio::test(start_paused = true)]
async fn input_requests_meeting_a_store_outage_are_written_once_it_answers() {
    let r = rig(asks_once());
    let id = task_id(&r.tools_call(json!({}), 0).await);
    r.faulty.fail("update_fenced", io_error());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(r.status(&id).await, TaskStatus::Working);
    let tries = r.faulty.calls().get("update_fenced").copied();
    assert!(tries >= Some(3), "the write is retried: {tries:?}");
    r.faulty.heal("update_fenced");
    // Used to register the answer's channel and give up on the record: the task read
    // `working` while its call waited for an answer nobody could give.
    r.wait_for(&id, TaskStatus::InputRequired).await;
    let got = r.answer_seven(&id).await;
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"]["answer"], 7, "{got}");
}

#[tokio::test(start_paused = true)]
async fn input_requests_whose_write_landed_unseen_keep_their_keys() {
    let r = rig(asks_once());
    let id = task_id(&r.tools_call(json!({}), 0).await);
    // The write lands but its reply is lost; the retry finds it written.
    r.faulty.lose_answers("update_fenced", io_error(), 1);
    r.wait_for(&id, TaskStatus::InputRequired).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(r.faulty.calls().get("update_fenced") >= Some(&2), "retried");
    let got = r.get(&id).await.expect("get");
    let keys: Vec<&String> = got["inputRequests"]
        .as_object()
        .expect("inputRequests")
        .keys()
        .collect();
    assert_eq!(keys, ["elicitation-1"], "the retry asked again: {got}");
    let got = r.answer_seven(&id).await;
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"]["answer"], 7, "{got}");
}

#[tokio::test(start_paused = true)]
async fn input_requests_that_cannot_be_written_are_refused_to_the_upstream() {
    let r = rig(asks_once());
    let id = task_id(&r.tools_call(json!({}), 0).await);
    // One failure that is not retried: the write of the input request.
    let corrupt = StoreError::Corrupt("unreadable record".into());
    r.faulty.fail_times("update_fenced", corrupt, 1);
    // The call hears its request refused and ends; before, it waited for good.
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.settle().await;
    let got = r.get(&id).await.expect("get");
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"]["content"][0]["text"], "no answer", "{got}");
}
