//! Upstream failures through the real binary (docs/design.md §14 "Upstream sessions"
//! and §12 "HTTP front", "Retry safety of upstream failures"): crashed stdio children,
//! restarted/expired HTTP sessions, an upstream that is down at start-up, upstream 5xx
//! answers, no orphans after `kill -9` of the gateway, and a second gateway instance
//! that must not touch the first one's children (README "Stdio children and pid
//! records").
//!
//! The status rule: a call that was never sent is 503 + `Retry-After` (a retry is
//! safe); a call that was sent and then failed is 200 + `-32603` (it is the request's
//! outcome, and SDK clients would lose a non-2xx message as a transport error).

#[macro_use]
mod common;
mod tasks_support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use serde_json::{Value, json};

per_transport!(
    crash_mid_call_then_next_call_succeeds,
    expire_session_then_next_call_succeeds,
    crashed_call_is_200_with_32603_and_the_request_id,
);

fn body_text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// 503 + Retry-After + JSON-RPC -32603 whose message names the upstream.
#[track_caller]
fn assert_unavailable(r: &Resp, what: &str) {
    assert_eq!(r.status, 503, "{what}: {}", body_text(r));
    assert!(
        r.header("retry-after").is_some(),
        "{what}: no Retry-After: {:?}",
        r.headers
    );
    let v = r.json();
    assert_eq!(v["id"], 1, "{what}: {v}");
    assert_eq!(v["error"]["code"], -32603, "{what}: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("demo")),
        "{what}: message must name the upstream: {v}"
    );
}

/// 200 + JSON-RPC -32603 (no `Retry-After`): the call was sent and then failed, and the
/// message names the upstream and says what happened.
#[track_caller]
fn assert_sent_then_failed(r: &Resp, id: &Value, what: &str) -> String {
    assert_eq!(r.status, 200, "{what}: {}", body_text(r));
    assert!(
        r.header("retry-after").is_none(),
        "{what}: a sent call must not invite a retry: {:?}",
        r.headers
    );
    let v = r.json();
    assert_eq!(&v["id"], id, "{what}: {v}");
    assert!(v.get("result").is_none(), "{what}: {v}");
    assert_eq!(v["error"]["code"], -32603, "{what}: {v}");
    let m = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(m.contains("demo"), "{what}: must name the upstream: {v}");
    assert!(
        !m.contains("unavailable"),
        "{what}: must say what happened, not 'unavailable': {v}"
    );
    m
}

/// `tools/call` with a chosen request id (to prove the id is echoed).
async fn call_with_id(c: &Client2026, id: Value, tool: &str, args: Value) -> Resp {
    let params = json!({"name": tool, "arguments": args});
    let body = c.body(id, "tools/call", &params);
    c.send("tools/call", &params, &body).await
}

/// Call echo until it succeeds; only 503 + Retry-After is tolerated meanwhile.
async fn echo_eventually(c: &Client2026, text: &str, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let r = c.call_tool("echo", json!({"text": text})).await;
        if r.status == 200 && r.json().get("result").is_some() {
            return r.json()["result"].clone();
        }
        assert_unavailable(&r, "while the upstream recovers");
        assert!(
            start.elapsed() < limit,
            "echo never succeeded: {}",
            body_text(&r)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pids of live (non-zombie) processes whose environment contains `marker`.
fn pids_with_marker(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if !is_alive(pid) {
            continue;
        }
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ"))
            && env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes())
        {
            out.push(pid);
        }
    }
    out.sort();
    out
}

/// Exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ..." — comm may contain spaces/parens; state follows the last ')'.
            let state = stat
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start())
                .unwrap_or("");
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

fn marker() -> (String, String) {
    let v = format!("{}-{}", std::process::id(), rand::random::<u64>());
    (
        format!("TASKGATE_TEST_MARKER={v}"),
        format!("env = {{ TASKGATE_TEST_MARKER = \"{v}\" }}\n"),
    )
}

