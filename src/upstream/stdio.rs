//! stdio upstream transport: a pool of children (spec C7, design.md policy 14).
//!
//! # Attribution guarantee
//! The stdio wire does not say which request a server→client message is about, and a
//! wrong guess could show tenant A's elicitation to tenant B. So a child serves **one
//! call at a time**: everything it writes while that call is in flight (progress with
//! the call's gateway-minted token, log messages, `elicitation/create`,
//! `sampling/createMessage`, `roots/list`) goes to that call's event channel and to no
//! other. A child is handed to the next call only after its previous call has been
//! answered, or after it was killed. Requests that arrive while no call is in flight
//! are answered by [`crate::upstream::unowned_request_answer`], never forwarded.
//!
//! # Cancellation guarantee
//! Dropping the future returned by [`LegacyTransport::call`] before it resolves sends
//! `notifications/cancelled` to the child. The child then stays reserved (no other call
//! can see its output) until it answers the cancelled request — that answer is
//! discarded — or `cancel_grace_ms` passes, in which case its whole process group is
//! killed and the slot restarts with a fresh child.
//!
//! # Lifecycle
//! Slot 0 is started eagerly by [`StdioPool::start`]. The pool keeps `spares`
//! initialised idle children ready beyond those in use (and beyond the calls waiting
//! for one), starting as many slots as that needs **at once**, ahead of need, up to
//! `processes`; idle extra children beyond the spares are reaped after `idle_reap_ms`.
//! So a call rarely waits out a child's start-up and settle window.
//!
//! A child that dies while serving a call fails that call with
//! [`UpstreamError::Broken`] and is replaced at once. Backoff (100 ms doubling to 5 s,
//! pool-wide) applies only to children that fail to start — the spawn or `initialize`
//! fails, or the child exits idle soon after starting. A caller (tenant + tool) whose
//! calls keep killing children is throttled (see [`throttle`]) so it cannot keep the
//! pool cold for everyone else.
//!
//! Children lead their own process group, get `SIGKILL` if the gateway dies, and are
//! recorded in `pid_dir` (this replica's directory under `store.runtime_dir`) so
//! [`kill_leftovers`] can clean up after a `kill -9` — only groups whose recording
//! gateway is provably dead.

pub(crate) mod framing;
mod process;
mod throttle;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use process::{Leftovers, kill_leftovers, kill_legacy_leftovers};

use self::framing::{LineReader, Next};
use self::throttle::{Caller, CrashThrottle, Verdict};
use super::identity::Identity;
use super::legacy_messages::{self, Inbound};
use super::{
    BoxFuture, CallEvent, CallOutcome, CallSpec, InputAnswer, InputRequest, LegacyTransport,
    SessionNotification, TransportState, UpstreamError, UpstreamInfo,
};
use crate::protocol::RpcError;

/// First delay after a failed start; doubles per consecutive failure up to the max.
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A child that exits on its own, idle, sooner than this after becoming ready counts
/// as a failed start (a server that quits right after its handshake would otherwise
/// be respawned in a tight loop).
const STABLE_UPTIME: Duration = Duration::from_secs(10);
/// Bound on the `initialize` round trip (covers slow `npx`/`uvx` cold starts).
/// Quiet period between `initialized` and a child's first call (see `spawn_child`).
const SETTLE_AFTER_INIT: Duration = Duration::from_millis(750);
const INIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Shutdown: how long a child gets after stdin EOF, then after SIGTERM.
const STDIN_EOF_GRACE: Duration = Duration::from_millis(500);
const SIGTERM_GRACE: Duration = Duration::from_millis(500);
/// After the child exits, how long to keep reading output it already wrote (its final
/// answer may still sit in the pipe) in case a grandchild holds stdout open.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);
/// After stdout EOF, how long the child gets to exit before it is killed.
const EXIT_AFTER_EOF: Duration = Duration::from_millis(500);
/// stderr lines are only logged, so they are capped well below stdout messages.
const MAX_STDERR_LINE: usize = 16 * 1024;
const NOTIFICATION_CAPACITY: usize = 64;

/// Configuration of one stdio pool (built from `UpstreamConfig`).
#[derive(Debug, Clone)]
pub struct StdioOptions {
    pub name: String,
    pub program: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Maximum number of children (= concurrent calls).
    pub processes: usize,
    /// Initialised idle children kept ready beyond those in use (counted within
    /// `processes`; 0 when `processes` is 1).
    pub spares: usize,
    pub cancel_grace_ms: u64,
    pub idle_reap_ms: u64,
    /// Longest accepted stdout line; longer is a protocol error.
    pub max_message_bytes: usize,
    /// Directory where child pids are recorded so leftovers of a previous (kill -9'd)
    /// gateway run can be killed at start-up: `<store.runtime_dir>/<replica id>`.
    pub pid_dir: PathBuf,
    /// Told about every completed `initialize` (the task plane's identity).
    pub identity: Option<Arc<Identity>>,
}

/// A pool of stdio children speaking legacy MCP; see the module docs.
pub struct StdioPool {
    shared: Arc<Shared>,
}

struct Shared {
    opts: StdioOptions,
    state: Mutex<PoolState>,
    /// Signalled (`notify_waiters`) on every slot change; checkout and `ensure_ready`
    /// re-scan the slots when woken.
    changed: Notify,
    /// One permit per slot. Tokio's semaphore is fair, so calls waiting for a free
    /// child are served FIFO; holding a permit guarantees an unreserved slot exists.
    permits: Arc<Semaphore>,
    notifications: broadcast::Sender<SessionNotification>,
    /// Gateway-minted upstream request ids and progress tokens, unique per pool.
    next_id: AtomicU64,
    next_token: AtomicU64,
    next_serial: AtomicU64,
    shutdown: CancellationToken,
    info: Mutex<Option<UpstreamInfo>>,
    /// Every child with a process, including ones still in the handshake.
    live: Mutex<HashMap<u64, Arc<Child>>>,
    /// Effective spares: `opts.spares` capped to the pool (0 for a single child).
    spares: usize,
    throttle: CrashThrottle,
}

