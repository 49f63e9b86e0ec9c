//! Upstream failures through the real binary (design.md policy 14 and "Upstream
//! unavailable"): crashed stdio children, restarted/expired HTTP sessions, an upstream
//! that is down at start-up, and no orphans after `kill -9` of the gateway.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

per_transport!(
    crash_mid_call_then_next_call_succeeds,
    expire_session_then_next_call_succeeds
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
    // The client gets an error, never a hang or a fake result.
    assert!(r.status == 503 || r.status == 502, "{}", body_text(&r));
    let v = r.json();
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("demo")),
        "must name the upstream: {v}"
    );

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
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(st)) = gw.proc.child.try_wait() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gateway did not stop on SIGTERM:\n{}",
            gw.proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
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
