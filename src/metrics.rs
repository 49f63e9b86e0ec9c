//! Prometheus metrics at `GET /metrics` (README "Limits and metrics"), via the
//! `metrics` facade and `metrics-exporter-prometheus` (no HTTP listener feature: the
//! gateway serves the text itself, on its own listener or `server.metrics_listen`).
//!
//! Every metric the gateway records is named here, as a small function the rest of
//! the code calls. This module is a leaf: it names no other module of the crate, so
//! any layer may record (the recorder is process-wide by the `metrics` crate's design,
//! the one accepted global). Task status transitions reach it through an engine
//! observer that `main` registers.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The `status` label values of `taskgate_tasks` (the task statuses of the store).
const TASK_STATUSES: [&str; 5] = [
    "working",
    "input_required",
    "completed",
    "failed",
    "cancelled",
];

/// The `decision` label values of `taskgate_fail_closed_total`: each error branch that
/// refuses or keeps state for recovery instead of going on (docs/design.md §16 "Fail
/// closed").
pub const FAIL_CLOSED: [&str; 7] = [
    // A tenant's live tasks could not be counted: the call was refused (503).
    "quota_uncounted",
    // A relay taken from the store could not be read: logged with its id, not acted on.
    "relay_undecodable",
    // Recording a call's outcome failed unexpectedly: its route was kept for recovery.
    "route_kept",
    // A running call's input requests could not be recorded: refused to the upstream.
    "input_refused",
    // The store failed after the upstream call was sent: 200 + -32603, call cancelled.
    "store_failed_after_send",
    // A route of this replica's live seat that no call here knows was resolved.
    "orphan_resolved",
    // An upstream tool bears a task tool's name: its endpoint holds plain clients.
    "task_tools_shadowed",
];

/// The events of `taskgate_legacy_sessions_total`.
const LEGACY_SESSION_EVENTS: [&str; 5] = ["created", "expired", "evicted", "deleted", "refused"];

/// The `reason` label values of `taskgate_throttled_total` (`limits::Reason`), all
/// present from start-up at 0 so an alert on their increase sees the first refusal.
pub const THROTTLE_REASONS: [&str; 5] = [
    "poll_interval",
    "request_rate",
    "tenant_quota",
    "queue_full",
    "legacy_sessions",
];

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const TASK_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
];

/// Install the process-wide recorder (once; later calls are no-ops).
pub fn install() {
    install_with(describe);
}

/// The recorder of `taskgate edge`: the same exposition, only the edge's metrics.
pub fn install_edge() {
    install_with(describe_edge);
}

