//! Load harness (`harness = false`): starts the real gateway (`target/release/taskgate`),
//! the bundled demo legacy server over HTTP, the `mcp-proxy` 0.6.0 peer when installed,
//! and a bare hyper "hello" server (this binary re-executed with `--hello-server`), all
//! on loopback, and reports requests/s and p50/p99 latency per scenario as Markdown.
//!
//! `cargo build --release && cargo bench --bench load -- [--quick] [--out FILE]
//!  [--duration-ms N] [--scale 100000,1000000] [--mcp-proxy PATH]
//!  [--only inline,get,create,scale,native]`
//!
//! Every load point is bounded in time (`--duration-ms`, default 3000, after a 500 ms
//! warm-up) and in count (`MAX_REQUESTS`), and all traffic goes to 127.0.0.1.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, json};

use taskgate::config::StoreConfig;
use taskgate::store::sled::SledStore;
use taskgate::store::{RequestRoute, SCHEMA_VERSION, TaskRecord, TaskStatus, TaskStore, now_ms};

const SECRET: &str = "bench-secret-0123456789abcdef0123456789abcdef";
const ISSUER: &str = "https://issuer.bench";
const AUDIENCE: &str = "taskgate-bench";
const MAX_REQUESTS: u64 = 2_000_000;
const LEGACY_VERSION: &str = "2025-06-18";
const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
const META_TASKS: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#;

#[path = "load/native.rs"]
mod native;
#[path = "load/stdio_pool.rs"]
mod stdio_pool;
#[path = "load/stores.rs"]
mod stores;

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
// Child processes.

struct Proc {
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        let echo = std::env::var_os("BENCH_LOGS").is_some();
        std::thread::spawn(move || {
            // The gateway logs a line per request: keep the first 10k (start-up lines
            // for `wait_log`), and spend little of the shared CPU on the rest.
            let mut r = BufReader::new(stderr);
            let mut buf = Vec::new();
            while r
                .read_until(b'\n', &mut buf)
                .map(|n| n > 0)
                .unwrap_or(false)
            {
                if echo {
                    eprint!("[proc] {}", String::from_utf8_lossy(&buf));
                }
                let mut l = sink.lock().unwrap();
                if l.len() < 10_000 {
                    l.push(String::from_utf8_lossy(&buf).trim_end().to_string());
                }
                drop(l);
                buf.clear();
            }
        });
        Self { child, logs }
    }

    /// Waits for a stderr line containing `needle`; returns it.
    fn wait_log(&mut self, needle: &str, limit: Duration) -> Option<String> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(l) = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return Some(l.clone());
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    fn log_text(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Resident set size in bytes (`VmRSS`).
    fn rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }

    /// User + system CPU seconds consumed so far.
    fn cpu_secs(&self) -> f64 {
        cpu_secs_of(&self.child.id().to_string())
    }
}

