//! The tasks engine: promotes slow `tools/call`s to durable tasks, serves
//! `tasks/get`, `tasks/update`, `tasks/cancel`, holds MRTR rounds, and runs every
//! upstream call through admission. It answers with a domain [`outcome::Reply`] that
//! the front renders; it names nothing of HTTP.
//!
//! The engine is made of parts with private state (ARCHITECTURE.md "The engine's
//! parts"): the task repository (`repo.rs`), the live calls (`live.rs`) and the
//! replica (`replica_state.rs`), held by the [`Engine`] type (`engine.rs`); what needs
//! several of them is an `Engine` method.
//!
//! - `events.rs`: one upstream call and its events as one stream.
//! - `promote.rs`: the promotion decision (which deadline, which mode).
//! - `call.rs`: the deadline race and durable creation before the handle goes out.
//! - `driver.rs`: a promoted call running in the background (progress, input, result).
//! - `methods.rs`: the `tasks/*` methods and the ownership check; `list.rs` a page of
//!   a principal's tasks (`tasks/list` of the 2025-11-25 dialect).
//! - `admin.rs`: what the operator API asks (lists by tenant, operator cancels,
//!   draining).
//! - `sweeper.rs`: expiry, tombstones, idle sessions and restart recovery.
//! - `sessions.rs`: the 2025-era client sessions (`SessionRepo`, a part of its own).
//! - `seen.rs`: read marks, for counting outcomes nobody collected.
//! - `replica.rs`: being one of several replicas (leases, takeover, relays, fan-out);
//!   `replica_state.rs` the `Replica` part it works with.
//! - `terminal_cache.rs`: terminal snapshots read before, answered without the store.
//! - `fingerprint.rs`: order-free fingerprints of JSON values.
//! - `snapshot.rs`: the wire shapes; `dialect.rs` the same records in the 2025-11-25
//!   task dialect.
//! - `mrtr.rs`: multi round-trip requests for clients that get no task.
//! - `inputs.rs`: screening upstream input requests; `failure.rs`: the retry class
//!   of a call that produced no answer; `outcome.rs`: the reply type.

pub mod admin;
pub mod call;
pub mod clock;
pub mod dialect;
pub mod driver;
mod engine;
pub mod events;
pub mod failure;
pub mod fingerprint;
mod follow;
pub mod ids;
pub mod inputs;
mod list;
mod live;
pub mod methods;
pub mod mrtr;
pub mod outcome;
pub mod promote;
pub mod purge;
pub mod replica;
mod replica_state;
mod repo;
pub mod seen;
pub mod sessions;
pub mod snapshot;
pub mod sweeper;
mod tenant_calls;
mod terminal;
mod terminal_cache;
pub mod upstream_task;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::broadcast;

use crate::auth::Principal;
use crate::config::Config;
use crate::limits::Limits;
use crate::protocol::param_headers::ToolHeaders;
use crate::store::{StoreError, TaskRecord, TaskStore};
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, QueuePosition, Upstream, UpstreamError, UpstreamInfo,
    UpstreamSet,
};

pub use engine::Engine;
pub use repo::{Change, Observer, Transition};
pub use sessions::{ActiveGuard, SessionError, SessionRepo};

impl Engine {
    pub fn new(store: Arc<dyn TaskStore>, cfg: Arc<Config>, limits: Arc<Limits>) -> Arc<Self> {
        Arc::new(engine::assemble(store, cfg, limits))
    }

    /// The 2025-era client sessions (docs/design.md §22 "Clients of the 2025 era").
    pub fn sessions(&self) -> &SessionRepo {
        &self.sessions
    }

    /// Call `f` on every task status transition from now on.
    pub fn observe(&self, f: Observer) {
        self.tasks.observe(f);
    }

    /// How long a batch of upstream input requests stays open for more
    /// (`input_gather_ms`).
    fn input_gather(&self) -> std::time::Duration {
        self.cfg.tasks.input_gather
    }

