//! What the gateway reads of a legacy upstream's `initialize` result (MCP 2025-11-25
//! "Lifecycle", "Initialization"): borrowed views, since `capabilities` and
//! `serverInfo` are kept exactly as the upstream sent them ([`super::UpstreamInfo`]),
//! which a copy through a typed model would not promise (the module docs of
//! `protocol`: payload fidelity).
//!
//! Every member reads the way a lookup by name does: one of another type than the one
//! named is as good as missing.

use serde_json::{Map, Value};

/// An `initialize` result that is a JSON object.
#[derive(Debug, Clone, Copy)]
pub struct InitializeResult<'a>(&'a Map<String, Value>);

impl<'a> InitializeResult<'a> {
    /// The view of `result`; `None` when it is not an object.
    pub fn of(result: &'a Value) -> Option<Self> {
        result.as_object().map(Self)
    }

    /// `protocolVersion`, when it is a string.
    pub fn protocol_version(self) -> Option<&'a str> {
        self.0.get("protocolVersion").and_then(Value::as_str)
    }

    /// `capabilities`, when it is an object.
    pub fn capabilities(self) -> Option<&'a Map<String, Value>> {
        self.0.get("capabilities").and_then(Value::as_object)
    }

    /// `serverInfo`, whatever it holds (`null` included): it is passed on as sent.
    pub fn server_info(self) -> Option<&'a Value> {
        self.0.get("serverInfo")
    }

    /// `instructions`, when it is a string.
    pub fn instructions(self) -> Option<&'a str> {
        self.0.get("instructions").and_then(Value::as_str)
    }
}

/// Whether a server's `capabilities` advertise 2025-11-25 tasks for `tools/call`:
/// `tasks.requests.tools.call` is an object. A read of the borrowed map: every
/// `tools/call` asks (docs/design.md §25).
pub fn advertises_tool_call_tasks(capabilities: &Map<String, Value>) -> bool {
    capabilities
        .get("tasks")
        .and_then(|t| t.get("requests"))
        .and_then(|r| r.get("tools"))
        .and_then(|t| t.get("call"))
        .is_some_and(Value::is_object)
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::{InitializeResult, advertises_tool_call_tasks};

    fn caps(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn reads_members_of_their_type() {
        let r = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": null,
            "instructions": 5,
        });
        let view = InitializeResult::of(&r).unwrap();
        assert_eq!(view.protocol_version(), Some("2025-06-18"));
        assert!(view.capabilities().is_some_and(|c| c.contains_key("tools")));
        assert_eq!(view.server_info(), Some(&Value::Null));
        assert_eq!(view.instructions(), None);
        let odd = json!({"protocolVersion": 2025, "capabilities": []});
        let view = InitializeResult::of(&odd).unwrap();
        assert_eq!(view.protocol_version(), None);
        assert!(view.capabilities().is_none());
        assert!(view.server_info().is_none());
        assert!(InitializeResult::of(&json!([])).is_none());
    }

    #[test]
    fn tool_call_tasks_need_an_object_at_the_end() {
        let yes = caps(json!({"tasks": {"requests": {"tools": {"call": {}}}}}));
        assert!(advertises_tool_call_tasks(&yes));
        for no in [
            json!({}),
            json!({"tasks": {"requests": {"tools": {"call": true}}}}),
            json!({"tasks": {"requests": {"tools": {}}}}),
            json!({"tasks": {"requests": [{"tools": {"call": {}}}]}}),
            json!({"tasks": null}),
        ] {
            assert!(!advertises_tool_call_tasks(&caps(no.clone())), "{no}");
        }
        // The same answer as a JSON pointer from `tasks` gives.
        for v in [
            json!({"tasks": {"requests": {"tools": {"call": {"x": 1}}}}}),
            json!({"tasks": {"requests": {"tools": {"call": []}}}}),
            json!({"tasks": [{"requests": {}}]}),
            json!({"tasks": "x"}),
        ] {
            let c = caps(v.clone());
            let by_pointer = c
                .get("tasks")
                .and_then(|t| t.pointer("/requests/tools/call"))
                .is_some_and(Value::is_object);
            assert_eq!(advertises_tool_call_tasks(&c), by_pointer, "{v}");
        }
    }
}
