//! A [`TaskStore`] wrapper for engine tests: counts the calls of each operation and
//! fails the operations a test names, so error branches (docs/design.md §16
//! "Durability, store failures and upgrades", "Fail closed") and the reads a request
//! makes can be checked in process.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{
    Created, Expired, IdempotencyEntry, Owned, OwnedSession, OwnerCursor, Purged, RequestRoute,
    SessionCreated, SessionRecord, SessionUpdate, StoreError, TaskRecord, TaskStatus, TaskStore,
    TenantCount, Tombstone, Update,
};
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use futures_util::future::BoxFuture;

/// See the module documentation. Operation names are the trait's method names.
pub(crate) struct FaultyStore {
    inner: Arc<dyn TaskStore>,
    failing: Mutex<HashMap<&'static str, Fault>>,
    /// Operations that wait this long after the inner store answered (a slow reply).
    slow: Mutex<HashMap<&'static str, std::time::Duration>>,
    calls: Mutex<HashMap<&'static str, usize>>,
}

/// How the calls of one operation fail.
struct Fault {
    error: StoreError,
    /// Calls left to fail; `None`: every call until healed.
    left: Option<usize>,
    /// The inner store does the call before it fails (a commit whose reply the
    /// connection lost).
    lands: bool,
}

impl FaultyStore {
    pub(crate) fn new(inner: Arc<dyn TaskStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            failing: Mutex::new(HashMap::new()),
            slow: Mutex::new(HashMap::new()),
            calls: Mutex::new(HashMap::new()),
        })
    }

    /// Every later call of `op` fails with `e` (until [`heal`](Self::heal)).
    pub(crate) fn fail(&self, op: &'static str, e: StoreError) {
        self.set_fault(op, e, None, false);
    }

    /// The next `times` calls of `op` fail with `e`; later ones pass.
    pub(crate) fn fail_times(&self, op: &'static str, e: StoreError, times: usize) {
        self.set_fault(op, e, Some(times), false);
    }

    /// The next `times` calls of `op` are done by the inner store but answer `e`: what
    /// a write that landed looks like when the connection closes before its reply.
    pub(crate) fn lose_answers(&self, op: &'static str, e: StoreError, times: usize) {
        self.set_fault(op, e, Some(times), true);
    }

    fn set_fault(&self, op: &'static str, error: StoreError, left: Option<usize>, lands: bool) {
        if left != Some(0) {
            let fault = Fault { error, left, lands };
            self.failing.lock().insert(op, fault);
        }
    }

    pub(crate) fn heal(&self, op: &'static str) {
        self.failing.lock().remove(op);
        self.slow.lock().remove(op);
    }

    /// Every later call of `op` is done by the inner store at once but answers `d`
    /// later: what a slow network round trip looks like to the caller.
    pub(crate) fn answer_late(&self, op: &'static str, d: std::time::Duration) {
        self.slow.lock().insert(op, d);
    }

    fn lateness(&self, op: &'static str) -> Option<std::time::Duration> {
        self.slow.lock().get(op).copied()
    }

    /// Calls of each operation so far (failed ones included).
    pub(crate) fn calls(&self) -> HashMap<&'static str, usize> {
        self.calls.lock().clone()
    }

    /// The error this call of `op` answers, if it fails: before the inner store does
    /// it (`landed` false) or after (`landed` true).
    fn fault(&self, op: &'static str, landed: bool) -> Result<(), StoreError> {
        let mut failing = self.failing.lock();
        let Some(fault) = failing.get_mut(op).filter(|f| f.lands == landed) else {
            return Ok(());
        };
        let error = fault.error.clone();
        if let Some(left) = &mut fault.left {
            *left -= 1;
            if *left == 0 {
                failing.remove(op);
            }
        }
        Err(error)
    }

    fn enter(&self, op: &'static str) -> Result<(), StoreError> {
        *self.calls.lock().entry(op).or_default() += 1;
        self.fault(op, false)
    }
}

/// Count `$op`, fail it if asked, else run `$call` on the inner store.
macro_rules! pass {
    ($self:ident, $op:literal, $call:expr) => {
        Box::pin(async move {
            $self.enter($op)?;
            let r = $call.await;
            if let Some(d) = $self.lateness($op) {
                tokio::time::sleep(d).await;
            }
            $self.fault($op, true)?;
            r
        })
    };
}

impl TaskStore for FaultyStore {
    fn create<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<Created, StoreError>> {
        pass!(
            self,
            "create",
            self.inner.create(task, route, idempotency_key)
        )
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        pass!(self, "flush", self.inner.flush())
    }