struct PoolState {
    slots: Vec<Slot>,
    /// Calls holding a permit that have not been given a child yet: demand that the
    /// pool starts children for, on top of the spares.
    waiting: usize,
    /// Consecutive failed starts, pool-wide, and the backoff they impose on starting
    /// further slots.
    start_failures: u32,
    starts_blocked_until: Option<Instant>,
}

struct Slot {
    state: SlotState,
    /// Reserved by a call (or by a cancelled call waiting out its grace period).
    busy: bool,
    idle_since: Instant,
}

enum SlotState {
    /// No supervisor: never started, reaped, or an extra slot whose start failed.
    Inactive,
    /// Spawning, initializing, or waiting out a restart backoff.
    Starting,
    Ready(Arc<Child>),
    /// The last start failed; the supervisor retries after a backoff.
    Down(String),
}

enum WriterCmd {
    Line(Vec<u8>),
    /// Close stdin (the polite first step of stopping a child).
    Close,
}

/// One running child process.
struct Child {
    serial: u64,
    pid: u32,
    writer: mpsc::UnboundedSender<WriterCmd>,
    /// The call this child is serving, if any. Only the call holding the slot sets it.
    active: Mutex<Option<Active>>,
    /// Cancelled once the process is reaped and its group cleaned up.
    gone: CancellationToken,
    /// Set when the child is being killed, so checkout never hands it out again.
    doomed: AtomicBool,
    info: Mutex<Option<UpstreamInfo>>,
    pid_file: Option<PathBuf>,
    /// Set when the child went away on its own while serving a call (not killed by
    /// the pool): its replacement starts at once.
    died_serving: AtomicBool,
}

/// Routing for the call in flight on a child.
struct Active {
    request_id: u64,
    /// Whose call it is, for the crash throttle (`None` for the gateway's own calls).
    caller: Option<Caller>,
    progress_token: Option<String>,
    events: mpsc::Sender<CallEvent>,
    reply: oneshot::Sender<Result<CallOutcome, UpstreamError>>,
    /// Cancelled when the call is abandoned (future dropped) or over: events are then
    /// dropped and pending input requests are answered with an error.
    token: CancellationToken,
}

impl Child {
    fn send(&self, msg: &Value) -> bool {
        match serde_json::to_vec(msg) {
            // serde_json escapes control characters, so the line has no raw newline.
            Ok(bytes) => self.writer.send(WriterCmd::Line(bytes)).is_ok(),
            Err(_) => false,
        }
    }

    fn usable(&self) -> bool {
        !self.doomed.load(Ordering::SeqCst) && !self.gone.is_cancelled()
    }

    /// Signal the child's process group, unless it is already reaped (its pid could
    /// then belong to someone else).
    fn signal(&self, sig: i32) {
        if !self.gone.is_cancelled() {
            process::kill_group(self.pid, sig);
        }
    }

    fn kill(&self) {
        self.doomed.store(true, Ordering::SeqCst);
        self.signal(libc::SIGKILL);
    }

    fn take_active(&self) -> Option<Active> {
        self.active.lock().ok().and_then(|mut a| a.take())
    }

    /// Close stdin, then SIGTERM, then SIGKILL the group (spec C7), waiting in between.
    async fn terminate(&self) {
        self.doomed.store(true, Ordering::SeqCst);
        let _ = self.writer.send(WriterCmd::Close);
        if tokio::time::timeout(STDIN_EOF_GRACE, self.gone.cancelled())
            .await
            .is_ok()
        {
            return;
        }
        // Some servers (e.g. server-everything) ignore stdin EOF.
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(SIGTERM_GRACE, self.gone.cancelled())
            .await
            .is_ok()
        {
            return;
        }
        self.signal(libc::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.gone.cancelled()).await;
    }
}

impl StdioPool {
    /// Create the pool and start slot 0 in the background. Must be called inside a
    /// tokio runtime.
    pub fn start(opts: StdioOptions) -> Arc<Self> {
        let processes = opts.processes.max(1);
        let spares = if processes == 1 {
            0
        } else {
            opts.spares.min(processes)
        };
        let now = Instant::now();
        let slots = (0..processes)
            .map(|_| Slot {
                state: SlotState::Inactive,
                busy: false,
                idle_since: now,
            })
            .collect();
        let (notifications, _) = broadcast::channel(NOTIFICATION_CAPACITY);
        let shared = Arc::new(Shared {
            opts,
            state: Mutex::new(PoolState {
                slots,
                waiting: 0,
                start_failures: 0,
                starts_blocked_until: None,
            }),
            changed: Notify::new(),
            permits: Arc::new(Semaphore::new(processes)),
            notifications,
            next_id: AtomicU64::new(1),
            next_token: AtomicU64::new(1),
            next_serial: AtomicU64::new(1),
            shutdown: CancellationToken::new(),
            info: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            spares,
            throttle: CrashThrottle::default(),
        });
        if let Ok(mut st) = shared.state.lock() {
            shared.activate(&mut st, 0);
            shared.replenish(&mut st);
        }
        Arc::new(Self { shared })
    }

    /// Pids of the children currently alive (for tests and diagnostics).
    pub fn child_pids(&self) -> Vec<u32> {
        self.shared
            .live
            .lock()
            .map(|l| l.values().map(|c| c.pid).collect())
            .unwrap_or_default()
    }
}