/// user+sys CPU seconds of a process (`/proc/<pid>/stat`; "self" for this harness).
fn cpu_secs_of(pid: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after ')': state is index 0, utime 11, stime 12.
    (ticks(11) + ticks(12)) / 100.0
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn addr_after(line: &str, prefix: &str) -> SocketAddr {
    line.rsplit(prefix)
        .next()
        .and_then(|s| {
            s.split(|c: char| c == '/' || c.is_whitespace() || c == '"')
                .next()
        })
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

fn taskgate_bin() -> PathBuf {
    let p = root().join("target/release/taskgate");
    assert!(
        p.exists(),
        "{} missing: run `cargo build --release` first",
        p.display()
    );
    p
}

fn start_demo() -> (Proc, SocketAddr) {
    let mut cmd = Command::new(taskgate_bin());
    cmd.args(["demo-upstream", "--http", "127.0.0.1:0"]);
    let mut p = Proc::spawn(cmd);
    let line = p
        .wait_log("listening on http://", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("demo upstream did not start: {}", p.log_text()));
    let addr = addr_after(&line, "http://");
    (p, addr)
}

fn start_hello() -> (Proc, SocketAddr) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg("--hello-server");
    let mut p = Proc::spawn(cmd);
    let line = p
        .wait_log("hello listening on http://", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("hello server did not start: {}", p.log_text()));
    let addr = addr_after(&line, "http://");
    (p, addr)
}

struct Gateway {
    proc: Proc,
    addr: SocketAddr,
    startup: Duration,
    /// When the process was spawned.
    spawned: Instant,
}

fn gateway_config(store: &Path, upstream: SocketAddr) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
max_connections = 10000
[store]
path = "{store}"
[auth]
mode = "jwt"
algorithms = ["HS256"]
hs256_secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
[tasks]
# The poll limiter still decides every tasks/get (issue #5: "JWT verify + ownership +
# store read + limiter"), but with a 1 ms interval it refuses none of the harness's
# polls (each task is polled a few times a second).
poll_interval_ms = 1
max_poll_interval_ms = 1
[limits]
max_live_tasks_per_tenant = 100000000
queue_size = 1000000
[[upstream]]
name = "demo"
path = "/mcp"
url = "http://{upstream}/mcp"
max_concurrency = 8192
[upstream.tools.sleep]
promote_after_ms = 0
"#,
        store = store.display()
    )
}

fn start_gateway(dir: &Path, upstream: SocketAddr) -> Gateway {
    start_gateway_with(dir, &gateway_config(&dir.join("data"), upstream))
}

