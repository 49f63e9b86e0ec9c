//! OpenTelemetry traces (docs/design.md §24 "Operations", README "Operations"): real
//! binaries exporting to a real OTLP/HTTP receiver (`tests/peers/otlp_receiver.py`,
//! decoding protobuf with `opentelemetry-proto`), and a client whose trace is started
//! by the OpenTelemetry Python SDK (`tests/peers/traced_request.py`). One trace id
//! from the client through the edge and two replicas to the HTTP upstream and to a
//! poll on the other replica; `_meta`-only propagation; an upstream that receives the
//! context; a collector that is down costs no request anything.

mod common;
mod legacy_support;
mod replicas_support;
mod tasks_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};

/// An OTLP/HTTP receiver process.
struct Receiver {
    _proc: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

fn otel_python() -> PathBuf {
    peers().join("venv-otel/bin/python")
}

impl Receiver {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let mut cmd = Command::new(otel_python());
        cmd.arg(repo_root().join("tests/peers/otlp_receiver.py"))
            .arg("--port-file")
            .arg(&port_file);
        let proc = Proc::spawn(cmd);
        let start = Instant::now();
        loop {
            if let Ok(p) = std::fs::read_to_string(&port_file)
                && let Ok(port) = p.trim().parse()
            {
                return Self {
                    _proc: proc,
                    port,
                    _dir: dir,
                };
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the OTLP receiver did not start:\n{}",
                proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spans(&self) -> Vec<Value> {
        let r = raw(&format!("{}/spans", self.base()), "GET", &[], Bytes::new())
            .await
            .unwrap();
        serde_json::from_slice::<Vec<Value>>(&r.body).unwrap_or_default()
    }

    /// The spans once `done` holds for them (the exporter batches every 500 ms).
    async fn spans_when(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let spans = self.spans().await;
            if done(&spans) {
                return spans;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what}: never arrived; spans: {}",
                serde_json::to_string_pretty(&spans).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `[telemetry]` exporting everything to `rx`.
fn telemetry_section(rx: &Receiver, service: &str) -> String {
    format!(
        "[telemetry]\notlp_endpoint = \"{}\"\nservice_name = \"{service}\"\n",
        rx.base()
    )
}

/// What `traced_request.py` printed.
struct Traced {
    trace_id: String,
    span_id: String,
    traceparent: String,
    status: u64,
    /// `taskgate-replica` of the answer (the edge test's).
    #[cfg_attr(not(feature = "edge"), allow(dead_code))]
    replica: String,
    body: Value,
}

/// POST `method` with `params` as `c` would, inside a client span of the Python SDK
/// exported to `rx`, propagating by `how` (`header`, `meta`, `both`).
async fn traced(
    rx: &Receiver,
    c: &Client2026,
    method: &str,
    params: Value,
    how: &str,
    parent: Option<&str>,
) -> Traced {
    traced_with_meta(rx, c, method, params, how, parent, json!({})).await
}

/// As [`traced`], with `extra_meta` keys added to the request's `_meta`.
async fn traced_with_meta(
    rx: &Receiver,
    c: &Client2026,
    method: &str,
    params: Value,
    how: &str,
    parent: Option<&str>,
    extra_meta: Value,
) -> Traced {
    let mut body = c.body(json!(7), method, &params);
    if let (Some(m), Some(extra)) = (
        body["params"]["_meta"].as_object_mut(),
        extra_meta.as_object(),
    ) {
        m.extend(extra.clone());
    }
    let mut cmd = Command::new(otel_python());
    cmd.arg(repo_root().join("tests/peers/traced_request.py"))
        .arg("--url")
        .arg(&c.url)
        .arg("--body")
        .arg(body.to_string())
        .arg("--propagate")
        .arg(how)
        .arg("--otlp")
        .arg(format!("{}/v1/traces", rx.base()));
    for (k, v) in c.headers(method, &params) {
        if k != "content-type" && k != "accept" {
            cmd.arg("--header").arg(format!("{k}: {v}"));
        }
    }
    if let Some(p) = parent {
        cmd.arg("--parent").arg(p);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "traced_request.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let body = v["body"].as_str().unwrap_or_default();
    Traced {
        trace_id: text("trace_id"),
        span_id: text("span_id"),
        traceparent: text("traceparent"),
        status: v["status"].as_u64().unwrap_or(0),
        replica: v["headers"]["taskgate-replica"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        body: serde_json::from_str(body)
            .ok()
            .or_else(|| sse_messages(body.as_bytes()).pop())
            .unwrap_or(Value::Null),
    }
}

fn in_trace<'a>(spans: &'a [Value], trace: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["trace_id"] == trace).collect()
}

/// The server span `name` of `service` (the upstream call's client span has the
/// same name).
fn named<'a>(spans: &[&'a Value], name: &str, service: &str) -> Option<&'a Value> {
    spans
        .iter()
        .find(|s| s["name"] == name && s["service"] == service && s["kind"] == "SERVER")
        .copied()
}

fn links_to(span: &Value, span_id: &str) -> bool {
    span["links"]
        .as_array()
        .is_some_and(|l| l.iter().any(|l| l["span_id"] == span_id))
}

/// Nothing a client sent as data shows up in a span: no arguments, no results, no
/// token.
fn assert_nothing_private(spans: &[Value], secret: &str) {
    let all = serde_json::to_string(spans).unwrap();
    assert!(!all.contains(secret), "a span holds call data: {all}");
    assert!(!all.contains("Bearer"), "a span holds a token: {all}");
    assert!(
        !all.contains("taskgate.tenant"),
        "the tenant is recorded without record_principal: {all}"
    );
}

/// A stdio upstream that records its stdin: a `_meta`-only client joins the trace
/// (its context is the parent), a header context wins over a different `_meta` one
/// (which becomes a link), and the upstream call carries the client span's context
/// in `_meta`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_context_joins_and_the_stdio_upstream_receives_it() {
    let rx = Receiver::start().await;
    let s = DemoSetup::start_traced(
        Transport::Stdio,
        "",
        &telemetry_section(&rx, "taskgate-test"),
        "",
    )
    .await;
    s.gw.wait_ready().await;
    let c = s.client();
    let secret = "a-secret-argument-7f3a";

