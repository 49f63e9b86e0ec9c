//! `tasks/get`, `tasks/update`, `tasks/cancel` (MCP Tasks extension, "Task Polling",
//! "Task Update Requests", "Task Cancellation") and the ownership check (docs/design.md
//! §7 "Ownership"): every method resolves the record under the caller's `(tenant,
//! subject)`; anything else is byte-identical to "not found".

use std::sync::Arc;

use serde_json::{Map, Value};

use super::engine::Engine;
use super::failure::Failure;
use super::replica::{changed, deliver_input, stop_call};
use super::repo::{Lookup, TaskRepo};
use super::terminal::conclude;
use super::{ids, snapshot};
use crate::auth::Principal;
use crate::config::as_millis;
use crate::limits::Limits;
use crate::protocol::RpcError;
use crate::protocol::params::{Field, TaskRef, TaskUpdate};
use crate::protocol::results::add_server_info;
use crate::store::{StoreError, TaskRecord, TaskStatus, now_ms};

/// The store did not answer a `tasks/*` method: 503 + `Retry-After`, since every one
/// may be retried (a read changes nothing; a cancel or an answer already applied is
/// acknowledged again; docs/design.md §16). Refusals of the request as sent stay 200.
pub(super) fn unavailable(e: StoreError) -> Failure {
    Failure::retry_later(RpcError::internal(format!(
        "the task store did not answer: {e}"
    )))
}

fn refused(e: RpcError) -> Failure {
    Failure::outcome(e)
}

/// The one reply for foreign, unknown and never-issued ids.
pub fn not_found() -> RpcError {
    RpcError::invalid_params("task not found")
}

fn expired() -> RpcError {
    RpcError::invalid_params("task expired")
}

/// Whether `f` is the owner's "task expired" (the tombstone of docs/design.md §7),
/// which the task tools answer in words of their own (§28).
pub fn is_expired(f: &Failure) -> bool {
    let e = expired();
    f.error.code == e.code && f.error.message == e.message
}

fn ack(server_info: &Value) -> Value {
    let mut m = Map::new();
    m.insert("resultType".into(), Value::from("complete"));
    add_server_info(&mut m, server_info);
    Value::Object(m)
}

/// Resolve `params.taskId` for `principal` on `upstream`.
pub(super) async fn resolve(
    tasks: &TaskRepo,
    principal: &Principal,
    upstream: &str,
    task: &TaskRef,
) -> Result<Arc<TaskRecord>, Failure> {
    let Some(task_id) = task.task_id.valid() else {
        return Err(refused(RpcError::invalid_params(
            "params.taskId must be a string",
        )));
    };
    if !ids::is_well_formed(task_id) {
        return Err(refused(RpcError::invalid_params("malformed task id")));
    }
    // One lookup under the caller's (tenant, subject): a foreign id and one never
    // issued cost the same reads and no decode (docs/design.md §7 "Ownership").
    let found = tasks
        .lookup_owned(task_id, &principal.tenant, &principal.subject)
        .await
        .map_err(unavailable)?;
    match found {
        Lookup::Record(rec) if rec.upstream == upstream => {
            // Never expire early, and never serve past the ttl even if the sweeper
            // has not run yet (docs/design.md §11 "Expiry").
            if rec.expires_at_ms <= now_ms() {
                Err(refused(expired()))
            } else {
                // One trace view shows the task end to end: each of its requests
                // links to the span that created it (docs/design.md §24).
                crate::telemetry::link_creation(rec.trace.as_deref());
                Ok(rec)
            }
        }
        Lookup::Expired => Err(refused(expired())),
        Lookup::Record(_) | Lookup::Unknown => Err(refused(not_found())),
    }
}

/// `tasks/get`: the owner's snapshot, whose read collects the outcome.
pub(super) async fn get<'a>(
    tasks: &TaskRepo,
    limits: &Limits,
    principal: &Principal,
    upstream: &str,
    task: &TaskRef,
    server_info: &'a Value,
) -> Result<snapshot::GetResult<'a>, Failure> {
    let rec = owner_snapshot(tasks, limits, principal, upstream, task).await?;
    // `resolve` only answers the owner: this read collects the outcome.
    tasks.note_seen(&rec);
    crate::metrics::status_read("tasks");
    Ok(snapshot::GetResult { rec, server_info })
}

