//! The tasks engine: promotes slow `tools/call`s to durable tasks, serves
//! `tasks/get`, `tasks/update`, `tasks/cancel`, holds MRTR rounds, and runs every
//! upstream call through admission. It answers with a domain [`outcome::Reply`] that
//! the front renders; it names nothing of HTTP.
//!
//! - `promote.rs`: the promotion decision (which deadline, which mode).
//! - `call.rs`: the deadline race and durable creation before the handle goes out.
//! - `driver.rs`: a promoted call running in the background (progress, input, result).
//! - `methods.rs`: the `tasks/*` methods and the ownership check.
//! - `sweeper.rs`: expiry, tombstones and restart recovery.
//! - `seen.rs`: read marks, for counting outcomes nobody collected.
//! - `replica.rs`: being one of several replicas (leases, takeover, relays, fan-out);
//!   `replica_state.rs` the state it keeps.
//! - `fingerprint.rs`: order-free fingerprints of JSON values.
//! - `snapshot.rs`: the wire shapes.
//! - `mrtr.rs`: multi round-trip requests for clients that get no task.
//! - `inputs.rs`: screening upstream input requests; `failure.rs`: the retry class
//!   of a call that produced no answer; `outcome.rs`: the reply type.

pub mod call;
pub mod clock;
pub mod driver;
pub mod failure;
pub mod fingerprint;
pub mod ids;
pub mod inputs;
pub mod methods;
pub mod mrtr;
pub mod outcome;
pub mod promote;
pub mod replica;
mod replica_state;
pub mod seen;
pub mod snapshot;
pub mod sweeper;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};

use crate::auth::Principal;
use crate::config::Config;
use crate::limits::Limits;
use crate::store::{
    Created, Expired, RequestRoute, SCHEMA_VERSION, StoreError, TaskRecord, TaskStatus, TaskStore,
    UpstreamIdentity,
};
use crate::upstream::{
    CallEvent, CallOutcome, CallSpec, InputAnswer, QueuePosition, Upstream, UpstreamError,
    UpstreamInfo, UpstreamSet,
};

/// A task changed status: `from: None` when it was created, `to: None` when expiry
/// removed it. Observers (metrics, limits) are registered by whoever assembles the
/// gateway, so the engine names neither.
#[derive(Debug, Clone, Copy)]
pub struct Transition<'a> {
    pub task_id: &'a str,
    pub from: Option<TaskStatus>,
    pub to: Option<TaskStatus>,
    pub created_at_ms: u64,
}

pub type Observer = Box<dyn Fn(&Transition<'_>) + Send + Sync>;

/// A promoted call that is running in this process.
struct Live {
    /// Aborting the call task drops the upstream call future, which cancels it
    /// upstream (transport contract).
    abort: tokio::task::AbortHandle,
    /// Answer channels of outstanding input requests, by input key.
    responders: HashMap<String, oneshot::Sender<InputAnswer>>,
    /// Answers that arrived before their key's channel was registered: the driver
    /// records the input request in the store first, so an owner who polls at once
    /// can answer in between. Handed over by [`Engine::add_responder`].
    early: HashMap<String, Value>,
}

/// What the engine's change stream carries to this replica's subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// This task's record changed (here or on another replica).
    Task(String),
    /// Changes may have been missed: read every subscribed task again.
    Resync,
}

/// Shared state of the tasks engine.
pub struct Engine {
    store: Arc<dyn TaskStore>,
    cfg: Arc<Config>,
    /// This gateway's flow control (owned by the gateway, not the process).
    limits: Arc<Limits>,
    /// Set once the gateway stops: a promoted call that ends because its upstream is
    /// being shut down is then *not* settled, so its request route stays in the store
    /// and the next start resolves the task.
    draining: AtomicBool,
    live: Mutex<HashMap<String, Live>>,
    /// Task ids whose record changed (for `subscriptions/listen`).
    changes: broadcast::Sender<Change>,
    /// Terminal snapshots the owner received, waiting to be marked in the store.
    seen: Arc<seen::SeenMarks>,
    observers: RwLock<Vec<Observer>>,
    /// This replica's seat, lease and relays on a shared store (`replica.rs`).
    replica: replica_state::ReplicaState,
    /// Tasks with a terminal write that no flush has covered yet (by writer count):
    /// sled shows a write before it is durable, so a reader that finds such a task
    /// terminal flushes first ([`Engine::durable`]); otherwise a crash could turn a
    /// result a client already read back into "gateway restarted" (README
    /// "Durability").
    unflushed: Mutex<HashMap<String, usize>>,
    /// Tasks between their write to the store and their launch ([`Creating`]): the
    /// orphan sweep leaves them alone, so a slow flush never looks like a lost call.
    creating: Mutex<HashSet<String>>,
}

/// Marks a task as being created until dropped (after its launch, or when its
/// creation failed).
pub(crate) struct Creating<'a> {
    engine: &'a Engine,
    task_id: String,
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.engine.creating.lock().remove(&self.task_id);
    }
}

