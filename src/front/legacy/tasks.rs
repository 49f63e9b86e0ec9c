//! The 2025-11-25 task dialect in a legacy session (docs/design.md §25, "The two
//! task dialects, method by method"). Only a session that negotiated 2025-11-25 sees
//! it: `initialize` advertises the `tasks` capability, `tools/list` marks each tool's
//! `execution.taskSupport`, a task-augmented `tools/call` gets a `CreateTaskResult`
//! from the same engine a 2026 client's promoted call does, and the session serves
//! `tasks/get`, the blocking `tasks/result` (input requests on its stream, the answers
//! relayed as `tasks/update` would), `tasks/list` and `tasks/cancel`. The task is the
//! record a 2026 client would see: owned by the principal, not by the session.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;

use super::super::answer::Final;
use super::super::gateway::Gateway;
use super::super::reply::{self, Body};
use super::dialect;
use super::live::LegacyLive;
use crate::auth::Principal;
use crate::config::{TaskMode, UpstreamConfig};
use crate::protocol::params::{Field, TaskRef, TaskUpdate};
use crate::protocol::{self, RequestId, RpcError, fields};
use crate::store::{SessionRecord, TaskRecord, TaskStatus};
use crate::tasks::Reply;
use crate::tasks::{Change, Engine};
use crate::tasks::{ErrorClass, Failure};
use crate::upstream::{InputAnswer, Upstream};

/// The one 2025-era version with the task dialect (MCP 2025-11-25 "Tasks").
pub(super) const TASKS_VERSION: &str = "2025-11-25";

/// How many tasks one `tasks/list` page holds.
const LIST_PAGE: usize = 100;

/// Whether a session of `version` speaks the task dialect.
pub(super) fn speaks_tasks(version: &str) -> bool {
    version == TASKS_VERSION
}

/// The server `tasks` capability the gateway serves (MCP 2025-11-25 "Tasks",
/// "Server Capabilities"), added when the upstream has tools.
pub(super) fn advertise(caps: &mut Map<String, Value>) {
    if caps.contains_key("tools") {
        caps.insert(
            "tasks".into(),
            json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        );
    }
}

/// Mark each tool of a `tools/list` result: any tool may run as a gateway task
/// (`optional`), unless configured `task = "never"` (the field left out: forbidden;
/// MCP 2025-11-25 "Tasks", "Tool-Level Negotiation"). The upstream's own value is
/// replaced: the gateway, not the upstream, runs a 2025 client's task.
pub(super) fn mark_tools(cfg: &UpstreamConfig, result: &mut Value) {
    let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
        return;
    };
    for tool in tools {
        let never = fields::tool_name(tool)
            .and_then(|n| cfg.tools.get(n))
            .is_some_and(|t| t.task == TaskMode::Never);
        let Some(t) = tool.as_object_mut() else {
            continue;
        };
        let execution = t
            .entry("execution")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(execution) = execution.as_object_mut() else {
            continue;
        };
        if never {
            execution.remove("taskSupport");
        } else {
            execution.insert("taskSupport".into(), Value::from("optional"));
        }
        if execution.is_empty() {
            t.remove("execution");
        }
    }
}

/// One request of the task dialect in a resolved session.
pub(super) struct TaskSession<'a> {
    pub(super) gw: &'a Gateway,
    pub(super) upstream: &'a Arc<Upstream>,
    pub(super) principal: &'a Principal,
    pub(super) rec: &'a SessionRecord,
}

fn json_answer(id: &RequestId, result: Value) -> Response<Body> {
    reply::json(StatusCode::OK, &protocol::response(id, result))
}

fn error_200(id: &RequestId, e: &RpcError) -> Response<Body> {
    reply::rpc_error(StatusCode::OK, Some(id), e)
}

fn failed(id: &RequestId, f: Failure) -> Response<Body> {
    Final::of(id, Reply::Failed(f)).into_response()
}

