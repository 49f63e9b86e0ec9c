//! The one held-call responder of both eras: a running upstream call answered on the
//! request that started it (docs/design.md §2 "Clients without the tasks extension",
//! §12 "HTTP front", §22 "Clients of the 2025 era").
//!
//! Response headers are held while the call is quick and quiet: its answer then goes
//! out as one JSON response. Once `keepalive_ms` passes with headers held, or the call
//! has something to tell the client before its answer, the response becomes an SSE
//! stream with keep-alive comments, the messages the call produces, and the answer
//! as its last event. `sync_timeout_ms` counts from the request's arrival in both
//! phases. The abort guard travels with whatever represents the client (this future,
//! then the SSE body), so a client that goes away cancels the upstream call.
//!
//! What an event means to the client is the era's to say ([`Site`]): `inline.rs` for
//! a 2026 client (MRTR rounds, `-32021` at the sync timeout), `legacy/call.rs` for a
//! 2025-era session (requests relayed on the stream, its progress token and log
//! level). The loop is the one call-event loop of every site (`tasks/events.rs`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::answer::{CallGuard, Final};
use super::reply::{self, Body};
use crate::tasks::JoinedCall;
use crate::tasks::{Event, Notice, Pending, Timers};
use crate::upstream::InputRequest;

/// What the site wants done with a batch of the upstream's input requests.
pub(super) enum Inputs {
    /// Answered or refused in place: nothing for the client.
    Nothing,
    /// Messages for the client, each its own SSE event.
    Send(Vec<Value>),
    /// The call's end: this answer, and the call is cancelled.
    Done(Final),
    /// Hand the call and the batch to [`Site::hold`] (an MRTR round).
    Hold(Vec<InputRequest>),
}

/// What one era makes of a held call's events.
pub(super) trait Site: Send + 'static {
    /// The call ended: its answer.
    fn finished(&mut self, r: JoinedCall) -> Final;
    /// `sync_timeout_ms` passed: the answer (the call is cancelled).
    fn sync_timed_out(&self) -> Final;
    /// A notice of the upstream as a message for the client, if it asked for it.
    fn notice(&mut self, n: Notice) -> Option<Value>;
    /// A batch of the upstream's input requests.
    fn inputs(&mut self, batch: Vec<InputRequest>) -> Inputs;
    /// Keep the call for a later request to resume ([`Inputs::Hold`]): the answer.
    fn hold(&mut self, pending: Pending, batch: Vec<InputRequest>) -> Final;
    /// The call is answered or its client gone.
    fn ended(&mut self) {}
    /// Whether the call may become a task now: not while the client is answering a
    /// question the call asked on its stream.
    fn may_promote(&self) -> bool {
        true
    }
}

/// What becomes of a held call at its deadline when it may become a task
/// (docs/design.md §28 "Task handles for plain clients").
pub(super) type Promoted = Pin<Box<dyn Future<Output = Result<Final, Pending>> + Send>>;

/// Makes a held call a task at its deadline: the handle's answer, or the call back
/// when it cannot become one (it is then held as in hold mode).
pub(super) trait Promote: Send + 'static {
    fn promote(self: Box<Self>, pending: Pending) -> Promoted;
}

/// A held call's deadline and what it becomes then.
pub(super) type Deadline = (Instant, Box<dyn Promote>);

/// How soon a deadline that found the client answering a question is tried again.
const PROMOTE_RETRY: Duration = Duration::from_millis(250);

/// When and how the answer may become a stream.
pub(super) struct Timing {
    /// Headers held until then; `None`: held until the call ends (a batch member,
    /// which may not stream) or not at all (see `held`).
    pub(super) hold_until: Option<Instant>,
    /// Whether headers are held at first; a client that asked for notifications is
    /// answered with a stream at once.
    pub(super) held: bool,
    /// When `sync_timeout_ms` runs out.
    pub(super) sync_at: Instant,
    pub(super) keepalive: Duration,
    /// Whether the stream opens with a keep-alive comment when the hold ends without
    /// a message (a 2025-era session's stream does; a 2026 one waits for its first
    /// event or keep-alive).
    pub(super) opening_comment: bool,
    /// When and how the call becomes a task; `None`: held to its end (hold mode).
    pub(super) promote: Option<Deadline>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// `keepalive_ms` passed with headers held: switch to SSE.
    Hold,
    /// `sync_timeout_ms` passed since the request arrived.
    Sync,
    /// Time for an SSE keep-alive comment.
    KeepAlive,
    /// The call's deadline (`promote_after_ms`): make it a task.
    Promote,
}

/// What one event asks of the responder.
enum Step {
    Nothing,
    Send(Vec<Value>),
    Done(Final),
    /// A hold or keep-alive period passed.
    Tick,
    /// The deadline passed: make the call a task.
    Promote,
}

