//! Wire shapes of a task (MCP Tasks extension, "Tasks", "Task Creation", "Task
//! Polling", "Task Status Notifications"): the flat `CreateTaskResult`, the
//! `DetailedTask` that `tasks/get` returns and `notifications/tasks` carries.

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::clock::iso8601;
use crate::protocol::results::{self, add_server_info};
use crate::protocol::{META_RELATED_TASK, META_SERVER_INFO, Method};
use crate::store::{TaskRecord, TaskStatus};

/// The `Task` fields every shape of either dialect shares: `status` as that dialect
/// shows it, and the ttl and poll interval under that dialect's names
/// (`dialect.rs` renders the 2025-11-25 ones).
pub fn task_fields(
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

/// The `tasks/get` result as a `Value`: the reference [`GetResult`] is checked
/// against.
#[cfg(test)]
pub fn get_result(rec: &TaskRecord, server_info: &Value) -> Value {
    let mut m = detailed(rec, server_info);
    m.insert("resultType".into(), Value::from("complete"));
    add_server_info(&mut m, server_info);
    Value::Object(m)
}

/// The `tasks/get` result, serialized straight from the owner's snapshot: the same
/// JSON, key for key, as `detailed` + `resultType` + the identity in `_meta`, without
/// building that `Value` tree or copying the stored result. Every poll renders one,
/// and the tree was a fifth of a poll's instructions (benches/RESULTS.md, "A poll's
/// answer written from the snapshot"). The tests compare it with `get_result`, the
/// `Value` tree kept for them.
#[derive(Debug)]
pub struct GetResult<'a> {
    pub rec: Arc<TaskRecord>,
    pub server_info: &'a Value,
}

impl Serialize for GetResult<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let rec = &*self.rec;
        let mut m = s.serialize_map(None)?;
        // `task_fields`, in its order.
        m.serialize_entry("taskId", &rec.task_id)?;
        m.serialize_entry("status", rec.status.as_str())?;
        if let Some(msg) = &rec.status_message {
            m.serialize_entry("statusMessage", msg)?;
        }
        m.serialize_entry("createdAt", &iso8601(rec.created_at_ms))?;
        m.serialize_entry("lastUpdatedAt", &iso8601(rec.last_updated_at_ms))?;
        m.serialize_entry("ttlMs", &rec.ttl_ms.max(1))?;
        m.serialize_entry("pollIntervalMs", &rec.poll_interval_ms.max(1))?;
        // `detailed`'s status-specific fields.
        match rec.status {
            TaskStatus::InputRequired => m.serialize_entry("inputRequests", &rec.input_requests)?,
            TaskStatus::Completed => m.serialize_entry(
                "result",
                &CompleteToolResult {
                    stored: rec.result.as_ref(),
                    server_info: self.server_info,
                },
            )?,
            TaskStatus::Failed => match &rec.error {
                Some(e) => m.serialize_entry("error", e)?,
                None => m.serialize_entry(
                    "error",
                    &serde_json::json!({"code": -32603, "message": "task failed"}),
                )?,
            },
            TaskStatus::Working | TaskStatus::Cancelled => {}
        }
        m.serialize_entry("resultType", "complete")?;
        m.serialize_entry("_meta", &ServerInfoOnly(self.server_info))?;
        m.end()
    }
}

/// `results::complete(Method::ToolsCall, stored, server_info)`, written from the
/// stored result in place: its keys in their order, `resultType` set where it stands
/// or appended, `_meta` rewritten where it stands or appended after it.
struct CompleteToolResult<'a> {
    stored: Option<&'a Value>,
    server_info: &'a Value,
}

