//! Task handles as tool results for plain clients (issue 51): a client without the
//! tasks extension — a 2026-07-28 request that does not declare it, or a 2025-era
//! session call without `params.task` — calling a tool in `plain_clients = "handle"`
//! mode gets, once `promote_after_ms` passes, an ordinary successful tool result naming
//! a task, and follows it through the gateway's own tools `taskgate_task_status`,
//! `taskgate_task_cancel` and `taskgate_task_list`; a tasks client on the same endpoint
//! never sees those tools and still gets `resultType: "task"`.
//!
//! Driven through real clients installed by `scripts/install-peers.sh`: the Python
//! `mcp` 2.3 `Client` (2026-07-28, `tests/peers/handle_py_client.py`), the TypeScript
//! SDK 1.x `Client` (2025-era Streamable HTTP, `tests/peers/handle_ts_client.mjs`), and
//! the agent frameworks pydantic-ai (`MCPToolset`) and openai-agents
//! (`MCPServerStreamableHttp`) without an LLM (`tests/peers/handle_agent.py`). Each
//! driver prints one JSON object of facts on its last stdout line; the tests assert on
//! them, and check the wire itself with raw requests where a byte comparison matters.
//! Upstream: the bundled demo over stdio (`src/demo/tools.rs`: `sleep`, `measure` with
//! an `outputSchema`, `slow_elicit`); the upstream-outage test runs the same demo over
//! Streamable HTTP (`taskgate demo-upstream --http`) as its own process.

mod common;

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use common::*;

const TASKS: &str = "io.modelcontextprotocol/tasks";
const PROMOTE_MS: u64 = 1000;
const STATUS: &str = "taskgate_task_status";
const CANCEL: &str = "taskgate_task_cancel";
const LIST: &str = "taskgate_task_list";

