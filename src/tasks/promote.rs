//! The promotion decision (docs/design.md §1 "Promotion"): for one `tools/call`,
//! whether and when it becomes a task. Per-tool settings win over per-upstream ones,
//! which win over `[tasks]`.

use std::time::Duration;

use crate::config::{OnInput, PlainClients, TaskMode, TasksConfig, UpstreamConfig};

/// How one tool call is to be run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub mode: TaskMode,
    /// Race the upstream against this deadline; zero = always a task.
    pub promote_after: Duration,
    pub on_input: OnInput,
    /// Tool argument that carries a caller idempotency key (docs/design.md §9
    /// "Idempotency").
    pub idempotency_argument: Option<String>,
    /// Absolute cap on the upstream call.
    pub call_timeout: Option<Duration>,
    /// What a plain client gets at the deadline (docs/design.md §28).
    pub plain_clients: PlainClients,
}

impl Promotion {
    pub fn resolve(tasks: &TasksConfig, upstream: &UpstreamConfig, tool: &str) -> Self {
        let t = upstream.tools.get(tool);
        let promote_after = t
            .and_then(|t| t.promote_after)
            .or(upstream.promote_after)
            .unwrap_or(tasks.promote_after);
        let call_timeout = t.and_then(|t| t.call_timeout).or(upstream.call_timeout);
        Self {
            mode: t.map(|t| t.task).unwrap_or_default(),
            promote_after,
            on_input: t.map(|t| t.on_input).unwrap_or_default(),
            idempotency_argument: t.and_then(|t| t.idempotency_argument.clone()),
            call_timeout,
            plain_clients: upstream.plain_clients_of(tool),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn tool_beats_upstream_beats_global() {
        let cfg = Config::parse(
            r#"
[auth]
mode = "none"
[tasks]
promote_after_ms = 900
[[upstream]]
name = "a"
command = ["x"]
promote_after_ms = 500
[upstream.tools.fast]
promote_after_ms = 0
task = "required"
on_input = "mrtr"
"#,
        )
        .unwrap();
        let u = &cfg.upstreams[0];
        let p = Promotion::resolve(&cfg.tasks, u, "fast");
        assert_eq!(p.promote_after, Duration::ZERO);
        assert_eq!(p.mode, TaskMode::Required);
        assert_eq!(p.on_input, OnInput::Mrtr);
        let p = Promotion::resolve(&cfg.tasks, u, "other");
        assert_eq!(p.promote_after, Duration::from_millis(500));
        assert_eq!(p.mode, TaskMode::Optional);
    }
}
