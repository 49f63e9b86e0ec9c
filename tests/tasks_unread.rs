//! Outcomes nobody collected (docs/design.md §23 "Outcomes nobody collected", README
//! "Limits and metrics"): terminal tasks that expire before their owner received the
//! terminal state are counted in `taskgate_tasks_expired_unread_total{status}`, and
//! each failed one logs a `warn` line; tasks read by `tasks/get` or on a listen stream,
//! and cancelled tasks, are not counted.
//!
//! Every test expires its tasks with a short `ttl_ms` and a 1 ms
//! `result_retention_ms`, so each task expires `ttl_ms` after its creation: an unread
//! control task created last expires last, and once it is counted the sweeper has
//! decided about every task before it.

mod common;
mod tasks_support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use serde_json::json;
use tasks_support::*;

const UNREAD: &str = "taskgate_tasks_expired_unread_total";
const WARN_MSG: &str = "failed task expired unread";

fn tools(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("[upstream.tools.{n}]\npromote_after_ms = 0\n"))
        .collect()
}

async fn start(ttl_ms: u64, tool_names: &[&str]) -> Gateway {
    let body = stdio_body(
        &format!("ttl_ms = {ttl_ms}\nresult_retention_ms = 1"),
        &tools(tool_names),
    );
    start_with_store("sweep_interval_ms = 200", &body).await
}

/// Every sample of `/metrics` as `series → value`.
async fn scrape(gw: &Gateway) -> Vec<(String, f64)> {
    let r = raw(&gw.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(s, v)| (s.to_string(), v.parse().unwrap_or(f64::NAN)))
        .collect()
}

fn sample(m: &[(String, f64)], series: &str) -> Option<f64> {
    m.iter().find(|(s, _)| s == series).map(|(_, v)| *v)
}

fn unread(m: &[(String, f64)], status: &str) -> Option<f64> {
    sample(m, &format!("{UNREAD}{{status=\"{status}\"}}"))
}

