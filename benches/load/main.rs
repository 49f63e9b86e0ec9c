//! Load harness (`harness = false`): starts the real gateway (`target/release/taskgate`),
//! the bundled demo legacy server over HTTP, the `mcp-proxy` 0.6.0 peer when installed,
//! and a bare hyper "hello" server (this binary re-executed with `--hello-server`), all
//! on loopback, and reports requests/s and p50/p99 latency per scenario as Markdown.
//!
//! `cargo build --release && cargo bench --bench load -- [--quick] [--out FILE]
//!  [--duration-ms N] [--scale 100000,1000000] [--mcp-proxy PATH]
//!  [--only inline,get,create,sessions,tls,traces,scale,native,pool,stores,replicas,edge,versus]`
//!
//! `versus` (only when named) runs this build beside `TASKGATE_BENCH_BASELINE_BIN`.
//!
//! Every load point is bounded in time (`--duration-ms`, default 3000, after a 500 ms
//! warm-up) and in count (`MAX_REQUESTS`), and all traffic goes to 127.0.0.1.

mod bare_pingora;
mod edge;
#[path = "../support/fixtures.rs"]
mod fixtures;
mod harness;
mod hello;
mod native;
#[path = "../support/pg_stats.rs"]
mod pg_stats;
mod processes;
mod replicas;
mod report;
mod requests;
mod scale_pg;
mod scenarios;
mod sessions;
mod stdio_pool;
mod stores;
mod tls;
mod traces;
mod versus;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use self::harness::client;
use self::hello::hello_server;
use self::processes::{start_demo, start_gateway};
use self::report::Report;
use self::requests::seed;
use self::scenarios::{durable_create, inline, scale, tasks_get};

/// The issuer of the harness's tokens, trusted by every gateway it starts.
const JWT: fixtures::Hs256Issuer = fixtures::Hs256Issuer {
    secret: "bench-secret-0123456789abcdef0123456789abcdef",
    issuer: "https://issuer.bench",
    audience: "taskgate-bench",
};
const MAX_REQUESTS: u64 = 2_000_000;
const LEGACY_VERSION: &str = "2025-06-18";
const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
const META_TASKS: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#;

type HttpClient = Client<HttpConnector, Full<Bytes>>;
type MakeReq = Arc<dyn Fn(u64) -> Request<Full<Bytes>> + Send + Sync>;

// ---------------------------------------------------------------------------------------
// Command line.

struct Opts {
    quick: bool,
    out: Option<PathBuf>,
    duration: Duration,
    warmup: Duration,
    scale: Vec<u64>,
    mcp_proxy: PathBuf,
    only: Option<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The PostgreSQL URL `scripts/pg.sh run` exports; without it a note says that
/// `rows` did not run.
fn pg_url(rep: &mut Report, rows: &str) -> Option<String> {
    let url = std::env::var("TASKGATE_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        rep.note(&format!(
            "{rows} not run: TASKGATE_TEST_PG_URL is not set (run the harness under `bash scripts/pg.sh run`)."
        ));
    }
    url
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        quick: false,
        out: None,
        duration: Duration::from_millis(3000),
        warmup: Duration::from_millis(500),
        scale: vec![100_000, 1_000_000],
        mcp_proxy: root().join(".peers/mcp-proxy/bin/mcp-proxy"),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => {
                o.quick = true;
                o.duration = Duration::from_millis(1000);
                o.warmup = Duration::from_millis(200);
                o.scale = vec![20_000];
            }
            "--out" => o.out = args.next().map(PathBuf::from),
            "--duration-ms" => {
                o.duration = Duration::from_millis(args.next().unwrap().parse().unwrap())
            }
            "--scale" => {
                o.scale = args
                    .next()
                    .unwrap()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse().unwrap())
                    .collect()
            }
            "--mcp-proxy" => o.mcp_proxy = args.next().map(PathBuf::from).unwrap(),
            "--only" => o.only = args.next(),
            _ => {} // `--bench` and friends from cargo
        }
    }
    o
}

// ---------------------------------------------------------------------------------------
// Scenarios.

fn main() {
    if std::env::args().any(|a| a == "--hello-server") {
        hello_server();
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, listen, upstream, dir, ..] = args.as_slice()
        && flag == "--bare-pingora"
    {
        bare_pingora::bare_pingora_server(listen, upstream, dir);
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs harness-less benches without `--bench`: the
        // load harness starts servers and takes minutes, so it only runs under
        // `cargo bench` (which passes `--bench`).
        eprintln!("load harness: skipped (run it with `cargo bench --bench load`)");
        return;
    }
    let o = parse_opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rep = Report { md: String::new() };
    let t_all = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("taskgate-bench")
        .tempdir()
        .unwrap();
    let _ = writeln!(
        rep.md,
        "Load points: {} ms measured after {} ms warm-up; latencies in ms; loopback; \
         client, gateway and upstream share the machine's cores.",
        o.duration.as_millis(),
        o.warmup.as_millis()
    );
    let want = |s: &str| {
        o.only
            .as_deref()
            .is_none_or(|x| x.split(',').any(|y| y == s))
    };

    let (demo, up) = start_demo();
    let gw_dir = work.path().join("gw");
    std::fs::create_dir_all(&gw_dir).unwrap();
    // The tasks/get set: 10k tasks over 1000 principals, seeded before start-up.
    const GET_TASKS: u64 = 10_000;
    const PRINCIPALS: u64 = 1_000;
    seed(&gw_dir, GET_TASKS, PRINCIPALS, 1000);
    let gw = start_gateway(&gw_dir, up);
    let c = client();

    let mut baseline_get_p99 = f64::NAN;

    if want("inline") {
        inline(&rt, &o, &mut rep, &c, up, &gw, work.path());
    }
    if want("get") {
        baseline_get_p99 = tasks_get(&rt, &o, &mut rep, &c, &gw, GET_TASKS, PRINCIPALS);
    }
    if want("create") {
        durable_create(&rt, &o, &mut rep, &c, &gw, &demo);
    }
    if want("sessions") {
        sessions::sessions(&rt, &o, &mut rep, &c, &gw);
    }
    drop(gw);
    if want("tls") {
        tls::tls(&rt, &o, &mut rep, up, work.path());
    }
    if want("traces") {
        traces::traces(&rt, &o, &mut rep, &c, up, work.path());
    }
    if want("scale") {
        scale(&rt, &o, &mut rep, &c, up, work.path(), baseline_get_p99);
        scale_pg::scale_postgres(&rt, &o, &mut rep, &c, up, work.path());
    }
    if want("native") {
        native::native_reference(&rt, &o, &mut rep, &c);
    }
    if want("pool") {
        stdio_pool::stdio_pool(&rt, &o, &mut rep, &c, work.path());
    }
    if want("stores") {
        stores::stores(&rt, &o, &mut rep, &c, up, work.path());
    }
    if want("replicas") {
        replicas::replicas(&rt, &o, &mut rep, &c, &demo, up, work.path());
    }
    if want("edge") {
        edge::edge(&rt, &o, &mut rep, &c, up, work.path());
    }
    if o.only
        .as_deref()
        .is_some_and(|x| x.split(',').any(|y| y == "versus"))
    {
        versus::versus(&rt, &o, &mut rep, &c, up, work.path());
    }
    rep.note(&format!(
        "Harness wall time: {:.0} s.",
        t_all.elapsed().as_secs_f64()
    ));
    if let Some(p) = &o.out {
        std::fs::write(p, &rep.md).unwrap();
    }
    println!("{}", rep.md);
}
