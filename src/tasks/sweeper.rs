//! Expiry (docs/design.md §11 "Expiry"), outcomes nobody collected (§23 "Outcomes
//! nobody collected") and restart recovery (§10 "Restart").

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Engine;
use super::driver::{conclude, fail};
use crate::protocol::RpcError;
use crate::store::{StoreError, TaskRecord, TaskStatus, now_ms};

impl Engine {
    /// Resolve request routes left by a previous process: their calls are gone, so
    /// their tasks fail with a reason; nothing stays `working` forever.
    pub async fn recover(&self) -> Result<usize, StoreError> {
        let routes = self.store.routes().await?;
        let mut failed = 0;
        for route in &routes {
            if let Some(task_id) = &route.task_id {
                let err = RpcError::internal("gateway restarted while the call was in flight")
                    .with_data(json!({ "upstream": route.upstream }));
                let retention = self.cfg.tasks.result_retention_ms;
                let r = self
                    .update_task(task_id, &mut |rec| {
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
            self.store.remove_route(&route.route_id).await?;
        }
        self.flush().await?;
        Ok(failed)
    }

    /// One sweep: expire tasks past their ttl (stopping their calls, leaving
    /// owner-only tombstones, counting outcomes nobody read) and drop old tombstones.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        // Reads still waiting in the marker land first: a task read just before its
        // expiry is not counted as unread.
        self.write_seen().await;
        let now = now_ms();
        let tomb_until = now + self.cfg.store.tombstone_ttl_ms;
        let mut n = 0;
        loop {
            let ids = self.store.expired(now, 512).await?;
            if ids.is_empty() {
                break;
            }
            for id in &ids {
                // Only a task still due is expired (an update may have extended it
                // since it was listed); its call, if any, stops then.
                if let Some(gone) = self.expire_task(id, now, tomb_until).await? {
                    self.stop_call(id).await;
                    self.changed(id);
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
        self.store.sweep_tombstones(now).await?;
        // Calls of replicas that lost their lease (docs/design.md §18).
        match self.take_over().await {
            Ok(0) => {}
            Ok(t) => tracing::warn!(tasks = t, "took over the calls of a lost replica"),
            Err(e) => tracing::error!(error = %e, "taking over a lost replica's calls failed"),
        }
        Ok(n)
    }

    pub fn spawn_sweeper(self: &Arc<Self>, shutdown: CancellationToken) {
        let engine = self.clone();
        let every = Duration::from_millis(self.cfg.store.sweep_interval_ms.max(100));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(every) => {}
                }
                match engine.sweep().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(expired = n, "expired tasks swept"),
                    Err(e) => tracing::error!(error = %e, "task sweep failed"),
                }
            }
        });
    }
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
            let error = rec.error.as_ref();
            let code = error.and_then(|e| e.get("code")).and_then(|c| c.as_i64());
            let message = error
                .and_then(|e| e.get("message"))
                .and_then(|m| m.as_str())
                .unwrap_or_default();
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
