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

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::inline::{CallGuard, Final, upstream_failure};
use super::super::reply::{self, Body};
use super::live::LegacyLive;
use crate::protocol::meta::ClientCaps;
use crate::protocol::{self, RequestId, RpcError};
use crate::tasks::events::{Event, Notice, Pending, Timers};
use crate::tasks::failure::CallFailure;
use crate::tasks::inputs::answer_undeclared;
use crate::tasks::outcome::JoinedCall;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// `keepalive_ms` passed with headers held: switch to SSE.
    Hold,
    Sync,
    KeepAlive,
}

/// What an event asks the site to send.
enum Out {
    Nothing,
    /// Messages for the client, each its own SSE event.
    Send(Vec<Value>),
    Done(Final),
}

/// Serve a started call: JSON if it ends quietly within `keepalive_ms`, else SSE.
pub(super) async fn serve(c: LegacyCall, mut pending: Pending) -> Response<Body> {
    let guard = CallGuard::new(pending.abort_handle());
    c.live
        .call_started(&c.session, &c.id, pending.abort_handle());
    let mut relayed: Vec<String> = Vec::new();
    let mut timers = Timers::default();
    timers.set(Timer::Sync, c.received + c.sync_timeout);
    if c.streaming {
        timers.set(Timer::Hold, Instant::now() + c.keepalive);
    }

    // Headers held: a quick, quiet call is one JSON answer.
    let first = loop {
        match on_event(&c, &mut pending, &mut timers, &mut relayed).await {
            Step::Out(Out::Done(f)) => {
                finish(&c, &relayed);
                return f.into_response();
            }
            Step::Out(Out::Nothing) => {}
            Step::Out(Out::Send(v)) => break Some(v),
            Step::Hold => break None,
        }
    };

    let (tx, rx) = mpsc::channel::<Bytes>(32);
    let body_guard = guard.clone();
    tokio::spawn(async move {
        let _guard = guard;
        timers.set(Timer::KeepAlive, Instant::now() + c.keepalive);
        let mut ok = match first {
            Some(msgs) => send_all(&tx, msgs).await,
            None => tx.send(reply::sse_keepalive()).await.is_ok(),
        };
        while ok {
            ok = match on_event(&c, &mut pending, &mut timers, &mut relayed).await {
                Step::Out(Out::Done(f)) => {
                    let _ = tx.send(reply::sse_event(&f.message)).await;
                    break;
                }
                Step::Out(Out::Send(msgs)) => send_all(&tx, msgs).await,
                Step::Out(Out::Nothing) => true,
                Step::Hold => {
                    timers.set(Timer::KeepAlive, Instant::now() + c.keepalive);
                    tx.send(reply::sse_keepalive()).await.is_ok()
                }
            };
        }
        // Ended, or the client went away: the guard, dropped here and with the body,
        // cancels a call still running.
        finish(&c, &relayed);
    });
    reply::sse(rx, body_guard)
}

enum Step {
    Out(Out),
    /// A hold or keep-alive period passed.
    Hold,
}

async fn on_event(
    c: &LegacyCall,
    pending: &mut Pending,
    timers: &mut Timers<Timer>,
    relayed: &mut Vec<String>,
) -> Step {
    match pending.next(timers).await {
        Event::Finished(r) => Step::Out(Out::Done(final_of(c, r))),
        Event::Notice(_) if !c.streaming => Step::Out(Out::Nothing),
        Event::Notice(n) => Step::Out(match notice(c, n) {
            Some(v) => Out::Send(vec![v]),
            None => Out::Nothing,
        }),
        Event::Inputs(batch) if !c.streaming => {
            for ir in batch {
                let e = RpcError::method_not_found(&ir.method);
                let _ = ir.respond.send(InputAnswer::Error(e));
            }
            Step::Out(Out::Nothing)
        }
        Event::Inputs(batch) => {
            // Each request its own event: 2025-06-18 and later clients read one
            // message per event, never a batch.
            let out: Vec<Value> = answer_undeclared(&c.caps, batch)
                .into_iter()
                .filter_map(|ir| relay(c, ir, relayed))
                .collect();
            Step::Out(if out.is_empty() {
                Out::Nothing
            } else {
                Out::Send(out)
            })
        }
        Event::Timer(Timer::Sync) => {
            pending.abort();
            Step::Out(Out::Done(sync_timeout(c)))
        }
        Event::Timer(Timer::Hold | Timer::KeepAlive) => Step::Hold,
    }
}

async fn send_all(tx: &mpsc::Sender<Bytes>, msgs: Vec<Value>) -> bool {
    for m in msgs {
        if tx.send(reply::sse_event(&m)).await.is_err() {
            return false;
        }
    }
    true
}

fn finish(c: &LegacyCall, relayed: &[String]) {
    c.live.call_ended(&c.session, &c.id);
    c.live.forget(&c.session, relayed);
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
fn relay(c: &LegacyCall, ir: InputRequest, relayed: &mut Vec<String>) -> Option<Value> {
    let id = c.live.relay(&c.session, ir.respond);
    relayed.push(id.clone());
    let mut m = Map::with_capacity(4);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), Value::from(id));
    m.insert("method".into(), Value::from(ir.method));
    if let Some(p) = ir.params {
        m.insert("params".into(), p);
    }
    Some(Value::Object(m))
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
    Final::ok(protocol::error_response(
        Some(&c.id),
        &RpcError::internal(format!(
            "the upstream call exceeded the gateway's sync_timeout_ms ({} ms) and was cancelled",
            c.sync_timeout.as_millis()
        )),
    ))
}

/// A JSON answer (headers not sent yet).
pub(super) fn json_answer(id: &RequestId, result: Value) -> Response<Body> {
    reply::json(StatusCode::OK, &protocol::response(id, result))
}
