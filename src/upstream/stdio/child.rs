//! One child process as the pool holds it: its handle, the call it serves, writing to
//! it and stopping it. Starting a child and reading its output are `spawn.rs`'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::throttle::Caller;
use crate::upstream::{CallEvent, CallOutcome, UpstreamError, UpstreamInfo};

/// Shutdown: how long a child gets after stdin EOF, then after SIGTERM.
const STDIN_EOF_GRACE: Duration = Duration::from_millis(500);
const SIGTERM_GRACE: Duration = Duration::from_millis(500);
pub(super) enum WriterCmd {
    Line(Vec<u8>),
    /// Close stdin (the polite first step of stopping a child).
    Close,
}

/// One running child process.
pub(super) struct Child {
    pub(super) serial: u64,
    pub(super) pid: u32,
    pub(super) writer: mpsc::UnboundedSender<WriterCmd>,
    /// The call this child is serving, if any. Only the call holding the slot sets it.
    pub(super) active: Mutex<Option<Active>>,
    /// Cancelled once the process is reaped and its group cleaned up.
    pub(super) gone: CancellationToken,
    /// Set when the child is being killed, so checkout never hands it out again.
    pub(super) doomed: AtomicBool,
    pub(super) info: Mutex<Option<Arc<UpstreamInfo>>>,
    pub(super) pid_file: Option<PathBuf>,
    /// Set when the child went away on its own while serving a call (not killed by
    /// the pool): its replacement starts at once.
    pub(super) died_serving: AtomicBool,
}

/// Routing for the call in flight on a child.
pub(super) struct Active {
    pub(super) request_id: u64,
    /// Whose call it is, for the crash throttle (`None` for the gateway's own calls).
    pub(super) caller: Option<Caller>,
    pub(super) progress_token: Option<String>,
    pub(super) events: mpsc::Sender<CallEvent>,
    pub(super) reply: oneshot::Sender<Result<CallOutcome, UpstreamError>>,
    /// Cancelled when the call is abandoned (future dropped) or over: events are then
    /// dropped and pending input requests are answered with an error.
    pub(super) token: CancellationToken,
}

impl Child {
    pub(super) fn send(&self, msg: &Value) -> bool {
        match serde_json::to_vec(msg) {
            // serde_json escapes control characters, so the line has no raw newline.
            Ok(bytes) => self.writer.send(WriterCmd::Line(bytes)).is_ok(),
            Err(_) => false,
        }
    }

    pub(super) fn usable(&self) -> bool {
        !self.doomed.load(Ordering::SeqCst) && !self.gone.is_cancelled()
    }

    /// Signal the child's process group, unless it is already reaped (its pid could
    /// then belong to someone else).
    pub(super) fn signal(&self, sig: i32) {
        if !self.gone.is_cancelled() {
            super::process::kill_group(self.pid, sig);
        }
    }

    pub(super) fn kill(&self) {
        self.doomed.store(true, Ordering::SeqCst);
        self.signal(libc::SIGKILL);
    }

    pub(super) fn take_active(&self) -> Option<Active> {
        self.active.lock().take()
    }

    /// Close stdin, then SIGTERM, then SIGKILL the group (MCP 2025-11-25 "Transports", "stdio", shutdown), waiting in between.
    pub(super) async fn terminate(&self) {
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
