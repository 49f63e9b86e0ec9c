//! A promoted call running in the background: upstream progress becomes
//! `statusMessage`, upstream input requests become `inputRequests`, and the answer
//! becomes the terminal state — unless the task reached a terminal state first (cancel,
//! expiry), in which case the late answer is discarded (docs/design.md §4 "Terminal
//! states never change", §6 "Cancel").

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::engine::Engine;
use super::events::{Event, Notice, Pending, Timers, queue_status};
use super::failure::{CallFailure, failure};
use super::inputs::{self, InputVerdict};
use super::outcome::JoinedCall;
use super::terminal::{conclude, fail};
use crate::protocol::results;
use crate::protocol::{ClientCaps, META_RELATED_TASK, Method, RpcError};
use crate::store::{StoreError, TaskRecord, TaskStatus, now_ms};
use crate::upstream::{CallOutcome, InputAnswer, InputRequest};

type Applier = Box<dyn Fn(&mut TaskRecord) + Send + Sync>;
/// An input request as recorded: `(method, params)`.
pub type InputSpec = (String, Option<Value>);
pub type Responder = oneshot::Sender<InputAnswer>;

/// How long an upstream progress message may wait before it is written as the task's
/// `statusMessage`: a burst collapses into one store write, and progress that the
/// answer overtakes is never written (the terminal state replaces it). Pollers see a
/// message at most this much later.
const PROGRESS_COALESCE: Duration = Duration::from_millis(50);

/// Retries of a terminal write while the store is unreachable: doubling from the first
/// up to the last.
const SETTLE_RETRY_FIRST: Duration = Duration::from_millis(100);
const SETTLE_RETRY_MAX: Duration = Duration::from_secs(2);

/// The driver's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverTimer {
    /// Write the coalesced progress (`PROGRESS_COALESCE` after the first of a burst).
    Progress,
    /// `input_timeout_ms` passed since the task last asked for input.
    Input,
}

/// Everything the driver needs for one task.
pub struct Driven {
    pub task_id: String,
    pub route_id: String,
    pub upstream: String,
    pub caps: ClientCaps,
    /// Answer input the client did not declare here (a 2025-era client's task).
    pub answer_undeclared: bool,
    pub call: Pending,
    /// Set when the task was created in `input_required`.
    pub awaiting_input: bool,
}

/// Assign fresh keys (unique for the task's life) to input requests `(method,
/// params)`, record them as outstanding and return the keys in order. Deterministic
/// for a given record, so a store update may safely retry it. Strips the legacy
/// `elicitationId` of URL-mode elicitations (removed in MCP 2026-07-28, "Changelog").
pub fn key_inputs(rec: &mut TaskRecord, inputs: &[(String, Option<Value>)]) -> Vec<String> {
    let mut keys = Vec::with_capacity(inputs.len());
    for (method, params) in inputs {
        let kind = method.split('/').next().unwrap_or("input");
        let key = format!("{kind}-{}", rec.issued_keys.len() + 1);
        rec.issued_keys.push(key.clone());
        rec.input_requests
            .insert(key.clone(), recorded_request(method, params.as_ref()));
        keys.push(key);
    }
    rec.status = TaskStatus::InputRequired;
    rec.status_message = Some("waiting for input".into());
    rec.last_updated_at_ms = now_ms();
    keys
}

/// An input request as [`key_inputs`] records it.
fn recorded_request(method: &str, params: Option<&Value>) -> Value {
    let mut req = Map::new();
    req.insert("method".into(), Value::from(method));
    if let Some(params) = params {
        let mut params = params.clone();
        if let Some(p) = params.as_object_mut() {
            p.remove("elicitationId");
        }
        req.insert("params".into(), params);
    }
    Value::Object(req)
}

/// The keys that an earlier write of the same `inputs` gave them, when that write
/// landed although its answer was lost (a connection that closed after the commit):
/// the last keys issued, each still outstanding with the same request. `None` when the
/// record does not hold them, and [`key_inputs`] is to record them.
pub fn keys_of_recorded(rec: &TaskRecord, inputs: &[InputSpec]) -> Option<Vec<String>> {
    if rec.status != TaskStatus::InputRequired || inputs.is_empty() {
        return None;
    }
    let first = rec.issued_keys.len().checked_sub(inputs.len())?;
    let keys = &rec.issued_keys[first..];
    let all_there = keys.iter().zip(inputs).all(|(key, (method, params))| {
        rec.input_requests.get(key) == Some(&recorded_request(method, params.as_ref()))
    });
    all_there.then(|| keys.to_vec())
}

