//! `[tasks]` (promotion, lifetimes, poll intervals, timeouts) and `[limits]` (flow
//! control).

use serde::Deserialize;

use super::error::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    pub promote_after_ms: u64,
    pub ttl_ms: u64,
    pub result_retention_ms: u64,
    pub poll_interval_ms: u64,
    pub max_poll_interval_ms: u64,
    pub sync_timeout_ms: u64,
    pub input_timeout_ms: u64,
    pub input_gather_ms: u64,
    pub max_result_bytes: usize,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            promote_after_ms: 1_000,
            ttl_ms: 3_600_000,
            result_retention_ms: 3_600_000,
            poll_interval_ms: 1_000,
            max_poll_interval_ms: 30_000,
            sync_timeout_ms: 300_000,
            input_timeout_ms: 600_000,
            input_gather_ms: 50,
            max_result_bytes: 16_777_216,
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
        if self.ttl_ms == 0 {
            return Err(invalid("tasks.ttl_ms", "must be > 0"));
        }
        if self.poll_interval_ms == 0 {
            return Err(invalid("tasks.poll_interval_ms", "must be > 0"));
        }
        if self.max_poll_interval_ms < self.poll_interval_ms {
            return Err(invalid(
                "tasks.max_poll_interval_ms",
                "must be >= tasks.poll_interval_ms",
            ));
        }
        if self.sync_timeout_ms == 0 {
            return Err(invalid("tasks.sync_timeout_ms", "must be > 0"));
        }
        Ok(())
    }
}
