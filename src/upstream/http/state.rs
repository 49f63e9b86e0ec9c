//! What one `HttpUpstream` holds: its fields, the state under its lock, and the small
//! helpers every part of the transport uses. The behaviour is in the files beside it,
//! the public surface in `mod.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::session::Session;
use crate::tls::client::HttpsConnector;
use crate::upstream::identity::Identity;
use crate::upstream::{
    CallEvent, SessionNotification, TransportState, UpstreamError, UpstreamInfo,
};

/// The transport's state under its lock.
pub(super) struct Inner {
    /// Current endpoint (updated when a 307/308 redirect is followed).
    pub(super) url: String,
    pub(super) session: Option<Session>,
    /// Shared, so that reading it under the lock (every request reads it) is a
    /// reference count, not a copy of the capability map: the copy under this lock
    /// was a contended lock on the `tasks/get` path (benches/RESULTS.md, issue 26).
    pub(super) info: Option<Arc<UpstreamInfo>>,
    pub(super) state: TransportState,
    pub(super) generation: u64,
    pub(super) last_failure: Option<(Instant, String)>,
}

/// A legacy Streamable HTTP client session (MCP 2025-11-25 "Transports", "Streamable HTTP"). See the module docs.
pub struct HttpUpstream {
    pub(super) me: Weak<HttpUpstream>,
    pub(super) name: String,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) max_message_bytes: usize,
    pub(super) identity: Option<Arc<Identity>>,
    pub(super) client: Client<HttpsConnector, Full<Bytes>>,
    pub(super) inner: Mutex<Inner>,
    /// Serialises handshakes (first start, recovery, re-init after 404).
    pub(super) init_lock: tokio::sync::Mutex<()>,
    pub(super) notifications: broadcast::Sender<SessionNotification>,
    pub(super) next_id: AtomicU64,
    pub(super) next_token: AtomicU64,
    /// Progress token → the call that owns it, for progress arriving on a stream other
    /// than the call's own (see the module docs). Entries live exactly as long as the
    /// call (`ProgressRoute`, in `inbound.rs`).
    pub(super) progress_routes: Mutex<HashMap<u64, ProgressTarget>>,
    /// Wakes the supervisor when the session was lost.
    pub(super) session_lost: Arc<Notify>,
    pub(super) stop: CancellationToken,
    pub(super) shutting_down: AtomicBool,
    /// Upstream tasks living in any of this transport's sessions.
    pub(super) live_tasks: std::sync::atomic::AtomicUsize,
}

/// Where progress for one token goes. The sender is weak so the route never keeps a
/// finished call's event channel open (receivers see the channel close when the call
/// ends, as with any other transport).
pub(super) struct ProgressTarget {
    pub(super) generation: u64,
    pub(super) events: mpsc::WeakSender<CallEvent>,
}

impl HttpUpstream {
    pub(super) fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    pub(super) fn current_session(&self) -> Option<Session> {
        self.inner().session.clone()
    }

    pub(super) fn unavailable(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Unavailable {
            upstream: self.name.clone(),
            reason: reason.into(),
        }
    }

    pub(super) fn broken(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Broken {
            upstream: self.name.clone(),
            reason: reason.into(),
        }
    }

    pub(super) fn protocol(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Protocol {
            upstream: self.name.clone(),
            reason: reason.into(),
        }
    }
}