    let only_meta = traced(
        &rx,
        &c,
        "tools/call",
        json!({"name": "echo", "arguments": {"text": secret}}),
        "meta",
        None,
    )
    .await;
    assert_eq!(only_meta.status, 200, "{:?}", only_meta.body);
    let spans = rx
        .spans_when("the server and client spans of a _meta-only call", |s| {
            in_trace(s, &only_meta.trace_id).len() >= 3
        })
        .await;
    let trace = in_trace(&spans, &only_meta.trace_id);
    let server = named(&trace, "tools/call echo", "taskgate-test").expect("server span");
    assert_eq!(server["kind"], "SERVER", "{server}");
    assert_eq!(
        server["parent_span_id"],
        only_meta.span_id.as_str(),
        "{server}"
    );
    let a = &server["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call", "{server}");
    assert_eq!(a["gen_ai.tool.name"], "echo", "{server}");
    assert_eq!(a["mcp.protocol.version"], "2026-07-28", "{server}");
    assert_eq!(a["jsonrpc.request.id"], "7", "{server}");
    let client = trace
        .iter()
        .find(|s| s["kind"] == "CLIENT" && s["service"] == "taskgate-test")
        .expect("the upstream call's client span");
    assert_eq!(client["parent_span_id"], server["span_id"], "{client}");
    assert_eq!(
        client["attributes"]["taskgate.upstream"], "demo",
        "{client}"
    );
    assert_eq!(
        client["attributes"]["network.transport"], "pipe",
        "{client}"
    );
    // The upstream got the client span's context in `_meta`, not the caller's.
    let sent = traced_messages(s.stdin_log.as_ref().unwrap());
    let call = sent
        .iter()
        .find(|m| m["method"] == "tools/call" && m["params"]["name"] == "echo")
        .expect("the upstream tools/call");
    let tp = call["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap_or("");
    assert_eq!(
        tp,
        format!(
            "00-{}-{}-01",
            only_meta.trace_id,
            client["span_id"].as_str().unwrap()
        ),
        "{call}"
    );

    // Header and a different `_meta` context: the header is the parent, `_meta` a link.
    let other_span = "2222222222222222";
    let other = format!("00-11111111111111111111111111111111-{other_span}-01");
    let with_header = traced_with_meta(
        &rx,
        &c,
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "b"}}),
        "header",
        None,
        json!({"traceparent": other}),
    )
    .await;
    assert_eq!(with_header.status, 200, "{:?}", with_header.body);
    let spans = rx
        .spans_when("the header-parented server span", |s| {
            named(
                &in_trace(s, &with_header.trace_id),
                "tools/call echo",
                "taskgate-test",
            )
            .is_some()
        })
        .await;
    let trace = in_trace(&spans, &with_header.trace_id);
    let server = named(&trace, "tools/call echo", "taskgate-test").unwrap();
    assert_eq!(
        server["parent_span_id"],
        with_header.span_id.as_str(),
        "{server}"
    );
    assert!(
        links_to(server, other_span),
        "the _meta context is no link: {server}"
    );
    assert!(!with_header.traceparent.is_empty());
    assert_nothing_private(&spans, secret);
}

