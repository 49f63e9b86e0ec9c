//! The lease watchdog (docs/design.md §18 "The lease by the replica's own clock"): a
//! scripted [`Cluster`] whose renewals stall, on paused tokio time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Engine;
use crate::config::Config;
use crate::limits::Limits;
use crate::store::cluster::{Cluster, ClusterEvent, Relay, Seat, TakenOver};
use crate::store::memory::MemoryStore;
use crate::store::{StoreError, Update};
use futures_util::future::BoxFuture;

/// Renewals answer at once until `stall` is set, then never; registrations wait while
/// `stall` is set and then hand out the next epoch.
#[derive(Default)]
struct Scripted {
    stall: AtomicBool,
    epoch: AtomicI64,
    /// When each renewal answered `true` (at once: also when it was sent).
    renewed: parking_lot::Mutex<Vec<Instant>>,
}

impl Cluster for Scripted {
    fn register<'a>(&'a self, replica_id: &'a str) -> BoxFuture<'a, Result<Seat, StoreError>> {
        Box::pin(async move {
            while self.stall.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(Seat {
                replica_id: replica_id.to_string(),
                epoch: self.epoch.fetch_add(1, Ordering::SeqCst) + 1,
            })
        })
    }

    fn renew<'a>(&'a self, _seat: &'a Seat) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            if self.stall.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.renewed.lock().push(Instant::now());
            Ok(true)
        })
    }

    fn take_over<'a>(&'a self, _: Update<'a>) -> BoxFuture<'a, Result<Vec<TakenOver>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn seat_of<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Seat>, StoreError>> {
        Box::pin(async { Ok(None) })
    }

    fn holder<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Seat>, StoreError>> {
        Box::pin(async { Ok(None) })
    }

    fn send_relay<'a>(
        &'a self,
        _: &'a Seat,
        _: &'a Relay,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn take_relays<'a>(
        &'a self,
        _: &'a Seat,
    ) -> BoxFuture<'a, Result<Vec<crate::store::cluster::TakenRelay>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn publish<'a>(&'a self, _: &'a str, _: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn listen(&self, _own: String, _poll: Duration, _events: mpsc::Sender<ClusterEvent>) {}
}

const CONFIG: &str = r#"
[store]
lease_ms = 3000
lease_renew_ms = 500
[auth]
mode = "none"
[[upstream]]
name = "demo"
command = ["unused"]
"#;

#[tokio::test(start_paused = true)]
async fn a_stalled_renewal_loses_the_lease_at_last_sent_plus_lease_ms() {
    let cfg = Config::parse(CONFIG).expect("config");
    let limits = Limits::from_config(&cfg);
    let holds = super::Holds::new([7; 32], cfg.tasks.input_timeout, None);
    let engine = Engine::new(MemoryStore::new(), Arc::new(cfg), limits, holds);
    let cluster = Arc::new(Scripted::default());
    let seat = engine.join_cluster(cluster.clone()).await.expect("join");
    assert_eq!(seat.epoch, 1);
    let shutdown = CancellationToken::new();
    engine.spawn_cluster(shutdown.clone());

    // Renewals go through for a while.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    assert!(engine.lease_held());
    cluster.stall.store(true, Ordering::SeqCst);
    let last = *cluster
        .renewed
        .lock()
        .last()
        .expect("renewals went through");
    // The last renewal answered was sent at `last` (answers are instant here): the
    // lease holds until `last + lease_ms`, not one renewal interval less or more,
    // although the renewal sent after it never answers.
    let lost_at = last + Duration::from_millis(3_000);
    tokio::time::sleep_until(lost_at - Duration::from_millis(5)).await;
    assert!(engine.lease_held(), "lost before lease_ms had passed");
    tokio::time::sleep_until(lost_at + Duration::from_millis(5)).await;
    assert!(
        !engine.lease_held(),
        "still held past lease_ms with a stalled renewal"
    );

    // The database answers again: a new epoch, never the old one.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(!engine.lease_held());
    cluster.stall.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(engine.lease_held());
    assert_eq!(engine.epoch(), Some(2));
    shutdown.cancel();
}
