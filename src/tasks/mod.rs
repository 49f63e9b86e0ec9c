//! The tasks engine: promotes slow `tools/call`s to durable tasks, serves
//! `tasks/get`, `tasks/update`, `tasks/cancel`, holds MRTR rounds, and runs every
//! upstream call through admission. It answers with a domain [`outcome::Reply`] that
//! the front renders; it names nothing of HTTP.
//!
//! The engine is made of parts with private state (ARCHITECTURE.md "The engine's
//! parts"): the task repository (`repo.rs`), the live calls (`live.rs`), the tenants'
//! calls (`tenant_calls.rs`), the replica (`replica_state.rs`) and the sessions
//! (`sessions.rs`), held by the [`Engine`] type (`engine.rs`). This file is the
//! engine's surface: each method below hands its work to the file that does it,
//! passing the parts that work needs (the whole engine where it touches most of them,
//! or runs on in a task of its own).
//!
//! - `admission.rs`: every upstream call (the tenant's fence, the admission gate).
//! - `events.rs`: one upstream call and its events as one stream.
//! - `promote.rs`: the promotion decision (which deadline, which mode).
//! - `call.rs`: the deadline race and durable creation before the handle goes out.
//! - `driver.rs`: a promoted call running in the background (progress, input, result).
//! - `upstream_task.rs` and `follow.rs`: a tool the upstream runs as its own task, and
//!   following that task.
//! - `methods.rs`: the `tasks/*` methods and the ownership check; `list.rs` a page of
//!   a principal's tasks (`tasks/list` of the 2025-11-25 dialect).
//! - `admin.rs`: what the operator API asks (lists by tenant, operator cancels,
//!   draining); `purge.rs` a tenant purge.
//! - `sweeper.rs`: expiry, tombstones, idle sessions and restart recovery;
//!   `terminal.rs` the bookkeeping of a move to a terminal state.
//! - `identities.rs`: the upstreams' identities and tool header maps across restarts.
//! - `sessions.rs`: the 2025-era client sessions (`SessionRepo`, a part of its own).
//! - `seen.rs`: read marks, for counting outcomes nobody collected.
//! - `replica.rs`: being one of several replicas (leases, takeover, relays, fan-out);
//!   `replica_state.rs` the `Replica` part it works with.
//! - `terminal_cache.rs`: terminal snapshots read before, answered without the store.
//! - `fingerprint.rs`: order-free fingerprints of JSON values.
//! - `snapshot.rs`: the wire shapes (the 2025-11-25 dialect's are the front's:
//!   `front/legacy/dialect.rs`).
//! - `mrtr.rs`: multi round-trip requests for clients that get no task.
//! - `inputs.rs`: screening upstream input requests; `failure.rs`: the retry class
//!   of a call that produced no answer; `outcome.rs`: the reply type.

pub mod admin;
mod admission;
pub mod call;
pub mod clock;
pub mod driver;
mod engine;
pub mod events;
pub mod failure;
pub mod fingerprint;
mod follow;
mod handles;
mod identities;
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
mod tool_call;
pub mod upstream_task;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::auth::Principal;
use crate::config::Config;
use crate::limits::Limits;
use crate::protocol::Request;
use crate::protocol::param_headers::ToolHeaders;
use crate::protocol::params::{Forward, TaskRef, TaskUpdate};
use crate::store::cluster::{Cluster, Seat};
use crate::store::{StoreError, TaskRecord, TaskStore, TenantCount};
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, Upstream, UpstreamError, UpstreamInfo, UpstreamSet,
};

pub use engine::Engine;
pub use repo::{Change, Observer, Transition};
pub use sessions::{ActiveGuard, SessionError, SessionRepo};

// The engine's surface for the layers above (the front names nothing else of it:
// tests/layering.rs): what a request hands the engine and what it gets back.
pub use admin::{MAX_PAGE, TaskQuery};
pub use call::{Caller, Retry, ToolCallRequest, ToolReply};
pub use clock::iso8601;
pub use events::{Event, Notice, Pending, Timers};
pub use failure::{CallFailure, ErrorClass, Failure, failure as failure_of};
pub use fingerprint::fingerprint;
pub use handles::{Adopted, Handle};
pub use ids::is_well_formed;
pub use inputs::{
    InlineTiming, InputVerdict, answer_undeclared, missing_capability, screen, upstream_spec,
};
pub use methods::is_expired;
pub use mrtr::{Holds, params_fingerprint};
pub use outcome::{JoinedCall, Reply, answer_of};
pub use purge::PurgeError;
pub use replica::MrtrHandler;
pub use snapshot::{create_result, detailed, task_fields};

