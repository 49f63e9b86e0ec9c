//! Store backend rows of the load harness: the same gateway, once on sled and once on
//! PostgreSQL, in one run: `tasks/get` over seeded completed tasks and durable task
//! creations (`tools/call sleep {ms:100}`, `promote_after_ms = 0`) at c = 1, 16 and
//! 64, with the database's WAL flush count for its rows (`pg_stat_wal.wal_sync`: this
//! disk's flush latency moves a lot, so a PostgreSQL row means little without it).
//!
//! The PostgreSQL rows need `TASKGATE_TEST_PG_URL` (a cluster `scripts/pg.sh` starts:
//! `bash scripts/pg.sh run cargo bench --bench load -- --only stores`); without it they
//! say so instead of running.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::HeaderValue;
use taskgate::store::TaskStore;
use taskgate::store::postgres::{PgSettings, PgStore};

use super::harness::{
    Check, check_completed, check_task_created, cpu_us_per, median_run, run_load,
};
use super::pg_stats::{reset_statements, statements, wal_syncs};
use super::processes::{Gateway, gateway_config, postgres_store, start_gateway_with};
use super::report::{Report, err_note, ms};
use super::requests::{gw_req, seed, seed_store, token};
use super::scenarios::get_maker;
use super::{HttpClient, META_TASKS, MakeReq, Opts, pg_url};

/// Seeded tasks for the `tasks/get` rows, and their owners.
const TASKS: u64 = 10_000;
const PRINCIPALS: u64 = 1_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];

enum Backend {
    Sled,
    Postgres { url: String, schema: String },
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Self::Sled => "sled",
            Self::Postgres { .. } => "postgres",
        }
    }
}

