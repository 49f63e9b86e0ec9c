//! Several replicas on one PostgreSQL schema (README "Several replicas"), in one run:
//! durable creations/s with 1, 2 and 3 replicas (requests spread round-robin), the
//! latency of a cancel sent to a replica that does not hold the call until the
//! upstream sees it (against one sent to the holder), and the takeover time after a
//! `kill -9` of the holder.
//!
//! Everything shares the machine's cores (client, replicas, upstream, database): more
//! replicas cannot add CPU here, so the creation rows measure the cost of spreading,
//! reported as per-replica efficiency `rate(n) / (n × rate(1))`.
//!
//! Needs `TASKGATE_TEST_PG_URL` (`bash scripts/pg.sh run cargo bench --bench load --
//! --only replicas`); without it the section says so instead of running.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use http::HeaderValue;
use http_body_util::BodyExt;

use super::harness::{RUNS, check_task_created, run_load};
use super::pg_stats::{reset_statements, statements, tasks_in};
use super::processes::{
    Gateway, Proc, cpu_secs_of, gateway_config, pg_cpu_secs, start_gateway_with,
};
use super::report::{Report, err_note, ms};
use super::requests::{gw_req, token};
use super::{HttpClient, META_TASKS, MakeReq, Opts, pg_url};

const LEASE_MS: u64 = 2_000;
const RENEW_MS: u64 = 500;
const SWEEP_MS: u64 = 500;
const CONC: usize = 16;
const CANCEL_TRIALS: usize = 10;
const TAKEOVER_TRIALS: usize = 3;
const TAKEOVER_TASKS: usize = 5;

fn replica_config(dir: &Path, up: SocketAddr, url: &str, schema: &str, id: &str) -> String {
    gateway_config(&dir.join("data"), up)
        .replacen(
            "[server]\n",
            &format!("[server]\nreplica_id = \"{id}\"\n"),
            1,
        )
        .replacen(
            "[store]\n",
            &format!(
                "[store]\nbackend = \"postgres\"\nurl = \"{url}\"\nschema = \"{schema}\"\n\
                 lease_ms = {LEASE_MS}\nlease_renew_ms = {RENEW_MS}\nsweep_interval_ms = {SWEEP_MS}\n"
            ),
            1,
        )
}

pub(super) fn start_replicas(
    work: &Path,
    up: SocketAddr,
    url: &str,
    schema: &str,
    n: usize,
) -> Vec<Gateway> {
    (0..n)
        .map(|i| {
            let dir = work.join(format!("{schema}-r{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            start_gateway_with(
                &dir,
                &replica_config(&dir, up, url, schema, &format!("r{i}")),
            )
        })
        .collect()
}

pub(super) fn bearer() -> HeaderValue {
    HeaderValue::from_str(&format!("Bearer {}", token("carol", "acme"))).unwrap()
}

async fn call(
    c: &HttpClient,
    addr: SocketAddr,
    method: &str,
    name: &str,
    params: &str,
) -> serde_json::Value {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{{params},{META_TASKS}}}}}"#
    );
    let resp = c
        .request(gw_req(addr, &bearer(), method, name, body))
        .await
        .unwrap();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null)
}