/// Split input requests into what is recorded and the answer channels.
pub fn split_inputs(batch: Vec<InputRequest>) -> (Vec<InputSpec>, Vec<Responder>) {
    batch
        .into_iter()
        .map(|ir| ((ir.method, ir.params), ir.respond))
        .unzip()
}

/// `statusMessage` for an upstream progress notification, e.g. "40/100: indexing".
pub fn progress_message(p: &Map<String, Value>) -> String {
    let num = |k: &str| p.get(k).filter(|v| v.is_number()).map(Value::to_string);
    let mut s = num("progress").unwrap_or_default();
    if let Some(t) = num("total") {
        s = format!("{s}/{t}");
    }
    if let Some(m) = crate::protocol::fields::progress_message(p) {
        s = if s.is_empty() {
            m.to_string()
        } else {
            format!("{s}: {m}")
        };
    }
    s
}

/// What [`settle`] did with a call's outcome and its request route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Not recorded here: the route stays for whoever resolves the task.
    Kept,
    /// Recorded (or the task was terminal already); the route is still to remove.
    Recorded,
    /// Recorded, and the store removed the route with the write (one statement on
    /// PostgreSQL: `TaskStore::update_fenced_releasing`).
    RouteGone,
}

/// Apply a terminal outcome of the call of `route_id` unless the task is already
/// terminal. [`Settled::Kept`] when the outcome may not be recorded and the route must stay:
/// the write was fenced (this replica no longer holds the call; whoever does, or
/// the takeover, resolves the task), or the store failed in a way it does not retry.
///
/// A store that is unreachable (an I/O error) is retried until it answers: the
/// outcome exists only here, and a task left `working` by one failed write would
/// stay so (its route names this live replica, so no takeover comes). A gateway
/// that stops meanwhile keeps the route, and its next start resolves the task.
async fn settle(
    engine: &Engine,
    task_id: &str,
    route_id: &str,
    apply: impl Fn(&mut TaskRecord) + Send + Sync,
) -> Settled {
    let retention = crate::config::as_millis(engine.cfg.tasks.result_retention);
    engine.tasks.terminal_writing(task_id);
    let mut backoff = SETTLE_RETRY_FIRST;
    // What the settle span needs: the creation's context and the final status.
    let mut settled: Option<(Option<String>, &'static str)> = None;
    let updated = loop {
        let r = engine
            .tasks
            .update_releasing(task_id, route_id, &mut |rec| {
                if rec.status.is_terminal() {
                    return false;
                }
                apply(rec);
                conclude(rec, retention);
                settled = Some((rec.trace.clone(), rec.status.as_str()));
                true
            })
            .await;
        match r {
            Err(StoreError::Io(e)) if !engine.shutting_down() && engine.lease_held() => {
                tracing::warn!(task = task_id, error = %e, retry_ms = backoff.as_millis() as u64, "recording a terminal state failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(SETTLE_RETRY_MAX);
            }
            other => break other,
        }
    };
    let released = match updated {
        Ok((_, released)) => {
            let span = match &settled {
                Some((trace, status)) => {
                    crate::telemetry::settle_span(task_id, status, trace.as_deref())
                }
                None => tracing::Span::none(),
            };
            match tracing::Instrument::instrument(engine.flush(), span).await {
                Ok(()) => engine.tasks.terminal_flushed(task_id),
                // Still unflushed: readers flush (and fail) before showing it.
                Err(e) => {
                    tracing::error!(task = task_id, error = %e, "flushing a terminal state failed");
                }
            }
            released
        }
        Err(StoreError::Fenced) => {
            tracing::warn!(
                task = task_id,
                "call outcome discarded: this replica no longer holds the call"
            );
            return Settled::Kept;
        }
        // Stopping, or the lease went meanwhile: the route stays for the next
        // start or the takeover.
        Err(StoreError::Io(e)) => {
            tracing::error!(task = task_id, error = %e, "recording a terminal state failed");
            return Settled::Kept;
        }
        // Anything else (a corrupt record, a closed store) is not known to have
        // written the outcome: keep the route, so recovery or the orphan sweep
        // resolves the task, rather than leave it non-terminal with no route
        // (docs/design.md §16 "Fail closed").
        Err(e) => {
            crate::metrics::fail_closed("route_kept");
            tracing::error!(task = task_id, error = %e, "recording a terminal state failed; its route is kept for recovery");
            return Settled::Kept;
        }
    };
    engine.changed(task_id);
    if released {
        Settled::RouteGone
    } else {
        Settled::Recorded
    }
}

fn outcome_applier(max: usize, upstream: &str, r: JoinedCall) -> Option<Applier> {
    match r {
        Ok(Ok(CallOutcome::Result(mut v))) => {
            if let Some(m) = v.get_mut("_meta").and_then(Value::as_object_mut) {
                m.remove(META_RELATED_TASK);
            }
            let size = serde_json::to_vec(&v).map(|b| b.len()).unwrap_or(0);
            if size > max {
                let err = RpcError::internal(format!(
                    "result too large: {size} bytes exceeds max_result_bytes ({max})"
                ));
                return Some(Box::new(move |rec| fail(rec, &err)));
            }
            Some(Box::new(move |rec| {
                rec.status = TaskStatus::Completed;
                rec.status_message = Some(if crate::protocol::fields::is_error_result(&v) {
                    "completed with a tool error".into()
                } else {
                    "completed".into()
                });
                rec.result = Some(v.clone());
            }))
        }
        Ok(Ok(CallOutcome::Error(e))) => {
            let e = results::map_error(e);
            Some(Box::new(move |rec| fail(rec, &e)))
        }
        // A task records the same error an inline call would answer with
        // (whatever its HTTP status there), so both read alike.
        Ok(Err(e)) => {
            let err = failure(upstream, CallFailure::Upstream(&e)).error;
            Some(Box::new(move |rec| fail(rec, &err)))
        }
        // Aborted by cancel or expiry: the record already says so.
        Err(j) if j.is_cancelled() => None,
        Err(_) => {
            let err = failure(upstream, CallFailure::Ended).error;
            Some(Box::new(move |rec| fail(rec, &err)))
        }
    }
}

/// Run a promoted call to its end.
pub(super) async fn drive(engine: Arc<Engine>, d: Driven) {
    let Driven {
        task_id,
        route_id,
        upstream,
        caps,
        answer_undeclared,
        mut call,
        awaiting_input,
    } = d;
    let input_timeout = engine.cfg.tasks.input_timeout;
    let mut timers = Timers::default();
    if awaiting_input {
        timers.set(DriverTimer::Input, Instant::now() + input_timeout);
    }
    let mut settled = Settled::Recorded;
    let epoch = engine.epoch();
    // The latest progress or queue position not yet written.
    let mut progress: Option<String> = None;
    loop {
        match call.next(&mut timers).await {
            Event::Finished(r) => {
                // Stopping: keep the request route so the next start resolves
                // the task (docs/design.md §10 "Restart").
                if engine.shutting_down() {
                    return;
                }
                if let Some(apply) =
                    outcome_applier(engine.cfg.tasks.max_result_bytes, &upstream, r)
                {
                    settled = settle(&engine, &task_id, &route_id, apply).await;
                }
                break;
            }
            Event::Notice(n) => {
                let msg = match n {
                    Notice::Progress(p) => {
                        engine.limits.progress_seen(&task_id);
                        progress_message(&p)
                    }
                    Notice::Queue(q) => queue_status(q),
                    Notice::Log(_) => continue,
                };
                if progress.replace(msg).is_none() {
                    timers.set(DriverTimer::Progress, Instant::now() + PROGRESS_COALESCE);
                }
            }
            Event::Timer(DriverTimer::Progress) => {
                if let Some(msg) = progress.take() {
                    write_progress(&engine, &task_id, &route_id, msg).await;
                }
            }
            Event::Inputs(batch) => {
                // Progress reported before the input request lands first.
                if let Some(msg) = progress.take() {
                    timers.clear(DriverTimer::Progress);
                    write_progress(&engine, &task_id, &route_id, msg).await;
                }
                let batch = if answer_undeclared {
                    inputs::answer_undeclared(&caps, batch)
                } else {
                    batch
                };
                if batch.is_empty() {
                    continue;
                }
                match inputs::screen(&caps, Method::ToolsCall, &upstream, batch) {
                    InputVerdict::Missing(err) => {
                        call.abort();
                        settled =
                            settle(&engine, &task_id, &route_id, move |rec| fail(rec, &err)).await;
                        break;
                    }
                    InputVerdict::Relay(batch) => {
                        on_inputs(&engine, &task_id, &route_id, batch).await;
                        timers.set(DriverTimer::Input, Instant::now() + input_timeout);
                    }
                    // Only a promoted `tools/call` is driven, and it may ask.
                    InputVerdict::Refused => {}
                }
            }
            Event::Timer(DriverTimer::Input) => {
                let waiting =
                    engine.tasks.status(&task_id).await == Some(TaskStatus::InputRequired);
                if waiting {
                    call.abort();
                    let err = RpcError::internal(format!(
                        "input was not provided within input_timeout_ms ({} ms)",
                        input_timeout.as_millis()
                    ));
                    settled =
                        settle(&engine, &task_id, &route_id, move |rec| fail(rec, &err)).await;
                    break;
                }
            }
        }
    }
    // A call this replica no longer holds (fenced, or stopped with the lease) keeps
    // its route: the takeover resolves the task from it.
    if settled == Settled::Kept || !engine.lease_held() || engine.epoch() != epoch {
        engine.calls.forget(&task_id);
        return;
    }
    if settled == Settled::Recorded
        && let Err(e) = engine.tasks.remove_route(&route_id).await
    {
        tracing::warn!(task = %task_id, error = %e, "removing a request route failed");
    }
    engine.calls.forget(&task_id);
}

async fn write_progress(engine: &Engine, task_id: &str, route_id: &str, msg: String) {
    let r = engine
        .tasks
        .update(task_id, Some(route_id), &mut |rec| {
            if rec.status.is_terminal() {
                return false;
            }
            rec.status_message = Some(msg.clone());
            rec.last_updated_at_ms = now_ms();
            true
        })
        .await;
    if r.is_ok() {
        engine.changed(task_id);
    }
}

/// Record the upstream's input requests on the task, then register the channels
/// their answers go to. A store that is unreachable is retried for up to
/// `input_timeout_ms`, as a terminal write is: the requests exist only here, and a
/// task whose write failed would read `working` while its call waits for an
/// answer nobody can give. A write that cannot be made registers nothing: the
/// upstream's requests are answered with an error, and the call goes on to its end.
async fn on_inputs(engine: &Engine, task_id: &str, route_id: &str, batch: Vec<InputRequest>) {
    let (requests, responders) = split_inputs(batch);
    let mut keys = Vec::new();
    let give_up = Instant::now() + engine.cfg.tasks.input_timeout;
    let mut backoff = SETTLE_RETRY_FIRST;
    let mut retrying = false;
    loop {
        let r = engine
            .tasks
            .update(task_id, Some(route_id), &mut |rec| {
                // `update` may run this more than once: only the last run's keys count.
                keys.clear();
                if rec.status.is_terminal() {
                    return false;
                }
                // A failed write may have landed all the same: its keys stand.
                if retrying && let Some(recorded) = keys_of_recorded(rec, &requests) {
                    keys = recorded;
                    return false;
                }
                keys = key_inputs(rec, &requests);
                true
            })
            .await;
        match r {
            Ok(_) => break,
            Err(StoreError::Io(e))
                if !engine.shutting_down()
                    && engine.lease_held()
                    && Instant::now() + backoff < give_up =>
            {
                tracing::warn!(task = task_id, error = %e, retry_ms = backoff.as_millis() as u64, "recording input requests failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(SETTLE_RETRY_MAX);
                retrying = true;
            }
            // Taken over: the takeover resolves the task, and the call's answer
            // is discarded (as in `settle`).
            Err(StoreError::Fenced) => {
                tracing::warn!(
                    task = task_id,
                    "input requests refused: this replica no longer holds the call"
                );
                keys.clear();
                break;
            }
            Err(e) => {
                crate::metrics::fail_closed("input_refused");
                tracing::error!(task = task_id, error = %e, "recording input requests failed; the upstream's requests are refused");
                keys.clear();
                break;
            }
        }
    }
    // Responders dropped here (terminal task, failed write) answer the upstream
    // with an error.
    for (key, tx) in keys.into_iter().zip(responders) {
        engine.calls.add_responder(task_id, key, tx);
    }
    engine.changed(task_id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn progress_messages() {
        let p = |v: Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(
            progress_message(&p(
                json!({"progress": 40, "total": 100, "message": "indexing shard 3"})
            )),
            "40/100: indexing shard 3"
        );
        assert_eq!(progress_message(&p(json!({"progress": 0.5}))), "0.5");
        assert_eq!(progress_message(&p(json!({"message": "hi"}))), "hi");
    }
}