/// The one read of a task shown to its owner, by `tasks/get` or on a listen stream:
/// owned and unexpired ([`resolve`]), durable if terminal, and with the poll interval
/// adapted. The caller notes the read (`TaskRepo::note_seen`) once the owner has it.
pub(super) async fn owner_snapshot(
    tasks: &TaskRepo,
    limits: &Limits,
    principal: &Principal,
    upstream: &str,
    task: &TaskRef,
) -> Result<Arc<TaskRecord>, Failure> {
    let mut rec = resolve(tasks, principal, upstream, task).await?;
    // A terminal state is shown only once it is durable.
    tasks.durable(&rec).await.map_err(unavailable)?;
    // Adaptive pollIntervalMs, remembered as advertised (docs/design.md §8 "Flow
    // control"). Only a live task's interval adapts, and a live record is never a
    // shared snapshot, so this copies nothing.
    if !rec.status.is_terminal() {
        limits.adapt(principal, Arc::make_mut(&mut rec));
    }
    Ok(rec)
}

/// Relay each answer for an outstanding key to the upstream; ignore the rest (MCP
/// Tasks extension, "Task Update Requests"). The task stays `input_required` until
/// every key is answered.
pub(super) async fn update(
    engine: &Engine,
    principal: &Principal,
    upstream: &str,
    update: TaskUpdate,
    server_info: &Value,
) -> Result<Value, Failure> {
    let rec = resolve(&engine.tasks, principal, upstream, &update.task).await?;
    let responses = match update.input_responses {
        Field::Valid(r) => r,
        Field::Absent | Field::Invalid => {
            return Err(refused(RpcError::invalid_params(
                "params.inputResponses must be an object",
            )));
        }
    };
    if rec.status != TaskStatus::InputRequired {
        return Ok(ack(server_info));
    }
    let answered: Vec<(String, Value)> = responses
        .into_iter()
        .filter(|(k, v)| rec.input_requests.contains_key(k) && v.is_object())
        .collect();
    if answered.is_empty() {
        return Ok(ack(server_info));
    }
    let keys: Vec<String> = answered.iter().map(|(k, _)| k.clone()).collect();
    let r = engine
        .tasks
        .update(&rec.task_id, None, &mut |r| {
            if r.status != TaskStatus::InputRequired {
                return false;
            }
            for k in &keys {
                r.input_requests.remove(k);
            }
            if r.input_requests.is_empty() {
                r.status = TaskStatus::Working;
                r.status_message = Some("working".into());
            }
            r.last_updated_at_ms = now_ms();
            true
        })
        .await;
    r.map_err(unavailable)?;
    // To the upstream call here, or relayed to the replica holding it.
    for (key, answer) in answered {
        deliver_input(&engine.calls, &engine.replica, &rec.task_id, &key, answer).await;
    }
    changed(&engine.tasks, &engine.replica, &rec.task_id);
    Ok(ack(server_info))
}

/// Record the intent durably, stop the upstream call, acknowledge (MCP Tasks
/// extension, "Task Cancellation"; docs/design.md §6 "Cancel"). A terminal task is
/// acknowledged unchanged.
pub(super) async fn cancel(
    engine: &Engine,
    principal: &Principal,
    upstream: &str,
    task: &TaskRef,
    server_info: &Value,
) -> Result<Value, Failure> {
    let rec = resolve(&engine.tasks, principal, upstream, task).await?;
    cancel_record(engine, &rec, "cancelled by the client")
        .await
        .map_err(unavailable)?;
    Ok(ack(server_info))
}

/// Cancel `rec` durably with `message` and stop its call; a terminal task is left as
/// it is, once its terminal write is durable (the caller's acknowledgement says the
/// task is over: a crash must not bring it back). The status the task has afterwards.
pub(super) async fn cancel_record(
    engine: &Engine,
    rec: &TaskRecord,
    message: &str,
) -> Result<TaskStatus, StoreError> {
    let tasks = &engine.tasks;
    if rec.status.is_terminal() {
        tasks.durable(rec).await?;
        return Ok(rec.status);
    }
    let retention = as_millis(engine.cfg.tasks.result_retention);
    tasks.terminal_writing(&rec.task_id);
    let after = tasks
        .update(&rec.task_id, None, &mut |r| {
            if r.status.is_terminal() {
                return false;
            }
            r.status = TaskStatus::Cancelled;
            r.status_message = Some(message.to_string());
            r.cancel_requested = true;
            conclude(r, retention);
            true
        })
        .await?;
    tasks.flush().await?;
    tasks.terminal_flushed(&rec.task_id);
    // Dropping the call sends `notifications/cancelled` upstream (here, or at the
    // replica holding it, by a relay).
    stop_call(&engine.calls, &engine.replica, &rec.task_id).await;
    changed(tasks, &engine.replica, &rec.task_id);
    Ok(after.map_or(TaskStatus::Cancelled, |r| r.status))
}
