//! One upstream call and what it says, as one stream of domain events.
//!
//! A call is answered in five places — inline as JSON, inline as SSE, held for a
//! 2025-era session (JSON or SSE), raced against its promotion deadline, and driven in
//! the background once it is a task — and each waits for the same things: the call's
//! end, its progress, log and queue reports, the upstream's input requests, and a timer
//! or two of its own. [`Pending::next`] is the one loop over them; each site only says
//! what an event means to it. A new kind of event (another dialect's input request,
//! say) is one arm in `Pending::accept`.
//!
//! Order (ARCHITECTURE.md "One call-event loop"): what is ready goes first, then the
//! call's end, then the upstream's reports, then the site's timers. Input requests
//! that arrive close together are gathered into one batch: the batch closes once
//! `input_gather_ms` passes without another event, and while it is open the site's
//! timers wait (a quiet period). Reports that arrive meanwhile are handed out before
//! the batch, and the reports still queued when the call ends are handed out before
//! its end.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, sleep_until};

use super::outcome::JoinedCall;
use crate::upstream::{CallEvent, CallOutcome, InputRequest, QueuePosition, UpstreamError};

/// The task running one upstream call.
pub type CallTask = JoinHandle<Result<CallOutcome, UpstreamError>>;

/// The task status message for a queue report ([`Notice::Queue`]).
pub fn queue_status(q: QueuePosition) -> String {
    match q {
        QueuePosition::Waiting(n) => crate::limits::queue_message(n),
        QueuePosition::Admitted => "working".into(),
    }
}

/// What the upstream reported about a call that is not a request to the client.
#[derive(Debug)]
pub enum Notice {
    /// `notifications/progress` params, `progressToken` removed.
    Progress(Map<String, Value>),
    /// `notifications/message` params.
    Log(Map<String, Value>),
    /// Where the call stands in its upstream's admission queue.
    Queue(QueuePosition),
}

/// The next thing a site waiting for a call must handle.
#[derive(Debug)]
pub enum Event<T> {
    /// The call ended: an answer, an upstream error, or aborted (cancel, expiry, lease
    /// loss). The last event of a call.
    Finished(JoinedCall),
    /// The upstream's input requests, gathered (never empty).
    Inputs(Vec<InputRequest>),
    Notice(Notice),
    /// A timer the site set came due (and is cleared).
    Timer(T),
}

/// The site's one-shot timers, keyed by a tag of the site's own; no allocation.
pub struct Timers<T> {
    slots: [Option<(T, Instant)>; TIMER_SLOTS],
}

/// More than any site uses (inline: hold, sync timeout, keep-alive).
const TIMER_SLOTS: usize = 4;

impl<T: Copy + Eq> Default for Timers<T> {
    fn default() -> Self {
        Self {
            slots: [None; TIMER_SLOTS],
        }
    }
}

impl<T: Copy + Eq> Timers<T> {
    /// Set (or move) the timer `tag` to `at`.
    pub fn set(&mut self, tag: T, at: Instant) {
        let slot = self
            .slots
            .iter()
            .position(|s| matches!(s, Some((t, _)) if *t == tag))
            .or_else(|| self.slots.iter().position(Option::is_none));
        match slot {
            Some(i) => self.slots[i] = Some((tag, at)),
            // Every slot holds another tag: a site with more tags than slots is a
            // programming error; the latest-due timer gives way rather than a panic.
            None => {
                if let Some(last) = self.slots.iter_mut().max_by_key(|s| s.map(|(_, at)| at)) {
                    *last = Some((tag, at));
                }
            }
        }
    }

    pub fn clear(&mut self, tag: T) {
        for s in &mut self.slots {
            if matches!(s, Some((t, _)) if *t == tag) {
                *s = None;
            }
        }
    }

    fn earliest(&self) -> Option<(T, Instant)> {
        self.slots
            .iter()
            .flatten()
            .copied()
            .min_by_key(|(_, at)| *at)
    }
}

/// An event received and not handed out yet.
enum Ready {
    Finished(JoinedCall),
    Inputs(Vec<InputRequest>),
    Notice(Notice),
}

