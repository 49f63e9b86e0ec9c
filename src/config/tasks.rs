//! `[tasks]` (promotion, lifetimes, poll intervals, timeouts) and `[limits]` (flow
//! control).

use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use super::millis::millis;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    #[serde(rename = "promote_after_ms", deserialize_with = "millis")]
    pub promote_after: Duration,
    #[serde(rename = "ttl_ms", deserialize_with = "millis")]
    pub ttl: Duration,
    #[serde(rename = "result_retention_ms", deserialize_with = "millis")]
    pub result_retention: Duration,
    #[serde(rename = "poll_interval_ms", deserialize_with = "millis")]
    pub poll_interval: Duration,
    #[serde(rename = "max_poll_interval_ms", deserialize_with = "millis")]
    pub max_poll_interval: Duration,
    #[serde(rename = "sync_timeout_ms", deserialize_with = "millis")]
    pub sync_timeout: Duration,
    #[serde(rename = "input_timeout_ms", deserialize_with = "millis")]
    pub input_timeout: Duration,
    #[serde(rename = "input_gather_ms", deserialize_with = "millis")]
    pub input_gather: Duration,
    pub max_result_bytes: usize,
    /// The prefix of the task tools plain clients see beside a handle-mode upstream's
    /// own (docs/design.md §28 "Task handles for plain clients"); never empty.
    pub task_tools_prefix: String,
    /// The longest a task-status tool call holds for `waitSeconds`.
    #[serde(rename = "max_status_wait_ms", deserialize_with = "millis")]
    pub max_status_wait: Duration,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            promote_after: Duration::from_millis(1_000),
            ttl: Duration::from_millis(3_600_000),
            result_retention: Duration::from_millis(3_600_000),
            poll_interval: Duration::from_millis(1_000),
            max_poll_interval: Duration::from_millis(30_000),
            sync_timeout: Duration::from_millis(300_000),
            input_timeout: Duration::from_millis(600_000),
            input_gather: Duration::from_millis(50),
            max_result_bytes: 16_777_216,
            task_tools_prefix: "taskgate_".into(),
            max_status_wait: Duration::from_millis(50_000),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub poll_burst: u32,
    pub requests_per_second: u32,
    pub max_live_tasks_per_tenant: u64,
    pub queue_size: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            poll_burst: 3,
            requests_per_second: 0,
            max_live_tasks_per_tenant: 10_000,
            queue_size: 1024,
        }
    }
}

impl TasksConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.ttl.is_zero() {
            return Err(invalid("tasks.ttl_ms", "must be > 0"));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid("tasks.poll_interval_ms", "must be > 0"));
        }
        if self.max_poll_interval < self.poll_interval {
            return Err(invalid(
                "tasks.max_poll_interval_ms",
                "must be >= tasks.poll_interval_ms",
            ));
        }
        if self.sync_timeout.is_zero() {
            return Err(invalid("tasks.sync_timeout_ms", "must be > 0"));
        }
        if self.task_tools_prefix.is_empty() {
            // An empty prefix would name the task tools like any upstream tool.
            return Err(invalid("tasks.task_tools_prefix", "must not be empty"));
        }
        Ok(())
    }
}
