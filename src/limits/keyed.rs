//! Keyed rate limiters with bounded, evicted state: the GCRA poll limiter (per
//! principal and task) and the per-principal token bucket (docs/design.md §8 "Flow
//! control").

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A map that drops entries idle longer than `idle` and never holds more than `cap`.
///
/// Two generations: new and touched entries live in `young`; when `young` holds half of
/// `cap`, it becomes `old` and the previous `old` (entries untouched for a whole
/// generation: the least recently used) is dropped at once. Every call is O(1)
/// amortised, however many distinct keys clients make up (an earlier version scanned
/// the whole map for its least recently used entry on each insert into a full map:
/// O(cap) per poll once 100k distinct tasks had been polled; the `poll_limiter` micro
/// benchmark now measures ~160 ns per new key against a full map).
struct Bounded<K, V> {
    young: HashMap<K, (V, Instant)>,
    old: HashMap<K, (V, Instant)>,
    idle: Duration,
    cap: usize,
    last_sweep: Instant,
}

impl<K: Hash + Eq + Clone, V> Bounded<K, V> {
    fn new(idle: Duration, cap: usize, now: Instant) -> Self {
        Self {
            young: HashMap::new(),
            old: HashMap::new(),
            idle,
            cap: cap.max(2),
            last_sweep: now,
        }
    }

    /// Drop idle entries; runs at most once per `idle` period, so it is amortised.
    fn sweep(&mut self, now: Instant) {
        let idle = self.idle;
        let fresh = |_: &K, e: &mut (V, Instant)| now.saturating_duration_since(e.1) <= idle;
        self.young.retain(fresh);
        self.old.retain(fresh);
        self.last_sweep = now;
    }

    /// The entry for `k`, created with `init` when absent; marks it used now.
    fn entry(&mut self, k: &K, now: Instant, init: impl FnOnce() -> V) -> &mut V {
        if now.saturating_duration_since(self.last_sweep) > self.idle {
            self.sweep(now);
        }
        if !self.young.contains_key(k) {
            // Take it out of the old generation before that may be dropped.
            let kept = self.old.remove(k);
            if self.young.len() >= self.cap / 2 {
                self.old = std::mem::take(&mut self.young);
            }
            if let Some(e) = kept {
                self.young.insert(k.clone(), e);
            }
        }
        let e = self.young.entry(k.clone()).or_insert_with(|| (init(), now));
        e.1 = now;
        &mut e.0
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        match self.young.get_mut(k) {
            Some((v, _)) => Some(v),
            None => self.old.get_mut(k).map(|(v, _)| v),
        }
    }

    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }
}

/// `(tenant, subject, taskId)` as a keyed 128-bit hash: a poll allocates nothing, and
/// 100k remembered keys take ~8 MB instead of ~25 MB of strings. The hash keys are
/// random per process, so clients cannot aim for a collision (and one would only share
/// a poll schedule).
pub type PollKey = u128;

/// Builds [`PollKey`]s.
pub struct PollKeys {
    hi: RandomState,
    lo: RandomState,
}

impl Default for PollKeys {
    fn default() -> Self {
        Self {
            hi: RandomState::new(),
            lo: RandomState::new(),
        }
    }
}

impl PollKeys {
    pub fn key(&self, tenant: &str, subject: &str, task_id: &str) -> PollKey {
        // `str` hashing is length-delimited: ("ab", "c") and ("a", "bc") differ.
        let half = |s: &RandomState| s.hash_one((tenant, subject, task_id));
        (u128::from(half(&self.hi)) << 64) | u128::from(half(&self.lo))
    }
}

struct PollState {
    /// GCRA theoretical arrival time.
    tat: Instant,
    /// The interval enforced: the smallest one advertised recently.
    interval: Duration,
    /// When `interval` was last advertised.
    advertised_at: Instant,
}

/// GCRA per `(tenant, subject, taskId)`: one poll per advertised interval, with a
/// burst of `burst` polls. A poll that respects the interval is never throttled.
pub struct PollLimiter {
    state: Mutex<Bounded<PollKey, PollState>>,
    burst: u32,
    base: Duration,
    /// How long a larger interval must have been the only one advertised before the
    /// limiter enforces it (the smaller one is "recent" until then).
    recent: Duration,
}