/// A 2025-era session's requests are server spans too, with the session id and the
/// negotiated version; a JSON-RPC error marks the span failed with its code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_session_is_traced_with_its_session_id_and_errors() {
    let rx = Receiver::start().await;
    let s = DemoSetup::start_full(
        Transport::Stdio,
        "",
        &telemetry_section(&rx, "taskgate-legacy"),
        "",
    )
    .await;
    s.gw.wait_ready().await;
    let mut l = legacy_support::Legacy::new(&s.gw, Some(token("alice", "acme")));
    l.initialize(json!({})).await;
    let session = l.session.clone().unwrap();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let mut h = l.headers();
    h.push(("traceparent", format!("00-{trace}-{parent}-01")));
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "x"}}});
    assert_eq!(l.post_with(&h, call.to_string()).await.status, 200);
    let unknown = json!({"jsonrpc": "2.0", "id": 6, "method": "no/such/method"});
    assert_eq!(l.post_with(&h, unknown.to_string()).await.status, 200);

    let spans = rx
        .spans_when("the session's two server spans", |s| {
            let t = in_trace(s, trace);
            t.iter()
                .any(|s| s["name"] == "tools/call echo" && s["kind"] == "SERVER")
                && t.iter().any(|s| s["name"] == "no/such/method")
        })
        .await;
    let t = in_trace(&spans, trace);
    let echo = named(&t, "tools/call echo", "taskgate-legacy").unwrap();
    assert_eq!(echo["parent_span_id"], parent, "{echo}");
    let a = &echo["attributes"];
    assert_eq!(a["mcp.session.id"], session.as_str(), "{echo}");
    assert_eq!(
        a["mcp.protocol.version"],
        l.version.as_deref().unwrap(),
        "{echo}"
    );
    assert_eq!(a["jsonrpc.request.id"], "5", "{echo}");
    assert_eq!(echo["status"], "UNSET", "{echo}");
    let failed = named(&t, "no/such/method", "taskgate-legacy").unwrap();
    assert_eq!(failed["attributes"]["error.type"], "-32601", "{failed}");
    assert_eq!(failed["status"], "ERROR", "{failed}");
}

/// A collector that refuses connections: every request is answered as without
/// traces, and the dropped spans are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_no_request_anything() {
    let dead = free_port();
    let s = DemoSetup::start_full(
        Transport::Stdio,
        "",
        &format!("[telemetry]\notlp_endpoint = \"http://127.0.0.1:{dead}\"\n"),
        "",
    )
    .await;
    s.gw.wait_ready().await;
    let c = s.client();
    for i in 0..40 {
        let r = c.call_tool("echo", json!({"text": format!("n{i}")})).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(first_text(&r.json()["result"]), format!("n{i}"));
    }
    let metrics = s.gw.url("/metrics");
    let dropped = eventually_async(Duration::from_secs(30), || async {
        let r = raw(&metrics, "GET", &[], Bytes::new()).await.unwrap();
        let text = String::from_utf8_lossy(&r.body).into_owned();
        text.lines().any(|l| {
            l.starts_with("taskgate_trace_spans_dropped_total{reason=\"export_failed\"}")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(40.0)
        })
    })
    .await;
    assert!(
        dropped,
        "dropped spans not counted:\n{}",
        s.gw.proc.log_text()
    );
    assert!(
        s.gw.proc
            .wait_log("telemetry: spans dropped", Duration::from_secs(10))
            .await
            .is_some(),
        "no warning about the collector:\n{}",
        s.gw.proc.log_text()
    );
}