/// An upstream call in progress with the channel of what it says. Everything
/// [`Pending::next`] has received but not handed out lives here, so a `next()`
/// dropped half-way loses nothing and a call held across MRTR rounds keeps it.
pub struct Pending {
    call: CallTask,
    events: mpsc::Receiver<CallEvent>,
    /// The event channel is still open.
    open: bool,
    /// `input_gather_ms`: how long a batch of input requests stays open.
    gather: Duration,
    /// The batch being gathered and when it closes unless another event comes.
    gathering: Option<(Vec<InputRequest>, Instant)>,
    /// Received and not handed out yet, in order.
    ready: VecDeque<Ready>,
    /// `Finished` was handed out: the call must not be polled again.
    done: bool,
}

impl Pending {
    pub fn new(call: CallTask, events: mpsc::Receiver<CallEvent>, gather: Duration) -> Self {
        Self {
            call,
            events,
            open: true,
            gather,
            gathering: None,
            ready: VecDeque::new(),
            done: false,
        }
    }

    /// Cancel the call upstream.
    pub fn abort(&self) {
        self.call.abort();
    }

    pub fn abort_handle(&self) -> AbortHandle {
        self.call.abort_handle()
    }

    /// The next event of the call, or a timer of `timers` coming due. Cancel-safe.
    /// After [`Event::Finished`] it never returns (every site leaves on it).
    pub async fn next<T: Copy + Eq>(&mut self, timers: &mut Timers<T>) -> Event<T> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                return match ev {
                    Ready::Finished(r) => {
                        self.done = true;
                        Event::Finished(r)
                    }
                    Ready::Inputs(b) => Event::Inputs(b),
                    Ready::Notice(n) => Event::Notice(n),
                };
            }
            if self.done {
                return std::future::pending().await;
            }
            if let Some(quiet_until) = self.gathering.as_ref().map(|g| g.1) {
                tokio::select! {
                    biased;
                    ev = self.events.recv(), if self.open => match ev {
                        Some(ev) => self.accept(ev),
                        None => {
                            self.open = false;
                            self.close_batch();
                        }
                    },
                    () = sleep_until(quiet_until) => self.close_batch(),
                }
                continue;
            }
            let due = timers.earliest();
            tokio::select! {
                biased;
                r = &mut self.call => {
                    self.drain_notices();
                    self.ready.push_back(Ready::Finished(r));
                }
                ev = self.events.recv(), if self.open => match ev {
                    Some(ev) => self.accept(ev),
                    None => self.open = false,
                },
                () = sleep_until(due.map_or_else(Instant::now, |d| d.1)), if due.is_some() => {
                    if let Some((tag, _)) = due {
                        timers.clear(tag);
                        return Event::Timer(tag);
                    }
                }
            }
        }
    }

    /// Take one upstream event: a report is ready at once, an input request opens (or
    /// extends) the batch.
    fn accept(&mut self, ev: CallEvent) {
        let now = Instant::now();
        match notice_of(ev) {
            Err(ir) => match &mut self.gathering {
                Some((batch, until)) => {
                    batch.push(ir);
                    *until = now + self.gather;
                }
                None => self.gathering = Some((vec![ir], now + self.gather)),
            },
            Ok(notice) => {
                if let Some((_, until)) = &mut self.gathering {
                    *until = now + self.gather;
                }
                self.ready.push_back(Ready::Notice(notice));
            }
        }
    }

    fn close_batch(&mut self) {
        if let Some((batch, _)) = self.gathering.take() {
            self.ready.push_back(Ready::Inputs(batch));
        }
    }

    /// The reports already sent when the call ended go out before its end. Input
    /// requests of a call that ended are dropped: their responders answer the
    /// upstream with an error.
    fn drain_notices(&mut self) {
        self.gathering = None;
        while let Ok(ev) = self.events.try_recv() {
            if let Ok(notice) = notice_of(ev) {
                self.ready.push_back(Ready::Notice(notice));
            }
        }
    }
}