impl PollLimiter {
    pub fn new(base_ms: u64, max_ms: u64, burst: u32, cap: usize) -> Self {
        let burst = burst.max(1);
        let max = Duration::from_millis(max_ms.max(base_ms).max(1));
        // Bounded state: drop entries idle longer than max_poll_interval × burst (by
        // then a burst's worth of polls at the longest interval has passed).
        let idle = (max * burst).max(Duration::from_secs(1));
        Self {
            state: Mutex::new(Bounded::new(idle, cap, Instant::now())),
            burst,
            base: Duration::from_millis(base_ms.max(1)),
            recent: max,
        }
    }

    fn tolerance(&self, interval: Duration) -> Duration {
        // burst − 1 polls ahead of schedule, plus 10 % (≤ 250 ms) for network jitter.
        interval * (self.burst - 1) + (interval / 10).min(Duration::from_millis(250))
    }

    /// Admit one poll now, or say how long to wait.
    pub fn check(&self, key: &PollKey, now: Instant) -> Result<(), Duration> {
        let mut st = self.state.lock();
        let base = self.base;
        let e = st.entry(key, now, || PollState {
            tat: now,
            interval: base,
            advertised_at: now,
        });
        let tol = self.tolerance(e.interval);
        let allow_at = e.tat.checked_sub(tol).unwrap_or(now);
        if allow_at > now {
            return Err(allow_at - now);
        }
        e.tat = e.tat.max(now) + e.interval;
        Ok(())
    }

    /// Record that `interval_ms` was advertised for this key.
    pub fn advertise(&self, key: &PollKey, interval_ms: u64, now: Instant) {
        let mut st = self.state.lock();
        let iv = Duration::from_millis(interval_ms.max(1));
        let recent = self.recent;
        let Some(e) = st.get_mut(key) else {
            // Never polled yet: the first poll is always admitted, and the entry is
            // created with the base interval (the smallest possible).
            return;
        };
        if iv <= e.interval {
            // A smaller interval takes effect at once: the last admitted poll now
            // counts for the smaller interval, so the next may come sooner.
            let shorter = e.interval - iv;
            e.tat = e
                .tat
                .checked_sub(shorter)
                .unwrap_or(now)
                .max(now.min(e.tat));
            e.interval = iv;
            e.advertised_at = now;
        } else if now.saturating_duration_since(e.advertised_at) > recent.max(e.interval) {
            // The smaller interval is no longer recent: enforce the larger one, from
            // the last admitted poll on.
            e.tat += iv - e.interval;
            e.interval = iv;
            e.advertised_at = now;
        }
    }

