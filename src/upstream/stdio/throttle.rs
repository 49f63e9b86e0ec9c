//! The crash throttle of a stdio pool: a caller (tenant + tool) whose calls keep
//! killing children is slowed down so it cannot keep the whole pool cold.
//!
//! A child that dies while serving a call is replaced at once, which is right for a
//! one-off crash but lets a caller that crashes every child it gets (a bad input, a
//! buggy tool) turn the pool into a restart loop that starves everyone else. So the
//! pool counts, per tenant and tool, the children that died while serving that
//! caller's call. After [`THROTTLE_AFTER`] such deaths within [`WINDOW`] the caller
//! is throttled:
//!
//! * its calls into this pool run **one at a time**, and
//! * each waits until a penalty has passed since its last crash — 500 ms, doubling per
//!   further crash up to 5 s.
//!
//! The throttle lifts once the caller goes [`WINDOW`] without a crash. Other callers
//! are never delayed by it; the pool keeps starting replacements for them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Crashes within this window that make a caller throttled; also the quiet time that
/// lifts the throttle.
pub(super) const WINDOW: Duration = Duration::from_secs(10);
pub(super) const THROTTLE_AFTER: usize = 3;
const PENALTY_FIRST: Duration = Duration::from_millis(500);
const PENALTY_MAX: Duration = Duration::from_secs(5);
/// Above this many remembered callers, quiet ones are forgotten on the next crash.
const PRUNE_ABOVE: usize = 256;

/// Who a call is for: the throttle's unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Caller {
    pub tenant: String,
    pub tool: String,
}

#[derive(Default)]
pub(super) struct CrashThrottle {
    callers: Mutex<HashMap<Caller, CallerState>>,
}

struct CallerState {
    /// Crash times within the last [`WINDOW`] (only needed until throttled).
    recent: VecDeque<Instant>,
    last_crash: Instant,
    /// Crashes since the throttle engaged; sets the penalty.
    strikes: u32,
    throttled: bool,
    /// One call at a time while throttled.
    single: Arc<Semaphore>,
}

/// What [`CrashThrottle::crashed`] decided, for the log line.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Free,
    /// Throttled; the caller's next call waits this long after the crash.
    Throttled(Duration),
}

impl CallerState {
    fn new(now: Instant) -> Self {
        Self {
            recent: VecDeque::new(),
            last_crash: now,
            strikes: 0,
            throttled: false,
            single: Arc::new(Semaphore::new(1)),
        }
    }

    fn quiet(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_crash) >= WINDOW
    }

    fn penalty(&self) -> Duration {
        let doublings = self.strikes.saturating_sub(1).min(16);
        (PENALTY_FIRST * 2u32.pow(doublings)).min(PENALTY_MAX)
    }

    /// Lift the throttle after a quiet window.
    fn refresh(&mut self, now: Instant) {
        if self.throttled && self.quiet(now) {
            self.throttled = false;
            self.strikes = 0;
            self.recent.clear();
        }
    }
}

impl CrashThrottle {
    /// A child died while serving `caller`'s call at `now`.
    pub(super) fn crashed(&self, caller: &Caller, now: Instant) -> Verdict {
        let mut callers = self.callers.lock();
        if callers.len() > PRUNE_ABOVE {
            callers.retain(|_, s| !s.quiet(now) || Arc::strong_count(&s.single) > 1);
        }
        let s = callers
            .entry(caller.clone())
            .or_insert_with(|| CallerState::new(now));
        s.refresh(now);
        s.last_crash = now;
        if s.throttled {
            s.strikes = s.strikes.saturating_add(1);
            return Verdict::Throttled(s.penalty());
        }
        s.recent.push_back(now);
        while s
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
        {
            s.recent.pop_front();
        }
        if s.recent.len() >= THROTTLE_AFTER {
            s.throttled = true;
            s.strikes = 1;
            s.recent.clear();
            return Verdict::Throttled(s.penalty());
        }
        Verdict::Free
    }

