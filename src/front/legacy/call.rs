//! One forwarded request of a 2025-era session, held until the upstream answers
//! (docs/design.md §22 "Clients of the 2025 era"). A legacy client never gets a task:
//! the call is answered as JSON when it is quick and quiet, and otherwise on an SSE
//! stream with keep-alive comments, the call's progress (with the client's own
//! token) and log messages (at the session's level), and the upstream's requests to
//! the client (elicitation, sampling, roots), whose answers come back as POSTed
//! JSON-RPC responses on the same session. The upstream's result or error passes
//! through as sent. `sync_timeout_ms` ends the call with `-32603` naming it (the 2026
//! `-32021` names an extension this client cannot use); a client that goes away, or
//! says `notifications/cancelled`, cancels the upstream call.
//!
//! The loop is the one call-event loop of every site (`tasks/events.rs`): each arm
//! only says what an event means to a legacy client.

use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::super::answer::{Final, upstream_failure};
use super::super::held;
use super::super::reply::{self, Body};
use super::live::LegacyLive;
use crate::protocol::meta::ClientCaps;
use crate::protocol::{self, RequestId, RpcError};
use crate::tasks::CallFailure;
use crate::tasks::JoinedCall;
use crate::tasks::answer_undeclared;
use crate::tasks::{Notice, Pending};
use crate::upstream::{CallOutcome, InputAnswer, InputRequest, Upstream};

/// A session never asked for a level hears `info` and above: another session's
/// `debug` (which turns the shared upstream to debug) must not reach it.
pub(super) const DEFAULT_LOG_RANK: usize = 1;

/// Everything one held legacy call needs.
pub(super) struct LegacyCall {
    pub(super) upstream: Arc<Upstream>,
    pub(super) live: Arc<LegacyLive>,
    pub(super) session: String,
    pub(super) id: RequestId,
    /// The client's `_meta.progressToken`, echoed on its progress notifications.
    pub(super) progress_token: Option<Value>,
    /// The session's declared client capabilities (what may be relayed to it).
    pub(super) caps: ClientCaps,
    /// The session's log level rank.
    pub(super) log_rank: usize,
    pub(super) keepalive: Duration,
    /// Whether the answer may become an SSE stream; a batch member's may not, so it
    /// hears no notifications and relays no requests.
    pub(super) streaming: bool,
    /// A `tools/list` page for a session with the task dialect: its tools are marked
    /// (`tasks::mark_tools`).
    pub(super) mark_tools: bool,
    pub(super) sync_timeout: Duration,
    /// When the HTTP request arrived: `sync_timeout_ms` counts from here.
    pub(super) received: Instant,
    /// Held while the call runs: the session is active on this replica.
    pub(super) _activity: Box<dyn Send + Sync>,
}

/// Serve a started call: JSON if it ends quietly within `keepalive_ms`, else SSE (the
/// one held-call responder, `held.rs`, with what a session makes of each event).
pub(super) async fn serve(
    c: LegacyCall,
    pending: Pending,
    promote: Option<held::Deadline>,
) -> Response<Body> {
    c.live
        .call_started(&c.session, &c.id, pending.abort_handle());
    let t = held::Timing {
        hold_until: c.streaming.then(|| Instant::now() + c.keepalive),
        held: true,
        sync_at: c.received + c.sync_timeout,
        keepalive: c.keepalive,
        opening_comment: true,
        promote,
    };
    let site = Site {
        c,
        relayed: Vec::new(),
    };
    held::serve(site, pending, t).await
}

/// A held call of a session, and the ids of the requests relayed on its stream.
struct Site {
    c: LegacyCall,
    relayed: Vec<String>,
}

impl held::Site for Site {
    fn finished(&mut self, r: JoinedCall) -> Final {
        final_of(&self.c, r)
    }

    fn sync_timed_out(&self) -> Final {
        sync_timeout(&self.c)
    }

    /// A batch member hears no notifications.
    fn notice(&mut self, n: Notice) -> Option<Value> {
        if self.c.streaming {
            notice(&self.c, n)
        } else {
            None
        }
    }

