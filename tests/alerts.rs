//! The alert rules and the dashboard (README "Operations"): `promtool` checks and runs
//! the unit tests of deploy/prometheus/alerts.yml; every metric, label and label value
//! the rules and deploy/grafana/taskgate.json name is on a running gateway's /metrics;
//! and a real Prometheus scraping a real gateway fires an alert for a real fault.
//!
//! Needs `promtool` and `prometheus` on the PATH (Debian's `prometheus` package;
//! scripts/test.sh installs it).

mod common;
mod tasks_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use common::tls::TestCa;
use common::*;
use tasks_support::*;

fn alerts_yml() -> PathBuf {
    repo_root().join("deploy/prometheus/alerts.yml")
}

fn dashboard_json() -> PathBuf {
    repo_root().join("deploy/grafana/taskgate.json")
}

/// Run a Prometheus tool; its output, or a panic that says how to get the tool.
fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {tool} ({e}): install it with `apt-get install -y prometheus`")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{tool} {args:?} failed:\n{text}");
    text
}

/// The alert names of alerts.yml.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn the_rules_pass_promtool_and_every_alert_is_tested_firing_and_not() {
    let checked = run(
        "promtool",
        &["check", "rules", "deploy/prometheus/alerts.yml"],
    );
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(
        "promtool",
        &["test", "rules", "deploy/prometheus/alerts_test.yml"],
    );
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Each alert has a case where it fires and one where it does not.
    let tests =
        std::fs::read_to_string(repo_root().join("deploy/prometheus/alerts_test.yml")).unwrap();
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    let mut current = None;
    for line in tests.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname:") {
            current = Some(name.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("exp_alerts:")
            && let Some(name) = current.take()
        {
            if rest.trim() == "[]" {
                quiet.insert(name);
            } else {
                firing.insert(name);
            }
        }
    }
    let rules = std::fs::read_to_string(alerts_yml()).unwrap();
    let names = alert_names(&rules);
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        assert!(firing.contains(name), "{name} is never tested firing");
        assert!(quiet.contains(name), "{name} is never tested not firing");
    }
}

// ---------------------------------------------------------------------------------
// The metrics the rules and the dashboard name