/// Start the gateway in `dir` with the configuration `config`.
fn start_gateway_with(dir: &Path, config: &str) -> Gateway {
    let cfg = dir.join("taskgate.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut cmd = Command::new(taskgate_bin());
    cmd.arg("--config").arg(&cfg).current_dir(dir);
    cmd.env("TASKGATE_LOG", "warn,taskgate=info");
    let t0 = Instant::now();
    let mut proc = Proc::spawn(cmd);
    let line = proc
        .wait_log("taskgate listening on http://", Duration::from_secs(120))
        .unwrap_or_else(|| panic!("gateway did not start:\n{}", proc.log_text()));
    let startup = t0.elapsed();
    let addr = addr_after(&line, "http://");
    Gateway {
        proc,
        addr,
        startup,
        spawned: t0,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `mcp-proxy` 0.6.0 in front of the demo upstream; `Err(reason)` if it cannot run.
fn start_mcp_proxy(
    bin: &Path,
    dir: &Path,
    upstream: SocketAddr,
) -> Result<(Proc, SocketAddr), String> {
    if !bin.exists() {
        return Err("not installed".into());
    }
    let port = free_port();
    let cfg = dir.join("mcp-proxy.toml");
    std::fs::write(
        &cfg,
        format!(
            "[proxy]\nname = \"bench\"\n[proxy.listen]\nhost = \"127.0.0.1\"\nport = {port}\n\n[[backends]]\nname = \"ev\"\ntransport = \"http\"\nurl = \"http://{upstream}/mcp\"\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&cfg).current_dir(dir);
    cmd.env("RUST_LOG", "warn");
    let mut p = Proc::spawn(cmd);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(st)) = p.child.try_wait() {
            return Err(format!("exited at start ({st}): {}", p.log_text()));
        }
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok((p, addr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    p.child.kill().ok();
    Err(format!("did not listen within 20 s: {}", p.log_text()))
}

// ---------------------------------------------------------------------------------------
// Tokens and deterministic task ids.

fn token(sub: &str, tenant: &str) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": sub, "tenant": tenant, "iss": ISSUER, "aud": AUDIENCE,
                "iat": now, "exp": now + 7200}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// Task `i` of a seeded store: a well-formed id (`tsk_` + base64url of 16 bytes).
fn seeded_id(i: u64) -> String {
    let bytes = (0xB00C_u128 << 64 | i as u128).to_be_bytes();
    format!(
        "tsk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Owner of seeded task `i`: principal `i % principals` = (tenant, subject).
fn owner(i: u64, principals: u64) -> (String, String) {
    let p = i % principals;
    (format!("tenant-{}", p % 10), format!("user-{p}"))
}

/// Seeds `n` completed tasks (create + route removal, flush every `flush_every`) into
/// `dir/data` through the store API, then closes the store. Returns the elapsed time.
fn seed(dir: &Path, n: u64, principals: u64, flush_every: u64) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t0 = Instant::now();
    rt.block_on(async {
        let cfg = StoreConfig {
            path: dir.join("data"),
            ..StoreConfig::default()
        };
        let store = SledStore::open(&cfg).unwrap();
        seed_store(store.as_ref(), n, principals, flush_every).await;
        drop(store);
    });
    drop(rt);
    t0.elapsed()
}

/// Seeds the `n` completed tasks [`get_maker`] reads into `store`.
async fn seed_store(store: &dyn TaskStore, n: u64, principals: u64, flush_every: u64) {
    let now = now_ms();
    let result = json!({"content": [{"type": "text", "text": "hello from the seeded store"}],
                        "isError": false});
    for i in 0..n {
        let id = seeded_id(i);
        let (tenant, subject) = owner(i, principals);
        let rec = TaskRecord {
            v: SCHEMA_VERSION,
            task_id: id.clone(),
            tenant: tenant.clone(),
            subject: subject.clone(),
            upstream: "demo".into(),
            tool: "echo".into(),
            args_fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
                .into(),
            idempotency_key: None,
            status: TaskStatus::Completed,
            status_message: None,
            created_at_ms: now,
            last_updated_at_ms: now,
            ttl_ms: 86_400_000,
            poll_interval_ms: 1000,
            expires_at_ms: now + 86_400_000,
            result: Some(result.clone()),
            error: None,
            input_requests: Map::new(),
            issued_keys: Vec::new(),
            cancel_requested: false,
        };
        let route_id = format!("rt_seed_{i}");
        let route = RequestRoute {
            v: SCHEMA_VERSION,
            route_id: route_id.clone(),
            upstream: "demo".into(),
            tenant,
            subject,
            method: "tools/call".into(),
            started_at_ms: now,
            deadline_ms: now + 60_000,
            task_id: Some(id),
        };
        store.create(&rec, &route, None).await.unwrap();
        store.remove_route(&route_id).await.unwrap();
        if (i + 1) % flush_every == 0 {
            store.flush().await.unwrap();
        }
    }
    store.flush().await.unwrap();
}

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                total += dir_size(&e.path());
            } else {
                // Allocated blocks, not the apparent (possibly sparse) length.
                use std::os::unix::fs::MetadataExt;
                total += md.blocks() * 512;
            }
        }
    }
    total
}

// ---------------------------------------------------------------------------------------
// Requests.

fn post(url: &str) -> http::request::Builder {
    Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
}

fn gw_req(
    addr: SocketAddr,
    bearer: &HeaderValue,
    method: &str,
    name: &str,
    body: String,
) -> Request<Full<Bytes>> {
    post(&format!("http://{addr}/mcp"))
        .header("authorization", bearer.clone())
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn echo_body_2026(seq: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{seq},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}},{META}}}}}"#
    )
}

fn legacy_req(url: &str, session: &str, body: String) -> Request<Full<Bytes>> {
    post(url)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", LEGACY_VERSION)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Legacy `initialize` + `notifications/initialized`; returns the session id.
async fn legacy_session(client: &HttpClient, url: &str) -> Result<String, String> {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": LEGACY_VERSION, "capabilities": {},
        "clientInfo": {"name": "taskgate-bench", "version": "0.1"}}});
    let req = post(url)
        .body(Full::new(Bytes::from(init.to_string())))
        .unwrap();
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let sid = sid.ok_or_else(|| {
        format!(
            "initialize: {status}, no session id: {}",
            String::from_utf8_lossy(&body)
        )
    })?;
    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string();
    let resp = client
        .request(legacy_req(url, &sid, note))
        .await
        .map_err(|e| e.to_string())?;
    let _ = resp.into_body().collect().await;
    Ok(sid)
}

