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
//! Bounded by the size of what it holds: past [`BUDGET_BYTES`] of encoded records the
//! oldest go (a lost hint costs one read), and a record over 1/64 of it is never kept.
//! A terminal record is not kept either, since a finished task is not written again by
//! its call.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::store::TaskRecord;

/// Encoded record bytes remembered at most: a few thousand live tasks of the usual size
/// (benches/RESULTS.md "Issue 32"), whatever their input requests hold.
const BUDGET_BYTES: usize = 8 << 20;

pub(super) struct LastWritten {
    inner: Mutex<Inner>,
    budget: usize,
}

impl Default for LastWritten {
    fn default() -> Self {
        Self::with_budget(BUDGET_BYTES)
    }
}

#[derive(Default)]
struct Inner {
    /// Per task: the version, the record, and its encoded size.
    entries: HashMap<String, (i64, TaskRecord, usize)>,
    /// Insertion order; an id may appear more than once (remembered again after a
    /// take), and its oldest appearance evicts it, which at worst loses a hint.
    order: VecDeque<String>,
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, task_id: &str) -> Option<(i64, TaskRecord)> {
        let (version, rec, size) = self.entries.remove(task_id)?;
        self.bytes -= size;
        Some((version, rec))
    }
}

impl LastWritten {
    fn with_budget(budget: usize) -> Self {
        Self {
            inner: Mutex::default(),
            budget,
        }
    }

    /// `rec`, encoded in `size` bytes, is in the store at `version` (this store just
    /// wrote it).
    pub(super) fn remember(&self, version: i64, rec: TaskRecord, size: usize) {
        let mut inner = self.inner.lock();
        inner.remove(&rec.task_id);
        if rec.status.is_terminal() || size > self.budget / 64 {
            return;
        }
        while inner.bytes + size > self.budget {
            let Some(id) = inner.order.pop_front() else {
                break;
            };
            inner.remove(&id);
        }
        // Ids left behind by takes are dropped with the oldest, so the order stays
        // within a few times the entries it names.
        if inner.order.len() > 4 * inner.entries.len() + 64 {
            let Inner { entries, order, .. } = &mut *inner;
            order.retain(|id| entries.contains_key(id));
        }
        inner.order.push_back(rec.task_id.clone());
        inner.bytes += size;
        inner
            .entries
            .insert(rec.task_id.clone(), (version, rec, size));
    }

    /// The last write of `task_id` this store remembers, removed: the caller writes
    /// at that version and remembers what it wrote.
    pub(super) fn take(&self, task_id: &str) -> Option<(i64, TaskRecord)> {
        self.inner.lock().remove(task_id)
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
        w.remember(1, task("tsk_a", "acme", u64::MAX), 100);
        assert_eq!(
            w.take("tsk_a").map(|(v, r)| (v, r.task_id)),
            Some((1, "tsk_a".into()))
        );
        assert!(w.take("tsk_a").is_none(), "taken once");
        w.remember(2, task("tsk_a", "acme", u64::MAX), 100);
        w.remember(
            3,
            TaskRecord {
                status: TaskStatus::Completed,
                ..task("tsk_a", "acme", u64::MAX)
            },
            100,
        );
        assert!(
            w.take("tsk_a").is_none(),
            "a terminal write forgets the task"
        );
        assert_eq!(w.inner.lock().bytes, 0);
    }

    #[test]
    fn holds_at_most_its_budget() {
        let w = LastWritten::with_budget(64 * 100);
        for i in 0..200 {
            w.remember(1, task(&format!("tsk_{i}"), "acme", u64::MAX), 100);
        }
        assert_eq!(w.len(), 64);
        assert!(w.take("tsk_0").is_none(), "the oldest went");
        assert!(w.take("tsk_199").is_some(), "the newest stayed");
        // Taken and remembered again, over and over: the order stays bounded.
        for _ in 0..10_000 {
            let (v, rec) = w.take("tsk_198").expect("remembered");
            w.remember(v + 1, rec, 100);
        }
        let inner = w.inner.lock();
        assert!(inner.bytes <= 64 * 100);
        assert!(inner.order.len() <= 4 * inner.entries.len() + 65);
    }

    #[test]
    fn a_record_over_a_64th_of_the_budget_is_not_kept() {
        let w = LastWritten::with_budget(64 * 100);
        w.remember(1, task("tsk_big", "acme", u64::MAX), 101);
        assert!(w.take("tsk_big").is_none());
        w.remember(1, task("tsk_ok", "acme", u64::MAX), 100);
        assert!(w.take("tsk_ok").is_some());
    }
}
