//! The in-memory [`TaskStore`]: everything in one mutex-guarded set of maps, nothing
//! kept across a restart. For tests and demos; it follows the same contract as the
//! durable backends (the contract suite in `contract.rs` runs against it), except that
//! "durable" means "until the process ends", so [`TaskStore::flush`] resolves at once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use rand::RngCore;

use super::idempotency;
use super::purge::Budget;
use super::{
    Corruption, Created, Expired, IdempotencyEntry, Owned, OwnedSession, OwnerCursor, Purged,
    PurgedTask, RequestRoute, SCHEMA_VERSION, SessionCreated, SessionRecord, SessionUpdate,
    StoreError, StoredIdentity, StoredToolHeaders, TaskRecord, TaskStatus, TaskStore, TenantCount,
    Tombstone, Update,
};
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use futures_util::future::BoxFuture;

#[derive(Default)]
struct State {
    tasks: HashMap<String, TaskRecord>,
    routes: BTreeMap<String, RequestRoute>,
    idempotency: HashMap<Vec<u8>, IdempotencyEntry>,
    /// The idempotency key each keyed task claimed (moved into its tombstone).
    idem_of: HashMap<String, Vec<u8>>,
    /// `(expires_at_ms, task_id)`, in expiry order.
    expiry: BTreeSet<(u64, String)>,
    /// The owner index: each principal's tasks per upstream, in creation order.
    owners: BTreeSet<OwnerKey>,
    tombstones: HashMap<String, Tombstone>,
    seen: HashSet<String>,
    identities: HashMap<String, Vec<u8>>,
    tool_headers: HashMap<String, Vec<u8>>,
    secrets: HashMap<String, [u8; 32]>,
    /// Non-terminal tasks per tenant.
    live: HashMap<String, u64>,
    /// 2025-era client sessions by id, and each principal's session ids.
    sessions: HashMap<String, SessionRecord>,
    session_owners: HashMap<(String, String), BTreeSet<String>>,
}

/// An owner index entry: `(tenant, subject, upstream, created_at_ms, task_id)`.
type OwnerKey = (String, String, String, u64, String);

fn owner_key(rec: &TaskRecord) -> OwnerKey {
    (
        rec.tenant.clone(),
        rec.subject.clone(),
        rec.upstream.clone(),
        rec.created_at_ms,
        rec.task_id.clone(),
    )
}

impl State {
    fn names_something(&self, task_id: &str) -> bool {
        self.tasks.contains_key(task_id) || self.tombstones.contains_key(task_id)
    }

    fn live_add(&mut self, tenant: &str) {
        *self.live.entry(tenant.to_string()).or_default() += 1;
    }

    fn live_sub(&mut self, tenant: &str) {
        if let Some(n) = self.live.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.live.remove(tenant);
            }
        }
    }
}