impl Engine {
    pub fn new(store: Arc<dyn TaskStore>, cfg: Arc<Config>, limits: Arc<Limits>) -> Arc<Self> {
        let (changes, _) = broadcast::channel(1024);
        Arc::new(Self {
            replica: replica_state::ReplicaState::new(cfg.replica_id()),
            store,
            cfg,
            limits,
            draining: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            changes,
            seen: Arc::default(),
            observers: RwLock::new(Vec::new()),
            unflushed: Mutex::new(HashMap::new()),
            creating: Mutex::new(HashSet::new()),
        })
    }

    /// Call `f` on every task status transition from now on.
    pub fn observe(&self, f: Observer) {
        self.observers.write().push(f);
    }

    fn notify(&self, t: Transition<'_>) {
        for f in self.observers.read().iter() {
            f(&t);
        }
    }

    // Every task write of the engine goes through these four, so that observers see
    // each transition exactly once whatever the backend.

    async fn create_task(
        &self,
        rec: &TaskRecord,
        route: &RequestRoute,
        index: Option<&[u8]>,
    ) -> Result<Created, StoreError> {
        let r = self.store.create(rec, route, index).await;
        if matches!(r, Ok(Created::New)) {
            self.notify(Transition {
                task_id: &rec.task_id,
                from: None,
                to: Some(rec.status),
                created_at_ms: rec.created_at_ms,
            });
        }
        r
    }

    async fn update_task(
        &self,
        task_id: &str,
        f: &mut (dyn FnMut(&mut TaskRecord) -> bool + Send),
    ) -> Result<Option<TaskRecord>, StoreError> {
        self.update_task_from(task_id, None, f).await
    }

    /// [`Engine::update_task`] from the in-flight call of route `fence` (if given):
    /// fenced on this replica's seat (`TaskStore::update_fenced`).
    async fn update_task_from(
        &self,
        task_id: &str,
        fence: Option<&str>,
        f: &mut (dyn FnMut(&mut TaskRecord) -> bool + Send),
    ) -> Result<Option<TaskRecord>, StoreError> {
        let mut before = None;
        let mut step = |rec: &mut TaskRecord| {
            let status = rec.status;
            let changed = f(rec);
            before = changed.then_some(status);
            changed
        };
        let r = match fence {
            Some(route) => self.store.update_fenced(task_id, route, &mut step).await?,
            None => self.store.update(task_id, &mut step).await?,
        };
        if let (Some(b), Some(after)) = (before, r.as_ref())
            && b != after.status
        {
            self.notify(Transition {
                task_id,
                from: Some(b),
                to: Some(after.status),
                created_at_ms: after.created_at_ms,
            });
        }
        Ok(r)
    }

    async fn expire_task(
        &self,
        task_id: &str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> Result<Option<Expired>, StoreError> {
        let r = self
            .store
            .expire(task_id, now_ms, tombstone_until_ms)
            .await?;
        if let Some(gone) = &r {
            self.notify(Transition {
                task_id,
                from: Some(gone.record.status),
                to: None,
                created_at_ms: gone.record.created_at_ms,
            });
        }
        Ok(r)
    }

    /// A durable flush, timed for `taskgate_store_flush_duration_seconds`.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let t = std::time::Instant::now();
        let r = self.store.flush().await;
        crate::metrics::store_flush(t.elapsed());
        r
    }

