//! The store contract: one suite of behaviours every [`TaskStore`] backend must show,
//! run against each backend. A backend joins with one line at the bottom
//! (`contract_suite!(name, factory)`), where the factory gives a [`Harness`]: a fresh,
//! empty store and a way to restart it as a new process would find it.
//!
//! Crash repairs that only one backend needs (sled's leftovers of a write cut short)
//! are tested next to that backend, with its own fault injection.

use std::sync::Arc;

use serde_json::{Map, json};

use super::memory::MemoryStore;
#[cfg(feature = "external-tests")]
use super::postgres::{PgStore, testing as pg};
use super::sled::SledStore;
use super::test_records::{route, session, task};
use super::{
    Created, Owned, OwnedSession, OwnerCursor, PurgeCounts, QuotaCreated, RequestRoute,
    SessionCreated, TaskRecord, TaskStatus, TaskStore, idempotency, now_ms, probe,
};
use crate::config::StoreConfig;
use crate::protocol::UpstreamInfo;

/// One store under test.
pub(crate) struct Harness {
    store: Option<Arc<dyn TaskStore>>,
    /// Close the store and open it again (what the next process sees); `None` for a
    /// backend that keeps nothing across a restart.
    reopen: Option<Box<dyn FnMut() -> Arc<dyn TaskStore> + Send>>,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    fn store(&self) -> Arc<dyn TaskStore> {
        self.store.clone().expect("store is open")
    }

    /// A restart: the caller must have dropped its handles first. Returns `false` for
    /// a backend that keeps nothing across one (the restart cases then stop).
    fn restart(&mut self) -> bool {
        let Some(reopen) = self.reopen.as_mut() else {
            return false;
        };
        self.store = None;
        self.store = Some(reopen());
        true
    }
}

fn memory() -> Harness {
    Harness {
        store: Some(MemoryStore::new()),
        reopen: None,
        _dir: None,
    }
}

fn sled() -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = StoreConfig {
        path: dir.path().join("db"),
        ..StoreConfig::default()
    };
    let open = move || -> Arc<dyn TaskStore> { SledStore::open(&cfg).expect("open sled") };
    let open = Box::new(open);
    Harness {
        store: Some(open()),
        reopen: Some(open),
        _dir: Some(dir),
    }
}

/// A fresh schema on the test cluster (`scripts/pg.sh`); a restart opens a new pool
/// on the same schema, as the next process would. Feature `external-tests`, as every
/// test that needs the cluster (Cargo.toml).
#[cfg(feature = "external-tests")]
fn postgres() -> Harness {
    let settings = pg::settings(&pg::unique_schema("contract"));
    pg::migrate_blocking(&settings);
    let open =
        move || -> Arc<dyn TaskStore> { PgStore::connect_lazy(&settings).expect("open postgres") };
    let open = Box::new(open);
    Harness {
        store: Some(open()),
        reopen: Some(open),
        _dir: None,
    }
}

const HOUR: u64 = 3_600_000;

pub(crate) async fn create_and_read_your_write(h: Harness) {
    let s = h.store();
    let t = task("tsk_a", "acme", now_ms() + HOUR);
    let r = route("rt_a", Some("tsk_a"));
    assert_eq!(s.create(&t, &r, None).await.unwrap(), Created::New);
    // Visible at once, before any flush.
    assert_eq!(s.get("tsk_a").await.unwrap(), Some(t.clone()));
    assert_eq!(s.routes().await.unwrap(), vec![r.clone()]);
    assert_eq!(s.live_tasks("acme").await.unwrap(), 1);
    assert_eq!(s.live_tasks("other").await.unwrap(), 0);
    assert_eq!(
        s.count_by_status().await.unwrap(),
        vec![(TaskStatus::Working, 1)]
    );
    s.flush().await.unwrap();
    assert!(s.healthy());
    // The same id twice is refused, and the first task is untouched.
    let mut again = t.clone();
    again.tool = "other".into();
    assert!(s.create(&again, &route("rt_b", None), None).await.is_err());
    assert_eq!(s.get("tsk_a").await.unwrap(), Some(t));
    assert_eq!(s.get("tsk_missing").await.unwrap(), None);
}

pub(crate) async fn updates_compare_and_swap(h: Harness) {
    let s = h.store();
    let t = task("tsk_u", "acme", now_ms() + HOUR);
    s.create(&t, &route("rt_u", Some("tsk_u")), None)
        .await
        .unwrap();
    // `false` leaves the record as it was.
    let r = s
        .update("tsk_u", &mut |rec| {
            rec.tool = "changed".into();
            false
        })
        .await;
    assert_eq!(r.unwrap(), Some(t.clone()));
    assert_eq!(s.get("tsk_u").await.unwrap(), Some(t));
    // Concurrent read-modify-writes lose nothing.
    let writers: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                s.update("tsk_u", &mut |rec| {
                    rec.issued_keys.push(key.clone());
                    true
                })
                .await
                .unwrap()
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let rec = s.get("tsk_u").await.unwrap().unwrap();
    assert_eq!(rec.issued_keys.len(), 16, "{:?}", rec.issued_keys);
    // Terminal: no longer live.
    let done = s
        .update("tsk_u", &mut |rec| {
            rec.status = TaskStatus::Completed;
            rec.result = Some(json!({"content": []}));
            true
        })
        .await;
    assert_eq!(done.unwrap().unwrap().status, TaskStatus::Completed);
    assert_eq!(s.live_tasks("acme").await.unwrap(), 0);
    let missing = s.update("tsk_none", &mut |_| true).await;
    assert_eq!(missing.unwrap(), None);
}