async fn crash_mid_call_then_next_call_succeeds(t: Transport) {
    let (mark, env) = marker();
    // One child, so the crash hits the child that serves the next call too.
    let extra = match t {
        Transport::Stdio => format!("max_concurrency = 1\nstdio_processes = 1\n{env}"),
        Transport::Http => String::new(),
    };
    let s = DemoSetup::start(t, "", &extra).await;
    s.gw.wait_ready().await;
    let c = s.client();
    assert_eq!(
        first_text(&echo_eventually(&c, "before", Duration::from_secs(10)).await),
        "before"
    );
    let before = pids_with_marker(&mark);
    if t == Transport::Stdio {
        assert_eq!(before.len(), 1, "one stdio child expected: {before:?}");
    }

    let r = c.call_tool("crash", json!({})).await;
    // The client gets an error, never a hang or a fake result: the call reached the
    // upstream, so 200 + -32603.
    assert_sent_then_failed(&r, &json!(1), "crash");

    // The next call succeeds (a restarting upstream may answer 503 + Retry-After).
    let res = echo_eventually(&c, "after", Duration::from_secs(30)).await;
    assert_eq!(first_text(&res), "after");
    if t == Transport::Stdio {
        let after = pids_with_marker(&mark);
        assert_eq!(after.len(), 1, "{after:?}");
        assert_ne!(before, after, "the crashed child was replaced");
    }
    // And the upstream stays usable.
    assert_eq!(
        first_text(&echo_eventually(&c, "again", Duration::from_secs(5)).await),
        "again"
    );
}

/// A call that reached the upstream and then died with it (stdio: the child exits;
/// HTTP: the server drops the connection) is answered 200 + `-32603` saying what
/// happened, with the request's own id — inline as JSON, and likewise for a client
/// with the tasks extension whose call fails before the promotion deadline.
async fn crashed_call_is_200_with_32603_and_the_request_id(t: Transport) {
    let s = DemoSetup::start(t, "", "").await;
    s.gw.wait_ready().await;
    let c = s.client();
    echo_eventually(&c, "warm", Duration::from_secs(10)).await;

    let r = call_with_id(&c, json!("crash-7"), "crash", json!({})).await;
    assert!(!r.is_sse(), "{:?}", r.headers);
    let m = assert_sent_then_failed(&r, &json!("crash-7"), "plain crash");
    if t == Transport::Stdio {
        assert!(m.contains("exit"), "must say the child exited: {m}");
    }

    echo_eventually(&c, "between", Duration::from_secs(30)).await;
    let declaring = s.client().with_caps(json!({
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    }));
    let r = call_with_id(&declaring, json!(8008), "crash", json!({})).await;
    assert_sent_then_failed(&r, &json!(8008), "crash with the tasks extension");
}

