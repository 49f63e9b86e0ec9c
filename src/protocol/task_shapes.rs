//! The task-related JSON shapes the engine reads but did not write itself, or wrote as
//! passthrough `Value`s: an upstream's own task (MCP 2025-11-25 "Tasks"), the tool
//! results and errors a task records, the input requests it holds and the answers to
//! them. Each is a typed view, read once where the engine takes the value in.
//!
//! Reading never refuses: a field that is missing or of another JSON type reads as
//! absent, and the engine falls back as it always did (a `tasks/get` without a status
//! is no known status; an error without a code is `-32603`). Nothing is copied out of
//! the value: the passthrough parts (a request's `params`, an error's `data`) are
//! borrowed, so their number text stays what `arbitrary_precision` kept (as in
//! `params.rs`, no serde derive rebuilds a value that passes through).

use serde_json::Value;

/// The string at `key` of the object `v`, if it is one.
fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// An upstream's `Task` (MCP 2025-11-25 "Tasks", "Data Types", "Task"): the `task` of
/// its `CreateTaskResult`, and what its `tasks/get` answers (a `GetTaskResult` is the
/// `Task` itself).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpstreamTask<'a> {
    pub task_id: Option<&'a str>,
    pub status: Option<&'a str>,
    pub status_message: Option<&'a str>,
    /// `ttl`, in milliseconds.
    pub ttl_ms: Option<u64>,
    /// `pollInterval`, in milliseconds.
    pub poll_interval_ms: Option<u64>,
}

impl<'a> UpstreamTask<'a> {
    /// The `Task` that `v` is.
    pub fn read(v: &'a Value) -> Self {
        Self {
            task_id: str_at(v, "taskId"),
            status: str_at(v, "status"),
            status_message: str_at(v, "statusMessage"),
            ttl_ms: v.get("ttl").and_then(Value::as_u64),
            poll_interval_ms: v.get("pollInterval").and_then(Value::as_u64),
        }
    }

    /// The `task` of a `CreateTaskResult` (MCP 2025-11-25 "Tasks", "Creating Tasks");
    /// `None` when `v` has none (the server ran the call without a task).
    pub fn created(v: &'a Value) -> Option<Self> {
        v.get("task").map(Self::read)
    }
}

/// What the engine reads of a `CallToolResult` (MCP 2025-11-25 "Tools", "Tool
/// Result").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolResult {
    /// `content` is an array: the value is a tool result at all.
    pub has_content: bool,
    /// `isError` is `true`: the tool reports an error.
    pub is_error: bool,
}

impl ToolResult {
    pub fn read(v: &Value) -> Self {
        Self {
            has_content: v.get("content").is_some_and(Value::is_array),
            is_error: v.get("isError").and_then(Value::as_bool).unwrap_or(false),
        }
    }
}

/// A JSON-RPC error object, `{code, message, data?}`, as a task records it or an
/// upstream sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ErrorObject<'a> {
    pub code: Option<i64>,
    pub message: Option<&'a str>,
    /// Present whatever its value (`null` included), as sent.
    pub data: Option<&'a Value>,
}

impl<'a> ErrorObject<'a> {
    pub fn read(v: &'a Value) -> Self {
        Self {
            code: v.get("code").and_then(Value::as_i64),
            message: str_at(v, "message"),
            data: v.get("data"),
        }
    }
}

/// An input request as the gateway holds it, `{method, params}`: a task's
/// `inputRequests` entry and an MRTR round's outstanding request (MCP 2026-07-28
/// "Multi Round-Trip Requests").
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HeldRequest<'a> {
    pub method: Option<&'a str>,
    /// Present whatever its value, as the upstream sent it.
    pub params: Option<&'a Value>,
}

impl<'a> HeldRequest<'a> {
    pub fn read(v: &'a Value) -> Self {
        Self {
            method: str_at(v, "method"),
            params: v.get("params"),
        }
    }
}

/// What an answer to an input request holds of the fields its kind requires: an
/// `ElicitResult`'s `action`, a `ListRootsResult`'s `roots` array, a
/// `CreateMessageResult`'s `content` (MCP 2025-11-25 "Elicitation", "Roots",
/// "Sampling").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputAnswerShape<'a> {
    pub action: Option<&'a str>,
    /// `roots` is an array.
    pub has_roots: bool,
    /// `content` is present, whatever its value.
    pub has_content: bool,
}