pub(crate) async fn idempotency_claims(h: Harness) {
    let s = h.store();
    let key = b"acme\0alice\0demo\0sleep\0k1".to_vec();
    let mut first = task("tsk_i1", "acme", now_ms() + HOUR);
    first.args_fingerprint = "fp1".into();
    let r = s
        .create(&first, &route("rt_i1", Some("tsk_i1")), Some(&key))
        .await;
    assert_eq!(r.unwrap(), Created::New);
    let entry = s.idempotency_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (entry.task_id.as_str(), entry.args_fingerprint.as_str()),
        ("tsk_i1", "fp1")
    );
    // A second create with the key writes nothing and names the first task.
    let second = task("tsk_i2", "acme", now_ms() + HOUR);
    match s
        .create(&second, &route("rt_i2", Some("tsk_i2")), Some(&key))
        .await
        .unwrap()
    {
        Created::Existing(e) => assert_eq!(e.task_id, "tsk_i1"),
        Created::New => panic!("duplicate key created a task"),
    }
    assert_eq!(s.get("tsk_i2").await.unwrap(), None);
    assert_eq!(s.routes().await.unwrap().len(), 1);
    assert_eq!(s.live_tasks("acme").await.unwrap(), 1);
}

/// A creation under a quota counts the tenant's live tasks with the write: refused at
/// the quota (nothing written, the key left free), a taken key still answered with
/// its task, and other tenants and terminal tasks not counted.
pub(crate) async fn creations_within_a_quota(h: Harness) {
    let s = h.store();
    let quota = |id: &str, key: Option<&[u8]>| {
        let s = s.clone();
        let t = task(id, "acme", now_ms() + HOUR);
        let r = route(&format!("rt_{id}"), Some(id));
        let key = key.map(<[u8]>::to_vec);
        async move {
            s.create_within_quota(&t, &r, key.as_deref(), 2)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        quota("tsk_q1", None).await,
        QuotaCreated::Done(Created::New)
    );
    let key = b"acme\0alice\0demo\0sleep\0q".to_vec();
    assert_eq!(
        quota("tsk_q2", Some(&key)).await,
        QuotaCreated::Done(Created::New)
    );
    assert_eq!(
        quota("tsk_q3", None).await,
        QuotaCreated::OverQuota { live: 2 }
    );
    let fresh = b"acme\0alice\0demo\0sleep\0fresh".to_vec();
    assert_eq!(
        quota("tsk_q4", Some(&fresh)).await,
        QuotaCreated::OverQuota { live: 2 }
    );
    assert_eq!(
        s.idempotency_get(&fresh).await.unwrap(),
        None,
        "key left free"
    );
    match quota("tsk_q5", Some(&key)).await {
        QuotaCreated::Done(Created::Existing(e)) => assert_eq!(e.task_id, "tsk_q2"),
        other => panic!("a taken key over the quota: {other:?}"),
    }
    for id in ["tsk_q3", "tsk_q4", "tsk_q5"] {
        assert_eq!(s.get(id).await.unwrap(), None, "{id} was refused");
    }
    assert_eq!(s.routes().await.unwrap().len(), 2);
    // Another tenant has its own count.
    let other = task("tsk_o1", "other", now_ms() + HOUR);
    let r = s
        .create_within_quota(&other, &route("rt_o1", Some("tsk_o1")), None, 2)
        .await
        .unwrap();
    assert_eq!(r, QuotaCreated::Done(Created::New));
    // A task that ended no longer counts.
    s.update("tsk_q1", &mut |rec| {
        rec.status = TaskStatus::Completed;
        true
    })
    .await
    .unwrap();
    assert_eq!(
        quota("tsk_q6", None).await,
        QuotaCreated::Done(Created::New)
    );
    // Without a quota's pressure the plain creation is unchanged.
    assert_eq!(s.live_tasks("acme").await.unwrap(), 2);
}

pub(crate) async fn concurrent_duplicates_have_one_winner(h: Harness) {
    let s = h.store();
    let key = b"acme\0alice\0demo\0sleep\0race".to_vec();
    let racers: Vec<_> = (0..12)
        .map(|i| {
            let s = s.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let id = format!("tsk_r{i}");
                let t = task(&id, "acme", now_ms() + HOUR);
                let r = route(&format!("rt_r{i}"), Some(&id));
                (id, s.create(&t, &r, Some(&key)).await.unwrap())
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut named = Vec::new();
    for r in racers {
        match r.await.unwrap() {
            (id, Created::New) => winners.push(id),
            (_, Created::Existing(e)) => named.push(e.task_id),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one creator wins: {winners:?}");
    assert!(named.iter().all(|n| *n == winners[0]), "{named:?}");
    assert_eq!(s.routes().await.unwrap().len(), 1);
    assert_eq!(s.live_tasks("acme").await.unwrap(), 1);
    let stored: usize = s
        .count_by_status()
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| *n as usize)
        .sum();
    assert_eq!(stored, 1);
}

pub(crate) async fn expiry_and_tombstones(h: Harness) {
    let s = h.store();
    let now = now_ms();
    let key = b"acme\0alice\0demo\0sleep\0exp".to_vec();
    let due = task("tsk_due", "acme", now - 10);
    let later = task("tsk_later", "acme", now + HOUR);
    let extended = task("tsk_ext", "acme", now - 5);
    s.create(&due, &route("rt_1", None), Some(&key))
        .await
        .unwrap();
    s.create(&later, &route("rt_2", None), None).await.unwrap();
    s.create(&extended, &route("rt_3", None), None)
        .await
        .unwrap();
    let listed = s.expired(now, 10).await.unwrap();
    assert_eq!(listed, vec!["tsk_due".to_string(), "tsk_ext".to_string()]);
    assert_eq!(s.expired(now, 1).await.unwrap().len(), 1, "limit");
    // Extended after it was listed: not expired.
    s.update("tsk_ext", &mut |rec| {
        rec.expires_at_ms = now + HOUR;
        true
    })
    .await
    .unwrap();
    assert!(
        s.expire("tsk_ext", now, now + HOUR)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        s.expired(now, 10).await.unwrap(),
        vec!["tsk_due".to_string()]
    );

    let gone = s.expire("tsk_due", now, now + 1000).await.unwrap().unwrap();
    assert_eq!(gone.record.task_id, "tsk_due");
    assert!(!gone.seen, "nobody read it");
    assert_eq!(s.get("tsk_due").await.unwrap(), None);
    let tomb = s.tombstone("tsk_due").await.unwrap().unwrap();
    assert_eq!(
        (tomb.tenant.as_str(), tomb.subject.as_str()),
        ("acme", "alice")
    );
    assert!(s.expired(now, 10).await.unwrap().is_empty());
    assert_eq!(s.live_tasks("acme").await.unwrap(), 2);
    // The claim lives as long as the tombstone: the key still names the task.
    let entry = s.idempotency_get(&key).await.unwrap().unwrap();
    assert_eq!(entry.task_id, "tsk_due");
    let again = task("tsk_due2", "acme", now + HOUR);
    let r = s
        .create(&again, &route("rt_4", None), Some(&key))
        .await
        .unwrap();
    assert!(matches!(r, Created::Existing(_)), "{r:?}");
    // Swept: tombstone and claim go together, and the key is free again.
    assert_eq!(s.sweep_tombstones(now).await.unwrap(), 0, "not due yet");
    assert_eq!(s.sweep_tombstones(now + 1000).await.unwrap(), 1);
    assert!(s.tombstone("tsk_due").await.unwrap().is_none());
    assert!(s.idempotency_get(&key).await.unwrap().is_none());
    let r = s
        .create(&again, &route("rt_4", None), Some(&key))
        .await
        .unwrap();
    assert_eq!(r, Created::New);
}

pub(crate) async fn ownership_lookups_cost_the_same(h: Harness) {
    let s = h.store();
    let now = now_ms();
    s.create(
        &task("tsk_live", "acme", now + HOUR),
        &route("rt_1", None),
        None,
    )
    .await
    .unwrap();
    s.create(
        &task("tsk_gone", "acme", now - 10),
        &route("rt_2", None),
        None,
    )
    .await
    .unwrap();
    s.expire("tsk_gone", now, now + HOUR)
        .await
        .unwrap()
        .unwrap();
    let found = s.lookup_owned("tsk_live", "acme", "alice").await.unwrap();
    assert!(
        matches!(&found, Owned::Record(r) if r.task_id == "tsk_live"),
        "{found:?}"
    );
    assert_eq!(
        s.lookup_owned("tsk_gone", "acme", "alice").await.unwrap(),
        Owned::Expired
    );
    for (tenant, subject) in [("acme", "bob"), ("globex", "alice"), ("acme\0alice", "")] {
        for id in ["tsk_live", "tsk_gone", "tsk_never"] {
            assert_eq!(
                s.lookup_owned(id, tenant, subject).await.unwrap(),
                Owned::Unknown,
                "{id} as {tenant:?}/{subject:?}"
            );
        }
    }
    // Counted, not timed: another principal's task, another principal's tombstone and
    // an id never issued make the same reads and decode nothing.
    let mut costs = Vec::new();
    for id in ["tsk_never", "tsk_live", "tsk_gone"] {
        let before = probe::counts();
        s.lookup_owned(id, "acme", "bob").await.unwrap();
        let after = probe::counts();
        costs.push((
            id,
            after.reads - before.reads,
            after.decodes - before.decodes,
        ));
    }
    let never = (costs[0].1, costs[0].2);
    assert_eq!(never.1, 0, "{costs:?}");
    for c in &costs {
        assert_eq!((c.1, c.2), never, "{costs:?}");
    }
}

pub(crate) async fn read_marks(h: Harness) {
    let s = h.store();
    let now = now_ms();
    let mut read = task("tsk_read", "acme", now - 1);
    read.status = TaskStatus::Completed;
    let mut unread = task("tsk_unread", "acme", now - 1);
    unread.status = TaskStatus::Failed;
    s.create(&read, &route("rt_1", None), None).await.unwrap();
    s.create(&unread, &route("rt_2", None), None).await.unwrap();
    // Marks for tasks that do not exist are skipped; marking twice is harmless.
    let ids = vec!["tsk_read".to_string(), "tsk_nothing".to_string()];
    s.mark_seen(&ids).await.unwrap();
    s.mark_seen(&ids).await.unwrap();
    let a = s
        .expire("tsk_read", now, now + 1000)
        .await
        .unwrap()
        .unwrap();
    let b = s
        .expire("tsk_unread", now, now + 1000)
        .await
        .unwrap()
        .unwrap();
    assert!(a.seen);
    assert!(!b.seen);
    // A mark never outlives its task.
    s.mark_seen(&["tsk_read".to_string()]).await.unwrap();
    let mut back = task("tsk_read", "acme", now - 1);
    back.status = TaskStatus::Completed;
    s.sweep_tombstones(now + 1000).await.unwrap();
    s.create(&back, &route("rt_3", None), None).await.unwrap();
    let c = s
        .expire("tsk_read", now, now + 1000)
        .await
        .unwrap()
        .unwrap();
    assert!(!c.seen, "a re-created id starts unread");
}

pub(crate) async fn routes_are_resolved_at_start_up(mut h: Harness) {
    let s = h.store();
    let t = task("tsk_s", "acme", now_ms() + HOUR);
    s.create(&t, &route("rt_task", Some("tsk_s")), None)
        .await
        .unwrap();
    s.put_route(&route("rt_inline", None)).await.unwrap();
    s.put_route(&route("rt_done", None)).await.unwrap();
    s.remove_route("rt_done").await.unwrap();
    s.flush().await.unwrap();
    drop(s);
    h.restart();
    let s = h.store();
    // What a start-up finds: the calls in flight at the last stop, with their tasks.
    let mut ids: Vec<String> = s
        .routes()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.route_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["rt_inline", "rt_task"]);
    assert_eq!(s.get("tsk_s").await.unwrap(), Some(t));
    assert_eq!(s.live_tasks("acme").await.unwrap(), 1);
    for id in ids {
        s.remove_route(&id).await.unwrap();
    }
    assert!(s.routes().await.unwrap().is_empty());
}

/// A task of `tenant`/`subject` on `upstream`, created at `created_at_ms`.
fn owned(id: &str, tenant: &str, subject: &str, upstream: &str, created_at_ms: u64) -> TaskRecord {
    TaskRecord {
        subject: subject.into(),
        upstream: upstream.into(),
        created_at_ms,
        ..task(id, tenant, now_ms() + HOUR)
    }
}

async fn owned_ids(
    s: &dyn TaskStore,
    (tenant, subject, upstream): (&str, &str, &str),
    after: Option<&OwnerCursor>,
    limit: usize,
) -> Vec<String> {
    s.list_owned(tenant, subject, upstream, after, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.task_id)
        .collect()
}

fn after(created_at_ms: u64, task_id: &str) -> OwnerCursor {
    OwnerCursor {
        created_at_ms,
        task_id: task_id.into(),
    }
}

pub(crate) async fn owner_lists(mut h: Harness) {
    let s = h.store();
    let alice = ("acme", "alice", "demo");
    // Out of order on purpose; at one time, ids order by their bytes ("Z" < "a").
    let mine = [
        ("tsk_d", 200),
        ("tsk_b", 100),
        ("tsk_a", 100),
        ("tsk_Z", 100),
        ("tsk_c", 50),
    ];
    for (i, (id, at)) in mine.iter().enumerate() {
        let rec = owned(id, "acme", "alice", "demo", *at);
        let key = format!("acme\0alice\0demo\0sleep\0{id}").into_bytes();
        // Keyed and plain creations both enter the index.
        let key = (i % 2 == 0).then_some(key.as_slice());
        assert_eq!(
            s.create(&rec, &route(&format!("rt_{id}"), None), key)
                .await
                .unwrap(),
            Created::New
        );
    }
    // Neighbours that must never show: another tenant, another subject of the same
    // tenant, other upstreams (one whose name extends "demo", one it extends), and
    // principals whose parts run into each other when joined.
    let others = [
        ("tsk_o1", "globex", "alice", "demo"),
        ("tsk_o2", "acme", "bob", "demo"),
        ("tsk_o3", "acme", "alice", "demo2"),
        ("tsk_o4", "acme", "alice", "dem"),
        ("tsk_o5", "acmealice", "", "demo"),
        ("tsk_o6", "acme", "alicedemo", ""),
        ("tsk_o7", "", "acmealice", "demo"),
    ];
    for (id, tenant, subject, upstream) in others {
        let rec = owned(id, tenant, subject, upstream, 100);
        s.create(&rec, &route(&format!("rt_{id}"), None), None)
            .await
            .unwrap();
    }
    let order = ["tsk_c", "tsk_Z", "tsk_a", "tsk_b", "tsk_d"];
    assert_eq!(owned_ids(&*s, alice, None, 10).await, order);
    let full = s
        .list_owned("acme", "alice", "demo", None, 10)
        .await
        .unwrap();
    assert_eq!(
        Some(&full[1]),
        s.get("tsk_Z").await.unwrap().as_ref(),
        "whole records"
    );
    // Pages: the limit holds, and a cursor resumes strictly after its task.
    assert_eq!(owned_ids(&*s, alice, None, 2).await, ["tsk_c", "tsk_Z"]);
    assert_eq!(
        owned_ids(&*s, alice, Some(&after(100, "tsk_Z")), 2).await,
        ["tsk_a", "tsk_b"]
    );
    assert_eq!(
        owned_ids(&*s, alice, Some(&after(100, "tsk_b")), 2).await,
        ["tsk_d"]
    );
    assert!(
        owned_ids(&*s, alice, Some(&after(200, "tsk_d")), 2)
            .await
            .is_empty()
    );
    assert_eq!(owned_ids(&*s, alice, None, 1).await, ["tsk_c"]);
    assert!(owned_ids(&*s, alice, None, 0).await.is_empty());
    // A cursor between tasks (its own task gone meanwhile) resumes at the next one.
    assert_eq!(
        owned_ids(&*s, alice, Some(&after(100, "tsk_aa")), 10).await,
        ["tsk_b", "tsk_d"]
    );
    assert_eq!(
        owned_ids(&*s, alice, Some(&after(60, "")), 10).await,
        ["tsk_Z", "tsk_a", "tsk_b", "tsk_d"]
    );
    // Walking every page with limit 2 yields each task once, in order.
    let mut walked = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .list_owned("acme", "alice", "demo", cursor.as_ref(), 2)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        cursor = Some(after(last.created_at_ms, &last.task_id));
        walked.extend(page.into_iter().map(|r| r.task_id));
    }
    assert_eq!(walked, order);
    // Each neighbour sees only its own.
    for (id, tenant, subject, upstream) in others {
        assert_eq!(
            owned_ids(&*s, (tenant, subject, upstream), None, 10).await,
            [id]
        );
    }
    // Empty: nobody's tasks, or an upstream nobody used.
    assert!(
        owned_ids(&*s, ("acme", "carol", "demo"), None, 10)
            .await
            .is_empty()
    );
    assert!(
        owned_ids(&*s, ("acme", "alice", "none"), None, 10)
            .await
            .is_empty()
    );

    // An update keeps the task listed, as it is now.
    s.update("tsk_a", &mut |rec| {
        rec.status = TaskStatus::Completed;
        rec.result = Some(json!({"content": []}));
        true
    })
    .await
    .unwrap();
    let listed = s
        .list_owned("acme", "alice", "demo", None, 10)
        .await
        .unwrap();
    assert_eq!(listed[2].task_id, "tsk_a");
    assert_eq!(listed[2].status, TaskStatus::Completed);
    // Expired: gone from the list with the record (the tombstone is not listed).
    let now = now_ms();
    s.update("tsk_b", &mut |rec| {
        rec.expires_at_ms = now - 1;
        true
    })
    .await
    .unwrap();
    assert!(s.expire("tsk_b", now, now + HOUR).await.unwrap().is_some());
    assert_eq!(
        owned_ids(&*s, alice, None, 10).await,
        ["tsk_c", "tsk_Z", "tsk_a", "tsk_d"]
    );
    assert_eq!(
        owned_ids(&*s, alice, Some(&after(100, "tsk_a")), 10).await,
        ["tsk_d"]
    );
    // A keyed creation that lost its key leaves nothing listed.
    let loser = owned("tsk_lost", "acme", "alice", "demo", 150);
    let taken = b"acme\0alice\0demo\0sleep\0tsk_d".to_vec();
    let r = s
        .create(&loser, &route("rt_lost", None), Some(&taken))
        .await
        .unwrap();
    assert!(matches!(r, Created::Existing(_)), "{r:?}");
    assert_eq!(
        owned_ids(&*s, alice, None, 10).await,
        ["tsk_c", "tsk_Z", "tsk_a", "tsk_d"]
    );
    // The index is kept across a restart.
    s.flush().await.unwrap();
    drop(s);
    if h.restart() {
        let s = h.store();
        assert_eq!(
            owned_ids(&*s, alice, None, 10).await,
            ["tsk_c", "tsk_Z", "tsk_a", "tsk_d"]
        );
    }
}

pub(crate) async fn upstream_identity_and_secrets(mut h: Harness) {
    let s = h.store();
    let id = UpstreamInfo {
        protocol_version: "2025-06-18".into(),
        server_info: json!({"name": "demo", "version": "1.0"}),
        capabilities: Map::new(),
        instructions: Some("hi".into()),
    };
    assert_eq!(s.upstream_identity("demo").await.unwrap(), None);
    assert!(s.put_upstream_identity("demo", &id).await.unwrap());
    assert!(
        !s.put_upstream_identity("demo", &id).await.unwrap(),
        "unchanged"
    );
    let mut other = id.clone();
    other.server_info = json!({"name": "demo", "version": "2.0"});
    assert!(s.put_upstream_identity("demo", &other).await.unwrap());
    assert_eq!(
        s.upstream_identity("demo").await.unwrap(),
        Some(other.clone())
    );
    let a = s.secret("a").await.unwrap();
    assert_eq!(s.secret("a").await.unwrap(), a);
    assert_ne!(s.secret("b").await.unwrap(), a);
    s.flush().await.unwrap();
    drop(s);
    if h.restart() {
        let s = h.store();
        assert_eq!(s.upstream_identity("demo").await.unwrap(), Some(other));
        assert_eq!(
            s.secret("a").await.unwrap(),
            a,
            "a secret survives a restart"
        );
    }
}

/// The `Mcp-Param-*` header map of an upstream's tools: absent until stored, written
/// only when it differs, an empty map kept as "known, nothing to check", separate
/// from the identity, and kept across a restart.
pub(crate) async fn upstream_tool_headers(mut h: Harness) {
    use crate::protocol::param_headers::ToolHeaders;
    let s = h.store();
    let list = json!({"tools": [{"name": "route", "inputSchema": {"type": "object",
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}}]});
    let (map, _) = ToolHeaders::from_tools_list(&list);
    assert_eq!(s.upstream_tool_headers("demo").await.unwrap(), None);
    assert!(s.put_upstream_tool_headers("demo", &map).await.unwrap());
    assert!(
        !s.put_upstream_tool_headers("demo", &map).await.unwrap(),
        "unchanged"
    );
    assert_eq!(
        s.upstream_tool_headers("demo").await.unwrap(),
        Some(map.clone())
    );
    let empty = ToolHeaders::default();
    assert!(s.put_upstream_tool_headers("other", &empty).await.unwrap());
    assert_eq!(
        s.upstream_tool_headers("other").await.unwrap(),
        Some(empty.clone())
    );
    assert_eq!(
        s.upstream_identity("demo").await.unwrap(),
        None,
        "a record of its own"
    );
    s.flush().await.unwrap();
    drop(s);
    if h.restart() {
        let s = h.store();
        assert_eq!(s.upstream_tool_headers("demo").await.unwrap(), Some(map));
        assert_eq!(
            s.upstream_tool_headers("other").await.unwrap(),
            Some(empty.clone())
        );
        assert!(s.put_upstream_tool_headers("demo", &empty).await.unwrap());
        assert_eq!(s.upstream_tool_headers("demo").await.unwrap(), Some(empty));
    }
}

// The `sessions` group: 2025-era client sessions (docs/design.md §22 "Clients of the
// 2025 era").

/// `at_cap`'s sessions as sorted ids.
fn held_ids(created: SessionCreated) -> Vec<String> {
    match created {
        SessionCreated::AtCap(held) => {
            let mut ids: Vec<String> = held.into_iter().map(|(id, _)| id).collect();
            ids.sort();
            ids
        }
        SessionCreated::New => panic!("expected AtCap, got New"),
    }
}

pub(crate) async fn sessions_create_and_read_back(mut h: Harness) {
    let s = h.store();
    let rec = session("mcs_a", "acme", "alice", 1_000);
    assert_eq!(
        s.create_session(&rec, 5).await.unwrap(),
        SessionCreated::New
    );
    let owned = s.session_owned("mcs_a", "acme", "alice").await.unwrap();
    assert_eq!(owned, OwnedSession::Record(Box::new(rec.clone())));
    // Byte-exact: the client's JSON reads back as the same text.
    let OwnedSession::Record(back) = owned else {
        unreachable!()
    };
    assert_eq!(
        serde_json::to_string(&back.client_info).unwrap(),
        r#"{"version":"1.0","name":"c","n":1.50,"z":-0}"#
    );
    assert_eq!(s.count_sessions().await.unwrap(), 1);
    // The same id twice is refused, and the first session is untouched.
    let mut again = session("mcs_a", "acme", "bob", 2_000);
    again.upstream = "other".into();
    assert!(s.create_session(&again, 5).await.is_err());
    assert_eq!(
        s.session_owned("mcs_a", "acme", "alice").await.unwrap(),
        OwnedSession::Record(Box::new(rec.clone()))
    );
    assert_eq!(s.count_sessions().await.unwrap(), 1);
    // Not flushed on its own, but a flush covers it like any write.
    s.flush().await.unwrap();
    drop(s);
    if h.restart() {
        let s = h.store();
        assert_eq!(
            s.session_owned("mcs_a", "acme", "alice").await.unwrap(),
            OwnedSession::Record(Box::new(rec)),
            "a session survives a restart"
        );
        assert_eq!(s.count_sessions().await.unwrap(), 1);
    }
}

pub(crate) async fn sessions_are_capped_per_principal(h: Harness) {
    let s = h.store();
    for (id, seen) in [("mcs_1", 30), ("mcs_2", 10)] {
        let rec = session(id, "acme", "alice", seen);
        assert_eq!(
            s.create_session(&rec, 2).await.unwrap(),
            SessionCreated::New
        );
    }
    // At the cap nothing is written, and the principal's sessions come back with
    // their last-seen times.
    let third = session("mcs_3", "acme", "alice", 40);
    match s.create_session(&third, 2).await.unwrap() {
        SessionCreated::AtCap(mut held) => {
            held.sort();
            assert_eq!(held, [("mcs_1".to_string(), 30), ("mcs_2".to_string(), 10)]);
        }
        SessionCreated::New => panic!("the cap was passed"),
    }
    assert_eq!(
        s.session_owned("mcs_3", "acme", "alice").await.unwrap(),
        OwnedSession::Unknown
    );
    // Other principals (same tenant, same subject elsewhere) have caps of their own.
    for (id, tenant, subject) in [("mcs_b", "acme", "bob"), ("mcs_g", "globex", "alice")] {
        let rec = session(id, tenant, subject, 5);
        assert_eq!(
            s.create_session(&rec, 2).await.unwrap(),
            SessionCreated::New
        );
    }
    // Room again once one is deleted.
    assert!(s.delete_session("mcs_2").await.unwrap());
    assert_eq!(
        s.create_session(&third, 2).await.unwrap(),
        SessionCreated::New
    );
    assert_eq!(
        held_ids(
            s.create_session(&session("mcs_4", "acme", "alice", 1), 2)
                .await
                .unwrap()
        ),
        ["mcs_1", "mcs_3"]
    );
    assert_eq!(s.count_sessions().await.unwrap(), 4);
}

pub(crate) async fn concurrent_session_creations_keep_the_cap(h: Harness) {
    let s = h.store();
    let creators: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let rec = session(&format!("mcs_c{i}"), "acme", "alice", i);
                s.create_session(&rec, 3).await.unwrap()
            })
        })
        .collect();
    let mut new = 0;
    for c in creators {
        if c.await.unwrap() == SessionCreated::New {
            new += 1;
        }
    }
    assert_eq!(new, 3, "exactly the cap was created");
    assert_eq!(s.count_sessions().await.unwrap(), 3);
}

