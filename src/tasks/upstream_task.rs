//! An upstream's own task from the gateway's side (docs/design.md §25 "The 2025-11-25
//! task dialect", upstream half): a legacy server that advertises
//! `tasks.requests.tools.call` runs a tool that declares `execution.taskSupport` as its
//! task. The gateway calls it task-augmented, writes its own task (bound to the
//! principal, durable before its id goes out) with a request route naming the upstream
//! task and session, and hands the follower (`follow.rs`) to the driver, which records
//! status messages and input requests and settles the task as it does for a promoted
//! call. After a restart or a takeover, `follow.rs` reaches the upstream task again
//! and this file hands it on the same way.
//!
//! These stay `Engine` methods beside the call race (`call.rs`), which starts them,
//! and the driver (`driver.rs`), which they start: both name the engine's surface
//! (`mod.rs`), so a file that `mod.rs` names cannot name them (ARCHITECTURE.md
//! "Layers").

use std::sync::Arc;

use tokio::sync::mpsc;

use super::call::{ToolCall, store_failed_after_send, store_failure};
use super::driver::Driven;
use super::engine::Engine;
use super::events::Pending;
use super::follow::{self, CancelUpstream};
use super::outcome::{Reply, answer_of};
use crate::store::{Created, RequestRoute, StoreError, TaskStatus, now_ms};
use crate::upstream::{TaskChannel, UpstreamError};

/// Why a gateway task followed an upstream task that its restart re-attached to.
pub const REATTACHED: &str =
    "re-attached to the upstream task after a gateway restart or a replica takeover";

impl Engine {
    /// `tools/call` of a tool the upstream runs as its own task (docs/design.md §25),
    /// without an idempotency key: the upstream task first, then the gateway's, whose
    /// route names it from its first write.
    pub(super) async fn upstream_task_call(self: &Arc<Self>, c: ToolCall, fp: String) -> Reply {
        let name = c.upstream.name().to_string();
        let answer = |r| answer_of(c.req.method, &name, &c.server_info, Ok(r));
        let admitted = match follow::admit_task(&self.limits, &c.upstream, &c.principal).await {
            Ok(p) => p,
            Err(e) => return answer(Err(e)),
        };
        let call = super::inputs::upstream_spec(c.req.method, &c.req.params.fwd, false);
        let (channel, created) =
            match follow::create_upstream_task(&self.cfg.tasks, &c.upstream, &c.principal, call)
                .await
            {
                Ok(x) => x,
                Err(r) => return answer(r),
            };
        // From here on the upstream task exists: a failure to record it cancels it.
        let mut orphan = CancelUpstream::new(self, &channel, &created.task_id);
        let mut rec = self.new_record(&c, &c.tool, fp, None);
        if let Some(upstream_ttl) = created.ttl_ms
            && upstream_ttl < rec.ttl_ms
        {
            // The upstream keeps its task (and result) for less: say so in ttlMs.
            rec.ttl_ms = upstream_ttl;
            rec.expires_at_ms = rec.created_at_ms + upstream_ttl;
        }
        if let Some(m) = &created.status_message {
            rec.status_message = Some(m.clone());
        }
        let mut route = self.new_route(&c, &rec.task_id);
        route.upstream_task = Some(follow::route_entry(
            channel.as_ref(),
            &created.task_id,
            &c.req.meta.caps,
            c.answer_undeclared,
        ));
        let _creating = self.calls.creating(&rec.task_id);
        let stored = match self.tasks.create(&rec, &route, None).await {
            Ok(_) => self.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            return store_failed_after_send(&name, e);
        }
        orphan.disarm();
        let poll = follow::bounded_poll(&self.cfg.tasks, created.poll);
        let follower = follow::follower(self, channel, created.task_id, poll, Some(admitted));
        self.launch(&c, &rec, &route, follower, Vec::new());
        crate::metrics::promoted(&name, &rec.task_id, c.client_kind());
        Reply::Task(Arc::new(rec))
    }