// ---------------------------------------------------------------------------------------
// The load loop.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Outcome {
    Ok,
    Refused,
    Error,
}

type Check = fn(StatusCode, &[u8]) -> Outcome;

fn contains(h: &[u8], n: &[u8]) -> bool {
    h.windows(n.len()).any(|w| w == n)
}

fn check_result(st: StatusCode, body: &[u8]) -> Outcome {
    if st == StatusCode::TOO_MANY_REQUESTS || st == StatusCode::SERVICE_UNAVAILABLE {
        Outcome::Refused
    } else if st == StatusCode::OK && contains(body, b"\"result\"") {
        Outcome::Ok
    } else {
        Outcome::Error
    }
}

/// A `tools/call echo` answer that carries the echoed text.
fn check_echo(st: StatusCode, body: &[u8]) -> Outcome {
    match check_result(st, body) {
        Outcome::Ok if !contains(body, b"hello") => Outcome::Error,
        o => o,
    }
}

/// A `tasks/get` answer for one of the seeded (completed) tasks.
fn check_completed(st: StatusCode, body: &[u8]) -> Outcome {
    match check_result(st, body) {
        Outcome::Ok if !contains(body, b"\"status\":\"completed\"") => Outcome::Error,
        o => o,
    }
}

fn check_hello(st: StatusCode, _: &[u8]) -> Outcome {
    if st == StatusCode::OK {
        Outcome::Ok
    } else {
        Outcome::Error
    }
}

fn check_task_created(st: StatusCode, body: &[u8]) -> Outcome {
    match check_result(st, body) {
        Outcome::Ok if contains(body, b"\"resultType\":\"task\"") => Outcome::Ok,
        Outcome::Ok => Outcome::Error,
        o if contains(body, b"\"error\"") && st.is_client_error() => {
            let _ = o;
            Outcome::Refused
        }
        o => o,
    }
}

#[derive(Default, Clone)]
struct Stats {
    ok: u64,
    refused: u64,
    errors: u64,
    secs: f64,
    lat_us: Vec<u32>,
    first_error: Option<String>,
}

impl Stats {
    fn rps(&self) -> f64 {
        self.ok as f64 / self.secs.max(1e-9)
    }
    fn pct(&self, p: f64) -> f64 {
        if self.lat_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.lat_us.len() as f64 - 1.0) * p).round() as usize;
        self.lat_us[i] as f64
    }
    fn p50(&self) -> f64 {
        self.pct(0.50)
    }
    fn p99(&self) -> f64 {
        self.pct(0.99)
    }
}

/// CPU µs per answered request: the process's user+sys CPU since `cpu0` over the
/// requests of `s` (any outcome).
fn cpu_us_per(proc: &Proc, cpu0: f64, s: &Stats) -> f64 {
    (proc.cpu_secs() - cpu0) * 1e6 / (s.ok + s.errors + s.refused).max(1) as f64
}

/// Runs of each contested point (tasks/get, creation): the machine is shared and
/// noisy, so a row is the median run (by requests/s) of this many.
const RUNS: usize = 3;

/// The median run, by requests/s, of `RUNS` runs of `point` (which returns the run's
/// stats and whatever else its row reports, e.g. CPU per request).
fn median_run<X>(mut point: impl FnMut() -> (Stats, X)) -> (Stats, X) {
    let mut runs: Vec<(Stats, X)> = (0..RUNS).map(|_| point()).collect();
    runs.sort_by(|a, b| a.0.rps().total_cmp(&b.0.rps()));
    runs.swap_remove(RUNS / 2)
}

