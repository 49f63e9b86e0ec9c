//! Being one of several replicas on a shared store (docs/design.md §18 "Replicas",
//! §19 "Any replica answers"; README "Several replicas").
//!
//! - **Lease.** [`Engine::join_cluster`] registers a new epoch; a loop renews the
//!   lease every `lease_renew_ms`. A replica that cannot renew within its lease stops
//!   taking calls (`lease_held() == false`: `/readyz` and `/livez` 503), stops its
//!   in-flight calls without settling them (their writes would be fenced anyway) and
//!   registers again with a new epoch once the database answers.
//! - **Takeover.** Each sweep resolves the routes of seats without a live lease: their
//!   tasks fail with "replica lost while the call was in flight". The store hands
//!   each route to exactly one replica, so no leader is needed.
//! - **Relays.** A cancel or input answer for a call held elsewhere, and an MRTR retry
//!   of a call held elsewhere, is queued in the store for the holder, which is woken
//!   by a notification and also polls for its relays every [`RELAY_POLL`].
//! - **Fan-out.** Every changed task id is published (batched) to the other replicas;
//!   what they publish comes back through the listener into the local change stream,
//!   with [`Change::Resync`](super::Change::Resync) after a reconnect.
//!
//! With sled none of this runs: one gateway, the lease is always held.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::engine::Engine;
use super::follow::follow_adopted;
use super::live::LiveCalls;
pub use super::replica_state::MrtrHandler;
use super::replica_state::Replica;
use super::repo::{TaskRepo, Transition};
use super::terminal::{conclude, fail};
use crate::config::as_millis;
use crate::protocol::RpcError;
use crate::store::StoreError;
use crate::store::cluster::{Cluster, ClusterEvent, Relay, RelayKind, Seat, TakenRelay};

/// How often a replica takes the relays queued for it even when no wake-up came: the
/// bound on a cross-replica cancel or input answer when a notification is lost.
pub const RELAY_POLL: Duration = Duration::from_millis(200);

/// Why a takeover failed a task.
const LOST: &str = "replica lost while the call was in flight";

fn correlation_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 12];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// The payloads of relays as they travel through the store, one struct per
// `RelayKind` (a cancel carries `null`): the kind column picks the struct, so no
// tagged enum guesses it. Field order is the stored key order.

/// An input answer for the holder of its call.
#[derive(Serialize, Deserialize)]
struct InputRelay {
    key: String,
    answer: Value,
}

/// An MRTR retry for the holder of its call, and where its reply goes.
#[derive(Serialize, Deserialize)]
struct MrtrRelay {
    corr: String,
    reply_to: SeatWire,
    request: Value,
}

/// The reply to an [`MrtrRelay`].
#[derive(Serialize, Deserialize)]
struct ReplyRelay {
    corr: String,
    reply: Value,
}

#[derive(Serialize, Deserialize)]
struct SeatWire {
    replica_id: String,
    epoch: i64,
}

fn payload(p: &impl Serialize) -> Vec<u8> {
    // Structs of strings and `Value`s always serialize.
    serde_json::to_vec(p).unwrap_or_default()
}

/// A task record changed: tell this replica's subscribers and the other replicas.
pub(super) fn changed(tasks: &TaskRepo, replica: &Replica, task_id: &str) {
    tasks.changed_here(task_id);
    replica.publish(task_id);
}

/// Start the lease, relay, publish and listen loops (nothing with one gateway).
pub(super) fn spawn_cluster(engine: &Arc<Engine>, shutdown: CancellationToken) {
    let Some(cluster) = engine.replica.cluster().cloned() else {
        return;
    };
    tokio::spawn(lease_loop(
        engine.clone(),
        cluster.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(relay_loop(
        engine.clone(),
        cluster.clone(),
        shutdown.clone(),
    ));
    let (tx, rx) = mpsc::unbounded_channel();
    engine.replica.publish_to(tx);
    tokio::spawn(publish_loop(
        cluster.clone(),
        engine.replica.id().to_string(),
        rx,
        shutdown.clone(),
    ));
    let (ev_tx, mut events) = mpsc::channel(256);
    cluster.listen(
        engine.replica.id().to_string(),
        engine.cfg.tasks.poll_interval,
        ev_tx,
    );
    let engine = engine.clone();
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                () = shutdown.cancelled() => return,
                ev = events.recv() => ev,
            };
            match ev {
                None => return,
                Some(ClusterEvent::Changed(ids)) => {
                    for id in ids {
                        engine.tasks.changed_here(&id);
                    }
                }
                Some(ClusterEvent::Resync) => engine.tasks.resync_here(),
                Some(ClusterEvent::Wake) => engine.replica.wake(),
            }
        }
    });
}

