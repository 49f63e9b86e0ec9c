//! Group-commit throughput of the sled store (`harness = false`; it used to be the
//! `group_commit_throughput` unit test of `src/store/sled`): 64 concurrent writers ×
//! 200 create+flush each, for normal and strict mode and both sled modes (51,200
//! durable operations in all). Prints, does not assert, throughput and latency.
//!
//! `cargo bench --bench store_throughput`. Side-by-side rows matter more than absolute
//! numbers: the machine is shared.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use taskgate::config::StoreConfig;
use taskgate::store::sled::SledStore;
use taskgate::store::{Created, TaskStore};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{route, task};

fn cfg(path: &Path, strict: bool) -> StoreConfig {
    StoreConfig {
        path: path.to_path_buf(),
        strict_fsync: strict,
        cache_capacity_bytes: 64 * 1024 * 1024,
        ..StoreConfig::default()
    }
}

async fn task_count(store: &SledStore) -> usize {
    let counts = store.count_by_status().await.unwrap();
    counts.iter().map(|(_, n)| *n as usize).sum()
}

async fn group_commit_run(strict: bool, mode: sled::Mode, label: &str) {
    const WRITERS: usize = 64;
    const PER: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<SledStore> = SledStore::open_with_mode(&cfg(dir.path(), strict), mode).unwrap();
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(PER);
            for i in 0..PER {
                let id = format!("tsk_{w}_{i}");
                let key = format!("key_{w}_{i}");
                let t0 = Instant::now();
                let mut t = task(&id, "acme", "alice", 3_600_000);
                t.result = Some(serde_json::json!({"content": [{"type": "text", "text": "ok"}]}));
                let r = store
                    .create(&t, &route(&id, &id, "acme", "alice"), Some(key.as_bytes()))
                    .await
                    .unwrap();
                assert_eq!(r, Created::New);
                store.flush().await.unwrap();
                lat.push(t0.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    let elapsed = start.elapsed();
    lat.sort();
    let n = lat.len();
    let p = |q: f64| lat[((n as f64 * q) as usize).min(n - 1)];
    println!(
        "group commit [{label}]: {n} create+flush in {:.2?} = {:.0} durable ops/s; \
         p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        elapsed,
        n as f64 / elapsed.as_secs_f64(),
        p(0.50),
        p(0.99),
        lat[n - 1]
    );
    let (rounds, waiters, micros) = store.flush_round_stats();
    println!(
        "    {rounds} flush rounds, {:.1} waiters/round, {:.0} µs/round",
        waiters as f64 / rounds as f64,
        micros as f64 / rounds as f64
    );
    assert_eq!(task_count(&store).await, WRITERS * PER);
    assert_eq!(
        store.live_tasks("acme").await.unwrap() as usize,
        WRITERS * PER
    );
    drop(store);
    let store = SledStore::open_with_mode(&cfg(dir.path(), strict), mode).unwrap();
    assert_eq!(task_count(&store).await, WRITERS * PER);
    for w in 0..WRITERS {
        for i in 0..PER {
            let key = format!("key_{w}_{i}");
            let entry = store.idempotency_get(key.as_bytes()).await.unwrap();
            assert!(
                entry.is_some(),
                "idempotency claim {key} lost across reopen"
            );
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        group_commit_run(false, sled::Mode::HighThroughput, "normal, HighThroughput").await;
        group_commit_run(false, sled::Mode::LowSpace, "normal, LowSpace").await;
        group_commit_run(true, sled::Mode::HighThroughput, "strict, HighThroughput").await;
        group_commit_run(true, sled::Mode::LowSpace, "strict, LowSpace").await;
    });
}
