//! Scale on PostgreSQL: the gateway process over a schema of 10,000 completed tasks,
//! then over each `--scale` size, with the rows the sled scale section has (start-up,
//! RSS, `tasks/get` at c = 32 with JWT, p99 against the 10k schema's in the same run).
//!
//! The schemas are seeded through `PgImport` (the batch path `taskgate store migrate`
//! writes with, 1,000 rows a statement): through the store API a million creations
//! would take as many commits. Needs `TASKGATE_TEST_PG_URL`
//! (`bash scripts/pg.sh run cargo bench --bench load -- --only scale`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use taskgate::store::TaskStatus;
use taskgate::store::postgres::{PgImport, PgSettings, TaskRow};

use super::fixtures::task;
use super::harness::{check_completed, run_load};
use super::pg_stats::{reset_statements, statements};
use super::processes::{gateway_config, pg_cpu_secs, postgres_store, start_gateway_with};
use super::report::{Report, err_note, ms};
use super::requests::{owner, seeded_id};
use super::scenarios::get_maker;
use super::{HttpClient, Opts, pg_url};

const PRINCIPALS: u64 = 1_000;
/// The reference schema's size: the `tasks/get` set of the other sections.
const BASELINE: u64 = 10_000;
const BATCH: u64 = 1_000;

pub(super) fn scale_postgres(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
) {
    let Some(url) = pg_url(rep, "PostgreSQL scale rows") else {
        return;
    };
    rep.section(
        "Scale on PostgreSQL: seeded schemas (completed tasks, 1000 principals), gateway process, tasks/get c=32 with JWT",
        &[
            "stored tasks",
            "seed time",
            "start-up",
            "RSS after start",
            "tasks/get req/s",
            "p50",
            "p99",
            "p99 vs 10k schema",
            "gateway CPU µs/req",
            "PostgreSQL CPU µs/req",
            "statements/req",
            "RSS after load",
            "errors",
        ],
    );
    let mut baseline_p99 = f64::NAN;
    let sizes: Vec<u64> = std::iter::once(BASELINE)
        .chain(o.scale.iter().copied().filter(|&n| n != BASELINE))
        .collect();
    let biggest = sizes.iter().copied().max().unwrap_or(BASELINE);
    let mut busiest = Vec::new();
    for n in sizes {
        let schema = format!("bench_scale_{}_{n}", std::process::id());
        let seed_t = rt.block_on(seed_schema(&url, &schema, n));
        let dir = work.join(format!("scale-pg-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = postgres_store(&gateway_config(&dir.join("data"), up), &url, &schema);
        let mut gw = start_gateway_with(&dir, &config);
        std::thread::sleep(Duration::from_millis(300));
        let rss0 = gw.proc.rss();
        // Measure once the background count of the `taskgate_tasks` gauge is done, as
        // the sled section does.
        let _ = gw
            .proc
            .wait_log("task gauge counted", Duration::from_secs(120));
        rt.block_on(reset_statements(&url));
        let (cpu0, pg0) = (gw.proc.cpu_secs(), pg_cpu_secs());
        let s = rt.block_on(run_load(
            c,
            32,
            o.warmup,
            o.duration,
            get_maker(gw.addr, n, PRINCIPALS),
            check_completed,
        ));
        let sent = s.sent.max(1) as f64;
        let gw_cpu = (gw.proc.cpu_secs() - cpu0) * 1e6 / sent;
        let pg_cpu = match (pg0, pg_cpu_secs()) {
            (Some(a), Some(b)) => format!("{:.0}", (b - a) * 1e6 / sent),
            _ => "–".into(),
        };
        // Most called first (`statements`); only top-level ones are round trips.
        let top: Vec<_> = rt
            .block_on(statements(&url))
            .into_iter()
            .filter(|(_, _, top)| *top)
            .collect();
        let top_level: i64 = top.iter().map(|(calls, _, _)| calls).sum();
        if n == biggest {
            busiest = top.into_iter().take(3).collect();
        }
        if n == BASELINE {
            baseline_p99 = s.p99();
        }
        let rss1 = gw.proc.rss();
        rep.row(&[
            n.to_string(),
            format!("{:.1} s", seed_t.as_secs_f64()),
            format!("{:.2} s", gw.startup.as_secs_f64()),
            format!("{:.0} MB", rss0 as f64 / 1e6),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{:.2}×", s.p99() / baseline_p99),
            format!("{gw_cpu:.0}"),
            pg_cpu,
            format!("{:.2}", top_level as f64 / sent),
            format!("{:.0} MB", rss1 as f64 / 1e6),
            format!("{}{}", s.errors + s.refused, err_note(&s)),
        ]);
        drop(gw);
        let _ = std::fs::remove_dir_all(&dir);
    }
    rep.note(
        "The 10k schema's reads are served from the terminal snapshots once seen (the set fits \
         their 16 MiB budget); a larger schema's mostly are not, so each such read is a \
         primary-key statement to the database. CPU and statements per request cover the \
         warm-up's requests as well as the measured ones; statements are top-level ones \
         (`pg_stat_statements`), the background's included.",
    );
    let busiest: Vec<String> = busiest
        .iter()
        .map(|(calls, text, _)| {
            let short: String = text.chars().take(80).collect();
            format!("{calls} × `{short}`")
        })
        .collect();
    rep.note(&format!(
        "The busiest statements over the {biggest}-task schema's load: {}.",
        busiest.join("; ")
    ));
}

/// Seeds `schema` (migrated first) with the `n` completed tasks [`get_maker`] reads,
/// `BATCH` rows a statement. Returns the elapsed time.
async fn seed_schema(url: &str, schema: &str, n: u64) -> Duration {
    let settings = PgSettings {
        url: url.to_string(),
        pool_size: 1,
        schema: schema.to_string(),
        lease_ms: 10_000,
        pooler: Default::default(),
    };
    let t0 = Instant::now();
    let import = PgImport::open(&settings).await.unwrap();
    let result = json!({"content": [{"type": "text", "text": "hello from the seeded store"}],
                        "isError": false});
    let mut start = 0;
    while start < n {
        let end = (start + BATCH).min(n);
        let records: Vec<_> = (start..end)
            .map(|i| {
                let id = seeded_id(i);
                let (tenant, subject) = owner(i, PRINCIPALS);
                let rec = taskgate::store::TaskRecord {
                    status: TaskStatus::Completed,
                    result: Some(result.clone()),
                    ..task(&id, &tenant, &subject, 86_400_000)
                };
                let bytes = serde_json::to_vec(&rec).unwrap();
                (rec, bytes)
            })
            .collect();
        let rows: Vec<TaskRow<'_>> = records
            .iter()
            .map(|(r, bytes)| TaskRow {
                task_id: &r.task_id,
                tenant: &r.tenant,
                subject: &r.subject,
                status: r.status.as_str(),
                expires_at_ms: r.expires_at_ms,
                idem_key: None,
                record: bytes,
                upstream: &r.upstream,
                created_at_ms: r.created_at_ms,
            })
            .collect();
        let written = import.tasks(&rows).await.unwrap();
        assert_eq!(written.inserted, end - start, "seeding {schema}");
        start = end;
    }
    t0.elapsed()
}
