//! The pool's slots: activation, spares, release, start backoff, checkout of a
//! child for a call, readiness and shutdown.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::child::Child;
use super::supervise::supervise;
use super::{BACKOFF_INITIAL, BACKOFF_MAX, PoolState, Shared, Slot, SlotState};
use crate::upstream::{TransportState, UpstreamError, UpstreamInfo};

impl Shared {
    pub(super) fn name(&self) -> &str {
        &self.opts.name
    }

    pub(super) fn live_children(&self) -> Vec<Arc<Child>> {
        self.live.lock().values().cloned().collect()
    }

    /// Start a supervisor for an inactive slot. Caller holds the state lock.
    pub(super) fn activate(self: &Arc<Self>, st: &mut PoolState, idx: usize) {
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
    pub(super) fn replenish(self: &Arc<Self>, st: &mut PoolState) {
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

    pub(super) fn set_slot(self: &Arc<Self>, idx: usize, state: SlotState) {
        {
            let mut st = self.state.lock();
            if let Some(slot) = st.slots.get_mut(idx) {
                slot.state = state;
                slot.idle_since = Instant::now();
            }
            self.replenish(&mut st);
        }
        self.changed.notify_waiters();
    }

    /// Return a slot reservation (call finished, or its cancelled call was settled).
    pub(super) fn release(self: &Arc<Self>, idx: usize) {
        {
            let mut st = self.state.lock();
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
    pub(super) fn start_failed(&self) -> Duration {
        let mut st = self.state.lock();
        st.start_failures = st.start_failures.saturating_add(1);
        let doublings = st.start_failures.saturating_sub(1).min(16);
        let delay = (BACKOFF_INITIAL * 2u32.pow(doublings)).min(BACKOFF_MAX);
        st.starts_blocked_until = Some(Instant::now() + delay);
        delay
    }

    pub(super) fn start_succeeded(&self) {
        {
            let mut st = self.state.lock();
            st.start_failures = 0;
            st.starts_blocked_until = None;
        }
    }

    pub(super) fn unavailable(&self, reason: impl Into<String>) -> UpstreamError {
        UpstreamError::Unavailable {
            upstream: self.opts.name.clone(),
            reason: reason.into(),
        }
    }

    /// Reserve a ready child for one call. The caller holds a semaphore permit, so at
    /// least one slot is unreserved. While it waits, the call counts as demand.
    pub(super) async fn checkout(self: &Arc<Self>) -> Result<(usize, Arc<Child>), UpstreamError> {
        struct Waiting<'a>(&'a Shared);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                {
                    let mut st = self.0.state.lock();
                    st.waiting = st.waiting.saturating_sub(1);
                }
            }
        }
        {
            let mut st = self.state.lock();
            st.waiting += 1;
        }
        let _waiting = Waiting(self);
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            {
                let mut st = self.state.lock();
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

    pub(super) async fn ensure_ready(self: &Arc<Self>) -> Result<Arc<UpstreamInfo>, UpstreamError> {
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            {
                let mut st = self.state.lock();
                if self.shutdown.is_cancelled() {
                    return Err(UpstreamError::ShuttingDown);
                }
                let ready = st.slots.iter().find_map(|s| match &s.state {
                    SlotState::Ready(c) if c.usable() => c.info.lock().clone(),
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

    pub(super) fn state(&self) -> TransportState {
        if self.shutdown.is_cancelled() {
            return TransportState::Down("shut down".into());
        }
        let st = self.state.lock();
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

    pub(super) async fn shutdown(self: &Arc<Self>) {
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
