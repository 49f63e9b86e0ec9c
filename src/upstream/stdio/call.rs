//! One call on a checked-out child, and the guard that cancels it when dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::child::{Active, Child};
use super::throttle::Caller;
use crate::upstream::{CallEvent, CallOutcome, CallSpec, UpstreamError, legacy_messages};

impl Shared {
    pub(super) async fn call(
        self: &Arc<Self>,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        if self.shutdown.is_cancelled() {
            return Err(UpstreamError::ShuttingDown);
        }
        let caller = spec.tenant.as_ref().map(|tenant| Caller {
            tenant: tenant.clone(),
            tool: spec.tool.as_deref().unwrap_or(&spec.method).to_string(),
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
        let guard = CallGuard {
            shared: self.clone(),
            slot,
            child: child.clone(),
            permit: Some(permit),
            sent: None,
            pin: None,
        };
        self.exchange(guard, caller, spec, events).await
    }

    /// Send `spec` to the guard's child and wait for the answer.
    pub(super) async fn exchange(
        self: &Arc<Self>,
        mut guard: CallGuard,
        caller: Option<Caller>,
        spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        let child = guard.child.clone();
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut params = spec.params;
        let progress_token = spec.want_progress.then(|| {
            let token = format!(
                "taskgate-{}",
                self.next_token.fetch_add(1, Ordering::Relaxed)
            );
            crate::protocol::trace::with_meta(&mut params, |m| {
                m.insert("progressToken".into(), Value::String(token.clone()));
            });
            token
        });
        let (reply_tx, reply_rx) = oneshot::channel();
        let token = CancellationToken::new();
        {
            let mut a = child.active.lock();
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
}

pub(super) struct Sent {
    pub(super) request_id: u64,
    pub(super) reply_rx: oneshot::Receiver<Result<CallOutcome, UpstreamError>>,
    pub(super) token: CancellationToken,
}

/// Owns a call's slot reservation. Normal completion releases it; being dropped
/// unfinished cancels the call upstream and keeps the child reserved until it settles.
pub(super) struct CallGuard {
    pub(super) shared: Arc<Shared>,
    pub(super) slot: usize,
    pub(super) child: Arc<Child>,
    pub(super) permit: Option<OwnedSemaphorePermit>,
    pub(super) sent: Option<Sent>,
    /// Set for a call on a pinned child (`pinned.rs`): the pin owns the reservation.
    pub(super) pin: Option<Arc<AtomicBool>>,
}

impl CallGuard {
    pub(super) fn finish(&mut self) {
        if let Some(sent) = self.sent.take() {
            sent.token.cancel();
        }
        if let Some(interrupted) = &self.pin {
            // The child answered: nothing of an earlier interrupted call is pending.
            interrupted.store(false, Ordering::SeqCst);
            return;
        }
        self.shared.release(self.slot);
        // Release the slot before the permit, so the next permit holder finds it free.
        self.permit.take();
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(interrupted) = &self.pin {
            // A pinned child stays reserved by its pin: say the call is abandoned and
            // let the pin decide what becomes of the child.
            if let Some(mut sent) = self.sent.take() {
                sent.token.cancel();
                if sent.reply_rx.try_recv().is_ok() || !self.child.usable() {
                    return;
                }
                self.child.send(&legacy_messages::cancelled(
                    sent.request_id,
                    "the gateway client cancelled the request",
                ));
                interrupted.store(true, Ordering::SeqCst);
            }
            return;
        }
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
        let grace = shared.opts.cancel_grace;
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
