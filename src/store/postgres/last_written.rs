//! What this store last wrote of each live task it may write again (docs/design.md
//! §17 "Writes on PostgreSQL"): the record and the `version` the write left, so that
//! the next compare-and-swap of that task can skip its read.
//!
//! An entry is a guess, never an answer: the write that uses it names its `version`,
//! and any other write in between (another replica, a cancel, an expiry, a purge)
//! moved the version or removed the row, so the guess writes nothing and the update
//! reads the record as before. Nothing is read from here; a hint only ever saves the
//! read of a write that succeeds.
//!
//! Bounded: past [`CAP`] entries the oldest go (a lost hint costs one read). A terminal
//! record is not kept, since a finished task is not written again by its call.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::store::TaskRecord;

/// Live tasks remembered at most: far above the tasks one replica has in flight at
/// once in the benchmarks (benches/RESULTS.md "Issue 32"), small beside its memory.
const CAP: usize = 4096;

#[derive(Default)]
pub(super) struct LastWritten {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, (i64, TaskRecord)>,
    /// Insertion order; an id may appear more than once (remembered again after a
    /// take), and the oldest appearance evicts it, which at worst loses a hint.
    order: VecDeque<String>,
}

impl LastWritten {
    /// `rec` is in the store at `version` (this store just wrote it).
    pub(super) fn remember(&self, version: i64, rec: TaskRecord) {
        if rec.status.is_terminal() {
            self.inner.lock().entries.remove(&rec.task_id);
            return;
        }
        let mut inner = self.inner.lock();
        inner.order.push_back(rec.task_id.clone());
        inner.entries.insert(rec.task_id.clone(), (version, rec));
        while inner.order.len() > CAP {
            if let Some(id) = inner.order.pop_front() {
                inner.entries.remove(&id);
            }
        }
    }

    /// The last write of `task_id` this store remembers, removed: the caller writes
    /// at that version and remembers what it wrote.
    pub(super) fn take(&self, task_id: &str) -> Option<(i64, TaskRecord)> {
        self.inner.lock().entries.remove(task_id)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TaskStatus;
    use crate::store::test_records::task;

    #[test]
    fn keeps_live_records_and_drops_terminal_ones() {
        let w = LastWritten::default();
        w.remember(1, task("tsk_a", "acme", u64::MAX));
        assert_eq!(
            w.take("tsk_a").map(|(v, r)| (v, r.task_id)),
            Some((1, "tsk_a".into()))
        );
        assert!(w.take("tsk_a").is_none(), "taken once");
        w.remember(2, task("tsk_a", "acme", u64::MAX));
        w.remember(
            3,
            TaskRecord {
                status: TaskStatus::Completed,
                ..task("tsk_a", "acme", u64::MAX)
            },
        );
        assert!(
            w.take("tsk_a").is_none(),
            "a terminal write forgets the task"
        );
    }

    #[test]
    fn holds_at_most_cap_entries() {
        let w = LastWritten::default();
        for i in 0..CAP + 100 {
            w.remember(1, task(&format!("tsk_{i}"), "acme", u64::MAX));
        }
        assert_eq!(w.len(), CAP);
        assert!(w.take("tsk_0").is_none(), "the oldest went");
        assert!(w.take(&format!("tsk_{}", CAP + 99)).is_some());
    }
}
