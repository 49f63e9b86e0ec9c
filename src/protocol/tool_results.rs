//! What the gateway itself reads of the `tools/*` results it passes through: each
//! listed tool's name and `execution.taskSupport` (the promotion decision,
//! docs/design.md §25), and a call result's `isError`. The results stay `Value`s (the
//! module docs of `protocol`: payload fidelity); these are borrowed views of them,
//! cheap enough for every `tools/call`, and nothing here copies a result.
//!
//! Both read the way a lookup by name does: a member of another type than the one
//! named is as good as missing, and never makes the rest of the result unreadable.

use serde_json::Value;

/// A `tools/list` result, as the gateway reads it.
#[derive(Debug, Clone, Copy)]
pub struct ToolsList<'a> {
    tools: &'a [Value],
}

impl<'a> ToolsList<'a> {
    /// The view of `result`; no tools when `tools` is not an array.
    pub fn of(result: &'a Value) -> Self {
        let tools = result
            .get("tools")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        Self { tools }
    }

    /// The listed tools, in the upstream's order.
    pub fn tools(self) -> impl Iterator<Item = ListedTool<'a>> {
        self.tools.iter().map(ListedTool)
    }

    /// The first listed tool named `name` (the one a `tools/call` of `name` reaches).
    pub fn find(self, name: &str) -> Option<ListedTool<'a>> {
        self.tools().find(|t| t.name() == Some(name))
    }
}

/// One entry of a `tools/list` result's `tools`.
#[derive(Debug, Clone, Copy)]
pub struct ListedTool<'a>(&'a Value);

impl<'a> ListedTool<'a> {
    /// `name`, when it is a string.
    pub fn name(self) -> Option<&'a str> {
        self.0.get("name").and_then(Value::as_str)
    }

    /// `execution.taskSupport`, when it is a string: whatever the upstream wrote, for
    /// the caller to judge (`forbidden`, `optional`, `required`).
    pub fn task_support(self) -> Option<&'a str> {
        self.0
            .get("execution")
            .and_then(|e| e.get("taskSupport"))
            .and_then(Value::as_str)
    }
}

/// Whether a `tools/call` result reports a tool error (`isError: true`); anything
/// else, a missing or non-boolean `isError` included, is a success.
pub fn is_tool_error(result: &Value) -> bool {
    result.get("isError").and_then(Value::as_bool) == Some(true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{ToolsList, is_tool_error};

    #[test]
    fn finds_the_first_tool_of_a_name() {
        let list = json!({"tools": [
            7,
            ["slow", {"taskSupport": "required"}],
            {"name": 5, "execution": {"taskSupport": "required"}},
            {"name": "slow", "execution": {"taskSupport": "optional"}},
            {"name": "slow", "execution": {"taskSupport": "required"}},
            {"name": "fast"},
            {"name": "odd", "execution": {"taskSupport": 1}},
            {"name": "arr", "execution": ["required"]},
        ]});
        let view = ToolsList::of(&list);
        assert_eq!(view.tools().count(), 8);
        assert_eq!(
            view.find("slow").and_then(|t| t.task_support()),
            Some("optional")
        );
        assert!(
            view.find("fast")
                .is_some_and(|t| t.task_support().is_none())
        );
        assert!(view.find("odd").is_some_and(|t| t.task_support().is_none()));
        assert!(view.find("arr").is_some_and(|t| t.task_support().is_none()));
        assert!(view.find("none").is_none());
        for bad in [json!({"tools": {"name": "slow"}}), json!([1]), json!(null)] {
            assert!(ToolsList::of(&bad).find("slow").is_none());
        }
    }

    #[test]
    fn tool_error_is_a_true_is_error() {
        assert!(is_tool_error(&json!({"content": [], "isError": true})));
        for v in [
            json!({"isError": false}),
            json!({"isError": "true"}),
            json!({"content": []}),
            json!([true]),
            json!(true),
        ] {
            assert!(!is_tool_error(&v), "{v}");
        }
    }
}