/// Renew the lease every `lease_renew_ms`, and count it lost by this replica's own
/// monotonic clock (docs/design.md §18 "Replicas"): the database set `lease_until` no
/// earlier than the moment a renewal was sent, so the lease surely holds until
/// `sent + lease_ms` of the last renewal that succeeded, and not surely one instant
/// longer. At that instant the lease is lost, whether or not a renewal is still
/// waiting on a stalled connection: a partitioned replica stops before any other
/// replica may take its calls over, not when some database operation times out. A
/// lease counted lost is never resumed: the replica comes back under a new epoch, so
/// the calls it stopped go to the takeover.
async fn lease_loop(engine: Arc<Engine>, cluster: Arc<dyn Cluster>, shutdown: CancellationToken) {
    let (replica, calls) = (&engine.replica, &engine.calls);
    let every = engine.cfg.store.lease_renew.max(Duration::from_millis(1));
    let lease = engine.cfg.store.lease;
    let joined = replica.joined();
    // `Some(until)` while the lease is held: the watchdog's deadline.
    let mut held_until = Some(joined + lease);
    let mut last_sent = joined;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(last_sent + every) => {}
            () = watchdog(held_until) => {
                lose_lease(replica, calls, "not renewed within lease_ms by this replica's clock");
                held_until = None;
            }
        }
        let Some(seat) = replica.seat() else {
            continue;
        };
        if let Some(until) = held_until {
            let sent = Instant::now();
            last_sent = sent;
            // Bounded by the deadline: past it, no answer can keep the lease.
            let renewed = tokio::select! {
                r = cluster.renew(&seat) => Some(r),
                () = tokio::time::sleep_until(until) => None,
            };
            match renewed {
                Some(Ok(true)) => held_until = Some(sent + lease),
                Some(Ok(false)) => {
                    lose_lease(replica, calls, "the lease ran out before it was renewed");
                    held_until = None;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "renewing the lease failed; retrying");
                    continue;
                }
                None => {
                    lose_lease(
                        replica,
                        calls,
                        "no renewal answered within lease_ms by this replica's clock",
                    );
                    held_until = None;
                }
            }
        }
        if held_until.is_none() {
            // A new epoch, so every call of the old one is the takeover's. The store's
            // operation limit bounds the attempt; the next one follows
            // `lease_renew_ms` later.
            let sent = Instant::now();
            last_sent = sent;
            let registered = tokio::select! {
                () = shutdown.cancelled() => return,
                r = cluster.register(replica.id()) => r,
            };
            match registered {
                Ok(new) => {
                    tracing::warn!(replica = %new.replica_id, epoch = new.epoch, "registered again with a new epoch");
                    replica.reseat(new);
                    held_until = Some(sent + lease);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registering a new epoch failed; retrying")
                }
            }
        }
    }
}

/// Stop taking calls and stop the calls in flight here: once the lease may have run
/// out another replica may fail their tasks, and their writes are fenced.
fn lose_lease(replica: &Replica, calls: &LiveCalls, why: &str) {
    if replica.lose_lease() {
        crate::metrics::lease_lost();
        tracing::error!(reason = why, "replica lease lost: not taking calls");
    }
    calls.abort_all();
}

