//! Expiry (docs/design.md §11 "Expiry"), outcomes nobody collected (§23 "Outcomes
//! nobody collected"), idle 2025-era sessions (§22 "Clients of the 2025 era") and
//! restart recovery (§10 "Restart").

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::engine::Engine;
use super::follow::reattach;
use super::replica::{changed, stop_call, take_over};
use super::terminal::{conclude, conclude_at, fail};
use crate::config::as_millis;
use crate::protocol::RpcError;
use crate::protocol::task_shapes::ErrorObject;
use crate::store::{OPERATION_LIMIT, StoreError, TaskRecord, TaskStatus, now_ms};
use crate::upstream::UpstreamSet;

/// Why the orphan sweep failed a task.
const ORPHANED: &str = "the call behind this task is no longer running (orphaned route)";

/// Why `taskgate store migrate` failed a task (docs/design.md §27 "Moving a sled store
/// to PostgreSQL").
pub const MOVED: &str = "the call was in flight when the task store moved to PostgreSQL; \
     whether it ran upstream is unknown";

/// Fail `rec`, whose call was in flight when its store moved to PostgreSQL, as
/// start-up recovery fails a task whose gateway restarted (the same error shape and
/// bookkeeping), with the reason [`MOVED`], at `at_ms`: given the same `at_ms` the
/// record comes out the same, so a rerun of the move can tell it wrote it.
pub fn fail_moved(rec: &mut TaskRecord, retention_ms: u64, at_ms: u64) {
    let err = RpcError::internal(MOVED).with_data(json!({ "upstream": rec.upstream }));
    fail(rec, &err);
    conclude_at(rec, retention_ms, at_ms);
}

/// Resolve request routes left by a previous process: their calls are gone, so
/// their tasks fail with a reason; nothing stays `working` forever.
/// A route that follows an upstream task whose session outlives the gateway is
/// re-attached to it instead (docs/design.md §25): each such task is re-attached
/// exactly once, or failed exactly once.
pub(super) async fn recover(
    engine: &Arc<Engine>,
    upstreams: &Arc<UpstreamSet>,
) -> Result<usize, StoreError> {
    let _ = engine.upstreams.set(upstreams.clone());
    let routes = engine.tasks.routes().await?;
    let mut failed = 0;
    for route in &routes {
        match reattach(engine, upstreams, route).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(route = %route.route_id, error = %e, "re-attaching to an upstream task failed; the task fails");
            }
        }
        if let Some(task_id) = &route.task_id {
            let err = RpcError::internal("gateway restarted while the call was in flight")
                .with_data(json!({ "upstream": route.upstream }));
            let retention = as_millis(engine.cfg.tasks.result_retention);
            let r = engine
                .tasks
                .update(task_id, None, &mut |rec| {
                    if rec.status.is_terminal() {
                        return false;
                    }
                    fail(rec, &err);
                    conclude(rec, retention);
                    true
                })
                .await?;
            if r.is_some() {
                failed += 1;
            }
        }
        engine.tasks.remove_route(&route.route_id).await?;
    }
    engine.tasks.flush().await?;
    Ok(failed)
}

/// Fail the tasks of routes this replica holds but runs no call for (docs/design.md
/// §16 "Durability, store failures and upgrades"): a creation the gateway gave up on
/// whose write landed after all, or a route kept when an outcome could not be recorded. Only routes
/// older than the store's operation limit count, and only the holder sweeps its own
/// routes, each write fenced on the route: every orphan is resolved exactly once.
pub(super) async fn resolve_orphans(engine: &Engine) -> Result<usize, StoreError> {
    if !engine.replica.lease_held() || engine.calls.shutting_down() {
        return Ok(0);
    }
    let limit = u64::try_from(OPERATION_LIMIT.as_millis()).unwrap_or(u64::MAX);
    let cutoff = now_ms().saturating_sub(limit);
    let retention = as_millis(engine.cfg.tasks.result_retention);
    let mut resolved = 0;
    let mut done = Vec::new();
    for route in engine.tasks.held_routes().await? {
        if route.started_at_ms > cutoff {
            continue;
        }
        if let Some(task_id) = &route.task_id {
            if engine.calls.knows(task_id) {
                continue;
            }
            let err = RpcError::internal(ORPHANED).with_data(json!({ "upstream": route.upstream }));
            let mut failed = false;
            let r = engine
                .tasks
                .update(task_id, Some(&route.route_id), &mut |rec| {
                    failed = !rec.status.is_terminal();
                    if failed {
                        fail(rec, &err);
                        conclude(rec, retention);
                    }
                    failed
                })
                .await;
            match r {
                Ok(_) => {}
                // The route is no longer this seat's: its new holder resolves it.
                Err(StoreError::Fenced) => continue,
                Err(e) => {
                    tracing::error!(task = %task_id, error = %e, "failing an orphaned task failed; its route stays");
                    continue;
                }
            }
            if failed {
                crate::metrics::fail_closed("orphan_resolved");
                tracing::warn!(task = %task_id, upstream = %route.upstream, "{ORPHANED}: task failed");
                changed(&engine.tasks, &engine.replica, task_id);
                resolved += 1;
            }
        }
        done.push(route.route_id);
    }
    // The failures are durable before their routes go, or a crash in between would
    // leave a `working` task with nothing to resolve it.
    if resolved > 0 {
        engine.tasks.flush().await?;
    }
    for route_id in &done {
        engine.tasks.remove_route(route_id).await?;
    }
    Ok(resolved)
}