pub(crate) async fn foreign_sessions_read_like_unknown_ones(h: Harness) {
    let s = h.store();
    s.create_session(&session("mcs_mine", "acme", "alice", 1), 5)
        .await
        .unwrap();
    for (tenant, subject) in [("acme", "bob"), ("globex", "alice"), ("acme\0alice", "")] {
        for id in ["mcs_mine", "mcs_never"] {
            assert_eq!(
                s.session_owned(id, tenant, subject).await.unwrap(),
                OwnedSession::Unknown,
                "{id} as {tenant:?}/{subject:?}"
            );
        }
    }
    // Counted, not timed: another principal's session and an id never issued make
    // the same reads and decode nothing.
    let mut costs = Vec::new();
    for id in ["mcs_never", "mcs_mine"] {
        let before = probe::counts();
        s.session_owned(id, "acme", "bob").await.unwrap();
        let after = probe::counts();
        costs.push((after.reads - before.reads, after.decodes - before.decodes));
    }
    assert_eq!(costs[0].1, 0, "{costs:?}");
    assert_eq!(costs[0], costs[1], "{costs:?}");
}

pub(crate) async fn session_updates_compare_and_swap(h: Harness) {
    let s = h.store();
    let rec = session("mcs_u", "acme", "alice", 1);
    s.create_session(&rec, 5).await.unwrap();
    let unchanged = s
        .update_session("mcs_u", &mut |r| {
            r.log_level = Some("debug".into());
            false
        })
        .await
        .unwrap();
    assert_eq!(unchanged, Some(rec.clone()));
    // The id and the owner stay whatever the step does.
    let moved = s
        .update_session("mcs_u", &mut |r| {
            r.session_id = "mcs_other".into();
            r.tenant = "globex".into();
            r.subject = "mallory".into();
            r.last_seen_at_ms = 50;
            true
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            moved.session_id.as_str(),
            moved.tenant.as_str(),
            moved.subject.as_str()
        ),
        ("mcs_u", "acme", "alice")
    );
    assert_eq!(moved.last_seen_at_ms, 50);
    // Concurrent read-modify-writes lose nothing.
    let writers: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let uri = format!("demo://{i}");
                s.update_session("mcs_u", &mut |r| {
                    r.subscriptions.push(uri.clone());
                    true
                })
                .await
                .unwrap()
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let OwnedSession::Record(now) = s.session_owned("mcs_u", "acme", "alice").await.unwrap() else {
        panic!("session gone")
    };
    assert_eq!(now.subscriptions.len(), 16);
    assert_eq!(now.last_seen_at_ms, 50);
    assert_eq!(
        s.update_session("mcs_none", &mut |_| true).await.unwrap(),
        None
    );
}

