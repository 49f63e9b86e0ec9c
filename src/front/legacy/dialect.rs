//! The 2025-11-25 task dialect's wire shapes of a task record (docs/design.md §25,
//! "The two task dialects, method by method"): the same record a 2026 client reads
//! through `snapshot.rs`, rendered for a 2025-era session that negotiated
//! 2025-11-25. Only the rendering differs; what is stored never does.

use serde_json::{Map, Value, json};

use crate::protocol::task_shapes::{ErrorObject, HeldRequest, ToolResult};
use crate::protocol::{META_RELATED_TASK, RpcError, error};
use crate::store::{TaskRecord, TaskStatus};

/// The status a 2025-11-25 client sees. A `CallToolResult` with `isError: true` is
/// `failed` there (MCP 2025-11-25 "Tasks", "Task Status"), while the record and the
/// 2026 rendering keep `completed` (docs/design.md §4).
pub(super) fn status(rec: &TaskRecord) -> &'static str {
    if rec.status == TaskStatus::Completed && is_error_result(rec.result.as_ref()) {
        "failed"
    } else {
        rec.status.as_str()
    }
}

fn is_error_result(result: Option<&Value>) -> bool {
    result.is_some_and(|r| ToolResult::read(r).is_error)
}

/// The `Task` object (MCP 2025-11-25 "Tasks", "Data Types", "Task"): `ttl` and
/// `pollInterval` in milliseconds under their 2025 names.
pub(super) fn task(rec: &TaskRecord) -> Map<String, Value> {
    crate::tasks::task_fields(rec, status(rec), "ttl", "pollInterval")
}

/// The `CreateTaskResult` made from the engine's flat 2026 handle (MCP 2025-11-25
/// "Tasks", "Creating Tasks"): `{task: Task}`, without the 2026 `resultType` and the
/// server identity in `_meta`.
pub(super) fn create_result_of_handle(handle: &Value) -> Value {
    let mut t = Map::with_capacity(7);
    for (from, to) in [
        ("taskId", "taskId"),
        ("status", "status"),
        ("statusMessage", "statusMessage"),
        ("createdAt", "createdAt"),
        ("lastUpdatedAt", "lastUpdatedAt"),
        ("ttlMs", "ttl"),
        ("pollIntervalMs", "pollInterval"),
    ] {
        if let Some(v) = handle.get(from) {
            t.insert(to.into(), v.clone());
        }
    }
    json!({ "task": t })
}

/// The `CreateTaskResult` of a task the gateway just created for a 2025-11-25
/// session: the 2026 handle's fields under their 2025 names.
pub(super) fn create_result(rec: &TaskRecord) -> Value {
    create_result_of_handle(&crate::tasks::create_result(rec, &Value::Null))
}

/// `notifications/tasks/status`: the whole `Task`, without the `related-task` key
/// (MCP 2025-11-25 "Tasks", "Task Notifications").
pub(super) fn status_notification(rec: &TaskRecord) -> Value {
    crate::protocol::notification("notifications/tasks/status", Value::Object(task(rec)))
}

/// The `_meta` key that ties a message to its task.
fn related(task_id: &str) -> Value {
    json!({ "taskId": task_id })
}

/// What `tasks/result` answers for a terminal task: exactly what the `tools/call`
/// would have returned, with the `related-task` key in the result's `_meta` (MCP
/// 2025-11-25 "Tasks", "Result Retrieval", "Related Task Metadata"). A failed call
/// answers its JSON-RPC error; a cancelled one, which never returned, `-32603`
/// saying so.
pub(super) fn payload(rec: &TaskRecord) -> Result<Value, RpcError> {
    match rec.status {
        TaskStatus::Completed => {
            let mut result = match rec.result.clone() {
                Some(Value::Object(m)) => m,
                _ => Map::new(),
            };
            let meta = result
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if !meta.is_object() {
                *meta = Value::Object(Map::new());
            }
            if let Value::Object(meta) = meta {
                meta.insert(META_RELATED_TASK.into(), related(&rec.task_id));
            }
            Ok(Value::Object(result))
        }
        TaskStatus::Failed => Err(stored_error(rec.error.as_ref())),
        TaskStatus::Cancelled => Err(RpcError::internal("the task was cancelled")
            .with_data(json!({ "taskId": rec.task_id }))),
        TaskStatus::Working | TaskStatus::InputRequired => {
            Err(RpcError::internal("the task is not terminal yet"))
        }
    }
}

/// The JSON-RPC error a failed task stored, as an [`RpcError`].
fn stored_error(e: Option<&Value>) -> RpcError {
    let Some(e) = e else {
        return RpcError::internal("task failed");
    };
    let e = ErrorObject::read(e);
    let code = e.code.unwrap_or(error::INTERNAL_ERROR);
    let message = e.message.unwrap_or("task failed");
    let err = RpcError::new(code, message);
    match e.data {
        Some(d) => err.with_data(d.clone()),
        None => err,
    }
}

