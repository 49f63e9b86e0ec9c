//! Terminal snapshots this replica has read (docs/design.md §7 "Ownership", "Terminal
//! snapshots"). A terminal record never changes again: only expiry or a tenant purge
//! removes it. So once one has been read from the store, later reads by its owner are
//! answered from memory, without a store round trip, while ownership and expiry stay
//! exact: an entry answers only the principal that owns it and only before its
//! `expires_at_ms`; any other read goes to the store as before.
//!
//! An entry leaves when its task changes (here or, through the fan-out, on another
//! replica: an expiry and a purge both report their tasks as changed), on a resync
//! (changes may have been missed), and when the byte budget needs room (oldest first).
//! A read that raced such a change is not kept: each slot of ids counts its evictions,
//! and an insert whose slot moved since the store read began is dropped.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

use crate::store::TaskRecord;

/// What the cache may hold, by the estimate of [`approx_size`]. At ~1 KiB per small
/// record this is some 16,000 snapshots (the benchmarks' 10k-task set fits); a record
/// over 1/64 of it is never kept. Small beside RSS: benches/RESULTS.md "Issue 32".
pub(super) const BUDGET_BYTES: usize = 16 << 20;

/// Eviction counters: an id's slot is `hash(id) % SLOTS`.
const SLOTS: usize = 64;

pub(super) struct TerminalCache {
    inner: Mutex<Inner>,
    /// Evictions per slot of ids; a clear moves them all.
    epochs: [AtomicU64; SLOTS],
    hasher: std::collections::hash_map::RandomState,
    budget: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Insertion order, for eviction: `(id, generation)`; a pair whose generation no
    /// longer matches its entry was removed already.
    order: VecDeque<(String, u64)>,
    bytes: usize,
    next_generation: u64,
}

struct Entry {
    rec: Arc<TaskRecord>,
    size: usize,
    generation: u64,
}

/// Taken before a store read ([`TerminalCache::ticket`]), handed back with what it
/// read ([`TerminalCache::keep`]).
pub(super) struct Ticket {
    slot: usize,
    epoch: u64,
}

impl Default for TerminalCache {
    fn default() -> Self {
        Self::with_budget(BUDGET_BYTES)
    }
}

impl TerminalCache {
    pub(super) fn with_budget(budget: usize) -> Self {
        Self {
            inner: Mutex::default(),
            epochs: std::array::from_fn(|_| AtomicU64::new(0)),
            hasher: std::collections::hash_map::RandomState::new(),
            budget,
        }
    }

    fn slot(&self, task_id: &str) -> usize {
        (self.hasher.hash_one(task_id) % SLOTS as u64) as usize
    }

    /// The terminal snapshot of `task_id` if `(tenant, subject)` owns it and it has not
    /// expired at `now_ms`; `None` sends the read to the store.
    pub(super) fn get(
        &self,
        task_id: &str,
        tenant: &str,
        subject: &str,
        now_ms: u64,
    ) -> Option<Arc<TaskRecord>> {
        let rec = {
            let inner = self.inner.lock();
            inner.entries.get(task_id).map(|e| e.rec.clone())?
        };
        // Shared, not copied: a snapshot never changes, and a reader that adapts a
        // record gets its own copy (`Arc::make_mut`).
        (rec.tenant == tenant && rec.subject == subject && rec.expires_at_ms > now_ms)
            .then_some(rec)
    }

    /// Call before the store read whose record may be kept.
    pub(super) fn ticket(&self, task_id: &str) -> Ticket {
        let slot = self.slot(task_id);
        Ticket {
            slot,
            epoch: self.epochs[slot].load(Ordering::Acquire),
        }
    }

