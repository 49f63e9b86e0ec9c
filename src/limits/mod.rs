//! Flow control (docs/design.md §8 "Flow control"): the poll limiter, the adaptive
//! `pollIntervalMs`, the per-principal request rate, the per-tenant live-task quota
//! and per-upstream admission with fair queueing.
//!
//! One [`Limits`] per gateway, built from the config and owned by it (so two gateways
//! in one process never share limiter state); everything the rest of the gateway
//! calls is a small hook: `front::dispatch` asks [`Limits::check_request`] /
//! [`Limits::check_poll`] / [`Limits::check_queue`], the engine asks
//! [`Limits::check_quota`], runs every upstream call through [`Limits::admit`] and
//! asks [`Limits::adapt`] for the interval to advertise.
//!
//! Every throttle answers JSON-RPC `-32005` with `data.{retryAfterMs, reason}` and
//! `Retry-After` (whole seconds, ≥ 1): 429 for poll rate, request rate and tenant
//! quota, 503 for a full queue.

pub mod gate;
pub mod interval;
pub mod keyed;
pub mod status_calls;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;

use crate::auth::Principal;
use crate::config::as_millis;
use crate::config::{Config, LimitsConfig, TasksConfig, UpstreamConfig};
use crate::protocol::RpcError;
use crate::protocol::error::THROTTLED;
use crate::store::{TaskRecord, now_ms};
pub use gate::QueueFull;
use gate::{Entry, Gate, Permit};
use interval::{IntervalInputs, advertised_interval};
use keyed::{PollKeys, PollLimiter, RequestLimiter};
use status_calls::StatusCalls;
pub use status_calls::StatusSlot;

/// Most limiter entries kept (each limiter); least recently used beyond that.
const MAX_ENTRIES: usize = 100_000;

/// Why a request was throttled (`data.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    PollInterval,
    RequestRate,
    TenantQuota,
    QueueFull,
    /// A principal's 2025-era sessions are at `[legacy] max_sessions_per_principal`
    /// and every one is in use (docs/design.md §22 "Clients of the 2025 era").
    LegacySessions,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PollInterval => "poll_interval",
            Self::RequestRate => "request_rate",
            Self::TenantQuota => "tenant_quota",
            Self::QueueFull => "queue_full",
            Self::LegacySessions => "legacy_sessions",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Self::PollInterval => "polling faster than pollIntervalMs",
            Self::RequestRate => "request rate limit exceeded",
            Self::TenantQuota => {
                "tenant live-task quota reached (limits.max_live_tasks_per_tenant)"
            }
            Self::QueueFull => "upstream queue is full",
            Self::LegacySessions => {
                "too many open sessions (legacy.max_sessions_per_principal), all in use"
            }
        }
    }
}

/// A throttle decision: what to tell the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub reason: Reason,
    pub retry_after: Duration,
}

impl Throttled {
    /// Every session of the principal is in use and the cap is reached.
    pub fn legacy_sessions(retry_after: std::time::Duration) -> Self {
        Self {
            reason: Reason::LegacySessions,
            retry_after,
        }
    }

    pub fn rpc_error(&self) -> RpcError {
        let ms = self.retry_after.as_millis().max(1) as u64;
        RpcError::new(THROTTLED, self.reason.message())
            .with_data(json!({ "retryAfterMs": ms, "reason": self.reason.as_str() }))
    }