/// An input request of the task as a request to the client, with the gateway's id
/// and the `related-task` key in its params' `_meta` (MCP 2025-11-25 "Tasks", "Input
/// Required Status"). `request` is the stored `{method, params}`.
pub(super) fn input_request(task_id: &str, id: &str, request: &Value) -> Option<Value> {
    let held = HeldRequest::read(request);
    let method = held.method?;
    let mut params = match held.params {
        Some(Value::Object(p)) => p.clone(),
        _ => Map::new(),
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert(META_RELATED_TASK.into(), related(task_id));
    }
    Some(json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": method,
        "params": params,
    }))
}

/// A terminal task `tasks/cancel` refuses (MCP 2025-11-25 "Tasks", "Task
/// Cancellation": `-32602`).
pub(super) fn cancel_refused(rec: &TaskRecord) -> RpcError {
    RpcError::invalid_params(format!(
        "Cannot cancel task: already in terminal status '{}'",
        status(rec)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SCHEMA_VERSION;

    fn rec(status: TaskStatus, result: Option<Value>, error: Option<Value>) -> TaskRecord {
        TaskRecord {
            v: SCHEMA_VERSION,
            task_id: "tsk_AAAAAAAAAAAAAAAAAAAAAA".into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            upstream: "demo".into(),
            tool: "sleep".into(),
            args_fingerprint: String::new(),
            idempotency_key: None,
            status,
            status_message: Some("m".into()),
            created_at_ms: 1_000,
            last_updated_at_ms: 2_000,
            ttl_ms: 60_000,
            poll_interval_ms: 1000,
            expires_at_ms: 61_000,
            result,
            error,
            input_requests: Map::new(),
            issued_keys: Vec::new(),
            cancel_requested: false,
            trace: None,
        }
    }

    #[test]
    fn task_uses_the_2025_field_names() {
        let t = Value::Object(task(&rec(TaskStatus::Working, None, None)));
        assert_eq!(t["ttl"], 60_000);
        assert_eq!(t["pollInterval"], 1000);
        assert_eq!(t["status"], "working");
        assert_eq!(t["statusMessage"], "m");
        assert!(t.get("ttlMs").is_none() && t.get("resultType").is_none());
        assert_eq!(t["createdAt"], "1970-01-01T00:00:01.000Z");
    }

    #[test]
    fn an_error_result_is_failed_only_in_this_dialect() {
        let r = rec(
            TaskStatus::Completed,
            Some(json!({"content": [], "isError": true})),
            None,
        );
        assert_eq!(status(&r), "failed");
        assert_eq!(r.status.as_str(), "completed");
        // tasks/result still returns the CallToolResult as the call would have.
        let p = payload(&r).unwrap();
        assert_eq!(p["isError"], true);
        assert_eq!(p["_meta"][META_RELATED_TASK]["taskId"], r.task_id);
        let ok = rec(
            TaskStatus::Completed,
            Some(json!({"content": [], "isError": false})),
            None,
        );
        assert_eq!(status(&ok), "completed");
    }

    #[test]
    fn payload_keeps_the_upstream_meta_and_adds_the_related_task() {
        let r = rec(
            TaskStatus::Completed,
            Some(json!({"content": [{"type": "text", "text": "ok"}], "_meta": {"x": 1}})),
            None,
        );
        let p = payload(&r).unwrap();
        assert_eq!(p["_meta"]["x"], 1);
        assert_eq!(p["content"][0]["text"], "ok");
        assert_eq!(p["_meta"][META_RELATED_TASK], json!({"taskId": r.task_id}));
    }

    #[test]
    fn failed_and_cancelled_payloads_are_errors() {
        let f = rec(
            TaskStatus::Failed,
            None,
            Some(json!({"code": -32000, "message": "boom", "data": {"a": 1}})),
        );
        let e = payload(&f).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (-32000, "boom"));
        let c = payload(&rec(TaskStatus::Cancelled, None, None)).unwrap_err();
        assert_eq!(c.code, error::INTERNAL_ERROR);
    }

    #[test]
    fn handle_becomes_a_create_task_result() {
        let h = json!({
            "taskId": "tsk_x", "status": "working", "statusMessage": "working",
            "createdAt": "a", "lastUpdatedAt": "b", "ttlMs": 5, "pollIntervalMs": 7,
            "resultType": "task", "_meta": {"io.modelcontextprotocol/serverInfo": {}}
        });
        assert_eq!(
            create_result_of_handle(&h),
            json!({"task": {"taskId": "tsk_x", "status": "working", "statusMessage": "working",
                "createdAt": "a", "lastUpdatedAt": "b", "ttl": 5, "pollInterval": 7}})
        );
    }

    #[test]
    fn input_requests_carry_the_related_task() {
        let r = input_request(
            "tsk_x",
            "g-1",
            &json!({"method": "elicitation/create", "params": {"message": "?"}}),
        )
        .unwrap();
        assert_eq!(r["id"], "g-1");
        assert_eq!(r["method"], "elicitation/create");
        assert_eq!(r["params"]["message"], "?");
        assert_eq!(r["params"]["_meta"][META_RELATED_TASK]["taskId"], "tsk_x");
        assert!(input_request("t", "g", &json!({"params": {}})).is_none());
    }

    #[test]
    fn cancel_refusal_names_the_status() {
        let e = cancel_refused(&rec(TaskStatus::Completed, Some(json!({})), None));
        assert_eq!(e.code, error::INVALID_PARAMS);
        assert!(e.message.contains("'completed'"), "{}", e.message);
    }
}
