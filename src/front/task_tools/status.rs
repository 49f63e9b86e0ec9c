//! One `task_status` call (docs/design.md §28), run as a call of its own so that each
//! era's held-call responder (`held.rs`) serves it as it serves any slow tool call:
//! JSON while quick, SSE keep-alives while it waits, and the task's questions relayed
//! on the call itself — a 2026 client gets them as an MRTR round whose retry answers
//! the task, a 2025-era session as requests on the call's stream. The wait reads the
//! store only: the upstream's state never matters here.
//!
//! In order: the task's poll interval is waited out (never answered early; past the
//! longest wait, a retry hint), the task is resolved for the caller (foreign and
//! never-issued alike), then the call waits up to `waitSeconds` for the task to end,
//! rereading it on each change.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;

use super::rows;
use crate::auth::Principal;
use crate::limits::{Limits, StatusSlot};
use crate::protocol::meta::ClientCaps;
use crate::protocol::params::{Field, TaskRef, TaskUpdate};
use crate::protocol::{RpcError, fields};
use crate::store::{TaskRecord, TaskStatus};
use crate::tasks::{Change, Engine, ErrorClass, Failure, Pending, missing_capability};
use crate::upstream::{CallEvent, CallOutcome, InputAnswer, InputRequest, UpstreamError};

/// Everything one status call needs.
pub(super) struct StatusCall {
    pub(super) engine: Arc<Engine>,
    pub(super) limits: Arc<Limits>,
    pub(super) principal: Principal,
    pub(super) upstream: String,
    pub(super) task_id: String,
    /// How long to wait for the task to end (`waitSeconds`, bounded).
    pub(super) wait: Duration,
    /// `max_status_wait_ms`: the longest the call may wait at all.
    pub(super) max_wait: Duration,
    /// What the client declared it can be asked.
    pub(super) caps: ClientCaps,
    pub(super) prefix: String,
    /// Held for the call's life: one of the poll burst's places.
    pub(super) _slot: StatusSlot,
}

/// The status call's outcome, as a call's.
type Outcome = Result<CallOutcome, UpstreamError>;

fn row(v: Value) -> Outcome {
    Ok(CallOutcome::Result(v))
}

impl StatusCall {
    /// Start the call; the era's responder serves what it says.
    pub(super) fn start(self, gather: Duration) -> Pending {
        let (tx, rx) = mpsc::channel(16);
        // In the request's span, so its read of the task links the span to the creation.
        let task = crate::telemetry::spawn_in_current_span(self.run(tx));
        Pending::new(task, rx, gather)
    }

    fn max_wait_s(&self) -> u64 {
        rows::seconds(u64::try_from(self.max_wait.as_millis()).unwrap_or(u64::MAX))
    }

    async fn run(self, events: mpsc::Sender<CallEvent>) -> Outcome {
        let started = Instant::now();
        // The poll interval, waited out rather than refused (docs/design.md §8).
        loop {
            match self.limits.check_poll(&self.principal, &self.task_id) {
                Ok(()) => break,
                Err(t) if started.elapsed() + t.retry_after > self.max_wait => {
                    crate::metrics::throttled(t.reason.as_str());
                    return row(rows::polled_too_often(t.retry_after_s()));
                }
                Err(t) => tokio::time::sleep(t.retry_after).await,
            }
        }
        crate::metrics::status_read("handle");
        let deadline = Instant::now() + self.wait;
        // Subscribed before the first read, so no change after it is missed.
        let mut changes = self.engine.subscribe_changes();
        let task = TaskRef::to(&self.task_id);
        let (answers_tx, mut answers) = mpsc::channel::<(String, InputAnswer)>(16);
        let mut asked: HashSet<String> = HashSet::new();
        let mut last: Option<Arc<TaskRecord>> = None;
        loop {
            match self
                .engine
                .owner_snapshot(&self.principal, &self.upstream, &task)
                .await
            {
                Ok(rec) => {
                    if rec.status.is_terminal() {
                        // The owner has the outcome (docs/design.md §23).
                        self.engine.note_seen(&rec);
                        return row(rows::terminal(&rec));
                    }
                    if rec.status == TaskStatus::InputRequired {
                        match self.ask(&rec, &events, &answers_tx, &mut asked).await {
                            Asked::Relayed => {}
                            // Nothing this client can answer: say what the task waits for.
                            Asked::CannotAsk => {
                                return row(rows::running(&rec, &self.prefix, self.max_wait_s()));
                            }
                            Asked::Gone => return row(rows::running(&rec, &self.prefix, 0)),
                        }
                    }
                    last = Some(rec);
                }
                Err(f) => match refusal(&f, &self.task_id) {
                    Some(v) => return row(v),
                    // The store cannot answer now: read again after the next change
                    // or a second, within the wait.
                    None if last.is_some() && Instant::now() < deadline => {}
                    None => return Ok(CallOutcome::Error(f.error)),
                },
            }
            let woke = tokio::select! {
                c = changes.recv() => match c {
                    Ok(Change::Task(t)) if t != self.task_id => Woke::Nothing,
                    Err(broadcast::error::RecvError::Closed) => Woke::Done,
                    _ => Woke::Reread,
                },
                Some((key, a)) = answers.recv() => Woke::Answer(key, a),
                () = tokio::time::sleep_until(deadline) => Woke::Done,
                // A change on another replica that was not announced still shows.
                () = tokio::time::sleep(Duration::from_secs(1)) => Woke::Reread,
            };
            match woke {
                Woke::Nothing | Woke::Reread => {}
                Woke::Answer(key, a) => self.answer(key, a, last.as_deref()).await,
                Woke::Done => {
                    return match &last {
                        Some(rec) => row(rows::running(rec, &self.prefix, self.max_wait_s())),
                        None => Ok(CallOutcome::Error(RpcError::internal(
                            "the task store did not answer",
                        ))),
                    };
                }
            }
        }
    }