    /// The upstream identities earlier runs stored, by upstream name (what the task
    /// plane shows until an upstream answers again). A read error is logged and counts
    /// as nothing stored: the identity is only ever a fallback.
    pub async fn stored_identities(&self) -> HashMap<String, UpstreamInfo> {
        let mut out = HashMap::new();
        for u in &self.cfg.upstreams {
            match self.store.upstream_identity(&u.name).await {
                Ok(Some(i)) => {
                    out.insert(
                        u.name.clone(),
                        UpstreamInfo {
                            protocol_version: i.protocol_version,
                            capabilities: i.capabilities,
                            server_info: i.server_info,
                            instructions: i.instructions,
                        },
                    );
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

    async fn store_identity(&self, name: &str, info: &UpstreamInfo) {
        let record = UpstreamIdentity {
            v: SCHEMA_VERSION,
            protocol_version: info.protocol_version.clone(),
            server_info: info.server_info.clone(),
            capabilities: info.capabilities.clone(),
            instructions: info.instructions.clone(),
        };
        match self.store.put_upstream_identity(name, &record).await {
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

    /// Note a terminal write of `task_id` that is about to be made; call
    /// [`Engine::terminal_flushed`] once a flush after it resolved.
    fn terminal_writing(&self, task_id: &str) {
        {
            let mut u = self.unflushed.lock();
            *u.entry(task_id.to_string()).or_default() += 1;
        }
    }

    fn terminal_flushed(&self, task_id: &str) {
        let mut u = self.unflushed.lock();
        if let Some(n) = u.get_mut(task_id) {
            *n -= 1;
            if *n == 0 {
                u.remove(task_id);
            }
        }
    }

    /// Mark the gateway as stopping (see the `draining` field).
    pub fn begin_shutdown(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn shutting_down(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
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
    }

    /// Start an inline call for `req` in its own task (admission included); the
    /// front waits for it and renders the answer.
    pub fn start_inline(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        principal: &Principal,
        req: &crate::protocol::Request<crate::protocol::params::Forward>,
    ) -> mrtr::Pending {
        let want_progress = req.meta.progress_token.is_some();
        let spec = inputs::upstream_spec(req.method, &req.params, want_progress);
        let (ev_tx, events) = tokio::sync::mpsc::channel::<CallEvent>(32);
        let up = upstream.clone();
        let p = principal.clone();
        let engine = self.clone();
        let call = tokio::spawn(async move { engine.call_upstream(&up, &p, spec, ev_tx).await });
        mrtr::Pending { call, events }
    }

    /// Before `rec` (just read) is shown to anyone: if it is terminal and that write
    /// may not be durable yet, flush (a flush started after the read covers it).
    pub async fn durable(&self, rec: &TaskRecord) -> Result<(), crate::store::StoreError> {
        let pending = rec.status.is_terminal() && self.unflushed.lock().contains_key(&rec.task_id);
        if pending {
            self.store.flush().await?;
        }
        Ok(())
    }

    /// Whether the store takes writes (a failed write or flush turns it off until a
    /// probe gets through): `/readyz` and `/livez` report it.
    pub fn store_healthy(&self) -> bool {
        self.store.healthy()
    }

    /// The owner received `rec` (src/tasks/seen.rs).
    pub fn note_seen(&self, rec: &TaskRecord) {
        self.seen.note_read(rec);
    }

    /// Write the noted reads now: from the marker task, from the sweeper before it
    /// expires anything (a read just before expiry then still counts), and once more
    /// when the gateway stops.
    pub async fn write_seen(&self) {
        self.seen.write(&*self.store).await;
    }

    /// Start the background task that writes noted reads.
    pub fn spawn_seen_marker(&self) {
        self.seen.spawn_marker(self.store.clone());
    }

    pub fn subscribe_changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// A task record changed: tell this replica's subscribers and the other replicas.
    fn changed(&self, task_id: &str) {
        self.changed_here(task_id);
        self.publish_change(task_id);
    }

    /// Tell this replica's subscribers only (a change another replica published).
    fn changed_here(&self, task_id: &str) {
        let _ = self.changes.send(Change::Task(task_id.to_string()));
    }

    /// Tell this replica's subscribers that changes may have been missed (the store's
    /// listener reconnected): every subscribed task must be read again.
    fn resync_here(&self) {
        let _ = self.changes.send(Change::Resync);
    }

    fn register_live(&self, task_id: &str, abort: tokio::task::AbortHandle) {
        {
            let mut live = self.live.lock();
            live.insert(
                task_id.to_string(),
                Live {
                    abort,
                    responders: HashMap::new(),
                    early: HashMap::new(),
                },
            );
        }
    }

    fn add_responder(&self, task_id: &str, key: String, tx: oneshot::Sender<InputAnswer>) {
        if let Some(l) = self.live.lock().get_mut(task_id) {
            match l.early.remove(&key) {
                Some(answer) => {
                    let _ = tx.send(InputAnswer::Result(answer));
                }
                None => {
                    l.responders.insert(key, tx);
                }
            }
        }
    }

    /// Hand `answer` to the call of `task_id` if it runs here: to its channel for
    /// `key`, or kept for the channel the driver is about to register (see
    /// [`Live::early`]). `Err` gives the answer back when the call is not here.
    fn offer_answer(&self, task_id: &str, key: &str, answer: Value) -> Result<(), Value> {
        let mut live = self.live.lock();
        let Some(l) = live.get_mut(task_id) else {
            return Err(answer);
        };
        match l.responders.remove(key) {
            Some(tx) => {
                let _ = tx.send(InputAnswer::Result(answer));
            }
            None => {
                l.early.insert(key.to_string(), answer);
            }
        }
        Ok(())
    }

    /// Stop a running call (cancel, expiry); `false` when it is not running here.
    fn abort_live(&self, task_id: &str) -> bool {
        let live = self.live.lock().remove(task_id);
        match live {
            Some(l) => {
                l.abort.abort();
                true
            }
            None => false,
        }
    }

    /// Mark `task_id` as being created (see [`Creating`]).
    fn creating(&self, task_id: &str) -> Creating<'_> {
        self.creating.lock().insert(task_id.to_string());
        Creating {
            engine: self,
            task_id: task_id.to_string(),
        }
    }

    /// Whether this process runs (or is about to launch) the call of `task_id`.
    fn knows_call(&self, task_id: &str) -> bool {
        self.live.lock().contains_key(task_id) || self.creating.lock().contains(task_id)
    }

    fn forget_live(&self, task_id: &str) {
        {
            let mut l = self.live.lock();
            l.remove(task_id);
        }
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
