//! The adaptive `pollIntervalMs` (docs/design.md §8 "Flow control"): one pure function,
//! so the policy is testable without a clock, a store or a limiter.

/// Everything the advertised interval depends on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalInputs {
    /// `tasks.poll_interval_ms`: the floor.
    pub base_ms: u64,
    /// `tasks.max_poll_interval_ms`: the ceiling.
    pub max_ms: u64,
    /// Time since the task was created.
    pub age_ms: u64,
    /// The upstream's progress cadence: `(smoothed gap between progress
    /// notifications, time since the last one)`, when progress has arrived.
    pub progress: Option<(u64, u64)>,
    /// Load on the gateway: 0 = idle; 1 = busy (queues as long as the upstream
    /// concurrency, or polls being throttled); capped at 3.
    pub pressure: f64,
}

/// Age after which the age-based interval doubles for the first time, in units of
/// `base_ms`: the interval is `base · 2^⌊log2(1 + age / (AGE_STEP · base))⌋`.
pub const AGE_STEP: u64 = 10;

/// The interval to advertise for a live task.
///
/// - *Progress cadence*: while the upstream reports progress (the last report is no
///   older than twice the smoothed gap), the interval follows that gap — polling
///   faster than progress arrives shows nothing new.
/// - *Age*: otherwise a bounded exponential: `base` for the first `10·base` ms, then
///   doubling at ages `10·base`, `30·base`, `70·base`, … (`2^k − 1` steps).
/// - *Load*: the result is multiplied by `1 + pressure` (pressure capped at 3).
///
/// The result always lies in `[base_ms, max_ms]`.
pub fn advertised_interval(i: IntervalInputs) -> u64 {
    let base = i.base_ms.max(1);
    let max = i.max_ms.max(base);
    let recent_progress = i
        .progress
        .filter(|&(gap, since)| since <= gap.max(base).saturating_mul(2));
    let ms = match recent_progress {
        Some((gap, _)) => gap.clamp(base, max),
        None => {
            let steps = i.age_ms / AGE_STEP.saturating_mul(base);
            let doublings = (steps.saturating_add(1)).ilog2().min(32);
            base.saturating_mul(1u64 << doublings)
        }
    };
    let pressure = if i.pressure.is_finite() {
        i.pressure.clamp(0.0, 3.0)
    } else {
        0.0
    };
    let scaled = (ms as f64 * (1.0 + pressure)).min(u64::MAX as f64) as u64;
    scaled.clamp(base, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(age_ms: u64) -> IntervalInputs {
        IntervalInputs {
            base_ms: 1000,
            max_ms: 30_000,
            age_ms,
            progress: None,
            pressure: 0.0,
        }
    }

    #[test]
    fn grows_with_age_and_is_bounded() {
        assert_eq!(advertised_interval(at(0)), 1000);
        assert_eq!(advertised_interval(at(9_999)), 1000);
        assert_eq!(advertised_interval(at(10_000)), 2000);
        assert_eq!(advertised_interval(at(29_999)), 2000);
        assert_eq!(advertised_interval(at(30_000)), 4000);
        assert_eq!(advertised_interval(at(70_000)), 8000);
        assert_eq!(advertised_interval(at(3_600_000)), 30_000);
        assert_eq!(advertised_interval(at(u64::MAX)), 30_000);
        let mut last = 0;
        for age in (0..2_000_000).step_by(7_919) {
            let v = advertised_interval(at(age));
            assert!(v >= last, "monotonic in age");
            assert!((1000..=30_000).contains(&v));
            last = v;
        }
    }

    #[test]
    fn follows_progress_cadence_while_it_is_recent() {
        let mut i = at(600_000);
        i.progress = Some((2_500, 1_000));
        assert_eq!(advertised_interval(i), 2_500);
        // Faster than the floor: the floor wins.
        i.progress = Some((100, 50));
        assert_eq!(advertised_interval(i), 1000);
        // Slower than the ceiling: the ceiling wins.
        i.progress = Some((120_000, 1_000));
        assert_eq!(advertised_interval(i), 30_000);
        // Stale progress: back to the age rule.
        i.progress = Some((2_500, 60_000));
        assert_eq!(advertised_interval(i), advertised_interval(at(600_000)));
    }

    #[test]
    fn grows_under_load() {
        let mut i = at(0);
        i.pressure = 1.0;
        assert_eq!(advertised_interval(i), 2000);
        i.pressure = 100.0;
        assert_eq!(advertised_interval(i), 4000);
        i.pressure = f64::NAN;
        assert_eq!(advertised_interval(i), 1000);
        i.pressure = -1.0;
        assert_eq!(advertised_interval(i), 1000);
        let mut old = at(3_600_000);
        old.pressure = 3.0;
        assert_eq!(advertised_interval(old), 30_000);
    }

    #[test]
    fn degenerate_config() {
        let i = IntervalInputs {
            base_ms: 0,
            max_ms: 0,
            age_ms: 5,
            progress: Some((0, 0)),
            pressure: 0.0,
        };
        assert_eq!(advertised_interval(i), 1);
    }
}