fn install_with(describe: fn()) {
    if HANDLE.get().is_some() {
        return;
    }
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("taskgate_task_duration_seconds".into()),
            TASK_BUCKETS,
        )
        .and_then(|b| b.set_buckets(LATENCY_BUCKETS));
    let Ok(builder) = builder else { return };
    match builder.install_recorder() {
        Ok(h) => {
            let _ = HANDLE.set(h);
            describe();
        }
        Err(e) => tracing::warn!(error = %e, "metrics recorder not installed"),
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "taskgate_requests_total",
        "MCP requests by method and HTTP status"
    );
    describe_histogram!(
        "taskgate_request_duration_seconds",
        "time to the response headers, by method"
    );
    describe_counter!(
        "taskgate_promotions_total",
        "tools/call promoted to a task, by upstream and client kind (tasks, handle)"
    );
    describe_counter!(
        "taskgate_status_reads_total",
        "task status reads by client kind (tasks: tasks/get; handle: the task-status tool)"
    );
    describe_counter!(
        "taskgate_inline_completions_total",
        "task-capable tools/call answered inline before the deadline"
    );
    describe_gauge!(
        "taskgate_tasks",
        "tasks in the store by status (counted since start-up, seeded from the store)"
    );
    describe_histogram!(
        "taskgate_task_duration_seconds",
        "creation to terminal state, by final status"
    );
    describe_histogram!(
        "taskgate_upstream_call_duration_seconds",
        "upstream call latency (excluding queueing), by upstream and outcome"
    );
    describe_counter!(
        "taskgate_throttled_total",
        "requests refused by a limit, by reason (poll_interval, request_rate, tenant_quota, queue_full, legacy_sessions)"
    );
    describe_counter!(
        "taskgate_upstream_queued_total",
        "upstream calls that waited for a concurrency slot"
    );
    describe_histogram!(
        "taskgate_upstream_queue_wait_seconds",
        "time queued for an upstream concurrency slot"
    );
    describe_histogram!(
        "taskgate_store_flush_duration_seconds",
        "durable store flush latency"
    );
    describe_counter!(
        "taskgate_store_flush_rounds_total",
        "group-commit flush rounds run by the store (each releases every waiting flush)"
    );
    describe_counter!(
        "taskgate_store_flush_round_waiters_total",
        "flush waiters released by group-commit rounds (÷ rounds = batch size)"
    );
    describe_counter!(
        "taskgate_upstream_restarts_total",
        "stdio child restarts and HTTP session re-initialisations, by upstream and kind"
    );
    describe_counter!(
        "taskgate_stdio_throttled_calls_total",
        "calls delayed by a stdio pool's crash throttle (their tenant's calls of this tool kept killing children), by upstream and tool"
    );
    describe_counter!(
        "taskgate_tasks_expired_unread_total",
        "terminal tasks that expired before their owner received the terminal state, by status (completed, failed)"
    );
    describe_counter!(
        "taskgate_fail_closed_total",
        "error branches that refused or kept state for recovery, by decision (docs/design.md §16)"
    );
    describe_gauge!(
        "taskgate_legacy_sessions_open",
        "2025-era client sessions in the store (seeded from the store at start-up)"
    );
    describe_counter!(
        "taskgate_legacy_sessions_total",
        "2025-era client sessions by event (created, expired, evicted, deleted, refused)"
    );
    describe_gauge!(
        "taskgate_upstream_up",
        "1 while the upstream is initialised and takes calls, else 0 (starting or down; /readyz names the reason)"
    );
    describe_gauge!(
        "taskgate_store_healthy",
        "1 while the task store takes writes, else 0 (/readyz store \"failed\")"
    );
    describe_gauge!(
        "taskgate_replica_lease_held",
        "1 while this replica holds its lease on a shared store (always 1 on sled), else 0: the replica takes no calls"
    );
    describe_gauge!(
        "taskgate_store_fanout_polling",
        "on a shared store: 1 while change fan-out polls the store every tasks.poll_interval_ms because LISTEN did not deliver (a transaction-mode pooler), 0 while LISTEN delivers"
    );
    describe_counter!(
        "taskgate_replica_lease_lost_total",
        "times this replica lost its lease on a shared store (its calls in flight were stopped; it comes back under a new epoch)"
    );
    describe_tls();
    counter!("taskgate_replica_lease_lost_total").increment(0);
    // The store opened and, on a shared store, the lease is taken before anything is
    // served (a failure stops the start); from then on `replica_health` follows both.
    replica_health(true, true);
    for reason in THROTTLE_REASONS {
        counter!("taskgate_throttled_total", "reason" => reason).increment(0);
    }
    for event in LEGACY_SESSION_EVENTS {
        counter!("taskgate_legacy_sessions_total", "event" => event).increment(0);
    }
    legacy_sessions_open(0.0);
    // Present from the start, so an alert on its increase sees the first one.
    for decision in FAIL_CLOSED {
        counter!("taskgate_fail_closed_total", "decision" => decision).increment(0);
    }
    for client in ["tasks", "handle"] {
        counter!("taskgate_status_reads_total", "client" => client).increment(0);
    }
    for status in ["completed", "failed"] {
        counter!("taskgate_tasks_expired_unread_total", "status" => status).increment(0);
    }
    for status in TASK_STATUSES {
        task_gauge(status, 0.0);
    }
}

