//! What the task tools answer, row by row (docs/design.md §28 "Task handles for plain
//! clients"): each answer is an ordinary `CallToolResult` — text a model can act on,
//! `structuredContent` for programs — so a client that knows nothing of tasks can
//! carry a slow call to its end. The era's envelope (`resultType`, `serverInfo`) is
//! added by the caller; nothing here reads a request or the store.

use serde_json::{Map, Value, json};

use crate::store::{TaskRecord, TaskStatus};
use crate::tasks::iso8601;

/// The three task tools, by their name after the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskTool {
    Status,
    Cancel,
    List,
}

impl TaskTool {
    const ALL: [TaskTool; 3] = [Self::Status, Self::Cancel, Self::List];

    fn suffix(self) -> &'static str {
        match self {
            Self::Status => "task_status",
            Self::Cancel => "task_cancel",
            Self::List => "task_list",
        }
    }

    /// The tool `name` names under `prefix`, if any.
    pub(crate) fn named(prefix: &str, name: &str) -> Option<Self> {
        let rest = name.strip_prefix(prefix)?;
        Self::ALL.into_iter().find(|t| t.suffix() == rest)
    }

    /// Every task tool's full name under `prefix`.
    pub(crate) fn names(prefix: &str) -> impl Iterator<Item = String> + '_ {
        Self::ALL
            .into_iter()
            .map(move |t| format!("{prefix}{}", t.suffix()))
    }

    /// The `Mcp-Param-*` name `task_status`'s `taskId` travels as (SEP-2243).
    pub(crate) const TASK_ID_HEADER: &'static str = "Task-Id";

    /// The tool's `tools/list` entry.
    pub(crate) fn definition(self, prefix: &str, max_wait_s: u64) -> Value {
        let name = format!("{prefix}{}", self.suffix());
        let task_id = |annotated: bool| {
            let mut s = json!({
                "type": "string",
                "description": "The task id a slow tool call answered with (tsk_…)",
            });
            if annotated && let Some(o) = s.as_object_mut() {
                o.insert("x-mcp-header".into(), Value::from(Self::TASK_ID_HEADER));
            }
            s
        };
        let (description, schema) = match self {
            Self::Status => (
                format!(
                    "Get the status or the result of a tool call that is still running as a \
                     task. Pass waitSeconds (up to {max_wait_s}) to wait for it to finish."
                ),
                json!({
                    "type": "object",
                    "properties": {
                        "taskId": task_id(true),
                        "waitSeconds": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": max_wait_s,
                            "description": "How long to wait for the task to finish before answering",
                        },
                    },
                    "required": ["taskId"],
                }),
            ),
            Self::Cancel => (
                "Cancel a tool call that is running as a task.".to_string(),
                json!({
                    "type": "object",
                    "properties": {"taskId": task_id(false)},
                    "required": ["taskId"],
                }),
            ),
            Self::List => (
                "List your recent tool calls that ran as tasks on this server, newest first."
                    .to_string(),
                json!({"type": "object", "properties": {}}),
            ),
        };
        json!({"name": name, "description": description, "inputSchema": schema})
    }
}

/// Whole seconds, rounded up, at least 1: what a model is told to wait.
pub(crate) fn seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

fn result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": is_error,
    })
}

/// The promoted call's answer: the handle.
pub(crate) fn handle(rec: &TaskRecord, prefix: &str, max_wait_s: u64) -> Value {
    let after = seconds(rec.poll_interval_ms);
    result(
        format!(
            "The tool `{tool}` is still running as task {id}. Call `{prefix}task_status` with \
             {{\"taskId\": \"{id}\", \"waitSeconds\": {max_wait_s}}} to wait for its result \
             (or without waitSeconds, after {after} s, to check on it).",
            tool = rec.tool,
            id = rec.task_id,
        ),
        json!({
            "taskId": rec.task_id,
            "status": "working",
            "tool": rec.tool,
            "pollAfterSeconds": after,
        }),
        false,
    )
}

/// A task still running (or waiting for input the client cannot give on this call).
pub(crate) fn running(rec: &TaskRecord, prefix: &str, max_wait_s: u64) -> Value {
    let after = seconds(rec.poll_interval_ms);
    let message = rec.status_message.as_deref().unwrap_or(rec.status.as_str());
    let text = if rec.status == TaskStatus::InputRequired {
        format!(
            "Task {id} (`{tool}`) is waiting for input this client cannot give here: {waits}. \
             It fails if nobody answers in time.",
            id = rec.task_id,
            tool = rec.tool,
            waits = waits_for(rec),
        )
    } else {
        format!(
            "Task {id} (`{tool}`) is still running: {message}. Call `{prefix}task_status` again \
             in {after} s, or with waitSeconds up to {max_wait_s} to wait for it.",
            id = rec.task_id,
            tool = rec.tool,
        )
    };
    result(
        text,
        json!({
            "taskId": rec.task_id,
            "status": rec.status.as_str(),
            "statusMessage": message,
            "pollAfterSeconds": after,
        }),
        false,
    )
}

