//! One upstream session's identity and health, as every part of the transport sees
//! it. What happens to a session that stops being trusted is `retire.rs`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The identity of one live upstream session.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// `Mcp-Session-Id`, when the server issued one.
    pub(super) id: Option<String>,
    /// Negotiated version; `None` only while the handshake itself runs.
    pub(super) version: Option<String>,
    /// Increments with every successful `initialize`; tells a stale session apart.
    pub(super) generation: u64,
    /// Shared by every clone: whether the session is still trusted, and who uses it.
    pub(super) live: Arc<Liveness>,
}

impl Session {
    pub(super) fn new(id: Option<String>, version: Option<String>) -> Self {
        Self {
            id,
            version,
            generation: 0,
            live: Arc::new(Liveness::default()),
        }
    }
}

/// What a session's users need to know about its health (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Health {
    /// Verifications (cancel + ping) in progress; new calls wait while this is > 0.
    pub(super) verifying: usize,
    /// No longer the current session: new calls go elsewhere.
    pub(super) retired: bool,
}

#[derive(Debug)]
pub(super) struct Liveness {
    pub(super) health: watch::Sender<Health>,
    /// Calls and verifications using the session right now.
    pub(super) users: AtomicUsize,
    /// Upstream tasks living in the session: while any does, the gateway never
    /// `DELETE`s it (docs/design.md §25).
    pub(super) tasks: AtomicUsize,
    /// Whether ending a retired session sends `DELETE` (not when the server already
    /// forgot it or cannot be reached).
    pub(super) delete_when_closed: AtomicBool,
    /// Set once the session was ended (at most once).
    pub(super) closed: AtomicBool,
    /// Cancelled when the session is ended: stops its GET stream.
    pub(super) ended: CancellationToken,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            health: watch::Sender::new(Health::default()),
            users: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            delete_when_closed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            ended: CancellationToken::new(),
        }
    }
}

impl Liveness {
    pub(super) fn health(&self) -> Health {
        *self.health.borrow()
    }

    /// A verification starts; callers that arrive now wait for its verdict.
    pub(super) fn begin_verify(self: &Arc<Self>) -> Verifying {
        self.health.send_modify(|h| h.verifying += 1);
        Verifying(self.clone())
    }
}

/// One verification in progress; its end (however it ends) releases the waiters.
pub(super) struct Verifying(Arc<Liveness>);

impl Drop for Verifying {
    fn drop(&mut self) {
        self.0
            .health
            .send_modify(|h| h.verifying = h.verifying.saturating_sub(1));
    }
}