/// The TLS metrics, which the gateway and the edge share (README "TLS").
fn describe_tls() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "taskgate_tls_cert_expiry_seconds",
        "notAfter of a loaded certificate as Unix seconds (the earliest of a chain or CA bundle), by kind (listener, ca) and name (the listener, or the CA file's path); alert on it minus time()"
    );
    describe_counter!(
        "taskgate_tls_handshake_failures_total",
        "TLS handshakes that failed, by side (outbound, inbound), peer (an upstream's name, jwks, postgres, replica, or the listener) and reason"
    );
    describe_counter!(
        "taskgate_tls_certificate_reloads_total",
        "listener certificates read again after a change on disk or SIGHUP, by listener and outcome (loaded, refused: the previous one keeps serving)"
    );
}

fn describe_edge() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "taskgate_edge_requests_total",
        "requests at the edge by route class (task, other, edge) and HTTP status"
    );
    describe_histogram!(
        "taskgate_edge_request_duration_seconds",
        "time from the request to the end of the response at the edge, by route class"
    );
    describe_gauge!(
        "taskgate_edge_replica_healthy",
        "1 while the replica passes its /livez checks, else 0"
    );
    describe_counter!(
        "taskgate_edge_retries_total",
        "requests sent to another replica after a connect failure, by the replica that failed"
    );
    describe_counter!(
        "taskgate_edge_ejections_total",
        "replicas ejected after a connect failure (until the next health check interval)"
    );
    describe_tls();
}

/// A request at the edge was answered (`route`: task, other, or edge for its own
/// endpoints).
pub fn edge_request(route: &'static str, status: u16, elapsed: Duration) {
    counter!("taskgate_edge_requests_total", "route" => route, "status" => status.to_string())
        .increment(1);
    histogram!("taskgate_edge_request_duration_seconds", "route" => route)
        .record(elapsed.as_secs_f64());
}

/// The edge's view of one replica's health.
pub fn edge_replica_health(replica: &str, healthy: bool) {
    gauge!("taskgate_edge_replica_healthy", "replica" => replica.to_string()).set(if healthy {
        1.0
    } else {
        0.0
    });
}

/// A connect failure at `replica`: the request goes to another one.
pub fn edge_retry(replica: &str) {
    counter!("taskgate_edge_retries_total", "replica" => replica.to_string()).increment(1);
}

/// `replica` was ejected after a connect failure.
pub fn edge_ejected(replica: &str) {
    counter!("taskgate_edge_ejections_total", "replica" => replica.to_string()).increment(1);
}

/// A `completed` or `failed` task expired without its owner having received its
/// terminal state (README "Limits and metrics").
pub fn expired_unread(status: &'static str) {
    counter!("taskgate_tasks_expired_unread_total", "status" => status).increment(1);
}

/// One group-commit round of the store released `waiters` flushes.
pub fn store_flush_round(waiters: u64) {
    counter!("taskgate_store_flush_rounds_total").increment(1);
    counter!("taskgate_store_flush_round_waiters_total").increment(waiters);
}

/// The Prometheus text exposition (empty if no recorder is installed).
pub fn render() -> String {
    HANDLE
        .get()
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}

pub fn request(method: &str, status: u16, elapsed: Duration) {
    let method = method.to_string();
    counter!("taskgate_requests_total", "method" => method.clone(), "status" => status.to_string())
        .increment(1);
    histogram!("taskgate_request_duration_seconds", "method" => method).record(elapsed);
}

/// A `tools/call` became a task, for a tasks client (`client = "tasks"`) or as a
/// plain client's handle (`"handle"`, docs/design.md §28).
pub fn promoted(upstream: &str, task_id: &str, client: &'static str) {
    counter!("taskgate_promotions_total", "upstream" => upstream.to_string(), "client" => client)
        .increment(1);
    tracing::info!(
        upstream,
        task = task_id,
        client,
        "tools/call promoted to a task"
    );
}