/// One sweep: expire tasks past their ttl (stopping their calls, leaving
/// owner-only tombstones, counting outcomes nobody read), drop old tombstones and
/// close idle legacy sessions.
pub(super) async fn sweep(engine: &Arc<Engine>) -> Result<usize, StoreError> {
    let tasks = &engine.tasks;
    // Reads still waiting in the marker land first: a task read just before its
    // expiry is not counted as unread.
    tasks.write_seen().await;
    let now = now_ms();
    let tomb_until = now + as_millis(engine.cfg.store.tombstone_ttl);
    let mut n = 0;
    loop {
        let ids = tasks.expired(now, 512).await?;
        if ids.is_empty() {
            break;
        }
        for id in &ids {
            // Only a task still due is expired (an update may have extended it
            // since it was listed); its call, if any, stops then.
            if let Some(gone) = tasks.expire(id, now, tomb_until).await? {
                stop_call(&engine.calls, &engine.replica, id).await;
                changed(tasks, &engine.replica, id);
                if !gone.seen {
                    expired_unread(&gone.record);
                }
                n += 1;
            }
        }
        if ids.len() < 512 {
            break;
        }
    }
    tasks.sweep_tombstones(now).await?;
    match engine.sessions.expire_idle().await {
        Ok(0) => {}
        Ok(s) => tracing::info!(sessions = s, "idle legacy sessions closed"),
        Err(e) => tracing::error!(error = %e, "closing idle legacy sessions failed"),
    }
    match resolve_orphans(engine).await {
        Ok(0) => {}
        Ok(o) => tracing::warn!(tasks = o, "failed the tasks of orphaned routes"),
        Err(e) => tracing::error!(error = %e, "resolving orphaned routes failed"),
    }
    // Calls of replicas that lost their lease (docs/design.md §18).
    match take_over(engine).await {
        Ok(0) => {}
        Ok(t) => tracing::warn!(tasks = t, "took over the calls of a lost replica"),
        Err(e) => tracing::error!(error = %e, "taking over a lost replica's calls failed"),
    }
    Ok(n)
}

pub(super) fn spawn_sweeper(engine: &Arc<Engine>, shutdown: CancellationToken) {
    let engine = engine.clone();
    let every = engine
        .cfg
        .store
        .sweep_interval
        .max(Duration::from_millis(100));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
            match sweep(&engine).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(expired = n, "expired tasks swept"),
                Err(e) => tracing::error!(error = %e, "task sweep failed"),
            }
        }
    });
}

/// A task expired without its owner having received its terminal state (docs/design.md
/// §23 "Outcomes nobody collected", README "Limits and metrics"): count a `completed`
/// or `failed` one and log a failed one, so an operator can alert on failures nobody
/// collected. A task that expired while still running has no outcome to collect, and
/// `cancelled` is only reached by the owner's own `tasks/cancel`: neither is counted.
fn expired_unread(rec: &TaskRecord) {
    match rec.status {
        TaskStatus::Completed => crate::metrics::expired_unread(rec.status.as_str()),
        TaskStatus::Failed => {
            crate::metrics::expired_unread(rec.status.as_str());
            let error = rec
                .error
                .as_ref()
                .map(ErrorObject::read)
                .unwrap_or_default();
            let code = error.code;
            let message = error.message.unwrap_or_default();
            tracing::warn!(
                tenant = %rec.tenant,
                subject = %rec.subject,
                upstream = %rec.upstream,
                tool = %rec.tool,
                task = %rec.task_id,
                error_code = code,
                error_message = %message,
                "failed task expired unread: nobody collected its error"
            );
        }
        TaskStatus::Working | TaskStatus::InputRequired | TaskStatus::Cancelled => {}
    }
}
