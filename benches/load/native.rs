//! "Native reference" rows of the load harness: the same task-creation and `tasks/get`
//! scenarios against the Python `fastmcp[tasks]==4.1.4` reference server
//! (`benches/native_fastmcp_server.py`, run with `.peers/venv-fastmcp/bin/python`),
//! measured with the harness's own load loop (`run_load`) and checks.
//!
//! The native server speaks 2026-07-28 + tasks over stateless streamable HTTP on
//! loopback, with no auth; its task store is fastmcp-tasks' default `memory://` Docket
//! backend (in-process, nothing on disk), and its worker runs the task bodies in the
//! same Python process that serves HTTP.
//!
//! Kept in its own file (included from `main.rs` as `mod native`) so it merges cleanly
//! with other edits to the harness; a child module sees `main.rs`'s private items.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};

use super::harness::{check_completed, check_task_created, cpu_us_per, run_load};
use super::processes::{Proc, addr_after};
use super::report::{Report, err_note, ms};
use super::requests::post;
use super::{HttpClient, META_TASKS, MakeReq, Opts, root};

const TITLE: &str = "Native reference (Python fastmcp[tasks]==4.1.4)";
/// Docket worker concurrency passed to the server (fastmcp-tasks' default is 10).
const WORKER_CONCURRENCY: u32 = 1000;

fn python() -> PathBuf {
    root().join(".peers/venv-fastmcp/bin/python")
}

fn script() -> PathBuf {
    root().join("benches/native_fastmcp_server.py")
}

/// The running reference server. Dropping it kills the process (via `Proc`); its stdin
/// is a pipe we hold, so the server also exits on EOF if this harness dies.
struct Native {
    proc: Proc,
    _stdin: ChildStdin,
    addr: SocketAddr,
}

fn start() -> Result<Native, String> {
    let py = python();
    if !py.exists() {
        return Err(".peers/venv-fastmcp missing (bash scripts/install-peers.sh)".into());
    }
    let mut cmd = Command::new(&py);
    cmd.arg(script())
        .arg("0")
        .arg("--concurrency")
        .arg(WORKER_CONCURRENCY.to_string())
        .current_dir(root())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", py.display()))?;
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if std::env::var_os("BENCH_LOGS").is_some() {
                eprintln!("[native] {line}");
            }
            let mut l = sink.lock().unwrap();
            if l.len() < 10_000 {
                l.push(line);
            }
        }
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("listening on http://") {
                let _ = tx.send(line);
            }
        }
    });
    let mut proc = Proc { child, logs };
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => Ok(Native {
            addr: addr_after(&line, "http://"),
            proc,
            _stdin: stdin,
        }),
        Err(_) => {
            let _ = proc.child.kill();
            let tail: String = proc.log_text().chars().rev().take(300).collect();
            Err(format!(
                "server did not start within 60 s: {}",
                tail.chars().rev().collect::<String>()
            ))
        }
    }
}

/// A 2026-07-28 request as the native server requires it: `MCP-Protocol-Version`, and
/// `Mcp-Method`/`Mcp-Name` matching the body (it answers 400 -32020 on a mismatch and
/// treats a request without the version header as a legacy one needing a session).
/// No `Authorization`: the reference server runs without auth.
fn native_req(addr: SocketAddr, method: &str, name: &str, body: String) -> Request<Full<Bytes>> {
    post(&format!("http://{addr}/mcp"))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn sleep_body(seq: u64, ms: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{seq},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":{ms}}},{META_TASKS}}}}}"#
    )
}

fn get_req(addr: SocketAddr, seq: u64, id: &str) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{seq},"method":"tasks/get","params":{{"taskId":"{id}",{META_TASKS}}}}}"#
    );
    native_req(addr, "tasks/get", id, body)
}

/// After a creation point the worker still runs the queued 100 ms bodies; their cost
/// belongs to the point. Waits until the server's CPU use settles (< 2% of a core over
/// 250 ms), at most 20 s. Returns the wait.
fn drain(n: &Native) -> Duration {
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let mut last = n.proc.cpu_secs();
    while t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(250));
        let now = n.proc.cpu_secs();
        if now - last < 0.005 {
            break;
        }
        last = now;
    }
    t0.elapsed()
}

