//! What one batch of a tenant purge removed ([`TaskStore::purge_tenant`],
//! docs/design.md §27 "Tenant purge").
//!
//! [`TaskStore::purge_tenant`]: super::TaskStore::purge_tenant

use serde::Serialize;

use super::TaskStatus;

/// How many stored items of each kind a purge removed. Only the kinds a backend
/// stores on their own are counted: PostgreSQL's indexes and read marks' cascade go
/// with their rows, so its `index_entries` stays 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PurgeCounts {
    /// Task records.
    pub tasks: u64,
    /// Request routes (in-flight calls of the tenant's tasks, and leftovers).
    pub routes: u64,
    /// Idempotency claims.
    pub idempotency_claims: u64,
    /// Tombstones of expired tasks.
    pub tombstones: u64,
    /// Read marks.
    pub read_marks: u64,
    /// 2025-era client sessions.
    pub sessions: u64,
    /// Relays between replicas (PostgreSQL) addressed about the tenant's calls.
    pub relays: u64,
    /// Index entries stored apart from their records (sled's trees, the in-memory
    /// store's maps).
    pub index_entries: u64,
}

impl PurgeCounts {
    /// `other` added to these counts.
    pub fn add(&mut self, other: &PurgeCounts) {
        self.tasks += other.tasks;
        self.routes += other.routes;
        self.idempotency_claims += other.idempotency_claims;
        self.tombstones += other.tombstones;
        self.read_marks += other.read_marks;
        self.sessions += other.sessions;
        self.relays += other.relays;
        self.index_entries += other.index_entries;
    }

    /// Everything removed, all kinds together.
    pub fn total(&self) -> u64 {
        self.tasks
            + self.routes
            + self.idempotency_claims
            + self.tombstones
            + self.read_marks
            + self.sessions
            + self.relays
            + self.index_entries
    }
}

/// A task record a purge removed: what the engine's observers need to see it go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgedTask {
    pub task_id: String,
    pub status: TaskStatus,
    pub created_at_ms: u64,
}

/// One batch of [`TaskStore::purge_tenant`](super::TaskStore::purge_tenant).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Purged {
    pub counts: PurgeCounts,
    /// The task records removed.
    pub tasks: Vec<PurgedTask>,
    /// The ids of the sessions removed (their streams on this replica end).
    pub sessions: Vec<String>,
    /// Whether the batch stopped at its limit: call again for the rest.
    pub more: bool,
}

/// Counts the items a batch removes against its limit.
#[derive(Debug)]
pub(crate) struct Budget {
    left: usize,
    /// Set once an item had to be left for the next batch.
    pub(crate) exhausted: bool,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            left: limit.max(1),
            exhausted: false,
        }
    }

    /// Whether any unit is left for a next phase; when none is, the batch reports
    /// `more` (what that phase would have found is left for the next batch).
    pub(crate) fn open(&mut self) -> bool {
        if self.left == 0 {
            self.exhausted = true;
        }
        self.left > 0
    }

    /// Take one unit for the next item; `false` (and the batch reports `more`) when
    /// none is left.
    pub(crate) fn take(&mut self) -> bool {
        if self.left == 0 {
            self.exhausted = true;
            return false;
        }
        self.left -= 1;
        true
    }
}