    /// A durable flush, timed for `taskgate_store_flush_duration_seconds`.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.tasks.flush().await
    }

    /// The upstream identities earlier runs stored, by upstream name (what the task
    /// plane shows until an upstream answers again). A read error is logged and counts
    /// as nothing stored: the identity is only ever a fallback.
    pub async fn stored_identities(&self) -> HashMap<String, UpstreamInfo> {
        let mut out = HashMap::new();
        for u in &self.cfg.upstreams {
            match self.tasks.upstream_identity(&u.name).await {
                Ok(Some(info)) => {
                    out.insert(u.name.clone(), info);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(upstream = %u.name, error = %e, "reading the stored upstream identity failed");
                }
            }
        }
        out
    }

    /// Keep every upstream's identity durable: each change is written (only when it
    /// differs from the stored record) and flushed in the background. Nothing waits
    /// for it; losing one to a crash only means the previous identity is shown until
    /// the upstream answers again.
    pub fn persist_identities(self: &Arc<Self>, upstreams: &UpstreamSet) {
        for u in upstreams.iter() {
            let mut changes = u.identity_changes();
            let name = u.name().to_string();
            let engine = self.clone();
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    let Some(info) = changes.borrow_and_update().clone() else {
                        continue;
                    };
                    engine.store_identity(&name, &info).await;
                }
            });
        }
    }

    /// The tools' `Mcp-Param-*` header maps earlier runs stored, by upstream name (what
    /// the front checks `tools/call` headers against until a new `tools/list`). A read
    /// error is logged and counts as nothing stored: the headers are then not checked
    /// until the upstream lists its tools again.
    pub async fn stored_tool_headers(&self) -> HashMap<String, ToolHeaders> {
        let mut out = HashMap::new();
        for u in &self.cfg.upstreams {
            match self.tasks.upstream_tool_headers(&u.name).await {
                Ok(Some(headers)) => {
                    out.insert(u.name.clone(), headers);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(upstream = %u.name, error = %e, "reading the stored tool header map failed");
                }
            }
        }
        out
    }

    /// Keep every upstream's tool header map durable, as
    /// [`persist_identities`](Self::persist_identities) does the identity.
    pub fn persist_tool_headers(self: &Arc<Self>, upstreams: &UpstreamSet) {
        for u in upstreams.iter() {
            let mut changes = u.tool_header_changes();
            let name = u.name().to_string();
            let engine = self.clone();
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    let Some(headers) = changes.borrow_and_update().clone() else {
                        continue;
                    };
                    engine.store_tool_headers(&name, &headers).await;
                }
            });
        }
    }

    async fn store_tool_headers(&self, name: &str, headers: &ToolHeaders) {
        match self.tasks.put_upstream_tool_headers(name, headers).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(upstream = %name, "tool header map stored");
                if let Err(e) = self.flush().await {
                    tracing::warn!(upstream = %name, error = %e, "flushing the tool header map failed");
                }
            }
            Err(e) => {
                tracing::warn!(upstream = %name, error = %e, "storing the tool header map failed");
            }
        }
    }

    async fn store_identity(&self, name: &str, info: &UpstreamInfo) {
        match self.tasks.put_upstream_identity(name, info).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(upstream = %name, "upstream identity stored");
                if let Err(e) = self.flush().await {
                    tracing::warn!(upstream = %name, error = %e, "flushing the upstream identity failed");
                }
            }
            Err(e) => {
                tracing::warn!(upstream = %name, error = %e, "storing the upstream identity failed");
            }
        }
    }

    /// Mark the gateway as stopping: a promoted call that ends because its upstream is
    /// being shut down is then *not* settled, so its request route stays in the store
    /// and the next start resolves the task.
    pub fn begin_shutdown(&self) {
        self.calls.begin_shutdown();
    }

    pub fn shutting_down(&self) -> bool {
        self.calls.shutting_down()
    }

    /// Every upstream call goes through here: first a slot of the upstream's
    /// admission gate (fair queueing; the queue position is reported on `events`
    /// while waiting), then the call in the principal's isolation scope. Dropping the
    /// future leaves the queue or cancels the call.
    pub async fn call_upstream(
        &self,
        upstream: &Upstream,
        principal: &Principal,
        spec: CallSpec,
        events: tokio::sync::mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        // A purge of the tenant refuses the call before it is sent, and cancels it
        // (dropping it cancels it upstream) while it runs (docs/design.md §27
        // "Tenant purge").
        let Some(in_flight) = self.tenant_calls.enter(&principal.tenant) else {
            return Err(UpstreamError::Unavailable {
                upstream: upstream.name().to_string(),
                reason: "the tenant's data is being purged".into(),
            });
        };
        let call = async {
            let report = |pos: Option<usize>| {
                let q = pos.map_or(QueuePosition::Admitted, QueuePosition::Waiting);
                let _ = events.try_send(CallEvent::Queue(q));
            };
            let admitted = self
                .limits
                .admit(
                    upstream.name(),
                    upstream.cfg.max_concurrency,
                    principal,
                    report,
                )
                .await;
            let Ok(_permit) = admitted else {
                return Err(UpstreamError::QueueFull {
                    upstream: upstream.name().to_string(),
                });
            };
            upstream.call(principal, spec, events).await
        };
        tokio::select! {
            r = call => r,
            () = in_flight.cancelled() => Err(UpstreamError::Broken {
                upstream: upstream.name().to_string(),
                reason: "cancelled by an operator purging the tenant's data".into(),
            }),
        }
    }

    /// Start an inline call for `req` in its own task (admission included); the
    /// front waits for it and renders the answer.
    pub fn start_inline(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        req: &crate::protocol::Request<crate::protocol::params::Forward>,
    ) -> events::Pending {
        let want_progress = req.meta.progress_token.is_some();
        let spec = inputs::upstream_spec(req.method, &req.params, want_progress);
        self.start_call(upstream, principal, spec)
    }

    /// Start the upstream call `spec` in its own task (a 2025-era session's request,
    /// built by the front as sent: docs/design.md §22 "Clients of the 2025 era").
    pub fn start_call(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        spec: CallSpec,
    ) -> events::Pending {
        let (ev_tx, events) = tokio::sync::mpsc::channel::<CallEvent>(32);
        let up = upstream.clone();
        let p = principal.clone();
        let engine = self.clone();
        // In the request's span, so the upstream call's client span is its child.
        let call = crate::telemetry::spawn_in_current_span(async move {
            engine.call_upstream(&up, &p, spec, ev_tx).await
        });
        events::Pending::new(call, events, self.input_gather())
    }

    /// A `required` upstream task tool called by a 2025-era session without task
    /// augmentation: the upstream task is followed inline, as one long call
    /// (`follow.rs`).
    pub fn start_upstream_task_inline(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        call: CallSpec,
    ) -> events::Pending {
        follow::start_inline(self, upstream, principal, call)
    }

    /// Whether the store takes writes (a failed write or flush turns it off until a
    /// probe gets through): `/readyz` and `/livez` report it.
    pub fn store_healthy(&self) -> bool {
        self.tasks.healthy()
    }

    /// The owner received `rec` (src/tasks/seen.rs).
    pub fn note_seen(&self, rec: &TaskRecord) {
        self.tasks.note_seen(rec);
    }

    /// Write the noted reads now: from the marker task, from the sweeper before it
    /// expires anything (a read just before expiry then still counts), and once more
    /// when the gateway stops.
    pub async fn write_seen(&self) {
        self.tasks.write_seen().await;
    }

    /// Start the background task that writes noted reads.
    pub fn spawn_seen_marker(&self) {
        self.tasks.spawn_seen_marker();
    }

    pub fn subscribe_changes(&self) -> broadcast::Receiver<Change> {
        self.tasks.subscribe()
    }

    /// A task record changed: tell this replica's subscribers and the other replicas.
    fn changed(&self, task_id: &str) {
        self.tasks.changed_here(task_id);
        self.replica.publish(task_id);
    }
}

/// The task status message for a queue report.
pub fn queue_status(q: QueuePosition) -> String {
    match q {
        QueuePosition::Waiting(n) => crate::limits::queue_message(n),
        QueuePosition::Admitted => "working".into(),
    }
}

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod sessions_tests;