    /// Relayed on the stream, each request its own event (2025-06-18 and later
    /// clients read one message per event, never a batch); a batch member, which has
    /// no stream, refuses them.
    fn inputs(&mut self, batch: Vec<InputRequest>) -> held::Inputs {
        if !self.c.streaming {
            for ir in batch {
                let e = RpcError::method_not_found(&ir.method);
                let _ = ir.respond.send(InputAnswer::Error(e));
            }
            return held::Inputs::Nothing;
        }
        let out: Vec<Value> = answer_undeclared(&self.c.caps, batch)
            .into_iter()
            .map(|ir| relay(&self.c, ir, &mut self.relayed))
            .collect();
        held::Inputs::Send(out)
    }

    /// A session makes no MRTR rounds ([`Site::inputs`] never holds).
    fn hold(&mut self, pending: Pending, _batch: Vec<InputRequest>) -> Final {
        pending.abort();
        sync_timeout(&self.c)
    }

    fn ended(&mut self) {
        self.c.live.call_ended(&self.c.session, &self.c.id);
        self.c.live.forget(&self.c.session, &self.relayed);
    }

    /// Not while a question relayed on the stream waits for the client's answer,
    /// which could no longer reach the call once it is a task.
    fn may_promote(&self) -> bool {
        !self.c.live.awaiting(&self.c.session, &self.relayed)
    }
}

/// A progress or log notification for this client, if it asked for it.
fn notice(c: &LegacyCall, n: Notice) -> Option<Value> {
    match n {
        Notice::Progress(mut p) => {
            let token = c.progress_token.clone()?;
            let mut params = Map::with_capacity(p.len() + 1);
            params.insert("progressToken".into(), token);
            params.append(&mut p);
            Some(protocol::notification(
                "notifications/progress",
                Value::Object(params),
            ))
        }
        Notice::Log(p) => {
            let level = protocol::fields::log_level(&p)?;
            (level >= c.log_rank)
                .then(|| protocol::notification("notifications/message", Value::Object(p)))
        }
        Notice::Queue(_) => None,
    }
}

/// An upstream request for the client: relayed as a JSON-RPC request with an id of
/// the gateway's, or answered here when the session did not declare what it needs
/// (roots: an empty list, as a client without roots would have; others: `-32601`,
/// what an SDK client answers for a method it does not handle).
fn relay(c: &LegacyCall, ir: InputRequest, relayed: &mut Vec<String>) -> Value {
    let id = c.live.relay(&c.session, ir.respond);
    relayed.push(id.clone());
    let mut m = Map::with_capacity(4);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), Value::from(id));
    m.insert("method".into(), Value::from(ir.method));
    if let Some(p) = ir.params {
        m.insert("params".into(), p);
    }
    Value::Object(m)
}

/// The upstream's answer as sent; a call that produced none is classified as
/// everywhere (`tasks::failure`): never sent → 503 + `Retry-After`, sent → 200
/// `-32603`.
fn final_of(c: &LegacyCall, r: JoinedCall) -> Final {
    match r {
        Ok(Ok(CallOutcome::Result(mut v))) => {
            if c.mark_tools {
                super::tasks::mark_tools(&c.upstream.cfg, &mut v);
            }
            Final::ok(protocol::response(&c.id, v))
        }
        Ok(Ok(CallOutcome::Error(e))) => Final::ok(protocol::error_response(Some(&c.id), &e)),
        Ok(Err(e)) => upstream_failure(&c.id, c.upstream.name(), &e),
        Err(_) => Final::failed(&c.id, c.upstream.name(), CallFailure::Ended),
    }
}

/// `sync_timeout_ms` passed: `-32603` naming it.
fn sync_timeout(c: &LegacyCall) -> Final {
    sync_timeout_of(&c.id, c.sync_timeout)
}

/// `sync_timeout_ms` (`after`) passed for request `id` of a session: `-32603` naming
/// it (the 2026 `-32021` names an extension this client cannot use).
pub(super) fn sync_timeout_of(id: &RequestId, after: Duration) -> Final {
    Final::ok(protocol::error_response(
        Some(id),
        &RpcError::internal(format!(
            "the upstream call exceeded the gateway's sync_timeout_ms ({} ms) and was cancelled",
            after.as_millis()
        )),
    ))
}

/// A JSON answer (headers not sent yet).
pub(super) fn json_answer(id: &RequestId, result: Value) -> Response<Body> {
    reply::json(StatusCode::OK, &protocol::response(id, result))
}
