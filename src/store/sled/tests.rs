use super::*;
use crate::config::StoreConfig;
use crate::protocol::UpstreamInfo;
use crate::store::test_records::{route, task};
use crate::store::{SCHEMA_VERSION, SetupError, StoredIdentity, TaskStatus};
use serde_json::Value;
use std::io::BufRead;
use std::time::Duration;

use super::codec::{StoredIdempotency, encode, encode_task};
use super::schema::{
    META_IDEM_OF, META_LIVE, META_LIVE_INDEX, META_OWNER_INDEX, META_SCHEMA, META_SEEN_SINCE,
    expiry_key, live_key, meta_key, owner_key, owner_prefix, split_live_key, split_owner_key,
};

fn cfg(path: &Path, strict: bool) -> StoreConfig {
    StoreConfig {
        path: path.to_path_buf(),
        strict_fsync: strict,
        cache_capacity_bytes: 64 * 1024 * 1024,
        ..StoreConfig::default()
    }
}

fn complete(store: &SledStore, id: &str) {
    let r = store
        .update(id, &mut |t| {
            t.status = TaskStatus::Completed;
            t.result = Some(serde_json::json!({"content": []}));
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(r.status, TaskStatus::Completed);
}

#[tokio::test(flavor = "multi_thread")]
async fn create_get_update_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let t = task("tsk_a", "acme", 1000);
    assert_eq!(
        store.create(&t, &route("r1", Some("tsk_a")), None).unwrap(),
        Created::New
    );
    store.flush().await.unwrap();
    assert_eq!(store.get("tsk_a").unwrap(), Some(t.clone()));
    assert_eq!(store.get("tsk_missing").unwrap(), None);

    let updated = store
        .update("tsk_a", &mut |t| {
            t.status = TaskStatus::InputRequired;
            t.status_message = Some("need input".into());
            t.issued_keys.push("k1".into());
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(updated.status, TaskStatus::InputRequired);
    assert_eq!(store.get("tsk_a").unwrap(), Some(updated.clone()));

    // `false` leaves the record unchanged even if the closure mutated it.
    let same = store
        .update("tsk_a", &mut |t| {
            t.status = TaskStatus::Failed;
            false
        })
        .unwrap();
    assert_eq!(same, Some(updated.clone()));
    assert_eq!(store.get("tsk_a").unwrap(), Some(updated));
    assert_eq!(store.update("tsk_missing", &mut |_| true).unwrap(), None);

    // A duplicate task id is refused, not overwritten.
    assert!(matches!(
        store.create(&t, &route("r2", None), None),
        Err(StoreError::Corrupt(_))
    ));
    assert!(store.healthy());
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotency_sequential_duplicate_returns_existing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let key: &[u8] = b"acme\0alice\0demo\0slow\0key-1";
    let mut a = task("tsk_a", "acme", 1000);
    a.args_fingerprint = "fp-a".into();
    assert_eq!(
        store.create(&a, &route("ra", None), Some(key)).unwrap(),
        Created::New
    );
    let b = task("tsk_b", "acme", 1000);
    let entry = IdempotencyEntry {
        task_id: "tsk_a".into(),
        args_fingerprint: "fp-a".into(),
    };
    assert_eq!(
        store.create(&b, &route("rb", None), Some(key)).unwrap(),
        Created::Existing(entry.clone())
    );
    // Nothing of the duplicate was written.
    assert_eq!(store.get("tsk_b").unwrap(), None);
    assert_eq!(store.routes().unwrap().len(), 1);
    assert_eq!(store.expired(u64::MAX, 10).unwrap(), vec!["tsk_a"]);
    assert_eq!(store.live_tasks("acme").unwrap(), 1);
    assert_eq!(store.idempotency_get(key).unwrap(), Some(entry));
    assert_eq!(store.idempotency_get(b"other").unwrap(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotency_concurrent_creates_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let key: &[u8] = b"acme\0alice\0demo\0slow\0same";
    let barrier = std::sync::Barrier::new(32);
    let results: Vec<(String, Created)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let store = &store;
                let barrier = &barrier;
                s.spawn(move || {
                    let id = format!("tsk_{i}");
                    let t = task(&id, "acme", 1000);
                    barrier.wait();
                    let r = store
                        .create(&t, &route(&format!("r{i}"), Some(&id)), Some(key))
                        .unwrap();
                    (id, r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<&String> = results
        .iter()
        .filter(|(_, r)| *r == Created::New)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one create wins");
    let winner = winners[0].clone();
    for (_, r) in &results {
        if let Created::Existing(e) = r {
            assert_eq!(e.task_id, winner);
        }
    }
    store.flush().await.unwrap();
    assert_eq!(store.tasks.len(), 1);
    assert_eq!(store.routes().unwrap().len(), 1);
    assert_eq!(store.expired(u64::MAX, 100).unwrap(), vec![winner.clone()]);
    assert_eq!(store.live_tasks("acme").unwrap(), 1);
    assert_eq!(store.idempotency_get(key).unwrap().unwrap().task_id, winner);
}

#[tokio::test(flavor = "multi_thread")]
async fn update_moves_expiry_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    store
        .create(&task("tsk_a", "acme", 1000), &route("ra", None), None)
        .unwrap();
    store
        .create(&task("tsk_b", "acme", 3000), &route("rb", None), None)
        .unwrap();
    assert_eq!(store.expired(999, 10).unwrap(), Vec::<String>::new());
    assert_eq!(store.expired(1000, 10).unwrap(), vec!["tsk_a"]);
    store
        .update("tsk_a", &mut |t| {
            t.expires_at_ms = 5000;
            true
        })
        .unwrap();
    assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
    assert_eq!(store.expired(4999, 10).unwrap(), vec!["tsk_b"]);
    assert_eq!(store.expired(5000, 10).unwrap(), vec!["tsk_b", "tsk_a"]);
    assert_eq!(store.expired(5000, 1).unwrap(), vec!["tsk_b"]);
    assert_eq!(store.expired(u64::MAX, 10).unwrap().len(), 2);
    assert_eq!(store.expiry.len(), 2, "old index entry removed");
    // An earlier expiry moves the entry at once.
    store
        .update("tsk_a", &mut |t| {
            t.expires_at_ms = 2000;
            true
        })
        .unwrap();
    assert_eq!(store.expired(2000, 10).unwrap(), vec!["tsk_a"]);
    assert_eq!(store.expiry.len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn expire_leaves_tombstone_and_sweep_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let key: &[u8] = b"acme\0alice\0demo\0slow\0k";
    store
        .create(&task("tsk_a", "acme", 1000), &route("ra", None), Some(key))
        .unwrap();
    // Not due yet (re-checked on the record): nothing happens.
    assert_eq!(store.expire("tsk_a", 999, 10_000).unwrap(), None);
    assert!(store.get("tsk_a").unwrap().is_some());
    assert_eq!(store.tombstone("tsk_a").unwrap(), None);
    let gone = store.expire("tsk_a", 1000, 10_000).unwrap().unwrap();
    assert_eq!(gone.record.task_id, "tsk_a");
    assert_eq!(store.get("tsk_a").unwrap(), None);
    assert_eq!(store.expired(u64::MAX, 10).unwrap(), Vec::<String>::new());
    assert_eq!(store.expire("tsk_a", u64::MAX, 10_000).unwrap(), None);
    let tomb = store.tombstone("tsk_a").unwrap().unwrap();
    assert_eq!(
        tomb,
        Tombstone {
            v: SCHEMA_VERSION,
            task_id: "tsk_a".into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            idempotency_index_key: Some(key.to_vec()),
            expires_at_ms: 10_000,
        }
    );
    // The key lives as long as the tombstone.
    assert!(store.idempotency_get(key).unwrap().is_some());
    assert_eq!(store.sweep_tombstones(9_999).unwrap(), 0);
    assert!(store.tombstone("tsk_a").unwrap().is_some());
    assert_eq!(store.sweep_tombstones(10_000).unwrap(), 1);
    assert_eq!(store.tombstone("tsk_a").unwrap(), None);
    assert_eq!(store.idempotency_get(key).unwrap(), None);
    assert_eq!(store.meta.scan_prefix(META_IDEM_OF).count(), 0);
    assert_eq!(store.sweep_tombstones(u64::MAX).unwrap(), 0);
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A read mark is one small entry of its own (the task record is not rewritten),
/// written once, durable with the next flush, and removed with its task.
#[tokio::test(flavor = "multi_thread")]
async fn seen_mark_is_a_small_entry_removed_with_its_task() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    for id in ["tsk_read", "tsk_unread", "tsk_durable"] {
        store
            .create(&task(id, "acme", 1000), &route(id, None), None)
            .unwrap();
        complete(&store, id);
    }
    let record = store.tasks.get("tsk_read").unwrap().unwrap();
    store.mark_seen(&ids(&["tsk_read", "tsk_never"])).unwrap();
    assert_eq!(
        store.tasks.get("tsk_read").unwrap().unwrap(),
        record,
        "the task record is not rewritten"
    );
    assert_eq!(store.seen.len(), 1, "no mark for a task that is not there");
    let mark = store.seen.get("tsk_read").unwrap().unwrap();
    let v: Value = serde_json::from_slice(&mark).unwrap();
    assert_eq!(v["v"], SCHEMA_VERSION, "{v}");
    assert!(mark.len() < 64, "a small entry: {} bytes", mark.len());
    // Marking again writes nothing.
    std::thread::sleep(Duration::from_millis(5));
    store.mark_seen(&ids(&["tsk_read"])).unwrap();
    assert_eq!(store.seen.get("tsk_read").unwrap().unwrap(), mark);

    let gone = store.expire("tsk_read", u64::MAX, 10).unwrap().unwrap();
    assert!(gone.seen);
    assert_eq!(gone.record.status, TaskStatus::Completed);
    assert_eq!(store.seen.len(), 0, "the mark goes with its task");
    let gone = store.expire("tsk_unread", u64::MAX, 10).unwrap().unwrap();
    assert!(!gone.seen);
    // A mark for an expired task is not written.
    store.mark_seen(&ids(&["tsk_read", "tsk_unread"])).unwrap();
    assert_eq!(store.seen.len(), 0);

    store.mark_seen(&ids(&["tsk_durable"])).unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert!(
        store
            .expire("tsk_durable", u64::MAX, 10)
            .unwrap()
            .unwrap()
            .seen
    );
}

/// Marks written while their tasks expire: none outlives its task.
#[tokio::test(flavor = "multi_thread")]
async fn seen_marks_racing_expiry_leave_no_orphans() {
    const N: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let all: Vec<String> = (0..N).map(|i| format!("tsk_{i}")).collect();
    for id in &all {
        store
            .create(&task(id, "acme", 1000), &route(id, None), None)
            .unwrap();
        complete(&store, id);
    }
    let seen = std::thread::scope(|s| {
        let marker = s.spawn(|| {
            for id in all.iter().rev() {
                store.mark_seen(std::slice::from_ref(id)).unwrap();
            }
        });
        let sweeper = s.spawn(|| {
            all.iter()
                .filter(|id| store.expire(id, u64::MAX, 10).unwrap().unwrap().seen)
                .count()
        });
        marker.join().unwrap();
        sweeper.join().unwrap()
    });
    assert_eq!(store.tasks.len(), 0);
    assert_eq!(store.seen.len(), 0, "a mark outlived its task");
    assert!(seen <= N);
}

/// What a crash can leave of a mark (module docs, "Concurrency contract") is
/// dropped with the task's stale expiry entry or with its tombstone.
#[tokio::test(flavor = "multi_thread")]
async fn seen_mark_leftovers_are_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    // `expire` cut short after the task's removal: mark and expiry entry remain.
    store.seen.insert("tsk_cut", &[]).unwrap();
    store
        .expiry
        .insert(expiry_key(500, "tsk_cut"), &[])
        .unwrap();
    assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
    assert_eq!(store.seen.get("tsk_cut").unwrap(), None);
    // A mark that landed after its task's `expire`, re-check lost: the tombstone
    // sweep takes it.
    let tomb = |id: &str| Tombstone {
        v: SCHEMA_VERSION,
        task_id: id.into(),
        tenant: "acme".into(),
        subject: "alice".into(),
        idempotency_index_key: None,
        expires_at_ms: 10,
    };
    store
        .tombstones
        .insert(
            "tsk_late",
            encode("tombstones", "tsk_late", &tomb("tsk_late")).unwrap(),
        )
        .unwrap();
    store.seen.insert("tsk_late", &[]).unwrap();
    // A tombstone beside a task that is still there keeps the task's mark.
    store
        .create(&task("tsk_live", "acme", 1000), &route("rl", None), None)
        .unwrap();
    complete(&store, "tsk_live");
    store.mark_seen(&ids(&["tsk_live"])).unwrap();
    store
        .tombstones
        .insert(
            "tsk_live",
            encode("tombstones", "tsk_live", &tomb("tsk_live")).unwrap(),
        )
        .unwrap();
    assert_eq!(store.sweep_tombstones(10).unwrap(), 2);
    assert_eq!(store.seen.get("tsk_late").unwrap(), None);
    assert!(store.seen.get("tsk_live").unwrap().is_some());
    assert!(
        store
            .expire("tsk_live", u64::MAX, 10)
            .unwrap()
            .unwrap()
            .seen
    );
}

/// A store written before read tracking (no `meta/layout/seen_since`): tasks that
/// were terminal before the upgrade count as seen, later ones are tracked.
#[tokio::test(flavor = "multi_thread")]
async fn read_tracking_starts_at_the_upgrade_of_an_older_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.seen_since_ms, 0, "a new store tracks every task");
    for id in ["tsk_old_done", "tsk_old_working"] {
        store
            .create(&task(id, "acme", 1000), &route(id, None), None)
            .unwrap();
    }
    complete(&store, "tsk_old_done");
    // Turn it into the older layout.
    store.meta.remove(META_SEEN_SINCE).unwrap();
    store.flush().await.unwrap();
    drop(store);

    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let since = store.seen_since_ms;
    assert!(since > 1, "{since}");
    store
        .create(&task("tsk_new", "acme", 1000), &route("rn", None), None)
        .unwrap();
    store
        .update("tsk_new", &mut |t| {
            t.status = TaskStatus::Failed;
            t.last_updated_at_ms = crate::store::now_ms();
            true
        })
        .unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.seen_since_ms, since, "kept across opens");
    let seen = |id: &str| store.expire(id, u64::MAX, 10).unwrap().unwrap().seen;
    assert!(seen("tsk_old_done"), "terminal before tracking: unknown");
    assert!(!seen("tsk_old_working"), "never terminal");
    assert!(!seen("tsk_new"), "terminal since tracking, never read");
}

#[tokio::test(flavor = "multi_thread")]
async fn routes_put_list_remove() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    // One record per route, compared with what was stored: the builders stamp the
    // current time, so a second call may differ by a millisecond.
    let r1 = route("r1", Some("tsk_a"));
    store
        .create(&task("tsk_a", "acme", 1000), &r1, None)
        .unwrap();
    store.put_route(&route("r2", None)).unwrap();
    let mut r2b = route("r2", None);
    r2b.deadline_ms = 99;
    store.put_route(&r2b).unwrap();
    let mut ids: Vec<_> = store.routes().unwrap();
    ids.sort_by(|a, b| a.route_id.cmp(&b.route_id));
    assert_eq!(ids, vec![r1, r2b]);
    store.remove_route("r1").unwrap();
    store.remove_route("nope").unwrap();
    assert_eq!(store.routes().unwrap().len(), 1);
    store.remove_route("r2").unwrap();
    assert!(store.routes().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn live_tasks_counter() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    for id in ["a1", "a2", "a3"] {
        store
            .create(&task(id, "acme", 1000), &route(id, None), None)
            .unwrap();
    }
    store
        .create(&task("b1", "beta", 1000), &route("b1", None), None)
        .unwrap();
    let mut done = task("a4", "acme", 1000);
    done.status = TaskStatus::Failed;
    store.create(&done, &route("a4", None), None).unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 3);
    assert_eq!(store.live_tasks("beta").unwrap(), 1);
    assert_eq!(store.live_tasks("nobody").unwrap(), 0);

    complete(&store, "a1");
    assert_eq!(store.live_tasks("acme").unwrap(), 2);
    // Non-status updates and terminal → terminal changes do not count.
    store
        .update("a2", &mut |t| {
            t.status = TaskStatus::InputRequired;
            true
        })
        .unwrap();
    store
        .update("a1", &mut |t| {
            t.status = TaskStatus::Cancelled;
            true
        })
        .unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 2);
    // Expiring a live task decrements, a terminal one does not.
    store.expire("a2", u64::MAX, 10).unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 1);
    store.expire("a1", u64::MAX, 10).unwrap();
    store.expire("a4", u64::MAX, 10).unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 1);
    store.expire("a3", u64::MAX, 10).unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 0);
    assert_eq!(store.live_tasks("beta").unwrap(), 1);

    // The counter is persisted.
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.live_tasks("beta").unwrap(), 1);
    assert_eq!(store.live_tasks("acme").unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn secret_is_stable_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let s1 = store.secret("request_state").unwrap();
    assert_eq!(store.secret("request_state").unwrap(), s1);
    let other = store.secret("other").unwrap();
    assert_ne!(s1, other);
    assert_ne!(s1, [0u8; 32]);
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.secret("request_state").unwrap(), s1);
    assert_eq!(store.secret("other").unwrap(), other);
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_identity_is_byte_exact_written_only_on_change_and_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.upstream_identity("demo").unwrap(), None);
    // Key order and number text exactly as the upstream sent them.
    let sent =
        r#"{"version":"1.0e0","name":"z-first","n":1.50,"big":123456789012345678901234567890}"#;
    let caps = r#"{"tools":{"listChanged":true},"experimental":{"b":1,"a":-0}}"#;
    let identity = UpstreamInfo {
        protocol_version: "2025-06-18".into(),
        server_info: serde_json::from_str(sent).unwrap(),
        capabilities: serde_json::from_str(caps).unwrap(),
        instructions: Some("hi".into()),
    };
    assert!(store.put_upstream_identity("demo", &identity).unwrap());
    // The same answer again (a re-initialising upstream) writes nothing.
    assert!(!store.put_upstream_identity("demo", &identity).unwrap());
    let other = UpstreamInfo {
        instructions: None,
        ..identity.clone()
    };
    assert!(store.put_upstream_identity("other", &other).unwrap());
    let raw = store.upstream_identity.get("other").unwrap().unwrap();
    let text = std::str::from_utf8(&raw).unwrap();
    assert!(!text.contains("instructions"), "{text}");
    store.flush().await.unwrap();
    drop(store);

    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let got = store.upstream_identity("demo").unwrap().unwrap();
    assert_eq!(got, identity);
    assert_eq!(serde_json::to_string(&got.server_info).unwrap(), sent);
    assert_eq!(
        serde_json::to_string(&Value::Object(got.capabilities)).unwrap(),
        caps
    );
    assert_eq!(store.upstream_identity("other").unwrap().unwrap(), other);
    // A different answer replaces the record.
    let changed = UpstreamInfo {
        server_info: serde_json::json!({"name": "z-first", "version": "2"}),
        ..identity
    };
    assert!(store.put_upstream_identity("demo", &changed).unwrap());
    assert_eq!(store.upstream_identity("demo").unwrap().unwrap(), changed);
    // A record of a newer schema is refused, naming tree and key.
    let mut newer = serde_json::to_value(StoredIdentity::current(&changed)).unwrap();
    newer["v"] = Value::from(SCHEMA_VERSION + 1);
    store
        .upstream_identity
        .insert("demo", serde_json::to_vec(&newer).unwrap())
        .unwrap();
    match store.upstream_identity("demo") {
        Err(StoreError::Corrupt(msg)) => {
            assert!(msg.what.contains("upstream_identity/demo"), "{msg}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn secret_concurrent_first_use_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let all: Vec<[u8; 32]> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| store.secret("k").unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(all.iter().all(|s| *s == all[0]));
}

#[tokio::test(flavor = "multi_thread")]
async fn durable_across_reopen() {
    for strict in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&cfg(dir.path(), strict)).unwrap();
        let key: &[u8] = b"k";
        let mut t = task("tsk_a", "acme", 1000);
        t.result = Some(serde_json::json!({"content": [{"type": "text", "text": "x"}]}));
        store
            .create(&t, &route("r1", Some("tsk_a")), Some(key))
            .unwrap();
        store.flush().await.unwrap();
        assert!(store.healthy());
        drop(store);
        let store = SledStore::open(&cfg(dir.path(), strict)).unwrap();
        assert_eq!(store.get("tsk_a").unwrap(), Some(t));
        assert_eq!(store.routes().unwrap().len(), 1);
        assert_eq!(
            store.idempotency_get(key).unwrap().unwrap().task_id,
            "tsk_a"
        );
        assert_eq!(store.expired(1000, 10).unwrap(), vec!["tsk_a"]);
        assert_eq!(store.live_tasks("acme").unwrap(), 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn strict_mode_syncs_large_blob_values() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), true)).unwrap();
    let mut t = task("tsk_big", "acme", 1000);
    t.result = Some(Value::String("x".repeat(4 * 1024 * 1024)));
    store.create(&t, &route("r", None), None).unwrap();
    store.flush().await.unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), true)).unwrap();
    assert_eq!(store.get("tsk_big").unwrap(), Some(t));
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_updates_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    store
        .create(&task("tsk_a", "acme", 1000), &route("ra", None), None)
        .unwrap();
    std::thread::scope(|s| {
        for i in 0..8 {
            let store = &store;
            s.spawn(move || {
                for j in 0..50 {
                    store
                        .update("tsk_a", &mut |t| {
                            t.issued_keys.push(format!("k{i}-{j}"));
                            true
                        })
                        .unwrap();
                }
            });
        }
    });
    let t = store.get("tsk_a").unwrap().unwrap();
    assert_eq!(
        t.issued_keys.len(),
        400,
        "every compare-and-swap retry re-applied"
    );
}