/// A task's status read by its owner, by client kind: `tasks` (`tasks/get`) or
/// `handle` (a task-status tool call, docs/design.md §28).
///
/// Every `tasks/get` counts here, so the two series' handles are looked up once: the
/// recorder is installed before the first request, and a handle taken before it
/// (a test without one) counts nowhere, as any counter would.
pub fn status_read(client: &'static str) {
    static TASKS: OnceLock<metrics::Counter> = OnceLock::new();
    static HANDLE_TOOL: OnceLock<metrics::Counter> = OnceLock::new();
    let series = if client == "handle" {
        &HANDLE_TOOL
    } else {
        &TASKS
    };
    series
        .get_or_init(|| counter!("taskgate_status_reads_total", "client" => client))
        .increment(1);
}

pub fn inline_completion(upstream: &str) {
    counter!("taskgate_inline_completions_total", "upstream" => upstream.to_string()).increment(1);
}

/// A fail-closed decision was taken (`decision`: one of [`FAIL_CLOSED`]).
pub fn fail_closed(decision: &'static str) {
    counter!("taskgate_fail_closed_total", "decision" => decision).increment(1);
}

/// A TLS handshake failed (`side`: outbound or inbound; `reason`: one of
/// `tls::FAILURE_REASONS`).
pub fn tls_handshake_failed(side: &'static str, peer: &str, reason: &'static str) {
    counter!(
        "taskgate_tls_handshake_failures_total",
        "side" => side,
        "peer" => peer.to_string(),
        "reason" => reason
    )
    .increment(1);
}

/// A listener's certificate files were read again (`outcome`: loaded or refused).
pub fn tls_certificate_reload(listener: &'static str, outcome: &'static str) {
    counter!(
        "taskgate_tls_certificate_reloads_total",
        "listener" => listener,
        "outcome" => outcome
    )
    .increment(1);
}

pub fn throttled(reason: &'static str) {
    counter!("taskgate_throttled_total", "reason" => reason).increment(1);
}

/// A 2025-era client session was created, closed (expired, evicted, deleted) or
/// refused at its principal's cap.
pub fn legacy_session(event: &'static str) {
    counter!("taskgate_legacy_sessions_total", "event" => event).increment(1);
}

/// Move `taskgate_legacy_sessions_open` by `delta` (also its seed from the store).
pub fn legacy_sessions_open(delta: f64) {
    gauge!("taskgate_legacy_sessions_open").increment(delta);
}

/// Set `taskgate_legacy_sessions_open` to a fresh count of the store (a shared store,
/// where other replicas' sessions never move this replica's gauge).
pub fn legacy_sessions_recounted(n: u64) {
    gauge!("taskgate_legacy_sessions_open").set(n as f64);
}

pub fn queued(upstream: &str) {
    counter!("taskgate_upstream_queued_total", "upstream" => upstream.to_string()).increment(1);
}

pub fn queue_wait(upstream: &str, waited: Duration) {
    histogram!("taskgate_upstream_queue_wait_seconds", "upstream" => upstream.to_string())
        .record(waited);
}

pub fn upstream_call(upstream: &str, outcome: &'static str, elapsed: Duration) {
    histogram!(
        "taskgate_upstream_call_duration_seconds",
        "upstream" => upstream.to_string(),
        "outcome" => outcome
    )
    .record(elapsed);
}

/// `kind`: `"stdio_restart"` or `"http_reinit"`.
pub fn upstream_restart(upstream: &str, kind: &'static str) {
    counter!(
        "taskgate_upstream_restarts_total",
        "upstream" => upstream.to_string(),
        "kind" => kind
    )
    .increment(1);
}

/// A call held back by a stdio pool's crash throttle.
pub fn stdio_throttled(upstream: &str, tool: &str) {
    counter!(
        "taskgate_stdio_throttled_calls_total",
        "upstream" => upstream.to_string(),
        "tool" => tool.to_string()
    )
    .increment(1);
}

/// Move one task between `taskgate_tasks` statuses (`None`: it was not, or is no
/// longer, in the store).
pub fn task_moved(from: Option<&'static str>, to: Option<&'static str>) {
    if let Some(f) = from {
        task_gauge(f, -1.0);
    }
    if let Some(t) = to {
        task_gauge(t, 1.0);
    }
}