async fn expire_session_then_next_call_succeeds(t: Transport) {
    let s = DemoSetup::start(t, "", "").await;
    s.gw.wait_ready().await;
    let c = s.client();
    for round in 0..3 {
        let r = c.call_tool("expire_session", json!({})).await;
        assert_eq!(r.status, 200, "{}", body_text(&r));
        let text = first_text(&r.json()["result"]);
        match t {
            Transport::Http => assert_eq!(text, "session expired"),
            Transport::Stdio => assert_eq!(text, "not supported"),
        }
        // The very next call must succeed: the gateway re-initialises on 404 itself.
        let r = c
            .call_tool("echo", json!({"text": format!("round {round}")}))
            .await;
        assert_eq!(r.status, 200, "round {round}: {}", body_text(&r));
        assert_eq!(first_text(&r.json()["result"]), format!("round {round}"));
    }
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_upstream_restart_on_same_port() {
    let mut demo = DemoHttp::start().await;
    let port = demo.port;
    let gw = Gateway::start(&format!("{}{}", jwt_auth(), demo_http_upstream(port, ""))).await;
    gw.wait_ready().await;
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    assert_eq!(
        first_text(&echo_eventually(&c, "one", Duration::from_secs(10)).await),
        "one"
    );
    // Counter state lives in the first server process.
    let r = c.call_tool("counter", json!({"key": "k"})).await;
    assert_eq!(first_text(&r.json()["result"]), "count=1");

    demo.proc.kill9();
    // While it is down: 503 + Retry-After + -32603 naming the upstream.
    let r = c.call_tool("echo", json!({"text": "down"})).await;
    assert_unavailable(&r, "upstream killed");

    let demo2 = DemoHttp::start_on(port).await;
    // The new process knows no session (404) → the gateway re-initialises.
    let res = echo_eventually(&c, "two", Duration::from_secs(30)).await;
    assert_eq!(first_text(&res), "two");
    // It really is the new process: its counter starts again.
    let r = c.call_tool("counter", json!({"key": "k"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(first_text(&r.json()["result"]), "count=1");
    drop(demo2);
}

async fn readyz(gw: &Gateway) -> Resp {
    raw(&gw.url("/readyz"), "GET", &[], bytes::Bytes::new())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_at_start_then_comes_up() {
    let port = free_port();
    let gw = Gateway::start(&format!("{}{}", jwt_auth(), demo_http_upstream(port, ""))).await;
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));

    // /readyz: 503, naming the upstream as down.
    let start = Instant::now();
    let mut last;
    loop {
        last = readyz(&gw).await;
        assert_eq!(last.status, 503, "{}", body_text(&last));
        if last.json()["upstreams"]["demo"]["state"] == "down" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "upstream never reported down: {}",
            body_text(&last)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last.json()["ready"], false);

    // A call: 503 + Retry-After + -32603 naming the upstream. Also server/discover.
    assert_unavailable(
        &c.call_tool("echo", json!({"text": "x"})).await,
        "tools/call",
    );
    assert_unavailable(
        &c.request("server/discover", json!({})).await,
        "server/discover",
    );
    assert_unavailable(&c.request("tools/list", json!({})).await, "tools/list");

    // Start the upstream on that port: /readyz turns 200 by itself (no traffic needed).
    let _demo = DemoHttp::start_on(port).await;
    let start = Instant::now();
    loop {
        let r = readyz(&gw).await;
        if r.status == 200 {
            assert_eq!(
                r.json()["upstreams"]["demo"]["state"],
                "ready",
                "{}",
                body_text(&r)
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "/readyz never turned 200 after the upstream came up: {}",
            body_text(&r)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let res = echo_eventually(&c, "up", Duration::from_secs(10)).await;
    assert_eq!(first_text(&res), "up");
    let r = c.request("server/discover", json!({})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_gateway_orphans_no_children() {
    let (mark, _) = marker();
    let upstream = stdio_upstream_bare(&format!(
        "max_concurrency = 3\nenv = {{ DEMO_IGNORE_EOF = \"1\", TASKGATE_TEST_MARKER = \"{}\" }}\n",
        mark.trim_start_matches("TASKGATE_TEST_MARKER=")
    ));
    let mut gw = Gateway::start(&format!("{}{upstream}", jwt_auth())).await;
    gw.wait_ready().await;
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    // Concurrent calls so the pool grows beyond the eager child.
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
            tokio::spawn(async move { c.call_tool("sleep", json!({"ms": 500})).await })
        })
        .collect();
    for h in calls {
        let r = h.await.unwrap();
        assert_eq!(r.status, 200, "{}", body_text(&r));
    }
    assert_eq!(
        first_text(&echo_eventually(&c, "x", Duration::from_secs(10)).await),
        "x"
    );

    let children = pids_with_marker(&mark);
    assert!(!children.is_empty(), "no demo children found with {mark}");
    let gw_pid = gw.pid();
    for pid in &children {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid: u32 = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        assert_eq!(ppid, gw_pid, "child {pid} is not the gateway's: {stat}");
    }

    gw.proc.kill9();
    let gone = eventually(Duration::from_secs(15), || {
        children.iter().all(|p| !is_alive(*p))
    })
    .await;
    let left: Vec<u32> = children.iter().copied().filter(|p| is_alive(*p)).collect();
    // Do not leave them behind even when the test fails.
    for p in &left {
        unsafe {
            libc::kill(*p as i32, libc::SIGKILL);
        }
    }
    assert!(gone, "children survived kill -9 of the gateway: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_gateway_stops_children() {
    let (mark, _) = marker();
    let upstream = stdio_upstream_bare(&format!(
        "max_concurrency = 2\nenv = {{ DEMO_IGNORE_EOF = \"1\", TASKGATE_TEST_MARKER = \"{}\" }}\n",
        mark.trim_start_matches("TASKGATE_TEST_MARKER=")
    ));
    let mut gw = Gateway::start(&format!("{}{upstream}", jwt_auth())).await;
    gw.wait_ready().await;
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    assert_eq!(
        first_text(&echo_eventually(&c, "x", Duration::from_secs(10)).await),
        "x"
    );
    let children = pids_with_marker(&mark);
    assert!(!children.is_empty(), "no demo children found");

    gw.proc.sigterm();
    let status = gw.proc.wait_exit(Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "exit status {status:?}:\n{}",
        gw.proc.log_text()
    );
    // Children that ignore stdin EOF are still stopped by the gateway itself.
    let gone = eventually(Duration::from_secs(15), || {
        children.iter().all(|p| !is_alive(*p))
    })
    .await;
    let left: Vec<u32> = children.iter().copied().filter(|p| is_alive(*p)).collect();
    for p in &left {
        unsafe {
            libc::kill(*p as i32, libc::SIGKILL);
        }
    }
    assert!(gone, "children survived SIGTERM of the gateway: {left:?}");
}

/// Calls to an upstream that stopped answering connections (connection refused: the
/// request was never sent) are 503 + `Retry-After` + `-32603` naming the upstream, for
/// every path that reaches it: a plain and a declaring `tools/call`, `tools/list`,
/// `prompts/list`, `resources/read`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_503_with_retry_after_and_32603() {
    let mut demo = DemoHttp::start().await;
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_auth(),
        demo_http_upstream(demo.port, "")
    ))
    .await;
    gw.wait_ready().await;
    demo.proc.kill9();
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    let declaring = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")))
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));

    assert_unavailable(
        &c.call_tool("echo", json!({"text": "x"})).await,
        "tools/call",
    );
    assert_unavailable(
        &declaring.call_tool("echo", json!({"text": "x"})).await,
        "tools/call with the tasks extension",
    );
    assert_unavailable(&c.request("tools/list", json!({})).await, "tools/list");
    assert_unavailable(&c.request("prompts/list", json!({})).await, "prompts/list");
    assert_unavailable(
        &c.request("resources/read", json!({"uri": "demo://readme"}))
            .await,
        "resources/read",
    );
}

/// A pass-through proxy to the demo HTTP server on `port`. While the returned status is
/// non-zero, every JSON-RPC request except `initialize` is read in full (so the gateway
/// has written it) and answered with that status instead of being forwarded.
async fn status_proxy(port: u16) -> (String, Arc<AtomicU16>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fail = Arc::new(AtomicU16::new(0));
    let answer = fail.clone();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (answer, client) = (answer.clone(), client.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: ::http::Request<hyper::body::Incoming>| {
                        let (answer, client) = (answer.clone(), client.clone());
                        async move {
                            type B = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|c| c.to_bytes())
                                .unwrap_or_default();
                            let msg: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let status = answer.load(Ordering::SeqCst);
                            let is_request = msg.get("id").is_some() && msg.get("method").is_some();
                            if status != 0 && is_request && msg["method"] != "initialize" {
                                let text = format!("proxy says {status}");
                                let resp: ::http::Response<B> = ::http::Response::builder()
                                    .status(status)
                                    .body(
                                        http_body_util::Full::new(Bytes::from(text))
                                            .map_err(|never| match never {})
                                            .boxed(),
                                    )
                                    .unwrap();
                                return Ok::<_, Infallible>(resp);
                            }
                            let uri = format!(
                                "http://127.0.0.1:{port}{}",
                                parts
                                    .uri
                                    .path_and_query()
                                    .map(|p| p.as_str())
                                    .unwrap_or("/")
                            );
                            let mut b = ::http::Request::builder().method(parts.method).uri(uri);
                            for (k, v) in parts.headers.iter() {
                                if k != ::http::header::HOST {
                                    b = b.header(k, v);
                                }
                            }
                            let out = b.body(http_body_util::Full::new(body)).unwrap();
                            let resp: ::http::Response<B> = match client.request(out).await {
                                Ok(r) => r.map(|b| b.boxed()),
                                Err(_) => ::http::Response::builder()
                                    .status(599)
                                    .body(
                                        http_body_util::Empty::<Bytes>::new()
                                            .map_err(|never| match never {})
                                            .boxed(),
                                    )
                                    .unwrap(),
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}/mcp"), fail)
}

/// An HTTP upstream (or a proxy in front of it) that answers 502/503/504 *after* the
/// gateway wrote the request: the request may have run, so the client gets 200 +
/// `-32603` naming the upstream and the status — never a 5xx the SDK would turn into a
/// transport error, and never an invitation to retry. Every path: `tools/call` (plain
/// and declaring), `tools/list`, `prompts/list`, `resources/read`. The session survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_5xx_after_the_request_was_written_is_200_with_32603() {
    let demo = DemoHttp::start().await;
    let (url, fail) = status_proxy(demo.port).await;
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_auth(),
        http_upstream("demo", "/mcp", &url, "")
    ))
    .await;
    gw.wait_ready().await;
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    let declaring = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")))
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));

    for status in [502u16, 503, 504] {
        fail.store(status, Ordering::SeqCst);
        let what = format!("tools/call answered {status}");
        let r = call_with_id(
            &c,
            json!(format!("s-{status}")),
            "echo",
            json!({"text": "x"}),
        )
        .await;
        let m = assert_sent_then_failed(&r, &json!(format!("s-{status}")), &what);
        assert!(
            m.contains(&status.to_string()),
            "{what}: must name the status: {m}"
        );
    }
    fail.store(503, Ordering::SeqCst);
    let r = call_with_id(&declaring, json!(99), "echo", json!({"text": "x"})).await;
    assert_sent_then_failed(&r, &json!(99), "declaring tools/call answered 503");
    let r = c.request("tools/list", json!({})).await;
    assert_sent_then_failed(&r, &json!(1), "tools/list answered 503");
    let r = c.request("prompts/list", json!({})).await;
    assert_sent_then_failed(&r, &json!(1), "prompts/list answered 503");
    let r = c
        .request("resources/read", json!({"uri": "demo://readme"}))
        .await;
    assert_sent_then_failed(&r, &json!(1), "resources/read answered 503");

    // The upstream session was not lost: the next call goes through.
    fail.store(0, Ordering::SeqCst);
    let r = c.call_tool("echo", json!({"text": "back"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(first_text(&r.json()["result"]), "back");
    drop(demo);
}

/// Kills every process carrying the marker when the test ends, passed or not: the
/// tests below create process groups that outlive their gateway on purpose.
struct KillMarked(String);

impl Drop for KillMarked {
    fn drop(&mut self) {
        for p in pids_with_marker(&self.0) {
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
            }
        }
    }
}

/// Every pid record (`*.json`) under `dir`, at any depth.
fn records_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(records_under(&p));
        } else if p.extension().is_some_and(|x| x == "json") {
            out.insert(p);
        }
    }
    out
}

