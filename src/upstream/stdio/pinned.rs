//! A child pinned to one upstream task (docs/design.md §25 "The 2025-11-25 task
//! dialect"): the task lives in that process, so every request of the task goes to it
//! and no other call gets the child until the task is done with it. A child cannot
//! outlive the gateway, so a stdio task is never re-attached: it fails with its child.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::Shared;
use super::call::CallGuard;
use super::child::Child;
use crate::upstream::{CallEvent, CallOutcome, CallSpec, SessionRef, TaskChannel, UpstreamError};

pub(super) struct PinnedChild {
    shared: Arc<Shared>,
    slot: usize,
    child: Arc<Child>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// A call was abandoned and the child has not answered anything since.
    interrupted: Arc<AtomicBool>,
}

impl Shared {
    /// Reserve a child for an upstream task, as a call reserves one for its run.
    pub(super) async fn pin(self: &Arc<Self>) -> Result<Arc<dyn TaskChannel>, UpstreamError> {
        if self.shutdown.is_cancelled() {
            return Err(UpstreamError::ShuttingDown);
        }
        let permit = tokio::select! {
            p = self.permits.clone().acquire_owned() => {
                p.map_err(|_| UpstreamError::ShuttingDown)?
            }
            () = self.shutdown.cancelled() => return Err(UpstreamError::ShuttingDown),
        };
        let (slot, child) = self.checkout().await?;
        self.pinned.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(PinnedChild {
            shared: self.clone(),
            slot,
            child,
            permit: Mutex::new(Some(permit)),
            interrupted: Arc::new(AtomicBool::new(false)),
        }))
    }
}

impl TaskChannel for PinnedChild {
    fn call(
        &self,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>> {
        Box::pin(async move {
            if self.shared.shutdown.is_cancelled() {
                return Err(UpstreamError::ShuttingDown);
            }
            if !self.child.usable() {
                return Err(UpstreamError::Broken {
                    upstream: self.shared.name().to_string(),
                    reason: "the child holding the task went away".into(),
                });
            }
            let guard = CallGuard {
                shared: self.shared.clone(),
                slot: self.slot,
                child: self.child.clone(),
                permit: None,
                sent: None,
                pin: Some(self.interrupted.clone()),
            };
            self.shared.exchange(guard, None, spec, events).await
        })
    }

    fn session(&self) -> Option<SessionRef> {
        None
    }

    fn task_started(&self) {}

    fn task_ended(&self) {}
}

impl Drop for PinnedChild {
    fn drop(&mut self) {
        // A child that still works on an abandoned request would answer into the next
        // call's stream: a fresh child is the only safe hand-over.
        if self.interrupted.load(Ordering::SeqCst) {
            self.child.kill();
        }
        self.shared.release(self.slot);
        self.permit.lock().take();
        self.shared.pinned.fetch_sub(1, Ordering::SeqCst);
    }
}