async fn run_load(
    client: &HttpClient,
    conc: usize,
    warmup: Duration,
    dur: Duration,
    make: MakeReq,
    check: Check,
) -> Stats {
    let seq = Arc::new(AtomicU64::new(1));
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + dur;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conc {
        let client = client.clone();
        let make = make.clone();
        let seq = seq.clone();
        set.spawn(async move {
            let mut s = Stats::default();
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let n = seq.fetch_add(1, Ordering::Relaxed);
                if n > MAX_REQUESTS {
                    break;
                }
                let req = make(n);
                let t0 = Instant::now();
                let res = match client.request(req).await {
                    Ok(resp) => {
                        let st = resp.status();
                        match resp.into_body().collect().await {
                            Ok(b) => {
                                let b = b.to_bytes();
                                let o = check(st, &b);
                                if o != Outcome::Ok && s.first_error.is_none() {
                                    s.first_error = Some(format!(
                                        "{st}: {}",
                                        String::from_utf8_lossy(&b[..b.len().min(300)])
                                    ));
                                }
                                o
                            }
                            Err(e) => {
                                s.first_error.get_or_insert(e.to_string());
                                Outcome::Error
                            }
                        }
                    }
                    Err(e) => {
                        s.first_error.get_or_insert(e.to_string());
                        Outcome::Error
                    }
                };
                let el = t0.elapsed();
                if t0 < measure_from {
                    continue;
                }
                match res {
                    Outcome::Ok => {
                        s.ok += 1;
                        s.lat_us.push(el.as_micros().min(u32::MAX as u128) as u32);
                    }
                    Outcome::Refused => s.refused += 1,
                    Outcome::Error => s.errors += 1,
                }
            }
            s
        });
    }
    let mut all = Stats::default();
    while let Some(r) = set.join_next().await {
        let s = r.unwrap();
        all.ok += s.ok;
        all.refused += s.refused;
        all.errors += s.errors;
        all.lat_us.extend(s.lat_us);
        if all.first_error.is_none() {
            all.first_error = s.first_error;
        }
    }
    all.secs = (Instant::now().min(end) - measure_from)
        .as_secs_f64()
        .max(1e-9);
    // Workers stop at `end`, but the last requests may finish after it.
    all.secs = all.secs.max(dur.as_secs_f64());
    all.lat_us.sort_unstable();
    all
}

fn client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

// ---------------------------------------------------------------------------------------
// Report.

struct Report {
    md: String,
}

fn ms(us: f64) -> String {
    if us.is_nan() {
        "–".into()
    } else {
        format!("{:.3}", us / 1000.0)
    }
}

impl Report {
    fn section(&mut self, title: &str, header: &[&str]) {
        let _ = write!(self.md, "\n### {title}\n\n| {} |\n|", header.join(" | "));
        for _ in header {
            self.md.push_str(" --- |");
        }
        self.md.push('\n');
        eprintln!("== {title}");
    }
    fn row(&mut self, cells: &[String]) {
        let line = format!("| {} |\n", cells.join(" | "));
        eprint!("{line}");
        self.md.push_str(&line);
    }
    fn note(&mut self, text: &str) {
        let _ = writeln!(self.md, "\n{text}");
        eprintln!("{text}");
    }
}

