//! The gateway in front of a real Python `mcp==1.9.4` FastMCP server
//! (`tests/fixtures/fastmcp194_server.py`, venv `.peers/venv-mcp194` from
//! `scripts/install-peers.sh`). That server sends a call's `notifications/progress` on
//! the session's standalone GET stream instead of the call's POST stream
//! (shared/peers.md); the gateway's progress tokens are its own and name the call
//! (design.md policy 14), so progress must reach the call whichever stream carries it.
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
