//! Records for the store's own tests (the contract suite, sled's tests, PostgreSQL's):
//! one working task and one request route, adjusted per test with struct update
//! syntax.

use serde_json::Map;

use super::{RequestRoute, SCHEMA_VERSION, TaskRecord, TaskStatus, now_ms};

/// A working task of `tenant` (subject `alice`), created now, expiring at
/// `expires_at_ms`.
pub(crate) fn task(id: &str, tenant: &str, expires_at_ms: u64) -> TaskRecord {
    let now = now_ms();
    TaskRecord {
        v: SCHEMA_VERSION,
        task_id: id.into(),
        tenant: tenant.into(),
        subject: "alice".into(),
        upstream: "demo".into(),
        tool: "sleep".into(),
        args_fingerprint: "fp".into(),
        idempotency_key: None,
        status: TaskStatus::Working,
        status_message: Some("working".into()),
        created_at_ms: now,
        last_updated_at_ms: now,
        ttl_ms: expires_at_ms.saturating_sub(now),
        poll_interval_ms: 1000,
        expires_at_ms,
        result: None,
        error: None,
        input_requests: Map::new(),
        issued_keys: Vec::new(),
        cancel_requested: false,
    }
}

/// The route of an upstream call of `acme`/`alice` started now, for task `task_id`
/// (`None`: a call that is not a task's).
pub(crate) fn route(id: &str, task_id: Option<&str>) -> RequestRoute {
    let now = now_ms();
    RequestRoute {
        v: SCHEMA_VERSION,
        route_id: id.into(),
        upstream: "demo".into(),
        tenant: "acme".into(),
        subject: "alice".into(),
        method: "tools/call".into(),
        started_at_ms: now,
        deadline_ms: now + 60_000,
        task_id: task_id.map(str::to_string),
    }
}
