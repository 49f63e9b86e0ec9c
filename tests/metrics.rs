//! `/metrics` (Prometheus text, moving with traffic, optional separate listener),
//! `/readyz` for a down upstream, and the per-request log line (README "Limits and
//! metrics").

#[macro_use]
#[allow(unused_macros)]
mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::json;

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// Parse the Prometheus text format strictly enough to catch a broken exposition:
/// `# HELP`/`# TYPE` comments and `name{labels} value` samples. Returns the samples.
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix("# ") {
            assert!(
                c.starts_with("HELP ") || c.starts_with("TYPE "),
                "bad comment: {line}"
            );
            if let Some(t) = c.strip_prefix("TYPE ") {
                let kind = t.split_whitespace().nth(1).unwrap_or_default();
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "bad type: {line}"
                );
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels: {line}");
        }
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        out.insert(series.to_string(), v);
    }
    out
}

async fn scrape(url: &str) -> HashMap<String, f64> {
    let r = raw(url, "GET", &[], Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    parse_prometheus(&String::from_utf8_lossy(&r.body))
}

fn get(m: &HashMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_move_with_traffic() {
    let port = free_port();
    let s = DemoSetup::start_full(
        Transport::Stdio,
        &format!("metrics_listen = \"127.0.0.1:{port}\""),
        "[tasks]\npoll_interval_ms = 1000\n[limits]\npoll_burst = 1\n",
        "[upstream.tools.sleep]\npromote_after_ms = 0\n",
    )
    .await;
    s.gw.wait_ready().await;
    let url = s.gw.url("/metrics");
    let separate = format!("http://127.0.0.1:{port}/metrics");
    let before = scrape(&url).await;
    // The 2025-era session series are there from the start (the gauge seeded from the
    // store, every event at 0).
    assert_eq!(
        before.get("taskgate_legacy_sessions_open"),
        Some(&0.0),
        "{before:?}"
    );
    for event in ["created", "expired", "evicted", "deleted", "refused"] {
        let series = format!("taskgate_legacy_sessions_total{{event=\"{event}\"}}");
        assert_eq!(before.get(&series), Some(&0.0), "{series}");
    }

    let plain = s.client();
    let tasks = s.client().with_caps(json!({"extensions": {TASKS: {}}}));
    for _ in 0..3 {
        let r = plain.call_tool("echo", json!({"text": "x"})).await;
        assert_eq!(r.status, 200);
    }
    let r = tasks.call_tool("sleep", json!({"ms": 100})).await;
    let task = r.json()["result"]["taskId"].as_str().unwrap().to_string();
    // Two polls at once: the second is throttled.
    tasks.request("tasks/get", json!({"taskId": task})).await;
    let r = tasks.request("tasks/get", json!({"taskId": task})).await;
    assert_eq!(r.status, 429);

    // Wait for the task to complete (and the gauge / histogram to move).
    let mut after = HashMap::new();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        after = scrape(&url).await;
        if get(&after, "taskgate_tasks{status=\"completed\"}") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ok_calls = "taskgate_requests_total{method=\"tools/call\",status=\"200\"}";
    assert!(
        get(&after, ok_calls) >= get(&before, ok_calls) + 4.0,
        "{after:?}"
    );
    assert!(
        get(
            &after,
            "taskgate_requests_total{method=\"tasks/get\",status=\"429\"}"
        ) >= 1.0,
        "{after:?}"
    );
    assert!(get(&after, "taskgate_throttled_total{reason=\"poll_interval\"}") >= 1.0);
    // By client kind (docs/design.md §28): these are a tasks client's.
    assert!(
        get(
            &after,
            "taskgate_promotions_total{upstream=\"demo\",client=\"tasks\"}"
        ) >= 1.0
    );
    assert!(get(&after, "taskgate_status_reads_total{client=\"tasks\"}") >= 1.0);
    // Every durable creation waited on a group-commit round.
    let rounds = get(&after, "taskgate_store_flush_rounds_total");
    assert!(rounds >= 1.0, "{after:?}");
    assert!(get(&after, "taskgate_store_flush_round_waiters_total") >= rounds);
    assert_eq!(
        get(&after, "taskgate_tasks{status=\"completed\"}"),
        1.0,
        "{after:?}"
    );
    assert_eq!(
        get(&after, "taskgate_tasks{status=\"working\"}"),
        0.0,
        "{after:?}"
    );
    assert!(
        get(
            &after,
            "taskgate_task_duration_seconds_count{status=\"completed\"}"
        ) >= 1.0,
        "{after:?}"
    );
    assert!(
        after
            .keys()
            .any(|k| k
                .starts_with("taskgate_upstream_call_duration_seconds_bucket{upstream=\"demo\"")),
        "{after:?}"
    );
    assert!(get(&after, "taskgate_store_flush_duration_seconds_count") >= 1.0);

    // The separate listener serves the same exposition, and health.
    let m = scrape(&separate).await;
    assert!(get(&m, ok_calls) >= 4.0);
    let r = raw(
        &format!("http://127.0.0.1:{port}/healthz"),
        "GET",
        &[],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);

    // One log line per request, with method, tenant, subject, status — never a token.
    let line =
        s.gw.proc
            .wait_log("taskgate::request", Duration::from_secs(5))
            .await
            .expect("request log line");
    assert!(line.contains("tenant"), "{line}");
    let logs = s.gw.proc.log_text();
    assert!(
        logs.lines().any(|l| l.contains("taskgate::request")
            && l.contains("tsk_")
            && l.contains("tasks/get")),
        "no task id in request logs"
    );
    assert!(
        !logs.contains(plain.token.as_deref().unwrap()),
        "a token was logged"
    );
}

#[tokio::test]
async fn readyz_reflects_a_down_upstream_and_restarts_count() {
    let port = free_port();
    let gw = Gateway::start(&format!(
        "{}{}",
        no_auth(),
        http_upstream("gone", "/mcp", &format!("http://127.0.0.1:{port}/mcp"), "")
    ))
    .await;
    let start = std::time::Instant::now();
    loop {
        let r = raw(&gw.url("/readyz"), "GET", &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        if v["upstreams"]["gone"]["state"] == "down" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // /metrics still answers (no token) while the upstream is down.
    let m = scrape(&gw.url("/metrics")).await;
    assert!(
        m.contains_key("taskgate_tasks{status=\"working\"}"),
        "{m:?}"
    );
}

#[tokio::test]
async fn stdio_restart_is_counted() {
    let s = DemoSetup::start(Transport::Stdio, "", "").await;
    s.gw.wait_ready().await;
    let c = s.client();
    let _ = c.call_tool("crash", json!({})).await;
    let url = s.gw.url("/metrics");
    let start = std::time::Instant::now();
    loop {
        let m = scrape(&url).await;
        if get(
            &m,
            "taskgate_upstream_restarts_total{upstream=\"demo\",kind=\"stdio_restart\"}",
        ) >= 1.0
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{m:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
