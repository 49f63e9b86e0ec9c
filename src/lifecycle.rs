//! Process lifecycle flags shared across modules (graceful shutdown, issue #4 item 9).

use std::sync::atomic::{AtomicBool, Ordering};

static DRAINING: AtomicBool = AtomicBool::new(false);

/// Mark the gateway as stopping: from now on a promoted call that ends because its
/// upstream is being shut down is *not* settled, so its request route stays in the
/// store and the next start resolves the task (policy 10).
pub fn begin_shutdown() {
    DRAINING.store(true, Ordering::SeqCst);
}

pub fn shutting_down() -> bool {
    DRAINING.load(Ordering::SeqCst)
}