impl TaskSession<'_> {
    fn name(&self) -> &str {
        self.upstream.name()
    }

    /// The answer to a task-augmented `tools/call` (MCP 2025-11-25 "Tasks", "Creating
    /// Tasks"), whose task the engine wrote durably before this: the
    /// `CreateTaskResult`, or for a replayed key whose task has ended, that task.
    pub(super) async fn created(&self, id: &RequestId, rec: &TaskRecord) -> Response<Body> {
        if matches!(rec.status, TaskStatus::Working | TaskStatus::InputRequired) {
            self.gw
                .legacy
                .task_created(&self.rec.session_id, &rec.task_id);
            return json_answer(id, dialect::create_result(rec));
        }
        // A duplicate of a finished task (an idempotency argument): its status in this
        // dialect may differ from the 2026 one (`isError` → `failed`).
        match self.snapshot(&TaskRef::to(&rec.task_id)).await {
            Ok(rec) => json_answer(id, json!({ "task": dialect::task(&rec) })),
            Err(f) => failed(id, f),
        }
    }

    /// The task for `params.taskId`, shown to its owner (ownership, expiry, a durable
    /// terminal state: `Engine::owner_snapshot`).
    async fn snapshot(&self, task: &TaskRef) -> Result<Arc<TaskRecord>, Failure> {
        self.gw
            .engine
            .owner_snapshot(self.principal, self.name(), task)
            .await
    }

    /// `tasks/get` (MCP 2025-11-25 "Tasks", "Getting Tasks"), after the poll limiter
    /// every poll passes (`dispatch.rs`, docs/design.md §8).
    pub(super) async fn get(&self, id: &RequestId, task: &TaskRef) -> Response<Body> {
        match self.snapshot(task).await {
            Ok(rec) => {
                self.gw.engine.note_seen(&rec);
                json_answer(id, Value::Object(dialect::task(&rec)))
            }
            Err(f) => failed(id, f),
        }
    }

    /// `tasks/cancel` (MCP 2025-11-25 "Tasks", "Cancelling Tasks"): the task is
    /// `cancelled` before the answer, which is the task; a terminal task is refused
    /// with `-32602`.
    pub(super) async fn cancel(&self, id: &RequestId, task: &TaskRef) -> Response<Body> {
        let rec = match self.snapshot(task).await {
            Ok(r) => r,
            Err(f) => return failed(id, f),
        };
        if rec.status.is_terminal() {
            return error_200(id, &dialect::cancel_refused(&rec));
        }
        let engine = &self.gw.engine;
        if let Err(f) = engine
            .cancel(self.principal, self.name(), task, &Value::Null)
            .await
        {
            return failed(id, f);
        }
        match self.snapshot(task).await {
            Ok(rec) if rec.status == TaskStatus::Cancelled => {
                json_answer(id, Value::Object(dialect::task(&rec)))
            }
            // It ended on its own first.
            Ok(rec) => error_200(id, &dialect::cancel_refused(&rec)),
            Err(f) => failed(id, f),
        }
    }

    /// `tasks/list` (MCP 2025-11-25 "Tasks", "Listing Tasks"): the principal's own
    /// tasks on this endpoint, whichever era created them, a page at a time.
    pub(super) async fn list(&self, id: &RequestId, cursor: Field<String>) -> Response<Body> {
        if cursor == Field::Invalid {
            return error_200(
                id,
                &RpcError::invalid_params("params.cursor must be a string"),
            );
        }
        let cursor = cursor.valid().map(String::as_str);
        let page = self
            .gw
            .engine
            .list_owned(self.principal, self.name(), cursor, LIST_PAGE)
            .await;
        match page {
            Ok((records, next)) => {
                let tasks: Vec<Value> = records
                    .iter()
                    .map(|r| Value::Object(dialect::task(r)))
                    .collect();
                let mut result = Map::new();
                result.insert("tasks".into(), Value::Array(tasks));
                if let Some(n) = next {
                    result.insert("nextCursor".into(), Value::from(n));
                }
                json_answer(id, Value::Object(result))
            }
            Err(f) => failed(id, f),
        }
    }

    /// `tasks/result` (MCP 2025-11-25 "Tasks", "Retrieving Task Results"): a terminal
    /// task's payload at once; otherwise an SSE stream held with keep-alives until the
    /// task ends, carrying its status notifications and its input requests.
    pub(super) async fn result(&self, id: RequestId, task: TaskRef) -> Response<Body> {
        let rec = match self.snapshot(&task).await {
            Ok(r) => r,
            Err(f) => return failed(&id, f),
        };
        if rec.status.is_terminal() {
            self.gw.engine.note_seen(&rec);
            return payload_answer(&id, &rec).into_response();
        }
        let (tx, rx) = mpsc::channel::<Bytes>(32);
        let held = Held {
            engine: self.gw.engine.clone(),
            live: self.gw.legacy.clone(),
            principal: self.principal.clone(),
            upstream: self.name().to_string(),
            session: self.rec.session_id.clone(),
            id,
            task,
            keepalive: self.gw.cfg.server.keepalive,
        };
        // The session in use here while the stream is open; its end (DELETE, expiry)
        // ends the wait, since its answers could no longer arrive.
        let activity = self.gw.engine.sessions().activity(&self.rec.session_id);
        let ended = Box::pin(activity.ended());
        tokio::spawn(held.run(rec, tx, ended));
        reply::sse(rx, activity)
    }
}

