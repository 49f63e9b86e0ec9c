//! [`Cluster`] on PostgreSQL: the `replicas` and `pending_relays` tables, the takeover
//! of dead seats' routes, and change fan-out with `LISTEN`/`NOTIFY`
//! (ARCHITECTURE.md "PostgreSQL schema", docs/design.md §18–19).
//!
//! Lease times are the database's `now()`, never a replica's clock, so replicas with
//! skewed clocks agree on who is alive. Notifications are never sent inside a
//! committing hot-path transaction: `NOTIFY` takes a cluster-wide lock held through
//! the commit flush, so it rides on a connection of its own with
//! `synchronous_commit = off`.

use std::time::Duration;

use futures_util::FutureExt;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::sql::Pooling;
use super::statements::{
    DropDeadRelays, Holder, LockTask, Notify, OrphanedRoutes, Register, RemoveRoutes, Renew,
    ReseatRoute, SeatOf, SendRelay, TakeOverTask, TakeRelays,
};
use super::{PgError, PgStore, SCHEMA_VERSION, db_message, decode, encode, ms};
use crate::store::cluster::{Cluster, ClusterEvent, Relay, RelayKind, Seat, TakenOver, TakenRelay};
use crate::store::{RequestRoute, StoreError, TaskRecord, Update, now_ms};
use futures_util::future::BoxFuture;

/// Routes resolved per takeover transaction.
const TAKEOVER_BATCH: i64 = 64;
/// Relays delivered per poll.
const RELAY_BATCH: i64 = 256;
/// `NOTIFY` payloads must stay under 8000 bytes.
const MAX_PAYLOAD: usize = 7_900;
/// Wait before the listener reconnects after losing its connection.
const LISTEN_RETRY: Duration = Duration::from_millis(500);
/// How long a new `LISTEN` connection has to deliver the probe this replica publishes
/// to itself before change fan-out falls back to polling (docs/design.md §27
/// "Connection poolers").
pub(super) const PROBE_WAIT: Duration = Duration::from_secs(2);

/// The notification channel of a schema: replicas on other schemas of the same
/// database never hear each other. A hash keeps it within the 63-byte identifier limit.
fn channel(schema: &str) -> String {
    // FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in schema.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("taskgate_{h:016x}")
}

/// `from` and the ids, split into payloads under the `NOTIFY` limit.
fn payloads(from: &str, ids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::from(from);
    for id in ids {
        if cur.len() > from.len() && cur.len() + 1 + id.len() > MAX_PAYLOAD {
            out.push(std::mem::replace(&mut cur, String::from(from)));
        }
        cur.push('\n');
        cur.push_str(id);
    }
    if cur.len() > from.len() {
        out.push(cur);
    }
    out
}

/// A payload id that is no task id: "a relay is waiting for this replica".
const WAKE: &str = "!wake:";
/// A payload id that is no task id: a replica's probe of its own `LISTEN`.
const PROBE: &str = "!probe:";

/// The sender and ids of a payload, `None` if it is not one of ours.
fn parse_payload(p: &str) -> Option<(&str, Vec<String>)> {
    let mut lines = p.split('\n');
    let from = lines.next()?;
    Some((from, lines.map(str::to_string).collect()))
}

fn lease_secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

impl PgStore {
    async fn register_now(&self, replica_id: &str) -> Result<Seat, PgError> {
        let c = self.pool.get().await?;
        let register = Register {
            replica_id,
            lease_secs: lease_secs(self.lease_ms),
        };
        let row = self.sql.register.query_one(&c, &register).await?;
        let seat = Seat {
            replica_id: replica_id.to_string(),
            epoch: row.try_get(0)?,
        };
        {
            let mut s = self.seat.write();
            *s = Some(seat.clone());
        }
        Ok(seat)
    }

    async fn renew_now(&self, seat: &Seat) -> Result<bool, PgError> {
        let c = self.pool.get().await?;
        let renew = Renew {
            replica_id: &seat.replica_id,
            epoch: seat.epoch,
            lease_secs: lease_secs(self.lease_ms),
        };
        Ok(self.sql.renew.execute(&c, &renew).await? == 1)
    }