    pub fn len(&self) -> usize {
        self.state.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Token bucket per `(tenant, subject)`: `rate` tokens per second, capacity `rate`.
pub struct RequestLimiter {
    state: Mutex<Bounded<(String, String), (f64, Instant)>>,
    rate: f64,
}

impl RequestLimiter {
    pub fn new(rate: u32, cap: usize) -> Self {
        Self {
            state: Mutex::new(Bounded::new(Duration::from_secs(60), cap, Instant::now())),
            rate: f64::from(rate.max(1)),
        }
    }

    pub fn check(&self, key: &(String, String), now: Instant) -> Result<(), Duration> {
        let mut st = self.state.lock();
        let rate = self.rate;
        let (tokens, at) = st.entry(key, now, || (rate, now));
        let elapsed = now.saturating_duration_since(*at).as_secs_f64();
        *tokens = (*tokens + elapsed * rate).min(rate);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str) -> PollKey {
        thread_local!(static KEYS: PollKeys = PollKeys::default());
        KEYS.with(|k| k.key("acme", "alice", t))
    }

    #[test]
    fn poll_keys_separate_their_parts() {
        let k = PollKeys::default();
        assert_eq!(k.key("a", "b", "c"), k.key("a", "b", "c"));
        assert_ne!(k.key("ab", "", "c"), k.key("a", "b", "c"));
        assert_ne!(k.key("a", "bc", ""), k.key("a", "b", "c"));
        assert_ne!(k.key("a", "b", "c"), k.key("a", "b", "d"));
    }

    #[test]
    fn gcra_burst_then_interval() {
        let t0 = Instant::now();
        let l = PollLimiter::new(1000, 30_000, 3, 100);
        let k = key("a");
        for _ in 0..3 {
            assert!(l.check(&k, t0).is_ok());
        }
        let wait = l.check(&k, t0).unwrap_err();
        assert!(wait > Duration::from_millis(800) && wait <= Duration::from_millis(1000));
        // A throttled poll does not push the schedule further out.
        assert_eq!(l.check(&k, t0).unwrap_err(), wait);
        assert!(l.check(&k, t0 + wait).is_ok());
        // Another task of the same principal is independent.
        assert!(l.check(&key("b"), t0).is_ok());
    }

    #[test]
    fn polling_at_the_interval_is_never_throttled() {
        let t0 = Instant::now();
        let l = PollLimiter::new(1000, 30_000, 1, 100);
        let k = key("a");
        for i in 0..50u32 {
            // Up to 5 % early because of jitter.
            let t = t0 + Duration::from_millis(1000) * i
                - Duration::from_millis(if i > 0 { 50 } else { 0 });
            assert!(l.check(&k, t).is_ok(), "poll {i}");
        }
    }

    #[test]
    fn enforces_the_smallest_recent_advertisement() {
        let t0 = Instant::now();
        let l = PollLimiter::new(1000, 10_000, 1, 100);
        let k = key("a");
        assert!(l.check(&k, t0).is_ok());
        l.advertise(&k, 1000, t0);
        // Advertised 4 s next: the 1 s told a moment ago is still honoured.
        let t1 = t0 + Duration::from_millis(1000);
        assert!(l.check(&k, t1).is_ok());
        l.advertise(&k, 4000, t1);
        let t2 = t1 + Duration::from_millis(1000);
        assert!(l.check(&k, t2).is_ok());
        // Once the 1 s advertisement is old, 4 s is enforced.
        let t3 = t0 + Duration::from_millis(12_000);
        assert!(l.check(&k, t3).is_ok());
        l.advertise(&k, 4000, t3);
        assert!(l.check(&k, t3 + Duration::from_millis(1000)).is_err());
        assert!(l.check(&k, t3 + Duration::from_millis(4000)).is_ok());
        // Shrinking takes effect at once.
        let t4 = t3 + Duration::from_millis(4000);
        l.advertise(&k, 1000, t4);
        assert!(l.check(&k, t4 + Duration::from_millis(1000)).is_ok());
    }

    #[test]
    fn advertising_the_same_interval_keeps_the_schedule() {
        let t0 = Instant::now();
        let l = PollLimiter::new(1000, 30_000, 2, 100);
        let k = key("a");
        let mut throttled = 0;
        for i in 0..20u32 {
            let t = t0 + Duration::from_millis(50) * i;
            match l.check(&k, t) {
                Ok(()) => l.advertise(&k, 1000, t),
                Err(_) => throttled += 1,
            }
        }
        // Admitted at 0 and 50 ms (burst 2), then at 900 ms (1 s − 10 % jitter).
        assert_eq!(throttled, 17);
    }

    #[test]
    fn state_is_bounded_and_evicted() {
        let t0 = Instant::now();
        let l = PollLimiter::new(10, 20, 1, 8);
        for i in 0..100 {
            let _ = l.check(&key(&i.to_string()), t0);
        }
        assert!(l.len() <= 8);
        // Idle entries go away.
        let _ = l.check(&key("late"), t0 + Duration::from_secs(5));
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn a_key_in_use_survives_a_flood_of_new_keys() {
        let t0 = Instant::now();
        let l = PollLimiter::new(1000, 1000, 1, 8);
        let hot = key("hot");
        assert!(l.check(&hot, t0).is_ok());
        assert!(l.check(&hot, t0).is_err(), "burst of 1 used up");
        for i in 0..100 {
            let _ = l.check(&key(&format!("flood-{i}")), t0);
            if i % 3 == 0 {
                // Still throttled: its state was kept, not evicted and reset.
                assert!(l.check(&hot, t0).is_err(), "after {i} new keys");
            }
            assert!(l.len() <= 8);
        }
    }

    #[test]
    fn token_bucket() {
        let t0 = Instant::now();
        let l = RequestLimiter::new(2, 10);
        let k = ("acme".to_string(), "alice".to_string());
        assert!(l.check(&k, t0).is_ok());
        assert!(l.check(&k, t0).is_ok());
        let wait = l.check(&k, t0).unwrap_err();
        assert!(wait <= Duration::from_millis(500));
        assert!(l.check(&k, t0 + Duration::from_millis(500)).is_ok());
        assert!(l.check(&("acme".into(), "bob".into()), t0).is_ok());
    }
}