/// What an `input_required` task waits for, in words: each request's method and
/// message.
fn waits_for(rec: &TaskRecord) -> String {
    let parts: Vec<String> = rec
        .input_requests
        .values()
        .map(|r| {
            let method = crate::protocol::fields::method_of(r).unwrap_or("a request");
            match r
                .get("params")
                .and_then(|p| p.get("message"))
                .and_then(Value::as_str)
            {
                Some(m) => format!("{method} ({m:?})"),
                None => method.to_string(),
            }
        })
        .collect();
    if parts.is_empty() {
        "input".into()
    } else {
        parts.join(", ")
    }
}

/// A terminal task: the tool's own result as stored when it completed; an error result
/// naming the failure or the cancellation otherwise.
pub(crate) fn terminal(rec: &TaskRecord) -> Value {
    match (rec.status, &rec.result) {
        (TaskStatus::Completed, Some(v)) => v.clone(),
        (TaskStatus::Cancelled, _) => result(
            format!("Task {} (`{}`) was cancelled.", rec.task_id, rec.tool),
            json!({"taskId": rec.task_id, "status": "cancelled"}),
            true,
        ),
        _ => {
            let error = rec.error.clone().unwrap_or(Value::Null);
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no error was recorded");
            let code = error.get("code").and_then(Value::as_i64);
            let text = match code {
                Some(c) => format!(
                    "Task {} (`{}`) failed: {message} (code {c}).",
                    rec.task_id, rec.tool
                ),
                None => format!("Task {} (`{}`) failed: {message}.", rec.task_id, rec.tool),
            };
            result(
                text,
                json!({"taskId": rec.task_id, "status": "failed", "error": error}),
                true,
            )
        }
    }
}

/// A foreign, unknown or never-issued id: one answer for all, whatever the id
/// (docs/design.md §7 "Ownership").
pub(crate) fn not_found() -> Value {
    result(
        "No such task was found: it is unknown, or not yours (task not found).".into(),
        json!({"error": "task not found"}),
        true,
    )
}

/// The owner's expired task (its tombstone).
pub(crate) fn expired(task_id: &str) -> Value {
    result(
        format!("Task {task_id} expired: its result is no longer kept (task expired)."),
        json!({"taskId": task_id, "error": "task expired"}),
        true,
    )
}

/// More status calls at once than the poll burst: a hint a model can act on, where a
/// 429 would end most agents' runs.
pub(crate) fn polled_too_often(retry_after_s: u64) -> Value {
    result(
        format!("polled too often; call again in {retry_after_s} s"),
        json!({"retryAfterSeconds": retry_after_s}),
        true,
    )
}

/// A cancel acknowledged: cooperative (docs/design.md §6 "Cancel"), so the status may
/// still be the one before the cancel took effect.
pub(crate) fn cancelled(task_id: &str, status: TaskStatus) -> Value {
    let text = if status.is_terminal() && status != TaskStatus::Cancelled {
        format!(
            "Task {task_id} had already ended ({}); nothing was cancelled.",
            status.as_str()
        )
    } else {
        format!("Cancellation of task {task_id} was requested.")
    };
    result(
        text,
        json!({"taskId": task_id, "status": status.as_str()}),
        false,
    )
}