    async fn take_over_now(
        &self,
        fail: &mut (dyn FnMut(&mut TaskRecord) -> bool + Send),
    ) -> Result<Vec<TakenOver>, PgError> {
        let mut c = self.pool.get().await?;
        let mut out = Vec::new();
        loop {
            let tx = c.transaction().await?;
            self.pooling.enter(&tx).await?;
            let batch = OrphanedRoutes {
                limit: TAKEOVER_BATCH,
            };
            let rows = self.sql.orphaned_routes.query(&tx, &batch).await?;
            let mut route_ids = Vec::with_capacity(rows.len());
            for row in &rows {
                let route_id: String = row.try_get(0)?;
                let task_id: Option<String> = row.try_get(1)?;
                let route_bytes: Vec<u8> = row.try_get(2)?;
                let route: Option<RequestRoute> =
                    decode(&format!("request_routes/{route_id}"), &route_bytes).ok();
                if let Some(task_id) = task_id
                    && let Some(t) = self
                        .sql
                        .lock_task
                        .query_opt(&tx, &LockTask { task_id: &task_id })
                        .await?
                {
                    let bytes: Vec<u8> = t.try_get(0)?;
                    let mut rec: TaskRecord = decode(&format!("task_routes/{task_id}"), &bytes)?;
                    let from = rec.status;
                    let follows_session = route.as_ref().is_some_and(|r| {
                        r.upstream_task
                            .as_ref()
                            .is_some_and(|u| u.session.is_some())
                    });
                    if follows_session && !rec.status.is_terminal() {
                        let (replica, epoch) = self.seat_columns();
                        let reseat = ReseatRoute {
                            route_id: &route_id,
                            replica_id: replica.as_deref(),
                            epoch,
                        };
                        self.sql.reseat_route.execute(&tx, &reseat).await?;
                        out.push(TakenOver {
                            from,
                            record: rec,
                            adopted: route,
                        });
                        continue;
                    }
                    if fail(&mut rec) {
                        rec.task_id = task_id.clone();
                        rec.v = SCHEMA_VERSION;
                        let record = encode("task record", &rec)?;
                        let failed = TakeOverTask {
                            task_id: &task_id,
                            status: rec.status.as_str(),
                            expires_at_ms: ms(rec.expires_at_ms),
                            record: &record,
                        };
                        self.sql.take_over_task.execute(&tx, &failed).await?;
                        out.push(TakenOver {
                            from,
                            record: rec,
                            adopted: None,
                        });
                    }
                }
                route_ids.push(route_id);
            }
            if !route_ids.is_empty() {
                let taken = RemoveRoutes {
                    route_ids: &route_ids,
                };
                self.sql.remove_routes.execute(&tx, &taken).await?;
            }
            tx.commit().await?;
            if (rows.len() as i64) < TAKEOVER_BATCH {
                break;
            }
        }
        self.sql
            .drop_dead_relays
            .execute(&c, &DropDeadRelays {})
            .await?;
        Ok(out)
    }

    async fn holder_now(&self, task_id: &str) -> Result<Option<Seat>, PgError> {
        let c = self.pool.get().await?;
        match self.sql.holder.query_opt(&c, &Holder { task_id }).await? {
            None => Ok(None),
            Some(row) => Ok(Some(Seat {
                replica_id: row.try_get(0)?,
                epoch: row.try_get(1)?,
            })),
        }
    }

    async fn seat_of_now(&self, replica_id: &str) -> Result<Option<Seat>, PgError> {
        let c = self.pool.get().await?;
        match self
            .sql
            .seat_of
            .query_opt(&c, &SeatOf { replica_id })
            .await?
        {
            None => Ok(None),
            Some(row) => Ok(Some(Seat {
                replica_id: replica_id.to_string(),
                epoch: row.try_get(0)?,
            })),
        }
    }

    async fn send_relay_now(&self, to: &Seat, relay: &Relay) -> Result<(), PgError> {
        let c = self.pool.get().await?;
        let send = SendRelay {
            task_id: relay.task_id.as_deref(),
            kind: relay.kind.as_str(),
            target_replica: &to.replica_id,
            target_epoch: to.epoch,
            created_at_ms: ms(now_ms()),
            payload: &relay.payload,
        };
        self.sql.send_relay.execute(&c, &send).await?;
        drop(c);
        // The relay is committed; a lost wake-up only costs the holder's poll interval.
        if let Err(e) = self
            .publish_now("", &[format!("{WAKE}{}", to.replica_id)])
            .await
        {
            tracing::debug!(error = %e.as_display(), "waking the relay target failed");
        }
        Ok(())
    }