pub(super) fn stores(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
) {
    rep.section(
        "Store backends: one gateway on sled, then on PostgreSQL (same run)",
        &[
            "store",
            "measure",
            "c",
            "req/s",
            "p50",
            "p99",
            "gateway CPU µs/req",
            "errors",
        ],
    );
    let mut backends = vec![Backend::Sled];
    if let Some(url) = pg_url(rep, "PostgreSQL rows") {
        backends.push(Backend::Postgres {
            url,
            schema: format!("bench_load_{}", std::process::id()),
        });
    }
    // The PostgreSQL gateway, kept for the statement count below.
    let mut lives = Vec::new();
    for b in &backends {
        let dir = work.join(format!("stores-{}", b.name()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = gateway_config(&dir.join("data"), up);
        let wal_before = match b {
            Backend::Sled => {
                seed(&dir, TASKS, PRINCIPALS, 1000);
                None
            }
            Backend::Postgres { url, schema } => {
                config = postgres_store(&config, url, schema);
                let settings = PgSettings {
                    url: url.clone(),
                    pool_size: 16,
                    schema: schema.clone(),
                    lease_ms: 10_000,
                    pooler: Default::default(),
                };
                rt.block_on(async {
                    let store: std::sync::Arc<dyn TaskStore> =
                        PgStore::open(&settings).await.unwrap();
                    seed_store(store.as_ref(), TASKS, PRINCIPALS, 1000).await;
                });
                Some(rt.block_on(wal_syncs(url)))
            }
        };
        let gw = start_gateway_with(&dir, &config);
        for conc in CONCURRENCY {
            let mk = get_maker(gw.addr, TASKS, PRINCIPALS);
            point(
                rt,
                o,
                rep,
                c,
                &gw,
                b.name(),
                "tasks/get",
                conc,
                mk,
                check_completed,
            );
        }
        let bearer = HeaderValue::from_str(&format!("Bearer {}", token("carol", "acme"))).unwrap();
        for conc in CONCURRENCY {
            let addr = gw.addr;
            let b2 = bearer.clone();
            let mk: MakeReq = std::sync::Arc::new(move |n| {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":100}},{META_TASKS}}}}}"#
                );
                gw_req(addr, &b2, "tools/call", "sleep", body)
            });
            point(
                rt,
                o,
                rep,
                c,
                &gw,
                b.name(),
                "durable creations",
                conc,
                mk,
                check_task_created,
            );
            // The background calls (100 ms each) end before the next point.
            std::thread::sleep(Duration::from_millis(500));
        }
        if let (Some(before), Backend::Postgres { url, .. }) = (wal_before, b) {
            let syncs = rt.block_on(wal_syncs(url)) - before;
            rep.note(&format!(
                "PostgreSQL flushed its WAL {syncs} times (`pg_stat_wal.wal_sync`) during its rows."
            ));
            lives.push((url.clone(), gw));
            continue;
        }
        drop(gw);
    }
    rep.note(&format!(
        "{TASKS} completed tasks over {PRINCIPALS} principals seeded through the store API before the tasks/get rows; JWT HS256 on every request. Each row is the median of 3 runs. PostgreSQL is the throwaway cluster of scripts/pg.sh on the same cores (fsync on)."
    ));
    for (url, gw) in lives {
        statements_per_task(rt, rep, c, &gw, &url);
    }
}

/// Tasks whose whole life the statement count covers.
const LIVES: usize = 200;

/// The whole life of a promoted task on PostgreSQL, counted by `pg_stat_statements`:
/// [`LIVES`] tasks created (`sleep {ms:50}`, `promote_after_ms = 0`, 8 at a time),
/// run to completion, and read once each by their owner after they ended; then the
/// read marks written. Statements run about once per task are the task's; the rest
/// (leases, relay polls, sweeps) are the replica's background over the same seconds.
fn statements_per_task(
    rt: &tokio::runtime::Runtime,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
    url: &str,
) {
    use super::replicas::{create, status};
    let addr = gw.addr;
    let t0 = std::time::Instant::now();
    let (ids, completed) = rt.block_on(async {
        reset_statements(url).await;
        let mut ids = Vec::new();
        for _ in 0..LIVES / 8 {
            let batch: Vec<_> = (0..8).map(|_| create(c, addr, 50)).collect();
            ids.extend(futures_util::future::join_all(batch).await);
        }
        // Every call ends 50 ms after it starts; read each once it has.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut completed = 0;
        for id in &ids {
            if status(c, addr, id).await == "completed" {
                completed += 1;
            }
        }
        // The read marks are written in the background within a second.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        (ids, completed)
    });
    let secs = t0.elapsed().as_secs_f64();
    let counted = rt.block_on(statements(url));
    rep.section(
        "The life of a promoted task on PostgreSQL (pg_stat_statements)",
        &["statement", "top level", "calls", "per task"],
    );
    let n = ids.iter().filter(|i| !i.is_empty()).count().max(1);
    let mut per_task = 0.0;
    for (calls, text, top) in &counted {
        let per = *calls as f64 / n as f64;
        if per >= 0.5 && *top {
            per_task += per;
        }
        let mut short: String = text.chars().take(90).collect();
        if text.len() > short.len() {
            short.push('…');
        }
        rep.row(&[
            format!("`{}`", short.replace('|', "\\|")),
            if *top { "yes" } else { "no (inside another)" }.into(),
            calls.to_string(),
            format!("{per:.2}"),
        ]);
    }
    rep.note(&format!(
        "{n} tasks created ({} ids returned), {completed} read completed by their owner; \
         {per_task:.1} top-level statements (round trips) per task among those run at least once per two tasks; \
         the others are the background over the {secs:.1} s the count covered.",
        ids.len()
    ));
}

#[allow(clippy::too_many_arguments)]
fn point(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
    store: &str,
    measure: &str,
    conc: usize,
    mk: MakeReq,
    check: Check,
) {
    let (s, cpu) = median_run(|| {
        let cpu0 = gw.proc.cpu_secs();
        let s = rt.block_on(run_load(c, conc, o.warmup, o.duration, mk.clone(), check));
        let cpu = cpu_us_per(&gw.proc, cpu0, &s);
        (s, cpu)
    });
    rep.row(&[
        store.into(),
        measure.into(),
        conc.to_string(),
        format!("{:.0}", s.rps()),
        ms(s.p50()),
        ms(s.p99()),
        format!("{cpu:.0}"),
        format!("{}{}", s.errors + s.refused, err_note(&s)),
    ]);
}