impl Serialize for CompleteToolResult<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        let fields = match self.stored {
            Some(Value::Object(o)) => Some(o),
            // A non-object result is wrapped (`complete`); none at all is an empty one.
            Some(other) => {
                m.serialize_entry("value", other)?;
                None
            }
            None => None,
        };
        let (mut has_result_type, mut has_meta) = (false, false);
        for (k, v) in fields.into_iter().flatten() {
            match k.as_str() {
                "resultType" => {
                    has_result_type = true;
                    m.serialize_entry(k, "complete")?;
                }
                "_meta" => {
                    has_meta = true;
                    m.serialize_entry(
                        k,
                        &MetaWithServerInfo {
                            meta: v,
                            server_info: self.server_info,
                        },
                    )?;
                }
                _ => m.serialize_entry(k, v)?,
            }
        }
        if !has_result_type {
            m.serialize_entry("resultType", "complete")?;
        }
        if !has_meta {
            m.serialize_entry("_meta", &ServerInfoOnly(self.server_info))?;
        }
        m.end()
    }
}

/// `{"io.modelcontextprotocol/serverInfo": server_info}`.
struct ServerInfoOnly<'a>(&'a Value);

impl Serialize for ServerInfoOnly<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(META_SERVER_INFO, self.0)?;
        m.end()
    }
}

/// An existing `_meta` as `add_server_info` leaves it: the legacy `related-task` key
/// removed the way `serde_json`'s ordered map removes (the last key takes its place),
/// then the identity set in place or appended. Any other value becomes
/// [`ServerInfoOnly`].
struct MetaWithServerInfo<'a> {
    meta: &'a Value,
    server_info: &'a Value,
}

impl Serialize for MetaWithServerInfo<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Value::Object(meta) = self.meta else {
            return ServerInfoOnly(self.server_info).serialize(s);
        };
        let mut keys: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        if let Some(i) = keys.iter().position(|(k, _)| *k == META_RELATED_TASK) {
            keys.swap_remove(i);
        }
        match keys.iter_mut().find(|(k, _)| *k == META_SERVER_INFO) {
            Some(entry) => entry.1 = self.server_info,
            None => keys.push((META_SERVER_INFO, self.server_info)),
        }
        let mut m = s.serialize_map(Some(keys.len()))?;
        for (k, v) in keys {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
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

    /// [`GetResult`] writes the bytes [`get_result`] serializes to, for every status
    /// and every shape of stored result the rewriting treats apart.
    #[test]
    fn get_result_view_writes_what_the_value_tree_does() {
        let si = json!({"name": "up", "version": "1", "title": "Up"});
        let results = [
            json!({"content": [{"type": "text", "text": "done"}], "isError": false}),
            json!({}),
            json!({"resultType": "partial", "content": [], "z": 1}),
            json!({"_meta": {"x": 1}, "content": []}),
            json!({"a": 1, "_meta": {
                "io.modelcontextprotocol/related-task": {"taskId": "t"}, "b": 2, "c": 3
            }, "resultType": "x", "d": 4}),
            json!({"_meta": {
                "p": 0,
                "io.modelcontextprotocol/serverInfo": {"old": true},
                "io.modelcontextprotocol/related-task": {"taskId": "t"},
                "q": 1
            }}),
            json!({"_meta": "not an object", "k": "v"}),
            json!([1, 2, 3]),
            json!("text"),
            Value::Null,
        ];
        let mut records = Vec::new();
        for r in results {
            records.push(completed(r));
        }
        let mut none = completed(json!({}));
        none.result = None;
        records.push(none);
        for status in [
            TaskStatus::Working,
            TaskStatus::InputRequired,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ] {
            let mut rec = completed(json!({"unused": true}));
            rec.status = status;
            rec.status_message = None;
            rec.ttl_ms = 0;
            rec.input_requests = json!({"r1": {"method": "elicitation/create", "params": {}}})
                .as_object()
                .cloned()
                .unwrap_or_default();
            records.push(rec.clone());
            rec.error = Some(json!({"code": -32000, "message": "boom", "data": [1]}));
            records.push(rec);
        }
        for rec in records {
            let want = serde_json::to_string(&get_result(&rec, &si)).unwrap();
            let got = serde_json::to_string(&GetResult {
                rec: Arc::new(rec),
                server_info: &si,
            })
            .unwrap();
            assert_eq!(got, want);
        }
    }
}