fn err_note(s: &Stats) -> String {
    match (&s.first_error, s.errors + s.refused) {
        (Some(e), n) if n > 0 => format!(" (first: {})", e.replace('|', "/").replace('\n', " ")),
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios.

fn main() {
    if std::env::args().any(|a| a == "--hello-server") {
        hello_server();
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
    drop(gw);
    if want("scale") {
        scale(&rt, &o, &mut rep, &c, up, work.path(), baseline_get_p99);
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
    rep.note(&format!(
        "Harness wall time: {:.0} s.",
        t_all.elapsed().as_secs_f64()
    ));
    if let Some(p) = &o.out {
        std::fs::write(p, &rep.md).unwrap();
    }
    println!("{}", rep.md);
}

#[allow(clippy::too_many_arguments)]
fn inline(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    gw: &Gateway,
    work: &Path,
) {
    let proxy = start_mcp_proxy(&o.mcp_proxy, work, up);
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("alice", "acme"))).unwrap();
    let direct_url = format!("http://{up}/mcp");
    let direct_sid = rt
        .block_on(legacy_session(c, &direct_url))
        .expect("demo session");
    let proxy_sid = match &proxy {
        Ok((_, addr)) => rt
            .block_on(legacy_session(c, &format!("http://{addr}/")))
            .map_err(|e| format!("session failed: {e}")),
        Err(e) => Err(e.clone()),
    };
    rep.section(
        "Inline overhead: tools/call echo (demo upstream over HTTP)",
        &[
            "path",
            "c",
            "req/s",
            "p50",
            "p99",
            "added p50",
            "added p99",
            "throughput vs direct",
            "errors",
        ],
    );
    for conc in [1usize, 32] {
        let url = direct_url.clone();
        let sid = direct_sid.clone();
        let direct: MakeReq = Arc::new(move |n| {
            legacy_req(
                &url,
                &sid,
                format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}}}}}}"#
                ),
            )
        });
        let d = rt.block_on(run_load(c, conc, o.warmup, o.duration, direct, check_echo));
        let mut rows = vec![(
            "direct (legacy, session)".to_string(),
            Some(d.clone()),
            None,
        )];
        let addr = gw.addr;
        let b = bearer.clone();
        let via: MakeReq =
            Arc::new(move |n| gw_req(addr, &b, "tools/call", "echo", echo_body_2026(n)));
        let t = rt.block_on(run_load(c, conc, o.warmup, o.duration, via, check_echo));
        rows.push(("taskgate (2026-07-28 + JWT)".into(), Some(t), None));
        match (&proxy, &proxy_sid) {
            (Ok((_, paddr)), Ok(psid)) => {
                let url = format!("http://{paddr}/");
                let sid = psid.clone();
                let mk: MakeReq = Arc::new(move |n| {
                    legacy_req(
                        &url,
                        &sid,
                        format!(
                            r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"ev/echo","arguments":{{"text":"hello"}}}}}}"#
                        ),
                    )
                });
                let p = rt.block_on(run_load(c, conc, o.warmup, o.duration, mk, check_echo));
                rows.push(("mcp-proxy 0.6.0 (legacy, session)".into(), Some(p), None));
            }
            (Err(e), _) | (_, Err(e)) => {
                rows.push(("mcp-proxy 0.6.0".into(), None, Some(e.clone())));
            }
        }
        for (name, s, why) in rows {
            match s {
                Some(s) => {
                    let is_direct = name.starts_with("direct");
                    let (ap50, ap99, ratio) = if is_direct {
                        ("–".into(), "–".into(), "1.00×".into())
                    } else {
                        (
                            ms(s.p50() - d.p50()),
                            ms(s.p99() - d.p99()),
                            format!("{:.2}×", s.rps() / d.rps()),
                        )
                    };
                    rep.row(&[
                        name,
                        conc.to_string(),
                        format!("{:.0}", s.rps()),
                        ms(s.p50()),
                        ms(s.p99()),
                        ap50,
                        ap99,
                        ratio,
                        format!("{}{}", s.errors + s.refused, err_note(&s)),
                    ]);
                }
                None => rep.row(&[
                    name,
                    conc.to_string(),
                    why.unwrap_or_default()
                        .replace('\n', " ")
                        .chars()
                        .take(200)
                        .collect(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                ]),
            }
        }
    }
}

