//! stdio upstream transport: a pool of children (MCP 2025-11-25 "Transports", "stdio"; docs/design.md §14 "Upstream sessions").
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
//! calls keep killing children is throttled (see `throttle.rs`) so it cannot keep the
//! pool cold for everyone else.
//!
//! Children lead their own process group, get `SIGKILL` if the gateway dies, and are
//! recorded in `pid_dir` (this replica's directory under `store.runtime_dir`) so
//! [`kill_leftovers`] can clean up after a `kill -9` — only groups whose recording
//! gateway is provably dead.

mod call;
mod child;
pub(crate) mod framing;
mod inbound;
mod pinned;
mod pool;
mod process;
mod spawn;
mod supervise;
mod throttle;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub use process::{Leftovers, kill_leftovers, kill_legacy_leftovers};

use self::child::Child;
use self::throttle::CrashThrottle;
use super::identity::Identity;
use super::{
    CallEvent, CallOutcome, CallSpec, LegacyTransport, SessionNotification, SessionRef,
    TaskChannel, TransportState, UpstreamError, UpstreamInfo,
};
use futures_util::future::BoxFuture;

/// First delay after a failed start; doubles per consecutive failure up to the max.
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A child that exits on its own, idle, sooner than this after becoming ready counts
/// as a failed start (a server that quits right after its handshake would otherwise
/// be respawned in a tight loop).
const STABLE_UPTIME: Duration = Duration::from_secs(10);
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
    pub cancel_grace: Duration,
    pub idle_reap: Duration,
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
    /// Shared, so that every request's read under the lock is a reference count, not a
    /// copy (benches/RESULTS.md, issue 26: contended locks on the request path).
    info: Mutex<Option<Arc<UpstreamInfo>>>,
    /// Every child with a process, including ones still in the handshake.
    live: Mutex<HashMap<u64, Arc<Child>>>,
    /// Effective spares: `opts.spares` capped to the pool (0 for a single child).
    spares: usize,
    throttle: CrashThrottle,
    /// Children pinned to upstream tasks (`pinned.rs`) right now.
    pinned: std::sync::atomic::AtomicUsize,
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
            pinned: std::sync::atomic::AtomicUsize::new(0),
        });
        {
            let mut st = shared.state.lock();
            shared.activate(&mut st, 0);
            shared.replenish(&mut st);
        }
        Arc::new(Self { shared })
    }

    /// Pids of the children currently alive (for tests and diagnostics).
    pub fn child_pids(&self) -> Vec<u32> {
        self.shared.live.lock().values().map(|c| c.pid).collect()
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

impl LegacyTransport for StdioPool {
    fn ensure_ready(&self) -> BoxFuture<'_, Result<Arc<UpstreamInfo>, UpstreamError>> {
        Box::pin(self.shared.ensure_ready())
    }

    fn info(&self) -> Option<Arc<UpstreamInfo>> {
        self.shared.info.lock().clone()
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

    fn pin(&self) -> BoxFuture<'_, Result<Arc<dyn TaskChannel>, UpstreamError>> {
        Box::pin(self.shared.pin())
    }

    fn adopt(&self, _session: &SessionRef) -> Option<Arc<dyn TaskChannel>> {
        None
    }

    fn live_tasks(&self) -> usize {
        self.shared.pinned.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests;
