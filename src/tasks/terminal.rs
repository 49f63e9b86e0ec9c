//! The bookkeeping of every move to a terminal state, for each file that ends a task
//! (a cancel, a sweep, recovery, a takeover, the driver): below them all, so none of
//! them names another to end a task (ARCHITECTURE.md "Layers").

use crate::protocol::RpcError;
use crate::store::{TaskRecord, TaskStatus, now_ms};

/// Bookkeeping of every move to a terminal state: no input is outstanding any more, and
/// the result stays retrievable for `result_retention_ms` (docs/design.md §11
/// "Expiry").
pub(super) fn conclude(rec: &mut TaskRecord, retention_ms: u64) {
    conclude_at(rec, retention_ms, now_ms());
}

/// [`conclude`] at `now` (a settle that must come out the same when repeated).
pub(super) fn conclude_at(rec: &mut TaskRecord, retention_ms: u64, now: u64) {
    rec.last_updated_at_ms = now;
    rec.input_requests.clear();
    rec.expires_at_ms = rec.expires_at_ms.max(now + retention_ms);
    rec.ttl_ms = rec.expires_at_ms.saturating_sub(rec.created_at_ms);
}

/// Mark a record failed with a JSON-RPC error.
pub(super) fn fail(rec: &mut TaskRecord, err: &RpcError) {
    rec.status = TaskStatus::Failed;
    rec.status_message = Some(err.message.clone());
    rec.error = Some(err.to_value());
    rec.result = None;
}