/// Scrape until `pred` holds; panics with the last scrape and the log otherwise.
async fn metrics_until(
    gw: &Gateway,
    what: &str,
    pred: impl Fn(&[(String, f64)]) -> bool,
) -> Vec<(String, f64)> {
    let start = Instant::now();
    loop {
        let m = scrape(gw).await;
        if pred(&m) {
            return m;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let ours: Vec<_> = m
                .iter()
                .filter(|(s, _)| s.starts_with("taskgate_tasks"))
                .collect();
            panic!(
                "{what}: not reached; metrics {ours:?}\n{}",
                gw.proc.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The warn line of the unread failed task `id`. Lines reach the log after the
/// counter moved (a background writer), and in the order the sweeper wrote them: once
/// this one is there, so is every line of a task that expired before it.
async fn warn_line(gw: &Gateway, id: &str) -> String {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Some(l) = warn_lines(gw).into_iter().find(|l| l.contains(id)) {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no warn line for {id}:\n{}", gw.proc.log_text());
}

/// The log lines of unread failed tasks.
fn warn_lines(gw: &Gateway) -> Vec<String> {
    gw.proc
        .log_text()
        .lines()
        .filter(|l| l.contains(WARN_MSG))
        .map(str::to_string)
        .collect()
}

/// Wait until the store holds `n` tasks in `status` (the gauge says so), without
/// reading any task.
async fn settled(gw: &Gateway, status: &str, n: f64) {
    let series = format!("taskgate_tasks{{status=\"{status}\"}}");
    metrics_until(gw, &format!("{n} {status} tasks"), |m| {
        sample(m, &series).unwrap_or(0.0) >= n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_failed_and_completed_tasks_are_counted_at_expiry() {
    let gw = start(1500, &["rpc_error", "echo"]).await;
    let alice = tasks_client(&gw, "alice", "acme");
    // Both series exist from the start, so an alert sees the first increase.
    let m = scrape(&gw).await;
    assert_eq!(unread(&m, "failed"), Some(0.0), "{m:?}");
    assert_eq!(unread(&m, "completed"), Some(0.0), "{m:?}");

    let failed = task_id(
        &create_task(
            &alice,
            "rpc_error",
            json!({"code": -32000, "message": "disk on fire"}),
        )
        .await,
    );
    let completed = task_id(&create_task(&alice, "echo", json!({"text": "hi"})).await);
    // Nobody polls either task after the CreateTaskResult.
    let m = metrics_until(&gw, "both counted", |m| {
        unread(m, "failed").unwrap_or(0.0) >= 1.0 && unread(m, "completed").unwrap_or(0.0) >= 1.0
    })
    .await;
    assert_eq!(unread(&m, "failed"), Some(1.0), "{m:?}");
    assert_eq!(unread(&m, "completed"), Some(1.0), "{m:?}");
    assert_eq!(
        sample(&m, "taskgate_tasks{status=\"failed\"}"),
        Some(0.0),
        "{m:?}"
    );

    let line = warn_line(&gw, &failed).await;
    assert!(line.contains("WARN"), "{line}");
    for part in [
        "tenant=acme",
        "tool=rpc_error",
        &format!("task={failed}"),
        "error_code=-32000",
        "disk on fire",
    ] {
        assert!(line.contains(part), "{part:?} missing: {line}");
    }
    let lines = warn_lines(&gw);
    assert_eq!(lines.len(), 1, "one line per failed task: {lines:?}");
    assert!(!lines[0].contains(&completed), "{lines:?}");

    // The owner still learns that the task expired.
    let v = msg(&tasks_get(&alice, &failed).await);
    assert_eq!(v["error"]["message"], "task expired", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_read_by_get_or_listen_are_not_counted() {
    let gw = start(8000, &["rpc_error", "echo", "elicit"]).await;
    let alice = tasks_client(&gw, "alice", "acme");

    // Read by tasks/get: a failed task whose error the owner polled.
    let by_get = task_id(&create_task(&alice, "rpc_error", json!({"message": "seen it"})).await);
    let done = poll_terminal(&alice, &by_get).await;
    assert_eq!(done["status"], "failed", "{done}");

    // Read on a listen stream: the completed snapshot arrives there, never by poll.
    let by_listen = task_id(&create_task(&alice, "elicit", json!({"message": "go?"})).await);
    let waiting = poll_until(&alice, &by_listen, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
    })
    .await;
    let key = waiting["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an input request");
    let mut listen = SseStream::listen(
        &alice,
        json!("sub"),
        json!({"taskIds": [by_listen.clone()]}),
    )
    .await;
    assert_eq!(listen.status, 200);
    let ack = listen.next(Duration::from_secs(30)).await.expect("ack");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    ok_result(
        &tasks_update(
            &alice,
            &by_listen,
            json!({key: {"action": "accept", "content": {"answer": "yes"}}}),
        )
        .await,
    );
    let snapshot = loop {
        let n = listen
            .next(Duration::from_secs(30))
            .await
            .expect("listen stream ended before the terminal snapshot");
        if n["method"] == "notifications/tasks"
            && is_terminal(n["params"]["status"].as_str().unwrap_or_default())
        {
            break n["params"].clone();
        }
    };
    assert_eq!(snapshot["status"], "completed", "{snapshot}");
    assert_eq!(snapshot["taskId"], by_listen.as_str(), "{snapshot}");

    // Controls, created last so they expire last: one unread task of each outcome.
    let control_failed =
        task_id(&create_task(&alice, "rpc_error", json!({"message": "nobody"})).await);
    create_task(&alice, "echo", json!({"text": "nobody"})).await;

    let m = metrics_until(&gw, "controls counted", |m| {
        unread(m, "failed").unwrap_or(0.0) >= 1.0 && unread(m, "completed").unwrap_or(0.0) >= 1.0
    })
    .await;
    assert_eq!(unread(&m, "failed"), Some(1.0), "read by tasks/get: {m:?}");
    assert_eq!(
        unread(&m, "completed"),
        Some(1.0),
        "read on the stream: {m:?}"
    );
    warn_line(&gw, &control_failed).await;
    let lines = warn_lines(&gw);
    assert_eq!(lines.len(), 1, "only the control: {lines:?}");
    assert!(!lines[0].contains(&by_get), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_tasks_are_not_counted() {
    let gw = start(3000, &["sleep", "rpc_error"]).await;
    let alice = tasks_client(&gw, "alice", "acme");
    let cancelled = task_id(&create_task(&alice, "sleep", json!({"ms": 60000})).await);
    ok_result(&tasks_cancel(&alice, &cancelled).await);
    // Not read after the cancel: it is not counted because its owner cancelled it.
    settled(&gw, "cancelled", 1.0).await;
    let control = task_id(&create_task(&alice, "rpc_error", json!({"message": "nobody"})).await);

    let m = metrics_until(&gw, "control counted", |m| {
        unread(m, "failed").unwrap_or(0.0) >= 1.0
    })
    .await;
    assert_eq!(unread(&m, "failed"), Some(1.0), "{m:?}");
    assert_eq!(unread(&m, "completed"), Some(0.0), "{m:?}");
    assert_eq!(unread(&m, "cancelled"), None, "{m:?}");
    assert_eq!(
        sample(&m, "taskgate_tasks{status=\"cancelled\"}"),
        Some(0.0),
        "the cancelled task expired: {m:?}"
    );
    warn_line(&gw, &control).await;
    let lines = warn_lines(&gw);
    assert_eq!(lines.len(), 1, "only the control: {lines:?}");
    assert!(!lines[0].contains(&cancelled), "{lines:?}");
}