/// Fail the tasks of calls whose replica lost its lease, or re-attach here to the
/// upstream tasks they followed in HTTP sessions (docs/design.md §25). Exactly one
/// replica resolves each call.
pub(super) async fn take_over(engine: &Arc<Engine>) -> Result<usize, StoreError> {
    let Some(cluster) = engine.replica.cluster() else {
        return Ok(0);
    };
    let retention = as_millis(engine.cfg.tasks.result_retention);
    let err = RpcError::internal(LOST);
    let taken = cluster
        .take_over(&mut |rec| {
            if rec.status.is_terminal() {
                return false;
            }
            let e = err.clone().with_data(json!({ "upstream": rec.upstream }));
            fail(rec, &e);
            conclude(rec, retention);
            true
        })
        .await?;
    for t in &taken {
        if let Some(route) = &t.adopted {
            follow_adopted(engine, route).await;
            continue;
        }
        engine.tasks.notify(Transition {
            task_id: &t.record.task_id,
            from: Some(t.from),
            to: Some(t.record.status),
            created_at_ms: t.record.created_at_ms,
        });
        changed(&engine.tasks, &engine.replica, &t.record.task_id);
        tracing::warn!(task = %t.record.task_id, upstream = %t.record.upstream, "{LOST}: task failed");
    }
    Ok(taken.len())
}

/// Stop the upstream call of `task_id`: here if it runs here, else by a relay to the
/// replica holding it.
pub(super) async fn stop_call(calls: &LiveCalls, replica: &Replica, task_id: &str) {
    if calls.abort(task_id) {
        return;
    }
    relay_to_holder(replica, task_id, RelayKind::Cancel, b"null".to_vec()).await;
}

/// Hand an input answer to the upstream call of `task_id`, wherever it runs.
pub(super) async fn deliver_input(
    calls: &LiveCalls,
    replica: &Replica,
    task_id: &str,
    key: &str,
    answer: Value,
) {
    let Err(answer) = calls.offer_answer(task_id, key, answer) else {
        return;
    };
    let input = InputRelay {
        key: key.to_string(),
        answer,
    };
    relay_to_holder(replica, task_id, RelayKind::Input, payload(&input)).await;
}

async fn relay_to_holder(replica: &Replica, task_id: &str, kind: RelayKind, payload: Vec<u8>) {
    let Some(cluster) = replica.cluster() else {
        return;
    };
    let holder = match cluster.holder(task_id).await {
        Ok(Some(h)) => h,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(task = task_id, error = %e, "finding the replica holding a call failed");
            return;
        }
    };
    if replica.seat().as_ref() == Some(&holder) {
        return;
    }
    let relay = Relay {
        kind,
        task_id: Some(task_id.to_string()),
        payload,
    };
    if let Err(e) = cluster.send_relay(&holder, &relay).await {
        tracing::warn!(task = task_id, error = %e, kind = kind.as_str(), "relaying to the replica holding a call failed");
    }
}

/// Relay an MRTR retry to the live seat of `replica_id` and wait for its reply (the
/// opaque `request` and reply are the front's). `None` when the replica is gone or
/// did not answer within `wait`.
pub(super) async fn relay_mrtr(
    replica: &Replica,
    replica_id: &str,
    request: Value,
    wait: Duration,
) -> Option<Value> {
    let cluster = replica.cluster()?;
    let me = replica.seat()?;
    let to = match cluster.seat_of(replica_id).await {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(replica = replica_id, error = %e, "finding an MRTR holder failed");
            return None;
        }
    };
    let corr = correlation_id();
    let rx = replica.await_reply(&corr);
    let relay = Relay {
        kind: RelayKind::Mrtr,
        task_id: None,
        payload: payload(&MrtrRelay {
            corr: corr.clone(),
            reply_to: SeatWire {
                replica_id: me.replica_id.clone(),
                epoch: me.epoch,
            },
            request,
        }),
    };
    let sent = cluster.send_relay(&to, &relay).await;
    let reply = match sent {
        Ok(()) => tokio::time::timeout(wait, rx)
            .await
            .ok()
            .and_then(Result::ok),
        Err(e) => {
            tracing::warn!(replica = replica_id, error = %e, "relaying an MRTR retry failed");
            None
        }
    };
    replica.stop_waiting(&corr);
    reply
}

async fn relay_loop(engine: Arc<Engine>, cluster: Arc<dyn Cluster>, shutdown: CancellationToken) {
    let (replica, calls) = (&engine.replica, &engine.calls);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RELAY_POLL) => {}
            () = replica.woken() => {}
        }
        let Some(seat) = replica.seat() else {
            continue;
        };
        let relays = match cluster.take_relays(&seat).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "taking relays failed");
                continue;
            }
        };
        for r in relays {
            on_relay(replica, calls, &cluster, r);
        }
    }
}