/// What a crash between two writes of one operation can leave behind (the
/// writes are ordered, not transactional) is repaired or ignored.
#[tokio::test(flavor = "multi_thread")]
async fn crash_leftovers_are_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    store
        .create(&task("tsk_a", "acme", 1000), &route("ra", None), None)
        .unwrap();
    // An update whose new expiry entry never landed: only the old entry is left.
    let mut t = store.get("tsk_a").unwrap().unwrap();
    t.expires_at_ms = 5000;
    store
        .tasks
        .insert("tsk_a", encode_task(&t).unwrap())
        .unwrap();
    // An expiry entry whose task is gone.
    store
        .expiry
        .insert(expiry_key(500, "tsk_gone"), &[])
        .unwrap();
    assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
    assert_eq!(store.expiry.len(), 1, "stale entries dropped");
    assert_eq!(
        store.expired(5000, 10).unwrap(),
        vec!["tsk_a"],
        "entry repaired"
    );

    // An idempotency claim whose task (and tombstone) never landed is taken over.
    let key: &[u8] = b"acme\0alice\0demo\0slow\0k";
    let orphan = StoredIdempotency {
        v: SCHEMA_VERSION,
        task_id: "tsk_never".into(),
        args_fingerprint: "fp".into(),
    };
    store
        .idempotency
        .insert(key, serde_json::to_vec(&orphan).unwrap())
        .unwrap();
    assert_eq!(store.idempotency_get(key).unwrap(), None, "reads as absent");
    assert_eq!(
        store
            .create(&task("tsk_b", "acme", 1000), &route("rb", None), Some(key))
            .unwrap(),
        Created::New
    );
    assert_eq!(
        store.idempotency_get(key).unwrap().unwrap().task_id,
        "tsk_b"
    );
    // ...but a claim whose task expired (tombstone) still answers Existing.
    store.expire("tsk_b", u64::MAX, 10_000).unwrap();
    assert!(matches!(
        store.create(&task("tsk_c", "acme", 1000), &route("rc", None), Some(key)),
        Ok(Created::Existing(e)) if e.task_id == "tsk_b"
    ));
    assert_eq!(store.get("tsk_c").unwrap(), None);
    let mut routes: Vec<String> = store
        .routes()
        .unwrap()
        .into_iter()
        .map(|r| r.route_id)
        .collect();
    routes.sort();
    assert_eq!(routes, ["ra", "rb"], "the losing create's route is undone");

    // Live entries of tasks that are gone or terminal are dropped at open.
    store
        .create(&task("tsk_d", "acme", 1000), &route("rd", None), None)
        .unwrap();
    store.live.insert(live_key("acme", "tsk_x"), &[]).unwrap();
    let mut done = store.get("tsk_a").unwrap().unwrap();
    done.status = TaskStatus::Completed;
    store
        .tasks
        .insert("tsk_a", encode_task(&done).unwrap())
        .unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 1, "only tsk_d is live");
    assert_eq!(store.live.len(), 1);
}