/// Requests for `tasks/get` spread over `n` seeded tasks and their owners.
fn get_maker(addr: SocketAddr, n: u64, principals: u64) -> MakeReq {
    let bearers: Arc<Vec<HeaderValue>> = Arc::new(
        (0..principals)
            .map(|p| {
                let (t, s) = owner(p, principals);
                HeaderValue::from_str(&format!("Bearer {}", token(&s, &t))).unwrap()
            })
            .collect(),
    );
    Arc::new(move |seq| {
        // A cheap scramble so consecutive requests hit unrelated tasks.
        let i = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % n;
        let id = seeded_id(i);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{seq},"method":"tasks/get","params":{{"taskId":"{id}",{META_TASKS}}}}}"#
        );
        gw_req(
            addr,
            &bearers[(i % principals) as usize],
            "tasks/get",
            &id,
            body,
        )
    })
}

fn tasks_get(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
    n: u64,
    principals: u64,
) -> f64 {
    let (hello_p, haddr) = start_hello();
    rep.section(
        &format!(
            "tasks/get throughput ({n} tasks × {principals} principals, JWT HS256) vs bare hyper ceiling"
        ),
        &[
            "target",
            "c",
            "req/s",
            "p50",
            "p99",
            "vs hello",
            "server CPU µs/req",
            "errors",
        ],
    );
    let mut p99_c32 = f64::NAN;
    for conc in [32usize, 64] {
        let url = format!("http://{haddr}/");
        let hello: MakeReq = Arc::new(move |_| {
            post(&url)
                .body(Full::new(Bytes::from_static(
                    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}",
                )))
                .unwrap()
        });
        let (h, hcpu) = median_run(|| {
            let cpu0 = hello_p.cpu_secs();
            let h = rt.block_on(run_load(
                c,
                conc,
                o.warmup,
                o.duration,
                hello.clone(),
                check_hello,
            ));
            let cpu = cpu_us_per(&hello_p, cpu0, &h);
            (h, cpu)
        });
        let (g, gcpu) = median_run(|| {
            let cpu0 = gw.proc.cpu_secs();
            let g = rt.block_on(run_load(
                c,
                conc,
                o.warmup,
                o.duration,
                get_maker(gw.addr, n, principals),
                check_completed,
            ));
            let cpu = cpu_us_per(&gw.proc, cpu0, &g);
            (g, cpu)
        });
        if conc == 32 {
            p99_c32 = g.p99();
        }
        rep.row(&[
            "bare hyper hello".into(),
            conc.to_string(),
            format!("{:.0}", h.rps()),
            ms(h.p50()),
            ms(h.p99()),
            "1.00×".into(),
            format!("{hcpu:.0}"),
            format!("{}{}", h.errors, err_note(&h)),
        ]);
        rep.row(&[
            "taskgate tasks/get".into(),
            conc.to_string(),
            format!("{:.0}", g.rps()),
            ms(g.p50()),
            ms(g.p99()),
            format!("{:.2}×", g.rps() / h.rps()),
            format!("{gcpu:.0}"),
            format!("{}{}", g.errors + g.refused, err_note(&g)),
        ]);
    }
    rep.note("Server CPU µs/req: user+sys CPU of the server process over the whole point (warm-up included) / measured requests, so it reads slightly high.");
    rep.note(&format!(
        "Each row is the median run (by req/s) of {RUNS} runs of that point; per concurrency, the hello runs come first, then the tasks/get runs."
    ));
    p99_c32
}

