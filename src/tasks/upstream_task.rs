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
//! Free functions over the engine, as the call race's are (ARCHITECTURE.md "The
//! engine's parts"): the race (`call.rs`) starts them, and what both share
//! (`ToolCall`, its record and route, the launch to the driver) is `tool_call.rs`'s.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::engine::Engine;
use super::events::Pending;
use super::follow::{self, CancelUpstream};
use super::outcome::{Reply, answer_of};
use super::tool_call::{
    ToolCall, existing, launch, new_record, new_route, store_failed_after_send, store_failure,
};
use crate::store::Created;
use crate::upstream::UpstreamError;

/// `tools/call` of a tool the upstream runs as its own task (docs/design.md §25),
/// without an idempotency key: the upstream task first, then the gateway's, whose
/// route names it from its first write.
pub(super) async fn upstream_task_call(engine: &Arc<Engine>, c: ToolCall<'_>, fp: String) -> Reply {
    let name = c.upstream.name().to_string();
    let answer = |r| answer_of(c.req.method, &name, c.server_info, Ok(r));
    let admitted = match follow::admit_task(&engine.limits, c.upstream, c.principal).await {
        Ok(p) => p,
        Err(e) => return answer(Err(e)),
    };
    let call = super::inputs::upstream_spec(c.req.method, &c.req.params.fwd, false);
    let (channel, created) = match follow::create_upstream_task(
        &engine.cfg.tasks,
        c.upstream,
        c.principal,
        call,
    )
    .await
    {
        Ok(x) => x,
        Err(r) => return answer(r),
    };
    // From here on the upstream task exists: a failure to record it cancels it.
    let mut orphan = CancelUpstream::new(engine, &channel, &created.task_id);
    let mut rec = new_record(engine, &c, &c.tool, fp, None);
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
    let mut route = new_route(engine, &c, &rec.task_id);
    route.upstream_task = Some(follow::route_entry(
        channel.as_ref(),
        &created.task_id,
        &c.req.meta.caps,
        c.answer_undeclared,
    ));
    let _creating = engine.calls.creating(&rec.task_id);
    let stored = match engine.tasks.create(&rec, &route, None).await {
        Ok(_) => engine.flush().await,
        Err(e) => Err(e),
    };
    if let Err(e) = stored {
        return store_failed_after_send(&name, e);
    }
    orphan.disarm();
    let poll = follow::bounded_poll(&engine.cfg.tasks, created.poll);
    let follower = follow::follower(engine, channel, created.task_id, poll, Some(admitted));
    launch(engine, &c, &rec, &route, follower, Vec::new());
    crate::metrics::promoted(&name, &rec.task_id, c.client_kind());
    Reply::Task(Arc::new(rec))
}

/// A keyed call of an upstream-task tool: the task and its idempotency claim are
/// written before anything goes upstream, as for every keyed call (docs/design.md
/// §9), so concurrent duplicates never create two upstream tasks. The call the
/// driver follows then creates the upstream task and records it in the route
/// before it polls; a crash in between fails the task once at the next start.
pub(super) async fn keyed_upstream_task_call(
    engine: &Arc<Engine>,
    c: ToolCall<'_>,
    fp: String,
    idem: Option<String>,
    index: Vec<u8>,
) -> Reply {
    let rec = new_record(engine, &c, &c.tool, fp.clone(), idem);
    let route = new_route(engine, &c, &rec.task_id);
    let _creating = engine.calls.creating(&rec.task_id);
    match engine.tasks.create(&rec, &route, Some(&index)).await {
        Ok(Created::New) => {}
        Ok(Created::Existing(entry)) => return existing(engine, &c, entry, &fp).await,
        Err(e) => return store_failure(e),
    }
    if let Err(e) = engine.flush().await {
        return store_failure(e);
    }
    let call = super::inputs::upstream_spec(c.req.method, &c.req.params.fwd, false);
    let (tx, rx) = mpsc::channel(32);
    let spawned = engine.clone();
    let (up, p) = (c.upstream.clone(), c.principal.clone());
    let (caps, answer_undeclared) = (c.req.meta.caps.clone(), c.answer_undeclared);
    let mut recorded = route.clone();
    let created_at = rec.created_at_ms;
    let task = tokio::spawn(async move {
        let admitted = follow::admit_task(&spawned.limits, &up, &p).await?;
        let (channel, created) =
            match follow::create_upstream_task(&spawned.cfg.tasks, &up, &p, call).await {
                Ok(x) => x,
                Err(r) => return r,
            };
        let mut orphan = CancelUpstream::new(&spawned, &channel, &created.task_id);
        recorded.upstream_task = Some(follow::route_entry(
            channel.as_ref(),
            &created.task_id,
            &caps,
            answer_undeclared,
        ));
        if let Err(e) = spawned.tasks.put_route(&recorded).await {
            // `orphan` cancels the upstream task; the task fails with this.
            return Err(UpstreamError::Broken {
                upstream: up.name().to_string(),
                reason: format!("the upstream task could not be recorded: {e}"),
            });
        }
        orphan.disarm();
        if let Some(ttl) = created.ttl_ms {
            follow::shorten_ttl(&spawned.tasks, &recorded, created_at, ttl).await;
        }
        let poll = follow::bounded_poll(&spawned.cfg.tasks, created.poll);
        follow::follow(spawned, channel, created.task_id, poll, tx, Some(admitted)).await
    });
    let pending = Pending::new(task, rx, engine.input_gather());
    launch(engine, &c, &rec, &route, pending, Vec::new());
    crate::metrics::promoted(c.upstream.name(), &rec.task_id, c.client_kind());
    Reply::Task(Arc::new(rec))
}