/// The answer for a terminal task.
fn payload_answer(id: &RequestId, rec: &TaskRecord) -> Final {
    match dialect::payload(rec) {
        Ok(v) => Final::of(id, Reply::Complete(Ok(v))),
        Err(e) => Final::of(id, Reply::Complete(Err(e))),
    }
}

/// A `tasks/result` held open until its task ends.
struct Held {
    engine: Arc<Engine>,
    live: Arc<LegacyLive>,
    principal: Principal,
    upstream: String,
    session: String,
    id: RequestId,
    task: TaskRef,
    keepalive: Duration,
}

/// What one wait of a held `tasks/result` ended with.
enum Woken {
    /// Read the task again.
    Reread,
    /// The client answered one of the task's input requests.
    Answer(String, InputAnswer),
    /// The client went away, or the session ended.
    Gone,
}

/// The end of the session a held `tasks/result` belongs to.
type SessionEnded = std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>;

impl Held {
    async fn run(self, first: Arc<TaskRecord>, tx: mpsc::Sender<Bytes>, mut ended: SessionEnded) {
        // Subscribed before the second read, so no change between them is missed.
        let mut changes = self.engine.subscribe_changes();
        let (answers_tx, mut answers) = mpsc::channel::<(String, InputAnswer)>(16);
        let mut relayed_keys: HashSet<String> = HashSet::new();
        let mut relayed_ids: Vec<String> = Vec::new();
        let mut shown = dialect::status(&first);
        let task_id = first.task_id.clone();
        // The latest read of the task: what an input answer is checked against.
        let mut last = first;
        let _ = tx.send(reply::sse_keepalive()).await;
        // One keep-alive clock for the whole wait: changes that come more often than
        // it (progress) must not keep postponing it.
        let mut keepalive_at = Instant::now() + self.keepalive;
        loop {
            match self
                .engine
                .owner_snapshot(&self.principal, &self.upstream, &self.task)
                .await
            {
                Ok(rec) => {
                    if dialect::status(&rec) != shown {
                        shown = dialect::status(&rec);
                        if tx
                            .send(reply::sse_event(&dialect::status_notification(&rec)))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    if rec.status.is_terminal() {
                        self.engine.note_seen(&rec);
                        let f = payload_answer(&self.id, &rec);
                        let _ = tx.send(reply::sse_event(&f.message)).await;
                        break;
                    }
                    if rec.status == TaskStatus::InputRequired
                        && !self
                            .relay_inputs(
                                &rec,
                                &tx,
                                &answers_tx,
                                &mut relayed_keys,
                                &mut relayed_ids,
                            )
                            .await
                    {
                        break;
                    }
                    last = rec;
                }
                // The store cannot answer now: that is no outcome of the call, so
                // wait and read again rather than end the stream with it.
                Err(f) if matches!(f.class, ErrorClass::RetryLater(_)) => {}
                Err(f) => {
                    let f = Final::of(&self.id, Reply::Failed(f));
                    let _ = tx.send(reply::sse_event(&f.message)).await;
                    break;
                }
            }
            let woken = self
                .wait(
                    &task_id,
                    &mut changes,
                    &mut answers,
                    &tx,
                    &mut keepalive_at,
                    &mut ended,
                )
                .await;
            match woken {
                Woken::Reread => {}
                Woken::Answer(key, answer) => self.answer(&last, key, answer).await,
                Woken::Gone => break,
            }
        }
        self.live.forget(&self.session, &relayed_ids);
    }

    /// Send the task's input requests not yet sent on this stream, each with an id of
    /// the gateway's; the client's answer comes back as a POSTed response.
    async fn relay_inputs(
        &self,
        rec: &TaskRecord,
        tx: &mpsc::Sender<Bytes>,
        answers: &mpsc::Sender<(String, InputAnswer)>,
        relayed_keys: &mut HashSet<String>,
        relayed_ids: &mut Vec<String>,
    ) -> bool {
        for (key, request) in &rec.input_requests {
            if !relayed_keys.insert(key.clone()) {
                continue;
            }
            let (otx, orx) = oneshot::channel();
            let gid = self.live.relay(&self.session, otx);
            relayed_ids.push(gid.clone());
            let Some(msg) = dialect::input_request(&rec.task_id, &gid, request) else {
                continue;
            };
            let (key, answers) = (key.clone(), answers.clone());
            tokio::spawn(async move {
                if let Ok(a) = orx.await {
                    let _ = answers.send((key, a)).await;
                }
            });
            if tx.send(reply::sse_event(&msg)).await.is_err() {
                return false;
            }
        }
        true
    }

    async fn wait(
        &self,
        task_id: &str,
        changes: &mut broadcast::Receiver<Change>,
        answers: &mut mpsc::Receiver<(String, InputAnswer)>,
        tx: &mpsc::Sender<Bytes>,
        keepalive_at: &mut Instant,
        ended: &mut SessionEnded,
    ) -> Woken {
        let tick = tokio::time::sleep_until(*keepalive_at);
        tokio::pin!(tick);
        loop {
            tokio::select! {
                c = changes.recv() => match c {
                    Ok(Change::Task(t)) if t != task_id => {}
                    Err(broadcast::error::RecvError::Closed) => return Woken::Gone,
                    // This task, or changes were missed.
                    _ => return Woken::Reread,
                },
                Some((key, a)) = answers.recv() => return Woken::Answer(key, a),
                () = ended.as_mut() => return Woken::Gone,
                _ = &mut tick => {
                    // A keep-alive, and a read: an expiry or a change on another
                    // replica that was not announced still shows.
                    *keepalive_at = Instant::now() + self.keepalive;
                    return if tx.send(reply::sse_keepalive()).await.is_ok() {
                        Woken::Reread
                    } else {
                        Woken::Gone
                    };
                }
                _ = tx.closed() => return Woken::Gone,
            }
        }
    }

    /// The client's answer to input request `key`, applied as a `tasks/update` with
    /// that one answer would be. An error answer has no `tasks/update` form; for an
    /// elicitation it is the user dismissing it (`cancel`), any other stays pending
    /// until the gateway's input timeout.
    async fn answer(&self, rec: &TaskRecord, key: String, answer: InputAnswer) {
        let value = match answer {
            InputAnswer::Result(v) => v,
            InputAnswer::Error(_)
                if rec.input_requests.get(&key).and_then(fields::method_of)
                    == Some("elicitation/create") =>
            {
                json!({"action": "cancel"})
            }
            InputAnswer::Error(_) => return,
        };
        let mut responses = Map::new();
        responses.insert(key, value);
        let update = TaskUpdate {
            task: TaskRef::to(&rec.task_id),
            input_responses: Field::Valid(responses),
        };
        if let Err(f) = self
            .engine
            .update(&self.principal, &self.upstream, update, &Value::Null)
            .await
        {
            tracing::warn!(task = %rec.task_id, error = %f.error.message, "a 2025-11-25 input answer was not applied");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn tools_are_marked_optional_unless_never() {
        let cfg = Config::parse(
            r#"
[auth]
mode = "none"
[[upstream]]
name = "a"
command = ["x"]
[upstream.tools.quiet]
task = "never"
"#,
        )
        .unwrap();
        let mut r = json!({"tools": [
            {"name": "slow", "execution": {"taskSupport": "required"}},
            {"name": "plain"},
            {"name": "quiet", "execution": {"taskSupport": "optional"}},
        ]});
        mark_tools(&cfg.upstreams[0], &mut r);
        assert_eq!(r["tools"][0]["execution"]["taskSupport"], "optional");
        assert_eq!(r["tools"][1]["execution"]["taskSupport"], "optional");
        assert!(r["tools"][2].get("execution").is_none(), "{r}");
    }

    #[test]
    fn the_capability_needs_tools() {
        let mut with = Map::new();
        with.insert("tools".into(), json!({}));
        advertise(&mut with);
        assert_eq!(with["tasks"]["requests"]["tools"]["call"], json!({}));
        assert!(with["tasks"].get("list").is_some() && with["tasks"].get("cancel").is_some());
        let mut without = Map::new();
        advertise(&mut without);
        assert!(without.is_empty());
    }
}
