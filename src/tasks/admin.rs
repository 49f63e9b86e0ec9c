//! What the operator API asks of the engine (docs/design.md §24 "Operations"): a
//! tenant's tasks by status, one task whoever owns it, a cancel by an operator, the
//! per-tenant counts, and draining this replica. Metadata only: nothing here returns
//! a task's arguments, result, error or input requests (the front renders
//! [`TaskSummary`], never the record).

use std::sync::atomic::{AtomicBool, Ordering};

use super::engine::Engine;
use super::methods::cancel_record;
use super::repo::TaskRepo;
use crate::store::{OwnerCursor, StoreError, TaskRecord, TaskStatus, now_ms};

/// The longest page the operator API serves.
pub const MAX_PAGE: usize = 500;

/// A list request: the indexed keys (`tenant`, `status`) choose the page; the other
/// filters apply within it, so a page may hold fewer than `limit` tasks while more
/// follow (`next` says where).
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub tenant: String,
    pub status: Option<TaskStatus>,
    pub upstream: Option<String>,
    pub tool: Option<String>,
    /// Only tasks created at least this long ago.
    pub min_age_ms: Option<u64>,
    pub after: Option<OwnerCursor>,
    pub limit: usize,
}

/// The metadata of one task an operator may see.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TaskSummary {
    pub id: String,
    pub status: &'static str,
    pub tool: String,
    pub upstream: String,
    pub tenant: String,
    pub subject: String,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub expires_at_ms: u64,
    pub status_message: Option<String>,
}

impl From<&TaskRecord> for TaskSummary {
    fn from(r: &TaskRecord) -> Self {
        Self {
            id: r.task_id.clone(),
            status: r.status.as_str(),
            tool: r.tool.clone(),
            upstream: r.upstream.clone(),
            tenant: r.tenant.clone(),
            subject: r.subject.clone(),
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.last_updated_at_ms,
            expires_at_ms: r.expires_at_ms,
            status_message: r.status_message.clone(),
        }
    }
}

/// One page of a list: the tasks that passed every filter, and where the next page
/// starts (`None`: the index holds no more).
#[derive(Debug, Clone)]
pub struct TaskPage {
    pub tasks: Vec<TaskSummary>,
    pub next: Option<OwnerCursor>,
}

/// One page of `q.tenant`'s tasks in creation order. Without a status, the five
/// status pages are merged (each read up to `limit` past the cursor): still O(page).
pub(super) async fn admin_list(tasks: &TaskRepo, q: &TaskQuery) -> Result<TaskPage, StoreError> {
    let limit = q.limit.clamp(1, MAX_PAGE);
    let statuses: &[TaskStatus] = match &q.status {
        Some(s) => std::slice::from_ref(s),
        None => &TaskStatus::ALL,
    };
    let mut scanned = Vec::new();
    for status in statuses {
        let page = tasks
            .list_tenant(&q.tenant, *status, q.after.as_ref(), limit)
            .await?;
        scanned.extend(page);
    }
    scanned.sort_by(|a, b| {
        (a.created_at_ms, a.task_id.as_bytes()).cmp(&(b.created_at_ms, b.task_id.as_bytes()))
    });
    scanned.truncate(limit);
    let next = (scanned.len() == limit)
        .then(|| scanned.last())
        .flatten()
        .map(|r| OwnerCursor {
            created_at_ms: r.created_at_ms,
            task_id: r.task_id.clone(),
        });
    let born_by = q.min_age_ms.map(|age| now_ms().saturating_sub(age));
    let tasks = scanned
        .iter()
        .filter(|r| q.upstream.as_ref().is_none_or(|u| &r.upstream == u))
        .filter(|r| q.tool.as_ref().is_none_or(|t| &r.tool == t))
        .filter(|r| born_by.is_none_or(|at| r.created_at_ms <= at))
        .map(TaskSummary::from)
        .collect();
    Ok(TaskPage { tasks, next })
}

/// One task, whoever owns it.
pub(super) async fn admin_show(
    tasks: &TaskRepo,
    task_id: &str,
) -> Result<Option<TaskSummary>, StoreError> {
    Ok(tasks.get(task_id).await?.as_ref().map(TaskSummary::from))
}

/// Cancel a task for an operator: the same durable cancel as the owner's (the upstream
/// gets `notifications/cancelled`), with a status message naming the operator, and an
/// audit line. `None` when no such task exists.
pub(super) async fn admin_cancel(
    engine: &Engine,
    task_id: &str,
    operator: &str,
) -> Result<Option<TaskSummary>, StoreError> {
    let Some(rec) = engine.tasks.get(task_id).await? else {
        return Ok(None);
    };
    let before = rec.status;
    let after = cancel_record(engine, &rec, &format!("cancelled by operator {operator}")).await?;
    tracing::warn!(
        target: "taskgate::audit",
        operator,
        task = task_id,
        tenant = %rec.tenant,
        subject = %rec.subject,
        tool = %rec.tool,
        from = before.as_str(),
        to = after.as_str(),
        "operator cancelled a task"
    );
    Ok(engine
        .tasks
        .get(task_id)
        .await?
        .as_ref()
        .map(TaskSummary::from))
}

/// Stop admitting new upstream calls (or admit them again), for a rolling deploy: the
/// task plane is still served, and the probes say "not ready" so the edge takes this
/// replica out.
pub(super) fn set_drained(drained: &AtomicBool, on: bool, operator: &str) {
    let was = drained.swap(on, Ordering::SeqCst);
    if was != on {
        tracing::warn!(
            target: "taskgate::audit",
            operator,
            drained = on,
            "operator {} this replica",
            if on { "drained" } else { "undrained" }
        );
    }
}

/// Whether an operator drained this replica.
pub(super) fn drained(drained: &AtomicBool) -> bool {
    drained.load(Ordering::Relaxed)
}