    async fn take_relays_now(&self, seat: &Seat) -> Result<Vec<TakenRelay>, PgError> {
        let c = self.pool.get().await?;
        let take = TakeRelays {
            target_replica: &seat.replica_id,
            target_epoch: seat.epoch,
            limit: RELAY_BATCH,
        };
        let rows = self.sql.take_relays.query(&c, &take).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get(0)?;
            let kind: String = row.try_get(1)?;
            let task_id: Option<String> = row.try_get(2)?;
            let payload: Vec<u8> = row.try_get(3)?;
            let Some(kind) = RelayKind::parse(&kind) else {
                // From a newer release, perhaps: it was deleted with the others, so
                // its whole content goes to the log (docs/design.md §16 "Fail closed").
                crate::metrics::fail_closed("relay_undecodable");
                tracing::error!(relay = id, kind = %kind, task = ?task_id, payload = %String::from_utf8_lossy(&payload), "a relay of an unknown kind was not acted on");
                continue;
            };
            out.push(TakenRelay {
                id,
                relay: Relay {
                    kind,
                    task_id,
                    payload,
                },
            });
        }
        out.sort_by_key(|t| t.id);
        Ok(out)
    }

    /// A connection of its own (not pooled), for `LISTEN` and for publishing.
    async fn dedicated(&self) -> Result<tokio_postgres::Client, PgError> {
        let (client, conn) = self.pg_config.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    async fn publish_now(&self, from: &str, ids: &[String]) -> Result<(), PgError> {
        let mut guard = self.publisher.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            let c = self.dedicated().await?;
            // Losing a notification in a crash costs a subscriber one update; not
            // worth a flush per batch. Never behind a transaction pooler: a session
            // setting stays with the server connection, which the pooler then lends
            // to the gateway's writes.
            if let Pooling::Direct = self.pooling {
                c.batch_execute("SET synchronous_commit = off").await?;
            }
            *guard = Some(c);
        }
        let Some(c) = guard.as_ref() else {
            return Ok(());
        };
        let chan = channel(&self.schema);
        for p in payloads(from, ids) {
            let notify = Notify {
                channel: &chan,
                payload: &p,
            };
            if let Err(e) = self.sql.notify.execute(c, &notify).await {
                *guard = None;
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// Keep one `LISTEN` connection open while `events` is: forward other replicas'
/// change notifications, and ask for a resync after every reconnect. Each new
/// connection first proves that it delivers: this replica publishes a probe and waits
/// [`PROBE_WAIT`] for it to come back. If it does not (a transaction-mode pooler lends
/// the listening server connection to whoever comes next), the fan-out polls instead
/// ([`poll_loop`]) for as long as this store lives.
async fn listen_loop(
    store: std::sync::Weak<PgStore>,
    own: String,
    poll: Duration,
    events: mpsc::Sender<ClusterEvent>,
) {
    let mut first = true;
    loop {
        if events.is_closed() {
            return;
        }
        let Some(s) = store.upgrade() else { return };
        let chan = channel(&s.schema);
        let connected = s.pg_config.connect(s.tls.clone()).await;
        drop(s);
        let (client, mut conn) = match connected {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %db_message(&e), "postgres LISTEN connection failed; retrying");
                tokio::time::sleep(LISTEN_RETRY).await;
                continue;
            }
        };
        let (msg_tx, mut msgs) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut stream = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(m) = stream.next().await {
                match m {
                    Ok(AsyncMessage::Notification(n)) => {
                        if msg_tx.send(n.payload().to_string()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        if let Err(e) = client.batch_execute(&format!("LISTEN \"{chan}\"")).await {
            tracing::warn!(error = %e, "postgres LISTEN failed; retrying");
            driver.abort();
            tokio::time::sleep(LISTEN_RETRY).await;
            continue;
        }
        if !first && events.send(ClusterEvent::Resync).await.is_err() {
            return;
        }
        first = false;
        let probe = format!("{PROBE}{own}:{}", rand::random::<u64>());
        let Some(s) = store.upgrade() else { return };
        if let Err(e) = s.publish_now(&own, std::slice::from_ref(&probe)).await {
            // Not a verdict on LISTEN: the probe is published again on reconnect.
            tracing::warn!(error = %e.as_display(), "publishing the LISTEN probe failed; reconnecting");
            driver.abort();
            tokio::time::sleep(LISTEN_RETRY).await;
            continue;
        }
        drop(s);
        let mut probe_until = Some(tokio::time::Instant::now() + PROBE_WAIT);
        loop {
            let next = match probe_until {
                Some(t) => match tokio::time::timeout_at(t, msgs.recv()).await {
                    Ok(p) => p,
                    Err(_) => break,
                },
                None => msgs.recv().await,
            };
            let Some(p) = next else { break };
            let Some((from, ids)) = parse_payload(&p) else {
                continue;
            };
            if probe_until.is_some() && ids.contains(&probe) {
                probe_until = None;
                crate::metrics::store_fanout_polling(false);
                continue;
            }
            let (wakes, ids): (Vec<String>, Vec<String>) = ids
                .into_iter()
                .filter(|i| !i.starts_with(PROBE))
                .partition(|i| i.starts_with(WAKE));
            let woken = wakes.iter().any(|w| w[WAKE.len()..] == own);
            if woken && events.send(ClusterEvent::Wake).await.is_err() {
                driver.abort();
                return;
            }
            if from == own || ids.is_empty() {
                continue;
            }
            if events.send(ClusterEvent::Changed(ids)).await.is_err() {
                driver.abort();
                return;
            }
        }
        if probe_until.is_some_and(|t| tokio::time::Instant::now() >= t) {
            tracing::warn!(
                wait_ms = PROBE_WAIT.as_millis() as u64,
                poll_ms = poll.as_millis() as u64,
                "postgres LISTEN did not deliver this replica's probe notification (a connection pooler in transaction mode, such as PgBouncer, between taskgate and PostgreSQL?): change fan-out falls back to polling; subscribers here see other replicas' task changes within poll_ms instead of at once (README \"Behind a connection pooler\")"
            );
            // Best effort: behind a pooler this may reach another server connection.
            let _ = client.batch_execute("UNLISTEN *").await;
            driver.abort();
            drop(client);
            return poll_loop(store, poll, events).await;
        }
        // The connection ended: notifications may be lost until the next LISTEN.
        tracing::warn!("postgres LISTEN connection lost; reconnecting");
        driver.abort();
        drop(client);
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}

/// Change fan-out without `LISTEN`: every `poll`, ask this replica's subscribers to
/// read their tasks again ([`ClusterEvent::Resync`]). Relays need nothing more: the
/// relay loop takes them on its own timer as well as on a wake-up.
async fn poll_loop(
    store: std::sync::Weak<PgStore>,
    poll: Duration,
    events: mpsc::Sender<ClusterEvent>,
) {
    crate::metrics::store_fanout_polling(true);
    let mut tick = tokio::time::interval(poll.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if store.strong_count() == 0 || events.send(ClusterEvent::Resync).await.is_err() {
            return;
        }
    }
}

impl Cluster for PgStore {
    fn register<'a>(&'a self, replica_id: &'a str) -> BoxFuture<'a, Result<Seat, StoreError>> {
        // The lease's own operations always try the database: they are what tells a
        // replica whether it may serve (see `PgStore::run`).
        self.attempt("register", self.register_now(replica_id))
            .boxed()
    }

    fn renew<'a>(&'a self, seat: &'a Seat) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.attempt("renew", self.renew_now(seat)).boxed()
    }

    fn take_over<'a>(
        &'a self,
        fail: Update<'a>,
    ) -> BoxFuture<'a, Result<Vec<TakenOver>, StoreError>> {
        self.run("take_over", self.take_over_now(fail)).boxed()
    }

    fn seat_of<'a>(
        &'a self,
        replica_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Seat>, StoreError>> {
        self.run("seat_of", self.seat_of_now(replica_id)).boxed()
    }

    fn holder<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, Result<Option<Seat>, StoreError>> {
        self.run("holder", self.holder_now(task_id)).boxed()
    }

    fn send_relay<'a>(
        &'a self,
        to: &'a Seat,
        relay: &'a Relay,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.run("send_relay", self.send_relay_now(to, relay))
            .boxed()
    }

    fn take_relays<'a>(
        &'a self,
        seat: &'a Seat,
    ) -> BoxFuture<'a, Result<Vec<TakenRelay>, StoreError>> {
        self.run("take_relays", self.take_relays_now(seat)).boxed()
    }

    fn publish<'a>(
        &'a self,
        from: &'a str,
        task_ids: &'a [String],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.run("publish", self.publish_now(from, task_ids))
            .boxed()
    }

    fn listen(&self, own: String, poll: Duration, events: mpsc::Sender<ClusterEvent>) {
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        tokio::spawn(listen_loop(
            std::sync::Arc::downgrade(&me),
            own,
            poll,
            events,
        ));
    }
}

