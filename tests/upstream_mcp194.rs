//! The gateway in front of a real Python `mcp==1.9.4` FastMCP server
//! (`tests/fixtures/fastmcp194_server.py`, venv `.peers/venv-mcp194` from
//! `scripts/install-peers.sh`). That server sends a call's `notifications/progress` on
//! the session's standalone GET stream instead of the call's POST stream (observed with
//! 1.9.4); the gateway's progress tokens are its own and name the call (docs/design.md
//! §14 "Upstream sessions"), so progress must reach the call whichever stream carries
//! it.
//!
//! The upstream is configured as `…/mcp`, which 1.9.4 answers with 307 to `/mcp/`: the
//! gateway follows it for POSTs and for the GET stream alike.

mod common;
mod tasks_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tasks_support::*;

fn python() -> PathBuf {
    let p = repo_root().join(".peers/venv-mcp194/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
        p.display()
    );
    p
}

/// The 1.9.4 fixture on a free port, once it accepts connections; returns it and the
/// URL to configure (without the trailing slash, so the 307 is exercised).
async fn start_fixture() -> (Proc, String) {
    let port = free_port();
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/fixtures/fastmcp194_server.py"))
        .arg(port.to_string());
    let p = Proc::spawn(cmd);
    let up = eventually(Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert!(up, "mcp 1.9.4 fixture did not start:\n{}", p.log_text());
    (p, format!("http://127.0.0.1:{port}/mcp"))
}

async fn fixture_and_gateway() -> (Proc, Gateway) {
    let (fixture, url) = start_fixture().await;
    let gw = start_ready(&http_body(&url, "", "")).await;
    (fixture, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_call_status_message_follows_progress_sent_on_get_stream() {
    let (_fixture, gw) = fixture_and_gateway().await;
    let c = tasks_client(&gw, "alice", "acme");

    // 6 × 0.5 s: well past promote_after_ms (200), with progress after every step.
    let id = task_id(&create_task(&c, "slow", json!({"steps": 6, "step_s": 0.5})).await);
    let step = |r: &Value| {
        (r["status"] == "working")
            .then(|| r["statusMessage"].as_str())
            .flatten()
            .filter(|m| m.contains("step "))
            .map(str::to_string)
    };
    let limit = Duration::from_secs(60);
    let first = poll_until(&c, &id, limit, |r| {
        step(r).is_some() || is_terminal(r["status"].as_str().unwrap_or_default())
    })
    .await;
    let first = step(&first).unwrap_or_else(|| {
        panic!("the task ended without its statusMessage ever showing progress: {first}")
    });
    let mut moved = None;
    let done = poll_until_seen(
        &c,
        &id,
        limit,
        |r| {
            if let Some(m) = step(r).filter(|m| *m != first) {
                moved.get_or_insert(m);
            }
        },
        |r| is_terminal(r["status"].as_str().unwrap_or_default()),
    )
    .await;
    let moved = moved.unwrap_or_else(|| panic!("statusMessage stayed at {first:?}: {done}"));
    assert!(first.contains("/6.0: step "), "{first}");
    assert!(moved.contains("/6.0: step "), "{moved}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(first_text(&done["result"]), "done after 6 steps", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_call_with_client_progress_token_streams_progress_sent_on_get_stream() {
    let (_fixture, gw) = fixture_and_gateway().await;
    // No tasks extension: the call stays inline; a progress token makes it SSE.
    let c = plain_client(&gw, "bob", "acme", json!({}));
    let params = json!({"name": "slow", "arguments": {"steps": 4, "step_s": 0.3}});
    let mut body = c.body(json!(7), "tools/call", &params);
    body["params"]["_meta"]["progressToken"] = json!("client-progress-1");
    let r = c.send("tools/call", &params, &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.is_sse(), "{:?}", r.headers);

    let messages = r.sse_messages();
    let progress: Vec<&Value> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(
        !progress.is_empty(),
        "no notifications/progress reached the client: {messages:?}"
    );
    for p in &progress {
        assert_eq!(p["params"]["progressToken"], "client-progress-1", "{p}");
        assert_eq!(p["params"]["total"], 4.0, "{p}");
        let text = p["params"]["message"].as_str().unwrap_or_default();
        assert!(text.starts_with("step "), "{p}");
    }
    let last = r.json();
    assert_eq!(last["id"], 7, "{last}");
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
    assert_eq!(first_text(&last["result"]), "done after 4 steps", "{last}");
}

// ----- a cancel breaks 1.9.4's session ------------------------------------------------
//
// mcp 1.9.4 answers `notifications/cancelled` for a running call with
// `{"error":{"code":0,"message":"Request cancelled"}}` and then its session is dead:
// every later POST on that session gets `200` SSE headers and a chunked body cut off
// without its last chunk, and a later GET gets headers and then nothing. The gateway
// must stop using such a session and carry on in a fresh one, so the calls after the
// cancel succeed — never "the stream broke", never a hang.

/// Generous bound for one call after the cancel (a fresh `initialize` included).
const PROMPTLY: Duration = Duration::from_secs(20);

/// `echo` inline, bounded by [`PROMPTLY`]: the echoed text, or a panic saying what the
/// gateway answered instead.
async fn echo_promptly(c: &Client2026, text: &str) -> String {
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(PROMPTLY, c.call_tool("echo", json!({ "text": text })))
        .await
        .unwrap_or_else(|_| panic!("echo {text:?} hung for {PROMPTLY:?}"));
    let v = r.json();
    assert_eq!(r.status, 200, "echo {text:?}: {v}");
    assert!(
        v.get("error").is_none(),
        "echo {text:?} failed after {:?}: {v}",
        started.elapsed()
    );
    first_text(&v["result"])
}

/// The calls a client makes once a cancel has reached the fixture: several inline
/// calls in a row, then a promoted one whose progress comes on the (new) session's GET
/// stream, all within [`PROMPTLY`] each.
async fn later_calls_succeed(gw: &Gateway) {
    let plain = plain_client(gw, "carol", "acme", json!({}));
    for i in 0..3 {
        let text = format!("after cancel {i}");
        assert_eq!(echo_promptly(&plain, &text).await, text);
    }
    let c = tasks_client(gw, "carol", "acme");
    let id = task_id(&create_task(&c, "slow", json!({"steps": 3, "step_s": 0.3})).await);
    let done = poll_until(&c, &id, PROMPTLY, |r| {
        is_terminal(r["status"].as_str().unwrap_or_default())
    })
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(first_text(&done["result"]), "done after 3 steps", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_a_cancelled_task_run_in_a_fresh_session() {
    let (fixture, gw) = fixture_and_gateway().await;
    let c = tasks_client(&gw, "alice", "acme");
    // A long call, surely running upstream once its progress shows.
    let id = task_id(&create_task(&c, "slow", json!({"steps": 200, "step_s": 0.1})).await);
    poll_until(&c, &id, Duration::from_secs(60), |r| {
        r["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("step "))
    })
    .await;
    let ack = tasks_cancel(&c, &id).await;
    assert_eq!(ack.status, 200, "{}", ack.json());
    assert!(
        fixture
            .wait_log("slow cancelled", Duration::from_secs(30))
            .await
            .is_some(),
        "the cancel never reached the fixture:\n{}",
        fixture.log_text()
    );
    let r = poll_terminal(&c, &id).await;
    assert_eq!(r["status"], "cancelled", "{r}");
    later_calls_succeed(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_a_client_left_an_inline_call_run_in_a_fresh_session() {
    let (fixture, gw) = fixture_and_gateway().await;
    let c = plain_client(&gw, "bob", "acme", json!({}));
    // The client gives up on an inline call after 2 s (the gateway has switched to SSE
    // after keepalive_ms = 1000); the gateway notices at its next keep-alive and
    // cancels the upstream call.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(2),
        c.call_tool("slow", json!({"steps": 200, "step_s": 0.1})),
    )
    .await;
    assert!(gave_up.is_err(), "the slow call finished: {gave_up:?}");
    assert!(
        fixture
            .wait_log("slow cancelled", Duration::from_secs(30))
            .await
            .is_some(),
        "the disconnect never cancelled the upstream call:\n{}",
        fixture.log_text()
    );
    later_calls_succeed(&gw).await;
}