impl Drop for StdioPool {
    /// Last handle gone without `shutdown()`: don't leave children behind.
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        for child in self.shared.live_children() {
            child.kill();
        }
    }
}

impl Shared {
    fn name(&self) -> &str {
        &self.opts.name
    }

    fn live_children(&self) -> Vec<Arc<Child>> {
        self.live
            .lock()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Start a supervisor for an inactive slot. Caller holds the state lock.
    fn activate(self: &Arc<Self>, st: &mut PoolState, idx: usize) {
        if self.shutdown.is_cancelled() {
            return;
        }
        let Some(slot) = st.slots.get_mut(idx) else {
            return;
        };
        if !matches!(slot.state, SlotState::Inactive) {
            return;
        }
        slot.state = SlotState::Starting;
        tokio::spawn(supervise(self.clone(), idx));
    }

    /// Start inactive slots until the pool has enough children ready or starting for
    /// the calls waiting plus the spares — all of them at once, so replacements start
    /// in parallel and before anyone needs them. Caller holds the state lock.
    fn replenish(self: &Arc<Self>, st: &mut PoolState) {
        if self.shutdown.is_cancelled() {
            return;
        }
        if st.starts_blocked_until.is_some_and(|t| Instant::now() < t) {
            return; // backing off after failed starts
        }
        let coming = |s: &Slot| {
            !s.busy
                && match &s.state {
                    SlotState::Starting => true,
                    SlotState::Ready(c) => c.usable(),
                    _ => false,
                }
        };
        let idle = st.slots.iter().filter(|s| coming(s)).count();
        let live = st
            .slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Starting | SlotState::Ready(_)))
            .count();
        let mut need = st.waiting + self.spares;
        if live == 0 {
            need = need.max(1);
        }
        let missing = need.saturating_sub(idle);
        let inactive: Vec<usize> = st
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy && matches!(s.state, SlotState::Inactive))
            .map(|(i, _)| i)
            .take(missing)
            .collect();
        for idx in inactive {
            self.activate(st, idx);
        }
    }

    fn set_slot(self: &Arc<Self>, idx: usize, state: SlotState) {
        if let Ok(mut st) = self.state.lock() {
            if let Some(slot) = st.slots.get_mut(idx) {
                slot.state = state;
                slot.idle_since = Instant::now();
            }
            self.replenish(&mut st);
        }
        self.changed.notify_waiters();
    }

    /// Return a slot reservation (call finished, or its cancelled call was settled).
    fn release(self: &Arc<Self>, idx: usize) {
        if let Ok(mut st) = self.state.lock() {
            if let Some(slot) = st.slots.get_mut(idx) {
                slot.busy = false;
                slot.idle_since = Instant::now();
            }
            self.replenish(&mut st);
        }
        self.changed.notify_waiters();
    }

    /// A start failed (or a child quit right after starting): back off further
    /// starts pool-wide. Returns the delay.
    fn start_failed(&self) -> Duration {
        let Ok(mut st) = self.state.lock() else {
            return BACKOFF_MAX;
        };
        st.start_failures = st.start_failures.saturating_add(1);
        let doublings = st.start_failures.saturating_sub(1).min(16);
        let delay = (BACKOFF_INITIAL * 2u32.pow(doublings)).min(BACKOFF_MAX);
        st.starts_blocked_until = Some(Instant::now() + delay);
        delay
    }

    fn start_succeeded(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.start_failures = 0;
            st.starts_blocked_until = None;
        }
    }

    fn unavailable(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Unavailable {
            upstream: self.opts.name.clone(),
            reason: reason.into(),
        }
    }

    /// Reserve a ready child for one call. The caller holds a semaphore permit, so at
    /// least one slot is unreserved. While it waits, the call counts as demand.
    async fn checkout(self: &Arc<Self>) -> Result<(usize, Arc<Child>), UpstreamError> {
        struct Waiting<'a>(&'a Shared);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let Ok(mut st) = self.0.state.lock() {
                    st.waiting = st.waiting.saturating_sub(1);
                }
            }
        }
        if let Ok(mut st) = self.state.lock() {
            st.waiting += 1;
        }
        let _waiting = Waiting(self);
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            {
                let mut st = self
                    .state
                    .lock()
                    .map_err(|_| self.unavailable("pool state poisoned"))?;
                if self.shutdown.is_cancelled() {
                    return Err(UpstreamError::ShuttingDown);
                }
                let free = |s: &Slot| !s.busy;
                if let Some((idx, child)) = st.slots.iter().enumerate().find_map(|(i, s)| match &s
                    .state
                {
                    SlotState::Ready(c) if free(s) && c.usable() => Some((i, c.clone())),
                    _ => None,
                }) {
                    if let Some(slot) = st.slots.get_mut(idx) {
                        slot.busy = true;
                    }
                    // No longer waiting; taking a child may have used up a spare.
                    st.waiting = st.waiting.saturating_sub(1);
                    self.replenish(&mut st);
                    st.waiting += 1; // undone by `_waiting`
                    return Ok((idx, child));
                }
                self.replenish(&mut st);
                // A free slot that is (re)starting will become ready: wait for it.
                let starting = st.slots.iter().any(|s| {
                    free(s) && matches!(&s.state, SlotState::Starting | SlotState::Ready(_))
                });
                if !starting {
                    let reason = st
                        .slots
                        .iter()
                        .find_map(|s| match &s.state {
                            SlotState::Down(r) => Some(r.clone()),
                            _ => None,
                        })
                        .unwrap_or_else(|| "no child available".into());
                    return Err(self.unavailable(reason));
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = self.shutdown.cancelled() => return Err(UpstreamError::ShuttingDown),
            }
        }
    }

    async fn ensure_ready(self: &Arc<Self>) -> Result<UpstreamInfo, UpstreamError> {
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            {
                let mut st = self
                    .state
                    .lock()
                    .map_err(|_| self.unavailable("pool state poisoned"))?;
                if self.shutdown.is_cancelled() {
                    return Err(UpstreamError::ShuttingDown);
                }
                let ready = st.slots.iter().find_map(|s| match &s.state {
                    SlotState::Ready(c) if c.usable() => c.info.lock().ok().and_then(|i| i.clone()),
                    _ => None,
                });
                if let Some(info) = ready {
                    return Ok(info);
                }
                if st
                    .slots
                    .iter()
                    .all(|s| matches!(s.state, SlotState::Inactive))
                {
                    self.activate(&mut st, 0);
                }
                let pending = st
                    .slots
                    .iter()
                    .any(|s| matches!(s.state, SlotState::Starting | SlotState::Ready(_)));
                if !pending {
                    let reason = st
                        .slots
                        .iter()
                        .find_map(|s| match &s.state {
                            SlotState::Down(r) => Some(r.clone()),
                            _ => None,
                        })
                        .unwrap_or_else(|| "no child could be started".into());
                    return Err(self.unavailable(reason));
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = self.shutdown.cancelled() => return Err(UpstreamError::ShuttingDown),
            }
        }
    }

    fn state(&self) -> TransportState {
        if self.shutdown.is_cancelled() {
            return TransportState::Down("shut down".into());
        }
        let Ok(st) = self.state.lock() else {
            return TransportState::Down("pool state poisoned".into());
        };
        if st
            .slots
            .iter()
            .any(|s| matches!(&s.state, SlotState::Ready(c) if c.usable()))
        {
            return TransportState::Ready;
        }
        match st.slots.first().map(|s| &s.state) {
            Some(SlotState::Down(r)) => TransportState::Down(r.clone()),
            _ => TransportState::Starting,
        }
    }

    async fn call(
        self: &Arc<Self>,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        if self.shutdown.is_cancelled() {
            return Err(UpstreamError::ShuttingDown);
        }
        let caller = spec.tenant.as_ref().map(|tenant| Caller {
            tenant: tenant.clone(),
            tool: spec
                .params
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or(&spec.method)
                .to_string(),
        });
        // Held for the whole call: a throttled caller runs one call at a time.
        let _throttled = match &caller {
            Some(c) => {
                let admitted = tokio::select! {
                    p = self.throttle.admit(c) => p,
                    () = self.shutdown.cancelled() => return Err(UpstreamError::ShuttingDown),
                };
                if admitted.is_some() {
                    crate::metrics::stdio_throttled(self.name(), &c.tool);
                }
                admitted
            }
            None => None,
        };
        let permit = tokio::select! {
            p = self.permits.clone().acquire_owned() => {
                p.map_err(|_| UpstreamError::ShuttingDown)?
            }
            () = self.shutdown.cancelled() => return Err(UpstreamError::ShuttingDown),
        };
        let (slot, child) = self.checkout().await?;
        // From here on the guard owns the reservation; dropping it (the call future
        // was dropped) runs the cancellation protocol.
        let mut guard = CallGuard {
            shared: self.clone(),
            slot,
            child: child.clone(),
            permit: Some(permit),
            sent: None,
        };

        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut params = spec.params;
        let progress_token = spec.want_progress.then(|| {
            let token = format!(
                "taskgate-{}",
                self.next_token.fetch_add(1, Ordering::Relaxed)
            );
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if !meta.is_object() {
                *meta = Value::Object(Map::new());
            }
            if let Value::Object(m) = meta {
                m.insert("progressToken".into(), Value::String(token.clone()));
            }
            token
        });
        let (reply_tx, reply_rx) = oneshot::channel();
        let token = CancellationToken::new();
        if let Ok(mut a) = child.active.lock() {
            // Routing must be in place before the request is written, or early
            // progress from the child would be treated as unowned.
            *a = Some(Active {
                request_id,
                caller,
                progress_token,
                events,
                reply: reply_tx,
                token: token.clone(),
            });
        }
        guard.sent = Some(Sent {
            request_id,
            reply_rx,
            token,
        });
        if !child.send(&legacy_messages::request(request_id, &spec.method, params)) {
            guard.finish();
            child.take_active();
            // The writer is gone, so the line was never queued: nothing ran upstream.
            return Err(self.unavailable("child stdin is closed; the request was not sent"));
        }

        let result = {
            let Some(sent) = guard.sent.as_mut() else {
                return Err(UpstreamError::ShuttingDown);
            };
            let broken = || {
                Err(UpstreamError::Broken {
                    upstream: self.opts.name.clone(),
                    reason: "child went away without answering".into(),
                })
            };
            tokio::select! {
                biased;
                r = &mut sent.reply_rx => r.unwrap_or_else(|_| broken()),
                () = self.shutdown.cancelled() => Err(UpstreamError::ShuttingDown),
                // The child may have died just before our routing was installed, in
                // which case nobody will ever fail the call for us.
                () = child.gone.cancelled() => sent.reply_rx.try_recv().unwrap_or_else(|_| broken()),
            }
        };
        guard.finish();
        result
    }

    async fn shutdown(self: &Arc<Self>) {
        self.shutdown.cancel();
        self.changed.notify_waiters();
        let children = self.live_children();
        for child in &children {
            if let Some(active) = child.take_active() {
                active.token.cancel();
                let _ = active.reply.send(Err(UpstreamError::ShuttingDown));
            }
        }
        futures_util::future::join_all(children.iter().map(|c| c.terminate())).await;
        for child in &children {
            if let Some(p) = &child.pid_file {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

struct Sent {
    request_id: u64,
    reply_rx: oneshot::Receiver<Result<CallOutcome, UpstreamError>>,
    token: CancellationToken,
}

/// Owns a call's slot reservation. Normal completion releases it; being dropped
/// unfinished cancels the call upstream and keeps the child reserved until it settles.
struct CallGuard {
    shared: Arc<Shared>,
    slot: usize,
    child: Arc<Child>,
    permit: Option<OwnedSemaphorePermit>,
    sent: Option<Sent>,
}

impl CallGuard {
    fn finish(&mut self) {
        if let Some(sent) = self.sent.take() {
            sent.token.cancel();
        }
        self.shared.release(self.slot);
        // Release the slot before the permit, so the next permit holder finds it free.
        self.permit.take();
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return; // finished normally
        };
        let Some(mut sent) = self.sent.take() else {
            self.shared.release(self.slot);
            drop(permit);
            return;
        };
        sent.token.cancel();
        // The answer may already be waiting: then there is nothing to cancel.
        if sent.reply_rx.try_recv().is_ok() || !self.child.usable() {
            self.shared.release(self.slot);
            drop(permit);
            return;
        }
        self.child.send(&legacy_messages::cancelled(
            sent.request_id,
            "the gateway client cancelled the request",
        ));
        let shared = self.shared.clone();
        let child = self.child.clone();
        let slot = self.slot;
        let grace = Duration::from_millis(shared.opts.cancel_grace_ms);
        let settle = async move {
            // Either the child answers (discarded), dies (the reader fails the reply),
            // or it is killed once the grace period is over.
            let settled = tokio::select! {
                r = tokio::time::timeout(grace, sent.reply_rx) => r.is_ok(),
                () = child.gone.cancelled() => true,
            };
            if !settled {
                tracing::warn!(upstream = %shared.name(), pid = child.pid,
                    "child did not settle a cancelled call within cancel_grace_ms; killing it");
                child.kill();
            }
            shared.release(slot);
            drop(permit);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(settle);
            }
            Err(_) => {
                // No runtime to wait in: the only safe option is a fresh child.
                self.child.kill();
                self.shared.release(self.slot);
            }
        }
    }
}

/// Keep one slot's child alive: spawn, initialize, wait for exit or idleness, restart.
async fn supervise(shared: Arc<Shared>, idx: usize) {
    loop {
        if shared.shutdown.is_cancelled() {
            return;
        }
        let backoff = match spawn_child(&shared).await {
            Ok(child) => {
                let started = Instant::now();
                shared.start_succeeded();
                if let Some(info) = child.info.lock().ok().and_then(|i| i.clone())
                    && let Ok(mut slot_info) = shared.info.lock()
                {
                    *slot_info = Some(info);
                }
                shared.set_slot(idx, SlotState::Ready(child.clone()));
                let reaped = watch_child(&shared, idx, &child).await;
                if reaped || shared.shutdown.is_cancelled() {
                    if reaped {
                        child.terminate().await;
                    }
                    return;
                }
                crate::metrics::upstream_restart(shared.name(), "stdio_restart");
                // Dying while serving a call says nothing about the child's ability to
                // start: replace it at once (repeat offenders are throttled instead).
                let quick_idle_exit =
                    !child.died_serving.load(Ordering::SeqCst) && started.elapsed() < STABLE_UPTIME;
                let delay = if quick_idle_exit {
                    shared.start_failed()
                } else {
                    Duration::ZERO
                };
                tracing::warn!(upstream = %shared.name(), pid = child.pid, slot = idx,
                    delay_ms = delay.as_millis() as u64, "stdio child exited; restarting");
                if delay.is_zero() {
                    shared.set_slot(idx, SlotState::Starting);
                    continue;
                }
                delay
            }
            Err(reason) => {
                let delay = shared.start_failed();
                tracing::warn!(upstream = %shared.name(), slot = idx, %reason,
                    delay_ms = delay.as_millis() as u64, "stdio child failed to start");
                shared.set_slot(idx, SlotState::Down(reason));
                if idx > 0 {
                    // Extra slots serve demand: once the backoff is over the pool
                    // starts whichever slots it then needs.
                    sleep_or_shutdown(&shared, delay).await;
                    shared.set_slot(idx, SlotState::Inactive);
                    return;
                }
                delay
            }
        };
        sleep_or_shutdown(&shared, backoff).await;
        if shared.shutdown.is_cancelled() {
            return;
        }
        shared.set_slot(idx, SlotState::Starting);
    }
}

async fn sleep_or_shutdown(shared: &Shared, d: Duration) {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        () = shared.shutdown.cancelled() => {}
    }
}