pub(crate) async fn sessions_are_deleted_and_expire_idle(h: Harness) {
    let s = h.store();
    for (id, seen) in [
        ("mcs_old", 100),
        ("mcs_mid", 200),
        ("mcs_new", 300),
        ("mcs_x", 150),
    ] {
        s.create_session(&session(id, "acme", "alice", seen), 10)
            .await
            .unwrap();
    }
    // Least recently seen first, strictly before the time, at most `limit`.
    assert_eq!(
        s.idle_sessions(300, 10).await.unwrap(),
        ["mcs_old", "mcs_x", "mcs_mid"]
    );
    assert_eq!(s.idle_sessions(300, 2).await.unwrap(), ["mcs_old", "mcs_x"]);
    assert!(s.idle_sessions(100, 10).await.unwrap().is_empty());
    // Expiry re-checks the record: one seen since it was listed stays.
    s.update_session("mcs_old", &mut |r| {
        r.last_seen_at_ms = 400;
        true
    })
    .await
    .unwrap();
    assert!(!s.expire_session("mcs_old", 300).await.unwrap());
    assert!(s.expire_session("mcs_mid", 300).await.unwrap());
    assert!(!s.expire_session("mcs_mid", 300).await.unwrap(), "gone");
    assert!(s.delete_session("mcs_new").await.unwrap());
    assert!(!s.delete_session("mcs_new").await.unwrap());
    assert!(!s.delete_session("mcs_never").await.unwrap());
    assert_eq!(
        s.session_owned("mcs_new", "acme", "alice").await.unwrap(),
        OwnedSession::Unknown
    );
    assert_eq!(s.count_sessions().await.unwrap(), 2);
    assert_eq!(
        s.idle_sessions(1_000, 10).await.unwrap(),
        ["mcs_x", "mcs_old"]
    );
    // Deleted sessions no longer count toward the cap.
    let r = s
        .create_session(&session("mcs_y", "acme", "alice", 1), 3)
        .await;
    assert_eq!(r.unwrap(), SessionCreated::New);
}

