//! This replica's part in the cluster, as the engine holds it: its id, its seat and
//! lease, and the channels of its relays. What a replica does with them is
//! `replica.rs`.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::store::cluster::{Cluster, Seat};

/// Handles an MRTR retry relayed here; the front installs it.
pub type MrtrHandler =
    Arc<dyn Fn(Value) -> futures_util::future::BoxFuture<'static, Value> + Send + Sync>;

/// This replica's part in the cluster.
pub(super) struct ReplicaState {
    /// `server.replica_id` (or its default): stable across restarts.
    pub(super) id: String,
    pub(super) cluster: OnceLock<Arc<dyn Cluster>>,
    pub(super) seat: RwLock<Option<Seat>>,
    pub(super) lease_held: AtomicBool,
    /// When the registration of the first seat was sent: the lease holds from there.
    pub(super) joined: OnceLock<Instant>,
    pub(super) publish: OnceLock<mpsc::UnboundedSender<String>>,
    pub(super) mrtr: OnceLock<MrtrHandler>,
    /// Rung when another replica queued a relay for this one.
    pub(super) wake: tokio::sync::Notify,
    /// MRTR retries relayed from here, waiting for their replies, by correlation id.
    pub(super) waiting: Mutex<HashMap<String, oneshot::Sender<Value>>>,
}

impl ReplicaState {
    pub(super) fn new(id: String) -> Self {
        Self {
            id,
            cluster: OnceLock::new(),
            seat: RwLock::new(None),
            lease_held: AtomicBool::new(true),
            joined: OnceLock::new(),
            publish: OnceLock::new(),
            mrtr: OnceLock::new(),
            wake: tokio::sync::Notify::new(),
            waiting: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn seat(&self) -> Option<Seat> {
        self.seat.read().clone()
    }

    pub(super) fn set_seat(&self, seat: Seat) {
        {
            let mut s = self.seat.write();
            *s = Some(seat);
        }
    }
}
