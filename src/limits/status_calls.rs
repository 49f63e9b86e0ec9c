//! How many task-status tool calls one principal has open for one task
//! (docs/design.md §8, §28): a status call early for the task's poll interval waits
//! the interval out instead of being refused, so the poll limiter alone would let a
//! client park any number of them; past the poll burst, further parallel calls are
//! refused with a retry hint.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::keyed::PollKey;

/// The open status calls, by principal and task.
pub struct StatusCalls {
    most: usize,
    open: Mutex<HashMap<PollKey, usize>>,
}

/// One open status call; closed when dropped.
pub struct StatusSlot {
    calls: Arc<StatusCalls>,
    key: PollKey,
}

impl StatusCalls {
    pub fn new(most: u32) -> Self {
        Self {
            most: usize::try_from(most).unwrap_or(usize::MAX).max(1),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Open a call for `key`, unless `most` are open already.
    pub(super) fn enter(self: &Arc<Self>, key: PollKey) -> Option<StatusSlot> {
        let mut open = self.open.lock();
        let n = open.entry(key).or_insert(0);
        if *n >= self.most {
            return None;
        }
        *n += 1;
        drop(open);
        Some(StatusSlot {
            calls: self.clone(),
            key,
        })
    }

    #[cfg(test)]
    fn open_for(&self, key: &PollKey) -> usize {
        self.open.lock().get(key).copied().unwrap_or(0)
    }
}

impl Drop for StatusSlot {
    fn drop(&mut self) {
        let mut open = self.calls.open.lock();
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::keyed::PollKeys;

    #[test]
    fn at_most_the_burst_are_open_and_a_closed_one_frees_its_place() {
        let calls = Arc::new(StatusCalls::new(2));
        let keys = PollKeys::default();
        let k = keys.key("t", "s", "tsk_a");
        let a = calls.enter(k);
        let b = calls.enter(k);
        assert!(a.is_some() && b.is_some());
        assert!(calls.enter(k).is_none());
        // Another task of the same principal has its own places.
        assert!(calls.enter(keys.key("t", "s", "tsk_b")).is_some());
        drop(a);
        assert_eq!(calls.open_for(&k), 1);
        assert!(calls.enter(k).is_some());
        drop(b);
        assert_eq!(calls.open_for(&k), 0);
    }
}
