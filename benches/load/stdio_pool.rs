//! Stdio pool rows of the load harness: the noisy-neighbour point (tenant A's `echo`
//! alone, then while tenant B's calls keep crashing children of the same shared pool,
//! in one run) and the first-call latency of a task-declaring client after start-up
//! and after a child crash.
//!
//! The gateway fronts the demo server over stdio with the shipped default's pool
//! (`max_concurrency = 8`, so 8 children, `isolation = "shared"`, default spares).
//!
//! Kept in its own file (included from `main.rs` as `mod stdio_pool`) so it merges
//! cleanly with other edits to the harness; a child module sees `main.rs`'s private
//! items.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};

use super::harness::{Outcome, Stats, check_echo, contains, run_load};
use super::processes::{Gateway, start_gateway_with, taskgate_bin};
use super::report::{Report, err_note, ms};
use super::requests::{gw_req, token};
use super::{HttpClient, JWT, META, META_TASKS, MakeReq, Opts};

const TITLE: &str = "Stdio pool: noisy neighbour on one shared pool (demo over stdio)";
/// Tenant B's concurrent crash loops (the load the crash throttle was first measured with).
const CRASH_LOOPS: usize = 4;
/// Fresh gateways started for the first-call rows; the row is their median.
const FIRST_CALL_STARTS: usize = 3;

fn config(store: &Path) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
[store]
path = "{store}"
{auth}[tasks]
promote_after_ms = 1000
[[upstream]]
name = "demo"
path = "/mcp"
command = ["{bin}", "demo-upstream"]
max_concurrency = 8
"#,
        store = store.display(),
        auth = JWT.auth_section(),
        bin = taskgate_bin().display(),
    )
}

fn start(dir: &Path) -> Gateway {
    std::fs::create_dir_all(dir).unwrap();
    start_gateway_with(dir, &config(&dir.join("data")))
}

/// Polls `/readyz` until it answers 200 (the pool's first child is initialised).
async fn ready(c: &HttpClient, gw: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let req = Request::get(format!("http://{}/readyz", gw.addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Ok(r) = c.request(req).await
            && r.status() == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("gateway never became ready");
}

fn call(
    gw: &Gateway,
    bearer: &HeaderValue,
    tool: &str,
    meta: &str,
    seq: u64,
) -> Request<Full<Bytes>> {
    let args = if tool == "echo" {
        r#"{"text":"hello"}"#
    } else {
        "{}"
    };
    gw_req(
        gw.addr,
        bearer,
        "tools/call",
        tool,
        format!(
            r#"{{"jsonrpc":"2.0","id":{seq},"method":"tools/call","params":{{"name":"{tool}","arguments":{args},{meta}}}}}"#
        ),
    )
}

/// Any answer counts: B's crash calls end in a JSON-RPC error by design.
fn any_answer(_: StatusCode, _: &[u8]) -> Outcome {
    Outcome::Ok
}

/// One `echo` from a task-declaring client: (latency, answered inline).
async fn timed_echo(
    c: &HttpClient,
    gw: &Gateway,
    bearer: &HeaderValue,
    seq: u64,
) -> (Duration, bool) {
    let t0 = Instant::now();
    let resp = c
        .request(call(gw, bearer, "echo", META_TASKS, seq))
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let inline = contains(&body, b"hello") && !contains(&body, b"\"resultType\":\"task\"");
    (t0.elapsed(), inline)
}

pub(super) fn stdio_pool(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    work: &Path,
) {
    let a = HeaderValue::from_str(&format!("Bearer {}", token("alice", "tenant-a"))).unwrap();
    let b = HeaderValue::from_str(&format!("Bearer {}", token("bob", "tenant-b"))).unwrap();

    rep.section(
        TITLE,
        &[
            "point",
            "A req/s",
            "A p50",
            "A p99",
            "A p50 vs alone",
            "B crashes",
            "errors",
        ],
    );
    let gw = start(&work.join("pool-noisy"));
    rt.block_on(ready(c, &gw));
    let echo_a: MakeReq = {
        let (addr, a) = (gw.addr, a.clone());
        std::sync::Arc::new(move |n| {
            gw_req(
                addr,
                &a,
                "tools/call",
                "echo",
                format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}},{META}}}}}"#
                ),
            )
        })
    };
    let alone = rt.block_on(run_load(
        c,
        1,
        o.warmup,
        o.duration,
        echo_a.clone(),
        check_echo,
    ));
    let crash_b: MakeReq = {
        let (addr, b) = (gw.addr, b.clone());
        std::sync::Arc::new(move |n| {
            gw_req(
                addr,
                &b,
                "tools/call",
                "crash",
                format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"crash","arguments":{{}},{META}}}}}"#
                ),
            )
        })
    };
    // A measures over a longer window than usual: the point is what a crash loop
    // does over time, including the first seconds before any throttle engages.
    let window = o.duration * 3;
    let (noisy, crashes) = rt.block_on(async {
        tokio::join!(
            run_load(c, 1, o.warmup, window, echo_a, check_echo),
            run_load(c, CRASH_LOOPS, o.warmup, window, crash_b, any_answer),
        )
    });
    let row = |rep: &mut Report, name: &str, s: &Stats, crashes: Option<&Stats>| {
        rep.row(&[
            name.into(),
            format!("{:.1}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{:.2}×", s.p50() / alone.p50()),
            crashes.map_or("–".into(), |b| b.ok.to_string()),
            format!("{}{}", s.errors + s.refused, err_note(s)),
        ]);
    };
    row(rep, "A echo alone (c=1)", &alone, None);
    row(
        rep,
        &format!("A echo while B crash-loops (c={CRASH_LOOPS})"),
        &noisy,
        Some(&crashes),
    );
    drop(gw);

    rep.section(
        "Stdio pool: first fast call from a task-declaring client (promote_after_ms = 1000)",
        &["point", "median latency", "max latency", "answered inline"],
    );
    let mut after_start = Vec::new();
    let mut after_crash = Vec::new();
    for i in 0..FIRST_CALL_STARTS {
        let gw = start(&work.join(format!("pool-first-{i}")));
        rt.block_on(async {
            ready(c, &gw).await;
            after_start.push(timed_echo(c, &gw, &a, 1).await);
            // Let the spare that first call started settle: the row is a crash in a
            // pool in use, not one within a second of its first call.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let r = c.request(call(&gw, &b, "crash", META, 2)).await.unwrap();
            let _ = r.into_body().collect().await;
            after_crash.push(timed_echo(c, &gw, &a, 3).await);
        });
    }
    for (name, mut v) in [
        ("after start-up (/readyz 200)", after_start),
        ("right after a child crash", after_crash),
    ] {
        v.sort();
        let inline = v.iter().filter(|(_, i)| *i).count();
        rep.row(&[
            name.into(),
            ms(v[v.len() / 2].0.as_micros() as f64),
            ms(v[v.len() - 1].0.as_micros() as f64),
            format!("{inline}/{}", v.len()),
        ]);
    }
}
