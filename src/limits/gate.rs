//! Per-upstream admission (docs/design.md §8 "Flow control"): at most `max_concurrency`
//! calls run; the rest wait in per-tenant FIFO queues. A freed slot goes to the waiting
//! tenant with the fewest running calls, ties to the one served least recently —
//! round-robin among equals — so a tenant that floods the upstream delays mostly
//! itself. The queue holds at most `queue_size` calls, one tenant at most half of them
//! (so it can never fill the queue for everyone).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

#[derive(Default)]
struct TenantState {
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
    running: usize,
    /// Admission sequence number of its last admitted call (0 = never).
    last_served: u64,
}

#[derive(Default)]
struct Inner {
    in_flight: usize,
    queued: usize,
    next_id: u64,
    seq: u64,
    tenants: HashMap<String, TenantState>,
}

impl Inner {
    /// The tenant whose waiter is admitted next.
    fn next_tenant(&self) -> Option<String> {
        self.tenants
            .iter()
            .filter(|(_, t)| !t.waiting.is_empty())
            .min_by_key(|(_, t)| (t.running, t.last_served))
            .map(|(k, _)| k.clone())
    }

    /// Estimated 1-based position of waiter `id` of `tenant`: its place in its own
    /// queue times the number of waiting tenants, plus the tenants ahead of it.
    fn position(&self, tenant: &str, id: u64) -> Option<usize> {
        let me = self.tenants.get(tenant)?;
        let idx = me.waiting.iter().position(|(w, _)| *w == id)?;
        let key = (me.running, me.last_served);
        let mut ahead = 0;
        let mut waiting_tenants = 0;
        for t in self.tenants.values().filter(|t| !t.waiting.is_empty()) {
            waiting_tenants += 1;
            if (t.running, t.last_served) < key {
                ahead += 1;
            }
        }
        Some(idx * waiting_tenants + ahead + 1)
    }

    /// The position a call of `tenant` entering now would be given, `None` when it
    /// would run at once. Same estimate as [`Self::position`].
    fn position_of_next(&self, tenant: &str, max: usize) -> Option<usize> {
        if self.in_flight < max && self.queued == 0 {
            return None;
        }
        let me = self.tenants.get(tenant);
        let idx = me.map_or(0, |t| t.waiting.len());
        let key = me.map_or((0, 0), |t| (t.running, t.last_served));
        let mut ahead = 0;
        let mut waiting_tenants = usize::from(idx == 0);
        for t in self.tenants.values().filter(|t| !t.waiting.is_empty()) {
            waiting_tenants += 1;
            if (t.running, t.last_served) < key {
                ahead += 1;
            }
        }
        Some(idx * waiting_tenants + ahead + 1)
    }

    fn remove(&mut self, tenant: &str, id: u64) -> bool {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return false;
        };
        let Some(i) = t.waiting.iter().position(|(w, _)| *w == id) else {
            return false;
        };
        t.waiting.remove(i);
        self.queued -= 1;
        self.forget_idle(tenant);
        true
    }

    fn forget_idle(&mut self, tenant: &str) {
        if self
            .tenants
            .get(tenant)
            .is_some_and(|t| t.waiting.is_empty() && t.running == 0)
        {
            self.tenants.remove(tenant);
        }
    }

    fn start(&mut self, tenant: &str) {
        self.seq += 1;
        let seq = self.seq;
        let t = self.tenants.entry(tenant.to_string()).or_default();
        t.running += 1;
        t.last_served = seq;
    }
}

/// The admission gate of one upstream.
pub struct Gate {
    max: usize,
    queue_size: usize,
    inner: Mutex<Inner>,
}

/// A running call's slot; dropping it admits the next waiter.
pub struct Permit(Arc<Gate>, String);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.release(&self.1);
    }
}

