//! Prometheus metrics at `GET /metrics` (issue #4 item 6), via the `metrics` facade
//! and `metrics-exporter-prometheus` (no HTTP listener feature: the gateway serves
//! the text itself, on its own listener or `server.metrics_listen`).
//!
//! Every metric the gateway records is named here, as a small function the rest of
//! the code calls; [`MeteredStore`] wraps the task store to follow task status
//! transitions, task durations and flush latency without touching the backend.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::store::{
    Created, Expired, IdempotencyEntry, RequestRoute, StoreError, TaskRecord, TaskStatus,
    TaskStore, Tombstone, UpstreamIdentity, now_ms,
};
use crate::upstream::BoxFuture;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const TASK_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
];

/// Install the process-wide recorder (once; later calls are no-ops).
pub fn install() {
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
    describe_counter!("taskgate_promotions_total", "tools/call promoted to a task");
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
        "requests refused by a limit, by reason (poll_interval, request_rate, tenant_quota, queue_full)"
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
    // Present from the start, so an alert on its increase sees the first one.
    for status in [TaskStatus::Completed, TaskStatus::Failed] {
        counter!("taskgate_tasks_expired_unread_total", "status" => status.as_str()).increment(0);
    }
}

/// A `completed` or `failed` task expired without its owner having received its
/// terminal state (README "Limits and metrics").
pub fn expired_unread(status: TaskStatus) {
    counter!("taskgate_tasks_expired_unread_total", "status" => status.as_str()).increment(1);
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

pub fn promoted(upstream: &str, task_id: &str) {
    counter!("taskgate_promotions_total", "upstream" => upstream.to_string()).increment(1);
    tracing::info!(upstream, task = task_id, "tools/call promoted to a task");
}

pub fn inline_completion(upstream: &str) {
    counter!("taskgate_inline_completions_total", "upstream" => upstream.to_string()).increment(1);
}

pub fn throttled(reason: &'static str) {
    counter!("taskgate_throttled_total", "reason" => reason).increment(1);
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

fn task_gauge(status: TaskStatus, delta: f64) {
    gauge!("taskgate_tasks", "status" => status.as_str()).increment(delta);
}

/// A [`TaskStore`] that records task status transitions, task durations and flush
/// latency, delegating everything to the backend.
pub struct MeteredStore {
    inner: Arc<dyn TaskStore>,
}

impl MeteredStore {
    /// Wrap `inner`, seeding the `taskgate_tasks` gauge from the records it holds.
    pub fn wrap(inner: Arc<dyn TaskStore>) -> Arc<dyn TaskStore> {
        // Counting a large store takes seconds (1M records); do it off the start-up
        // path. Transitions that race the count can skew the gauge by a few; the
        // gauge is an operational view, not an invariant.
        let seed = inner.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            match seed.count_by_status() {
                Ok(counts) => {
                    let total: u64 = counts.iter().map(|(_, n)| n).sum();
                    for (status, n) in counts {
                        task_gauge(status, n as f64);
                    }
                    tracing::info!(
                        tasks = total,
                        elapsed_ms = t0.elapsed().as_millis() as u64,
                        "task gauge counted from the store"
                    );
                }
                Err(e) => tracing::warn!(error = %e, "counting the stored tasks failed"),
            }
            // The pass pulled every record through the store's cache; hand the memory
            // it freed back to the OS instead of keeping it in the allocator.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only releases free heap pages; no pointers change.
            unsafe {
                libc::malloc_trim(0);
            }
        });
        for s in [
            TaskStatus::Working,
            TaskStatus::InputRequired,
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ] {
            task_gauge(s, 0.0);
        }
        Arc::new(Self { inner })
    }
}

impl TaskStore for MeteredStore {
    fn create(
        &self,
        task: &TaskRecord,
        route: &RequestRoute,
        idempotency_key: Option<&[u8]>,
    ) -> Result<Created, StoreError> {
        let r = self.inner.create(task, route, idempotency_key);
        if matches!(r, Ok(Created::New)) {
            task_gauge(task.status, 1.0);
        }
        r
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.flush().await;
            histogram!("taskgate_store_flush_duration_seconds").record(t.elapsed());
            r
        })
    }

    fn get(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.inner.get(task_id)
    }

    fn update(
        &self,
        task_id: &str,
        f: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let mut before = None;
        let r = self.inner.update(task_id, &mut |rec| {
            let status = rec.status;
            let changed = f(rec);
            before = changed.then_some(status);
            changed
        })?;
        if let (Some(b), Some(after)) = (before, r.as_ref())
            && b != after.status
        {
            task_gauge(b, -1.0);
            task_gauge(after.status, 1.0);
            if after.status.is_terminal() && !b.is_terminal() {
                let secs = now_ms().saturating_sub(after.created_at_ms) as f64 / 1000.0;
                histogram!("taskgate_task_duration_seconds", "status" => after.status.as_str())
                    .record(secs);
                crate::limits::get().task_done(task_id);
            }
        }
        Ok(r)
    }

    fn put_route(&self, route: &RequestRoute) -> Result<(), StoreError> {
        self.inner.put_route(route)
    }
    fn remove_route(&self, route_id: &str) -> Result<(), StoreError> {
        self.inner.remove_route(route_id)
    }
    fn routes(&self) -> Result<Vec<RequestRoute>, StoreError> {
        self.inner.routes()
    }
    fn idempotency_get(&self, key: &[u8]) -> Result<Option<IdempotencyEntry>, StoreError> {
        self.inner.idempotency_get(key)
    }
    fn count_by_status(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError> {
        self.inner.count_by_status()
    }
    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.expired(now_ms, limit)
    }
    fn expire(
        &self,
        task_id: &str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> Result<Option<Expired>, StoreError> {
        let r = self.inner.expire(task_id, now_ms, tombstone_until_ms)?;
        if let Some(gone) = &r {
            task_gauge(gone.record.status, -1.0);
            crate::limits::get().task_done(task_id);
        }
        Ok(r)
    }
    fn mark_seen(&self, task_ids: &[String]) -> Result<(), StoreError> {
        self.inner.mark_seen(task_ids)
    }
    fn tombstone(&self, task_id: &str) -> Result<Option<Tombstone>, StoreError> {
        self.inner.tombstone(task_id)
    }
    fn sweep_tombstones(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.inner.sweep_tombstones(now_ms)
    }
    fn live_tasks(&self, tenant: &str) -> Result<u64, StoreError> {
        self.inner.live_tasks(tenant)
    }
    fn upstream_identity(&self, name: &str) -> Result<Option<UpstreamIdentity>, StoreError> {
        self.inner.upstream_identity(name)
    }
    fn put_upstream_identity(
        &self,
        name: &str,
        identity: &UpstreamIdentity,
    ) -> Result<bool, StoreError> {
        self.inner.put_upstream_identity(name, identity)
    }
    fn secret(&self, name: &str) -> Result<[u8; 32], StoreError> {
        self.inner.secret(name)
    }
    fn healthy(&self) -> bool {
        self.inner.healthy()
    }
}