    /// Keep `rec` if it is terminal, small enough, and nothing of its slot was evicted
    /// since `ticket` was taken.
    pub(super) fn keep(&self, ticket: Ticket, rec: &Arc<TaskRecord>) {
        if !rec.status.is_terminal() {
            return;
        }
        let size = approx_size(rec);
        if size > self.budget / 64 {
            return;
        }
        let mut inner = self.inner.lock();
        // Checked under the lock: `forget` bumps the epoch before it takes the lock, so
        // an eviction either is seen here or removes what this inserts.
        if self.epochs[ticket.slot].load(Ordering::Acquire) != ticket.epoch
            || inner.entries.contains_key(&rec.task_id)
        {
            return;
        }
        while inner.bytes + size > self.budget {
            let Some((id, generation)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .entries
                .get(&id)
                .is_some_and(|e| e.generation == generation)
                && let Some(e) = inner.entries.remove(&id)
            {
                inner.bytes -= e.size;
            }
        }
        let generation = inner.next_generation;
        inner.next_generation += 1;
        inner.bytes += size;
        inner.order.push_back((rec.task_id.clone(), generation));
        inner.entries.insert(
            rec.task_id.clone(),
            Entry {
                rec: rec.clone(),
                size,
                generation,
            },
        );
    }

    /// `task_id` changed: drop its snapshot, and any read of it under way.
    pub(super) fn forget(&self, task_id: &str) {
        self.epochs[self.slot(task_id)].fetch_add(1, Ordering::AcqRel);
        let mut inner = self.inner.lock();
        if let Some(e) = inner.entries.remove(task_id) {
            inner.bytes -= e.size;
        }
        Self::compact(&mut inner);
    }

    /// Changes may have been missed: drop everything.
    pub(super) fn clear(&self) {
        for e in &self.epochs {
            e.fetch_add(1, Ordering::AcqRel);
        }
        let mut inner = self.inner.lock();
        inner.entries.clear();
        inner.order.clear();
        inner.bytes = 0;
    }

    /// Keep the order queue from growing past twice the entries with pairs of removed
    /// entries (each `forget` leaves one behind).
    fn compact(inner: &mut Inner) {
        if inner.order.len() > 2 * inner.entries.len() + 64 {
            let Inner { entries, order, .. } = inner;
            order.retain(|(id, g)| entries.get(id).is_some_and(|e| e.generation == *g));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }
}

/// A record's memory, roughly: its strings and JSON values plus a fixed overhead.
fn approx_size(rec: &TaskRecord) -> usize {
    const RECORD: usize = 512;
    let strings = rec.task_id.len()
        + rec.tenant.len()
        + rec.subject.len()
        + rec.upstream.len()
        + rec.tool.len()
        + rec.args_fingerprint.len()
        + rec.idempotency_key.as_ref().map_or(0, String::len)
        + rec.status_message.as_ref().map_or(0, String::len)
        + rec.trace.as_ref().map_or(0, String::len);
    let values =
        rec.result.as_ref().map_or(0, value_size) + rec.error.as_ref().map_or(0, value_size);
    RECORD + strings + values
}

fn value_size(v: &Value) -> usize {
    const NODE: usize = 32;
    match v {
        Value::String(s) => NODE + s.len(),
        Value::Array(a) => NODE + a.iter().map(value_size).sum::<usize>(),
        Value::Object(o) => {
            NODE + o
                .iter()
                .map(|(k, v)| NODE + k.len() + value_size(v))
                .sum::<usize>()
        }
        _ => NODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TaskStatus;
    use crate::store::test_records::task;

    fn done(id: &str, tenant: &str, expires_at_ms: u64) -> Arc<TaskRecord> {
        Arc::new(TaskRecord {
            status: TaskStatus::Completed,
            result: Some(serde_json::json!({"content": [{"type": "text", "text": "ok"}]})),
            ..task(id, tenant, expires_at_ms)
        })
    }

    #[test]
    fn answers_only_the_owner_before_expiry() {
        let c = TerminalCache::default();
        let rec = done("tsk_a", "acme", 1_000);
        c.keep(c.ticket("tsk_a"), &rec);
        let hit = c.get("tsk_a", "acme", "alice", 999);
        assert_eq!(hit.as_deref(), Some(&*rec));
        assert!(
            hit.is_some_and(|h| Arc::ptr_eq(&h, &rec)),
            "a hit shares the snapshot, it does not copy it"
        );
        assert_eq!(c.get("tsk_a", "acme", "bob", 999), None, "another subject");
        assert_eq!(
            c.get("tsk_a", "other", "alice", 999),
            None,
            "another tenant"
        );
        assert_eq!(c.get("tsk_a", "acme", "alice", 1_000), None, "expired");
        assert_eq!(c.get("tsk_b", "acme", "alice", 0), None, "never read");
    }

    #[test]
    fn keeps_only_terminal_snapshots() {
        let c = TerminalCache::default();
        let working = Arc::new(task("tsk_w", "acme", u64::MAX));
        c.keep(c.ticket("tsk_w"), &working);
        assert_eq!(c.get("tsk_w", "acme", "alice", 0), None);
    }

    #[test]
    fn a_change_during_the_read_is_not_kept() {
        let c = TerminalCache::default();
        let rec = done("tsk_a", "acme", u64::MAX);
        let ticket = c.ticket("tsk_a");
        c.forget("tsk_a");
        c.keep(ticket, &rec);
        assert_eq!(c.get("tsk_a", "acme", "alice", 0), None);
        let ticket = c.ticket("tsk_a");
        c.clear();
        c.keep(ticket, &rec);
        assert_eq!(c.len(), 0);
        c.keep(c.ticket("tsk_a"), &rec);
        assert_eq!(c.len(), 1);
        c.forget("tsk_a");
        assert_eq!(c.get("tsk_a", "acme", "alice", 0), None);
    }

    #[test]
    fn the_budget_evicts_the_oldest() {
        let one = approx_size(&done("tsk_0", "acme", u64::MAX));
        let c = TerminalCache::with_budget(one * 64 * 3 / 2);
        // 96 fit (one record is 1/64 of the budget at most); 200 inserts keep the newest.
        for i in 0..200 {
            let id = format!("tsk_{i}");
            c.keep(c.ticket(&id), &done(&id, "acme", u64::MAX));
        }
        assert!(c.len() <= 96);
        assert!(c.get("tsk_0", "acme", "alice", 0).is_none(), "oldest gone");
        assert!(
            c.get("tsk_199", "acme", "alice", 0).is_some(),
            "newest kept"
        );
        let inner = c.inner.lock();
        assert!(inner.bytes <= c.budget);
    }
}