/// Fail (never skip) when the peers are not installed.
fn require_peers() {
    for p in [
        node(),
        node_modules().join("@modelcontextprotocol/sdk/package.json"),
        peers().join("venv-mcp23/bin/python"),
        peers().join("venv-agents/bin/python"),
    ] {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
            p.display()
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Driver {
    /// Python `mcp` 2.3, 2026-07-28 without the tasks extension.
    Py,
    /// TypeScript SDK 1.32.2, a 2025-era session.
    Ts,
    /// pydantic-ai / openai-agents (the scenario picks the framework).
    Agent,
}

/// The `[tasks]`/`[limits]` sections every gateway here shares. The burst absorbs the
/// drivers' own polls; the limiter is exercised by `past_the_poll_burst_*`.
fn sections(extra_tasks: &str, poll_burst: u32) -> String {
    format!(
        "[tasks]\npromote_after_ms = {PROMOTE_MS}\npoll_interval_ms = 100\n\
         task_tools_prefix = \"taskgate_\"\nmax_status_wait_ms = 50000\n{extra_tasks}\
         [limits]\npoll_burst = {poll_burst}\n"
    )
}

/// A gateway (JWT auth) in front of the demo over stdio in handle mode.
struct Setup {
    gw: Gateway,
}

impl Setup {
    async fn start() -> Self {
        Self::start_with("", "", "").await
    }

    /// `store_extra` goes into `[store]`, `extra_tasks` into `[tasks]`, `tools` after
    /// the `[[upstream]]` (e.g. `[upstream.tools.NAME]` tables).
    async fn start_with(store_extra: &str, extra_tasks: &str, tools: &str) -> Self {
        let upstream = demo_stdio_upstream("plain_clients = \"handle\"");
        Self::start_full(store_extra, extra_tasks, &upstream, tools, 10).await
    }

    /// As [`Setup::start_with`], with the whole `[[upstream]]` table and the
    /// `[limits] poll_burst` given.
    async fn start_full(
        store_extra: &str,
        extra_tasks: &str,
        upstream: &str,
        tools: &str,
        poll_burst: u32,
    ) -> Self {
        require_peers();
        let body = format!(
            "{store_extra}{}{}{upstream}{tools}",
            jwt_auth(),
            sections(extra_tasks, poll_burst)
        );
        let gw = Gateway::start(&body).await;
        gw.wait_ready().await;
        Self { gw }
    }

    fn url(&self) -> String {
        self.gw.url("/mcp")
    }

    fn logs(&self) -> String {
        format!("--- gateway log ---\n{}", self.gw.proc.log_text())
    }

    /// A raw 2026-07-28 client as `sub`@acme: plain (`caps = {}`) or a tasks client.
    fn raw(&self, sub: &str, caps: Value) -> Client2026 {
        Client2026::new(&self.gw, "/mcp", Some(token(sub, "acme"))).with_caps(caps)
    }

    /// Run one driver scenario as alice@acme (and `token2`); returns its facts,
    /// asserting the driver itself ran.
    async fn run(
        &self,
        driver: Driver,
        scenario: &str,
        spec: Value,
        token2: Option<String>,
    ) -> Facts {
        let mut args: Vec<OsString> = Vec::new();
        let program = match driver {
            Driver::Py => {
                args.push(repo_root().join("tests/peers/handle_py_client.py").into());
                peers().join("venv-mcp23/bin/python")
            }
            Driver::Ts => {
                args.push(repo_root().join("tests/peers/handle_ts_client.mjs").into());
                args.push(node_modules().into());
                node()
            }
            Driver::Agent => {
                args.push(repo_root().join("tests/peers/handle_agent.py").into());
                peers().join("venv-agents/bin/python")
            }
        };
        args.push(self.url().into());
        args.push(token("alice", "acme").into());
        args.push(scenario.into());
        args.push(spec.to_string().into());
        if let Some(t) = token2 {
            args.push(t.into());
        }
        let out = tokio::task::spawn_blocking(move || {
            Command::new(program)
                .args(args)
                .env("OPENAI_AGENTS_DISABLE_TRACING", "1")
                .output()
                .expect("run the driver")
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let context = format!("stderr:\n{stderr}\n{}", self.logs());
        let v: Value = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| {
                panic!("{driver:?} {scenario}: no JSON report\nstdout:\n{stdout}\n{context}")
            });
        assert_eq!(
            v["ok"],
            true,
            "{driver:?} {scenario}: {}\n{}\n{context}",
            v["error"],
            v["trace"].as_str().unwrap_or("")
        );
        let f = Facts {
            v,
            context,
            what: format!("{driver:?} {scenario}"),
        };
        // Each SDK driver is the plain client of its era.
        match driver {
            Driver::Py => f.check(
                f.get("protocolVersion") == "2026-07-28",
                "the Python client speaks 2026-07-28",
            ),
            Driver::Ts => f.check(
                f.get("protocolVersion")
                    .as_str()
                    .is_some_and(|p| p.starts_with("2025-")),
                "the TypeScript SDK 1.x session is 2025-era",
            ),
            Driver::Agent => {}
        }
        f
    }

    /// Start a `sleep` of `ms` as a plain raw client `sub` and return the handle's id.
    async fn raw_handle(&self, sub: &str, ms: u64) -> String {
        let c = self.raw(sub, json!({}));
        let r = c.call_tool("sleep", json!({"ms": ms})).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        let id = v["result"]["structuredContent"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no handle in {v}\n{}", self.logs()))
            .to_string();
        assert!(is_task_id(&id), "{v}");
        id
    }
}

/// `taskgate_task_status` over raw HTTP, with the `Mcp-Param-Task-Id` header its
/// `x-mcp-header` annotation asks for (docs/design.md §12 "HTTP front"). The whole
/// response, for byte comparisons.
async fn raw_status(c: &Client2026, task_id: &str, wait: Option<u64>) -> Resp {
    let mut args = json!({"taskId": task_id});
    if let Some(w) = wait {
        args["waitSeconds"] = json!(w);
    }
    let params = json!({"name": STATUS, "arguments": args});
    let body = c.body(json!(7), "tools/call", &params);
    let mut h = c.headers("tools/call", &params);
    h.push(("mcp-param-task-id", task_id.to_string()));
    raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .unwrap_or_else(|e| panic!("{STATUS}: {e}"))
}

/// `tsk_` + 22 unpadded base64url characters (docs/design.md §1 "Promotion").
fn is_task_id(s: &str) -> bool {
    s.len() == 26
        && s.starts_with("tsk_")
        && s[4..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn is_error(r: &Value) -> bool {
    r["isError"].as_bool().unwrap_or(false)
}

fn text(r: &Value) -> String {
    r["content"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["type"] == "text"))
        .and_then(|b| b["text"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// A driver report plus everything worth printing when an assertion fails.
struct Facts {
    v: Value,
    context: String,
    what: String,
}

impl Facts {
    fn get(&self, k: &str) -> &Value {
        &self.v[k]
    }

    fn check(&self, cond: bool, what: &str) {
        assert!(cond, "{}: {what}: {}\n{}", self.what, self.v, self.context);
    }

    /// The call answered with a handle within `promote_after_ms` + 1 s: an ordinary
    /// successful tool result whose text tells a model what to call next.
    fn handle(&self, tool: &str) -> String {
        let call = self.get("call");
        let sc = &call["structuredContent"];
        let id = sc["taskId"].as_str().unwrap_or_default().to_string();
        self.check(is_task_id(&id), "the call did not answer with a handle");
        self.check(!is_error(call), "a handle is not an error");
        self.check(sc["status"] == "working", "handle status is not working");
        self.check(sc["tool"] == tool, "handle names another tool");
        self.check(
            sc["pollAfterSeconds"].is_number(),
            "handle has no pollAfterSeconds",
        );
        let t = text(call);
        self.check(
            t.contains(&id) && t.contains(STATUS) && t.contains("waitSeconds"),
            "handle text does not tell a model to call the status tool with the id and waitSeconds",
        );
        let elapsed = self.get("call_elapsed_s").as_f64().unwrap_or(f64::MAX);
        let promote = PROMOTE_MS as f64 / 1000.0;
        self.check(
            elapsed >= promote * 0.9 && elapsed < promote + 1.0,
            "the handle did not come within promote_after_ms + 1 s",
        );
        self.check(self.get("task_id") == id.as_str(), "driver saw another id");
        id
    }
}

// ---------------------------------------------------------------------------------
// Listing.

async fn plain_list(driver: Driver) {
    let s = Setup::start().await;
    let f = s
        .run(driver, "list", json!({"text": "hi plain"}), None)
        .await;
    f.check(
        f.get("task_tools") == &json!([STATUS, CANCEL, LIST]),
        "plain clients see the three task tools",
    );
    f.check(
        f.get("sleep_has_output_schema") == false,
        "sleep has no outputSchema",
    );
    f.check(
        f.get("tools")
            .as_array()
            .is_some_and(|t| t.contains(&json!("measure"))),
        "measure is listed",
    );
    f.check(
        f.get("measure_has_output_schema") == false,
        "a handle-mode tool is listed to plain clients without its outputSchema",
    );
    let schema = f.get("task_status_input_schema");
    f.check(
        schema["properties"]["taskId"]["type"] == "string"
            && schema["properties"]["taskId"]["x-mcp-header"] == "Task-Id",
        "taskId: a string annotated x-mcp-header Task-Id",
    );
    f.check(
        schema["properties"]["waitSeconds"]["type"] == "integer",
        "waitSeconds: an integer",
    );
    f.check(
        schema["required"] == json!(["taskId"]),
        "only taskId is required",
    );
    f.check(
        f.get("task_cancel_input_schema")["properties"]["taskId"]["type"] == "string",
        "task_cancel takes a taskId",
    );
    f.check(
        f.get("task_list_input_schema")["type"] == "object",
        "task_list takes an object",
    );
    // A quick call stays inline.
    let echo = f.get("echo");
    f.check(
        text(echo) == "hi plain"
            && !is_error(echo)
            && echo["structuredContent"]["taskId"].is_null(),
        "a quick call is answered inline",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_plain_list_has_task_tools() {
    plain_list(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_plain_list_has_task_tools() {
    plain_list(Driver::Ts).await;
}

// ---------------------------------------------------------------------------------
// Handle, status, list.

async fn handle_flow(driver: Driver) {
    let s = Setup::start().await;
    let f = s
        .run(driver, "handle", json!({"ms": 20000, "wait": 30}), None)
        .await;
    let id = f.handle("sleep");

    // Without waitSeconds the status answers at once: still running.
    let running = f.get("running");
    let sc = &running["structuredContent"];
    f.check(!is_error(running), "a running status is not an error");
    f.check(sc["taskId"] == id.as_str(), "running status names the task");
    f.check(sc["status"] == "working", "the task is working");
    f.check(
        sc["pollAfterSeconds"].is_number(),
        "running status has pollAfterSeconds",
    );
    f.check(
        sc.get("statusMessage")
            .is_none_or(|m| m.is_string() || m.is_null()),
        "statusMessage, when present, is a string",
    );

    // With waitSeconds the status held until the task ended: the tool's own result.
    let done = f.get("done");
    f.check(!is_error(done), "the completed result is not an error");
    f.check(text(done) == "slept 20000 ms", "the tool's own result");
    f.check(
        done["structuredContent"]["taskId"].is_null(),
        "the completed result is the tool's, not a status",
    );
    f.check(
        f.get("polls")
            .as_u64()
            .is_some_and(|n| (1..=3).contains(&n)),
        "a status with waitSeconds = 30 held for the rest of a 20 s task",
    );

    // The task list: newest first, at most 20.
    let tasks = f.get("list")["structuredContent"]["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    f.check(
        !tasks.is_empty() && tasks.len() <= 20,
        "task_list holds 1..=20 tasks",
    );
    let first = &tasks[0];
    f.check(
        first["taskId"] == id.as_str()
            && first["tool"] == "sleep"
            && first["status"] == "completed"
            && first["createdAt"].is_string(),
        "the newest task is ours, completed",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_handle_status_result_list() {
    handle_flow(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_handle_status_result_list() {
    handle_flow(Driver::Ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_wait_runs_out_on_a_running_task() {
    let s = Setup::start().await;
    let id = s.raw_handle("alice", 60000).await;
    let f = s
        .run(
            Driver::Py,
            "status",
            json!({"task_id": id, "wait": 2}),
            None,
        )
        .await;
    let r = f.get("result");
    f.check(!is_error(r), "a running status is not an error");
    f.check(
        r["structuredContent"]["status"] == "working"
            && r["structuredContent"]["taskId"] == id.as_str(),
        "still working after the wait",
    );
    let elapsed = f.get("elapsed_s").as_f64().unwrap_or(0.0);
    f.check(
        (1.8..15.0).contains(&elapsed),
        "the status call held for about waitSeconds",
    );
}

// ---------------------------------------------------------------------------------
// Cancel, bad ids.

async fn cancel_flow(driver: Driver) {
    let s = Setup::start().await;
    let f = s
        .run(driver, "cancel", json!({"ms": 60000, "wait": 5}), None)
        .await;
    let id = f.handle("sleep");
    let c = f.get("cancel");
    f.check(
        c["structuredContent"]["taskId"] == id.as_str()
            && c["structuredContent"]["status"].is_string(),
        "task_cancel answers {taskId, status}",
    );
    f.check(!text(c).is_empty(), "task_cancel answers with text too");
    let after = f.get("after");
    f.check(
        is_error(after),
        "a cancelled task's status is an error result",
    );
    f.check(
        text(after).to_lowercase().contains("cancel"),
        "the text names the cancellation",
    );
    for k in ["malformed", "missing"] {
        f.check(
            f.get(k)["error"]["code"] == -32602,
            &format!("a {k} taskId is a JSON-RPC -32602"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_cancel() {
    cancel_flow(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_cancel() {
    cancel_flow(Driver::Ts).await;
}

/// Another principal's id and a never-issued id answer alike, through the SDK and,
/// byte for byte, on the wire.
async fn foreign_flow(driver: Driver) {
    let s = Setup::start().await;
    let id = s.raw_handle("alice", 60000).await;
    let f = s
        .run(
            driver,
            "foreign",
            json!({"task_id": id}),
            Some(token("bob", "acme")),
        )
        .await;
    f.check(
        is_error(f.get("foreign")),
        "another principal's id is an error result",
    );
    f.check(
        is_error(f.get("never_issued")),
        "a never-issued id is an error result",
    );
    f.check(f.get("identical") == true, "both results are identical");

    let bob = s.raw("bob", json!({}));
    let never = format!("tsk_{}", "A".repeat(22));
    let a = raw_status(&bob, &id, None).await;
    let b = raw_status(&bob, &never, None).await;
    // Same request id, same framing: the JSON-RPC messages must match byte for byte
    // (an SSE body is compared message by message, its event ids aside).
    assert_eq!(a.status, b.status, "{}", s.logs());
    assert_eq!(a.is_sse(), b.is_sse());
    let bytes = |r: &Resp| -> Vec<u8> {
        if r.is_sse() {
            r.json().to_string().into_bytes()
        } else {
            r.body.to_vec()
        }
    };
    assert!(is_error(&a.json()["result"]), "{:?}", a.json());
    assert_eq!(
        String::from_utf8_lossy(&bytes(&a)),
        String::from_utf8_lossy(&bytes(&b)),
        "foreign vs never-issued differ on the wire\n{}",
        s.logs()
    );
    // The owner still sees it running.
    let own = raw_status(&s.raw("alice", json!({})), &id, None)
        .await
        .json();
    assert_eq!(
        own["result"]["structuredContent"]["status"], "working",
        "{own}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_foreign_is_never_issued() {
    foreign_flow(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_foreign_is_never_issued() {
    foreign_flow(Driver::Ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owners_expired_id_says_task_expired() {
    let s = Setup::start_with(
        "sweep_interval_ms = 200\n",
        "ttl_ms = 2500\nresult_retention_ms = 1\n",
        "",
    )
    .await;
    let id = s.raw_handle("alice", 60000).await;
    let alice = s.raw("alice", json!({}));
    let start = Instant::now();
    let gone = loop {
        let v = raw_status(&alice, &id, None).await.json();
        let r = &v["result"];
        if is_error(r) {
            break r.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never expired: {v}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(text(&gone).contains("task expired"), "{gone}");
    let f = s
        .run(Driver::Py, "status", json!({"task_id": id}), None)
        .await;
    let r = f.get("result");
    f.check(
        is_error(r) && text(r).contains("task expired"),
        "the SDK sees task expired",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_poll_burst_is_an_error_result_with_retry_after() {
    let s = Setup::start().await;
    let id = s.raw_handle("alice", 60000).await;
    let alice = s.raw("alice", json!({}));
    // Early status calls one after another wait the interval out: never refused.
    for _ in 0..3 {
        let v = raw_status(&alice, &id, None).await.json();
        assert_eq!(v["result"]["structuredContent"]["status"], "working", "{v}");
    }
    // More open at once than the burst (10): the ones past it are refused at once
    // with a hint a model can act on, while the others wait.
    let calls: Vec<_> = (0..14)
        .map(|_| {
            let (c, id) = (alice.clone(), id.clone());
            tokio::spawn(async move { raw_status(&c, &id, Some(3)).await.json() })
        })
        .collect();
    let mut refused = Vec::new();
    let mut waited = 0;
    for c in calls {
        let v = c.await.unwrap_or_else(|e| panic!("status call: {e}"));
        let r = &v["result"];
        if is_error(r) {
            refused.push(r.clone());
        } else {
            assert_eq!(r["structuredContent"]["status"], "working", "{v}");
            waited += 1;
        }
    }
    assert!(
        !refused.is_empty() && waited >= 1,
        "refused {refused:?}, waited {waited}\n{}",
        s.logs()
    );
    for r in refused {
        let t = text(&r);
        assert!(
            t.contains("polled too often; call again in ") && t.ends_with(" s"),
            "{r}"
        );
        assert!(
            r["structuredContent"]["retryAfterSeconds"]
                .as_u64()
                .is_some_and(|n| n >= 1),
            "{r}"
        );
    }
}

// ---------------------------------------------------------------------------------
// Output schemas and late input.

async fn output_schema_flow(driver: Driver) {
    let s = Setup::start().await;
    let f = s
        .run(
            driver,
            "output_schema",
            json!({"ms": 3000, "wait": 30}),
            None,
        )
        .await;
    f.check(f.get("measure_listed") == true, "measure is listed");
    f.check(
        f.get("measure_has_output_schema") == false,
        "measure is listed without outputSchema to a plain client",
    );
    f.check(
        f.get("sdk_accepted") == true,
        "the SDK's outputSchema validation accepted the handle",
    );
    f.handle("measure");
    f.check(
        f.get("status_sdk_accepted") == true,
        "the SDK accepted the status answers",
    );
    let done = f.get("done");
    f.check(!is_error(done), "measure completed");
    f.check(
        done["structuredContent"]["elapsedMs"]
            .as_u64()
            .is_some_and(|ms| ms >= 3000),
        "the stored result's structuredContent is the tool's own",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_output_schema_tool_in_handle_mode() {
    output_schema_flow(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_output_schema_tool_in_handle_mode() {
    output_schema_flow(Driver::Ts).await;
}

/// Input the upstream asks for after the handle: 2026 clients get MRTR on the status
/// call, 2025 clients an elicitation request on its SSE stream; either way the SDK's
/// elicitation handler answers and the task completes with the answer.
async fn elicit_late_flow(driver: Driver) {
    let s = Setup::start().await;
    let spec = json!({"ms": 3000, "message": "Favourite colour?", "wait": 20,
                      "answer": {"answer": "octarine"}});
    let f = s.run(driver, "elicit_late", spec, None).await;
    f.handle("slow_elicit");
    f.check(
        f.get("asked_before_handle") == &json!([]),
        "nothing was asked before the deadline",
    );
    f.check(
        f.get("asked") == &json!(["Favourite colour?"]),
        "the question reached the elicitation handler once",
    );
    f.check(!is_error(f.get("done")), "the task completed");
    f.check(
        f.get("final_text")
            .as_str()
            .is_some_and(|t| t.contains("octarine")),
        "the answer reached the tool",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_elicit_after_the_handle_via_mrtr() {
    elicit_late_flow(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_elicit_after_the_handle_via_sse() {
    elicit_late_flow(Driver::Ts).await;
}

// ---------------------------------------------------------------------------------
// Agent frameworks.

async fn agent_flow(framework: &str) {
    let s = Setup::start().await;
    let f = s
        .run(
            Driver::Agent,
            framework,
            json!({"ms": 6000, "wait": 30}),
            None,
        )
        .await;
    f.check(
        f.get("tools")
            .as_array()
            .is_some_and(|t| t.contains(&json!(STATUS)) && t.contains(&json!("sleep"))),
        "the framework lists sleep and the status tool",
    );
    let id = f.get("task_id").as_str().unwrap_or_default().to_string();
    f.check(is_task_id(&id), "the framework's call returned a handle");
    let elapsed = f.get("call_elapsed_s").as_f64().unwrap_or(f64::MAX);
    f.check(
        elapsed < PROMOTE_MS as f64 / 1000.0 + 1.0,
        "the handle came within promote_after_ms + 1 s",
    );
    let done = f.get("done");
    // pydantic-ai maps a single-text result to its text; openai-agents returns the
    // CallToolResult.
    let final_text = done
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| text(done));
    f.check(
        final_text == "slept 6000 ms",
        "the status call returned the tool's result",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pydantic_ai_follows_a_handle() {
    agent_flow("pydantic_ai").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_agents_follows_a_handle() {
    agent_flow("openai_agents").await;
}

// ---------------------------------------------------------------------------------
// Tasks clients and per-tool modes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_client_sees_no_task_tools_and_gets_a_task() {
    let s = Setup::start().await;
    let tasks = s.raw("carol", json!({"extensions": {TASKS: {}}}));
    let listed = tasks.request("tools/list", json!({})).await.json();
    let tools = listed["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    for n in [STATUS, CANCEL, LIST] {
        assert!(!names.contains(&n), "a tasks client sees {n}: {listed}");
    }
    let measure = tools
        .iter()
        .find(|t| t["name"] == "measure")
        .unwrap_or_else(|| panic!("measure not listed: {listed}"));
    assert!(
        measure["outputSchema"].is_object(),
        "a tasks client keeps measure's outputSchema: {measure}"
    );
    let r = tasks.call_tool("sleep", json!({"ms": 5000})).await;
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "task", "{v}\n{}", s.logs());
    assert!(
        v["result"]["taskId"].as_str().is_some_and(is_task_id),
        "{v}"
    );

    // The same endpoint, a plain raw client: the task tools are there.
    let plain = s.raw("carol", json!({}));
    let listed = plain.request("tools/list", json!({})).await.json();
    let names: Vec<String> = listed["result"]["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for n in [STATUS, CANCEL, LIST] {
        assert!(
            names.iter().any(|x| x == n),
            "a plain client lacks {n}: {listed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_in_hold_mode_is_held_inline() {
    let s = Setup::start_with("", "", "[upstream.tools.sleep]\nplain_clients = \"hold\"\n").await;
    let plain = s.raw("alice", json!({}));
    let listed = plain.request("tools/list", json!({})).await.json();
    let tools = listed["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // measure is still in handle mode: no outputSchema for a plain client.
    let measure = tools.iter().find(|t| t["name"] == "measure");
    assert!(
        measure.is_some_and(|m| m.get("outputSchema").is_none()),
        "{listed}"
    );
    let start = Instant::now();
    let v = plain.call_tool("sleep", json!({"ms": 2500})).await.json();
    assert_eq!(text(&v["result"]), "slept 2500 ms", "{v}\n{}", s.logs());
    assert!(start.elapsed() >= Duration::from_millis(2400), "{v}");
    assert!(v["result"]["structuredContent"]["taskId"].is_null(), "{v}");
}

// ---------------------------------------------------------------------------------
// Durability, upstream outages, held status calls, inline input, metrics.

/// `taskgate_task_list` as a raw 2026 plain client: the `result`.
async fn raw_list(c: &Client2026) -> Value {
    let r = c.call_tool(LIST, json!({})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["result"].clone()
}

/// The status of `id` in the owner's `taskgate_task_list`, if listed.
async fn listed_status(c: &Client2026, id: &str) -> Option<String> {
    let r = raw_list(c).await;
    r["structuredContent"]["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["taskId"] == id)
        .and_then(|t| t["status"].as_str().map(str::to_string))
}

/// A handle survives a SIGKILL of the gateway: a task that completed before the kill
/// answers its stored result after the restart; one still running at the kill answers
/// a failure naming the restart (docs/design.md §16, `recover`), never `working`
/// forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_resolves_after_sigkill_and_restart() {
    let s = Setup::start().await;
    let id = s.raw_handle("alice", 2500).await;
    let alice = s.raw("alice", json!({}));
    // Wait on the list (it does not touch the result) until the task completed.
    let start = Instant::now();
    loop {
        let st = listed_status(&alice, &id).await;
        if st.as_deref() == Some("completed") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never completed: {st:?}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = Setup {
        gw: s.gw.kill9_and_relaunch().await,
    };
    let alice = s.raw("alice", json!({}));
    let v = raw_status(&alice, &id, None).await.json();
    let r = &v["result"];
    assert!(!is_error(r), "{v}\n{}", s.logs());
    assert_eq!(text(r), "slept 2500 ms", "{v}\n{}", s.logs());

    // A task still running at the kill fails with the restart as its reason.
    let id = s.raw_handle("alice", 60000).await;
    let v = raw_status(&alice, &id, None).await.json();
    assert_eq!(v["result"]["structuredContent"]["status"], "working", "{v}");
    let s = Setup {
        gw: s.gw.kill9_and_relaunch().await,
    };
    let alice = s.raw("alice", json!({}));
    let v = raw_status(&alice, &id, None).await.json();
    let r = &v["result"];
    assert!(is_error(r), "{v}\n{}", s.logs());
    assert!(
        text(r).contains("gateway restarted while the call was in flight"),
        "{v}\n{}",
        s.logs()
    );
    assert_eq!(r["structuredContent"]["status"], "failed", "{v}");
}

/// The task tools are the gateway's own: with the upstream process gone they still
/// answer tool results (not a transport error or a 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_status_answers_while_the_upstream_is_down() {
    let mut up = DemoHttp::start().await;
    let upstream = demo_http_upstream(up.port, "plain_clients = \"handle\"");
    let s = Setup::start_full("", "", &upstream, "", 10).await;
    let id = s.raw_handle("alice", 60000).await;
    up.proc.kill9();
    // Let the gateway notice (its readiness turns 503), at most 20 s.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let r = raw(&s.gw.url("/readyz"), "GET", &[], Bytes::new()).await;
        if r.is_ok_and(|r| r.status == 503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alice = s.raw("alice", json!({}));
    // A few rounds over a few seconds: each answers a tool result.
    for round in 0..4 {
        let resp = raw_status(&alice, &id, None).await;
        assert_eq!(
            resp.status,
            200,
            "round {round}: {}\n{}",
            String::from_utf8_lossy(&resp.body),
            s.logs()
        );
        let v = resp.json();
        assert!(v["error"].is_null(), "round {round}: {v}\n{}", s.logs());
        let r = &v["result"];
        assert!(r["content"].is_array(), "round {round}: {v}");
        let st = &r["structuredContent"]["status"];
        assert!(
            st == "working" || st == "failed",
            "round {round}: status {st}: {v}"
        );
        if st == "failed" {
            assert!(is_error(r), "{v}");
        }
        let list = raw_list(&alice).await;
        assert!(
            list["structuredContent"]["tasks"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["taskId"] == id.as_str())),
            "round {round}: {list}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Resident set size of `pid` in KiB (`VmRSS` in /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// A held status call waits on the store, not on the upstream: a thousand of them for
/// one task leave the upstream's two slots free for a real call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_held_status_calls_leave_upstream_slots_free() {
    const HELD: usize = 1000;
    let upstream = stdio_upstream_bare("plain_clients = \"handle\"\nmax_concurrency = 2");
    let s = Setup::start_full("", "", &upstream, "", 2000).await;
    let id = s.raw_handle("alice", 60000).await;
    let alice = s.raw("alice", json!({}));
    let pid = s.gw.pid();
    let before = rss_kib(pid);
    // Each raw request opens its own connection (tests/common `send`): 1000 at once.
    let started = Instant::now();
    let calls: Vec<_> = (0..HELD)
        .map(|_| {
            let (c, id) = (alice.clone(), id.clone());
            tokio::spawn(async move { raw_status(&c, &id, Some(20)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let held_rss = rss_kib(pid);
    let early = calls.iter().filter(|c| c.is_finished()).count();
    let echo_start = Instant::now();
    let echo = tokio::time::timeout(
        Duration::from_secs(10),
        s.raw("alice", json!({}))
            .call_tool("echo", json!({"text": "slots free"})),
    )
    .await
    .unwrap_or_else(|_| panic!("echo did not answer within 10 s\n{}", s.logs()));
    let echo_s = echo_start.elapsed().as_secs_f64();
    let v = echo.json();
    assert_eq!(text(&v["result"]), "slots free", "{v}\n{}", s.logs());
    assert!(v["result"]["structuredContent"]["taskId"].is_null(), "{v}");
    let mut working = 0;
    for c in calls {
        let r = c.await.unwrap_or_else(|e| panic!("status call: {e}"));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert!(
            !is_error(&v["result"]),
            "a held status call was refused: {v}\n{}",
            s.logs()
        );
        assert_eq!(v["result"]["structuredContent"]["status"], "working", "{v}");
        working += 1;
    }
    assert_eq!(working, HELD);
    eprintln!(
        "held status calls: {HELD} (answered before the echo: {early}); gateway RSS \
         {before} KiB before, {held_rss} KiB while held (delta {} KiB, {:.1} KiB per \
         call); echo answered in {echo_s:.3} s; all answered after {:.1} s",
        held_rss as i64 - before as i64,
        (held_rss as f64 - before as f64) / HELD as f64,
        started.elapsed().as_secs_f64()
    );
}

/// Input the upstream asks for before `promote_after_ms` is relayed on the call itself
/// (MRTR for a 2026 client, an SSE request for a 2025 session), and the call answers
/// inline: no handle.
async fn elicit_inline_flow(driver: Driver) {
    let s = Setup::start_with("", "", "[upstream.tools.elicit]\npromote_after_ms = 5000\n").await;
    let spec = json!({"tool": "elicit", "args": {"message": "Favourite colour?"},
                      "answer": {"answer": "octarine"}});
    let f = s.run(driver, "elicit_late", spec, None).await;
    let call = f.get("call");
    f.check(
        f.get("task_id").is_null() && call["structuredContent"]["taskId"].is_null(),
        "the call answered inline, not with a handle",
    );
    f.check(!is_error(call), "the elicit call succeeded");
    f.check(
        text(call).starts_with("elicited: accept") && text(call).contains("octarine"),
        "the tool's own result carries the answer",
    );
    f.check(
        f.get("asked_before_handle") == &json!(["Favourite colour?"]),
        "the question reached the elicitation handler once, during the call",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_before_the_deadline_is_relayed_on_the_call_in_handle_mode() {
    elicit_inline_flow(Driver::Py).await;
    elicit_inline_flow(Driver::Ts).await;
}

/// The value of the first `/metrics` series named `name` whose labels contain all of
/// `labels` (label order is not fixed).
fn series(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (lbl, value) = rest.strip_prefix('{')?.split_once('}')?;
        labels
            .iter()
            .all(|want| lbl.split(',').any(|have| have == *want))
            .then(|| value.trim().parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_handles_and_status_calls_by_client_kind() {
    let s = Setup::start().await;
    let id = s.raw_handle("alice", 60000).await;
    let v = raw_status(&s.raw("alice", json!({})), &id, None)
        .await
        .json();
    assert_eq!(v["result"]["structuredContent"]["status"], "working", "{v}");
    let r = raw(&s.gw.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let m = String::from_utf8_lossy(&r.body).to_string();
    let promotions = series(
        &m,
        "taskgate_promotions_total",
        &["client=\"handle\"", "upstream=\"demo\""],
    );
    assert!(promotions.is_some_and(|n| n >= 1.0), "{m}");
    let reads = series(&m, "taskgate_status_reads_total", &["client=\"handle\""]);
    assert!(reads.is_some_and(|n| n >= 1.0), "{m}");
}
