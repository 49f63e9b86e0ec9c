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
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Engine;
use crate::store::{TaskRecord, TaskStatus};

/// How long a noted read waits for others before they are written together. A client
/// that polls until terminal reads each outcome once or twice, so the batch is what
/// many tasks finishing together produce.
const COALESCE: Duration = Duration::from_millis(100);

/// Noted reads waiting at most: if the store falls behind, further reads are not
/// noted (they can only over-count) rather than growing memory without bound.
const MAX_PENDING: usize = 65_536;

/// Independent parts of the pending set, each behind its own lock: every terminal
/// `tasks/get` notes its task here, and behind one lock the runtime's worker threads
/// queued for each other (benches/RESULTS.md, issue 26).
const SHARDS: usize = 16;

/// Reads noted but not yet written.
#[derive(Default)]
pub(super) struct SeenMarks {
    pending: [Mutex<HashSet<String>>; SHARDS],
    wake: Notify,
    /// Held while a batch is written, so that the sweeper's write waits for a batch
    /// the marker task has already taken.
    writing: tokio::sync::Mutex<()>,
}

impl SeenMarks {
    /// Task ids end in random base64, so their last byte spreads them over the shards.
    fn shard(&self, task_id: &str) -> &Mutex<HashSet<String>> {
        let last = task_id.as_bytes().last().copied().unwrap_or(0);
        &self.pending[usize::from(last) % SHARDS]
    }

    fn note(&self, task_id: &str) {
        let mut pending = self.shard(task_id).lock();
        if pending.len() >= MAX_PENDING / SHARDS || pending.contains(task_id) {
            return;
        }
        pending.insert(task_id.to_string());
        drop(pending);
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<String> {
        let mut all = Vec::new();
        for shard in &self.pending {
            let taken = std::mem::take(&mut *shard.lock());
            all.extend(taken);
        }
        all
    }
}

impl Engine {
    /// The owner received `rec`, as a `tasks/get` result or a `notifications/tasks`
    /// on its listen stream. Only outcomes the sweeper would count are noted: a
    /// cancelled task is never counted, so its read needs no mark.
    pub fn note_seen(&self, rec: &TaskRecord) {
        if matches!(rec.status, TaskStatus::Completed | TaskStatus::Failed) {
            self.seen.note(&rec.task_id);
        }
    }

    /// Write the noted reads now: from the marker task, from the sweeper before it
    /// expires anything (a read just before expiry then still counts), and once more
    /// when the gateway stops.
    pub async fn write_seen(&self) {
        let _writing = self.seen.writing.lock().await;
        let batch = self.seen.take();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.mark_seen(&batch).await {
            tracing::warn!(
                error = %e,
                tasks = batch.len(),
                "recording task reads failed; these tasks count as unread when they expire"
            );
        }
    }

    /// Start the background task that writes noted reads.
    pub fn spawn_seen_marker(self: &Arc<Self>) {
        let engine = self.clone();
        tokio::spawn(async move {
            loop {
                // A read noted while a batch is written leaves a permit: the next
                // batch follows.
                engine.seen.wake.notified().await;
                tokio::time::sleep(COALESCE).await;
                engine.write_seen().await;
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
}