/// The `recorder.pid` a pid record names.
fn recorder_of(record: &Path) -> Option<u64> {
    let v: Value = serde_json::from_slice(&std::fs::read(record).ok()?).ok()?;
    v["recorder"]["pid"].as_u64()
}

/// A config file in `dir`: `[server]` on port 0 plus `server_extra`, `[store]` at
/// `store` plus `store_extra`, then `body`.
fn write_config(
    dir: &Path,
    store: &Path,
    server_extra: &str,
    store_extra: &str,
    body: &str,
) -> PathBuf {
    let path = dir.join("taskgate.toml");
    write(
        &path,
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n{server_extra}\n[store]\npath = {}\n{store_extra}\n{body}",
            toml_string(&store.display().to_string())
        ),
    );
    path
}

/// The store lock comes first: a second gateway on the same config (same store) while
/// the first serves a long task stops with a clear error before it touches anything,
/// and the first's children and task are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_instance_on_the_same_store_exits_without_touching_the_first() {
    let (mark, env) = marker();
    let _cleanup = KillMarked(mark.clone());
    let gw = tasks_support::start_ready(&tasks_support::stdio_body("", &env)).await;
    let c = tasks_support::tasks_client(&gw, "alice", "acme");
    // Long enough to be in flight for the whole life of the second instance.
    let task = tasks_support::task_id(
        &tasks_support::create_task(&c, "sleep", json!({"ms": 20000, "steps": 20})).await,
    );
    let children = pids_with_marker(&mark);
    assert!(!children.is_empty(), "no demo children found with {mark}");
    let records = records_under(&gw.dir.path().join("data"));
    assert!(!records.is_empty(), "no pid records in the store directory");

    let mut cmd = Command::new(bin());
    cmd.arg("--config")
        .arg(&gw.config_path)
        .current_dir(gw.dir.path());
    let mut second = Proc::spawn(cmd);
    let start = Instant::now();
    let status = loop {
        let dead: Vec<u32> = children.iter().copied().filter(|p| !is_alive(*p)).collect();
        assert!(
            dead.is_empty(),
            "the second instance killed the first's children {dead:?}:\n{}",
            second.log_text()
        );
        if let Ok(Some(st)) = second.child.try_wait() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "second instance did not exit:\n{}",
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Let the stderr reader catch up with the last lines.
    let _ = second
        .wait_log("another running taskgate", Duration::from_secs(10))
        .await;
    let log = second.log_text();
    assert!(!status.success(), "second instance exited 0:\n{log}");
    assert!(
        log.contains("another running taskgate")
            && log.contains(&gw.dir.path().join("data").display().to_string()),
        "the error must say another taskgate holds the store, naming it:\n{log}"
    );
    assert!(!log.contains("killed leftover"), "{log}");
    assert_eq!(
        records_under(&gw.dir.path().join("data")),
        records,
        "the second instance changed the first's pid records"
    );
    let status_now = tasks_support::ok_result(&tasks_support::tasks_get(&c, &task).await);
    assert_eq!(
        status_now["status"], "working",
        "precondition: the task was still in flight when the second instance stopped"
    );

    let done = tasks_support::poll_terminal(&c, &task).await;
    assert_eq!(done["status"], "completed", "{done}");
    let dead: Vec<u32> = children.iter().copied().filter(|p| !is_alive(*p)).collect();
    assert!(dead.is_empty(), "children died: {dead:?}");
    assert!(
        !gw.proc.log_text().contains("exited with signal"),
        "{}",
        gw.proc.log_text()
    );
    // The default runtime_dir is <store.path>/run.
    assert!(
        records
            .iter()
            .all(|r| r.starts_with(gw.dir.path().join("data/run"))),
        "pid records outside <store>/run: {records:?}"
    );
}