/// The engine's surface: every method hands its work to the file that does it.
impl Engine {
    /// An engine over `store`, holding MRTR rounds in `holds`.
    pub fn new(
        store: Arc<dyn TaskStore>,
        cfg: Arc<Config>,
        limits: Arc<Limits>,
        holds: Arc<Holds>,
    ) -> Arc<Self> {
        Arc::new(engine::assemble(store, cfg, limits, holds))
    }

    /// The 2025-era client sessions (docs/design.md §22 "Clients of the 2025 era").
    pub fn sessions(&self) -> &SessionRepo {
        &self.sessions
    }

    /// Call `f` on every task status transition from now on.
    pub fn observe(&self, f: Observer) {
        self.tasks.observe(f);
    }

    /// A durable flush, timed for `taskgate_store_flush_duration_seconds`.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.tasks.flush().await
    }

    // For the engine's files that take the whole engine (`call.rs`, `driver.rs`,
    // `upstream_task.rs`, `tool_call.rs`).

    /// How long a batch of upstream input requests stays open for more
    /// (`input_gather_ms`).
    fn input_gather(&self) -> Duration {
        self.cfg.tasks.input_gather
    }

    /// A task record changed: tell this replica's subscribers and the other replicas.
    fn changed(&self, task_id: &str) {
        replica::changed(&self.tasks, &self.replica, task_id);
    }

    // Upstream identities and tool header maps (`identities.rs`).

    /// The upstream identities earlier runs stored, by upstream name.
    pub async fn stored_identities(&self) -> HashMap<String, UpstreamInfo> {
        identities::stored_identities(&self.tasks, &self.cfg).await
    }

    /// Keep every upstream's identity durable, written and flushed in the background.
    pub fn persist_identities(self: &Arc<Self>, upstreams: &UpstreamSet) {
        identities::persist_identities(self, upstreams);
    }

    /// The tools' `Mcp-Param-*` header maps earlier runs stored, by upstream name.
    pub async fn stored_tool_headers(&self) -> HashMap<String, ToolHeaders> {
        identities::stored_tool_headers(&self.tasks, &self.cfg).await
    }

    /// Keep every upstream's tool header map durable, as
    /// [`persist_identities`](Self::persist_identities) does the identity.
    pub fn persist_tool_headers(self: &Arc<Self>, upstreams: &UpstreamSet) {
        identities::persist_tool_headers(self, upstreams);
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

    // Upstream calls (`call.rs`, `admission.rs`, `follow.rs`).

    /// An MRTR retry (`params.requestState`) of a call this engine holds; `None` for a
    /// first request. Every method that may answer `input_required` resumes here.
    pub fn mrtr_retry<P: AsRef<Forward>>(
        &self,
        upstream: &str,
        principal: &Principal,
        req: &Request<P>,
        server_info: &Value,
    ) -> Option<Retry> {
        call::mrtr_retry(&self.holds, upstream, principal, req, server_info)
    }

    /// The calls held for an MRTR round: an inline call that asks for input is held
    /// here until the client's retry (`mrtr.rs`).
    pub fn holds(&self) -> &Arc<Holds> {
        &self.holds
    }

    /// The one entry for a `tools/call` of either era: the params checks, then inline
    /// or a task by who makes the call ([`Caller`]). It returns the entry's own future
    /// (`call::call_tool`), with no second one around it.
    pub fn call_tool(
        self: &Arc<Self>,
        r: ToolCallRequest<'_>,
    ) -> impl Future<Output = ToolReply> + Send {
        call::call_tool(self, r)
    }

    /// Every upstream call goes through here: the tenant's purge fence, a slot of the
    /// upstream's admission gate, then the call in the principal's isolation scope.
    /// Dropping the future leaves the queue or cancels the call.
    pub async fn call_upstream(
        &self,
        upstream: &Upstream,
        principal: &Principal,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        admission::call_upstream(
            &self.tenant_calls,
            &self.limits,
            upstream,
            principal,
            spec,
            events,
        )
        .await
    }

    /// Start an inline call for `req` in its own task (admission included); the
    /// front waits for it and renders the answer.
    pub fn start_inline(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        req: &Request<Forward>,
    ) -> events::Pending {
        admission::start_inline(self, upstream, principal, req)
    }

    /// Start the upstream call `spec` in its own task (a 2025-era session's request,
    /// built by the front as sent: docs/design.md §22 "Clients of the 2025 era").
    pub fn start_call(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        spec: CallSpec,
    ) -> events::Pending {
        admission::start_call(self, upstream, principal, spec)
    }

    /// A `required` upstream task tool called by a 2025-era session without task
    /// augmentation: the upstream task is followed inline, as one long call.
    pub fn start_upstream_task_inline(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        call: CallSpec,
    ) -> events::Pending {
        follow::start_inline(self, upstream, principal, call)
    }

    // Read marks and the change stream (`repo.rs`, `seen.rs`).

    /// Whether the store takes writes (a failed write or flush turns it off until a
    /// probe gets through): `/readyz` and `/livez` report it.
    /// Make a plain client's held call a task at its deadline (docs/design.md §28):
    /// durable before its handle goes out, or the call back to hold on.
    pub async fn adopt(self: &Arc<Self>, h: Box<Handle>, pending: Pending) -> Adopted {
        handles::adopt(self, h, pending).await
    }

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

    // The `tasks/*` methods (`methods.rs`, `list.rs`).

    /// Resolve `params.taskId` for `principal` on `upstream`: owned and unexpired, else
    /// the one "not found" (docs/design.md §7 "Ownership").
    pub async fn resolve(
        &self,
        principal: &Principal,
        upstream: &str,
        task: &TaskRef,
    ) -> Result<Arc<TaskRecord>, failure::Failure> {
        methods::resolve(&self.tasks, principal, upstream, task).await
    }

    pub async fn get<'a>(
        &self,
        principal: &Principal,
        upstream: &str,
        task: &TaskRef,
        server_info: &'a Value,
    ) -> Result<snapshot::GetResult<'a>, failure::Failure> {
        methods::get(
            &self.tasks,
            &self.limits,
            principal,
            upstream,
            task,
            server_info,
        )
        .await
    }

    /// The one read of a task shown to its owner, by `tasks/get` or on a listen stream:
    /// owned and unexpired ([`Engine::resolve`]), durable if terminal, and with the
    /// poll interval adapted. The caller notes the read ([`Engine::note_seen`]) once
    /// the owner has it.
    pub async fn owner_snapshot(
        &self,
        principal: &Principal,
        upstream: &str,
        task: &TaskRef,
    ) -> Result<Arc<TaskRecord>, failure::Failure> {
        methods::owner_snapshot(&self.tasks, &self.limits, principal, upstream, task).await
    }

    /// Relay each answer for an outstanding key to the upstream (MCP Tasks extension,
    /// "Task Update Requests").
    pub async fn update(
        &self,
        principal: &Principal,
        upstream: &str,
        update: TaskUpdate,
        server_info: &Value,
    ) -> Result<Value, failure::Failure> {
        methods::update(self, principal, upstream, update, server_info).await
    }

    /// Record the intent durably, stop the upstream call, acknowledge (MCP Tasks
    /// extension, "Task Cancellation"; docs/design.md §6 "Cancel").
    pub async fn cancel(
        &self,
        principal: &Principal,
        upstream: &str,
        task: &TaskRef,
        server_info: &Value,
    ) -> Result<Value, failure::Failure> {
        methods::cancel(self, principal, upstream, task, server_info).await
    }

    /// One page of the principal's tasks on `upstream` (docs/design.md §25), with the
    /// opaque cursor for the next page.
    pub async fn list_owned(
        &self,
        principal: &Principal,
        upstream: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<String>), failure::Failure> {
        list::list_owned(
            &self.tasks,
            &self.limits,
            principal,
            upstream,
            cursor,
            limit,
        )
        .await
    }

    // The operator API (`admin.rs`, `purge.rs`; docs/design.md §24).

    /// One page of `q.tenant`'s tasks in creation order.
    pub async fn admin_list(&self, q: &admin::TaskQuery) -> Result<admin::TaskPage, StoreError> {
        admin::admin_list(&self.tasks, q).await
    }

    /// One task, whoever owns it.
    pub async fn admin_show(
        &self,
        task_id: &str,
    ) -> Result<Option<admin::TaskSummary>, StoreError> {
        admin::admin_show(&self.tasks, task_id).await
    }

    /// Cancel a task for an operator, as its owner's cancel does, with an audit line.
    /// `None` when no such task exists.
    pub async fn admin_cancel(
        &self,
        task_id: &str,
        operator: &str,
    ) -> Result<Option<admin::TaskSummary>, StoreError> {
        admin::admin_cancel(self, task_id, operator).await
    }

    /// How many tasks each tenant holds, by status.
    pub async fn tenant_counts(&self) -> Result<Vec<TenantCount>, StoreError> {
        self.tasks.tenant_counts().await
    }

    /// Stop admitting new upstream calls (or admit them again), for a rolling deploy.
    pub fn set_drained(&self, on: bool, operator: &str) {
        admin::set_drained(&self.admin_drained, on, operator);
    }

    /// Whether an operator drained this replica.
    pub fn drained(&self) -> bool {
        admin::drained(&self.admin_drained)
    }

    /// Whether this replica takes new upstream calls: it holds its lease and no
    /// operator drained it.
    pub fn accepting_calls(&self) -> bool {
        self.lease_held() && !self.drained()
    }

    /// Purge `tenant` for `operator` (named in the audit lines, docs/design.md §27
    /// "Tenant purge"). Safe to run again, also after a failure or a crash.
    pub async fn admin_purge(
        &self,
        tenant: &str,
        operator: &str,
    ) -> Result<purge::PurgeReport, purge::PurgeError> {
        purge::admin_purge(self, tenant, operator).await
    }

    // Replicas on a shared store (`replica.rs`, docs/design.md §18).

    /// This replica's id (`server.replica_id` or its default).
    pub fn replica_id(&self) -> &str {
        self.replica.id()
    }

    /// Whether this replica may take calls: always with one gateway; on a shared
    /// store, while its lease is renewed.
    pub fn lease_held(&self) -> bool {
        self.replica.lease_held()
    }

    /// The epoch of this replica's seat (`None` with one gateway): a call started
    /// under another epoch is no longer this replica's.
    pub(super) fn epoch(&self) -> Option<i64> {
        self.replica.epoch()
    }

    /// Take a seat on a shared store: a new epoch and a lease. Call before recovery
    /// (which then resolves this replica's earlier epochs only).
    pub async fn join_cluster(&self, cluster: Arc<dyn Cluster>) -> Result<Seat, StoreError> {
        self.replica.join(cluster).await
    }

    /// Install what runs an MRTR retry relayed to this replica.
    pub fn on_relayed_mrtr(&self, h: replica::MrtrHandler) {
        self.replica.set_mrtr_handler(h);
    }

    /// Start the lease, relay, publish and listen loops (nothing with one gateway).
    pub fn spawn_cluster(self: &Arc<Self>, shutdown: CancellationToken) {
        replica::spawn_cluster(self, shutdown);
    }

    /// Relay an MRTR retry to the live seat of `replica_id` and wait for its reply.
    /// `None` when the replica is gone or did not answer within `wait`.
    pub async fn relay_mrtr(
        &self,
        replica_id: &str,
        request: Value,
        wait: Duration,
    ) -> Option<Value> {
        replica::relay_mrtr(&self.replica, replica_id, request, wait).await
    }

    // Expiry and recovery (`sweeper.rs`).

    /// Resolve request routes left by a previous process: their tasks fail with a
    /// reason, or follow again the upstream task they followed (docs/design.md §10
    /// "Restart", §25). The number of tasks failed.
    pub async fn recover(
        self: &Arc<Self>,
        upstreams: &Arc<UpstreamSet>,
    ) -> Result<usize, StoreError> {
        sweeper::recover(self, upstreams).await
    }

    /// One sweep: expiry, tombstones, idle legacy sessions, orphaned routes and the
    /// calls of lost replicas. The number of tasks expired.
    pub async fn sweep(self: &Arc<Self>) -> Result<usize, StoreError> {
        sweeper::sweep(self).await
    }

    pub fn spawn_sweeper(self: &Arc<Self>, shutdown: CancellationToken) {
        sweeper::spawn_sweeper(self, shutdown);
    }
}

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod sessions_tests;