/// A task reached terminal `status` this long after it was created.
pub fn task_finished(status: &'static str, secs: f64) {
    histogram!("taskgate_task_duration_seconds", "status" => status).record(secs);
}

/// `n` tasks of `status` found in the store (seeding the gauge after start-up).
pub fn task_gauge(status: &'static str, n: f64) {
    gauge!("taskgate_tasks", "status" => status).increment(n);
}

/// Replace `taskgate_tasks` with a fresh count of a shared store: `counts` by status,
/// every status it does not name at 0. Other replicas move tasks this one never
/// sees, so on a shared store the gauge is recounted rather than only moved.
pub fn task_gauge_recounted(counts: &[(&'static str, u64)]) {
    for status in TASK_STATUSES {
        let n = counts
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, n)| *n)
            .sum::<u64>();
        gauge!("taskgate_tasks", "status" => status).set(n as f64);
    }
}

/// One durable flush of the task store.
pub fn store_flush(elapsed: Duration) {
    histogram!("taskgate_store_flush_duration_seconds").record(elapsed);
}

/// A certificate (`kind` `listener`: `name` is the listener) or CA file (`kind` `ca`:
/// `name` is its path) was loaded, whose earliest `notAfter` is `not_after` (Unix
/// seconds; README "Operations").
pub fn tls_cert_expiry(kind: &'static str, name: &str, not_after: i64) {
    gauge!(
        "taskgate_tls_cert_expiry_seconds",
        "kind" => kind,
        "name" => name.to_string()
    )
    .set(not_after as f64);
}

/// Whether `upstream` is initialised and takes calls (sampled, like `/readyz`).
pub fn upstream_up(upstream: &str, up: bool) {
    gauge!("taskgate_upstream_up", "upstream" => upstream.to_string()).set(if up {
        1.0
    } else {
        0.0
    });
}

/// Register the series of a configured upstream at 0, so an alert on their increase
/// sees the first event and a dashboard shows the upstream before its first call.
pub fn upstream_configured(upstream: &str) {
    let upstream = upstream.to_string();
    for client in ["tasks", "handle"] {
        counter!("taskgate_promotions_total", "upstream" => upstream.clone(), "client" => client)
            .increment(0);
    }
    counter!("taskgate_inline_completions_total", "upstream" => upstream.clone()).increment(0);
    counter!("taskgate_upstream_queued_total", "upstream" => upstream.clone()).increment(0);
    let _ = histogram!("taskgate_upstream_queue_wait_seconds", "upstream" => upstream);
}

/// Whether the store takes writes and this replica holds its lease (what `/readyz` and
/// `/livez` report besides the upstreams).
pub fn replica_health(store_healthy: bool, lease_held: bool) {
    let one = |b: bool| if b { 1.0 } else { 0.0 };
    gauge!("taskgate_store_healthy").set(one(store_healthy));
    gauge!("taskgate_replica_lease_held").set(one(lease_held));
}

/// Whether change fan-out polls (`LISTEN` did not deliver its probe) or listens
/// (docs/design.md §27 "Connection poolers").
pub fn store_fanout_polling(polling: bool) {
    gauge!("taskgate_store_fanout_polling").set(if polling { 1.0 } else { 0.0 });
}

/// This replica lost its lease: it stopped its calls in flight and registers again
/// under a new epoch (a loss shorter than a scrape never shows in
/// `taskgate_replica_lease_held`; this counts it).
pub fn lease_lost() {
    counter!("taskgate_replica_lease_lost_total").increment(1);
}

/// Spans the OTLP exporter delivered to the collector.
pub fn trace_spans_exported(n: u64) {
    counter!("taskgate_trace_spans_exported_total").increment(n);
}

/// Spans dropped: `queue_full` (the export queue was full) or `export_failed` (the
/// collector refused them or could not be reached).
pub fn trace_spans_dropped(reason: &'static str, n: u64) {
    counter!("taskgate_trace_spans_dropped_total", "reason" => reason).increment(n);
}
