//! Supervision of one slot: spawn, watch, restart with backoff, reap when idle.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::child::Child;
use super::spawn::spawn_child;
use super::{STABLE_UPTIME, Shared, SlotState};

/// Keep one slot's child alive: spawn, initialize, wait for exit or idleness, restart.
pub(super) async fn supervise(shared: Arc<Shared>, idx: usize) {
    loop {
        if shared.shutdown.is_cancelled() {
            return;
        }
        let backoff = match spawn_child(&shared).await {
            Ok(child) => {
                let started = Instant::now();
                shared.start_succeeded();
                if let Some(info) = child.info.lock().clone() {
                    *shared.info.lock() = Some(info);
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

pub(super) async fn sleep_or_shutdown(shared: &Shared, d: Duration) {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        () = shared.shutdown.cancelled() => {}
    }
}

/// Wait until the child goes away (false) or, for extra slots, is reaped because it
/// stayed idle for `idle_reap_ms` while the pool had more idle children than its
/// spares (true; the slot is then already `Inactive`).
pub(super) async fn watch_child(shared: &Shared, idx: usize, child: &Child) -> bool {
    if idx == 0 {
        // The first child is never reaped: it answers `ensure_ready` and `info()`.
        child.gone.cancelled().await;
        return false;
    }
    let reap_after = shared.opts.idle_reap.max(Duration::from_millis(1));
    loop {
        let next_check = {
            let mut st = shared.state.lock();
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