/// A store written before the live index kept counters in `meta/live/`: the first
/// open builds the index from the tasks and drops the counters.
#[tokio::test(flavor = "multi_thread")]
async fn live_index_is_built_for_an_older_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    for (id, tenant) in [("a1", "acme"), ("a2", "acme"), ("b1", "beta")] {
        store
            .create(&task(id, tenant, 1000), &route(id, None), None)
            .unwrap();
    }
    complete(&store, "a2");
    // Turn it into the older layout.
    store.live.clear().unwrap();
    store.meta.remove(META_LIVE_INDEX).unwrap();
    store
        .meta
        .insert(meta_key(META_LIVE, b"acme"), &7u64.to_be_bytes())
        .unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert_eq!(store.live_tasks("acme").unwrap(), 1);
    assert_eq!(store.live_tasks("beta").unwrap(), 1);
    assert_eq!(store.meta.scan_prefix(META_LIVE).count(), 0);
    assert!(store.meta.get(META_LIVE_INDEX).unwrap().is_some());
    // Keys with any tenant string round-trip.
    let k = live_key("te\0nant", "tsk_1");
    assert_eq!(split_live_key(&k), Some(("te\0nant", "tsk_1")));
}

fn listed(store: &SledStore, tenant: &str, upstream: &str) -> Vec<String> {
    store
        .list_owned(tenant, "alice", upstream, None, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.task_id)
        .collect()
}

