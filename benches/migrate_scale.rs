//! `taskgate store migrate` on a large sled store (`harness = false`; by hand, not in
//! CI): seeds `--tasks N` completed tasks (default 1,000,000) with the store API —
//! every third with an idempotency claim, every second read by its owner, and a few
//! left in flight — then, against the PostgreSQL cluster of `TASKGATE_TEST_PG_URL`,
//! runs the release binary's `store migrate` twice under `/usr/bin/time -v` (the
//! move, then a rerun that copies nothing) and prints the wall time and peak RSS of
//! each (benches/RESULTS.md "Moving 1M tasks from sled to PostgreSQL").
//!
//! `cargo build --release && bash scripts/pg.sh run cargo bench --bench migrate_scale --
//! --tasks 1000000` (`--dir D` keeps the seeded store in `D` and reuses it when it is
//! there; `--batch-size B` is passed on).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::json;
use taskgate::config::StoreConfig;
use taskgate::store::sled::SledStore;
use taskgate::store::{TaskRecord, TaskStatus, TaskStore};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{route, task};

/// Tasks left in flight (their routes stay), failed by the move.
const IN_FLIGHT: u64 = 10;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// `n` completed tasks and [`IN_FLIGHT`] working ones into the sled store at `data`.
async fn seed(data: &Path, n: u64) {
    let cfg = StoreConfig {
        path: data.to_path_buf(),
        ..StoreConfig::default()
    };
    let store = SledStore::open(&cfg).unwrap();
    let result = json!({"content": [{"type": "text", "text": "hello from the seeded store"}],
                        "isError": false});
    let mut read = Vec::new();
    for i in 0..n + IN_FLIGHT {
        let id = format!("tsk_seed_{i:08}");
        let (tenant, subject) = (format!("t{}", i % 10), format!("s{}", i % 1000));
        let rec = if i < n {
            TaskRecord {
                status: TaskStatus::Completed,
                result: Some(result.clone()),
                ..task(&id, &tenant, &subject, 86_400_000)
            }
        } else {
            task(&id, &tenant, &subject, 86_400_000)
        };
        let route_id = format!("rt_seed_{i}");
        let key = format!("key-{i}");
        let key = (i % 3 == 0).then_some(key.as_bytes());
        store
            .create(&rec, &route(&route_id, &id, &tenant, &subject), key)
            .await
            .unwrap();
        if i < n {
            store.remove_route(&route_id).await.unwrap();
            if i % 2 == 0 {
                read.push(id);
            }
        }
        if read.len() >= 1000 {
            store.mark_seen(&read).await.unwrap();
            read.clear();
            store.flush().await.unwrap();
        }
    }
    store.mark_seen(&read).await.unwrap();
    store.flush().await.unwrap();
}

/// Wall seconds and peak RSS (MB) of one run of the migrate command, from `time -v`.
fn timed_migrate(bin: &Path, data: &Path, url: &str, schema: &str, batch: &str) -> (f64, u64) {
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(bin)
        .args(["store", "migrate", "--from"])
        .arg(data)
        .args(["--to", url, "--schema", schema, "--batch-size", batch])
        .output()
        .expect("/usr/bin/time (Debian package `time`)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}");
    let field = |name: &str| {
        stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    // `h:mm:ss` or `m:ss.ss`.
    let wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss):")
        .split(':')
        .fold(0.0, |acc, part| {
            acc * 60.0 + part.parse::<f64>().unwrap_or(0.0)
        });
    let rss_kb: u64 = field("Maximum resident set size (kbytes):")
        .parse()
        .unwrap_or(0);
    (wall, rss_kb / 1024)
}

fn dir_mb(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += if m.is_dir() {
                dir_mb(&e.path()) << 20
            } else {
                m.len()
            };
        }
    }
    total >> 20
}

fn main() {
    let n: u64 = arg("--tasks")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let batch = arg("--batch-size").unwrap_or_else(|| "1000".into());
    let tmp = tempfile::tempdir().unwrap();
    let dir = arg("--dir")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().into());
    let data = dir.join("data");
    if !data.join("db").is_file() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let t0 = Instant::now();
        rt.block_on(seed(&data, n));
        println!(
            "seeded {n} tasks (+{IN_FLIGHT} in flight) in {:.1} s, {} MB on disk",
            t0.elapsed().as_secs_f64(),
            dir_mb(&data)
        );
    }
    let Ok(url) = std::env::var("TASKGATE_TEST_PG_URL") else {
        println!("TASKGATE_TEST_PG_URL is not set: seeded only (run under scripts/pg.sh)");
        return;
    };
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_taskgate"));
    let schema = format!("bench_migrate_{}", std::process::id());
    let (wall, rss) = timed_migrate(&bin, &data, &url, &schema, &batch);
    println!(
        "| move | {n} | {batch} | {wall:.1} s | {:.0} tasks/s | {rss} MB |",
        n as f64 / wall
    );
    let (wall, rss) = timed_migrate(&bin, &data, &url, &schema, &batch);
    println!(
        "| rerun (copies nothing) | {n} | {batch} | {wall:.1} s | {:.0} tasks/s | {rss} MB |",
        n as f64 / wall
    );
}