    /// `Retry-After` in whole seconds, at least 1.
    pub fn retry_after_s(&self) -> u64 {
        u64::try_from(self.retry_after.as_millis().div_ceil(1000))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// Progress cadence of one task.
#[derive(Clone, Copy)]
struct Cadence {
    last: Instant,
    gap_ms: Option<u64>,
}

/// Flow-control state of one gateway.
pub struct Limits {
    base_ms: u64,
    max_ms: u64,
    max_live_per_tenant: u64,
    queue_size: usize,
    polls: PollLimiter,
    poll_keys: PollKeys,
    requests: Option<RequestLimiter>,
    /// Open task-status tool calls (docs/design.md §28).
    status_calls: Arc<StatusCalls>,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
    cadence: Mutex<HashMap<String, Cadence>>,
    /// Polls admitted / throttled in the current and previous second (saturation).
    polls_ok: AtomicU64,
    polls_throttled: AtomicU64,
    window: Mutex<(Instant, f64)>,
}

/// The status message of a call waiting at `position` in an upstream's queue.
pub fn queue_message(position: usize) -> String {
    format!("queued (position {position})")
}

impl Limits {
    /// The limits a gateway with configuration `cfg` enforces.
    pub fn from_config(cfg: &Config) -> Arc<Self> {
        Arc::new(Self::new(&cfg.limits, &cfg.tasks, &cfg.upstreams))
    }

    pub fn new(l: &LimitsConfig, t: &TasksConfig, upstreams: &[UpstreamConfig]) -> Self {
        let gates = upstreams
            .iter()
            .map(|u| (u.name.clone(), Gate::new(u.max_concurrency, l.queue_size)))
            .collect();
        Self {
            base_ms: as_millis(t.poll_interval),
            max_ms: as_millis(t.max_poll_interval),
            max_live_per_tenant: l.max_live_tasks_per_tenant,
            queue_size: l.queue_size,
            poll_keys: PollKeys::default(),
            polls: PollLimiter::new(
                as_millis(t.poll_interval),
                as_millis(t.max_poll_interval),
                l.poll_burst,
                MAX_ENTRIES,
            ),
            requests: (l.requests_per_second > 0)
                .then(|| RequestLimiter::new(l.requests_per_second, MAX_ENTRIES)),
            status_calls: Arc::new(StatusCalls::new(l.poll_burst)),
            gates: Mutex::new(gates),
            cadence: Mutex::new(HashMap::new()),
            polls_ok: AtomicU64::new(0),
            polls_throttled: AtomicU64::new(0),
            window: Mutex::new((Instant::now(), 0.0)),
        }
    }

    /// Per-principal request rate (`limits.requests_per_second`, 0 = off).
    pub fn check_request(&self, p: &Principal) -> Result<(), Throttled> {
        let Some(r) = &self.requests else {
            return Ok(());
        };
        r.check(&(p.tenant.clone(), p.subject.clone()), Instant::now())
            .map_err(|retry_after| Throttled {
                reason: Reason::RequestRate,
                retry_after,
            })
    }

    /// The poll limiter for `tasks/get` of a well-formed task id (checked before the
    /// task is resolved: a throttled poll costs no store read).
    pub fn check_poll(&self, p: &Principal, task_id: &str) -> Result<(), Throttled> {
        let key = self.poll_keys.key(&p.tenant, &p.subject, task_id);
        match self.polls.check(&key, Instant::now()) {
            Ok(()) => {
                self.polls_ok.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(retry_after) => {
                self.polls_throttled.fetch_add(1, Ordering::Relaxed);
                Err(Throttled {
                    reason: Reason::PollInterval,
                    retry_after,
                })
            }
        }
    }

    /// Open a task-status tool call of `p` for `task_id`, unless the poll burst's
    /// worth are open already (docs/design.md §28): the slot closes when dropped.
    pub fn enter_status(&self, p: &Principal, task_id: &str) -> Option<StatusSlot> {
        let key = self.poll_keys.key(&p.tenant, &p.subject, task_id);
        self.status_calls.enter(key)
    }

    /// Record the interval advertised to `p` for a task (`tasks/get`, notifications).
    pub fn advertise(&self, p: &Principal, task_id: &str, interval_ms: u64) {
        let key = self.poll_keys.key(&p.tenant, &p.subject, task_id);
        self.polls.advertise(&key, interval_ms, Instant::now());
    }

    /// Per-tenant quota of live tasks, checked before a call that could become a task
    /// starts. `live` is the tenant's current count of non-terminal tasks.
    pub fn check_quota(&self, live: u64) -> Result<(), Throttled> {
        if live >= self.max_live_per_tenant {
            return Err(self.over_quota());
        }
        Ok(())
    }

    /// The quota [`check_quota`](Self::check_quota) holds `live` against, for a store
    /// that counts it with the creation (`TaskStore::create_within_quota`).
    pub fn max_live_per_tenant(&self) -> u64 {
        self.max_live_per_tenant
    }

    /// The refusal of a call over the tenant's quota.
    pub fn over_quota(&self) -> Throttled {
        Throttled {
            reason: Reason::TenantQuota,
            retry_after: Duration::from_millis(self.base_ms.max(1000)),
        }
    }

    fn gate(&self, upstream: &str, max_concurrency: usize) -> Arc<Gate> {
        let mut g = self.gates.lock();
        g.entry(upstream.to_string())
            .or_insert_with(|| Gate::new(max_concurrency, self.queue_size))
            .clone()
    }

    /// Refuse up front when the upstream's queue has no room for this tenant.
    pub fn check_queue(
        &self,
        upstream: &str,
        max_concurrency: usize,
        p: &Principal,
    ) -> Result<(), Throttled> {
        if self.gate(upstream, max_concurrency).would_refuse(&p.tenant) {
            return Err(Throttled {
                reason: Reason::QueueFull,
                retry_after: Duration::from_secs(1),
            });
        }
        Ok(())
    }

    /// Wait for a slot of the upstream (FIFO per tenant, round-robin across tenants),
    /// telling `report` the queue position while waiting (`Some(n)`) and once admitted
    /// after a wait (`None`). Dropping the future leaves the queue.
    pub async fn admit(
        &self,
        upstream: &str,
        max_concurrency: usize,
        p: &Principal,
        mut report: impl FnMut(Option<usize>),
    ) -> Result<Permit, QueueFull> {
        let gate = self.gate(upstream, max_concurrency);
        let mut waiting = match gate.enter(&p.tenant) {
            Ok(Entry::Run(permit)) => return Ok(permit),
            Ok(Entry::Queued(w)) => w,
            Err(full) => {
                crate::metrics::throttled(Reason::QueueFull.as_str());
                return Err(full);
            }
        };
        crate::metrics::queued(upstream);
        let started = Instant::now();
        let mut reported = None;
        let mut last_report = Instant::now();
        loop {
            // Report on change, and every 2 s (a call promoted meanwhile picks it up).
            if let Some(pos) = waiting.position()
                && (reported != Some(pos) || last_report.elapsed() >= Duration::from_secs(2))
            {
                report(Some(pos));
                reported = Some(pos);
                last_report = Instant::now();
            }
            tokio::select! {
                permit = waiting.wait() => {
                    crate::metrics::queue_wait(upstream, started.elapsed());
                    report(None);
                    return Ok(permit);
                }
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    /// The status message of a call of `p` to `upstream` that has not entered the
    /// queue yet: "queued (position N)" when it would wait, else `None`.
    pub fn queue_status_if_entered(
        &self,
        upstream: &str,
        max_concurrency: usize,
        p: &Principal,
    ) -> Option<String> {
        let pos = self
            .gate(upstream, max_concurrency)
            .position_if_entered(&p.tenant)?;
        Some(queue_message(pos))
    }

    /// Load in `[0, 3]` for the adaptive interval: queued calls relative to upstream
    /// concurrency, plus the share of polls throttled over the last second.
    pub fn pressure(&self) -> f64 {
        let (mut cap, mut queued) = (0usize, 0usize);
        {
            let g = self.gates.lock();
            for gate in g.values() {
                cap += gate.max_concurrency();
                queued += gate.load().1;
            }
        }
        let queue = queued as f64 / cap.max(1) as f64;
        let throttle = self.throttle_ratio();
        (queue + 2.0 * throttle).clamp(0.0, 3.0)
    }

    fn throttle_ratio(&self) -> f64 {
        let mut w = self.window.lock();
        if w.0.elapsed() >= Duration::from_secs(1) {
            let ok = self.polls_ok.swap(0, Ordering::Relaxed) as f64;
            let bad = self.polls_throttled.swap(0, Ordering::Relaxed) as f64;
            // Only a sizeable crowd of over-eager pollers counts as saturation.
            w.1 = if ok + bad >= 20.0 {
                bad / (ok + bad)
            } else {
                0.0
            };
            w.0 = Instant::now();
        }
        w.1
    }

    /// Note an upstream progress notification for a task (its cadence).
    pub fn progress_seen(&self, task_id: &str) {
        let mut c = self.cadence.lock();
        let now = Instant::now();
        if c.len() >= MAX_ENTRIES {
            let stale = Duration::from_millis(self.max_ms.saturating_mul(2));
            c.retain(|_, v| v.last.elapsed() <= stale);
        }
        let e = c.entry(task_id.to_string()).or_insert(Cadence {
            last: now,
            gap_ms: None,
        });
        let gap = now.saturating_duration_since(e.last).as_millis() as u64;
        if gap > 0 {
            // Exponentially smoothed gap (α = 1/2).
            e.gap_ms = Some(e.gap_ms.map_or(gap, |g| (g + gap) / 2));
        }
        e.last = now;
    }

    /// Forget per-task state (the task reached a terminal state).
    pub fn task_done(&self, task_id: &str) {
        {
            let mut c = self.cadence.lock();
            c.remove(task_id);
        }
    }

    /// The interval to advertise for a record right now.
    pub fn interval_for(&self, rec: &TaskRecord) -> u64 {
        let progress = self
            .cadence
            .lock()
            .get(&rec.task_id)
            .and_then(|e| Some((e.gap_ms?, e.last.elapsed().as_millis() as u64)));
        advertised_interval(IntervalInputs {
            base_ms: self.base_ms,
            max_ms: self.max_ms,
            age_ms: now_ms().saturating_sub(rec.created_at_ms),
            progress,
            pressure: self.pressure(),
        })
    }

    /// Set `rec.poll_interval_ms` to the adaptive interval (live tasks only) and
    /// remember it as advertised to `p`.
    pub fn adapt(&self, p: &Principal, rec: &mut TaskRecord) {
        if rec.status.is_terminal() {
            return;
        }
        rec.poll_interval_ms = self.interval_for(rec);
        self.advertise(p, &rec.task_id, rec.poll_interval_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"demo\"\ncommand = [\"unused\"]\nmax_concurrency = 1\n";

    #[tokio::test]
    async fn a_panic_while_the_gates_are_locked_keeps_max_concurrency() {
        let cfg = Config::parse(CONFIG).expect("config");
        let limits = Limits::from_config(&cfg);
        let l = limits.clone();
        let panicked = std::thread::spawn(move || {
            let _held = l.gates.lock();
            panic!("a panic while the gates are locked");
        })
        .join();
        assert!(panicked.is_err());
        let p = Principal {
            tenant: "acme".into(),
            subject: "alice".into(),
        };
        let first = limits.admit("demo", 1, &p, |_| {}).await.expect("a slot");
        // With a poisoned lock this used to be a fresh, ungated gate.
        let second = tokio::time::timeout(
            Duration::from_millis(100),
            limits.admit("demo", 1, &p, |_| {}),
        )
        .await;
        assert!(second.is_err(), "admitted past max_concurrency = 1");
        drop(first);
        let third =
            tokio::time::timeout(Duration::from_secs(5), limits.admit("demo", 1, &p, |_| {})).await;
        assert!(matches!(third, Ok(Ok(_))), "the slot was not freed");
    }

    /// `taskgate_throttled_total` is registered at 0 for every reason the limits give.
    #[test]
    fn every_throttle_reason_is_registered_at_start() {
        // A new reason fails to compile here until it is listed.
        let all = |r: Reason| match r {
            Reason::PollInterval
            | Reason::RequestRate
            | Reason::TenantQuota
            | Reason::QueueFull
            | Reason::LegacySessions => r.as_str(),
        };
        let reasons = [
            Reason::PollInterval,
            Reason::RequestRate,
            Reason::TenantQuota,
            Reason::QueueFull,
            Reason::LegacySessions,
        ];
        let mut names: Vec<&str> = reasons.into_iter().map(all).collect();
        let mut registered = crate::metrics::THROTTLE_REASONS.to_vec();
        names.sort_unstable();
        registered.sort_unstable();
        assert_eq!(names, registered);
    }
}