    /// A keyed call of an upstream-task tool: the task and its idempotency claim are
    /// written before anything goes upstream, as for every keyed call (docs/design.md
    /// §9), so concurrent duplicates never create two upstream tasks. The call the
    /// driver follows then creates the upstream task and records it in the route
    /// before it polls; a crash in between fails the task once at the next start.
    pub(super) async fn keyed_upstream_task_call(
        self: &Arc<Self>,
        c: ToolCall,
        fp: String,
        idem: Option<String>,
        index: Vec<u8>,
    ) -> Reply {
        let rec = self.new_record(&c, &c.tool, fp.clone(), idem);
        let route = self.new_route(&c, &rec.task_id);
        let _creating = self.calls.creating(&rec.task_id);
        match self.tasks.create(&rec, &route, Some(&index)).await {
            Ok(Created::New) => {}
            Ok(Created::Existing(entry)) => return self.existing(&c, entry, &fp).await,
            Err(e) => return store_failure(e),
        }
        if let Err(e) = self.flush().await {
            return store_failure(e);
        }
        let call = super::inputs::upstream_spec(c.req.method, &c.req.params.fwd, false);
        let (tx, rx) = mpsc::channel(32);
        let engine = self.clone();
        let (up, p) = (c.upstream.clone(), c.principal.clone());
        let (caps, answer_undeclared) = (c.req.meta.caps.clone(), c.answer_undeclared);
        let mut recorded = route.clone();
        let created_at = rec.created_at_ms;
        let task = tokio::spawn(async move {
            let admitted = follow::admit_task(&engine.limits, &up, &p).await?;
            let (channel, created) =
                match follow::create_upstream_task(&engine.cfg.tasks, &up, &p, call).await {
                    Ok(x) => x,
                    Err(r) => return r,
                };
            let mut orphan = CancelUpstream::new(&engine, &channel, &created.task_id);
            recorded.upstream_task = Some(follow::route_entry(
                channel.as_ref(),
                &created.task_id,
                &caps,
                answer_undeclared,
            ));
            if let Err(e) = engine.tasks.put_route(&recorded).await {
                // `orphan` cancels the upstream task; the task fails with this.
                return Err(UpstreamError::Broken {
                    upstream: up.name().to_string(),
                    reason: format!("the upstream task could not be recorded: {e}"),
                });
            }
            orphan.disarm();
            if let Some(ttl) = created.ttl_ms {
                follow::shorten_ttl(&engine.tasks, &recorded, created_at, ttl).await;
            }
            let poll = follow::bounded_poll(&engine.cfg.tasks, created.poll);
            follow::follow(engine, channel, created.task_id, poll, tx, Some(admitted)).await
        });
        let pending = Pending::new(task, rx, self.input_gather());
        self.launch(&c, &rec, &route, pending, Vec::new());
        crate::metrics::promoted(c.upstream.name(), &rec.task_id, c.client_kind());
        Reply::Task(Arc::new(rec))
    }

    /// Follow the upstream task of `route` (held by this process) on `channel`, which
    /// `follow.rs` reached again after a restart or a takeover: the task is `working`
    /// again and its follower goes to the driver. `false` when the task is over.
    pub(super) async fn resume_following(
        self: &Arc<Self>,
        route: &RequestRoute,
        channel: Arc<dyn TaskChannel>,
    ) -> Result<bool, StoreError> {
        let (Some(task_id), Some(ut)) = (&route.task_id, &route.upstream_task) else {
            return Ok(false);
        };
        // Input requests of the previous process had their answer channels there;
        // the upstream asks again through `tasks/result`.
        let live = self
            .tasks
            .update(task_id, Some(&route.route_id), &mut |rec| {
                if rec.status.is_terminal() {
                    return false;
                }
                rec.input_requests.clear();
                rec.status = TaskStatus::Working;
                rec.status_message = Some(REATTACHED.into());
                rec.last_updated_at_ms = now_ms();
                true
            })
            .await?;
        if live.is_none() {
            return Ok(false);
        }
        channel.task_started();
        let poll = follow::bounded_poll(&self.cfg.tasks, None);
        let follower = follow::follower(self, channel, ut.task_id.clone(), poll, None);
        self.calls.register(task_id, follower.abort_handle());
        tokio::spawn(self.clone().drive(Driven {
            task_id: task_id.clone(),
            route_id: route.route_id.clone(),
            upstream: route.upstream.clone(),
            caps: ut.caps.clone(),
            answer_undeclared: ut.answer_undeclared,
            call: follower,
            awaiting_input: false,
        }));
        self.changed(task_id);
        tracing::info!(task = %task_id, upstream = %route.upstream, upstream_task = %ut.task_id, "{REATTACHED}");
        Ok(true)
    }
}