pub(super) async fn create(c: &HttpClient, addr: SocketAddr, ms: u64) -> String {
    let v = call(
        c,
        addr,
        "tools/call",
        "sleep",
        &format!(r#""name":"sleep","arguments":{{"ms":{ms}}}"#),
    )
    .await;
    v["result"]["taskId"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub(super) async fn status(c: &HttpClient, addr: SocketAddr, id: &str) -> String {
    let v = call(c, addr, "tasks/get", id, &format!(r#""taskId":"{id}""#)).await;
    v["result"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// How many `notifications/cancelled` the demo upstream has seen (its `stats` tool).
async fn cancelled(c: &HttpClient, addr: SocketAddr) -> u64 {
    let v = call(
        c,
        addr,
        "tools/call",
        "stats",
        r#""name":"stats","arguments":{}"#,
    )
    .await;
    let text = v["result"]["content"][0]["text"].as_str().unwrap_or("{}");
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|s| s["cancelled"].as_u64())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Time from a `tasks/cancel` sent to `to` until the upstream saw the cancellation of
/// a call held by `holder`.
async fn cancel_latency(c: &HttpClient, holder: SocketAddr, to: SocketAddr) -> Duration {
    let id = create(c, holder, 60_000).await;
    while status(c, to, &id).await != "working" {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = cancelled(c, holder).await;
    let t0 = Instant::now();
    call(c, to, "tasks/cancel", &id, &format!(r#""taskId":"{id}""#)).await;
    while cancelled(c, holder).await <= before && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t0.elapsed()
}

pub(super) fn replicas(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    demo: &Proc,
    up: SocketAddr,
    work: &Path,
) {
    let mut creation_costs = Vec::new();
    rep.section(
        "Several replicas on one PostgreSQL schema (same run)",
        &[
            "measure",
            "replicas",
            "value",
            "p50",
            "p99",
            "gateway CPU µs/req",
            "errors",
        ],
    );
    let Some(url) = pg_url(rep, "Replica rows") else {
        return;
    };
    let pid = std::process::id();

    // Durable creations, spread round-robin over n replicas: the counts per task at
    // 1, 2 and 3 replicas, in interleaved runs (1, 2, 3, 1, 2, 3, …), each on a fresh
    // schema with its replicas started for it, so its statements are its own.
    let mut by_n: Vec<Vec<CreationRun>> = vec![Vec::new(); 3];
    for round in 0..RUNS {
        for n in 1..=3 {
            let schema = format!("bench_rep{n}_{round}_{pid}");
            by_n[n - 1].push(creation_run(rt, o, c, demo, up, work, &url, &schema, n));
        }
    }
    let mut one = None;
    for (i, mut runs) in by_n.into_iter().enumerate() {
        let n = i + 1;
        runs.sort_by(|a, b| a.stats.rps().total_cmp(&b.stats.rps()));
        let med = |f: &dyn Fn(&CreationRun) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let m = CreationMedians {
            statements: med(&|r| r.statements),
            notifies: med(&|r| r.notifies),
            gateway: med(&|r| r.gateway_us),
            pg: med(&|r| r.pg_us),
            upstream: med(&|r| r.upstream_us),
            client: med(&|r| r.client_us),
        };
        let s = &runs[runs.len() / 2].stats;
        let base = *one.get_or_insert((s.rps(), m.statements, m.gateway));
        rep.row(&[
            format!("durable creations/s, c={CONC}"),
            n.to_string(),
            format!("{:.0} ({:.2}× one replica)", s.rps(), s.rps() / base.0),
            ms(s.p50()),
            ms(s.p99()),
            format!("{:.0} ({:.2}×)", m.gateway, m.gateway / base.2),
            format!("{}{}", s.errors + s.refused, err_note(s)),
        ]);
        creation_costs.push((n, m, base.1));
    }
    // Cancel latency: to the holder, and to the other replica (a relay).
    let schema = format!("bench_cancel_{pid}");
    let gws = start_replicas(work, up, &url, &schema, 2);
    let (a, b) = (gws[0].addr, gws[1].addr);
    let (direct, relayed) = rt.block_on(async {
        let mut d = Vec::new();
        let mut r = Vec::new();
        for _ in 0..CANCEL_TRIALS {
            d.push(cancel_latency(c, a, a).await);
            r.push(cancel_latency(c, a, b).await);
        }
        (d, r)
    });
    for (what, v) in [
        ("cancel → upstream, sent to the holder", direct),
        ("cancel → upstream, sent to another replica", relayed),
    ] {
        let p99 = v.iter().max().copied().unwrap_or_default();
        let p50 = median(v);
        rep.row(&[
            what.into(),
            "2".into(),
            format!("{CANCEL_TRIALS} trials"),
            ms(p50.as_micros() as f64),
            format!("{} (max)", ms(p99.as_micros() as f64)),
            "-".into(),
            "0".into(),
        ]);
    }
    drop(gws);

    // Takeover: kill -9 the holder of TAKEOVER_TASKS calls; time until the other
    // replica reports every one failed.
    let mut times = Vec::new();
    for t in 0..TAKEOVER_TRIALS {
        let schema = format!("bench_takeover{t}_{pid}");
        let mut gws = start_replicas(work, up, &url, &schema, 2);
        let (a, b) = (gws[0].addr, gws[1].addr);
        let elapsed = rt.block_on(async {
            let mut ids = Vec::new();
            for _ in 0..TAKEOVER_TASKS {
                ids.push(create(c, a, 120_000).await);
            }
            for id in &ids {
                while status(c, b, id).await != "working" {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            // SIGKILL: the replica gets no chance to hand anything over.
            let _ = gws[0].proc.child.kill();
            let _ = gws[0].proc.child.wait();
            let t0 = Instant::now();
            for id in &ids {
                while status(c, b, id).await != "failed" && t0.elapsed() < Duration::from_secs(60) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            t0.elapsed()
        });
        times.push(elapsed);
        drop(gws);
    }
    let max = times.iter().max().copied().unwrap_or_default();
    rep.row(&[
        format!("takeover after kill -9 ({TAKEOVER_TASKS} calls)"),
        "2".into(),
        format!("{TAKEOVER_TRIALS} trials"),
        ms(median(times).as_micros() as f64),
        format!("{} (max)", ms(max.as_micros() as f64)),
        "-".into(),
        "0".into(),
    ]);
    rep.note(&format!(
        "Replica rows: lease_ms = {LEASE_MS}, lease_renew_ms = {RENEW_MS}, sweep_interval_ms = {SWEEP_MS} (the takeover bound is their sum plus the poll step); creations are `tools/call sleep {{ms:100}}` with promote_after_ms = 0 at c = {CONC}, spread round-robin; the 1-, 2- and 3-replica runs interleaved (1, 2, 3, 1, 2, 3, …), each on a fresh schema with its replicas started for it; each row the median run by creations/s, CPU the median per task (warm-up included: all tasks the schema holds afterwards) summed over the replicas. Client, replicas, the HTTP demo upstream and PostgreSQL share 2 cores."
    ));
    rep.section(
        "What a task costs each process at 1, 2 and 3 replicas (same runs, medians)",
        &[
            "replicas",
            "PostgreSQL statements per task (top level)",
            "vs one replica",
            "of which pg_notify",
            "replicas' CPU µs/task",
            "PostgreSQL CPU µs/task",
            "upstream CPU µs/task",
            "client CPU µs/task",
        ],
    );
    for (n, m, one_statements) in creation_costs {
        rep.row(&[
            n.to_string(),
            format!("{:.2}", m.statements),
            format!("{:.2}×", m.statements / one_statements),
            format!("{:.2}", m.notifies),
            format!("{:.0}", m.gateway),
            format!("{:.0}", m.pg),
            format!("{:.0}", m.upstream),
            format!("{:.0}", m.client),
        ]);
    }
    rep.note(
        "Statements: every top-level statement of the database during the run and its drain \
         (pg_stat_statements, reset per run), leases, relay polls and fan-out included, over \
         the tasks created. PostgreSQL CPU: the postmaster, its backends and the children it \
         reaped. The capacity model in benches/RESULTS.md is built from this table.",
    );
}

/// One interleaved creation run's figures, per task.
#[derive(Clone)]
struct CreationRun {
    stats: super::harness::Stats,
    statements: f64,
    /// Of `statements`, the change fan-out's `pg_notify` batches.
    notifies: f64,
    gateway_us: f64,
    pg_us: f64,
    upstream_us: f64,
    client_us: f64,
}

struct CreationMedians {
    statements: f64,
    notifies: f64,
    gateway: f64,
    pg: f64,
    upstream: f64,
    client: f64,
}

/// Start `n` replicas on `schema`, create tasks round-robin over them at c = [`CONC`],
/// let the background calls end, and count what each process spent per task.
#[allow(clippy::too_many_arguments)]
fn creation_run(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    c: &HttpClient,
    demo: &Proc,
    up: SocketAddr,
    work: &Path,
    url: &str,
    schema: &str,
    n: usize,
) -> CreationRun {
    let gws = start_replicas(work, up, url, schema, n);
    let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.addr).collect();
    let b = bearer();
    let mk: MakeReq = std::sync::Arc::new(move |i| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":100}},{META_TASKS}}}}}"#
        );
        gw_req(
            addrs[i as usize % addrs.len()],
            &b,
            "tools/call",
            "sleep",
            body,
        )
    });
    rt.block_on(reset_statements(url));
    let gw0: f64 = gws.iter().map(|g| g.proc.cpu_secs()).sum();
    let (pg0, up0, me0) = (
        pg_cpu_secs().unwrap_or(0.0),
        demo.cpu_secs(),
        cpu_secs_of("self"),
    );
    let stats = rt.block_on(run_load(
        c,
        CONC,
        o.warmup,
        o.duration,
        mk,
        check_task_created,
    ));
    // The background calls (100 ms) end, and their terminal writes with them.
    std::thread::sleep(Duration::from_millis(600));
    let gw1: f64 = gws.iter().map(|g| g.proc.cpu_secs()).sum();
    let (pg1, up1, me1) = (
        pg_cpu_secs().unwrap_or(0.0),
        demo.cpu_secs(),
        cpu_secs_of("self"),
    );
    let counted = rt.block_on(statements(url));
    let tasks = rt.block_on(tasks_in(url, schema)).max(1) as f64;
    drop(gws);
    let top: i64 = counted.iter().filter(|s| s.2).map(|s| s.0).sum();
    let notifies: i64 = counted
        .iter()
        .filter(|s| s.2 && s.1.contains("pg_notify"))
        .map(|s| s.0)
        .sum();
    let per = |secs: f64| secs * 1e6 / tasks;
    CreationRun {
        stats,
        statements: top as f64 / tasks,
        notifies: notifies as f64 / tasks,
        gateway_us: per(gw1 - gw0),
        pg_us: per(pg1 - pg0),
        upstream_us: per(up1 - up0),
        client_us: per(me1 - me0),
    }
}