fn on_relay(replica: &Replica, calls: &LiveCalls, cluster: &Arc<dyn Cluster>, taken: TakenRelay) {
    let relayed = match read_relay(&taken.relay) {
        Ok(r) => r,
        Err(why) => return dead_letter(&taken, &why),
    };
    match relayed {
        Relayed::Cancel { task_id } => {
            calls.abort(&task_id);
        }
        Relayed::Input {
            task_id,
            key,
            answer,
        } => {
            // Not here any more: the call ended, and the task says how.
            if calls.offer_answer(&task_id, &key, answer).is_err() {
                tracing::debug!(task = %task_id, key, "relayed input answer has no running call here");
            }
        }
        Relayed::Reply { corr, reply } => {
            // The retry it answers may have timed out already, and was told so.
            if !replica.reply(&corr, reply) {
                tracing::info!(
                    relay = taken.id,
                    "an MRTR reply arrived after its retry stopped waiting"
                );
            }
        }
        Relayed::Mrtr { to, corr, request } => {
            let Some(h) = replica.mrtr_handler() else {
                return dead_letter(&taken, "no MRTR handler is installed on this replica");
            };
            let cluster = cluster.clone();
            // The resumed call may run for a while: never hold up other relays.
            tokio::spawn(async move {
                let reply = h(request).await;
                let relay = Relay {
                    kind: RelayKind::Reply,
                    task_id: None,
                    payload: payload(&ReplyRelay { corr, reply }),
                };
                if let Err(e) = cluster.send_relay(&to, &relay).await {
                    tracing::warn!(error = %e, "sending an MRTR reply back failed");
                }
            });
        }
    }
}

/// What a relay asks for, read from its stored form.
#[derive(Debug, PartialEq)]
enum Relayed {
    Cancel {
        task_id: String,
    },
    Input {
        task_id: String,
        key: String,
        answer: Value,
    },
    Reply {
        corr: String,
        reply: Value,
    },
    Mrtr {
        to: Seat,
        corr: String,
        request: Value,
    },
}

/// Read a relay; `Err` says what is wrong with it. Such a relay was already taken from
/// the store, so the caller logs it whole ([`dead_letter`]) instead of dropping it.
fn read_relay(r: &Relay) -> Result<Relayed, String> {
    let task_id = || {
        r.task_id
            .clone()
            .ok_or_else(|| "it names no task".to_string())
    };
    let unreadable = |e: serde_json::Error| format!("its payload is unreadable: {e}");
    Ok(match r.kind {
        RelayKind::Cancel => Relayed::Cancel {
            task_id: task_id()?,
        },
        RelayKind::Input => {
            let p: InputRelay = serde_json::from_slice(&r.payload).map_err(unreadable)?;
            Relayed::Input {
                task_id: task_id()?,
                key: p.key,
                answer: p.answer,
            }
        }
        RelayKind::Reply => {
            let p: ReplyRelay = serde_json::from_slice(&r.payload).map_err(unreadable)?;
            Relayed::Reply {
                corr: p.corr,
                reply: p.reply,
            }
        }
        RelayKind::Mrtr => {
            let p: MrtrRelay = serde_json::from_slice(&r.payload).map_err(unreadable)?;
            Relayed::Mrtr {
                to: Seat {
                    replica_id: p.reply_to.replica_id,
                    epoch: p.reply_to.epoch,
                },
                corr: p.corr,
                request: p.request,
            }
        }
    })
}

/// A relay that was taken from the store but cannot be acted on: counted, and logged
/// whole with its id so an operator can replay it (docs/design.md §16 "Fail closed").
fn dead_letter(t: &TakenRelay, why: &str) {
    crate::metrics::fail_closed("relay_undecodable");
    tracing::error!(
        relay = t.id,
        kind = t.relay.kind.as_str(),
        task = ?t.relay.task_id,
        reason = why,
        payload = %String::from_utf8_lossy(&t.relay.payload),
        "a relay could not be acted on"
    );
}

