//! Wire shapes of a task (spec B3, B4, B5, B9): the flat `CreateTaskResult`, the
//! `DetailedTask` that `tasks/get` returns and `notifications/tasks` carries.

use serde_json::{Map, Value};

use super::clock::iso8601;
use crate::front::results::add_server_info;
use crate::store::{TaskRecord, TaskStatus};

/// The `Task` fields every shape shares.
fn base(rec: &TaskRecord) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("taskId".into(), Value::from(rec.task_id.clone()));
    m.insert("status".into(), Value::from(rec.status.as_str()));
    if let Some(msg) = &rec.status_message {
        m.insert("statusMessage".into(), Value::from(msg.clone()));
    }
    m.insert("createdAt".into(), Value::from(iso8601(rec.created_at_ms)));
    m.insert(
        "lastUpdatedAt".into(),
        Value::from(iso8601(rec.last_updated_at_ms)),
    );
    m.insert("ttlMs".into(), Value::from(rec.ttl_ms.max(1)));
    m.insert(
        "pollIntervalMs".into(),
        Value::from(rec.poll_interval_ms.max(1)),
    );
    m
}

/// `DetailedTask`: status-specific fields only for their status (spec B3).
pub fn detailed(rec: &TaskRecord) -> Map<String, Value> {
    let mut m = base(rec);
    match rec.status {
        TaskStatus::InputRequired => {
            m.insert(
                "inputRequests".into(),
                Value::Object(rec.input_requests.clone()),
            );
        }
        TaskStatus::Completed => {
            m.insert(
                "result".into(),
                rec.result
                    .clone()
                    .unwrap_or_else(|| Value::Object(Map::new())),
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
    let mut m = detailed(rec);
    m.insert("resultType".into(), Value::from("complete"));
    add_server_info(&mut m, server_info);
    Value::Object(m)
}

/// The flat `CreateTaskResult` (spec B4): no `result`, `error` or `inputRequests`.
pub fn create_result(rec: &TaskRecord, server_info: &Value) -> Value {
    let mut m = base(rec);
    m.insert("resultType".into(), Value::from("task"));
    add_server_info(&mut m, server_info);
    Value::Object(m)
}
