//! Removing every trace of one tenant (docs/design.md §27 "Tenant purge"), for the
//! operator API: fence the tenant on this replica (no new call or task of it starts
//! here), cancel its live tasks as an operator's cancel does (the upstream gets
//! `notifications/cancelled`) and its inline calls in flight, wait for them to end,
//! then remove its data from the store in bounded batches, each flushed before the
//! next, and forget what this replica holds of it in memory. One audit line when it
//! starts and one when it ends, with counts only: never a task's contents.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::admin::MAX_PAGE;
use super::engine::Engine;
use super::methods::cancel_record;
use super::replica::changed;
use super::tenant_calls::Fence;
use crate::store::{OwnerCursor, PurgeCounts, StoreError, TaskStatus};

/// The most stored items one batch removes: each batch is one short store operation
/// (one transaction on PostgreSQL), flushed before the next.
pub const PURGE_BATCH: usize = 500;

/// How long a purge waits for the tenant's cancelled calls to end before it removes
/// the data anyway (a call that ignores its cancel only delays the upstream's side).
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// What a purge did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PurgeReport {
    pub tenant: String,
    /// Live tasks cancelled before their data went.
    pub cancelled_tasks: u64,
    /// Upstream calls and task creations of the tenant in flight on this replica when
    /// the purge cancelled them (inline calls among them).
    pub cancelled_calls: u64,
    /// What the store removed, by kind.
    pub removed: PurgeCounts,
    /// Store batches run.
    pub batches: u64,
    pub duration_ms: u64,
}

/// Why a purge did not finish.
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    #[error("a purge of tenant {0:?} is already running on this replica")]
    Running(String),
    #[error("the purge stopped after {batches} batches: {source}")]
    Store {
        batches: u64,
        #[source]
        source: StoreError,
    },
}

/// Purge `tenant` for `operator` (named in the audit lines). Safe to run again,
/// also after a failure or a crash: each run finds what is left.
pub(super) async fn admin_purge(
    engine: &Engine,
    tenant: &str,
    operator: &str,
) -> Result<PurgeReport, PurgeError> {
    let started = Instant::now();
    let Some(fence) = engine.tenant_calls.fence(tenant) else {
        return Err(PurgeError::Running(tenant.to_string()));
    };
    tracing::warn!(
        target: "taskgate::audit",
        operator,
        tenant,
        batch = PURGE_BATCH,
        "tenant purge started"
    );
    let mut report = PurgeReport {
        tenant: tenant.to_string(),
        ..PurgeReport::default()
    };
    let outcome = purge_fenced(engine, &fence, operator, &mut report).await;
    report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let r = &report.removed;
    let (end, error) = match &outcome {
        Ok(()) => ("finished", String::new()),
        Err(e) => ("failed; run it again to finish", e.to_string()),
    };
    tracing::warn!(
        target: "taskgate::audit",
        operator,
        tenant,
        cancelled_tasks = report.cancelled_tasks,
        cancelled_calls = report.cancelled_calls,
        tasks = r.tasks,
        routes = r.routes,
        idempotency_claims = r.idempotency_claims,
        tombstones = r.tombstones,
        read_marks = r.read_marks,
        sessions = r.sessions,
        relays = r.relays,
        index_entries = r.index_entries,
        batches = report.batches,
        duration_ms = report.duration_ms,
        error,
        "tenant purge {end}"
    );
    drop(fence);
    match outcome {
        Ok(()) => Ok(report),
        Err(source) => Err(PurgeError::Store {
            batches: report.batches,
            source,
        }),
    }
}

async fn purge_fenced(
    engine: &Engine,
    fence: &Fence<'_>,
    operator: &str,
    report: &mut PurgeReport,
) -> Result<(), StoreError> {
    let tenant = report.tenant.clone();
    report.cancelled_tasks = cancel_live_tasks(engine, &tenant, operator).await?;
    report.cancelled_calls = fence.cancel() as u64;
    let deadline = Instant::now() + DRAIN_WAIT;
    while fence.in_flight() > 0 {
        if Instant::now() >= deadline {
            tracing::warn!(
                tenant,
                in_flight = fence.in_flight(),
                "calls of the purged tenant did not end after their cancel; purging anyway"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        let batch = engine.tasks.purge_tenant(&tenant, PURGE_BATCH).await?;
        engine.tasks.flush().await?;
        report.batches += 1;
        report.removed.add(&batch.counts);
        // Subscribers read these tasks again and find nothing; this replica's
        // streams of the sessions end.
        for t in &batch.tasks {
            changed(&engine.tasks, &engine.replica, &t.task_id);
        }
        engine.sessions.purged(&batch.sessions);
        if !batch.more {
            return Ok(());
        }
    }
}

/// Cancel each of the tenant's working and input-required tasks as an operator
/// does (`admin_cancel`): terminal and durable first, then the call stopped here
/// or relayed to the replica holding it.
async fn cancel_live_tasks(
    engine: &Engine,
    tenant: &str,
    operator: &str,
) -> Result<u64, StoreError> {
    let message = format!("cancelled by operator {operator}: tenant purge");
    let mut cancelled = 0u64;
    for status in [TaskStatus::Working, TaskStatus::InputRequired] {
        // A cancelled task leaves this status's index; the cursor steps past any
        // that stays (one that finished meanwhile is terminal anyway).
        let mut after: Option<OwnerCursor> = None;
        loop {
            let page = engine
                .tasks
                .list_tenant(tenant, status, after.as_ref(), MAX_PAGE)
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            after = Some(OwnerCursor {
                created_at_ms: last.created_at_ms,
                task_id: last.task_id.clone(),
            });
            for rec in &page {
                if cancel_record(engine, rec, &message).await? == TaskStatus::Cancelled {
                    cancelled += 1;
                }
            }
        }
    }
    Ok(cancelled)
}