/// Why a call was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// A queued call: resolves to a permit; dropping it leaves the queue.
pub struct Waiting {
    gate: Arc<Gate>,
    tenant: String,
    id: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Waiting {
    /// Current 1-based position, `None` once admitted.
    pub fn position(&self) -> Option<usize> {
        self.gate.inner.lock().position(&self.tenant, self.id)
    }

    /// Wait for admission (cancel-safe: dropping the future keeps the place).
    pub async fn wait(&mut self) -> Permit {
        if let Some(rx) = self.rx.as_mut() {
            // The sender lives in the queue until it admits us (or we leave), and
            // the gate outlives us, so this resolves only with the slot.
            let _ = rx.await;
        }
        self.rx = None;
        Permit(self.gate.clone(), self.tenant.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let removed = self.gate.inner.lock().remove(&self.tenant, self.id);
        // Admitted after all (the slot was handed over): pass it on.
        if !removed && rx.try_recv().is_ok() {
            self.gate.release(&self.tenant);
        }
    }
}

/// Outcome of [`Gate::enter`].
pub enum Entry {
    Run(Permit),
    Queued(Waiting),
}

impl Gate {
    pub fn new(max_concurrency: usize, queue_size: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max_concurrency.max(1),
            queue_size,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn tenant_share(&self) -> usize {
        if self.queue_size <= 1 {
            self.queue_size
        } else {
            self.queue_size.div_ceil(2)
        }
    }

    fn full_for(&self, i: &Inner, tenant: &str) -> bool {
        i.queued >= self.queue_size
            || i.tenants.get(tenant).map_or(0, |t| t.waiting.len()) >= self.tenant_share()
    }

    /// Whether a call from `tenant` would be refused right now (checked before any
    /// work starts, so a refused request has no side effect).
    pub fn would_refuse(&self, tenant: &str) -> bool {
        let i = self.inner.lock();
        (i.in_flight >= self.max || i.queued > 0) && self.full_for(&i, tenant)
    }

    /// Run now, queue, or refuse.
    pub fn enter(self: &Arc<Self>, tenant: &str) -> Result<Entry, QueueFull> {
        let mut i = self.inner.lock();
        if i.in_flight < self.max && i.queued == 0 {
            i.in_flight += 1;
            i.start(tenant);
            return Ok(Entry::Run(Permit(self.clone(), tenant.to_string())));
        }
        if self.full_for(&i, tenant) {
            return Err(QueueFull);
        }
        let (tx, rx) = oneshot::channel();
        i.next_id += 1;
        let id = i.next_id;
        i.queued += 1;
        i.tenants
            .entry(tenant.to_string())
            .or_default()
            .waiting
            .push_back((id, tx));
        Ok(Entry::Queued(Waiting {
            gate: self.clone(),
            tenant: tenant.to_string(),
            id,
            rx: Some(rx),
        }))
    }

    /// Free a slot of `tenant`: hand it to the next waiter.
    fn release(&self, tenant: &str) {
        let mut i = self.inner.lock();
        if let Some(t) = i.tenants.get_mut(tenant) {
            t.running = t.running.saturating_sub(1);
        }
        i.forget_idle(tenant);
        while let Some(next) = i.next_tenant() {
            let Some((_, tx)) = i.tenants.get_mut(&next).and_then(|t| t.waiting.pop_front()) else {
                break;
            };
            i.queued -= 1;
            if tx.send(()).is_ok() {
                i.start(&next); // the slot moves to the waiter
                return;
            }
            i.forget_idle(&next);
        }
        i.in_flight = i.in_flight.saturating_sub(1);
    }

    /// The queue position a call of `tenant` would get if it entered now (`None`: it
    /// would run at once). Lets a task created before its call starts say "queued"
    /// from its first snapshot on.
    pub fn position_if_entered(&self, tenant: &str) -> Option<usize> {
        self.inner.lock().position_of_next(tenant, self.max)
    }

    /// `(running, queued)`.
    pub fn load(&self) -> (usize, usize) {
        let i = self.inner.lock();
        (i.in_flight, i.queued)
    }

    pub fn max_concurrency(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(e: Result<Entry, QueueFull>) -> Permit {
        match e {
            Ok(Entry::Run(p)) => p,
            _ => panic!("expected to run"),
        }
    }
    fn queued(e: Result<Entry, QueueFull>) -> Waiting {
        match e {
            Ok(Entry::Queued(w)) => w,
            _ => panic!("expected to queue"),
        }
    }

    #[tokio::test]
    async fn fair_fifo_and_bounded() {
        let g = Gate::new(1, 4);
        let p = run(g.enter("a"));
        let mut a1 = queued(g.enter("a"));
        let mut a2 = queued(g.enter("a"));
        // Tenant a has its share (half the queue); b still gets in.
        assert!(g.enter("a").is_err());
        assert!(g.would_refuse("a"));
        assert!(!g.would_refuse("b"));
        let mut b1 = queued(g.enter("b"));
        // b has never been served: it goes first; a's calls stay FIFO.
        assert_eq!(b1.position(), Some(1));
        assert_eq!(a1.position(), Some(2));
        assert_eq!(a2.position(), Some(4));
        drop(p);
        let p = b1.wait().await;
        assert_eq!(a1.position(), Some(1));
        drop(p);
        let p = a1.wait().await;
        assert_eq!(g.load(), (1, 1));
        drop(p);
        let p = a2.wait().await;
        drop(p);
        assert_eq!(g.load(), (0, 0));
    }

    #[tokio::test]
    async fn the_tenant_with_fewer_running_calls_goes_first() {
        let g = Gate::new(2, 8);
        let pa = run(g.enter("a"));
        let pb = run(g.enter("b"));
        let mut a1 = queued(g.enter("a"));
        let mut b1 = queued(g.enter("b"));
        // Tie on running calls: a was served longer ago, so it is ahead.
        assert_eq!(a1.position(), Some(1));
        assert_eq!(b1.position(), Some(2));
        // b frees its slot: b now runs fewer calls than a, so b goes first.
        drop(pb);
        let pb1 = b1.wait().await;
        drop(pa);
        let _pa1 = a1.wait().await;
        drop(pb1);
        assert_eq!(g.load(), (1, 0));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let g = Gate::new(1, 8);
        let p = run(g.enter("a"));
        let w = queued(g.enter("a"));
        let w2 = queued(g.enter("b"));
        drop(w);
        assert_eq!(w2.position(), Some(1));
        drop(p);
        // Handed to w2; dropping w2 before it looks passes the slot back.
        drop(w2);
        assert_eq!(g.load(), (0, 0));
        let _p = run(g.enter("c"));
    }

    #[test]
    fn position_if_entered_predicts_the_next_waiter() {
        let g = Gate::new(1, 10);
        assert_eq!(g.position_if_entered("a"), None);
        let _run = g.enter("a");
        assert_eq!(g.position_if_entered("a"), Some(1));
        let w1 = queued(g.enter("a"));
        assert_eq!(w1.position(), Some(1));
        assert_eq!(g.position_if_entered("a"), Some(2));
        let w2 = queued(g.enter("a"));
        assert_eq!(w2.position(), Some(2));
    }
}