    /// If `caller` is throttled: the single-flight semaphore and the instant before
    /// which its next call must not start.
    fn gate(&self, caller: &Caller, now: Instant) -> Option<(Arc<Semaphore>, Instant)> {
        let mut callers = self.callers.lock();
        let s = callers.get_mut(caller)?;
        s.refresh(now);
        s.throttled
            .then(|| (s.single.clone(), s.last_crash + s.penalty()))
    }

    /// Wait until `caller` may call. `None` when it is not throttled (no waiting);
    /// otherwise the permit that keeps its calls one at a time, to hold for the call.
    pub(super) async fn admit(&self, caller: &Caller) -> Option<OwnedSemaphorePermit> {
        let (single, _) = self.gate(caller, Instant::now())?;
        let permit = single.acquire_owned().await.ok()?;
        // Re-read after the wait: the call ahead of us may have crashed again.
        if let Some((_, not_before)) = self.gate(caller, Instant::now()) {
            tokio::time::sleep_until(not_before.into()).await;
        }
        Some(permit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(tenant: &str, tool: &str) -> Caller {
        Caller {
            tenant: tenant.into(),
            tool: tool.into(),
        }
    }

    #[test]
    fn throttles_after_repeated_crashes_and_lifts_after_a_quiet_window() {
        let t = CrashThrottle::default();
        let b = caller("b", "crash");
        let t0 = Instant::now();
        assert_eq!(t.crashed(&b, t0), Verdict::Free);
        assert_eq!(t.crashed(&b, t0 + Duration::from_secs(1)), Verdict::Free);
        assert!(t.gate(&b, t0 + Duration::from_secs(1)).is_none());
        let third = t0 + Duration::from_secs(2);
        assert_eq!(
            t.crashed(&b, third),
            Verdict::Throttled(Duration::from_millis(500))
        );
        let (_, not_before) = t.gate(&b, third).unwrap();
        assert_eq!(not_before, third + Duration::from_millis(500));
        // Each further crash doubles the penalty, up to the cap.
        let mut last = third;
        for want in [1000, 2000, 4000, 5000, 5000] {
            last += Duration::from_secs(1);
            assert_eq!(
                t.crashed(&b, last),
                Verdict::Throttled(Duration::from_millis(want))
            );
        }
        assert!(
            t.gate(&b, last + WINDOW - Duration::from_millis(1))
                .is_some()
        );
        assert!(t.gate(&b, last + WINDOW).is_none(), "quiet window lifts it");
        // Lifted: counting starts afresh.
        assert_eq!(t.crashed(&b, last + WINDOW * 2), Verdict::Free);
    }

    #[test]
    fn crashes_spread_wider_than_the_window_never_throttle() {
        let t = CrashThrottle::default();
        let b = caller("b", "flaky");
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(t.crashed(&b, t0 + WINDOW / 2 * i), Verdict::Free);
        }
    }

    #[test]
    fn callers_are_separate_by_tenant_and_tool() {
        let t = CrashThrottle::default();
        let t0 = Instant::now();
        for i in 0..3 {
            t.crashed(&caller("b", "crash"), t0 + Duration::from_millis(i));
        }
        assert!(t.gate(&caller("b", "crash"), t0).is_some());
        assert!(t.gate(&caller("b", "echo"), t0).is_none());
        assert!(t.gate(&caller("a", "crash"), t0).is_none());
        // Separator characters cannot make two callers one.
        assert!(t.gate(&caller("b\0crash", ""), t0).is_none());
    }

    #[tokio::test]
    async fn a_throttled_caller_runs_one_call_at_a_time_after_its_penalty() {
        let t = Arc::new(CrashThrottle::default());
        let b = caller("b", "crash");
        assert!(t.admit(&b).await.is_none(), "not throttled: no gate");
        let now = Instant::now();
        for _ in 0..3 {
            t.crashed(&b, now);
        }
        let first = t.admit(&b).await.expect("gated");
        assert!(
            now.elapsed() >= Duration::from_millis(500),
            "penalty waited out"
        );
        let t2 = t.clone();
        let b2 = b.clone();
        let second = tokio::spawn(async move { t2.admit(&b2).await.is_some() });
        // Well past the penalty: only the first call's permit can hold it back.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "second call waits for the first");
        drop(first);
        assert!(second.await.unwrap());
    }
}