/// Wait until the child goes away (false) or, for extra slots, is reaped because it
/// stayed idle for `idle_reap_ms` while the pool had more idle children than its
/// spares (true; the slot is then already `Inactive`).
async fn watch_child(shared: &Shared, idx: usize, child: &Child) -> bool {
    if idx == 0 {
        // The first child is never reaped: it answers `ensure_ready` and `info()`.
        child.gone.cancelled().await;
        return false;
    }
    let reap_after = Duration::from_millis(shared.opts.idle_reap_ms.max(1));
    loop {
        let next_check = {
            let Ok(mut st) = shared.state.lock() else {
                return false;
            };
            let Some(slot) = st.slots.get(idx) else {
                return false;
            };
            let idle_for = slot.idle_since.elapsed();
            let reapable = !slot.busy && child.usable() && idle_for >= reap_after;
            let idle_ready = st
                .slots
                .iter()
                .filter(|s| !s.busy && matches!(&s.state, SlotState::Ready(c) if c.usable()))
                .count();
            if reapable && idle_ready > shared.spares {
                if let Some(slot) = st.slots.get_mut(idx) {
                    // Marked under the lock so no call can check the child out any more.
                    slot.state = SlotState::Inactive;
                }
                child.doomed.store(true, Ordering::SeqCst);
                drop(st);
                shared.changed.notify_waiters();
                tracing::info!(upstream = %shared.name(), pid = child.pid, slot = idx,
                    "reaping idle stdio child");
                return true;
            }
            if reapable {
                // Idle long enough but one of the spares: look again a period later.
                reap_after
            } else {
                reap_after
                    .saturating_sub(idle_for)
                    .max(Duration::from_millis(10))
            }
        };
        tokio::select! {
            () = child.gone.cancelled() => return false,
            () = tokio::time::sleep(next_check) => {}
        }
    }
}

