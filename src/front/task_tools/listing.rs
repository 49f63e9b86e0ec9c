//! The `tools/list` a plain client sees on an endpoint that offers handles
//! (docs/design.md §28): a handle-mode tool without its `outputSchema` (a handle
//! cannot conform to it; the real structured result comes back through
//! `task_status`), and the task tools after the upstream's own. A tasks client's list
//! is the upstream's.

use serde_json::Value;

use super::rows::TaskTool;
use crate::config::{PlainClients, UpstreamConfig};
use crate::protocol::tool_results::ToolsList;

/// Whether one of the upstream's tools bears a task tool's name under `prefix`: then
/// nothing is shadowed, and the endpoint holds plain clients' calls as before.
pub(crate) fn collides(list: &Value, prefix: &str) -> bool {
    let view = ToolsList::of(list);
    TaskTool::names(prefix).any(|n| view.find(&n).is_some())
}

/// Drop the `outputSchema` of each handle-mode tool of a first `tools/list` page.
pub(crate) fn strip_output_schemas(list: &mut Value, cfg: &UpstreamConfig) {
    let Some(tools) = list.get_mut("tools").and_then(Value::as_array_mut) else {
        return;
    };
    for t in tools.iter_mut() {
        let handle = crate::protocol::fields::tool_name(t)
            .is_some_and(|n| cfg.plain_clients_of(n) == PlainClients::Handle);
        if handle && let Some(o) = t.as_object_mut() {
            o.remove("outputSchema");
        }
    }
}

/// The task tools' list entries, in the order they are listed.
pub(crate) fn definitions(prefix: &str, max_wait_s: u64) -> Vec<Value> {
    [TaskTool::Status, TaskTool::Cancel, TaskTool::List]
        .into_iter()
        .map(|t| t.definition(prefix, max_wait_s))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::Config;

    fn cfg() -> Config {
        Config::parse(
            r#"
[auth]
mode = "none"
[[upstream]]
name = "a"
command = ["x"]
plain_clients = "handle"
[upstream.tools.quick]
plain_clients = "hold"
"#,
        )
        .unwrap()
    }

    #[test]
    fn handle_tools_lose_their_output_schema_and_the_task_tools_follow() {
        let cfg = cfg();
        let schema = json!({"type": "object"});
        let mut list = json!({"tools": [
            {"name": "slow", "outputSchema": schema},
            {"name": "quick", "outputSchema": schema},
        ]});
        assert!(!collides(&list, "taskgate_"));
        strip_output_schemas(&mut list, &cfg.upstreams[0]);
        let mut tools = list["tools"].as_array().cloned().unwrap_or_default();
        tools.extend(definitions("taskgate_", 50));
        assert!(tools[0].get("outputSchema").is_none());
        assert_eq!(tools[1]["outputSchema"], schema);
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "slow",
                "quick",
                "taskgate_task_status",
                "taskgate_task_cancel",
                "taskgate_task_list"
            ]
        );
    }

    #[test]
    fn a_tool_named_like_a_task_tool_collides() {
        let list = json!({"tools": [{"name": "taskgate_task_list"}]});
        assert!(collides(&list, "taskgate_"));
        assert!(!collides(&list, "tg_"));
    }
}
