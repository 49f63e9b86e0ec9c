//! sled next to PostgreSQL in one run, at the `TaskStore` level: durable creations/s
//! (create + flush, so the id could go out) and reads/s at 1, 16 and 64 concurrent
//! callers, the latency of one creation, the time to migrate and open, and the
//! database's WAL flush count for the run (`pg_stat_wal`: this disk's flush latency
//! moves a lot, so a row means little without it).
//!
//! Run: `bash scripts/pg.sh run cargo bench --bench store_backends` (needs
//! `TASKGATE_TEST_PG_URL`; rows go to stdout as a markdown table).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use taskgate::config::StoreConfig;
use taskgate::store::TaskStore;
use taskgate::store::postgres::{PgSettings, PgStore};
use taskgate::store::sled::SledStore;

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/pg_stats.rs"]
#[allow(dead_code)] // the statement counts are the load harness's
mod pg_stats;
use pg_stats::wal_syncs;

const RUN: Duration = Duration::from_secs(3);

/// Operations per second with `c` callers for [`RUN`]; `op(n)` does operation `n`.
async fn rate<F, Fut>(c: usize, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..c {
        let (op, next) = (op.clone(), next.clone());
        set.spawn(async move {
            while start.elapsed() < RUN {
                op(next.fetch_add(1, Ordering::Relaxed)).await;
            }
        });
    }
    while set.join_next().await.is_some() {}
    next.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn create(store: &dyn TaskStore, prefix: &str, n: u64) {
    let id = format!("tsk_{prefix}_{n:012}");
    let route_id = format!("rt_{prefix}_{n:012}");
    let (rec, route) = (
        fixtures::task(&id, "acme", "alice", 3_600_000),
        fixtures::route(&route_id, &id, "acme", "alice"),
    );
    store.create(&rec, &route, None).await.unwrap();
    store.flush().await.unwrap();
}

async fn rows(name: &str, store: Arc<dyn TaskStore>, prefix: &str) {
    // One creation's latency (median of 200, one at a time).
    let mut lat = Vec::new();
    for n in 0..200u64 {
        let t = Instant::now();
        create(store.as_ref(), &format!("{prefix}l"), n).await;
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "| {name} | create latency c=1 | p50 {:.2} ms, p99 {:.2} ms |",
        lat[100].as_secs_f64() * 1e3,
        lat[198].as_secs_f64() * 1e3
    );
    for c in [1usize, 16, 64] {
        let s = store.clone();
        let p = format!("{prefix}{c}");
        let r = rate(c, move |n| {
            let (s, p) = (s.clone(), p.clone());
            async move { create(s.as_ref(), &p, n).await }
        })
        .await;
        println!("| {name} | durable creates/s c={c} | {r:.0} |");
    }
    for c in [1usize, 16, 64] {
        let s = store.clone();
        let p = format!("{prefix}1");
        let r = rate(c, move |n| {
            let (s, p) = (s.clone(), p.clone());
            async move {
                let id = format!("tsk_{p}_{:012}", n % 100);
                assert!(s.get(&id).await.unwrap().is_some());
            }
        })
        .await;
        println!("| {name} | gets/s c={c} | {r:.0} |");
    }
}

fn main() {
    let Ok(url) = std::env::var("TASKGATE_TEST_PG_URL") else {
        eprintln!("TASKGATE_TEST_PG_URL is not set: run under `bash scripts/pg.sh run …`");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("| backend | measure | value |\n|---|---|---|");
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            path: dir.path().join("data"),
            ..StoreConfig::default()
        };
        let t = Instant::now();
        let sled: Arc<dyn TaskStore> = SledStore::open(&cfg).unwrap();
        println!("| sled | open | {:.1} ms |", t.elapsed().as_secs_f64() * 1e3);
        rows("sled", sled, "s").await;

        let settings = PgSettings {
            url: url.clone(),
            pool_size: 64,
            schema: format!("bench_{}", std::process::id()),
            lease_ms: 10_000,
            pooler: Default::default(),
        };
        let t = Instant::now();
        let pg: Arc<dyn TaskStore> = PgStore::open(&settings).await.unwrap();
        println!(
            "| postgres | migrate (fresh schema) + open | {:.1} ms |",
            t.elapsed().as_secs_f64() * 1e3
        );
        let t = Instant::now();
        drop(PgStore::open(&settings).await.unwrap());
        println!(
            "| postgres | open (schema up to date) | {:.1} ms |",
            t.elapsed().as_secs_f64() * 1e3
        );
        let before = wal_syncs(&url).await;
        let t = Instant::now();
        rows("postgres", pg, "p").await;
        let syncs = wal_syncs(&url).await - before;
        println!(
            "| postgres | WAL flushes (pg_stat_wal.wal_sync) during its rows | {syncs} in {:.1} s |",
            t.elapsed().as_secs_f64()
        );
    });
}