impl<'a> InputAnswerShape<'a> {
    pub fn read(v: &'a Value) -> Self {
        Self {
            action: str_at(v, "action"),
            has_roots: v.get("roots").is_some_and(Value::is_array),
            has_content: v.get("content").is_some(),
        }
    }
}

/// The params of an `elicitation/create` request (MCP 2025-11-25 "Elicitation"): the
/// `mode` it asks in (`form` when absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ElicitationParams<'a> {
    pub mode: Option<&'a str>,
}

impl<'a> ElicitationParams<'a> {
    pub fn read(v: &'a Value) -> Self {
        Self {
            mode: str_at(v, "mode"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_upstream_task_reads_its_fields_and_ignores_wrong_types() {
        let v = json!({"taskId": "t1", "status": "working", "statusMessage": "busy",
            "ttl": 300000, "pollInterval": 500});
        assert_eq!(
            UpstreamTask::read(&v),
            UpstreamTask {
                task_id: Some("t1"),
                status: Some("working"),
                status_message: Some("busy"),
                ttl_ms: Some(300_000),
                poll_interval_ms: Some(500),
            }
        );
        let odd = json!({"taskId": 7, "status": null, "ttl": -1, "pollInterval": 1.5});
        assert_eq!(UpstreamTask::read(&odd), UpstreamTask::default());
        for not_an_object in [json!([1, 2]), json!("x"), json!(null), json!(3)] {
            assert_eq!(UpstreamTask::read(&not_an_object), UpstreamTask::default());
        }
    }

    #[test]
    fn a_created_task_is_under_task() {
        let v = json!({"task": {"taskId": "t1", "ttl": 60000}});
        let t = UpstreamTask::created(&v);
        assert_eq!(t.and_then(|t| t.task_id), Some("t1"));
        assert_eq!(t.and_then(|t| t.ttl_ms), Some(60_000));
        let plain = json!({"content": []});
        assert_eq!(UpstreamTask::created(&plain), None);
        // A `task` that is no object names no task id.
        let odd = json!({"task": "t1"});
        let t = UpstreamTask::created(&odd);
        assert_eq!(t.and_then(|t| t.task_id), None);
    }

    #[test]
    fn tool_results_and_errors() {
        let r = ToolResult::read(&json!({"content": [], "isError": true}));
        assert_eq!(
            r,
            ToolResult {
                has_content: true,
                is_error: true
            }
        );
        let r = ToolResult::read(&json!({"content": {}, "isError": "true"}));
        assert_eq!(r, ToolResult::default());

        let e = json!({"code": -32000, "message": "boom", "data": null});
        let read = ErrorObject::read(&e);
        assert_eq!(
            (read.code, read.message, read.data),
            (Some(-32000), Some("boom"), Some(&Value::Null))
        );
        let odd = json!({"code": 1.5, "message": 3});
        assert_eq!(ErrorObject::read(&odd), ErrorObject::default());
    }

    #[test]
    fn passthrough_values_are_borrowed_with_their_number_text() {
        let v: Value = serde_json::from_str(r#"{"method":"m","params":{"n":1.50,"z":-0}}"#)
            .unwrap_or_default();
        let held = HeldRequest::read(&v);
        assert_eq!(held.method, Some("m"));
        let text = held.params.map(Value::to_string).unwrap_or_default();
        assert_eq!(text, r#"{"n":1.50,"z":-0}"#);
        let e: Value = serde_json::from_str(r#"{"data":[1.50]}"#).unwrap_or_default();
        let data = ErrorObject::read(&e).data.map(Value::to_string);
        assert_eq!(data.as_deref(), Some("[1.50]"));
    }

    #[test]
    fn answers_and_elicitation_params() {
        let answer = json!({"action": "accept", "roots": [], "content": null});
        assert_eq!(
            InputAnswerShape::read(&answer),
            InputAnswerShape {
                action: Some("accept"),
                has_roots: true,
                has_content: true,
            }
        );
        let odd = json!({"action": 1, "roots": {}});
        assert_eq!(InputAnswerShape::read(&odd), InputAnswerShape::default());
        let url = json!({"mode": "url"});
        assert_eq!(ElicitationParams::read(&url).mode, Some("url"));
        let odd = json!({"mode": 1});
        assert_eq!(ElicitationParams::read(&odd).mode, None);
    }
}
