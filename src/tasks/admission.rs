//! Every upstream call goes through here (ARCHITECTURE.md "How the layers talk":
//! admission is the engine's): the tenant's purge fence, then a slot of the upstream's
//! admission gate, then the call in the principal's isolation scope; and an inline
//! call started in its own task on top of it.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::engine::Engine;
use super::events::Pending;
use super::inputs;
use super::tenant_calls::TenantCalls;
use crate::auth::Principal;
use crate::limits::Limits;
use crate::protocol::Request;
use crate::protocol::params::Forward;
use crate::upstream::{CallEvent, CallOutcome, CallSpec, QueuePosition, Upstream, UpstreamError};

/// First a slot of the upstream's admission gate (fair queueing; the queue position is
/// reported on `events` while waiting), then the call in the principal's isolation
/// scope. Dropping the future leaves the queue or cancels the call.
pub(super) async fn call_upstream(
    tenant_calls: &TenantCalls,
    limits: &Limits,
    upstream: &Upstream,
    principal: &Principal,
    spec: CallSpec,
    events: mpsc::Sender<CallEvent>,
) -> Result<CallOutcome, UpstreamError> {
    // A purge of the tenant refuses the call before it is sent, and cancels it
    // (dropping it cancels it upstream) while it runs (docs/design.md §27 "Tenant
    // purge").
    let Some(in_flight) = tenant_calls.enter(&principal.tenant) else {
        return Err(UpstreamError::Unavailable {
            upstream: upstream.name().to_string(),
            reason: "the tenant's data is being purged".into(),
        });
    };
    let call = async {
        let report = |pos: Option<usize>| {
            let q = pos.map_or(QueuePosition::Admitted, QueuePosition::Waiting);
            let _ = events.try_send(CallEvent::Queue(q));
        };
        let admitted = limits
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
    };
    tokio::select! {
        r = call => r,
        () = in_flight.cancelled() => Err(UpstreamError::Broken {
            upstream: upstream.name().to_string(),
            reason: "cancelled by an operator purging the tenant's data".into(),
        }),
    }
}

/// An inline call for `req` in its own task (admission included); the front waits
/// for it and renders the answer.
pub(super) fn start_inline(
    engine: &Arc<Engine>,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    req: &Request<Forward>,
) -> Pending {
    let want_progress = req.meta.progress_token.is_some();
    let spec = inputs::upstream_spec(req.method, &req.params, want_progress);
    start_call(engine, upstream, principal, spec)
}

/// The upstream call `spec` in its own task (a 2025-era session's request, built by
/// the front as sent: docs/design.md §22 "Clients of the 2025 era").
pub(super) fn start_call(
    engine: &Arc<Engine>,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    spec: CallSpec,
) -> Pending {
    let (ev_tx, events) = mpsc::channel::<CallEvent>(32);
    let up = upstream.clone();
    let p = principal.clone();
    let gather = engine.cfg.tasks.input_gather;
    let engine = engine.clone();
    // In the request's span, so the upstream call's client span is its child.
    let call = crate::telemetry::spawn_in_current_span(async move {
        call_upstream(&engine.tenant_calls, &engine.limits, &up, &p, spec, ev_tx).await
    });
    Pending::new(call, events, gather)
}