/// Two gateways on different stores that share `store.runtime_dir` and
/// `server.replica_id`: the second finds the first's pid records, but their recorder is
/// alive, so it neither kills those children nor deletes the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_runtime_dir_leaves_a_live_recorders_children_alone() {
    let shared = tempfile::tempdir().unwrap();
    let runtime = shared.path().join("run");
    let server_extra = "replica_id = \"shared-replica\"\n";
    let store_extra = format!(
        "runtime_dir = {}\n",
        toml_string(&runtime.display().to_string())
    );
    let replica_dir = runtime.join("shared-replica");

    let (mark1, env1) = marker();
    let _cleanup1 = KillMarked(mark1.clone());
    let dir1 = tempfile::tempdir().unwrap();
    let cfg1 = write_config(
        dir1.path(),
        &dir1.path().join("data"),
        server_extra,
        &store_extra,
        &format!("{}{}", jwt_auth(), demo_stdio_upstream(&env1)),
    );
    let gw1 = Gateway::launch(dir1, cfg1).await;
    gw1.wait_ready().await;
    let c1 = Client2026::new(&gw1, "/mcp", Some(token("alice", "acme")));
    assert_eq!(
        first_text(&echo_eventually(&c1, "one", Duration::from_secs(10)).await),
        "one"
    );
    let children1 = pids_with_marker(&mark1);
    assert!(!children1.is_empty(), "no demo children found with {mark1}");
    let records1 = records_under(&replica_dir);
    assert!(
        !records1.is_empty(),
        "no records in {}",
        replica_dir.display()
    );
    for r in &records1 {
        assert_eq!(
            recorder_of(r),
            Some(u64::from(gw1.pid())),
            "{}",
            r.display()
        );
    }

    let (mark2, env2) = marker();
    let _cleanup2 = KillMarked(mark2.clone());
    let dir2 = tempfile::tempdir().unwrap();
    let cfg2 = write_config(
        dir2.path(),
        &dir2.path().join("data"),
        server_extra,
        &store_extra,
        &format!("{}{}", jwt_auth(), demo_stdio_upstream(&env2)),
    );
    // Listening means its start-up scan of the shared directory is over.
    let gw2 = Gateway::launch(dir2, cfg2).await;
    gw2.wait_ready().await;
    assert!(
        !gw2.proc.log_text().contains("killed leftover"),
        "{}",
        gw2.proc.log_text()
    );
    let dead: Vec<u32> = children1
        .iter()
        .copied()
        .filter(|p| !is_alive(*p))
        .collect();
    assert!(dead.is_empty(), "the second gateway killed {dead:?}");
    for r in &records1 {
        assert!(r.exists(), "the second gateway deleted {}", r.display());
    }
    // Both keep serving, the first with the very same children.
    let c2 = Client2026::new(&gw2, "/mcp", Some(token("bob", "acme")));
    assert_eq!(
        first_text(&echo_eventually(&c2, "two", Duration::from_secs(10)).await),
        "two"
    );
    assert_eq!(
        first_text(&echo_eventually(&c1, "three", Duration::from_secs(10)).await),
        "three"
    );
    for p in &children1 {
        assert!(is_alive(*p), "child {p} of the first gateway died");
    }
    assert!(
        pids_with_marker(&mark1)
            .iter()
            .all(|p| children1.contains(p))
    );
    let gw2_records: Vec<_> = records_under(&replica_dir)
        .into_iter()
        .filter(|r| recorder_of(r) == Some(u64::from(gw2.pid())))
        .collect();
    assert!(
        !gw2_records.is_empty(),
        "the second gateway records its own children there too"
    );
}

