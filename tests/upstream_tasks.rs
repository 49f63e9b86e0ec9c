//! Upstream tasks for 2026 clients (docs/design.md §25, upstream half): a legacy
//! server that advertises `tasks.requests.tools.call` runs a tool declaring
//! `execution.taskSupport` as its own 2025-11-25 task; the gateway answers with its own
//! durable task and follows the upstream one — status messages, input through the
//! upstream's `tasks/result`, cancel forwarded, the result fetched once `tasks/get`
//! says it is terminal — and re-attaches to it after a restart (HTTP), or fails it
//! (stdio, where the task dies with its child).
//!
//! Real upstreams: the Python `mcp` 1.30 task server (`tests/peers/mcp130_task_server.py`)
//! and server-everything's `simulate-research-query`, each over HTTP and stdio.

mod common;
mod legacy_support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;
use legacy_support::Legacy;

const TASKS: &str = "io.modelcontextprotocol/tasks";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Up {
    PyHttp,
    PyStdio,
    EverythingHttp,
    EverythingStdio,
}

struct Setup {
    gw: Gateway,
    /// The HTTP upstream's process (kept alive across gateway restarts).
    _server: Option<Proc>,
}

fn stdio(command: &[String]) -> String {
    let cmd: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[[upstream]]\nname = \"up\"\npath = \"/mcp\"\ncommand = [{}]\n",
        cmd.join(", ")
    )
}

async fn setup(up: Up) -> Setup {
    setup_with(up, "").await
}

/// [`setup`] with more `[tasks]` keys.
async fn setup_with(up: Up, tasks_extra: &str) -> Setup {
    for p in [task_python(), node(), everything_js()] {
        assert!(
            p.exists(),
            "{} is missing: run the README's test command",
            p.display()
        );
    }
    let (server, upstream) = match up {
        Up::PyHttp => {
            let (p, port) = start_task_server_http().await;
            let url = format!("http://127.0.0.1:{port}/mcp");
            (Some(p), http_upstream("up", "/mcp", &url, ""))
        }
        Up::EverythingHttp => {
            let (p, port) = start_everything_http().await;
            let url = format!("http://127.0.0.1:{port}/mcp");
            (Some(p), http_upstream("up", "/mcp", &url, ""))
        }
        Up::PyStdio => (
            None,
            stdio(&[
                task_python().display().to_string(),
                task_server_py().display().to_string(),
                "stdio".into(),
            ]),
        ),
        Up::EverythingStdio => (
            None,
            stdio(&[
                node().display().to_string(),
                everything_js().display().to_string(),
                "stdio".into(),
            ]),
        ),
    };
    let body = format!(
        "{}\n[tasks]\npoll_interval_ms = 100\n{tasks_extra}\n{upstream}",
        jwt_auth()
    );
    let gw = Gateway::start(&body).await;
    gw.wait_ready().await;
    Setup {
        gw,
        _server: server,
    }
}

fn client(gw: &Gateway) -> Client2026 {
    Client2026::new(gw, "/mcp", Some(token("alice", "acme")))
        .with_caps(json!({"extensions": {TASKS: {}}, "elicitation": {}}))
}

/// Call `tool` and return the id of the gateway's task.
async fn start(gw: &Gateway, tool: &str, args: Value) -> String {
    let h = create(gw, tool, args).await;
    h["taskId"].as_str().expect("taskId").to_string()
}

/// Call `tool` and return the gateway's task handle.
async fn create(gw: &Gateway, tool: &str, args: Value) -> Value {
    let r = client(gw).call_tool(tool, args).await;
    let v = r.json();
    assert_eq!(r.status, 200, "{v}\n{}", gw.proc.log_text());
    let t = v["result"].clone();
    assert_eq!(t["resultType"], "task", "{v}\n{}", gw.proc.log_text());
    t
}

/// One `tasks/get` (after the advertised interval): the task, `None` on a 429.
async fn get(gw: &Gateway, id: &str) -> Option<Value> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = client(gw).request("tasks/get", json!({"taskId": id})).await;
    if r.status == 429 {
        return None;
    }
    let v = r.json();
    assert_eq!(r.status, 200, "tasks/get: {v}\n{}", gw.proc.log_text());
    Some(v["result"].clone())
}

