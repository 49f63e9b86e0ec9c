//! Read marks (docs/design.md §23 "Outcomes nobody collected", README "Limits and
//! metrics"): which terminal tasks their owner has received, so that the sweeper can
//! count, and log, the outcomes nobody collected.
//!
//! A read only notes the task id here (a lock and a set insert). A background task
//! writes the noted ids to the store a moment later, many reads in one go and without
//! a flush, so neither `tasks/get` nor a listen stream ever waits for the store. A
//! mark that is lost (a crash before sled writes its log, a full queue) can only make
//! a task that was read count as unread.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::store::{TaskRecord, TaskStatus, TaskStore};

/// How long a noted read waits for others before they are written together. A client
/// that polls until terminal reads each outcome once or twice, so the batch is what
/// many tasks finishing together produce.
const COALESCE: Duration = Duration::from_millis(100);

/// Noted reads waiting at most: if the store falls behind, further reads are not
/// noted (they can only over-count) rather than growing memory without bound.
const MAX_PENDING: usize = 65_536;

/// Tasks remembered as noted already, at most (two generations of half this each, a
/// hash apiece: about 1 MB). A task polled again and again after its end is noted
/// once, not once a poll: each noting costs the marker task store reads, and under a
/// `tasks/get` load that was a store read for every poll (benches/RESULTS.md, issue
/// 26). A task that falls out of the window is noted again and skipped by the store's
/// own check.
const MAX_RECENT: usize = 65_536;

/// Independent parts of the set, each behind its own lock: every terminal `tasks/get`
/// notes its task here, and behind one lock the runtime's worker threads queued for
/// each other (benches/RESULTS.md, issue 26).
const SHARDS: usize = 16;

#[derive(Default)]
struct Shard {
    /// Noted, not yet written.
    pending: HashSet<String>,
    /// Hashes of the ids noted lately, pending or written: the newer generation
    /// first. When it is full the older one is dropped and the newer takes its place.
    recent: [HashSet<u64>; 2],
}

impl Shard {
    fn is_recent(&self, hash: u64) -> bool {
        self.recent.iter().any(|g| g.contains(&hash))
    }

    fn remember(&mut self, hash: u64) {
        if self.recent[0].len() >= MAX_RECENT / SHARDS / 2 {
            self.recent[1] = std::mem::take(&mut self.recent[0]);
        }
        self.recent[0].insert(hash);
    }
}

/// Reads noted but not yet written, and which tasks were noted lately.
#[derive(Default)]
pub(super) struct SeenMarks {
    shards: [Mutex<Shard>; SHARDS],
    /// Keyed per process, so nobody can choose ids whose hashes collide.
    hasher: RandomState,
    wake: Notify,
    /// Held while a batch is written, so that the sweeper's write waits for a batch
    /// the marker task has already taken.
    writing: tokio::sync::Mutex<()>,
}

impl SeenMarks {
    /// The id's hash, and the shard its top bits pick.
    fn shard(&self, task_id: &str) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one(task_id);
        (hash, &self.shards[(hash >> 60) as usize % SHARDS])
    }

    fn note(&self, task_id: &str) {
        let (hash, shard) = self.shard(task_id);
        let mut shard = shard.lock();
        if shard.is_recent(hash) || shard.pending.len() >= MAX_PENDING / SHARDS {
            return;
        }
        shard.remember(hash);
        shard.pending.insert(task_id.to_string());
        drop(shard);
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<String> {
        let mut all = Vec::new();
        for shard in &self.shards {
            let taken = std::mem::take(&mut shard.lock().pending);
            all.extend(taken);
        }
        all
    }

    /// A batch that could not be written: its tasks are noted again on their next read.
    fn forget(&self, batch: &[String]) {
        for task_id in batch {
            let (hash, shard) = self.shard(task_id);
            for g in &mut shard.lock().recent {
                g.remove(&hash);
            }
        }
    }
}

impl SeenMarks {
    /// The owner received `rec`, as a `tasks/get` result or a `notifications/tasks`
    /// on its listen stream. Only outcomes the sweeper would count are noted: a
    /// cancelled task is never counted, so its read needs no mark.
    pub(super) fn note_read(&self, rec: &TaskRecord) {
        if matches!(rec.status, TaskStatus::Completed | TaskStatus::Failed) {
            self.note(&rec.task_id);
        }
    }

    /// Write the noted reads to `store` now.
    pub(super) async fn write(&self, store: &dyn TaskStore) {
        let _writing = self.writing.lock().await;
        let batch = self.take();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = store.mark_seen(&batch).await {
            self.forget(&batch);
            tracing::warn!(
                error = %e,
                tasks = batch.len(),
                "recording task reads failed; these tasks count as unread when they expire"
            );
        }
    }

    /// Start the background task that writes noted reads to `store`.
    pub(super) fn spawn_marker(self: &Arc<Self>, store: Arc<dyn TaskStore>) {
        let marks = self.clone();
        tokio::spawn(async move {
            loop {
                // A read noted while a batch is written leaves a permit: the next
                // batch follows.
                marks.wake.notified().await;
                tokio::time::sleep(COALESCE).await;
                marks.write(&*store).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noted_reads_are_taken_once_and_bounded() {
        let marks = SeenMarks::default();
        marks.note("tsk_a");
        marks.note("tsk_a");
        marks.note("tsk_b");
        let mut batch = marks.take();
        batch.sort();
        assert_eq!(batch, ["tsk_a", "tsk_b"]);
        assert!(marks.take().is_empty());
        for i in 0..MAX_PENDING + 10_000 {
            marks.note(&format!("tsk_{i:x}"));
        }
        let taken = marks.take().len();
        assert!(
            taken <= MAX_PENDING && taken > MAX_PENDING / 2,
            "bounded, and spread over the shards: {taken}"
        );
    }

    #[test]
    fn a_task_read_again_is_noted_once_until_it_leaves_the_window() {
        let marks = SeenMarks::default();
        marks.note("tsk_a");
        assert_eq!(marks.take(), ["tsk_a"]);
        // Written already: polling it again notes nothing.
        for _ in 0..100 {
            marks.note("tsk_a");
        }
        assert!(marks.take().is_empty());
        // A batch the store refused is noted again on the next read.
        marks.forget(&["tsk_a".to_string()]);
        marks.note("tsk_a");
        assert_eq!(marks.take(), ["tsk_a"]);
        // Past the window (two generations), an old task is noted afresh, and memory
        // stays bounded.
        for i in 0..2 * MAX_RECENT {
            marks.note(&format!("tsk_{i:x}"));
            if i % 1024 == 0 {
                marks.take();
            }
        }
        marks.take();
        let remembered: usize = marks
            .shards
            .iter()
            .map(|s| s.lock().recent.iter().map(HashSet::len).sum::<usize>())
            .sum();
        assert!(remembered <= MAX_RECENT, "bounded: {remembered}");
        marks.note("tsk_a");
        assert_eq!(marks.take(), ["tsk_a"]);
    }
}