/// An upstream event as a notice, or the input request it is.
fn notice_of(ev: CallEvent) -> Result<Notice, InputRequest> {
    match ev {
        CallEvent::Input(ir) => Err(ir),
        CallEvent::Progress(p) => Ok(Notice::Progress(p)),
        CallEvent::Log(p) => Ok(Notice::Log(p)),
        CallEvent::Queue(q) => Ok(Notice::Queue(q)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::{CallOutcome, InputAnswer};
    use serde_json::json;
    use tokio::sync::oneshot;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum T {
        A,
        B,
    }

    fn input(method: &str) -> (CallEvent, oneshot::Receiver<InputAnswer>) {
        let (tx, rx) = oneshot::channel();
        let ir = InputRequest {
            method: method.into(),
            params: None,
            respond: tx,
        };
        (CallEvent::Input(ir), rx)
    }

    fn progress(n: u64) -> CallEvent {
        let p = json!({ "progress": n });
        CallEvent::Progress(p.as_object().cloned().unwrap_or_default())
    }

    /// A call that answers once `release` fires, and its event sender.
    fn call(gather_ms: u64) -> (Pending, mpsc::Sender<CallEvent>, oneshot::Sender<()>) {
        let (tx, rx) = mpsc::channel(32);
        let (release, wait) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = wait.await;
            Ok(CallOutcome::Result(json!({ "ok": true })))
        });
        (
            Pending::new(task, rx, Duration::from_millis(gather_ms)),
            tx,
            release,
        )
    }

    fn progress_of(ev: &Event<T>) -> Option<u64> {
        match ev {
            Event::Notice(Notice::Progress(p)) => p.get("progress").and_then(Value::as_u64),
            _ => None,
        }
    }

    #[tokio::test]
    async fn inputs_close_together_form_one_batch_after_the_reports() {
        let (mut p, tx, _release) = call(100);
        let mut timers = Timers::<T>::default();
        let (a, _ra) = input("elicitation/create");
        let (b, _rb) = input("roots/list");
        for ev in [a, progress(1), b] {
            assert!(tx.send(ev).await.is_ok());
        }
        assert_eq!(progress_of(&p.next(&mut timers).await), Some(1));
        match p.next(&mut timers).await {
            Event::Inputs(batch) => {
                let methods: Vec<_> = batch.iter().map(|ir| ir.method.as_str()).collect();
                assert_eq!(methods, ["elicitation/create", "roots/list"]);
            }
            other => panic!("expected the batch, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_dropped_next_loses_nothing_of_the_batch() {
        let (mut p, tx, _release) = call(200);
        let mut timers = Timers::<T>::default();
        let (a, _ra) = input("elicitation/create");
        assert!(tx.send(a).await.is_ok());
        // Dropped mid-gather: the first request is already in the batch.
        let r = tokio::time::timeout(Duration::from_millis(20), p.next(&mut timers)).await;
        assert!(r.is_err(), "the batch must still be open");
        let (b, _rb) = input("sampling/createMessage");
        assert!(tx.send(b).await.is_ok());
        match p.next(&mut timers).await {
            Event::Inputs(batch) => assert_eq!(batch.len(), 2),
            other => panic!("expected the whole batch, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn queued_reports_go_out_before_the_end() {
        let (mut p, tx, release) = call(50);
        let mut timers = Timers::<T>::default();
        for n in 1..=3 {
            assert!(tx.send(progress(n)).await.is_ok());
        }
        assert!(release.send(()).is_ok());
        // Let the call finish with the reports still queued.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut seen = Vec::new();
        loop {
            let ev = p.next(&mut timers).await;
            if let Event::Finished(r) = &ev {
                assert!(matches!(r, Ok(Ok(CallOutcome::Result(_)))));
                break;
            }
            seen.push(progress_of(&ev));
        }
        assert_eq!(seen, [Some(1), Some(2), Some(3)]);
    }

    #[tokio::test]
    async fn timers_come_due_earliest_first_and_once() {
        let (mut p, _tx, _release) = call(50);
        let mut timers = Timers::default();
        let now = Instant::now();
        timers.set(T::B, now + Duration::from_millis(60));
        timers.set(T::A, now + Duration::from_millis(30));
        assert!(matches!(p.next(&mut timers).await, Event::Timer(T::A)));
        assert!(matches!(p.next(&mut timers).await, Event::Timer(T::B)));
        // Both cleared: nothing comes until the call ends.
        let r = tokio::time::timeout(Duration::from_millis(100), p.next(&mut timers)).await;
        assert!(r.is_err());
    }

    #[tokio::test]
    async fn timers_wait_while_a_batch_gathers() {
        let (mut p, tx, _release) = call(150);
        let mut timers = Timers::default();
        timers.set(T::A, Instant::now() + Duration::from_millis(10));
        let (a, _ra) = input("elicitation/create");
        assert!(tx.send(a).await.is_ok());
        // The request arrives before the timer is polled: the quiet period wins.
        assert!(matches!(p.next(&mut timers).await, Event::Inputs(_)));
        assert!(matches!(p.next(&mut timers).await, Event::Timer(T::A)));
    }
}
