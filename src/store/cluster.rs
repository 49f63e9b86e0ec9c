//! What several replicas on one shared store need of it (docs/design.md §18
//! "Replicas", §19 "Any replica answers"): leases, takeover of a dead replica's
//! in-flight calls, relays between replicas and change fan-out.
//!
//! Only a backend that several processes share implements [`Cluster`] (PostgreSQL);
//! with sled the gateway is alone and none of this exists.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{StoreError, TaskRecord, TaskStatus, Update};
use futures_util::future::BoxFuture;

/// A replica's seat: its stable id and the epoch of this start. Every request route
/// names the seat of the replica holding the call; a write from that call is fenced
/// on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    pub replica_id: String,
    pub epoch: i64,
}

/// What one replica asks of the replica that holds a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayKind {
    /// `tasks/cancel` was recorded elsewhere: stop the upstream call.
    Cancel,
    /// `tasks/update` answered an input request: hand the answer to the upstream.
    Input,
    /// An MRTR retry of a call held here: resume it and send the reply back.
    Mrtr,
    /// The reply to an MRTR retry, for the replica the client talks to.
    Reply,
}

impl RelayKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Input => "input",
            Self::Mrtr => "mrtr",
            Self::Reply => "reply",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "cancel" => Self::Cancel,
            "input" => Self::Input,
            "mrtr" => Self::Mrtr,
            "reply" => Self::Reply,
            _ => return None,
        })
    }
}

/// A relay as it is stored and delivered (the `pending_relays` table).
#[derive(Debug, Clone, PartialEq)]
pub struct Relay {
    pub kind: RelayKind,
    pub task_id: Option<String>,
    /// JSON bytes; what they hold depends on `kind`.
    pub payload: Vec<u8>,
}

/// A relay taken from the store: its row id (named in the log when it cannot be acted
/// on, so nothing is lost silently) and the relay.
#[derive(Debug, Clone, PartialEq)]
pub struct TakenRelay {
    pub id: i64,
    pub relay: Relay,
}

/// A task the takeover resolved: its status before, and the record after — failed,
/// or (`adopted`) unchanged, its route now this seat's so the taker re-attaches to the
/// upstream task the route follows (docs/design.md §25).
#[derive(Debug, Clone, PartialEq)]
pub struct TakenOver {
    pub from: TaskStatus,
    pub record: TaskRecord,
    pub adopted: Option<crate::store::RequestRoute>,
}

/// What the change listener reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// Tasks another replica changed.
    Changed(Vec<String>),
    /// The listener reconnected: notifications may have been missed, so every task
    /// with a subscriber must be read again.
    Resync,
    /// A relay was queued for this replica: take it now rather than at the next poll.
    Wake,
}

/// Coordination between the replicas sharing one store. Every method is safe to call
/// from any number of replicas at once: each piece of work is done by exactly one.
pub trait Cluster: Send + Sync + 'static {
    /// Register a new epoch for `replica_id` with a fresh lease, and remember the seat:
    /// request routes written from now on name it.
    fn register<'a>(&'a self, replica_id: &'a str) -> BoxFuture<'a, Result<Seat, StoreError>>;

    /// Extend the lease of `seat` (database clock). `false` when the lease already ran
    /// out or the seat has a newer epoch: the seat is lost for good.
    fn renew<'a>(&'a self, seat: &'a Seat) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Resolve request routes whose seat holds no live lease: apply `fail` to each
    /// route's task (unless `fail` declines) and delete the route, in one transaction
    /// per batch, skipping routes another replica is resolving. A route following an
    /// upstream task in an HTTP session, whose task is not terminal, is instead moved
    /// to the caller's seat and returned `adopted`. Also drops relays addressed to
    /// dead seats.
    fn take_over<'a>(
        &'a self,
        fail: Update<'a>,
    ) -> BoxFuture<'a, Result<Vec<TakenOver>, StoreError>>;

    /// The live seat of `replica_id` (its current epoch, while its lease holds).
    fn seat_of<'a>(
        &'a self,
        replica_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Seat>, StoreError>>;

    /// The seat holding the in-flight call of `task_id`, if any.
    fn holder<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, Result<Option<Seat>, StoreError>>;

    /// Queue `relay` for the replica at `to` (durable before it returns) and wake it
    /// (best effort: it also polls).
    fn send_relay<'a>(
        &'a self,
        to: &'a Seat,
        relay: &'a Relay,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Take (and delete) the relays queued for `seat`, oldest first.
    fn take_relays<'a>(
        &'a self,
        seat: &'a Seat,
    ) -> BoxFuture<'a, Result<Vec<TakenRelay>, StoreError>>;

    /// Tell the other replicas that these tasks changed (best effort: a lost
    /// notification only delays a subscriber until the next change or resync).
    fn publish<'a>(
        &'a self,
        from: &'a str,
        task_ids: &'a [String],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Start listening for other replicas' changes (one dedicated connection,
    /// reconnecting on its own); events go to `events` until it closes. `own` is this
    /// replica's id: its own changes are not reported back. Where notifications
    /// cannot be delivered (behind a transaction-mode pooler), a
    /// [`ClusterEvent::Resync`] every `poll` stands in for them (docs/design.md §27
    /// "Connection poolers").
    fn listen(&self, own: String, poll: Duration, events: mpsc::Sender<ClusterEvent>);
}
