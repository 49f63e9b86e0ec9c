//! Graceful shutdown (README "Limits and metrics", "Shutdown"; docs/design.md §10
//! "Restart"): SIGTERM during load exits 0, inline calls in flight finish within the
//! drain grace, no task is lost, and a restart resolves every handle (to its result, or
//! to `failed` for calls that were in flight).

#[macro_use]
#[allow(unused_macros)]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";

#[tokio::test]
async fn sigterm_under_load_exits_zero_and_restart_resolves_every_task() {
    let s = DemoSetup::start_full(
        Transport::Stdio,
        "drain_grace_ms = 10000",
        "[tasks]\npoll_interval_ms = 100\n[limits]\npoll_burst = 1000\n",
        "max_concurrency = 8\n[upstream.tools.sleep]\npromote_after_ms = 0\n",
    )
    .await;
    s.gw.wait_ready().await;
    let tasks = s.client().with_caps(json!({"extensions": {TASKS: {}}}));

    // Tasks: some finish before the signal, some are still running at it.
    let mut ids = Vec::new();
    for ms in [10u64, 10, 60_000, 60_000, 60_000] {
        let r = tasks.call_tool("sleep", json!({"ms": ms})).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        ids.push(r.json()["result"]["taskId"].as_str().unwrap().to_string());
    }
    for id in &ids[..2] {
        let start = std::time::Instant::now();
        loop {
            let v = tasks
                .request("tasks/get", json!({"taskId": id}))
                .await
                .json();
            if v["result"]["status"] == "completed" {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "{v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Inline calls in flight when SIGTERM arrives finish within the grace period.
    let plain = s.client();
    let mut inline = Vec::new();
    for _ in 0..3 {
        let c = Client2026 {
            url: plain.url.clone(),
            token: plain.token.clone(),
            caps: json!({}),
        };
        inline.push(tokio::spawn(async move {
            c.call_tool("sleep", json!({"ms": 1500})).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let DemoSetup { gw, .. } = s;
    let Gateway {
        mut proc,
        dir,
        config_path,
        ..
    } = gw;
    proc.sigterm();
    for h in inline {
        let r = h.await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["result"]["content"][0]["text"], "slept 1500 ms");
    }
    let status = proc.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{}", proc.log_text());
    drop(proc);

    // Restart on the same store: every handle resolves.
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    assert!(
        gw.proc
            .log_text()
            .contains("tasks whose calls were in flight"),
        "{}",
        gw.proc.log_text()
    );
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")))
        .with_caps(json!({"extensions": {TASKS: {}}}));
    for (i, id) in ids.iter().enumerate() {
        let v: Value = c.request("tasks/get", json!({"taskId": id})).await.json();
        let st = v["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if i < 2 {
            assert_eq!(st, "completed", "{v}");
        } else {
            assert_eq!(st, "failed", "{v}");
            let msg = v["result"]["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("gateway restarted"), "{v}");
        }
    }
}
