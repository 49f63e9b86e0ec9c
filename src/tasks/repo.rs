//! The task repository: the engine's only way to the store. Every task write goes
//! through it, so observers see each status transition exactly once whatever the
//! backend; a terminal write is tracked until a flush covers it, so no reader shows a
//! result a crash could still take back; and the reads owners collect are noted here.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tokio::sync::broadcast;

use super::seen::SeenMarks;
use super::terminal_cache::TerminalCache;
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use crate::store::{
    Created, Expired, IdempotencyEntry, Owned, OwnerCursor, QuotaCreated, RequestRoute, StoreError,
    TaskRecord, TaskStatus, TaskStore, TenantCount, now_ms,
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

/// What the engine's change stream carries to this replica's subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// This task's record changed (here or on another replica).
    Task(String),
    /// Changes may have been missed: read every subscribed task again.
    Resync,
}

/// What a task id is to one principal ([`TaskRepo::lookup_owned`]): the store's
/// [`Owned`], with the record shared so that a terminal snapshot served from memory is
/// not copied.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Lookup {
    Record(Arc<TaskRecord>),
    Expired,
    Unknown,
}

/// A write of a task record: `true` when it changed the record.
pub(super) type Edit<'a> = &'a mut (dyn FnMut(&mut TaskRecord) -> bool + Send);

pub(super) struct TaskRepo {
    store: Arc<dyn TaskStore>,
    observers: RwLock<Vec<Observer>>,
    /// Tasks with a terminal write that no flush has covered yet (by writer count):
    /// sled shows a write before it is durable, so a reader that finds such a task
    /// terminal flushes first ([`TaskRepo::durable`]); otherwise a crash could turn a
    /// result a client already read back into "gateway restarted" (README
    /// "Durability").
    unflushed: Mutex<HashMap<String, usize>>,
    /// Terminal snapshots the owner received, waiting to be marked in the store.
    seen: Arc<SeenMarks>,
    /// Task ids whose record changed (for `subscriptions/listen`).
    changes: broadcast::Sender<Change>,
    /// Terminal snapshots read before, for their owners' next reads
    /// (`terminal_cache.rs`); kept current by [`TaskRepo::changed_here`].
    terminal: TerminalCache,
}

impl TaskRepo {
    pub(super) fn new(store: Arc<dyn TaskStore>) -> Self {
        let (changes, _) = broadcast::channel(1024);
        Self {
            store,
            observers: RwLock::new(Vec::new()),
            unflushed: Mutex::new(HashMap::new()),
            seen: Arc::default(),
            changes,
            terminal: TerminalCache::default(),
        }
    }

    pub(super) fn observe(&self, f: Observer) {
        self.observers.write().push(f);
    }

    /// Tell the observers of a transition the store made on its own (a takeover).
    pub(super) fn notify(&self, t: Transition<'_>) {
        for f in self.observers.read().iter() {
            f(&t);
        }
    }

    // Every task write goes through these three.

    pub(super) async fn create(
        &self,
        rec: &TaskRecord,
        route: &RequestRoute,
        index: Option<&[u8]>,
    ) -> Result<Created, StoreError> {
        let r = self.store.create(rec, route, index).await;
        if matches!(r, Ok(Created::New)) {
            self.created(rec);
        }
        r
    }

    /// [`TaskRepo::create`] under the tenant's live-task quota, counted by the store
    /// with the write (`TaskStore::create_within_quota`).
    pub(super) async fn create_within_quota(
        &self,
        rec: &TaskRecord,
        route: &RequestRoute,
        index: Option<&[u8]>,
        max_live: u64,
    ) -> Result<QuotaCreated, StoreError> {
        let r = self
            .store
            .create_within_quota(rec, route, index, max_live)
            .await;
        if matches!(r, Ok(QuotaCreated::Done(Created::New))) {
            self.created(rec);
        }
        r
    }

    fn created(&self, rec: &TaskRecord) {
        self.notify(Transition {
            task_id: &rec.task_id,
            from: None,
            to: Some(rec.status),
            created_at_ms: rec.created_at_ms,
        });
    }

    /// Apply `f` to the record of `task_id`; from the in-flight call of route `fence`
    /// (if given), fenced on this replica's seat (`TaskStore::update_fenced`).
    pub(super) async fn update(
        &self,
        task_id: &str,
        fence: Option<&str>,
        f: Edit<'_>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.write(task_id, fence, f, false).await?.0)
    }