/// A store written before the owner index (no `owner` entries, no
/// `meta/layout/owner_index`) gets it built from its records at the next open, once.
#[tokio::test(flavor = "multi_thread")]
async fn owner_index_is_built_once_for_an_older_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert!(
        store.meta.get(META_OWNER_INDEX).unwrap().is_some(),
        "a new store has it"
    );
    for (id, tenant, upstream, at) in [
        ("a2", "acme", "demo", 20),
        ("a1", "acme", "demo", 10),
        ("a3", "acme", "other", 5),
        ("b1", "beta", "demo", 1),
    ] {
        let rec = TaskRecord {
            upstream: upstream.into(),
            created_at_ms: at,
            ..task(id, tenant, u64::MAX)
        };
        store.create(&rec, &route(id, None), None).unwrap();
    }
    complete(&store, "a2");
    assert_eq!(listed(&store, "acme", "demo"), ["a1", "a2"]);
    // Turn it into the older layout.
    store.owner.clear().unwrap();
    store.meta.remove(META_OWNER_INDEX).unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert!(store.meta.get(META_OWNER_INDEX).unwrap().is_some());
    assert_eq!(listed(&store, "acme", "demo"), ["a1", "a2"]);
    assert_eq!(listed(&store, "acme", "other"), ["a3"]);
    assert_eq!(listed(&store, "beta", "demo"), ["b1"]);
    assert_eq!(store.owner.len(), 4);
    // Built once: with the marker in place, an open does not scan the tasks again.
    store.owner.clear().unwrap();
    store.flush().await.unwrap();
    drop(store);
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    assert!(listed(&store, "acme", "demo").is_empty());
}