/// Fires at `until`; never while the lease is already lost (`None`).
async fn watchdog(until: Option<Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Publish changed ids in batches: whatever queued up while the last batch went out
/// goes in the next, each id once.
async fn publish_loop(
    cluster: Arc<dyn Cluster>,
    from: String,
    mut rx: mpsc::UnboundedReceiver<String>,
    shutdown: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return,
            id = rx.recv() => match id { Some(id) => id, None => return },
        };
        let mut seen = std::collections::HashSet::from([first.clone()]);
        let mut batch = vec![first];
        while let Ok(id) = rx.try_recv() {
            if seen.insert(id.clone()) {
                batch.push(id);
            }
            if batch.len() >= 4096 {
                break;
            }
        }
        if let Err(e) = cluster.publish(&from, &batch).await {
            tracing::debug!(error = %e, ids = batch.len(), "publishing task changes failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay(kind: RelayKind, task_id: Option<&str>, payload: &[u8]) -> Relay {
        Relay {
            kind,
            task_id: task_id.map(str::to_string),
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn well_formed_relays_are_read_whole() {
        let input = relay(
            RelayKind::Input,
            Some("tsk_a"),
            br#"{"key":"k1","answer":{"action":"accept"}}"#,
        );
        assert_eq!(
            read_relay(&input),
            Ok(Relayed::Input {
                task_id: "tsk_a".into(),
                key: "k1".into(),
                answer: json!({"action": "accept"}),
            })
        );
        let mrtr = relay(
            RelayKind::Mrtr,
            None,
            br#"{"corr":"c1","reply_to":{"replica_id":"r1","epoch":3},"request":{"x":1}}"#,
        );
        assert_eq!(
            read_relay(&mrtr),
            Ok(Relayed::Mrtr {
                to: Seat {
                    replica_id: "r1".into(),
                    epoch: 3,
                },
                corr: "c1".into(),
                request: json!({"x": 1}),
            })
        );
        assert_eq!(
            read_relay(&relay(RelayKind::Cancel, Some("tsk_a"), b"null")),
            Ok(Relayed::Cancel {
                task_id: "tsk_a".into()
            })
        );
    }

    #[test]
    fn relay_payloads_keep_the_stored_shape() {
        // Replicas of the version before typed relays read and wrote these bytes.
        let v = |s: &str| serde_json::from_str::<Value>(s).unwrap_or_default();
        let answer = v(r#"{"action":"accept","content":{"n":1.50,"m":1e999}}"#);
        let old = |x: Value| serde_json::to_vec(&x).unwrap_or_default();
        let input = InputRelay {
            key: "k".into(),
            answer: answer.clone(),
        };
        assert_eq!(payload(&input), old(json!({"key": "k", "answer": answer})));
        let mrtr = MrtrRelay {
            corr: "c".into(),
            reply_to: SeatWire {
                replica_id: "r".into(),
                epoch: 3,
            },
            request: answer.clone(),
        };
        assert_eq!(
            payload(&mrtr),
            old(
                json!({"corr": "c", "reply_to": {"replica_id": "r", "epoch": 3}, "request": answer})
            )
        );
        let reply = ReplyRelay {
            corr: "c".into(),
            reply: answer.clone(),
        };
        assert_eq!(payload(&reply), old(json!({"corr": "c", "reply": answer})));
    }

    #[test]
    fn unreadable_relays_are_refused_not_guessed() {
        // Each of these used to be dropped without a trace (an unparsable payload read
        // as `null`); now each is an `Err` that the relay loop logs with the relay's id.
        let bad = [
            relay(RelayKind::Input, Some("tsk_a"), b"not json"),
            relay(RelayKind::Input, Some("tsk_a"), br#"{"answer":{}}"#),
            relay(RelayKind::Input, Some("tsk_a"), br#"{"key":7,"answer":{}}"#),
            relay(RelayKind::Input, Some("tsk_a"), br#"{"key":"k"}"#),
            relay(RelayKind::Input, None, br#"{"key":"k","answer":{}}"#),
            relay(RelayKind::Cancel, None, b"null"),
            relay(RelayKind::Reply, None, br#"{"reply":{}}"#),
            relay(RelayKind::Reply, None, br#"{"corr":"c"}"#),
            relay(RelayKind::Mrtr, None, br#"{"corr":"c","request":{}}"#),
            relay(
                RelayKind::Mrtr,
                None,
                br#"{"corr":"c","reply_to":{"replica_id":"r"},"request":{}}"#,
            ),
            relay(RelayKind::Mrtr, None, br#"[1,2]"#),
        ];
        for r in &bad {
            assert!(read_relay(r).is_err(), "{r:?} was read");
        }
    }
}