/// Spawn one child and run the `initialize` handshake (spec C2).
async fn spawn_child(shared: &Arc<Shared>) -> Result<Arc<Child>, String> {
    let opts = &shared.opts;
    let mut cmd = tokio::process::Command::new(&opts.program);
    cmd.args(&opts.args)
        .envs(&opts.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    process::configure(&mut cmd);
    let mut proc = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", opts.program))?;
    let Some(pid) = proc.id() else {
        return Err(format!("{} exited immediately", opts.program));
    };
    process::mark_live(pid);
    let pid_file = process::record(&opts.pid_dir, &opts.name, &opts.program, pid);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (proc.stdin.take(), proc.stdout.take(), proc.stderr.take())
    else {
        process::kill_group(pid, libc::SIGKILL);
        let _ = proc.wait().await;
        process::unmark_live(pid);
        if let Some(p) = &pid_file {
            let _ = std::fs::remove_file(p);
        }
        return Err("child stdio pipes are missing".into());
    };

    let (writer, writer_rx) = mpsc::unbounded_channel();
    let child = Arc::new(Child {
        serial: shared.next_serial.fetch_add(1, Ordering::Relaxed),
        pid,
        writer,
        active: Mutex::new(None),
        gone: CancellationToken::new(),
        doomed: AtomicBool::new(false),
        info: Mutex::new(None),
        pid_file,
        died_serving: AtomicBool::new(false),
    });
    if let Ok(mut live) = shared.live.lock() {
        live.insert(child.serial, child.clone());
    }
    tokio::spawn(write_loop(stdin, writer_rx));
    tokio::spawn(log_stderr(shared.opts.name.clone(), pid, stderr));
    let (init_tx, init_rx) = oneshot::channel();
    let init_id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(run_child(
        shared.clone(),
        child.clone(),
        proc,
        stdout,
        Some((init_id, init_tx)),
    ));
    // Shutdown may have snapshotted `live` before this child was inserted.
    if shared.shutdown.is_cancelled() {
        child.kill();
        return Err("gateway is shutting down".into());
    }
    child.send(&legacy_messages::initialize_request(init_id));

    let outcome = tokio::select! {
        r = init_rx => r.unwrap_or_else(|_| Err("child went away during initialize".into())),
        () = tokio::time::sleep(INIT_TIMEOUT) => Err(format!(
            "no initialize answer within {}s", INIT_TIMEOUT.as_secs()
        )),
        () = shared.shutdown.cancelled() => Err("gateway is shutting down".into()),
    };
    match outcome {
        Ok(info) => {
            if let Some(id) = &shared.opts.identity {
                id.learned(&info);
            }
            if let Ok(mut i) = child.info.lock() {
                *i = Some(info);
            }
            // Attribution is a security boundary (policy 14): servers send unsolicited
            // requests right after `initialized` (server-everything asks `roots/list`
            // ~350 ms later). A child gets its first call only after this settle
            // window, so such a request is answered as unowned instead of being
            // blamed on — or shown to — whichever client's call happens to run.
            tokio::select! {
                () = tokio::time::sleep(SETTLE_AFTER_INIT) => {}
                () = shared.shutdown.cancelled() => {
                    child.kill();
                    return Err("gateway is shutting down".into());
                }
            }
            tracing::info!(upstream = %shared.name(), pid, "stdio child ready");
            Ok(child)
        }
        Err(reason) => {
            child.kill();
            Err(reason)
        }
    }
}

async fn write_loop(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<WriterCmd>,
) {
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriterCmd::Line(mut bytes) => {
                bytes.push(b'\n');
                // A write error means the child is gone; the reader reports that.
                if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                    return;
                }
            }
            WriterCmd::Close => return,
        }
    }
}