    /// Put the task's questions not yet asked on this call to the client, each as an
    /// input request of the call; their answers come back on `answers`.
    async fn ask(
        &self,
        rec: &TaskRecord,
        events: &mpsc::Sender<CallEvent>,
        answers: &mpsc::Sender<(String, InputAnswer)>,
        asked: &mut HashSet<String>,
    ) -> Asked {
        let askable: Vec<(&String, &Value)> = rec
            .input_requests
            .iter()
            .filter(|(_, r)| {
                fields::method_of(r)
                    .is_some_and(|m| missing_capability(&self.caps, m, r.get("params")).is_none())
            })
            .collect();
        if askable.is_empty() {
            return if asked.is_empty() {
                Asked::CannotAsk
            } else {
                Asked::Relayed
            };
        }
        for (key, request) in askable {
            if !asked.insert(key.clone()) {
                continue;
            }
            let Some(method) = fields::method_of(request) else {
                continue;
            };
            let (tx, rx) = oneshot::channel();
            let ir = InputRequest {
                method: method.to_string(),
                params: request.get("params").cloned(),
                respond: tx,
            };
            if events.send(CallEvent::Input(ir)).await.is_err() {
                return Asked::Gone;
            }
            let (key, answers) = (key.clone(), answers.clone());
            tokio::spawn(async move {
                if let Ok(a) = rx.await {
                    let _ = answers.send((key, a)).await;
                }
            });
        }
        Asked::Relayed
    }

    /// The client's answer to question `key`, applied as `tasks/update` applies one. An
    /// error answer has no `tasks/update` form: for an elicitation it is the user
    /// dismissing it (`cancel`); any other stays open until the input timeout.
    async fn answer(&self, key: String, answer: InputAnswer, rec: Option<&TaskRecord>) {
        let value = match answer {
            InputAnswer::Result(v) => v,
            InputAnswer::Error(_)
                if rec
                    .and_then(|r| r.input_requests.get(&key))
                    .and_then(fields::method_of)
                    == Some("elicitation/create") =>
            {
                serde_json::json!({"action": "cancel"})
            }
            InputAnswer::Error(_) => return,
        };
        let mut responses = Map::new();
        responses.insert(key, value);
        let update = TaskUpdate {
            task: TaskRef::to(&self.task_id),
            input_responses: Field::Valid(responses),
        };
        if let Err(f) = self
            .engine
            .update(&self.principal, &self.upstream, update, &Value::Null)
            .await
        {
            tracing::warn!(task = %self.task_id, error = %f.error.message, "an answer given on a task-status call was not applied");
        }
    }
}

/// What asking the client came to.
enum Asked {
    Relayed,
    /// The task waits only for what this client did not declare it can answer.
    CannotAsk,
    /// The call's client is gone.
    Gone,
}

enum Woke {
    Nothing,
    Reread,
    Answer(String, InputAnswer),
    Done,
}

/// The tool result for a task the caller cannot see (unknown, foreign, never issued:
/// one answer) or that expired; `None` when the store could not answer.
fn refusal(f: &Failure, task_id: &str) -> Option<Value> {
    if matches!(f.class, ErrorClass::RetryLater(_)) {
        return None;
    }
    Some(if crate::tasks::is_expired(f) {
        rows::expired(task_id)
    } else {
        rows::not_found()
    })
}