    fn get<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        pass!(self, "get", self.inner.get(task_id))
    }

    fn update<'a>(
        &'a self,
        task_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        pass!(self, "update", self.inner.update(task_id, f))
    }

    fn update_fenced<'a>(
        &'a self,
        task_id: &'a str,
        route_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        pass!(
            self,
            "update_fenced",
            self.inner.update_fenced(task_id, route_id, f)
        )
    }

    fn put_route<'a>(&'a self, route: &'a RequestRoute) -> BoxFuture<'a, Result<(), StoreError>> {
        pass!(self, "put_route", self.inner.put_route(route))
    }

    fn remove_route<'a>(&'a self, route_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        pass!(self, "remove_route", self.inner.remove_route(route_id))
    }

    fn routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        pass!(self, "routes", self.inner.routes())
    }

    fn held_routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        pass!(self, "held_routes", self.inner.held_routes())
    }

    fn idempotency_get<'a>(
        &'a self,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<IdempotencyEntry>, StoreError>> {
        pass!(self, "idempotency_get", self.inner.idempotency_get(key))
    }

    fn count_by_status(&self) -> BoxFuture<'_, Result<Vec<(TaskStatus, u64)>, StoreError>> {
        pass!(self, "count_by_status", self.inner.count_by_status())
    }

    fn expired(&self, now_ms: u64, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        pass!(self, "expired", self.inner.expired(now_ms, limit))
    }

    fn expire<'a>(
        &'a self,
        task_id: &'a str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Expired>, StoreError>> {
        pass!(
            self,
            "expire",
            self.inner.expire(task_id, now_ms, tombstone_until_ms)
        )
    }

    fn mark_seen<'a>(&'a self, task_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        pass!(self, "mark_seen", self.inner.mark_seen(task_ids))
    }

    fn tombstone<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, StoreError>> {
        pass!(self, "tombstone", self.inner.tombstone(task_id))
    }

    fn list_owned<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        upstream: &'a str,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        pass!(
            self,
            "list_owned",
            self.inner
                .list_owned(tenant, subject, upstream, after, limit)
        )
    }

    fn list_tenant<'a>(
        &'a self,
        tenant: &'a str,
        status: TaskStatus,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        pass!(
            self,
            "list_tenant",
            self.inner.list_tenant(tenant, status, after, limit)
        )
    }

    fn tenant_counts(&self) -> BoxFuture<'_, Result<Vec<TenantCount>, StoreError>> {
        pass!(self, "tenant_counts", self.inner.tenant_counts())
    }

    fn lookup_owned<'a>(
        &'a self,
        task_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<Owned, StoreError>> {
        pass!(
            self,
            "lookup_owned",
            self.inner.lookup_owned(task_id, tenant, subject)
        )
    }

    fn sweep_tombstones(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        pass!(
            self,
            "sweep_tombstones",
            self.inner.sweep_tombstones(now_ms)
        )
    }

    fn live_tasks<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        pass!(self, "live_tasks", self.inner.live_tasks(tenant))
    }

    fn upstream_identity<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamInfo>, StoreError>> {
        pass!(
            self,
            "upstream_identity",
            self.inner.upstream_identity(name)
        )
    }

    fn put_upstream_identity<'a>(
        &'a self,
        name: &'a str,
        identity: &'a UpstreamInfo,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        pass!(
            self,
            "put_upstream_identity",
            self.inner.put_upstream_identity(name, identity)
        )
    }

    fn upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ToolHeaders>, StoreError>> {
        pass!(
            self,
            "upstream_tool_headers",
            self.inner.upstream_tool_headers(name)
        )
    }

    fn put_upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
        headers: &'a ToolHeaders,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        pass!(
            self,
            "put_upstream_tool_headers",
            self.inner.put_upstream_tool_headers(name, headers)
        )
    }

    fn secret<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<[u8; 32], StoreError>> {
        pass!(self, "secret", self.inner.secret(name))
    }

    fn healthy(&self) -> bool {
        self.inner.healthy()
    }

    fn create_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        cap: usize,
    ) -> BoxFuture<'a, Result<SessionCreated, StoreError>> {
        pass!(
            self,
            "create_session",
            self.inner.create_session(session, cap)
        )
    }

    fn session_owned<'a>(
        &'a self,
        session_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<OwnedSession, StoreError>> {
        pass!(
            self,
            "session_owned",
            self.inner.session_owned(session_id, tenant, subject)
        )
    }

    fn update_session<'a>(
        &'a self,
        session_id: &'a str,
        f: SessionUpdate<'a>,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, StoreError>> {
        pass!(
            self,
            "update_session",
            self.inner.update_session(session_id, f)
        )
    }

    fn delete_session<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        pass!(
            self,
            "delete_session",
            self.inner.delete_session(session_id)
        )
    }

    fn expire_session<'a>(
        &'a self,
        session_id: &'a str,
        last_seen_before_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        pass!(
            self,
            "expire_session",
            self.inner.expire_session(session_id, last_seen_before_ms)
        )
    }

    fn idle_sessions(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        pass!(
            self,
            "idle_sessions",
            self.inner.idle_sessions(before_ms, limit)
        )
    }

    fn count_sessions(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        pass!(self, "count_sessions", self.inner.count_sessions())
    }

    fn purge_tenant<'a>(
        &'a self,
        tenant: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Purged, StoreError>> {
        pass!(self, "purge_tenant", self.inner.purge_tenant(tenant, limit))
    }
}