/// One trace id across client → edge → replica → HTTP upstream (which sees the
/// context in its headers and in `_meta`) → the task's settle span → a poll on the
/// other replica, each linked to the creation.
#[cfg(feature = "edge")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_across_edge_replicas_and_upstream() {
    use replicas_support::*;
    use tasks_support::*;
    let rx = Receiver::start().await;
    let section = telemetry_section(&rx, "taskgate");
    let rs = Replicas::start_edited(2, "", |text| format!("{text}\n{section}")).await;
    let edge = edge::start(
        &rs,
        &format!("\n{}", telemetry_section(&rx, "taskgate-edge")),
    )
    .await;
    let c = Client2026 {
        url: format!("http://127.0.0.1:{}/mcp", edge.port),
        token: Some(token("alice", "acme")),
        caps: tasks_caps(),
    };

    let created = traced(
        &rx,
        &c,
        "tools/call",
        json!({"name": "sleep", "arguments": {"ms": 1200}}),
        "header",
        None,
    )
    .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let task = created.body["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {:?}", created.body))
        .to_string();
    let creator = created.replica.clone();
    let other = if creator == "r0" { 1 } else { 0 };

    // Poll the other replica directly, in the same trace (the client continues it).
    let direct = tasks_client(&rs.gws[other], "alice", "acme");
    let mut polled = None;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let p = traced(
            &rx,
            &direct,
            "tasks/get",
            json!({"taskId": task}),
            "header",
            Some(&created.traceparent),
        )
        .await;
        assert_eq!(p.status, 200, "{:?}", p.body);
        if p.body["result"]["status"] == "completed" {
            polled = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let polled = polled.expect("the task never completed");
    assert_eq!(polled.replica, format!("r{other}"));

    let spans = rx
        .spans_when("the whole trace", |s| {
            // Every span the assertions below name (each process exports its own
            // batches every 500 ms, and the client's spans share their names).
            let t = in_trace(s, &created.trace_id);
            t.iter().any(|s| s["name"] == "task settle")
                && t.iter().any(|s| {
                    s["name"] == "tasks/get" && s["parent_span_id"] == polled.span_id.as_str()
                })
                && named(&t, "tools/call sleep", "taskgate-edge").is_some()
                && named(&t, "tools/call sleep", "taskgate").is_some()
                && t.iter()
                    .any(|s| s["kind"] == "CLIENT" && s["service"] == "taskgate")
        })
        .await;
    let trace = in_trace(&spans, &created.trace_id);
    let edge_span = named(&trace, "tools/call sleep", "taskgate-edge").expect("edge span");
    assert_eq!(
        edge_span["parent_span_id"],
        created.span_id.as_str(),
        "{edge_span}"
    );
    let creation = named(&trace, "tools/call sleep", "taskgate").expect("replica span");
    assert_eq!(
        creation["parent_span_id"], edge_span["span_id"],
        "{creation}"
    );
    assert_eq!(
        creation["resource"]["taskgate.replica_id"],
        creator.as_str(),
        "{creation}"
    );
    let upstream_call = trace
        .iter()
        .find(|s| s["kind"] == "CLIENT" && s["service"] == "taskgate")
        .unwrap();
    assert_eq!(
        upstream_call["parent_span_id"],
        creation["span_id"],
        "{}",
        serde_json::to_string_pretty(&trace).unwrap_or_default()
    );
    assert_eq!(upstream_call["attributes"]["network.transport"], "tcp");
    let settle = trace.iter().find(|s| s["name"] == "task settle").unwrap();
    assert!(
        links_to(settle, creation["span_id"].as_str().unwrap()),
        "{settle}"
    );
    assert_eq!(settle["attributes"]["taskgate.task.status"], "completed");
    let poll = trace
        .iter()
        .find(|s| s["name"] == "tasks/get" && s["parent_span_id"] == polled.span_id.as_str())
        .expect("the poll's server span");
    assert_eq!(
        poll["resource"]["taskgate.replica_id"],
        format!("r{other}"),
        "{poll}"
    );
    assert!(
        links_to(poll, creation["span_id"].as_str().unwrap()),
        "{poll}"
    );

    // The HTTP upstream saw the client span's context in both places.
    let want = format!(
        "00-{}-{}-01",
        created.trace_id,
        upstream_call["span_id"].as_str().unwrap()
    );
    let line = format!("header_traceparent=\"{want}\" meta_traceparent=\"{want}\"");
    assert!(
        rs.demo.proc.log_text().contains(&line),
        "{line} not in the upstream's log:\n{}",
        rs.demo.proc.log_text()
    );
    assert_nothing_private(&spans, "\"ms\"");
}