/// What a cut-short write leaves in the owner index: an entry without its task (a
/// `create` cut short, or an `expire` cut short after the task's removal) is skipped by
/// a listing; the second kind is dropped by `expired`, which its expiry entry still
/// leads to.
#[tokio::test(flavor = "multi_thread")]
async fn owner_entry_leftovers_are_skipped_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let at = |id: &str, created: u64| TaskRecord {
        created_at_ms: created,
        ..task(id, "acme", u64::MAX)
    };
    store
        .create(&at("tsk_1", 10), &route("r1", None), None)
        .unwrap();
    store
        .create(&at("tsk_3", 30), &route("r3", None), None)
        .unwrap();
    // A create cut short before its task: index entries only.
    let cut = owner_key("acme", "alice", "demo", 20, "tsk_2");
    store.owner.insert(&cut, &[]).unwrap();
    assert_eq!(listed(&store, "acme", "demo"), ["tsk_1", "tsk_3"]);
    let page = store.list_owned("acme", "alice", "demo", None, 2).unwrap();
    assert_eq!(page.len(), 2, "a skipped entry does not shorten the page");
    // An expire cut short after the task's removal: tombstone, expiry entry and owner
    // entry remain.
    let gone = owner_key("acme", "alice", "demo", 40, "tsk_4");
    store.owner.insert(&gone, &[]).unwrap();
    let tomb = Tombstone {
        v: SCHEMA_VERSION,
        task_id: "tsk_4".into(),
        tenant: "acme".into(),
        subject: "alice".into(),
        idempotency_index_key: None,
        expires_at_ms: u64::MAX,
    };
    store
        .tombstones
        .insert("tsk_4", encode("tombstones", "tsk_4", &tomb).unwrap())
        .unwrap();
    store.expiry.insert(expiry_key(500, "tsk_4"), &[]).unwrap();
    assert_eq!(store.expired(1000, 10).unwrap(), Vec::<String>::new());
    assert_eq!(store.owner.get(&gone).unwrap(), None);
    assert!(
        store.owner.get(&cut).unwrap().is_some(),
        "no tombstone: left"
    );
    assert_eq!(listed(&store, "acme", "demo"), ["tsk_1", "tsk_3"]);
    // A whole expire removes the entry with the task.
    store
        .update("tsk_1", &mut |t| {
            t.expires_at_ms = 5;
            true
        })
        .unwrap();
    store.expire("tsk_1", 10, 100).unwrap().unwrap();
    assert_eq!(listed(&store, "acme", "demo"), ["tsk_3"]);
    assert_eq!(store.owner.len(), 2, "tsk_3's entry and the cut create's");
}