async fn tenant_ids(
    s: &dyn TaskStore,
    tenant: &str,
    status: TaskStatus,
    after: Option<&OwnerCursor>,
    limit: usize,
) -> Vec<String> {
    s.list_tenant(tenant, status, after, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.task_id)
        .collect()
}

/// The operator API's index: a tenant's tasks per status in creation order, moved
/// when the status changes, gone with the task; and the per-tenant counts.
pub(crate) async fn tenant_lists(h: Harness) {
    let s = h.store();
    let working = TaskStatus::Working;
    for (id, tenant, subject, at) in [
        ("tsk_d", "acme", "alice", 200),
        ("tsk_b", "acme", "bob", 100),
        ("tsk_a", "acme", "alice", 100),
        ("tsk_Z", "acme", "carol", 100),
        ("tsk_c", "acme", "alice", 50),
        // Neighbours: tenants whose names extend, or are extended by, "acme".
        ("tsk_o1", "acme2", "alice", 10),
        ("tsk_o2", "acm", "alice", 10),
        ("tsk_o3", "globex", "alice", 10),
    ] {
        let rec = owned(id, tenant, subject, "demo", at);
        s.create(&rec, &route(&format!("rt_{id}"), None), None)
            .await
            .unwrap();
    }
    let order = ["tsk_c", "tsk_Z", "tsk_a", "tsk_b", "tsk_d"];
    assert_eq!(tenant_ids(&*s, "acme", working, None, 10).await, order);
    assert_eq!(
        tenant_ids(&*s, "acme", working, None, 2).await,
        ["tsk_c", "tsk_Z"]
    );
    assert_eq!(
        tenant_ids(&*s, "acme", working, Some(&after(100, "tsk_Z")), 2).await,
        ["tsk_a", "tsk_b"]
    );
    assert!(
        tenant_ids(&*s, "acme", TaskStatus::Completed, None, 10)
            .await
            .is_empty()
    );
    assert_eq!(tenant_ids(&*s, "acm", working, None, 10).await, ["tsk_o2"]);
    // A status change moves the task to its new status's list.
    s.update("tsk_a", &mut |rec| {
        rec.status = TaskStatus::Completed;
        rec.result = Some(json!({"content": []}));
        true
    })
    .await
    .unwrap();
    assert_eq!(
        tenant_ids(&*s, "acme", working, None, 10).await,
        ["tsk_c", "tsk_Z", "tsk_b", "tsk_d"]
    );
    let done = s
        .list_tenant("acme", TaskStatus::Completed, None, 10)
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(Some(&done[0]), s.get("tsk_a").await.unwrap().as_ref());
    // Expired: gone from every list.
    let now = now_ms();
    s.update("tsk_b", &mut |rec| {
        rec.expires_at_ms = now - 1;
        true
    })
    .await
    .unwrap();
    assert!(s.expire("tsk_b", now, now + HOUR).await.unwrap().is_some());
    assert_eq!(
        tenant_ids(&*s, "acme", working, None, 10).await,
        ["tsk_c", "tsk_Z", "tsk_d"]
    );
    let counts: Vec<(String, TaskStatus, u64)> = s
        .tenant_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.tenant, c.status, c.tasks))
        .collect();
    for want in [
        ("acme".to_string(), working, 3),
        ("acme".to_string(), TaskStatus::Completed, 1),
        ("acme2".to_string(), working, 1),
        ("acm".to_string(), working, 1),
        ("globex".to_string(), working, 1),
    ] {
        assert!(counts.contains(&want), "{want:?} in {counts:?}");
    }
    assert_eq!(counts.len(), 5, "{counts:?}");
}