async fn next<S: Site>(
    site: &mut S,
    pending: &mut Option<Pending>,
    timers: &mut Timers<Timer>,
    guard: &CallGuard,
) -> Step {
    // Only a hold takes the call, and it ends the answer: never reached.
    let Some(p) = pending.as_mut() else {
        return Step::Done(site.sync_timed_out());
    };
    match p.next(timers).await {
        Event::Finished(r) => Step::Done(site.finished(r)),
        Event::Notice(n) => match site.notice(n) {
            Some(v) => Step::Send(vec![v]),
            None => Step::Nothing,
        },
        Event::Inputs(batch) => match site.inputs(batch) {
            Inputs::Nothing => Step::Nothing,
            Inputs::Send(v) if v.is_empty() => Step::Nothing,
            Inputs::Send(v) => Step::Send(v),
            Inputs::Done(f) => {
                p.abort();
                Step::Done(f)
            }
            Inputs::Hold(batch) => {
                // The call is no longer this request's to cancel.
                guard.disarm();
                match pending.take() {
                    Some(p) => Step::Done(site.hold(p, batch)),
                    None => Step::Nothing,
                }
            }
        },
        Event::Timer(Timer::Sync) => {
            // Cancels the upstream call (the guard would too, when dropped).
            p.abort();
            Step::Done(site.sync_timed_out())
        }
        Event::Timer(Timer::Hold | Timer::KeepAlive) => Step::Tick,
        Event::Timer(Timer::Promote) if site.may_promote() => Step::Promote,
        Event::Timer(Timer::Promote) => {
            timers.set(Timer::Promote, Instant::now() + PROMOTE_RETRY);
            Step::Nothing
        }
    }
}

/// The deadline passed: hand the call to the engine as a task. Its handle is the
/// answer and the call is no longer this request's to cancel; a call that cannot
/// become a task is held on.
async fn promote<S: Site>(
    site: &mut S,
    pending: &mut Option<Pending>,
    promoter: &mut Option<Box<dyn Promote>>,
    guard: &CallGuard,
) -> Option<Final> {
    let (p, pr) = (pending.take()?, promoter.take());
    let Some(pr) = pr else {
        *pending = Some(p);
        return None;
    };
    match pr.promote(p).await {
        Ok(f) => {
            guard.disarm();
            site.ended();
            Some(f)
        }
        Err(p) => {
            *pending = Some(p);
            None
        }
    }
}

/// Answer a started call on its request: JSON while quick and quiet, else SSE.
pub(super) async fn serve<S: Site>(mut site: S, pending: Pending, t: Timing) -> Response<Body> {
    let guard = CallGuard::new(pending.abort_handle());
    let mut pending = Some(pending);
    let mut timers = Timers::default();
    // Armed from the request's start and watched in both phases.
    timers.set(Timer::Sync, t.sync_at);
    let mut promoter = t.promote.map(|(at, p)| {
        timers.set(Timer::Promote, at);
        p
    });
    let mut first = None;
    if t.held {
        if let Some(at) = t.hold_until {
            timers.set(Timer::Hold, at);
        }
        loop {
            match next(&mut site, &mut pending, &mut timers, &guard).await {
                Step::Done(f) => {
                    site.ended();
                    return f.into_response();
                }
                Step::Nothing => {}
                Step::Send(v) => {
                    first = Some(v);
                    break;
                }
                Step::Tick => break,
                Step::Promote => {
                    if let Some(f) = promote(&mut site, &mut pending, &mut promoter, &guard).await {
                        return f.into_response();
                    }
                }
            }
        }
        timers.clear(Timer::Hold);
    }

    // SSE from here on: errors travel in-stream.
    let (tx, rx) = mpsc::channel::<Bytes>(32);
    let body_guard = guard.clone();
    tokio::spawn(async move {
        let guard = guard;
        timers.set(Timer::KeepAlive, Instant::now() + t.keepalive);
        let mut ok = match first {
            Some(msgs) => send_all(&tx, msgs).await,
            None if t.held && t.opening_comment => tx.send(reply::sse_keepalive()).await.is_ok(),
            None => true,
        };
        while ok {
            ok = match next(&mut site, &mut pending, &mut timers, &guard).await {
                Step::Done(f) => {
                    let _ = tx.send(reply::sse_event(&f.message)).await;
                    break;
                }
                Step::Send(msgs) => send_all(&tx, msgs).await,
                Step::Nothing => true,
                Step::Tick => {
                    timers.set(Timer::KeepAlive, Instant::now() + t.keepalive);
                    tx.send(reply::sse_keepalive()).await.is_ok()
                }
                Step::Promote => {
                    match promote(&mut site, &mut pending, &mut promoter, &guard).await {
                        Some(f) => {
                            let _ = tx.send(reply::sse_event(&f.message)).await;
                            // The handle went out: `ended` ran with it.
                            return;
                        }
                        None => true,
                    }
                }
            };
        }
        // Answered, or the client went away: the guard, dropped here and with the
        // body, cancels a call still running.
        site.ended();
    });
    reply::sse(rx, body_guard)
}

async fn send_all(tx: &mpsc::Sender<Bytes>, msgs: Vec<Value>) -> bool {
    for m in msgs {
        if tx.send(reply::sse_event(&m)).await.is_err() {
            return false;
        }
    }
    true
}