#[test]
fn owner_keys_are_unambiguous_and_split_back() {
    let k = owner_key("te\0n", "su\0b", "up", 0x0102_0304_0506_0708, "tsk_x");
    assert_eq!(split_owner_key(&k), Some((0x0102_0304_0506_0708, "tsk_x")));
    assert!(k.starts_with(&owner_prefix("te\0n", "su\0b", "up")));
    // Parts that run into each other when joined stay apart.
    let parts = [
        ("ab", "c", "d"),
        ("a", "bc", "d"),
        ("a", "b", "cd"),
        ("a", "b", "c"),
        ("a\0b", "c", "d"),
    ];
    for (i, a) in parts.iter().enumerate() {
        for (j, b) in parts.iter().enumerate() {
            let key = owner_key(b.0, b.1, b.2, 7, "tsk_1");
            assert_eq!(
                key.starts_with(&owner_prefix(a.0, a.1, a.2)),
                i == j,
                "{a:?} / {b:?}"
            );
        }
    }
    assert_eq!(split_owner_key(b"\0\0"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn schema_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    // A newer record is refused, naming tree and key.
    let mut newer = serde_json::to_value(task("tsk_new", "acme", 1)).unwrap();
    newer["v"] = Value::from(SCHEMA_VERSION + 1);
    store
        .tasks
        .insert("tsk_new", serde_json::to_vec(&newer).unwrap())
        .unwrap();
    match store.get("tsk_new") {
        Err(StoreError::Corrupt(msg)) => {
            assert!(msg.what.contains("tasks/tsk_new"), "{msg}");
            assert!(msg.what.contains("schema version"), "{msg}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // An older record without `v` and without optional fields is upgraded.
    let old = serde_json::json!({
        "task_id": "tsk_old", "tenant": "acme", "subject": "alice",
        "upstream": "demo", "tool": "slow", "args_fingerprint": "fp",
        "status": "working", "created_at_ms": 1, "last_updated_at_ms": 1,
        "ttl_ms": 10, "poll_interval_ms": 1000, "expires_at_ms": 11
    });
    store
        .tasks
        .insert("tsk_old", serde_json::to_vec(&old).unwrap())
        .unwrap();
    let rec = store.get("tsk_old").unwrap().unwrap();
    assert_eq!(rec.v, SCHEMA_VERSION);
    assert!(rec.input_requests.is_empty() && rec.issued_keys.is_empty());
    assert!(!rec.cancel_requested && rec.result.is_none());
    let old_route = serde_json::json!({
        "v": 0, "route_id": "r", "upstream": "demo", "tenant": "acme",
        "subject": "alice", "method": "tools/call", "started_at_ms": 1, "deadline_ms": 2
    });
    store
        .routes
        .insert("r", serde_json::to_vec(&old_route).unwrap())
        .unwrap();
    assert_eq!(store.routes().unwrap()[0].task_id, None);
    // A store written by a newer gateway is refused at open.
    store
        .meta
        .insert(META_SCHEMA, &(SCHEMA_VERSION + 1).to_be_bytes())
        .unwrap();
    store.flush().await.unwrap();
    drop(store);
    match SledStore::open(&cfg(dir.path(), false)) {
        Err(StoreError::Corrupt(msg)) => assert!(msg.what.contains("schema version"), "{msg}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn second_open_of_a_live_store_fails_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let _store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    match SledStore::open(&cfg(dir.path(), false)) {
        Err(e @ StoreError::Locked(_)) => {
            let msg = e.to_string();
            assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
            assert!(msg.contains("another running taskgate"), "{msg}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
}

#[test]
fn open_outside_runtime_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    match SledStore::open(&cfg(dir.path(), false)) {
        Err(e @ StoreError::Setup(SetupError::NoRuntime { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains(&dir.path().display().to_string()), "{msg}")
        }
        other => panic!("expected NoRuntime, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn open_error_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let path = file.join("store");
    match SledStore::open(&cfg(&path, false)) {
        Err(e @ StoreError::Io(IoError::Sled { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            // sled's own error is kept as the source.
            let sled = std::error::Error::source(&e)
                .and_then(std::error::Error::source)
                .and_then(|s| s.downcast_ref::<std::sync::Arc<sled::Error>>());
            assert!(sled.is_some(), "{e:?}");
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

const CRASH_ENV: &str = "TASKGATE_STORE_CRASH_DIR";
const CRASH_N: usize = 500;

/// Child half of `crash_after_flush_keeps_flushed_writes`; a no-op unless the
/// parent set `CRASH_ENV`.
#[tokio::test(flavor = "multi_thread")]
async fn crash_writer() {
    let Ok(dir) = std::env::var(CRASH_ENV) else {
        return;
    };
    let store = SledStore::open(&cfg(Path::new(&dir), false)).unwrap();
    for i in 0..CRASH_N {
        let id = format!("tsk_{i}");
        store
            .create(&task(&id, "acme", 1000), &route(&id, Some(&id)), None)
            .unwrap();
    }
    store.flush().await.unwrap();
    println!("FLUSHED");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    // Keep writing (unflushed) until killed, fast enough that log buffers fill
    // and reach the file on their own, so the kill can cut a create short.
    for i in 0.. {
        let id = format!("late_{i}");
        store
            .create(&task(&id, "acme", 1000), &route(&id, Some(&id)), None)
            .unwrap();
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_after_flush_keeps_flushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "store::sled::tests::crash_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_ENV, dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut flushed = false;
    for line in std::io::BufReader::new(stdout).lines() {
        if line.unwrap().contains("FLUSHED") {
            flushed = true;
            break;
        }
    }
    assert!(flushed, "writer exited before FLUSHED");
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    for i in 0..CRASH_N {
        let id = format!("tsk_{i}");
        assert!(store.get(&id).unwrap().is_some(), "{id} lost after crash");
    }
    // Whatever the kill cut short is consistent: a task never exists without its
    // route (written first), live entries only for stored tasks, and the expiry
    // index names only stored tasks.
    let routes: std::collections::HashSet<String> = store
        .routes()
        .unwrap()
        .into_iter()
        .map(|r| r.route_id)
        .collect();
    let indexed: std::collections::HashSet<String> = store
        .expiry
        .iter()
        .map(|kv| String::from_utf8(kv.unwrap().0[8..].to_vec()).unwrap())
        .collect();
    for kv in store.tasks.iter() {
        let (k, _) = kv.unwrap();
        let id = String::from_utf8(k.to_vec()).unwrap();
        assert!(routes.contains(&id), "task {id} survived without its route");
        assert!(
            indexed.contains(&id),
            "task {id} survived without an expiry entry"
        );
    }
    let live = store.live_tasks("acme").unwrap() as usize;
    assert!(live >= CRASH_N && live <= store.tasks.len(), "{live}");
    for id in store.expired(u64::MAX, usize::MAX).unwrap() {
        assert!(store.get(&id).unwrap().is_some(), "{id}");
    }
    eprintln!(
        "crash test: {CRASH_N} flushed tasks survived SIGKILL ({} tasks total, incl. unflushed)",
        store.tasks.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn session_owner_leftovers_are_dropped() {
    use super::schema::session_owner_key;
    use crate::store::SessionCreated;
    use crate::store::test_records::session;
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&cfg(dir.path(), false)).unwrap();
    let kept = session("mcs_kept", "acme", "alice", 10);
    assert_eq!(store.create_session(&kept, 2).unwrap(), SessionCreated::New);
    // A create cut short after its owner entry, and a delete cut short before its
    // owner entry went: two entries without a session.
    for id in ["mcs_never", "mcs_deleted"] {
        let k = session_owner_key("acme", "alice", id);
        store.session_owner.insert(k, &[]).unwrap();
    }
    assert_eq!(store.session_owner.len(), 3);
    // At the cap they do not count, and are dropped.
    let next = session("mcs_next", "acme", "alice", 20);
    assert_eq!(store.create_session(&next, 2).unwrap(), SessionCreated::New);
    assert_eq!(store.session_owner.len(), 2);
    // The idle sweep drops them too.
    let k = session_owner_key("acme", "alice", "mcs_again");
    store.session_owner.insert(k, &[]).unwrap();
    assert_eq!(store.idle_sessions(15, 10).unwrap(), vec!["mcs_kept"]);
    assert_eq!(store.session_owner.len(), 2);
    // Deleting a session removes its entry.
    assert!(store.delete_session("mcs_kept", None).unwrap());
    assert_eq!(store.session_owner.len(), 1);
}