/// `kill -9` of the gateway leaves a grandchild behind (the death signal reaches only
/// the direct child); the restart finds it in `<runtime_dir>/<replica_id>` and kills
/// it. Leftovers recorded by an older version in `<store>/children` go the same way,
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_kill9_kills_leftovers_from_the_runtime_dir() {
    let (mark, _) = marker();
    let _cleanup = KillMarked(mark.clone());
    let mark_value = mark.trim_start_matches("TASKGATE_TEST_MARKER=").to_string();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("data");
    let runtime = dir.path().join("rt");
    let replica_dir = runtime.join("r1");
    // The wrapper forks a grandchild that outlives the demo server it execs.
    let script = format!(
        "sleep 100000 >/dev/null 2>&1 & exec '{}' demo-upstream",
        bin().display()
    );
    let body = format!(
        "{}[[upstream]]\nname = \"demo\"\npath = \"/mcp\"\ncommand = [\"/bin/sh\", \"-c\", {}]\nmax_concurrency = 1\nenv = {{ TASKGATE_TEST_MARKER = \"{mark_value}\" }}\n",
        jwt_auth(),
        toml_string(&script)
    );
    let config = write_config(
        dir.path(),
        &store,
        "replica_id = \"r1\"\n",
        &format!(
            "runtime_dir = {}\n",
            toml_string(&runtime.display().to_string())
        ),
        &body,
    );
    let mut gw = Gateway::launch(dir, config).await;
    gw.wait_ready().await;
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    assert_eq!(
        first_text(&echo_eventually(&c, "x", Duration::from_secs(10)).await),
        "x"
    );
    let before = pids_with_marker(&mark);
    assert_eq!(
        before.len(),
        2,
        "demo server and its sleep expected: {before:?}"
    );
    let records = records_under(&replica_dir);
    assert_eq!(records.len(), 1, "{records:?}");
    let record = records.first().unwrap();
    assert_eq!(recorder_of(record), Some(u64::from(gw.pid())));
    let leader: u32 = record
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(before.contains(&leader), "{leader} not in {before:?}");
    let grandchild: Vec<u32> = before.iter().copied().filter(|p| *p != leader).collect();
    assert!(
        records_under(&store).is_empty(),
        "records must live in runtime_dir only"
    );

    // A leftover of an older gateway version: a group recorded in <store>/children
    // without a recorder.
    let legacy_dir = store.join("children");
    std::fs::create_dir_all(&legacy_dir).unwrap();
    let mut old = {
        use std::os::unix::process::CommandExt;
        Command::new("sleep")
            .arg("100000")
            .env("TASKGATE_TEST_MARKER", &mark_value)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", old.id())).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    write(
        &legacy_dir.join(format!("{}.json", old.id())),
        &json!({"pid": old.id(), "starttime": fields[19].parse::<u64>().unwrap(),
                "session": fields[3].parse::<i64>().unwrap(), "upstream": "demo",
                "program": "sleep"})
        .to_string(),
    );

    gw.proc.kill9();
    // The death signal takes the demo server; its sleep stays: a leftover.
    assert!(
        eventually(Duration::from_secs(15), || !is_alive(leader)).await,
        "the demo server survived kill -9 of the gateway"
    );
    assert!(
        grandchild.iter().all(|p| is_alive(*p)),
        "precondition: the grandchild {grandchild:?} outlives the gateway"
    );

    let Gateway {
        proc,
        dir,
        config_path,
        ..
    } = gw;
    drop(proc);
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    assert!(
        eventually(Duration::from_secs(15), || {
            grandchild.iter().all(|p| !is_alive(*p))
        })
        .await,
        "leftover {grandchild:?} survived the restart:\n{}",
        gw.proc.log_text()
    );
    assert!(
        eventually(Duration::from_secs(15), || {
            matches!(old.try_wait(), Ok(Some(_)))
        })
        .await,
        "the legacy-recorded group survived the restart:\n{}",
        gw.proc.log_text()
    );
    assert!(!legacy_dir.exists(), "legacy record directory not removed");
    assert!(gw.proc.log_text().contains("killed leftover"));
    for r in &records {
        assert!(
            !r.exists(),
            "the dead gateway's record {} was kept",
            r.display()
        );
    }
    let now = records_under(&replica_dir);
    assert!(
        !now.is_empty()
            && now
                .iter()
                .all(|r| recorder_of(r) == Some(u64::from(gw.pid()))),
        "{now:?}"
    );
}