async fn log_stderr(name: String, pid: u32, stderr: ChildStderr) {
    let mut reader = LineReader::new(BufReader::new(stderr), MAX_STDERR_LINE);
    loop {
        match reader.next().await {
            Ok(Next::Line(bytes)) => {
                tracing::info!(upstream = %name, pid, "stderr: {}", String::from_utf8_lossy(&bytes));
            }
            Ok(Next::TooLong) => {
                tracing::info!(upstream = %name, pid, "stderr: <line longer than {MAX_STDERR_LINE} bytes skipped>");
            }
            Ok(Next::Eof) | Err(_) => return,
        }
    }
}

enum EndCause {
    Eof,
    TooLong,
    ReadError(std::io::Error),
    Exited,
}

/// Read the child's stdout until it ends, dispatch every message, then clean up: reap
/// the process, kill its group's stragglers, fail the in-flight call, drop the pid
/// record, and mark the child gone (which makes the supervisor restart the slot).
async fn run_child(
    shared: Arc<Shared>,
    child: Arc<Child>,
    mut proc: tokio::process::Child,
    stdout: ChildStdout,
    mut init: Option<(u64, oneshot::Sender<Result<UpstreamInfo, String>>)>,
) {
    let max = shared.opts.max_message_bytes;
    let mut reader = LineReader::new(BufReader::new(stdout), max);
    let mut status: Option<std::io::Result<ExitStatus>> = None;
    let cause = loop {
        tokio::select! {
            r = reader.next() => match r {
                Ok(Next::Line(bytes)) => dispatch_line(&shared, &child, &bytes, &mut init).await,
                Ok(Next::TooLong) => break EndCause::TooLong,
                Ok(Next::Eof) => break EndCause::Eof,
                Err(e) => break EndCause::ReadError(e),
            },
            s = proc.wait(), if status.is_none() => {
                status = Some(s);
                break EndCause::Exited;
            }
        }
    };
    // Doomed already = the pool killed it (reaped, cancel not settled, shutdown).
    let killed_by_pool = child.doomed.swap(true, Ordering::SeqCst);
    match &cause {
        EndCause::Exited => {
            // The final answer may still be in the pipe: read what is left, bounded
            // in time because a grandchild may keep stdout open.
            let drain = async {
                while let Ok(Next::Line(bytes)) = reader.next().await {
                    dispatch_line(&shared, &child, &bytes, &mut init).await;
                }
            };
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await;
        }
        EndCause::TooLong => {
            process::kill_group(child.pid, libc::SIGKILL);
        }
        EndCause::Eof | EndCause::ReadError(_) => {}
    }
    let status = match status {
        Some(s) => s,
        None => match tokio::time::timeout(EXIT_AFTER_EOF, proc.wait()).await {
            Ok(s) => s,
            Err(_) => {
                process::kill_group(child.pid, libc::SIGKILL);
                proc.wait().await
            }
        },
    };
    // Grandchildren of a dead leader would otherwise live on with our stdio pipes.
    process::kill_group(child.pid, libc::SIGKILL);
    process::unmark_live(child.pid);

    let exit = match &status {
        Ok(s) => describe_status(*s),
        Err(e) => format!("exited (status unknown: {e})"),
    };
    let desc = match &cause {
        EndCause::Exited => format!("child {exit}"),
        EndCause::Eof => format!("child closed stdout and {exit}"),
        EndCause::TooLong => format!("child sent a message longer than {max} bytes"),
        EndCause::ReadError(e) => format!("reading child stdout failed ({e}); child {exit}"),
    };
    if let Some(active) = child.take_active() {
        active.token.cancel();
        child.died_serving.store(true, Ordering::SeqCst);
        if !killed_by_pool
            && !shared.shutdown.is_cancelled()
            && let Some(caller) = &active.caller
            && let Verdict::Throttled(penalty) = shared.throttle.crashed(caller, Instant::now())
        {
            tracing::warn!(upstream = %shared.name(), tenant = %caller.tenant,
                tool = %caller.tool, penalty_ms = penalty.as_millis() as u64,
                "calls keep killing stdio children; throttling this tenant and tool \
                 (one call at a time, each after the penalty)");
        }
        let err = if shared.shutdown.is_cancelled() {
            UpstreamError::ShuttingDown
        } else if matches!(cause, EndCause::TooLong) {
            UpstreamError::Protocol {
                upstream: shared.opts.name.clone(),
                reason: desc.clone(),
            }
        } else {
            UpstreamError::Broken {
                upstream: shared.opts.name.clone(),
                reason: format!("{desc} while the call was in flight"),
            }
        };
        let _ = active.reply.send(Err(err));
    }
    if let Some((_, tx)) = init.take() {
        let _ = tx.send(Err(desc.clone()));
    }
    if shared.shutdown.is_cancelled() {
        tracing::info!(upstream = %shared.name(), pid = child.pid, "{desc}");
    } else {
        tracing::warn!(upstream = %shared.name(), pid = child.pid, "{desc}");
    }
    if let Some(p) = &child.pid_file {
        let _ = std::fs::remove_file(p);
    }
    if let Ok(mut live) = shared.live.lock() {
        live.remove(&child.serial);
    }
    let _ = child.writer.send(WriterCmd::Close);
    child.gone.cancel();
}

