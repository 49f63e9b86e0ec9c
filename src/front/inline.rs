//! Serving one request inline from the upstream (the synchronous path, docs/design.md
//! §2 "Clients without the tasks extension" and §12 "HTTP front", JSON or SSE).
//!
//! The upstream call runs in its own task. Response headers are held for up to
//! `keepalive_ms`: a fast answer to a request that asked for no progress or log
//! notifications goes out as `application/json`; otherwise the response becomes an SSE
//! stream with keep-alive comments, notifications, and the final answer. The abort
//! guard travels with whatever currently represents the client (the handler future,
//! then the SSE body), so a client that goes away cancels the upstream call.
//!
//! `sync_timeout_ms` counts from the request's arrival and is raced in both phases:
//! while headers are still held it answers HTTP 400 `-32021`, once the SSE stream is
//! open `-32021` is the final event; either way the upstream call is cancelled. How
//! a call that produced no answer is reported is decided in the engine (`tasks/failure.rs`).

use std::sync::Arc;

use http::Response;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::answer::Final;
use super::held;
use super::reply::Body;
use crate::auth::Principal;
use crate::protocol::meta::log_level_rank;
use crate::protocol::params::Forward;
use crate::protocol::{self, Request};
use crate::tasks::CallFailure;
use crate::tasks::Engine;
pub use crate::tasks::InlineTiming;
use crate::tasks::{InputVerdict, screen as screen_inputs};
use crate::tasks::{JoinedCall, Reply, answer_of};
use crate::tasks::{Notice, Pending};
use crate::upstream::{InputRequest, Upstream};

/// A progress or log notification for the client, or `None` when the request did not
/// opt in (MCP 2026-07-28 "Progress": a `progressToken`; "Logging": a `logLevel`).
fn client_notification<P>(req: &Request<P>, notice: Notice) -> Option<Value> {
    match notice {
        Notice::Progress(mut p) => {
            let token = req.meta.progress_token.clone()?;
            let mut params = Map::with_capacity(p.len() + 1);
            params.insert("progressToken".into(), token);
            params.append(&mut p);
            Some(protocol::notification(
                "notifications/progress",
                Value::Object(params),
            ))
        }
        Notice::Log(p) => {
            let want = log_level_rank(req.meta.log_level.as_deref()?)?;
            let level = protocol::fields::log_level(&p)?;
            (level >= want)
                .then(|| protocol::notification("notifications/message", Value::Object(p)))
        }
        // Queue-position reports are for task status, not client progress.
        Notice::Queue(_) => None,
    }
}

/// Everything one inline request needs.
pub struct Inline {
    pub engine: Arc<Engine>,
    pub upstream: Arc<Upstream>,
    pub principal: Principal,
    pub req: Request<Forward>,
    pub server_info: Value,
    pub timing: InlineTiming,
    /// When the HTTP request arrived: `sync_timeout_ms` counts from here
    /// (docs/design.md §2 "Clients without the tasks extension").
    pub received: Instant,
}

/// Run `req` against the upstream and answer inline.
pub async fn run(c: Inline) -> Response<Body> {
    let pending = c.engine.start_inline(&c.upstream, &c.principal, &c.req);
    serve(c, pending, None).await
}

/// Wait for a running call and answer inline (JSON, or SSE once it takes longer
/// than `keepalive_ms` or the client asked for notifications): the one held-call
/// responder (`held.rs`), with what a 2026 client makes of each event.
pub(super) async fn serve(
    c: Inline,
    pending: Pending,
    promote: Option<held::Deadline>,
) -> Response<Body> {
    let wants_stream = c.req.meta.progress_token.is_some() || c.req.meta.log_level.is_some();
    let t = held::Timing {
        hold_until: Some(Instant::now() + c.timing.keepalive),
        held: !wants_stream,
        sync_at: c.received + c.timing.sync_timeout,
        keepalive: c.timing.keepalive,
        opening_comment: false,
        promote,
    };
    held::serve(c, pending, t).await
}

impl held::Site for Inline {
    fn finished(&mut self, r: JoinedCall) -> Final {
        final_of(self, r)
    }

    /// `-32021` naming the tasks extension (docs/design.md §2 "Clients without the
    /// tasks extension").
    fn sync_timed_out(&self) -> Final {
        sync_timeout(self)
    }

    fn notice(&mut self, n: Notice) -> Option<Value> {
        client_notification(&self.req, n)
    }

    /// Input the client cannot give ends the call; input it can is an MRTR round.
    fn inputs(&mut self, batch: Vec<InputRequest>) -> held::Inputs {
        match screen(self, batch) {
            InputVerdict::Missing(err) => held::Inputs::Done(Final::of(
                &self.req.id,
                Reply::Failed(crate::tasks::Failure::refused(err)),
            )),
            InputVerdict::Relay(batch) => held::Inputs::Hold(batch),
            InputVerdict::Refused => held::Inputs::Nothing,
        }
    }

    fn hold(&mut self, pending: Pending, batch: Vec<InputRequest>) -> Final {
        Final::ok(protocol::response(
            &self.req.id,
            hold_call(self, pending, batch),
        ))
    }
}

fn screen(c: &Inline, batch: Vec<InputRequest>) -> InputVerdict {
    screen_inputs(&c.req.meta.caps, c.req.method, c.upstream.name(), batch)
}

fn final_of(c: &Inline, r: JoinedCall) -> Final {
    Final::of(
        &c.req.id,
        answer_of(c.req.method, c.upstream.name(), &c.server_info, r),
    )
}

/// The answer once `sync_timeout_ms` passed (docs/design.md §2 "Clients without the
/// tasks extension"): `-32021` naming the tasks extension.
fn sync_timeout(c: &Inline) -> Final {
    Final::failed(
        &c.req.id,
        c.upstream.name(),
        CallFailure::SyncTimeout(c.timing.sync_timeout),
    )
}

fn hold_call(c: &Inline, pending: Pending, batch: Vec<InputRequest>) -> Value {
    c.engine.holds().hold(
        pending,
        batch,
        &c.principal,
        c.upstream.name(),
        c.req.method,
        &c.req.params,
        &c.server_info,
    )
}