/// Creates `count` tasks (`sleep {ms:0}`) with `conc` concurrent clients and waits until
/// every one reports `completed` (bounded). Setup for the `tasks/get` points, not a
/// measurement.
async fn create_completed(
    c: &HttpClient,
    addr: SocketAddr,
    count: usize,
    conc: usize,
) -> Result<Vec<String>, String> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let ids = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let next = Arc::new(AtomicUsize::new(0));
    let seq = Arc::new(AtomicU64::new(1));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conc {
        let (c, ids, next, seq) = (c.clone(), ids.clone(), next.clone(), seq.clone());
        set.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < count {
                if Instant::now() > deadline {
                    return Err("creating the tasks/get set took over 180 s".to_string());
                }
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let body = String::from_utf8(
                    fetch(
                        &c,
                        native_req(addr, "tools/call", "sleep", sleep_body(n, 0)),
                    )
                    .await?,
                )
                .map_err(|e| e.to_string())?;
                let id = task_id(&body).ok_or_else(|| format!("no task handle: {body}"))?;
                ids.lock().unwrap().push(id);
            }
            Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    let ids = std::mem::take(&mut *ids.lock().unwrap());
    // Every task must be completed before the get points (their check wants it).
    let mut pending: Vec<String> = ids.clone();
    while !pending.is_empty() {
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {count} tasks not completed after 180 s",
                pending.len()
            ));
        }
        let mut still = Vec::new();
        for (i, id) in pending.iter().enumerate() {
            let b = fetch(c, get_req(addr, i as u64, id)).await?;
            if !super::harness::contains(&b, b"\"status\":\"completed\"") {
                still.push(id.clone());
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(ids)
}

async fn fetch(c: &HttpClient, req: Request<Full<Bytes>>) -> Result<Vec<u8>, String> {
    let resp = tokio::time::timeout(Duration::from_secs(30), c.request(req))
        .await
        .map_err(|_| "request timed out (30 s)".to_string())?
        .map_err(|e| e.to_string())?;
    let st = resp.status();
    let b = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !st.is_success() {
        return Err(format!("{st}: {}", String::from_utf8_lossy(&b)));
    }
    Ok(b.to_vec())
}

fn task_id(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let r = &v["result"];
    (r["resultType"] == "task").then(|| r["taskId"].as_str().map(str::to_owned))?
}

fn not_run(rep: &mut Report, why: &str) {
    rep.section(TITLE, &["scenario", "result"]);
    rep.row(&["tasks/get, creation".into(), format!("not run: {why}")]);
}

pub(super) fn native_reference(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
) {
    let n = match start() {
        Ok(n) => n,
        Err(e) => return not_run(rep, &e.replace(['\n', '|'], " ")),
    };
    let rss0 = n.proc.rss();

    // (a) Creation: the tool always runs as a task when the call declares tasks.
    rep.section(
        &format!("{TITLE}: task creation, tools/call sleep {{ms:100}} with tasks declared"),
        &[
            "c",
            "task handles/s",
            "p50",
            "p99",
            "errors",
            "server CPU µs/task",
            "drain after point",
            "server RSS after",
        ],
    );
    for conc in [1usize, 16, 64] {
        let addr = n.addr;
        let mk: MakeReq =
            Arc::new(move |seq| native_req(addr, "tools/call", "sleep", sleep_body(seq, 100)));
        let cpu0 = n.proc.cpu_secs();
        let s = rt.block_on(run_load(
            c,
            conc,
            o.warmup,
            o.duration,
            mk,
            check_task_created,
        ));
        let waited = drain(&n);
        let cpu = cpu_us_per(&n.proc, cpu0, &s);
        rep.row(&[
            conc.to_string(),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{}{}", s.errors + s.refused, err_note(&s)),
            format!("{cpu:.0}"),
            format!("{:.1} s", waited.as_secs_f64()),
            format!("{:.0} MB", n.proc.rss() as f64 / 1e6),
        ]);
    }

    // (b) tasks/get over a set of completed tasks created beforehand.
    let count: usize = if o.quick { 1000 } else { 5000 };
    let t0 = Instant::now();
    let ids = match rt.block_on(create_completed(c, n.addr, count, 16)) {
        Ok(ids) => Arc::new(ids),
        Err(e) => {
            rep.section(&format!("{TITLE}: tasks/get"), &["scenario", "result"]);
            rep.row(&[
                "tasks/get".into(),
                format!("not run: {}", e.replace(['\n', '|'], " ")),
            ]);
            return;
        }
    };
    let setup = t0.elapsed();
    rep.section(
        &format!("{TITLE}: tasks/get over {count} completed tasks"),
        &["c", "req/s", "p50", "p99", "server CPU µs/req", "errors"],
    );
    for conc in [32usize, 64] {
        let addr = n.addr;
        let ids = ids.clone();
        let mk: MakeReq = Arc::new(move |seq| {
            // The same cheap scramble as the taskgate get points.
            let i = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % ids.len() as u64;
            get_req(addr, seq, &ids[i as usize])
        });
        let cpu0 = n.proc.cpu_secs();
        let s = rt.block_on(run_load(c, conc, o.warmup, o.duration, mk, check_completed));
        let cpu = cpu_us_per(&n.proc, cpu0, &s);
        rep.row(&[
            conc.to_string(),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{cpu:.0}"),
            format!("{}{}", s.errors + s.refused, err_note(&s)),
        ]);
    }
    rep.note(&format!(
        "Native reference: `benches/native_fastmcp_server.py` on fastmcp[tasks]==4.1.4 \
         (uvicorn, one Python process, Docket worker concurrency {WORKER_CONCURRENCY}), \
         stateless 2026-07-28 streamable HTTP with JSON bodies, **no auth** (the taskgate rows \
         verify a JWT per request). Task state lives in the in-process `memory://` Docket \
         backend (burner-redis): nothing is written to disk, so unlike taskgate's sled store \
         it does not survive a restart. The task bodies run in the same process and event \
         loop that serves HTTP. Requests carry `MCP-Protocol-Version`, `Mcp-Method` and \
         `Mcp-Name`. The tasks/get set was created with `sleep {{ms:0}}` in {:.1} s; server \
         RSS {:.0} MB at start, {:.0} MB at the end; creation CPU includes running the \
         bodies (the drain after each point).",
        setup.as_secs_f64(),
        rss0 as f64 / 1e6,
        n.proc.rss() as f64 / 1e6,
    ));
    drop(n); // kills the server
}