/// The caller's own tasks on the endpoint, newest first.
pub(crate) fn list(recs: &[TaskRecord]) -> Value {
    let tasks: Vec<Value> = recs
        .iter()
        .map(|r| {
            let mut m = Map::new();
            m.insert("taskId".into(), Value::from(r.task_id.clone()));
            m.insert("tool".into(), Value::from(r.tool.clone()));
            m.insert("status".into(), Value::from(r.status.as_str()));
            m.insert("createdAt".into(), Value::from(iso8601(r.created_at_ms)));
            Value::Object(m)
        })
        .collect();
    let text = if recs.is_empty() {
        "You have no tasks on this server.".to_string()
    } else {
        let lines: Vec<String> = recs
            .iter()
            .map(|r| {
                format!(
                    "{} `{}` {} (created {})",
                    r.task_id,
                    r.tool,
                    r.status.as_str(),
                    iso8601(r.created_at_ms)
                )
            })
            .collect();
        format!("Your tasks, newest first:\n{}", lines.join("\n"))
    };
    result(text, json!({"tasks": tasks}), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SCHEMA_VERSION;

    fn rec(status: TaskStatus) -> TaskRecord {
        TaskRecord {
            v: SCHEMA_VERSION,
            task_id: "tsk_AAAAAAAAAAAAAAAAAAAAAA".into(),
            tenant: "t".into(),
            subject: "s".into(),
            upstream: "demo".into(),
            tool: "sleep".into(),
            args_fingerprint: String::new(),
            idempotency_key: None,
            status,
            status_message: Some("step 1/2".into()),
            created_at_ms: 0,
            last_updated_at_ms: 0,
            ttl_ms: 1000,
            poll_interval_ms: 1500,
            expires_at_ms: 1000,
            result: None,
            error: None,
            input_requests: Map::new(),
            issued_keys: Vec::new(),
            cancel_requested: false,
            trace: None,
        }
    }

    #[test]
    fn names_round_trip_under_the_prefix() {
        for t in TaskTool::ALL {
            let name = format!("tg_{}", t.suffix());
            assert_eq!(TaskTool::named("tg_", &name), Some(t));
            assert_eq!(TaskTool::named("taskgate_", &name), None);
        }
        assert_eq!(TaskTool::named("tg_", "tg_task_other"), None);
        assert_eq!(TaskTool::names("p_").count(), 3);
        let def = TaskTool::Status.definition("p_", 50);
        assert_eq!(def["name"], "p_task_status");
        assert_eq!(
            def["inputSchema"]["properties"]["taskId"]["x-mcp-header"],
            "Task-Id"
        );
        assert_eq!(
            def["inputSchema"]["properties"]["waitSeconds"]["maximum"],
            50
        );
        let cancel = TaskTool::Cancel.definition("p_", 50);
        assert!(
            cancel["inputSchema"]["properties"]["taskId"]
                .get("x-mcp-header")
                .is_none()
        );
    }

    #[test]
    fn handle_and_running_rows_tell_a_model_what_to_do() {
        let r = rec(TaskStatus::Working);
        let h = handle(&r, "taskgate_", 50);
        assert_eq!(h["isError"], false);
        assert_eq!(
            h["structuredContent"],
            json!({"taskId": r.task_id, "status": "working", "tool": "sleep", "pollAfterSeconds": 2})
        );
        let text = h["content"][0]["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("taskgate_task_status") && text.contains(&r.task_id),
            "{text}"
        );
        let run = running(&r, "taskgate_", 50);
        assert_eq!(run["structuredContent"]["statusMessage"], "step 1/2");
        assert_eq!(run["structuredContent"]["pollAfterSeconds"], 2);
    }

    #[test]
    fn terminal_rows() {
        let mut done = rec(TaskStatus::Completed);
        let stored =
            json!({"content": [{"type": "text", "text": "ok"}], "structuredContent": {"n": 1}});
        done.result = Some(stored.clone());
        assert_eq!(terminal(&done), stored);

        let mut failed = rec(TaskStatus::Failed);
        failed.error = Some(json!({"code": -32603, "message": "boom"}));
        let f = terminal(&failed);
        assert_eq!(f["isError"], true);
        let text = f["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("boom") && text.contains("-32603"), "{text}");

        let c = terminal(&rec(TaskStatus::Cancelled));
        assert_eq!(c["isError"], true);
        assert_eq!(c["structuredContent"]["status"], "cancelled");
    }

    #[test]
    fn refusals_are_error_results() {
        assert_eq!(not_found()["isError"], true);
        let e = expired("tsk_x");
        assert!(
            e["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("task expired")
        );
        assert_eq!(
            polled_too_often(3)["structuredContent"],
            json!({"retryAfterSeconds": 3})
        );
        assert_eq!(seconds(0), 1);
        assert_eq!(seconds(1001), 2);
    }

    #[test]
    fn list_rows_are_newest_first_as_given() {
        let l = list(&[rec(TaskStatus::Working), rec(TaskStatus::Completed)]);
        assert_eq!(l["structuredContent"]["tasks"][1]["status"], "completed");
        assert_eq!(
            l["structuredContent"]["tasks"][0]["createdAt"],
            "1970-01-01T00:00:00.000Z"
        );
        assert!(list(&[])["content"][0]["text"].as_str().is_some());
    }
}