fn describe_status(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("exited with signal {sig}"),
        _ => format!("exited ({s})"),
    }
}

async fn dispatch_line(
    shared: &Shared,
    child: &Arc<Child>,
    bytes: &[u8],
    init: &mut Option<(u64, oneshot::Sender<Result<UpstreamInfo, String>>)>,
) {
    let text = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    if text.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let msg: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(_) => {
            // Stdout should carry MCP only, but stray prints are common; they are not
            // worth killing a child over.
            let preview: String = String::from_utf8_lossy(text).chars().take(200).collect();
            tracing::warn!(upstream = %shared.name(), pid = child.pid,
                "ignoring non-JSON stdout line: {preview}");
            return;
        }
    };
    match msg {
        // 2025-03-26 batches: handle each element as its own message.
        Value::Array(items) => {
            for item in items {
                dispatch(shared, child, item, init).await;
            }
        }
        other => dispatch(shared, child, other, init).await,
    }
}

async fn dispatch(
    shared: &Shared,
    child: &Arc<Child>,
    msg: Value,
    init: &mut Option<(u64, oneshot::Sender<Result<UpstreamInfo, String>>)>,
) {
    let inbound = match legacy_messages::classify(msg) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(upstream = %shared.name(), pid = child.pid, "ignoring message: {e}");
            return;
        }
    };
    match inbound {
        Inbound::Response { id, outcome } => {
            if let Some((init_id, _)) = init
                && id.as_u64() == Some(*init_id)
            {
                let Some((_, tx)) = init.take() else { return };
                let result = match outcome {
                    CallOutcome::Result(r) => legacy_messages::parse_initialize_result(&r),
                    CallOutcome::Error(e) => Err(format!("initialize failed: {e}")),
                };
                if result.is_ok() {
                    // Queued before any call request can be, so ordering holds.
                    child.send(&legacy_messages::initialized_notification());
                }
                let _ = tx.send(result);
                return;
            }
            let active = child.active.lock().ok().and_then(|mut a| {
                if a.as_ref()
                    .is_some_and(|x| id.as_u64() == Some(x.request_id))
                {
                    a.take()
                } else {
                    None
                }
            });
            match active {
                Some(active) => {
                    active.token.cancel();
                    // If the call was abandoned the receiver belongs to the grace
                    // task, which only needs to know the child settled.
                    let _ = active.reply.send(Ok(outcome));
                }
                None => {
                    tracing::debug!(upstream = %shared.name(), pid = child.pid, %id,
                        "discarding response to no in-flight request");
                }
            }
        }
        Inbound::Request { id, method, params } => {
            handle_request(shared, child, id, method, params).await;
        }
        Inbound::Notification { method, params } => {
            handle_notification(shared, child, method, params).await;
        }
    }
}

