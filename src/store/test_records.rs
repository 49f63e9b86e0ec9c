//! Records for the store's own tests (the contract suite, sled's tests, PostgreSQL's):
//! one working task, one request route and one 2025-era client session, adjusted per
//! test with struct update syntax.

use serde_json::Map;

use super::{RequestRoute, SCHEMA_VERSION, SessionRecord, TaskRecord, TaskStatus, now_ms};

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
        trace: None,
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
        upstream_task: None,
    }
}

/// A session of `tenant`/`subject` on upstream `demo`, last seen at `last_seen_at_ms`.
/// Its `clientInfo` holds what a re-encoding would change (key order, number text).
pub(crate) fn session(
    id: &str,
    tenant: &str,
    subject: &str,
    last_seen_at_ms: u64,
) -> SessionRecord {
    let client_info =
        serde_json::from_str(r#"{"version":"1.0","name":"c","n":1.50,"z":-0}"#).unwrap_or_default();
    let client_capabilities =
        serde_json::from_str(r#"{"roots":{"listChanged":true},"elicitation":{}}"#)
            .unwrap_or_default();
    SessionRecord {
        v: SCHEMA_VERSION,
        session_id: id.into(),
        tenant: tenant.into(),
        subject: subject.into(),
        upstream: "demo".into(),
        protocol_version: "2025-06-18".into(),
        client_info,
        client_capabilities,
        created_at_ms: last_seen_at_ms,
        last_seen_at_ms,
        initialized: false,
        log_level: None,
        subscriptions: Vec::new(),
    }
}