/// The edge, started with extra config lines (here `[telemetry]`).
#[cfg(feature = "edge")]
mod edge {
    use super::*;
    use replicas_support::Replicas;

    pub(crate) struct Edge {
        pub(crate) _proc: Proc,
        pub(crate) port: u16,
        pub(crate) _dir: tempfile::TempDir,
    }

    pub(crate) async fn start(rs: &Replicas, extra: &str) -> Edge {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let replicas: Vec<String> = rs
            .gws
            .iter()
            .map(|g| format!("\"{}\"", g.url("")))
            .collect();
        let text = format!(
            "[edge]\nlisten = \"127.0.0.1:{port}\"\nreplicas = [{}]\nhealth_interval_ms = 200\n\
             pid_file = {}\nupgrade_sock = {}\n{extra}",
            replicas.join(", "),
            toml_string(&dir.path().join("edge.pid").display().to_string()),
            toml_string(&dir.path().join("edge.sock").display().to_string()),
        );
        let config = dir.path().join("edge.toml");
        std::fs::write(&config, text).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("edge")
            .arg("--config")
            .arg(&config)
            .current_dir(dir.path())
            .env("TASKGATE_LOG", "info");
        let proc = Proc::spawn(cmd);
        let url = format!("http://127.0.0.1:{port}/healthz");
        let start = Instant::now();
        loop {
            if let Ok(r) = raw(&url, "GET", &[], Bytes::new()).await
                && r.status == 200
                && r.json()["replicas"]["healthy"] == rs.gws.len()
            {
                return Edge {
                    _proc: proc,
                    port,
                    _dir: dir,
                };
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "edge did not start:\n{}",
                proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A plain client's status call of a handle (docs/design.md §28) is linked to the
/// span that created the task, as a `tasks/get` is (§24).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_tool_call_links_to_the_handles_creation() {
    let rx = Receiver::start().await;
    let s = DemoSetup::start_full(
        Transport::Stdio,
        "",
        &telemetry_section(&rx, "taskgate"),
        "[upstream.tools.sleep]\nplain_clients = \"handle\"\npromote_after_ms = 0\n",
    )
    .await;
    s.gw.wait_ready().await;
    let c = s.client().with_caps(json!({}));
    // A short call: the creation's span ends with the upstream call it carries.
    let params = json!({"name": "sleep", "arguments": {"ms": 1500}});
    let created = traced(&rx, &c, "tools/call", params, "header", None).await;
    assert_eq!(created.status, 200, "{}", created.body);
    let id = created.body["result"]["structuredContent"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no handle: {}", created.body))
        .to_string();

    let params = json!({"name": "taskgate_task_status", "arguments": {"taskId": id}});
    let body = c.body(json!(8), "tools/call", &params);
    let mut h = c.headers("tools/call", &params);
    h.push(("mcp-param-task-id", id.clone()));
    let r = raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    let status_span = |spans: &[Value]| {
        spans
            .iter()
            .find(|s| {
                s["name"] == "tools/call taskgate_task_status"
                    && s["service"] == "taskgate"
                    && s["kind"] == "SERVER"
            })
            .cloned()
    };
    let spans = rx
        .spans_when("the creation and the status call", |s| {
            named(
                &in_trace(s, &created.trace_id),
                "tools/call sleep",
                "taskgate",
            )
            .is_some()
                && status_span(s).is_some()
        })
        .await;
    let trace = in_trace(&spans, &created.trace_id);
    let creation = named(&trace, "tools/call sleep", "taskgate").expect("creation span");
    let status = status_span(&spans).expect("status span");
    assert!(
        links_to(&status, creation["span_id"].as_str().unwrap_or_default()),
        "{status}"
    );
}