/// See the module documentation.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The state (every change below is applied after its checks, so a panic while
    /// it is held cannot leave it half-written; ARCHITECTURE.md "Locks").
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn create_now(
        &self,
        task: &TaskRecord,
        route: &RequestRoute,
        idempotency_key: Option<&[u8]>,
    ) -> Result<Created, StoreError> {
        let mut s = self.state();
        if s.tasks.contains_key(&task.task_id) {
            return Err(StoreError::Corrupt(
                format!("tasks/{}: a task with this id already exists", task.task_id).into(),
            ));
        }
        if let Some(k) = idempotency_key {
            if let Some(entry) = s.idempotency.get(k)
                && s.names_something(&entry.task_id)
            {
                return Ok(Created::Existing(entry.clone()));
            }
            s.idempotency.insert(
                k.to_vec(),
                IdempotencyEntry {
                    task_id: task.task_id.clone(),
                    args_fingerprint: task.args_fingerprint.clone(),
                },
            );
            s.idem_of.insert(task.task_id.clone(), k.to_vec());
        }
        let mut rec = task.clone();
        rec.v = SCHEMA_VERSION;
        s.routes.insert(route.route_id.clone(), route.clone());
        s.expiry.insert((rec.expires_at_ms, rec.task_id.clone()));
        s.owners.insert(owner_key(&rec));
        if !rec.status.is_terminal() {
            s.live_add(&rec.tenant);
        }
        s.tasks.insert(rec.task_id.clone(), rec);
        Ok(Created::New)
    }

    fn update_now(
        &self,
        task_id: &str,
        f: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let mut s = self.state();
        let Some(old) = s.tasks.get(task_id).cloned() else {
            return Ok(None);
        };
        let mut rec = old.clone();
        if !f(&mut rec) {
            return Ok(Some(old));
        }
        rec.task_id = task_id.to_string();
        rec.v = SCHEMA_VERSION;
        if rec.expires_at_ms != old.expires_at_ms {
            s.expiry.remove(&(old.expires_at_ms, task_id.to_string()));
            s.expiry.insert((rec.expires_at_ms, task_id.to_string()));
        }
        let (was_at, is_at) = (owner_key(&old), owner_key(&rec));
        if was_at != is_at {
            s.owners.remove(&was_at);
            s.owners.insert(is_at);
        }
        let (was, is) = (!old.status.is_terminal(), !rec.status.is_terminal());
        if was && (!is || old.tenant != rec.tenant) {
            s.live_sub(&old.tenant);
        }
        if is && (!was || old.tenant != rec.tenant) {
            s.live_add(&rec.tenant);
        }
        s.tasks.insert(task_id.to_string(), rec.clone());
        Ok(Some(rec))
    }

    fn expire_now(&self, task_id: &str, now_ms: u64, tombstone_until_ms: u64) -> Option<Expired> {
        let mut s = self.state();
        let due = s.tasks.get(task_id)?.expires_at_ms <= now_ms;
        if !due {
            return None;
        }
        let rec = s.tasks.remove(task_id)?;
        let idx = s.idem_of.remove(task_id);
        s.tombstones.insert(
            task_id.to_string(),
            Tombstone {
                v: SCHEMA_VERSION,
                task_id: task_id.to_string(),
                tenant: rec.tenant.clone(),
                subject: rec.subject.clone(),
                idempotency_index_key: idx,
                expires_at_ms: tombstone_until_ms,
            },
        );
        s.expiry.remove(&(rec.expires_at_ms, task_id.to_string()));
        s.owners.remove(&owner_key(&rec));
        let seen = s.seen.remove(task_id);
        if !rec.status.is_terminal() {
            s.live_sub(&rec.tenant);
        }
        Some(Expired { record: rec, seen })
    }

    fn list_owned_now(
        &self,
        tenant: &str,
        subject: &str,
        upstream: &str,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Vec<TaskRecord> {
        let s = self.state();
        let at = |created_at_ms: u64, task_id: &str| -> OwnerKey {
            (
                tenant.to_string(),
                subject.to_string(),
                upstream.to_string(),
                created_at_ms,
                task_id.to_string(),
            )
        };
        let from = match after {
            Some(c) => Bound::Excluded(at(c.created_at_ms, &c.task_id)),
            None => Bound::Included(at(0, "")),
        };
        s.owners
            .range((from, Bound::Unbounded))
            .take_while(|(t, sub, up, _, _)| t == tenant && sub == subject && up == upstream)
            .filter_map(|(_, _, _, _, id)| s.tasks.get(id).cloned())
            .take(limit)
            .collect()
    }

    /// A scan of every task: this store is a test seam, where that costs nothing.
    fn list_tenant_now(
        &self,
        tenant: &str,
        status: TaskStatus,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Vec<TaskRecord> {
        let s = self.state();
        let mut page: Vec<&TaskRecord> = s
            .tasks
            .values()
            .filter(|r| r.tenant == tenant && r.status == status)
            .filter(|r| {
                after.is_none_or(|c| {
                    (r.created_at_ms, r.task_id.as_bytes())
                        > (c.created_at_ms, c.task_id.as_bytes())
                })
            })
            .collect();
        page.sort_by(|a, b| {
            (a.created_at_ms, a.task_id.as_bytes()).cmp(&(b.created_at_ms, b.task_id.as_bytes()))
        });
        page.into_iter().take(limit).cloned().collect()
    }

    fn tenant_counts_now(&self) -> Vec<TenantCount> {
        let s = self.state();
        let mut counts: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        for r in s.tasks.values() {
            *counts
                .entry((r.tenant.clone(), r.status.as_str()))
                .or_insert(0) += 1;
        }
        counts
            .into_iter()
            .filter_map(|((tenant, status), tasks)| {
                Some(TenantCount {
                    tenant,
                    status: TaskStatus::parse(status)?,
                    tasks,
                })
            })
            .collect()
    }

    fn sweep_now(&self, now_ms: u64) -> usize {
        let mut s = self.state();
        let due: Vec<Tombstone> = s
            .tombstones
            .values()
            .filter(|t| t.expires_at_ms <= now_ms)
            .cloned()
            .collect();
        for t in &due {
            if let Some(k) = &t.idempotency_index_key
                && s.idempotency.get(k).is_some_and(|e| e.task_id == t.task_id)
            {
                s.idempotency.remove(k);
            }
            if !s.tasks.contains_key(&t.task_id) {
                s.seen.remove(&t.task_id);
            }
            s.tombstones.remove(&t.task_id);
        }
        due.len()
    }

    fn create_session_now(
        &self,
        session: &SessionRecord,
        cap: usize,
    ) -> Result<SessionCreated, StoreError> {
        let mut s = self.state();
        if s.sessions.contains_key(&session.session_id) {
            return Err(StoreError::Corrupt(
                format!(
                    "sessions/{}: a session with this id already exists",
                    session.session_id
                )
                .into(),
            ));
        }
        let owner = (session.tenant.clone(), session.subject.clone());
        if let Some(ids) = s.session_owners.get(&owner)
            && ids.len() >= cap
        {
            let held = ids
                .iter()
                .filter_map(|id| s.sessions.get(id))
                .map(|r| (r.session_id.clone(), r.last_seen_at_ms))
                .collect();
            return Ok(SessionCreated::AtCap(held));
        }
        let mut rec = session.clone();
        rec.v = SCHEMA_VERSION;
        s.session_owners
            .entry(owner)
            .or_default()
            .insert(rec.session_id.clone());
        s.sessions.insert(rec.session_id.clone(), rec);
        Ok(SessionCreated::New)
    }

    fn update_session_now(
        &self,
        session_id: &str,
        f: &mut dyn FnMut(&mut SessionRecord) -> bool,
    ) -> Option<SessionRecord> {
        let mut s = self.state();
        let old = s.sessions.get(session_id)?.clone();
        let mut rec = old.clone();
        if !f(&mut rec) {
            return Some(old);
        }
        rec.v = SCHEMA_VERSION;
        rec.session_id = old.session_id;
        rec.tenant = old.tenant;
        rec.subject = old.subject;
        s.sessions.insert(session_id.to_string(), rec.clone());
        Some(rec)
    }

    /// Delete `session_id` if `due` says so of its record.
    fn delete_session_now(&self, session_id: &str, due: impl Fn(&SessionRecord) -> bool) -> bool {
        let mut s = self.state();
        if !s.sessions.get(session_id).is_some_and(due) {
            return false;
        }
        let Some(rec) = s.sessions.remove(session_id) else {
            return false;
        };
        let owner = (rec.tenant, rec.subject);
        if let Some(ids) = s.session_owners.get_mut(&owner) {
            ids.remove(session_id);
            if ids.is_empty() {
                s.session_owners.remove(&owner);
            }
        }
        true
    }

    fn put_identity_now(&self, name: &str, identity: &UpstreamInfo) -> Result<bool, StoreError> {
        // Compared as the serialized text, like a backend that stores bytes: key order
        // and number text count.
        let bytes = serde_json::to_vec(&StoredIdentity::current(identity))
            .map_err(|e| corrupt_identity(name, e))?;
        let mut s = self.state();
        if s.identities.get(name) == Some(&bytes) {
            return Ok(false);
        }
        s.identities.insert(name.to_string(), bytes);
        Ok(true)
    }

    fn put_tool_headers_now(&self, name: &str, headers: &ToolHeaders) -> Result<bool, StoreError> {
        let bytes = serde_json::to_vec(&StoredToolHeaders::current(headers))
            .map_err(|e| corrupt_tool_headers(name, e))?;
        let mut s = self.state();
        if s.tool_headers.get(name) == Some(&bytes) {
            return Ok(false);
        }
        s.tool_headers.insert(name.to_string(), bytes);
        Ok(true)
    }
}

/// A future that is ready at once with `v` (every operation here is in memory).
impl MemoryStore {
    /// Routes, then tasks with everything of theirs, then tombstones, claims and
    /// sessions, each while the batch's budget lasts.
    fn purge_now(&self, tenant: &str, limit: usize) -> Purged {
        let mut s = self.state();
        let mut out = Purged::default();
        let mut budget = Budget::new(limit);
        let routes: Vec<String> = s
            .routes
            .values()
            .filter(|r| r.tenant == tenant)
            .map(|r| r.route_id.clone())
            .collect();
        for id in routes {
            if !budget.take() {
                break;
            }
            s.routes.remove(&id);
            out.counts.routes += 1;
        }
        let tasks: Vec<String> = s
            .tasks
            .values()
            .filter(|r| r.tenant == tenant)
            .map(|r| r.task_id.clone())
            .collect();
        for id in tasks {
            if !budget.take() {
                break;
            }
            let Some(rec) = s.tasks.remove(&id) else {
                continue;
            };
            let c = &mut out.counts;
            c.tasks += 1;
            c.index_entries += u64::from(s.expiry.remove(&(rec.expires_at_ms, id.clone())));
            c.index_entries += u64::from(s.owners.remove(&owner_key(&rec)));
            if let Some(k) = s.idem_of.remove(&id) {
                c.index_entries += 1;
                if s.idempotency.get(&k).is_some_and(|e| e.task_id == id) {
                    s.idempotency.remove(&k);
                    c.idempotency_claims += 1;
                }
            }
            c.read_marks += u64::from(s.seen.remove(&id));
            if !rec.status.is_terminal() {
                s.live_sub(tenant);
            }
            out.tasks.push(PurgedTask {
                task_id: id,
                status: rec.status,
                created_at_ms: rec.created_at_ms,
            });
        }
        let tombs: Vec<Tombstone> = s
            .tombstones
            .values()
            .filter(|t| t.tenant == tenant)
            .cloned()
            .collect();
        for t in tombs {
            if !budget.take() {
                break;
            }
            if let Some(k) = &t.idempotency_index_key
                && s.idempotency.get(k).is_some_and(|e| e.task_id == t.task_id)
            {
                s.idempotency.remove(k);
                out.counts.idempotency_claims += 1;
            }
            if !s.tasks.contains_key(&t.task_id) {
                out.counts.read_marks += u64::from(s.seen.remove(&t.task_id));
            }
            s.tombstones.remove(&t.task_id);
            out.counts.tombstones += 1;
        }
        let prefix = idempotency::tenant_prefix(tenant);
        let claims: Vec<Vec<u8>> = s
            .idempotency
            .keys()
            .filter(|k| idempotency::belongs_to(k, &prefix))
            .cloned()
            .collect();
        for k in claims {
            if !budget.take() {
                break;
            }
            s.idempotency.remove(&k);
            out.counts.idempotency_claims += 1;
        }
        let owners: Vec<(String, String)> = s
            .session_owners
            .keys()
            .filter(|(t, _)| t == tenant)
            .cloned()
            .collect();
        for owner in owners {
            let ids: Vec<String> = s
                .session_owners
                .get(&owner)
                .map(|ids| ids.iter().cloned().collect())
                .unwrap_or_default();
            for id in ids {
                if !budget.take() {
                    break;
                }
                if s.sessions.remove(&id).is_some() {
                    out.counts.sessions += 1;
                    out.sessions.push(id.clone());
                }
                if let Some(held) = s.session_owners.get_mut(&owner) {
                    held.remove(&id);
                    if held.is_empty() {
                        s.session_owners.remove(&owner);
                    }
                }
            }
        }
        out.more = budget.exhausted;
        out
    }
}

fn corrupt_identity(name: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(Corruption::from(format!("upstream_identity/{name}: {e}")).caused_by(e))
}

fn corrupt_tool_headers(name: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(Corruption::from(format!("upstream_tool_headers/{name}: {e}")).caused_by(e))
}

fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

impl TaskStore for MemoryStore {
    fn create<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<Created, StoreError>> {
        ready(self.create_now(task, route, idempotency_key))
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        ready(Ok(()))
    }

    fn get<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        ready(Ok(self.state().tasks.get(task_id).cloned()))
    }

    fn update<'a>(
        &'a self,
        task_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        ready(self.update_now(task_id, f))
    }

    fn put_route<'a>(&'a self, route: &'a RequestRoute) -> BoxFuture<'a, Result<(), StoreError>> {
        self.state()
            .routes
            .insert(route.route_id.clone(), route.clone());
        ready(Ok(()))
    }

    fn remove_route<'a>(&'a self, route_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.state().routes.remove(route_id);
        ready(Ok(()))
    }

    fn routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        ready(Ok(self.state().routes.values().cloned().collect()))
    }

    fn held_routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        self.routes()
    }

    fn idempotency_get<'a>(
        &'a self,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<IdempotencyEntry>, StoreError>> {
        let s = self.state();
        let entry = s
            .idempotency
            .get(key)
            .filter(|e| s.names_something(&e.task_id))
            .cloned();
        ready(Ok(entry))
    }

    fn count_by_status(&self) -> BoxFuture<'_, Result<Vec<(TaskStatus, u64)>, StoreError>> {
        let mut counts: Vec<(TaskStatus, u64)> = Vec::new();
        for rec in self.state().tasks.values() {
            match counts.iter_mut().find(|(s, _)| *s == rec.status) {
                Some((_, n)) => *n += 1,
                None => counts.push((rec.status, 1)),
            }
        }
        ready(Ok(counts))
    }

    fn expired(&self, now_ms: u64, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let ids = self
            .state()
            .expiry
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect();
        ready(Ok(ids))
    }

    fn expire<'a>(
        &'a self,
        task_id: &'a str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Expired>, StoreError>> {
        ready(Ok(self.expire_now(task_id, now_ms, tombstone_until_ms)))
    }

    fn mark_seen<'a>(&'a self, task_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut s = self.state();
        for id in task_ids {
            if s.tasks.contains_key(id) {
                s.seen.insert(id.clone());
            }
        }
        ready(Ok(()))
    }

    fn lookup_owned<'a>(
        &'a self,
        task_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<Owned, StoreError>> {
        let s = self.state();
        let owns = |t: &str, s: &str| t == tenant && s == subject;
        let found = match (s.tasks.get(task_id), s.tombstones.get(task_id)) {
            (Some(rec), _) if owns(&rec.tenant, &rec.subject) => {
                Owned::Record(Box::new(rec.clone()))
            }
            (None, Some(t)) if owns(&t.tenant, &t.subject) => Owned::Expired,
            _ => Owned::Unknown,
        };
        ready(Ok(found))
    }

    fn tombstone<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, StoreError>> {
        ready(Ok(self.state().tombstones.get(task_id).cloned()))
    }

    fn list_owned<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        upstream: &'a str,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        ready(Ok(
            self.list_owned_now(tenant, subject, upstream, after, limit)
        ))
    }

    fn list_tenant<'a>(
        &'a self,
        tenant: &'a str,
        status: TaskStatus,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        ready(Ok(self.list_tenant_now(tenant, status, after, limit)))
    }

    fn tenant_counts(&self) -> BoxFuture<'_, Result<Vec<TenantCount>, StoreError>> {
        ready(Ok(self.tenant_counts_now()))
    }

    fn sweep_tombstones(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        ready(Ok(self.sweep_now(now_ms)))
    }

    fn live_tasks<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        ready(Ok(self.state().live.get(tenant).copied().unwrap_or(0)))
    }

    fn upstream_identity<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamInfo>, StoreError>> {
        let r = match self.state().identities.get(name) {
            None => Ok(None),
            Some(b) => serde_json::from_slice(b)
                .map(Some)
                .map_err(|e| corrupt_identity(name, e)),
        };
        ready(r)
    }

    fn put_upstream_identity<'a>(
        &'a self,
        name: &'a str,
        identity: &'a UpstreamInfo,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        ready(self.put_identity_now(name, identity))
    }

    fn upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ToolHeaders>, StoreError>> {
        let r = match self.state().tool_headers.get(name) {
            None => Ok(None),
            Some(b) => serde_json::from_slice::<StoredToolHeaders>(b)
                .map(|stored| Some(stored.tools))
                .map_err(|e| corrupt_tool_headers(name, e)),
        };
        ready(r)
    }

    fn put_upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
        headers: &'a ToolHeaders,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        ready(self.put_tool_headers_now(name, headers))
    }

    fn secret<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<[u8; 32], StoreError>> {
        let mut s = self.state();
        let secret = *s.secrets.entry(name.to_string()).or_insert_with(|| {
            let mut fresh = [0u8; 32];
            rand::rng().fill_bytes(&mut fresh);
            fresh
        });
        ready(Ok(secret))
    }

    fn healthy(&self) -> bool {
        true
    }

    fn create_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        cap: usize,
    ) -> BoxFuture<'a, Result<SessionCreated, StoreError>> {
        ready(self.create_session_now(session, cap))
    }

    fn session_owned<'a>(
        &'a self,
        session_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<OwnedSession, StoreError>> {
        let found = match self.state().sessions.get(session_id) {
            Some(rec) if rec.tenant == tenant && rec.subject == subject => {
                OwnedSession::Record(Box::new(rec.clone()))
            }
            _ => OwnedSession::Unknown,
        };
        ready(Ok(found))
    }

    fn update_session<'a>(
        &'a self,
        session_id: &'a str,
        f: SessionUpdate<'a>,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, StoreError>> {
        ready(Ok(self.update_session_now(session_id, f)))
    }

    fn delete_session<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        ready(Ok(self.delete_session_now(session_id, |_| true)))
    }

    fn expire_session<'a>(
        &'a self,
        session_id: &'a str,
        last_seen_before_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let gone = self.delete_session_now(session_id, |r| r.last_seen_at_ms < last_seen_before_ms);
        ready(Ok(gone))
    }

    fn idle_sessions(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let mut idle: Vec<(u64, String)> = self
            .state()
            .sessions
            .values()
            .filter(|r| r.last_seen_at_ms < before_ms)
            .map(|r| (r.last_seen_at_ms, r.session_id.clone()))
            .collect();
        idle.sort();
        ready(Ok(idle.into_iter().take(limit).map(|(_, id)| id).collect()))
    }

    fn count_sessions(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        ready(Ok(self.state().sessions.len() as u64))
    }

    fn purge_tenant<'a>(
        &'a self,
        tenant: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Purged, StoreError>> {
        ready(Ok(self.purge_now(tenant, limit)))
    }
}
