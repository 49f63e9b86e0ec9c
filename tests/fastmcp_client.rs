//! A real third-party 2026-07-28 + Tasks client end to end: Python
//! `fastmcp[tasks]==4.1.4` (venv `.peers/venv-fastmcp`, installed by
//! `scripts/install-peers.sh`), driven by `tests/peers/fastmcp_client.py`, against the
//! gateway fronting the bundled demo legacy upstream over stdio. Auth: the JWT bearer
//! token via fastmcp's `auth=` (BearerAuth).
//!
//! fastmcp-tasks 4.1.4 omits the `Mcp-Name: <taskId>` header on `tasks/*` (SEP-2663
//! routing headers; taskgate enforces them with 400 -32020, as the conformance suite
//! expects). The driver declares the header through the SDK's own `name_param` hook;
//! `fastmcp_unshimmed_client_lacks_mcp_name_on_tasks_get` pins the unpatched behaviour.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use common::*;

fn python() -> PathBuf {
    repo_root().join(".peers/venv-fastmcp/bin/python")
}

fn require_peers() {
    assert!(
        python().exists(),
        "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
        python().display()
    );
}

async fn gateway() -> Gateway {
    let body = format!(
        // fastmcp-tasks 4.1.4 ramps its polls 20 → 40 → 80 ms before settling at
        // pollIntervalMs, i.e. faster than advertised, and does not retry a 429; a
        // burst of 10 admits that ramp (the limiter itself is tested in limits.rs).
        "{}[tasks]\npromote_after_ms = 200\npoll_interval_ms = 100\n[limits]\npoll_burst = 10\n{}",
        jwt_auth(),
        demo_stdio_upstream("")
    );
    let gw = Gateway::start(&body).await;
    gw.wait_ready().await;
    gw
}

/// Run one scenario of the driver; returns its JSON report (asserting `ok`).
async fn run(scenario: &str) -> (Value, Gateway) {
    require_peers();
    run_on(gateway().await, scenario).await
}

/// Run one scenario against `gw`.
async fn run_on(gw: Gateway, scenario: &str) -> (Value, Gateway) {
    let url = gw.url("/mcp");
    let tok = token("fastmcp-user", "acme");
    let scenario_owned = scenario.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(repo_root().join("tests/peers/fastmcp_client.py"))
            .arg(url)
            .arg(tok)
            .arg(scenario_owned)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("run the fastmcp driver")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "{scenario}: no JSON report\nstdout:\n{stdout}\nstderr:\n{stderr}\n--- gateway ---\n{}",
                gw.proc.log_text()
            )
        });
    assert_eq!(
        report["ok"],
        true,
        "{scenario}: {}\n{}\nstderr:\n{stderr}\n--- gateway ---\n{}",
        report["error"],
        report["trace"].as_str().unwrap_or(""),
        gw.proc.log_text()
    );
    (report, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_transparent_call_tool_polls_task_to_result() {
    let (r, _gw) = run("transparent").await;
    let tools: Vec<&str> = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(tools.contains(&"sleep") && tools.contains(&"elicit"), "{r}");
    assert_eq!(r["echo"][0], "hi fastmcp", "{r}");
    assert_eq!(r["slow"][0], "slept 1500 ms", "{r}");
    assert_eq!(r["slow_is_error"], false, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_task_handle_status_and_result() {
    let (r, _gw) = run("handle").await;
    assert!(r["task_id"].as_str().unwrap().starts_with("tsk_"), "{r}");
    assert_eq!(r["created_status"], "working", "{r}");
    assert_eq!(r["poll_interval_ms"], 100, "{r}");
    assert_eq!(r["final_status"], "completed", "{r}");
    assert_eq!(r["result"][0], "slept 1500 ms", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_input_required_answered_via_tasks_update() {
    let (r, _gw) = run("elicit").await;
    assert_eq!(r["parked"], "input_required", "{r}");
    assert_eq!(r["asked"][0], "Favourite colour?", "{r}");
    assert_eq!(
        r["result"][0], "elicited: accept {\"answer\":\"octarine\"}",
        "{r}"
    );
    assert_eq!(r["final_status"], "completed", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_cancel_task() {
    let (r, _gw) = run("cancel").await;
    assert_eq!(r["final_status"], "cancelled", "{r}");
}

/// Documents the client-side gap the shim covers: unpatched, fastmcp-tasks 4.1.4's
/// `tasks/get` carries no `Mcp-Name`, and the gateway answers 400 -32020 as SEP-2663
/// requires. If a future pin fixes the client, this test says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_unshimmed_client_lacks_mcp_name_on_tasks_get() {
    let (r, _gw) = run("unshimmed").await;
    assert!(r["task_id"].as_str().unwrap().starts_with("tsk_"), "{r}");
    assert_eq!(r["code"], -32020, "{r}");
    assert!(
        r["status_error"]
            .as_str()
            .is_some_and(|e| e.contains("Mcp-Name")),
        "{r}"
    );
}

/// server-everything's `simulate-research-query`, the upstream's own 2025-11-25 task,
/// through the gateway (docs/design.md §25): fastmcp's elicitation handler answers
/// the upstream's question through `tasks/update`, the report comes back, and a
/// cancel reaches the upstream task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_follows_server_everything_research() {
    require_peers();
    let (_everything, port) = start_everything_http().await;
    let gw = everything_gateway(port, "poll_interval_ms = 100\n[limits]\npoll_burst = 10\n").await;
    let (r, gw) = run_on(gw, "research").await;
    assert_eq!(r["final_status"], "completed", "{r}");
    assert_eq!(r["ttl_ms"], 300000, "{r}");
    assert!(
        r["asked"][0]
            .as_str()
            .unwrap_or_default()
            .contains("python"),
        "{r}"
    );
    let text = r["result"][0].as_str().unwrap_or_default();
    assert!(
        text.contains("Research Report") && text.contains("snake"),
        "{r}"
    );
    assert_eq!(r["cancelled"], "cancelled", "{r}");
    assert!(
        gw.proc
            .wait_log("upstream task cancelled", Duration::from_secs(20))
            .await
            .is_some(),
        "{}",
        gw.proc.log_text()
    );
}