/// Tests on the test cluster (feature `external-tests`; the cluster-free ones are in
/// `tests` below).
#[cfg(all(test, feature = "external-tests"))]
mod database_tests {
    use super::super::testing::settings;
    use super::*;
    use crate::store::test_records::{route, task};
    use crate::store::{TaskStatus, TaskStore};

    const HOUR: u64 = 3_600_000;

    async fn open_store(prefix: &str) -> std::sync::Arc<PgStore> {
        let s = settings(&super::super::testing::unique_schema(prefix));
        PgStore::open(&s).await.expect("open")
    }

    /// Make `seat`'s lease run out now (as if its replica stopped renewing).
    async fn expire_lease(store: &PgStore, seat: &Seat) {
        let c = store.pool.get().await.expect("conn");
        c.execute(
            "UPDATE replicas SET lease_until = now() - interval '1 second'
             WHERE replica_id = $1 AND epoch = $2",
            &[&seat.replica_id, &seat.epoch],
        )
        .await
        .expect("expire lease");
    }

    /// A late write of the call of `rt_lease` (its seat's lease gone) is refused.
    async fn assert_late_write_fenced(store: &PgStore) {
        let late = store
            .update_fenced("tsk_lease", "rt_lease", &mut |r| {
                r.status = TaskStatus::Completed;
                true
            })
            .await;
        assert!(matches!(late, Err(StoreError::Fenced)), "{late:?}");
    }