/// The items of each tenant `tenant_purge` seeds: a working task with its route and
/// claim, a completed task that was read, an expired task (a tombstone and its
/// claim), a route of a call that is no task's, and a 2025-era session.
async fn seed_tenant(s: &Arc<dyn TaskStore>, t: &str) {
    let now = now_ms();
    let key = |n: &str| idempotency::index_key(t, "alice", "demo", "sleep", n);
    let owned_route = |id: &str, task_id: Option<&str>| RequestRoute {
        tenant: t.into(),
        ..route(id, task_id)
    };
    let live = task(&format!("tsk_{t}_live"), t, now + HOUR);
    let r = owned_route(&format!("rt_{t}_live"), Some(&live.task_id));
    assert_eq!(
        s.create(&live, &r, Some(&key("live"))).await.unwrap(),
        Created::New
    );
    let done = TaskRecord {
        status: TaskStatus::Completed,
        ..task(&format!("tsk_{t}_done"), t, now + HOUR)
    };
    let r = owned_route(&format!("rt_{t}_done"), Some(&done.task_id));
    s.create(&done, &r, None).await.unwrap();
    s.remove_route(&r.route_id).await.unwrap();
    s.mark_seen(std::slice::from_ref(&done.task_id))
        .await
        .unwrap();
    let old = task(&format!("tsk_{t}_old"), t, now - 10);
    let r = owned_route(&format!("rt_{t}_old"), Some(&old.task_id));
    s.create(&old, &r, Some(&key("old"))).await.unwrap();
    s.remove_route(&r.route_id).await.unwrap();
    assert!(
        s.expire(&old.task_id, now, now + HOUR)
            .await
            .unwrap()
            .is_some()
    );
    s.put_route(&owned_route(&format!("rt_{t}_inline"), None))
        .await
        .unwrap();
    let created = s
        .create_session(&session(&format!("mcs_{t}"), t, "alice", now), 10)
        .await
        .unwrap();
    assert_eq!(created, SessionCreated::New);
}