fn durable_create(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
    demo: &Proc,
) {
    rep.section(
        "Durable task creation: tools/call sleep {ms:100}, promote_after_ms = 0",
        &[
            "c",
            "promotions/s",
            "p50",
            "p99",
            "refused",
            "other errors",
            "gateway CPU µs/task",
            "upstream CPU µs/task",
            "load client CPU µs/task",
            "gateway RSS after",
        ],
    );
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("carol", "acme"))).unwrap();
    for conc in [1usize, 16, 64] {
        let addr = gw.addr;
        let b = bearer.clone();
        let mk: MakeReq = Arc::new(move |n| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":100}},{META_TASKS}}}}}"#
            );
            gw_req(addr, &b, "tools/call", "sleep", body)
        });
        let (s, (gcpu, dcpu, ccpu)) = median_run(|| {
            let (g0, d0, c0) = (gw.proc.cpu_secs(), demo.cpu_secs(), cpu_secs_of("self"));
            let s = rt.block_on(run_load(
                c,
                conc,
                o.warmup,
                o.duration,
                mk.clone(),
                check_task_created,
            ));
            // The background calls (100 ms each) finish; their cost belongs to the point.
            std::thread::sleep(Duration::from_millis(1500));
            let client =
                (cpu_secs_of("self") - c0) * 1e6 / (s.ok + s.errors + s.refused).max(1) as f64;
            let cpu = (
                format!("{:.0}", cpu_us_per(&gw.proc, g0, &s)),
                format!("{:.0}", cpu_us_per(demo, d0, &s)),
                format!("{client:.0}"),
            );
            (s, cpu)
        });
        rep.row(&[
            conc.to_string(),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            s.refused.to_string(),
            format!("{}{}", s.errors, err_note(&s)),
            gcpu,
            dcpu,
            ccpu,
            format!("{:.0} MB", gw.proc.rss() as f64 / 1e6),
        ]);
    }
    rep.note(&format!(
        "Each row is the median run (by promotions/s) of {RUNS} runs; CPU columns: process user+sys CPU over the run plus the 1.5 s drain of its background calls, per task."
    ));
}

#[allow(clippy::too_many_arguments)]
fn scale(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
    baseline_p99: f64,
) {
    rep.section(
        "Scale: seeded stores (completed tasks, 1000 principals), tasks/get c=32 with JWT",
        &[
            "stored tasks",
            "seed time",
            "on disk",
            "start-up",
            "RSS after start",
            "background count",
            "RSS after count",
            "tasks/get req/s",
            "p50",
            "p99",
            "p99 vs 10k store",
            "RSS after load",
            "errors",
        ],
    );
    for &n in &o.scale {
        let dir = work.join(format!("scale-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let seed_t = seed(&dir, n, 1000, 10_000);
        let disk = dir_size(&dir.join("data"));
        let mut gw = start_gateway(&dir, up);
        std::thread::sleep(Duration::from_millis(300));
        let rss0 = gw.proc.rss();
        // The `taskgate_tasks` gauge is counted from the store in the background after
        // start-up (one pass over every record); measure tasks/get once that is done.
        let counted = match gw
            .proc
            .wait_log("task gauge counted", Duration::from_secs(120))
        {
            Some(_) => format!("{:.2} s", gw.spawned.elapsed().as_secs_f64()),
            None => "not seen in 120 s".into(),
        };
        let rss_counted = gw.proc.rss();
        let s = rt.block_on(run_load(
            c,
            32,
            o.warmup,
            o.duration,
            get_maker(gw.addr, n, 1000),
            check_completed,
        ));
        let rss1 = gw.proc.rss();
        rep.row(&[
            n.to_string(),
            format!("{:.1} s", seed_t.as_secs_f64()),
            format!("{:.0} MB", disk as f64 / 1e6),
            format!("{:.2} s", gw.startup.as_secs_f64()),
            format!("{:.0} MB", rss0 as f64 / 1e6),
            counted,
            format!("{:.0} MB", rss_counted as f64 / 1e6),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{:.2}×", s.p99() / baseline_p99),
            format!("{:.0} MB", rss1 as f64 / 1e6),
            format!("{}{}", s.errors + s.refused, err_note(&s)),
        ]);
        drop(gw);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ---------------------------------------------------------------------------------------
// The bare hyper ceiling.

fn hello_server() {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        eprintln!(
            "hello listening on http://{}",
            listener.local_addr().unwrap()
        );
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(
                                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",
                            )))
                            .unwrap(),
                    )
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .http1_only()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
}