    fn fail_working(rec: &mut TaskRecord) -> bool {
        if rec.status.is_terminal() {
            return false;
        }
        rec.status = TaskStatus::Failed;
        true
    }

    /// Every request route of the schema, by id.
    async fn route_ids(s: &PgStore) -> Vec<String> {
        let c = s.pool.get().await.expect("conn");
        c.query("SELECT route_id FROM request_routes ORDER BY route_id", &[])
            .await
            .expect("routes")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// A call's terminal write takes its request route with it, in one statement,
    /// only under the fence and only when terminal; a fenced one removes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_terminal_write_releases_its_route() {
        let a = open_store("release").await;
        let seat = a.register("a").await.expect("register");
        for id in ["r", "o"] {
            let t = task(&format!("tsk_{id}"), "acme", now_ms() + HOUR);
            a.create(
                &t,
                &route(&format!("rt_{id}"), Some(&format!("tsk_{id}"))),
                None,
            )
            .await
            .expect("create");
        }
        let (rec, released) = a
            .update_fenced_releasing("tsk_r", "rt_r", &mut |r| {
                r.status_message = Some("half way".into());
                true
            })
            .await
            .expect("progress");
        assert_eq!(rec.map(|r| r.status), Some(TaskStatus::Working));
        assert!(!released, "not terminal: the route stays");
        assert_eq!(route_ids(&a).await, ["rt_o", "rt_r"]);
        let (rec, released) = a
            .update_fenced_releasing("tsk_r", "rt_r", &mut |r| {
                r.status = TaskStatus::Completed;
                true
            })
            .await
            .expect("terminal");
        assert_eq!(rec.map(|r| r.status), Some(TaskStatus::Completed));
        assert!(released);
        assert_eq!(route_ids(&a).await, ["rt_o"]);
        // No write: nothing released.
        let (_, released) = a
            .update_fenced_releasing("tsk_o", "rt_o", &mut |_| false)
            .await
            .expect("no write");
        assert!(!released);
        // Fenced: neither the record nor the route changes.
        expire_lease(&a, &seat).await;
        let late = a
            .update_fenced_releasing("tsk_o", "rt_o", &mut |r| {
                r.status = TaskStatus::Completed;
                true
            })
            .await;
        assert!(matches!(late, Err(StoreError::Fenced)), "{late:?}");
        assert_eq!(route_ids(&a).await, ["rt_o"]);
        let o = a.get("tsk_o").await.expect("get").expect("there");
        assert_eq!(o.status, TaskStatus::Working);
    }