pub(crate) async fn tenant_purge(h: Harness) {
    let s = h.store();
    seed_tenant(&s, "gone").await;
    seed_tenant(&s, "kept").await;
    let key = |t: &str, n: &str| idempotency::index_key(t, "alice", "demo", "sleep", n);

    let mut total = PurgeCounts::default();
    let mut batches = 0;
    let mut purged_tasks = Vec::new();
    loop {
        let b = s.purge_tenant("gone", 2).await.unwrap();
        batches += 1;
        total.add(&b.counts);
        purged_tasks.extend(b.tasks.into_iter().map(|t| t.task_id));
        if !b.more {
            break;
        }
        assert!(batches < 20, "a purge of a handful of items ends");
    }
    assert!(batches > 1, "a limit of 2 takes several batches: {batches}");
    purged_tasks.sort();
    assert_eq!(purged_tasks, ["tsk_gone_done", "tsk_gone_live"]);
    assert_eq!(
        (
            total.tasks,
            total.tombstones,
            total.sessions,
            total.idempotency_claims
        ),
        (2, 1, 1, 2),
        "{total:?}"
    );
    assert_eq!(
        total.routes, 2,
        "the live task's route and the inline call's: {total:?}"
    );

    // Nothing of the tenant is readable, and an id reads like one never issued.
    for id in ["tsk_gone_live", "tsk_gone_done", "tsk_gone_old"] {
        assert_eq!(s.get(id).await.unwrap(), None, "{id}");
        assert_eq!(s.tombstone(id).await.unwrap(), None, "{id}");
        let owned = s.lookup_owned(id, "gone", "alice").await.unwrap();
        assert_eq!(owned, Owned::Unknown, "{id}");
    }
    for n in ["live", "old"] {
        assert_eq!(s.idempotency_get(&key("gone", n)).await.unwrap(), None);
    }
    assert!(
        s.list_owned("gone", "alice", "demo", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    for status in TaskStatus::ALL {
        assert!(
            s.list_tenant("gone", status, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }
    let counts = s.tenant_counts().await.unwrap();
    assert!(counts.iter().all(|c| c.tenant != "gone"), "{counts:?}");
    assert_eq!(s.live_tasks("gone").await.unwrap(), 0);
    let routes = s.routes().await.unwrap();
    assert!(routes.iter().all(|r| r.tenant != "gone"), "{routes:?}");
    let session = s.session_owned("mcs_gone", "gone", "alice").await.unwrap();
    assert_eq!(session, OwnedSession::Unknown);

    // The other tenant keeps everything.
    assert!(s.get("tsk_kept_live").await.unwrap().is_some());
    assert!(s.get("tsk_kept_done").await.unwrap().is_some());
    let old = s
        .lookup_owned("tsk_kept_old", "kept", "alice")
        .await
        .unwrap();
    assert_eq!(old, Owned::Expired);
    for n in ["live", "old"] {
        assert!(s.idempotency_get(&key("kept", n)).await.unwrap().is_some());
    }
    assert_eq!(s.live_tasks("kept").await.unwrap(), 1);
    assert_eq!(routes.iter().filter(|r| r.tenant == "kept").count(), 2);
    let kept = s.session_owned("mcs_kept", "kept", "alice").await.unwrap();
    assert!(matches!(kept, OwnedSession::Record(_)));

    // Again: nothing left to remove; and the tenant's keys are free for new work.
    let again = s.purge_tenant("gone", 100).await.unwrap();
    assert_eq!((again.counts.total(), again.more), (0, false), "{again:?}");
    let fresh = task("tsk_gone_new", "gone", now_ms() + HOUR);
    let r = s
        .create(
            &fresh,
            &route("rt_new", Some("tsk_gone_new")),
            Some(&key("gone", "live")),
        )
        .await
        .unwrap();
    assert_eq!(r, Created::New);
}

/// Every case of the contract, as tests of one backend: `contract_suite!(name,
/// factory)` with `factory: fn() -> Harness`.
macro_rules! contract_suite {
    ($name:ident, $factory:path) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn create_and_read_your_write() {
                super::create_and_read_your_write($factory()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn updates_compare_and_swap() {
                super::updates_compare_and_swap($factory()).await
            }
            #[tokio::test]
            async fn idempotency_claims() {
                super::idempotency_claims($factory()).await
            }
            #[tokio::test]
            async fn creations_within_a_quota() {
                super::creations_within_a_quota($factory()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_duplicates_have_one_winner() {
                super::concurrent_duplicates_have_one_winner($factory()).await
            }
            #[tokio::test]
            async fn expiry_and_tombstones() {
                super::expiry_and_tombstones($factory()).await
            }
            #[tokio::test]
            async fn ownership_lookups_cost_the_same() {
                super::ownership_lookups_cost_the_same($factory()).await
            }
            #[tokio::test]
            async fn read_marks() {
                super::read_marks($factory()).await
            }
            #[tokio::test]
            async fn routes_are_resolved_at_start_up() {
                super::routes_are_resolved_at_start_up($factory()).await
            }
            #[tokio::test]
            async fn upstream_identity_and_secrets() {
                super::upstream_identity_and_secrets($factory()).await
            }
            #[tokio::test]
            async fn owner_lists() {
                super::owner_lists($factory()).await
            }
            #[tokio::test]
            async fn tenant_lists() {
                super::tenant_lists($factory()).await
            }
            #[tokio::test]
            async fn tenant_purge() {
                super::tenant_purge($factory()).await
            }
            #[tokio::test]
            async fn upstream_tool_headers() {
                super::upstream_tool_headers($factory()).await
            }
            mod sessions {
                use super::super::*;

                #[tokio::test]
                async fn create_and_read_back() {
                    sessions_create_and_read_back($factory()).await
                }
                #[tokio::test]
                async fn capped_per_principal() {
                    sessions_are_capped_per_principal($factory()).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn concurrent_creations_keep_the_cap() {
                    concurrent_session_creations_keep_the_cap($factory()).await
                }
                #[tokio::test]
                async fn foreign_reads_like_unknown() {
                    foreign_sessions_read_like_unknown_ones($factory()).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn updates_compare_and_swap() {
                    session_updates_compare_and_swap($factory()).await
                }
                #[tokio::test]
                async fn deleted_and_expired_idle() {
                    sessions_are_deleted_and_expire_idle($factory()).await
                }
            }
        }
    };
}

contract_suite!(memory_backend, memory);
contract_suite!(sled_backend, sled);
#[cfg(feature = "external-tests")]
contract_suite!(postgres_backend, postgres);