    /// [`TaskRepo::update`] for the last write of the call of route `fence`: the store
    /// may remove the route with a terminal write (`TaskStore::update_fenced_releasing`);
    /// `true` when it did.
    pub(super) async fn update_releasing(
        &self,
        task_id: &str,
        fence: &str,
        f: Edit<'_>,
    ) -> Result<(Option<TaskRecord>, bool), StoreError> {
        self.write(task_id, Some(fence), f, true).await
    }

    async fn write(
        &self,
        task_id: &str,
        fence: Option<&str>,
        f: Edit<'_>,
        release: bool,
    ) -> Result<(Option<TaskRecord>, bool), StoreError> {
        let mut before = None;
        let mut step = |rec: &mut TaskRecord| {
            let status = rec.status;
            let changed = f(rec);
            before = changed.then_some(status);
            changed
        };
        let (r, released) = match fence {
            Some(route) if release => {
                self.store
                    .update_fenced_releasing(task_id, route, &mut step)
                    .await?
            }
            Some(route) => (
                self.store.update_fenced(task_id, route, &mut step).await?,
                false,
            ),
            None => (self.store.update(task_id, &mut step).await?, false),
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
        Ok((r, released))
    }

    pub(super) async fn expire(
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

    /// One batch of a tenant purge (`TaskStore::purge_tenant`): the observers see each
    /// removed task go, as at expiry, and nothing here remembers it.
    pub(super) async fn purge_tenant(
        &self,
        tenant: &str,
        limit: usize,
    ) -> Result<crate::store::Purged, StoreError> {
        let batch = self.store.purge_tenant(tenant, limit).await?;
        for t in &batch.tasks {
            self.unflushed.lock().remove(&t.task_id);
            self.notify(Transition {
                task_id: &t.task_id,
                from: Some(t.status),
                to: None,
                created_at_ms: t.created_at_ms,
            });
        }
        Ok(batch)
    }

    /// A durable flush, timed for `taskgate_store_flush_duration_seconds`.
    pub(super) async fn flush(&self) -> Result<(), StoreError> {
        let t = std::time::Instant::now();
        let r = self.store.flush().await;
        crate::metrics::store_flush(t.elapsed());
        r
    }

    /// Note a terminal write of `task_id` that is about to be made; call
    /// [`TaskRepo::terminal_flushed`] once a flush after it resolved.
    pub(super) fn terminal_writing(&self, task_id: &str) {
        let mut u = self.unflushed.lock();
        *u.entry(task_id.to_string()).or_default() += 1;
    }

    pub(super) fn terminal_flushed(&self, task_id: &str) {
        let mut u = self.unflushed.lock();
        if let Some(n) = u.get_mut(task_id) {
            *n -= 1;
            if *n == 0 {
                u.remove(task_id);
            }
        }
    }

    /// Before `rec` (just read) is shown to anyone: if it is terminal and that write
    /// may not be durable yet, flush (a flush started after the read covers it).
    pub(super) async fn durable(&self, rec: &TaskRecord) -> Result<(), StoreError> {
        let pending = rec.status.is_terminal() && self.unflushed.lock().contains_key(&rec.task_id);
        if pending {
            self.flush().await?;
        }
        Ok(())
    }

    /// Before `recs` (just read) are shown: one flush covers every terminal write
    /// among them that may not be durable yet ([`TaskRepo::durable`] for a page).
    pub(super) async fn durable_all(&self, recs: &[TaskRecord]) -> Result<(), StoreError> {
        let pending = {
            let u = self.unflushed.lock();
            recs.iter()
                .any(|r| r.status.is_terminal() && u.contains_key(&r.task_id))
        };
        if pending {
            self.flush().await?;
        }
        Ok(())
    }

    // Reads.

    /// `task_id` if `(tenant, subject)` owns it: one lookup, whoever asks
    /// (docs/design.md §7 "Ownership"). A terminal snapshot its owner read before is
    /// answered from memory; anyone else's read of it, like a read of an id never
    /// issued, goes to the store (`terminal_cache.rs`).
    pub(super) async fn lookup_owned(
        &self,
        task_id: &str,
        tenant: &str,
        subject: &str,
    ) -> Result<Lookup, StoreError> {
        if let Some(rec) = self.terminal.get(task_id, tenant, subject, now_ms()) {
            return Ok(Lookup::Record(rec));
        }
        let ticket = self.terminal.ticket(task_id);
        Ok(
            match self.store.lookup_owned(task_id, tenant, subject).await? {
                Owned::Record(rec) => {
                    let rec = Arc::new(*rec);
                    self.terminal.keep(ticket, &rec);
                    Lookup::Record(rec)
                }
                Owned::Expired => Lookup::Expired,
                Owned::Unknown => Lookup::Unknown,
            },
        )
    }

    /// A page of the tasks `(tenant, subject)` holds on `upstream`
    /// (`TaskStore::list_owned`).
    pub(super) async fn list_owned(
        &self,
        tenant: &str,
        subject: &str,
        upstream: &str,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        self.store
            .list_owned(tenant, subject, upstream, after, limit)
            .await
    }

    /// A task as stored, whoever owns it (the operator API only).
    pub(super) async fn get(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.store.get(task_id).await
    }

    /// A page of `tenant`'s tasks in `status` (`TaskStore::list_tenant`).
    pub(super) async fn list_tenant(
        &self,
        tenant: &str,
        status: TaskStatus,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        self.store.list_tenant(tenant, status, after, limit).await
    }

    pub(super) async fn tenant_counts(&self) -> Result<Vec<TenantCount>, StoreError> {
        self.store.tenant_counts().await
    }

    /// The status of `task_id` as stored, `None` when it is gone or unreadable.
    pub(super) async fn status(&self, task_id: &str) -> Option<TaskStatus> {
        match self.store.get(task_id).await {
            Ok(Some(rec)) => Some(rec.status),
            _ => None,
        }
    }

    pub(super) async fn live_tasks(&self, tenant: &str) -> Result<u64, StoreError> {
        self.store.live_tasks(tenant).await
    }

    pub(super) async fn idempotency_get(
        &self,
        index: &[u8],
    ) -> Result<Option<IdempotencyEntry>, StoreError> {
        self.store.idempotency_get(index).await
    }

    // Request routes and expiry (the sweeper's and the driver's).

    pub(super) async fn routes(&self) -> Result<Vec<RequestRoute>, StoreError> {
        self.store.routes().await
    }

    pub(super) async fn held_routes(&self) -> Result<Vec<RequestRoute>, StoreError> {
        self.store.held_routes().await
    }

    /// Write a route as this process's (re-attaching to an upstream task).
    pub(super) async fn put_route(&self, route: &RequestRoute) -> Result<(), StoreError> {
        self.store.put_route(route).await
    }

    pub(super) async fn remove_route(&self, route_id: &str) -> Result<(), StoreError> {
        self.store.remove_route(route_id).await
    }

    pub(super) async fn expired(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.store.expired(now_ms, limit).await
    }

    pub(super) async fn sweep_tombstones(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.store.sweep_tombstones(now_ms).await
    }

    // Upstream identities.

    pub(super) async fn upstream_identity(
        &self,
        name: &str,
    ) -> Result<Option<UpstreamInfo>, StoreError> {
        self.store.upstream_identity(name).await
    }

    pub(super) async fn put_upstream_identity(
        &self,
        name: &str,
        identity: &UpstreamInfo,
    ) -> Result<bool, StoreError> {
        self.store.put_upstream_identity(name, identity).await
    }

    pub(super) async fn upstream_tool_headers(
        &self,
        name: &str,
    ) -> Result<Option<ToolHeaders>, StoreError> {
        self.store.upstream_tool_headers(name).await
    }

    pub(super) async fn put_upstream_tool_headers(
        &self,
        name: &str,
        headers: &ToolHeaders,
    ) -> Result<bool, StoreError> {
        self.store.put_upstream_tool_headers(name, headers).await
    }

    /// Whether the store takes writes (a failed write or flush turns it off until a
    /// probe gets through).
    pub(super) fn healthy(&self) -> bool {
        self.store.healthy()
    }

    // Read marks (src/tasks/seen.rs).

    pub(super) fn note_seen(&self, rec: &TaskRecord) {
        self.seen.note_read(rec);
    }

    pub(super) async fn write_seen(&self) {
        self.seen.write(&*self.store).await;
    }

    pub(super) fn spawn_seen_marker(&self) {
        self.seen.spawn_marker(self.store.clone());
    }

    // The change stream of this replica's subscribers.

    pub(super) fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    pub(super) fn changed_here(&self, task_id: &str) {
        self.terminal.forget(task_id);
        let _ = self.changes.send(Change::Task(task_id.to_string()));
    }

    pub(super) fn resync_here(&self) {
        self.terminal.clear();
        let _ = self.changes.send(Change::Resync);
    }
}