/// What a /metrics exposition holds: each name (samples and `# TYPE` families) with
/// the label values seen under each label name.
#[derive(Default, Debug)]
struct Exposition {
    names: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exposition {
    fn parse(text: &str) -> Self {
        let mut e = Self::default();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                if let Some(name) = t.split_whitespace().next() {
                    e.names.entry(name.to_string()).or_default();
                }
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((series, _value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let entry = e.names.entry(name.to_string()).or_default();
            for (k, v) in matchers(labels) {
                entry.entry(k).or_default().insert(v);
            }
        }
        e
    }
}

/// `a="x",b=~"y|z"` as (name, value) pairs; the operator is dropped (label values here
/// hold no quotes).
fn matchers(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(q) = rest.find('"') {
        let head = &rest[..q];
        let name = head
            .trim_start_matches([',', ' '])
            .trim_end_matches(['=', '~', '!'])
            .trim()
            .to_string();
        let after = &rest[q + 1..];
        let Some(end) = after.find('"') else { break };
        out.push((name, after[..end].to_string()));
        rest = &after[end + 1..];
    }
    out
}

/// The metric names (`taskgate_…`) an expression names.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("taskgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// `name{…}` selectors of an expression: the name and its matchers' text.
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in metric_names(expr) {
        let needle = format!("{name}{{");
        let mut from = 0;
        while let Some(i) = expr[from..].find(&needle) {
            let start = from + i + needle.len();
            let end = start + expr[start..].find('}').unwrap_or(0);
            out.push((name.clone(), expr[start..end].to_string()));
            from = end;
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Label names of `by (…)`, `without (…)`, `on (…)` and `ignoring (…)` clauses.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for kw in ["by", "without", "on", "ignoring"] {
        let mut from = 0;
        while let Some(i) = expr[from..].find(kw) {
            let at = from + i;
            from = at + kw.len();
            let before_ok = at == 0
                || !expr[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let rest = expr[from..].trim_start();
            if !before_ok || !rest.starts_with('(') {
                continue;
            }
            let Some(close) = rest.find(')') else {
                continue;
            };
            out.extend(
                rest[1..close]
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            );
        }
    }
    out
}

/// The `expr` of every rule in alerts.yml (single-line or `|` blocks).
fn rule_exprs(rules: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = rules.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        if rest.trim() != "|" {
            out.push(rest.trim().to_string());
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let mut block = String::new();
        while i < lines.len() {
            let l = lines[i];
            if !l.trim().is_empty() && l.len() - l.trim_start().len() <= indent {
                break;
            }
            block.push_str(l.trim());
            block.push(' ');
            i += 1;
        }
        out.push(block);
    }
    out
}

/// Every `expr` of the dashboard's targets.
fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// Labels Prometheus adds to every scraped series (the dashboard's `instance` variable
/// filters on one), never on /metrics itself.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Each metric `expr` names exists in `m`; each label it matches on or groups by is
/// one of those metrics' labels; each exact value it asks for (`=`, or a `=~` list of
/// plain alternatives) is one the gateway exported.
fn check_expr(expr: &str, m: &Exposition, missing: &mut Vec<String>) {
    let names = metric_names(expr);
    for n in &names {
        if !m.names.contains_key(n) {
            missing.push(format!("metric {n} (in {expr})"));
        }
    }
    for (name, text) in selectors(expr) {
        let Some(labels) = m.names.get(&name) else {
            continue;
        };
        for (label, value) in matchers(&text) {
            if TARGET_LABELS.contains(&label.as_str()) {
                continue;
            }
            let Some(values) = labels.get(&label) else {
                missing.push(format!("label {label} of {name} (in {expr})"));
                continue;
            };
            let plain = value.split('|').all(|v| {
                !v.is_empty()
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_./".contains(c))
            });
            if plain {
                for v in value.split('|') {
                    if !values.contains(v) {
                        missing.push(format!("{name}{{{label}=\"{v}\"}} (in {expr})"));
                    }
                }
            }
        }
    }
    for label in grouping_labels(expr) {
        let known = TARGET_LABELS.contains(&label.as_str())
            || names
                .iter()
                .filter_map(|n| m.names.get(n))
                .any(|labels| labels.contains_key(&label));
        if !known {
            missing.push(format!("grouping label {label} (in {expr})"));
        }
    }
}

/// `GET url` over TLS trusting `ca`.
async fn get_tls(ca: &Path, url: &str) -> Result<Resp, String> {
    let config = common::tls::client_config(ca, None, &[]);
    common::tls::request(config, url, "GET", &[], Bytes::new())
        .await
        .map(|(r, _)| r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let ops = TestCa::new(dir.path(), "ops");
    let cert = ops.server("ops");
    let port = free_port();
    // metrics_listen over TLS, so the certificate gauge has a listener to report.
    let server = format!(
        "metrics_listen = \"127.0.0.1:{port}\"\nmetrics_tls_cert = {}\nmetrics_tls_key = {}\n",
        toml_string(&cert.cert.display().to_string()),
        toml_string(&cert.key.display().to_string())
    );
    // One slot, so a second call queues; one poll per second, so a second poll is
    // refused.
    let body = format!(
        "{}[tasks]\npromote_after_ms = 200\npoll_interval_ms = 1000\n[limits]\npoll_burst = 1\n{}",
        jwt_auth(),
        stdio_upstream_bare("max_concurrency = 1\n")
    );
    let gw = Gateway::start_with_server(&server, &body).await;
    gw.wait_ready().await;
    let metrics_url = format!("https://localhost:{port}/metrics");

    // Traffic that makes each family appear that only appears with its first sample:
    // an inline call, two promoted calls (the second queued), a refused poll, a crash
    // loop the stdio pool throttles, a failed TLS handshake.
    let c = tasks_client(&gw, "alice", "acme");
    let r = c.call_tool("echo", json!({"text": "inline"})).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let first = task_id(&create_task(&c, "sleep", json!({"ms": 600})).await);
    let second = task_id(&create_task(&c, "sleep", json!({"ms": 100})).await);
    let _ = c.request("tasks/get", json!({"taskId": first})).await;
    let r = c.request("tasks/get", json!({"taskId": first})).await;
    assert_eq!(r.status, 429, "{:?}", r.json());
    let other = TestCa::new(dir.path(), "other");
    assert!(get_tls(&other.ca_file, &metrics_url).await.is_err());

    let scrape = || async {
        let r = get_tls(&ops.ca_file, &metrics_url).await.unwrap();
        assert_eq!(r.status, 200);
        String::from_utf8_lossy(&r.body).into_owned()
    };
    let start = Instant::now();
    loop {
        let text = scrape().await;
        if text.contains("taskgate_task_duration_seconds_count{status=\"completed\"} 2")
            && !text.contains("taskgate_upstream_queue_wait_seconds_count{upstream=\"demo\"} 0")
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "tasks {first} and {second} never completed:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let noisy = Client2026::new(&gw, "/mcp", Some(token("bob", "noisy")));
    let start = Instant::now();
    let text = loop {
        let r = noisy.call_tool("crash", json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.json());
        let text = scrape().await;
        if text.contains("taskgate_stdio_throttled_calls_total{") {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the crash loop was never throttled:\n{text}"
        );
    };
    let m = Exposition::parse(&text);

    let mut exprs = rule_exprs(&std::fs::read_to_string(alerts_yml()).unwrap());
    assert!(exprs.len() >= 10, "{exprs:?}");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_json()).unwrap()).unwrap();
    let before = exprs.len();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= before + 10, "{exprs:?}");
    let mut missing = Vec::new();
    for e in &exprs {
        check_expr(e, &m, &mut missing);
    }
    assert!(
        missing.is_empty(),
        "named but not exported:\n{}\n\n/metrics:\n{text}",
        missing.join("\n")
    );
    // And in the annotations and descriptions: every `taskgate_…` name at all.
    for file in [alerts_yml(), dashboard_json()] {
        for name in metric_names(&std::fs::read_to_string(&file).unwrap()) {
            assert!(
                m.names.contains_key(&name),
                "{} names {name}, which /metrics does not have",
                file.display()
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// End to end: a real Prometheus

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET` a Prometheus API path; the parsed JSON.
async fn api(base: &str, path: &str) -> Option<Value> {
    let r = raw(&format!("{base}{path}"), "GET", &[], Bytes::new())
        .await
        .ok()?;
    serde_json::from_slice(&r.body).ok()
}

/// The alerts of one name Prometheus holds, with their state.
async fn alerts_named(base: &str, name: &str) -> Vec<Value> {
    let Some(v) = api(base, "/api/v1/alerts").await else {
        return Vec::new();
    };
    v["data"]["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|x| x["labels"]["alertname"] == name)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_fires_upstream_down_for_a_stopped_upstream() {
    let mut demo = DemoHttp::start().await;
    let metrics_port = free_port();
    let gw = Gateway::start_with_server(
        &format!("metrics_listen = \"127.0.0.1:{metrics_port}\"\n"),
        &format!(
            "{}{}",
            jwt_auth(),
            demo_http_upstream(demo.port, "max_concurrency = 4\n")
        ),
    )
    .await;
    gw.wait_ready().await;
    let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let up = "taskgate_upstream_up{upstream=\"demo\"} 1";
    let sampled = eventually_async(Duration::from_secs(10), || async {
        raw(&metrics_url, "GET", &[], Bytes::new())
            .await
            .is_ok_and(|r| String::from_utf8_lossy(&r.body).contains(up))
    })
    .await;
    assert!(sampled, "{up} never appeared");

    // The rules as shipped, every `for:` cut to 0s so the test need not wait them out.
    let dir = tempfile::tempdir().unwrap();
    let rules: String = std::fs::read_to_string(alerts_yml())
        .unwrap()
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for:") {
            Some(_) => format!("{}for: 0s\n", &l[..l.len() - l.trim_start().len()]),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(dir.path().join("alerts.yml"), rules).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - alerts.yml\n\
         scrape_configs:\n  - job_name: taskgate\n    static_configs:\n      - targets: [\"127.0.0.1:{metrics_port}\"]\n"
    );
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let prom_port = free_port();
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .current_dir(dir.path());
    // Killed on drop, whatever the test's outcome.
    let prometheus = Proc::spawn(cmd);
    let base = format!("http://127.0.0.1:{prom_port}");

    // Scraped healthy first: the alert is not firing.
    let query = format!("/api/v1/query?query={}", encode("taskgate_upstream_up"));
    let scraped = eventually_async(Duration::from_secs(20), || async {
        api(&base, &query).await.is_some_and(|v| {
            v["data"]["result"]
                .as_array()
                .is_some_and(|r| r.iter().any(|s| s["value"][1] == "1"))
        })
    })
    .await;
    assert!(
        scraped,
        "Prometheus never scraped the gateway:\n{}",
        prometheus.log_text()
    );
    assert!(alerts_named(&base, "TaskgateUpstreamDown").await.is_empty());

    // Every dashboard expression is PromQL this Prometheus evaluates.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_json()).unwrap()).unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    for e in &exprs {
        let e = e
            .replace("$__rate_interval", "1m")
            .replace("$instance", ".*");
        let v = api(&base, &format!("/api/v1/query?query={}", encode(&e)))
            .await
            .unwrap_or_default();
        assert_eq!(v["status"], "success", "{e}: {v}");
    }

    // The fault: the upstream stops, and the next call finds it gone.
    demo.proc.kill9();
    let c = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    let r = c.call_tool("echo", json!({"text": "anyone there?"})).await;
    assert_ne!(r.status, 200, "{:?}", r.json());

    let start = Instant::now();
    let firing = loop {
        let alerts = alerts_named(&base, "TaskgateUpstreamDown").await;
        if let Some(a) = alerts.iter().find(|a| a["state"] == "firing") {
            break a.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "TaskgateUpstreamDown never fired: {alerts:?}\n{}",
            prometheus.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(firing["labels"]["upstream"], "demo", "{firing}");
    assert_eq!(firing["labels"]["severity"], "critical", "{firing}");
    assert_eq!(
        firing["annotations"]["summary"],
        format!("Upstream demo is down on 127.0.0.1:{metrics_port}"),
        "{firing}"
    );
    eprintln!(
        "TaskgateUpstreamDown firing {:?} after the upstream stopped",
        start.elapsed()
    );
}
