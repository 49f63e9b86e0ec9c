//! Child processes of the harness: the gateway, the demo and hello servers, mcp-proxy.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::fixtures::free_port;
use super::{JWT, root};

pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) logs: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub(super) fn spawn(mut cmd: Command) -> Self {
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
    pub(super) fn wait_log(&mut self, needle: &str, limit: Duration) -> Option<String> {
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

    pub(super) fn log_text(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Resident set size in bytes (`VmRSS`).
    pub(super) fn rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }

    /// User + system CPU seconds consumed so far.
    pub(super) fn cpu_secs(&self) -> f64 {
        cpu_secs_of(&self.child.id().to_string())
    }
}

/// user+sys CPU seconds of a process (`/proc/<pid>/stat`; "self" for this harness).
pub(super) fn cpu_secs_of(pid: &str) -> f64 {
    let [user, sys] = user_sys_secs_of(pid);
    user + sys
}

/// CPU seconds of the PostgreSQL cluster `scripts/pg.sh` started
/// (`TASKGATE_TEST_PG_DIR`): the postmaster, its live children (backends, WAL writer,
/// checkpointer …) and the children it already reaped; `None` without the cluster.
pub(super) fn pg_cpu_secs() -> Option<f64> {
    let dir = std::env::var("TASKGATE_TEST_PG_DIR").ok()?;
    let pid_file = std::fs::read_to_string(format!("{dir}/data/postmaster.pid")).ok()?;
    let postmaster = pid_file.lines().next()?.trim().to_string();
    let fields = |pid: &str| -> Vec<String> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        rest.split_whitespace().map(str::to_string).collect()
    };
    let num = |f: &[String], i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // After ')': ppid 1, utime 11, stime 12, cutime 13, cstime 14 (clock ticks).
    let own = fields(&postmaster);
    let mut ticks = num(&own, 11) + num(&own, 12) + num(&own, 13) + num(&own, 14);
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let f = fields(&name);
        if f.get(1).map(String::as_str) == Some(postmaster.as_str()) {
            ticks += num(&f, 11) + num(&f, 12);
        }
    }
    Some(ticks / 100.0)
}

/// User and kernel CPU seconds of a process, apart.
pub(super) fn user_sys_secs_of(pid: &str) -> [f64; 2] {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after ')': state is index 0, utime 11, stime 12.
    [ticks(11) / 100.0, ticks(12) / 100.0]
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn addr_after(line: &str, prefix: &str) -> SocketAddr {
    line.rsplit(prefix)
        .next()
        .and_then(|s| {
            s.split(|c: char| c == '/' || c.is_whitespace() || c == '"')
                .next()
        })
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

pub(super) fn taskgate_bin() -> PathBuf {
    // Another build (an older commit, for a side-by-side run) with TASKGATE_BENCH_BIN.
    let p = std::env::var_os("TASKGATE_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/release/taskgate"));
    assert!(
        p.exists(),
        "{} missing: run `cargo build --release` first",
        p.display()
    );
    p
}

pub(super) fn start_demo() -> (Proc, SocketAddr) {
    let mut cmd = Command::new(taskgate_bin());
    cmd.args(["demo-upstream", "--http", "127.0.0.1:0"]);
    let mut p = Proc::spawn(cmd);
    let line = p
        .wait_log("listening on http://", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("demo upstream did not start: {}", p.log_text()));
    let addr = addr_after(&line, "http://");
    (p, addr)
}

pub(super) fn start_hello() -> (Proc, SocketAddr) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg("--hello-server");
    let mut p = Proc::spawn(cmd);
    let line = p
        .wait_log("hello listening on http://", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("hello server did not start: {}", p.log_text()));
    let addr = addr_after(&line, "http://");
    (p, addr)
}

pub(super) struct Gateway {
    pub(super) proc: Proc,
    pub(super) addr: SocketAddr,
    pub(super) startup: Duration,
    /// When the process was spawned.
    pub(super) spawned: Instant,
}

pub(super) fn gateway_config(store: &Path, upstream: SocketAddr) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
max_connections = 10000
[store]
path = "{store}"
{auth}[tasks]
# The poll limiter still decides every tasks/get (benches/RESULTS.md: "JWT verify + ownership +
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
        store = store.display(),
        auth = JWT.auth_section(),
    )
}

/// `config` with its store moved to `schema` of the PostgreSQL at `url`.
pub(super) fn postgres_store(config: &str, url: &str, schema: &str) -> String {
    config.replacen(
        "[store]\n",
        &format!("[store]\nbackend = \"postgres\"\nurl = \"{url}\"\nschema = \"{schema}\"\n"),
        1,
    )
}

pub(super) fn start_gateway(dir: &Path, upstream: SocketAddr) -> Gateway {
    start_gateway_with(dir, &gateway_config(&dir.join("data"), upstream))
}

/// Start the gateway in `dir` with the configuration `config`.
pub(super) fn start_gateway_with(dir: &Path, config: &str) -> Gateway {
    start_gateway_bin(&taskgate_bin(), dir, config)
}

/// Start the gateway binary `bin` (this build, or another one for `--only versus`) in
/// `dir` with the configuration `config`.
pub(super) fn start_gateway_bin(bin: &Path, dir: &Path, config: &str) -> Gateway {
    let cfg = dir.join("taskgate.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&cfg).current_dir(dir);
    // The gateway's default request log (a line per request, read by this harness);
    // `BENCH_GATEWAY_LOG` overrides it for an experiment.
    let log = std::env::var("BENCH_GATEWAY_LOG").unwrap_or_else(|_| "warn,taskgate=info".into());
    cmd.env("TASKGATE_LOG", log);
    let t0 = Instant::now();
    let mut proc = Proc::spawn(cmd);
    // `http://` or, with `server.tls_cert` (the `tls` scenario), `https://`.
    let line = proc
        .wait_log("taskgate listening on ", Duration::from_secs(120))
        .unwrap_or_else(|| panic!("gateway did not start:\n{}", proc.log_text()));
    let startup = t0.elapsed();
    let addr = addr_after(&line, "://");
    Gateway {
        proc,
        addr,
        startup,
        spawned: t0,
    }
}

/// `mcp-proxy` 0.6.0 in front of the demo upstream; `Err(reason)` if it cannot run.
pub(super) fn start_mcp_proxy(
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
