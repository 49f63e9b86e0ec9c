//! Wire shapes of a task (MCP Tasks extension, "Tasks", "Task Creation", "Task
//! Polling", "Task Status Notifications"): the flat `CreateTaskResult`, the
//! `DetailedTask` that `tasks/get` returns and `notifications/tasks` carries.

use serde_json::{Map, Value};

use super::clock::iso8601;
use crate::protocol::Method;
use crate::protocol::results::{self, add_server_info};
use crate::store::{TaskRecord, TaskStatus};

/// The `Task` fields every shape of either dialect shares: `status` as that dialect
/// shows it, and the ttl and poll interval under that dialect's names
/// (`dialect.rs` renders the 2025-11-25 ones).
pub(super) fn task_fields(
    rec: &TaskRecord,
    status: &str,
    ttl_key: &str,
    poll_key: &str,
) -> Map<String, Value> {
    let mut m = Map::with_capacity(7);
    m.insert("taskId".into(), Value::from(rec.task_id.clone()));
    m.insert("status".into(), Value::from(status));
    if let Some(msg) = &rec.status_message {
        m.insert("statusMessage".into(), Value::from(msg.clone()));
    }
    m.insert("createdAt".into(), Value::from(iso8601(rec.created_at_ms)));
    m.insert(
        "lastUpdatedAt".into(),
        Value::from(iso8601(rec.last_updated_at_ms)),
    );
    m.insert(ttl_key.into(), Value::from(rec.ttl_ms.max(1)));
    m.insert(poll_key.into(), Value::from(rec.poll_interval_ms.max(1)));
    m
}

/// The `Task` fields of the 2026 shapes.
fn base(rec: &TaskRecord) -> Map<String, Value> {
    task_fields(rec, rec.status.as_str(), "ttlMs", "pollIntervalMs")
}

/// `DetailedTask`: status-specific fields only for their status (MCP Tasks extension,
/// "Tasks").
///
/// A completed task's `result` is what the original `tools/call` would have returned,
/// so it is rendered here as a 2026 result — its own `resultType` and the upstream's
/// identity in `_meta` (docs/design.md, introduction: payload fidelity). The store
/// keeps the upstream `CallToolResult` as received; rendering at serve time means
/// records written by any earlier version get the same shape, and `server_info` is the
/// identity known now rather than at completion.
pub fn detailed(rec: &TaskRecord, server_info: &Value) -> Map<String, Value> {
    let mut m = base(rec);
    match rec.status {
        TaskStatus::InputRequired => {
            m.insert(
                "inputRequests".into(),
                Value::Object(rec.input_requests.clone()),
            );
        }
        TaskStatus::Completed => {
            let stored = rec
                .result
                .clone()
                .unwrap_or_else(|| Value::Object(Map::new()));
            // `complete` keeps the upstream's other `_meta` keys and drops a legacy
            // `related-task` one (the MCP Tasks extension has no such linkage), as for an
            // inline result.
            m.insert(
                "result".into(),
                results::complete(Method::ToolsCall, stored, server_info),
            );
        }
        TaskStatus::Failed => {
            m.insert(
                "error".into(),
                rec.error.clone().unwrap_or_else(
                    || serde_json::json!({"code": -32603, "message": "task failed"}),
                ),
            );
        }
        TaskStatus::Working | TaskStatus::Cancelled => {}
    }
    m
}

/// The `tasks/get` result.
pub fn get_result(rec: &TaskRecord, server_info: &Value) -> Value {
    let mut m = detailed(rec, server_info);
    m.insert("resultType".into(), Value::from("complete"));
    add_server_info(&mut m, server_info);
    Value::Object(m)
}

/// The flat `CreateTaskResult` (MCP Tasks extension, "Task Creation"): no `result`,
/// `error` or `inputRequests`.
pub fn create_result(rec: &TaskRecord, server_info: &Value) -> Value {
    let mut m = base(rec);
    m.insert("resultType".into(), Value::from("task"));
    add_server_info(&mut m, server_info);
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SCHEMA_VERSION;
    use serde_json::json;

    fn completed(result: Value) -> TaskRecord {
        TaskRecord {
            v: SCHEMA_VERSION,
            task_id: "tsk_AAAAAAAAAAAAAAAAAAAAAA".into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            upstream: "demo".into(),
            tool: "sleep".into(),
            args_fingerprint: String::new(),
            idempotency_key: None,
            status: TaskStatus::Completed,
            status_message: Some("completed".into()),
            created_at_ms: 1,
            last_updated_at_ms: 2,
            ttl_ms: 60_000,
            poll_interval_ms: 1000,
            expires_at_ms: 60_001,
            result: Some(result),
            error: None,
            input_requests: Map::new(),
            issued_keys: Vec::new(),
            cancel_requested: false,
            trace: None,
        }
    }

    #[test]
    fn completed_result_is_rendered_as_a_complete_result() {
        let si = json!({"name": "up", "version": "1"});
        // As stored by an older build: the legacy linkage still present.
        let rec = completed(json!({
            "content": [{"type": "text", "text": "done"}],
            "isError": false,
            "_meta": {"x": 1, "io.modelcontextprotocol/related-task": {"taskId": "t"}}
        }));
        for shape in [get_result(&rec, &si), Value::Object(detailed(&rec, &si))] {
            let r = &shape["result"];
            assert_eq!(r["resultType"], "complete", "{shape}");
            assert_eq!(r["content"][0]["text"], "done", "{shape}");
            assert_eq!(r["isError"], false, "{shape}");
            assert_eq!(
                r["_meta"],
                json!({"x": 1, "io.modelcontextprotocol/serverInfo": si}),
                "{shape}"
            );
        }
        // The stored record is untouched: rendering happens when served.
        assert!(rec.result.as_ref().unwrap().get("resultType").is_none());
    }
}
