//! The work of each tenant in flight on this replica (its upstream calls, and the
//! task creations that may write a record), and the fence a tenant purge raises
//! around it (docs/design.md §27 "Tenant purge"): while a purge of a tenant runs, no
//! new call or creation of that tenant starts here, and the ones in flight are
//! cancelled, so none writes a record after the purge removed its tenant's.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// Entered twice per task-creating `tools_call` (the creation and its upstream call),
/// so an entry costs one lock and two reference counts: no allocation while the
/// tenant has work in flight, and the token is shared, not cloned (a token's clone
/// takes a lock of its own).
#[derive(Default)]
pub(super) struct TenantCalls {
    tenants: Mutex<HashMap<Arc<str>, Tenant>>,
}

struct Tenant {
    /// The map's key, shared with the guards.
    name: Arc<str>,
    /// [`InFlight`] guards alive.
    active: usize,
    /// A purge holds the [`Fence`].
    purging: bool,
    /// Cancelled by the purge; a fresh one once the fence is gone.
    cancel: Arc<CancellationToken>,
}

impl Tenant {
    fn named(name: Arc<str>) -> Self {
        Self {
            name,
            active: 0,
            purging: false,
            cancel: Arc::default(),
        }
    }
}

/// One call or creation of a tenant in flight; dropped when it is done.
pub(super) struct InFlight<'a> {
    calls: &'a TenantCalls,
    tenant: Arc<str>,
    cancel: Arc<CancellationToken>,
}

impl InFlight<'_> {
    /// Resolves when a purge of the tenant cancels what is in flight.
    pub(super) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut tenants = self.calls.tenants.lock();
        if let Some(t) = tenants.get_mut(&*self.tenant) {
            t.active = t.active.saturating_sub(1);
            if t.active == 0 && !t.purging {
                tenants.remove(&*self.tenant);
            }
        }
    }
}

/// A purge's hold on one tenant: until dropped, [`TenantCalls::enter`] refuses it.
pub(super) struct Fence<'a> {
    calls: &'a TenantCalls,
    tenant: String,
}

impl Fence<'_> {
    /// Cancel every call and creation of the tenant in flight here; how many there were.
    pub(super) fn cancel(&self) -> usize {
        let tenants = self.calls.tenants.lock();
        match tenants.get(&*self.tenant) {
            Some(t) => {
                t.cancel.cancel();
                t.active
            }
            None => 0,
        }
    }

    /// How many are still in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.calls
            .tenants
            .lock()
            .get(&*self.tenant)
            .map_or(0, |t| t.active)
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        let mut tenants = self.calls.tenants.lock();
        if let Some(t) = tenants.get_mut(&*self.tenant) {
            t.purging = false;
            t.cancel = Arc::default();
            if t.active == 0 {
                tenants.remove(&*self.tenant);
            }
        }
    }
}

impl TenantCalls {
    /// Start a call or creation of `tenant`; `None` while a purge of it runs.
    pub(super) fn enter(&self, tenant: &str) -> Option<InFlight<'_>> {
        let mut tenants = self.tenants.lock();
        let t = match tenants.get_mut(tenant) {
            Some(t) => t,
            None => {
                let name: Arc<str> = Arc::from(tenant);
                tenants
                    .entry(name.clone())
                    .or_insert_with(|| Tenant::named(name))
            }
        };
        if t.purging {
            return None;
        }
        t.active += 1;
        Some(InFlight {
            calls: self,
            tenant: t.name.clone(),
            cancel: t.cancel.clone(),
        })
    }

    /// Raise the purge fence around `tenant`; `None` when another purge of it holds it.
    pub(super) fn fence(&self, tenant: &str) -> Option<Fence<'_>> {
        let mut tenants = self.tenants.lock();
        let name: Arc<str> = Arc::from(tenant);
        let t = tenants
            .entry(name.clone())
            .or_insert_with(|| Tenant::named(name));
        if t.purging {
            return None;
        }
        t.purging = true;
        Some(Fence {
            calls: self,
            tenant: tenant.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fence_cancels_and_refuses_its_tenant_only() {
        let calls = TenantCalls::default();
        let a = calls.enter("a").expect("no purge yet");
        let b = calls.enter("b").expect("no purge yet");
        let fence = calls.fence("a").expect("the first purge");
        assert!(
            calls.fence("a").is_none(),
            "one purge of a tenant at a time"
        );
        assert!(calls.enter("a").is_none(), "refused while purged");
        assert_eq!(fence.cancel(), 1);
        a.cancelled().await;
        assert!(!b.cancel.is_cancelled(), "another tenant's call runs on");
        drop(a);
        assert_eq!(fence.in_flight(), 0);
        drop(fence);
        let again = calls.enter("a").expect("admitted once the purge ended");
        assert!(!again.cancel.is_cancelled(), "a fresh token");
        drop((again, b));
        assert!(
            calls.tenants.lock().is_empty(),
            "nothing kept for idle tenants"
        );
    }
}