/// The in-flight, non-abandoned call's routing (cloned out so no lock is held across
/// an await).
fn current_call(
    child: &Child,
) -> Option<(mpsc::Sender<CallEvent>, CancellationToken, Option<String>)> {
    let guard = child.active.lock().ok()?;
    let a = guard.as_ref()?;
    if a.token.is_cancelled() {
        return None;
    }
    Some((a.events.clone(), a.token.clone(), a.progress_token.clone()))
}

/// Deliver an event to the call without ever blocking the reader past the call's end:
/// a closed receiver drops it, an abandoned call stops the wait.
async fn deliver(
    events: &mpsc::Sender<CallEvent>,
    token: &CancellationToken,
    ev: CallEvent,
) -> bool {
    tokio::select! {
        r = events.send(ev) => r.is_ok(),
        () = token.cancelled() => false,
    }
}

async fn handle_request(
    shared: &Shared,
    child: &Arc<Child>,
    id: Value,
    method: String,
    params: Option<Value>,
) {
    let is_input = matches!(
        method.as_str(),
        "elicitation/create" | "sampling/createMessage" | "roots/list"
    );
    if method == "ping" || !is_input {
        child.send(&legacy_messages::answer(
            &id,
            &super::unowned_request_answer(&method),
        ));
        return;
    }
    let Some((events, token, _)) = current_call(child) else {
        // Attribution is a security boundary: with no call in flight nobody may see it.
        tracing::info!(upstream = %shared.name(), pid = child.pid, %method,
            "answering upstream request no call owns");
        child.send(&legacy_messages::answer(
            &id,
            &super::unowned_request_answer(&method),
        ));
        return;
    };
    let (respond, answer_rx) = oneshot::channel();
    let ev = CallEvent::Input(InputRequest {
        method: method.clone(),
        params,
        respond,
    });
    // If delivery fails the event (and `respond`) is dropped, so `answer_rx` resolves
    // to an error right away below.
    deliver(&events, &token, ev).await;
    let child = child.clone();
    // Answering may take a human's time: don't hold up the reader meanwhile.
    tokio::spawn(async move {
        let answer = tokio::select! {
            r = answer_rx => r.unwrap_or_else(|_| InputAnswer::Error(RpcError::internal(
                format!("{method} was not answered by the gateway client"),
            ))),
            () = token.cancelled() => InputAnswer::Error(RpcError::internal(
                "the request this input belongs to is no longer in flight",
            )),
            () = child.gone.cancelled() => return,
        };
        child.send(&legacy_messages::answer(&id, &answer));
    });
}

async fn handle_notification(
    shared: &Shared,
    child: &Arc<Child>,
    method: String,
    params: Option<Value>,
) {
    match method.as_str() {
        "notifications/progress" => {
            let Some((token, rest)) = legacy_messages::split_progress(params) else {
                return;
            };
            match current_call(child) {
                Some((events, call_token, Some(mine))) if token.as_str() == Some(mine.as_str()) => {
                    deliver(&events, &call_token, CallEvent::Progress(rest)).await;
                }
                _ => {
                    tracing::debug!(upstream = %shared.name(), pid = child.pid, %token,
                        "dropping progress for no in-flight call");
                }
            }
        }
        "notifications/message" => {
            let Some(Value::Object(p)) = params else {
                return;
            };
            match current_call(child) {
                Some((events, token, _)) => {
                    deliver(&events, &token, CallEvent::Log(p)).await;
                }
                None => {
                    let text = Value::Object(p).to_string();
                    tracing::info!(upstream = %shared.name(), pid = child.pid,
                        "upstream log outside any call: {text}");
                }
            }
        }
        "notifications/tools/list_changed"
        | "notifications/prompts/list_changed"
        | "notifications/resources/list_changed"
        | "notifications/resources/updated" => {
            // No subscribers is fine: nobody is listening yet.
            let _ = shared
                .notifications
                .send(SessionNotification { method, params });
        }
        _ => {
            tracing::debug!(upstream = %shared.name(), pid = child.pid, %method,
                "ignoring upstream notification");
        }
    }
}

impl LegacyTransport for StdioPool {
    fn ensure_ready(&self) -> BoxFuture<'_, Result<UpstreamInfo, UpstreamError>> {
        Box::pin(self.shared.ensure_ready())
    }

    fn info(&self) -> Option<UpstreamInfo> {
        self.shared.info.lock().ok().and_then(|i| i.clone())
    }

    fn state(&self) -> TransportState {
        self.shared.state()
    }

    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>> {
        Box::pin(self.shared.call(spec, events))
    }

    fn notifications(&self) -> broadcast::Receiver<SessionNotification> {
        self.shared.notifications.subscribe()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.shared.shutdown())
    }
}

#[cfg(test)]
mod tests;
