//! This replica's part in the cluster, as the engine holds it: its id, its seat and
//! lease, and the channels of its relays, with the one API that reads and changes them.
//! What a replica does with them (the loops, takeover, relays) is `replica.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::store::StoreError;
use crate::store::cluster::{Cluster, Seat};

/// Handles an MRTR retry relayed here; the front installs it.
pub type MrtrHandler =
    Arc<dyn Fn(Value) -> futures_util::future::BoxFuture<'static, Value> + Send + Sync>;

/// This replica's part in the cluster: its own state, behind one narrow API.
pub(super) struct Replica {
    /// `server.replica_id` (or its default): stable across restarts.
    id: String,
    cluster: OnceLock<Arc<dyn Cluster>>,
    seat: RwLock<Option<Seat>>,
    lease_held: AtomicBool,
    /// When the registration of the first seat was sent: the lease holds from there.
    joined: OnceLock<Instant>,
    publish: OnceLock<mpsc::UnboundedSender<String>>,
    mrtr: OnceLock<MrtrHandler>,
    /// Rung when another replica queued a relay for this one.
    wake: Notify,
    /// MRTR retries relayed from here, waiting for their replies, by correlation id.
    waiting: Mutex<HashMap<String, oneshot::Sender<Value>>>,
}

impl Replica {
    pub(super) fn new(id: String) -> Self {
        Self {
            id,
            cluster: OnceLock::new(),
            seat: RwLock::new(None),
            lease_held: AtomicBool::new(true),
            joined: OnceLock::new(),
            publish: OnceLock::new(),
            mrtr: OnceLock::new(),
            wake: Notify::new(),
            waiting: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// The shared store's cluster side; `None` with one gateway.
    pub(super) fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        self.cluster.get()
    }

    /// Take a seat on `cluster`: a new epoch and a lease held from the moment the
    /// registration was sent.
    pub(super) async fn join(&self, cluster: Arc<dyn Cluster>) -> Result<Seat, StoreError> {
        let sent = Instant::now();
        let seat = cluster.register(&self.id).await?;
        let _ = self.joined.set(sent);
        self.set_seat(seat.clone());
        let _ = self.cluster.set(cluster);
        Ok(seat)
    }

    /// When the first registration was sent (now if none was).
    pub(super) fn joined(&self) -> Instant {
        self.joined.get().copied().unwrap_or_else(Instant::now)
    }

    pub(super) fn seat(&self) -> Option<Seat> {
        self.seat.read().clone()
    }

    pub(super) fn epoch(&self) -> Option<i64> {
        self.seat().map(|s| s.epoch)
    }

    pub(super) fn lease_held(&self) -> bool {
        self.lease_held.load(Ordering::SeqCst)
    }

    /// The lease may have run out: `true` when it was held until now.
    pub(super) fn lose_lease(&self) -> bool {
        self.lease_held.swap(false, Ordering::SeqCst)
    }

    /// Registered again under a new epoch: the lease holds again.
    pub(super) fn reseat(&self, seat: Seat) {
        self.set_seat(seat);
        self.lease_held.store(true, Ordering::SeqCst);
    }

    fn set_seat(&self, seat: Seat) {
        let mut s = self.seat.write();
        *s = Some(seat);
    }

    /// Changes published from now on go to `tx` (the publish loop).
    pub(super) fn publish_to(&self, tx: mpsc::UnboundedSender<String>) {
        let _ = self.publish.set(tx);
    }

    /// Publish a change to the other replicas (batched, in the background).
    pub(super) fn publish(&self, task_id: &str) {
        if let Some(tx) = self.publish.get() {
            let _ = tx.send(task_id.to_string());
        }
    }

    pub(super) fn set_mrtr_handler(&self, h: MrtrHandler) {
        let _ = self.mrtr.set(h);
    }

    pub(super) fn mrtr_handler(&self) -> Option<MrtrHandler> {
        self.mrtr.get().cloned()
    }

    /// Another replica queued a relay for this one.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Wait for the reply to the MRTR retry relayed as `corr`.
    pub(super) fn await_reply(&self, corr: &str) -> oneshot::Receiver<Value> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(corr.to_string(), tx);
        rx
    }

    pub(super) fn stop_waiting(&self, corr: &str) {
        let gone = self.waiting.lock().remove(corr);
        drop(gone);
    }

    /// Hand a relayed reply to its waiting retry; `false` when none waits any more.
    pub(super) fn reply(&self, corr: &str, reply: Value) -> bool {
        let waiter = self.waiting.lock().remove(corr);
        match waiter {
            Some(tx) => {
                let _ = tx.send(reply);
                true
            }
            None => false,
        }
    }
}