/// Poll until the status is `until` (or terminal), collecting the status messages.
async fn follow(gw: &Gateway, id: &str, until: &str, seen: &mut Vec<String>) -> Value {
    let start = Instant::now();
    loop {
        let Some(t) = get(gw, id).await else { continue };
        if let Some(m) = t["statusMessage"].as_str()
            && seen.last().map(String::as_str) != Some(m)
        {
            seen.push(m.to_string());
        }
        let status = t["status"].as_str().unwrap_or_default();
        if status == until || matches!(status, "completed" | "failed" | "cancelled") {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "task {id} stuck in {status}: {t}\n{}",
            gw.proc.log_text()
        );
    }
}

/// Poll until the upstream reports progress of its own (a status message other than
/// the gateway's "working").
async fn under_way(gw: &Gateway, id: &str) {
    let start = Instant::now();
    loop {
        if let Some(t) = get(gw, id).await {
            assert_eq!(t["status"], "working", "{t}");
            if t["statusMessage"].as_str().is_some_and(|m| m != "working") {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}",
            gw.proc.log_text()
        );
    }
}

async fn update(gw: &Gateway, id: &str, key: &str, content: Value) {
    let r = client(gw)
        .request(
            "tasks/update",
            json!({"taskId": id, "inputResponses": {key: {"action": "accept", "content": content}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert!(r.json().get("result").is_some(), "{}", r.json());
}

// ---------------------------------------------------------------------------------

async fn python_flows(up: Up) {
    let s = setup(up).await;
    let gw = &s.gw;

    // A task, its status messages, its result.
    let id = start(gw, "task_work", json!({"ms": 1200, "steps": 3})).await;
    let mut seen = Vec::new();
    let t = follow(gw, &id, "completed", &mut seen).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(
        first_text(&t["result"]),
        "task_work done: 1200 ms, 3 steps",
        "{t}"
    );
    assert!(
        t["result"]["_meta"]
            .get("io.modelcontextprotocol/related-task")
            .is_none(),
        "the upstream's task key goes: {t}"
    );
    assert!(
        seen.iter().any(|m| m.starts_with("step ")),
        "the upstream's statusMessage becomes the task's: {seen:?}"
    );

    // Input: the upstream asks through tasks/result; the answer goes back by tasks/update.
    let id = start(
        gw,
        "task_work",
        json!({"ms": 800, "steps": 2, "ask": "which?"}),
    )
    .await;
    let t = follow(gw, &id, "input_required", &mut Vec::new()).await;
    assert_eq!(t["status"], "input_required", "{t}");
    let req = &t["inputRequests"]["elicitation-1"];
    assert_eq!(req["method"], "elicitation/create", "{t}");
    assert_eq!(req["params"]["message"], "which?", "{t}");
    update(gw, &id, "elicitation-1", json!({"answer": "42"})).await;
    let t = follow(gw, &id, "completed", &mut Vec::new()).await;
    assert_eq!(
        first_text(&t["result"]),
        "task_work done: 800 ms, 2 steps, answer=42",
        "{t}"
    );

    // Cancel is forwarded upstream.
    let id = start(gw, "task_work", json!({"ms": 30000, "steps": 30})).await;
    under_way(gw, &id).await;
    let r = client(gw)
        .request("tasks/cancel", json!({"taskId": id}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let t = follow(gw, &id, "cancelled", &mut Vec::new()).await;
    assert_eq!(t["status"], "cancelled", "{t}");
    assert!(
        gw.proc
            .wait_log("upstream task cancelled", Duration::from_secs(20))
            .await
            .is_some(),
        "tasks/cancel reached the upstream:\n{}",
        gw.proc.log_text()
    );

    // The upstream's failures: a raised error fails the task; `isError` is a tool error.
    let id = start(
        gw,
        "task_work",
        json!({"ms": 200, "steps": 1, "fail": "error"}),
    )
    .await;
    let t = follow(gw, &id, "failed", &mut Vec::new()).await;
    assert_eq!(t["status"], "failed", "{t}");
    assert!(
        t["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the upstream task failed"),
        "{t}"
    );
    let id = start(
        gw,
        "task_work",
        json!({"ms": 200, "steps": 1, "fail": "isError"}),
    )
    .await;
    let t = follow(gw, &id, "completed", &mut Vec::new()).await;
    assert_eq!(t["result"]["isError"], true, "{t}");

    // The optional tool runs as the upstream's task too.
    let id = start(gw, "task_optional", json!({"ms": 200, "steps": 1})).await;
    let t = follow(gw, &id, "completed", &mut Vec::new()).await;
    assert_eq!(
        first_text(&t["result"]),
        "task_work done: 200 ms, 1 steps",
        "{t}"
    );

    // A client without the extension calling a `required` tool: 400 -32021 (§1).
    let plain = Client2026::new(gw, "/mcp", Some(token("alice", "acme")));
    let r = plain.call_tool("task_work", json!({"ms": 10})).await;
    assert_eq!(r.status, 400, "{}", r.json());
    assert_eq!(r.json()["error"]["code"], -32021, "{}", r.json());
    // …and a plain tool of the same server is a plain call.
    let r = client(gw).call_tool("echo", json!({"text": "hi"})).await;
    assert_eq!(first_text(&r.json()["result"]), "hi", "{}", r.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_task_server_over_http() {
    python_flows(Up::PyHttp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_task_server_over_stdio() {
    python_flows(Up::PyStdio).await;
}

async fn research(up: Up) {
    let s = setup(up).await;
    let gw = &s.gw;
    let h = create(
        gw,
        "simulate-research-query",
        json!({"topic": "python", "ambiguous": true}),
    )
    .await;
    // The upstream keeps its task 5 minutes, less than the gateway would: ttlMs says so.
    assert_eq!(h["ttlMs"], 300000, "{h}");
    let id = h["taskId"].as_str().expect("taskId").to_string();
    let mut seen = Vec::new();
    let t = follow(gw, &id, "input_required", &mut seen).await;
    assert_eq!(t["status"], "input_required", "{t}\n{}", gw.proc.log_text());
    let key = t["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an input request");
    update(gw, &id, &key, json!({"interpretation": "snake"})).await;
    let t = follow(gw, &id, "completed", &mut seen).await;
    assert_eq!(t["status"], "completed", "{t}");
    let text = first_text(&t["result"]);
    assert!(text.contains("Research Report"), "{text}");
    assert!(
        text.contains("snake"),
        "the answer reached the upstream: {text}"
    );
    assert!(
        seen.iter().any(|m| m.contains("Gathering sources")),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_research_over_http() {
    research(Up::EverythingHttp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_research_over_stdio() {
    research(Up::EverythingStdio).await;
}

/// Stop the gateway (SIGKILL or SIGTERM) mid-task and start it again on its store.
async fn restart(s: Setup, kill: bool) -> Setup {
    let Setup { gw, _server } = s;
    if kill {
        let gw = gw.kill9_and_relaunch().await;
        return Setup { gw, _server };
    }
    let Gateway {
        mut proc,
        dir,
        config_path,
        ..
    } = gw;
    proc.sigterm();
    let _ = tokio::task::spawn_blocking(move || {
        let _ = proc.child.wait();
    })
    .await;
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    Setup { gw, _server }
}

async fn reattach(up: Up, kill: bool) {
    let s = setup(up).await;
    let (tool, args, done) = match up {
        Up::EverythingHttp => (
            "simulate-research-query",
            json!({"topic": "rust"}),
            "Research Report",
        ),
        _ => (
            "task_work",
            json!({"ms": 4000, "steps": 8}),
            "task_work done: 4000 ms, 8 steps",
        ),
    };
    let id = start(&s.gw, tool, args).await;
    // Under way upstream before the gateway goes.
    under_way(&s.gw, &id).await;
    let mut seen = Vec::new();
    let s = restart(s, kill).await;
    let t = follow(&s.gw, &id, "completed", &mut seen).await;
    assert_eq!(t["status"], "completed", "{t}\n{}", s.gw.proc.log_text());
    assert!(first_text(&t["result"]).contains(done), "{t}");
    assert!(
        s.gw.proc
            .log_text()
            .contains("re-attached to the upstream task"),
        "{}",
        s.gw.proc.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_reattaches_to_python_http_tasks() {
    reattach(Up::PyHttp, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_gateway_leaves_the_upstream_session_and_reattaches() {
    reattach(Up::PyHttp, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_reattaches_to_server_everything_tasks() {
    reattach(Up::EverythingHttp, true).await;
}

/// Over stdio the task lives in the child, which dies with the gateway: the restarted
/// gateway fails it once, with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_task_fails_with_its_child() {
    let s = setup(Up::PyStdio).await;
    let id = start(&s.gw, "task_work", json!({"ms": 20000, "steps": 20})).await;
    under_way(&s.gw, &id).await;
    let s = restart(s, true).await;
    let t = follow(&s.gw, &id, "failed", &mut Vec::new()).await;
    assert_eq!(t["status"], "failed", "{t}");
    assert!(
        t["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("gateway restarted"),
        "{t}"
    );
}

/// A 2025-era session calling a `required` upstream-task tool without `params.task`:
/// the gateway follows the upstream task inline, as one long call (the upstream itself
/// refuses such a call with `-32601`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_session_gets_a_required_task_tool_inline() {
    let s = setup(Up::PyHttp).await;
    let mut l = Legacy::new(&s.gw, Some(token("alice", "acme")));
    l.initialize_as(json!({"elicitation": {}}), "2025-06-18")
        .await;
    let r = l
        .request(
            json!(2),
            "tools/call",
            json!({"name": "task_work", "arguments": {"ms": 600, "steps": 2}}),
        )
        .await;
    let v = if r.is_sse() {
        r.sse_messages()
            .into_iter()
            .find(|m| m.get("id") == Some(&json!(2)))
            .unwrap_or_default()
    } else {
        r.json()
    };
    assert_eq!(
        first_text(&v["result"]),
        "task_work done: 600 ms, 2 steps",
        "{v}\n{}",
        s.gw.proc.log_text()
    );
}

/// Keyed calls of an upstream-task tool (docs/design.md §9): concurrent duplicates get
/// one task (its claim is written before anything goes upstream), which completes, and
/// a repeat after completion names it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_duplicates_share_one_upstream_task() {
    let s = setup(Up::PyHttp).await;
    let gw = &s.gw;
    let keyed = || async {
        let c = client(gw);
        let params = json!({"name": "task_work", "arguments": {"ms": 800, "steps": 2}});
        let body = c.body(json!(1), "tools/call", &params);
        let mut h = c.headers("tools/call", &params);
        h.push(("idempotency-key", "report-42".to_string()));
        let r = raw(&c.url, "POST", &h, bytes::Bytes::from(body.to_string()))
            .await
            .expect("tools/call");
        let v = r.json();
        assert_eq!(
            v["result"]["resultType"],
            "task",
            "{v}\n{}",
            gw.proc.log_text()
        );
        v["result"]["taskId"].as_str().expect("taskId").to_string()
    };
    let ids = futures_util::future::join_all((0..4).map(|_| keyed())).await;
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    let t = follow(gw, &ids[0], "completed", &mut Vec::new()).await;
    assert_eq!(
        first_text(&t["result"]),
        "task_work done: 800 ms, 2 steps",
        "{t}"
    );
    assert_eq!(keyed().await, ids[0]);
    // One upstream task was created for all of them.
    let created = gw.proc.log_text().matches("upstream task created").count();
    assert_eq!(created, 1, "{}", gw.proc.log_text());
}

/// An upstream delivers an input request once, on the `tasks/result` stream of the
/// gateway process that asked: after a restart nobody can answer it, so the
/// re-attached task fails once `input_timeout_ms` passes without a request (and the
/// upstream task is cancelled), rather than waiting out its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_request_lost_with_the_gateway_fails_the_task() {
    let s = setup_with(Up::PyHttp, "input_timeout_ms = 3000\n").await;
    let id = start(
        &s.gw,
        "task_work",
        json!({"ms": 600, "steps": 2, "ask": "which?"}),
    )
    .await;
    let t = follow(&s.gw, &id, "input_required", &mut Vec::new()).await;
    assert_eq!(t["status"], "input_required", "{t}");
    let s = restart(s, true).await;
    let t = follow(&s.gw, &id, "failed", &mut Vec::new()).await;
    assert_eq!(t["status"], "failed", "{t}\n{}", s.gw.proc.log_text());
    assert!(
        t["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("never reached the gateway"),
        "{t}"
    );
    assert!(
        s.gw.proc
            .wait_log("upstream task cancelled", Duration::from_secs(20))
            .await
            .is_some(),
        "{}",
        s.gw.proc.log_text()
    );
}