    /// A replica writes a task it created without reading it first
    /// (`last_written.rs`); a write another replica made in between is never lost, and
    /// the fence still holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_write_from_memory_never_loses_another_replicas() {
        let a = open_store("last_written").await;
        let b = PgStore::open(&settings(a.schema())).await.expect("open b");
        let seat = a.register("a").await.expect("register a");
        b.register("b").await.expect("register b");
        for id in ["h", "f"] {
            let t = task(&format!("tsk_{id}"), "acme", now_ms() + HOUR);
            a.create(
                &t,
                &route(&format!("rt_{id}"), Some(&format!("tsk_{id}"))),
                None,
            )
            .await
            .expect("create");
        }
        let append = |who: &'static str| {
            move |r: &mut TaskRecord| {
                let before = r.status_message.take().unwrap_or_default();
                r.status_message = Some(format!("{before}+{who}"));
                true
            }
        };
        // b writes after a's creation; a's next write must build on b's.
        b.update("tsk_h", &mut append("b")).await.expect("b");
        let rec = a.update("tsk_h", &mut append("a")).await.expect("a");
        assert_eq!(
            rec.and_then(|r| r.status_message).as_deref(),
            Some("working+b+a")
        );
        // a wrote last: its next write goes straight to the version it left.
        let rec = a
            .update_fenced("tsk_h", "rt_h", &mut |r| {
                r.status = TaskStatus::Completed;
                true
            })
            .await
            .expect("terminal");
        assert_eq!(rec.map(|r| r.status), Some(TaskStatus::Completed));
        let h = a.get("tsk_h").await.expect("get").expect("there");
        assert_eq!(
            (h.status, h.status_message.as_deref()),
            (TaskStatus::Completed, Some("working+b+a"))
        );
        // Created here and never read: the fence still refuses a seat whose lease
        // lapsed.
        expire_lease(&a, &seat).await;
        let late = a
            .update_fenced("tsk_f", "rt_f", &mut |r| {
                r.status = TaskStatus::Completed;
                true
            })
            .await;
        assert!(matches!(late, Err(StoreError::Fenced)), "{late:?}");
        let f = b.get("tsk_f").await.expect("get").expect("there");
        assert_eq!(f.status, TaskStatus::Working);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_lease_fences_writes_and_takeover_fails_once() {
        let a = open_store("lease").await;
        // A second replica on the same schema.
        let b = PgStore::open(&settings(a.schema())).await.expect("open b");
        let seat_a = a.register("a").await.expect("register a");
        b.register("b").await.expect("register b");
        assert_eq!(seat_a.epoch, 1);
        assert!(a.renew(&seat_a).await.expect("renew"));

        let t = task("tsk_lease", "acme", now_ms() + HOUR);
        a.create(&t, &route("rt_lease", Some("tsk_lease")), None)
            .await
            .expect("create");
        assert_eq!(
            b.holder("tsk_lease").await.expect("holder"),
            Some(seat_a.clone())
        );
        // While the lease holds: fenced writes go through, and nothing is taken over.
        let w = a
            .update_fenced("tsk_lease", "rt_lease", &mut |r| {
                r.status_message = Some("progress".into());
                true
            })
            .await
            .expect("fenced write while held");
        assert_eq!(
            w.and_then(|r| r.status_message).as_deref(),
            Some("progress")
        );
        assert!(
            b.take_over(&mut fail_working)
                .await
                .expect("take over")
                .is_empty()
        );

        // A's lease runs out: one takeover fails the task, a second finds nothing.
        expire_lease(&a, &seat_a).await;
        assert_late_write_fenced(&a).await;
        let (mut fb, mut fa) = (fail_working, fail_working);
        let (t1, t2) = tokio::join!(b.take_over(&mut fb), a.take_over(&mut fa));
        let taken = t1.expect("b").len() + t2.expect("a").len();
        assert_eq!(taken, 1, "exactly one replica takes the call over");
        assert!(
            !a.renew(&seat_a).await.expect("renew"),
            "a lapsed lease is lost for good"
        );

        // A registers a new epoch; a late write of the old call still changes nothing.
        let seat_a2 = a.register("a").await.expect("register again");
        assert_eq!(seat_a2.epoch, 2);
        assert_late_write_fenced(&a).await;
        let rec = b.get("tsk_lease").await.expect("get").expect("task");
        assert_eq!(rec.status, TaskStatus::Failed);
        assert!(b.holder("tsk_lease").await.expect("holder").is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_relays_reach_only_their_seat_and_routes_are_per_epoch() {
        let a = open_store("relay").await;
        let seat1 = a.register("a").await.expect("register");
        a.create(
            &task("tsk_r1", "acme", now_ms() + HOUR),
            &route("rt_r1", Some("tsk_r1")),
            None,
        )
        .await
        .expect("create");
        // The route names the seat; start-up recovery of the same epoch sees nothing,
        // and the orphan sweep of that seat sees it.
        assert!(a.routes().await.expect("routes").is_empty());
        let held = a.held_routes().await.expect("held routes");
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].route_id, "rt_r1");
        let relay = Relay {
            kind: RelayKind::Cancel,
            task_id: Some("tsk_r1".into()),
            payload: b"null".to_vec(),
        };
        a.send_relay(&seat1, &relay).await.expect("send");
        let other = Seat {
            replica_id: "b".into(),
            epoch: 1,
        };
        assert!(a.take_relays(&other).await.expect("take").is_empty());
        let taken = a.take_relays(&seat1).await.expect("take");
        assert_eq!(
            taken.into_iter().map(|t| t.relay).collect::<Vec<_>>(),
            vec![relay]
        );
        assert!(a.take_relays(&seat1).await.expect("take again").is_empty());
        // After a restart (a new epoch) the old epoch's route is this replica's to
        // recover.
        let seat2 = a.register("a").await.expect("register again");
        assert_eq!(seat2.epoch, seat1.epoch + 1);
        let left = a.routes().await.expect("routes");
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].route_id, "rt_r1");
        assert!(a.held_routes().await.expect("held routes").is_empty());
        assert_eq!(a.seat_of("a").await.expect("seat_of"), Some(seat2));
        assert_eq!(a.seat_of("nobody").await.expect("seat_of"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_changes_reach_other_listeners_not_the_sender() {
        let a = open_store("notify").await;
        let (tx, mut rx) = mpsc::channel(16);
        // A poll interval no test waits out: only LISTEN delivers here.
        let poll = Duration::from_secs(3600);
        a.listen("b".into(), poll, tx);
        let (own_tx, mut own_rx) = mpsc::channel(16);
        a.listen("a".into(), poll, own_tx);
        // Publish until the listener is up (LISTEN runs in the background).
        let ids = vec!["tsk_n1".to_string(), "tsk_n2".to_string()];
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                a.publish("a", &ids).await.expect("publish");
                if let Ok(Some(ev)) =
                    tokio::time::timeout(Duration::from_millis(200), rx.recv()).await
                {
                    return ev;
                }
            }
        })
        .await
        .expect("a notification");
        assert_eq!(got, ClusterEvent::Changed(ids));
        assert!(
            own_rx.try_recv().is_err(),
            "a replica hears its own changes"
        );
        // A relay queued for "b" wakes b's listener, not a's.
        let to = Seat {
            replica_id: "b".into(),
            epoch: 1,
        };
        let relay = Relay {
            kind: RelayKind::Cancel,
            task_id: None,
            payload: b"null".to_vec(),
        };
        a.send_relay(&to, &relay).await.expect("relay");
        let woke = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a wake-up");
        assert_eq!(woke, Some(ClusterEvent::Wake));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            own_rx.try_recv().is_err(),
            "a replica woken for another's relay"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_split_under_the_limit_and_parse_back() {
        let ids: Vec<String> = (0..1000).map(|i| format!("tsk_{i:040}")).collect();
        let ps = payloads("replica-a", &ids);
        assert!(ps.len() > 1);
        let mut back = Vec::new();
        for p in &ps {
            assert!(p.len() < 8000);
            let (from, got) = parse_payload(p).expect("payload");
            assert_eq!(from, "replica-a");
            back.extend(got);
        }
        assert_eq!(back, ids);
        assert!(payloads("a", &[]).is_empty());
    }

    #[test]
    fn channels_differ_by_schema_and_fit() {
        let a = channel("taskgate");
        assert_ne!(a, channel("taskgate2"));
        assert!(a.len() <= 63);
        assert_eq!(a, channel("taskgate"));
    }
}
