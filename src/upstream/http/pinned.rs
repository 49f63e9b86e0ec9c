//! An upstream task's session (docs/design.md §25 "The 2025-11-25 task dialect"):
//! every request of the task goes to the session that created it, which is never
//! replaced by a new handshake and never `DELETE`d while the task lives.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::retire::Lease;
use super::session::Session;
use super::state::HttpUpstream;
use crate::upstream::{CallEvent, CallOutcome, CallSpec, SessionRef, TaskChannel, UpstreamError};

struct Pinned {
    upstream: Arc<HttpUpstream>,
    session: Session,
    /// Counts the task as a user of the session, so a retired session is not ended
    /// (its GET stream stopped, or `DELETE`d) under it.
    _lease: Lease,
}

impl HttpUpstream {
    /// Pin `session` (the current one, or one a previous process recorded).
    pub(super) fn pinned(&self, session: Session) -> Result<Arc<dyn TaskChannel>, UpstreamError> {
        let upstream = self.me.upgrade().ok_or(UpstreamError::ShuttingDown)?;
        let lease = Lease::new(self, &session);
        Ok(Arc::new(Pinned {
            upstream,
            session,
            _lease: lease,
        }))
    }
}

impl TaskChannel for Pinned {
    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>> {
        Box::pin(
            self.upstream
                .call_until_stopped(spec, events, Some(&self.session)),
        )
    }

    fn session(&self) -> Option<SessionRef> {
        Some(SessionRef {
            id: self.session.id.clone()?,
            version: self.session.version.clone(),
        })
    }

    fn task_started(&self) {
        self.session.live.tasks.fetch_add(1, Ordering::SeqCst);
        self.upstream.live_tasks.fetch_add(1, Ordering::SeqCst);
    }

    fn task_ended(&self) {
        let dec = |n: usize| Some(n.saturating_sub(1));
        let _ = self
            .session
            .live
            .tasks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, dec);
        let _ = self
            .upstream
            .live_tasks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, dec);
    }
}
