//! The official TypeScript SDK end to end: `@modelcontextprotocol/client` 2.4.0
//! (2026-07-28) with `@modelcontextprotocol/ext-tasks` 0.2.2 (installed by
//! `scripts/install-peers.sh` into `.peers/npm`, run on the Node 22 from
//! `.peers/node22`), driven by `tests/peers/ts_client.mjs`, against the gateway in
//! front of the bundled demo legacy upstream (stdio) and of server-everything
//! (Streamable HTTP, its own process). Auth: the JWT bearer token as a transport
//! header.
//!
//! ext-tasks validates every 2026 result strictly, including the `result` nested in a
//! completed task, which must carry its own `resultType` (docs/design.md, introduction:
//! payload fidelity). Its 2026 task traffic goes through a host `rawDispatch`; the
//! driver's sends each request through the SDK's own `StreamableHTTPClientTransport`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;

const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// Fail (never skip) when the peers are not installed.
fn require_peers() {
    for p in [
        node(),
        node_modules().join("@modelcontextprotocol/client/package.json"),
        node_modules().join("@modelcontextprotocol/ext-tasks/package.json"),
        everything_js(),
    ] {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
            p.display()
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Up {
    /// The bundled demo legacy server over stdio.
    Demo,
    /// The same, with the gateway's listener on TLS under a private CA the SDK trusts
    /// through `NODE_EXTRA_CA_CERTS`.
    DemoOverTls,
    /// server-everything over Streamable HTTP.
    Everything,
}

/// What each flow calls on an upstream, and what it must answer.
struct Flow {
    tool: &'static str,
    args: Value,
    answer: Value,
}

impl Up {
    fn fast(self) -> (Flow, &'static str) {
        match self {
            Up::Demo | Up::DemoOverTls => (flow("echo", json!({"text": "hi ts"})), "hi ts"),
            Up::Everything => (flow("echo", json!({"message": "hi ts"})), "Echo: hi ts"),
        }
    }

    fn slow(self) -> (Flow, &'static str) {
        match self {
            Up::Demo | Up::DemoOverTls => (flow("sleep", json!({"ms": 1500})), "slept 1500 ms"),
            Up::Everything => (
                flow(
                    "trigger-long-running-operation",
                    json!({"duration": 2, "steps": 2}),
                ),
                "Long running operation completed. Duration: 2 seconds, Steps: 2.",
            ),
        }
    }

    fn long(self) -> Flow {
        match self {
            Up::Demo | Up::DemoOverTls => flow("sleep", json!({"ms": 30000})),
            Up::Everything => flow(
                "trigger-long-running-operation",
                json!({"duration": 30, "steps": 30}),
            ),
        }
    }

    /// The elicitation flow, the question's message, and a text the result holds.
    fn elicit(self) -> (Flow, &'static str, &'static str) {
        match self {
            Up::Demo | Up::DemoOverTls => (
                Flow {
                    tool: "elicit",
                    args: json!({"message": "Favourite colour?"}),
                    answer: json!({"answer": "octarine"}),
                },
                "Favourite colour?",
                "elicited: accept {\"answer\":\"octarine\"}",
            ),
            Up::Everything => (
                Flow {
                    tool: "trigger-elicitation-request",
                    args: json!({}),
                    answer: json!({"name": "Ada Lovelace", "check": true}),
                },
                "Please provide inputs for the following fields:",
                "- Name: Ada Lovelace",
            ),
        }
    }

    fn server_name(self) -> Option<&'static str> {
        match self {
            Up::Demo | Up::DemoOverTls => Some("taskgate-demo"),
            Up::Everything => None,
        }
    }
}

fn flow(tool: &'static str, args: Value) -> Flow {
    Flow {
        tool,
        args,
        answer: json!({}),
    }
}

/// A gateway (JWT auth) in front of `up`; server-everything runs as its own process.
struct Setup {
    _everything: Option<Proc>,
    gw: Gateway,
    /// `/mcp` as the SDK reaches it.
    url: String,
    /// With [`Up::DemoOverTls`]: the CA file for `NODE_EXTRA_CA_CERTS`, and its home.
    tls: Option<(std::path::PathBuf, tempfile::TempDir)>,
}

impl Setup {
    async fn start(up: Up) -> Self {
        require_peers();
        // The SDK honours pollIntervalMs; the burst only absorbs its first polls
        // racing the creation (the limiter itself is tested in limits.rs).
        let tasks =
            "[tasks]\npromote_after_ms = 500\npoll_interval_ms = 100\n[limits]\npoll_burst = 10\n";
        let (everything, upstream) = match up {
            Up::Demo | Up::DemoOverTls => (None, demo_stdio_upstream("")),
            Up::Everything => {
                let (p, port) = start_everything_http().await;
                (
                    Some(p),
                    http_upstream(
                        "everything",
                        "/mcp",
                        &format!("http://127.0.0.1:{port}/mcp"),
                        "max_concurrency = 4",
                    ),
                )
            }
        };
        let body = format!("{}{tasks}{upstream}", jwt_auth());
        if !matches!(up, Up::DemoOverTls) {
            let gw = Gateway::start(&body).await;
            gw.wait_ready().await;
            let url = gw.url("/mcp");
            return Self {
                _everything: everything,
                gw,
                url,
                tls: None,
            };
        }
        let dir = tempfile::tempdir().unwrap();
        let ca = common::tls::TestCa::new(dir.path(), "front");
        let cert = ca.server("gw");
        let keys = format!(
            "tls_cert = {}\ntls_key = {}\n",
            toml_string(&cert.cert.display().to_string()),
            toml_string(&cert.key.display().to_string())
        );
        let gw = Gateway::start_with_server(&keys, &body).await;
        let base = format!("https://localhost:{}", gw.addr.port());
        let ready = eventually_async(Duration::from_secs(30), || async {
            let config = common::tls::client_config(&ca.ca_file, None, &[]);
            common::tls::request(
                config,
                &format!("{base}/readyz"),
                "GET",
                &[],
                Default::default(),
            )
            .await
            .is_ok_and(|(r, _)| r.status == 200)
        })
        .await;
        assert!(ready, "gateway not ready over TLS:\n{}", gw.proc.log_text());
        Self {
            _everything: everything,
            gw,
            url: format!("{base}/mcp"),
            tls: Some((ca.ca_file.clone(), dir)),
        }
    }

    fn logs(&self) -> String {
        let mut s = format!("--- gateway log ---\n{}", self.gw.proc.log_text());
        if let Some(e) = &self._everything {
            s.push_str(&format!(
                "\n--- server-everything log ---\n{}",
                e.log_text()
            ));
        }
        s
    }

    /// server-everything registers client-conditional tools (elicitation) only after
    /// the gateway's session declared the capability, announcing them with
    /// `notifications/tools/list_changed`; wait until `name` is listed.
    async fn wait_tool(&self, name: &str) {
        let c = Client2026::new(&self.gw, "/mcp", Some(token("ts-user", "acme")));
        let start = Instant::now();
        loop {
            let r = c.request("tools/list", json!({})).await;
            let listed = r.json()["result"]["tools"]
                .as_array()
                .is_some_and(|a| a.iter().any(|t| t["name"] == name));
            if listed {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "tool {name} never listed\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Run one driver scenario; returns its facts (asserting the driver itself ran).
    async fn run(&self, scenario: &str, f: &Flow) -> Facts {
        let spec = json!({"tool": f.tool, "args": f.args, "answer": f.answer}).to_string();
        let args = [
            repo_root()
                .join("tests/peers/ts_client.mjs")
                .into_os_string(),
            node_modules().into_os_string(),
            self.url.clone().into(),
            token("ts-user", "acme").into(),
            scenario.into(),
            spec.into(),
        ];
        let extra_ca = self.tls.as_ref().map(|(ca, _)| ca.clone());
        let out = tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(node());
            if let Some(ca) = extra_ca {
                // Node's own trust store plus the test CA, as an operator would set it.
                cmd.env("NODE_EXTRA_CA_CERTS", ca);
            }
            cmd.args(args).output().expect("run the TypeScript driver")
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
            .unwrap_or_else(|| panic!("{scenario}: no JSON report\n{context}"));
        assert_eq!(
            v["ok"],
            true,
            "{scenario}: {}\n{}\n{context}",
            v["error"],
            v["trace"].as_str().unwrap_or("")
        );
        assert_eq!(v["era"], "modern", "{scenario}: {v}");
        Facts { v, context }
    }
}

/// A driver report plus everything worth printing when an assertion fails.
struct Facts {
    v: Value,
    context: String,
}

impl Facts {
    fn get(&self, k: &str) -> &Value {
        &self.v[k]
    }

    fn check(&self, cond: bool, what: &str) {
        assert!(cond, "{what}: {}\n{}", self.v, self.context);
    }

    /// The SDK settled the call as `completed` (a schema rejection would show up as
    /// `failed` with the codec's error).
    fn completed(&self) {
        self.check(
            self.get("outcome") == "completed",
            &format!("outcome is not completed ({})", self.get("outcome_error")),
        );
    }

    /// `tasks/*` and `tools/call` exchanges the driver sent through `rawDispatch`.
    fn wire(&self, method: &str) -> Vec<&Value> {
        self.get("wire")
            .as_array()
            .map(|a| a.iter().filter(|w| w["method"] == method).collect())
            .unwrap_or_default()
    }

    fn statuses(&self) -> Vec<&str> {
        self.get("statuses")
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    fn is_task(&self) {
        self.check(
            self.get("kind") == "task",
            "expected a task-backed execution",
        );
        self.check(
            self.get("task_id")
                .as_str()
                .is_some_and(|t| t.starts_with("tsk_")),
            "task id",
        );
        let created = self.wire("tools/call");
        self.check(
            created.len() == 1 && created[0]["resultType"] == "task",
            "one tools/call answered with a CreateTaskResult",
        );
    }

    fn first_text(&self) -> &str {
        self.get("texts")[0].as_str().unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------
// The four flows, in front of either upstream.

async fn fast_call_answered_inline(up: Up) {
    let s = Setup::start(up).await;
    let (f, text) = up.fast();
    let r = s.run("fast", &f).await;
    r.check(
        r.get("tools")
            .as_array()
            .is_some_and(|t| t.iter().any(|n| n == f.tool)),
        "the SDK's tools/list lists the tool",
    );
    r.check(r.get("plain_texts")[0] == text, "the SDK's own callTool");
    r.check(r.get("kind") == "immediate", "a fast call is not a task");
    r.completed();
    r.check(r.first_text() == text, "result content");
    r.check(r.get("result")["resultType"] == "complete", "resultType");
    let calls = r.wire("tools/call");
    r.check(
        calls.len() == 1 && calls[0]["resultType"] == "complete",
        "answered inline",
    );
    r.check(
        r.wire("tasks/get").is_empty(),
        "no polling for an inline result",
    );
}

async fn slow_call_polled_to_completed_result(up: Up) {
    let s = Setup::start(up).await;
    let (f, text) = up.slow();
    let r = s.run("task", &f).await;
    r.is_task();
    r.completed();
    r.check(r.first_text() == text, "result content");
    r.check(
        r.get("terminal_task_status") == "completed",
        "terminal snapshot",
    );
    let st = r.statuses();
    r.check(
        st.first() == Some(&"working") && st.last() == Some(&"completed"),
        "statuses observed",
    );
    // On the wire: the completed snapshot's nested result is a 2026 result with the
    // upstream's identity, the same identity the tasks/get result itself carries.
    let gets = r.wire("tasks/get");
    let done = gets
        .iter()
        .find(|w| w["status"] == "completed")
        .copied()
        .unwrap_or(&Value::Null);
    r.check(done["resultType"] == "complete", "tasks/get resultType");
    r.check(
        done["result"]["resultType"] == "complete",
        "nested result resultType",
    );
    let nested = &done["result"]["_meta"][SERVER_INFO];
    r.check(
        nested["name"].is_string() && *nested == done["server_info"],
        "nested result serverInfo",
    );
    if let Some(name) = up.server_name() {
        r.check(nested["name"] == name, "serverInfo names the upstream");
    }
}

async fn input_answered_via_tasks_update(up: Up) {
    let s = Setup::start(up).await;
    let (f, question, answered) = up.elicit();
    if let Up::Everything = up {
        s.wait_tool(f.tool).await;
    }
    let r = s.run("input", &f).await;
    r.is_task();
    let asked = r.get("asked").as_array().cloned().unwrap_or_default();
    r.check(asked.len() == 1, "one question reached the handler");
    r.check(
        asked[0]["kind"] == "elicitation"
            && asked[0]["message"] == question
            && asked[0]["scope"] == "task"
            && asked[0]["delivery"] == "task-update",
        "the question as the SDK's handler saw it",
    );
    r.check(
        r.statuses().contains(&"input_required"),
        "input_required observed",
    );
    let updates = r.wire("tasks/update");
    r.check(
        updates.len() == 1 && updates[0]["resultType"] == "complete",
        "answered with one tasks/update",
    );
    r.completed();
    r.check(
        r.get("texts").as_array().is_some_and(|t| {
            t.iter()
                .filter_map(Value::as_str)
                .any(|t| t.contains(answered))
        }),
        "the answer reached the upstream",
    );
}

async fn cancel_task(up: Up) {
    let s = Setup::start(up).await;
    let r = s.run("cancel", &up.long()).await;
    r.is_task();
    r.check(r.get("outcome") == "cancelled", "the SDK's outcome");
    let cancels = r.wire("tasks/cancel");
    r.check(
        cancels.len() == 1 && cancels[0]["resultType"] == "complete",
        "one acknowledged tasks/cancel",
    );
    r.check(
        r.get("server_status") == "cancelled",
        "the gateway reports the task cancelled",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_demo_fast_call_answered_inline() {
    fast_call_answered_inline(Up::Demo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_demo_slow_call_polled_to_completed_result() {
    slow_call_polled_to_completed_result(Up::Demo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_demo_input_answered_via_tasks_update() {
    input_answered_via_tasks_update(Up::Demo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_demo_cancel_task() {
    cancel_task(Up::Demo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_over_tls_fast_call_answered_inline() {
    fast_call_answered_inline(Up::DemoOverTls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_over_tls_slow_call_polled_to_completed_result() {
    slow_call_polled_to_completed_result(Up::DemoOverTls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_everything_fast_call_answered_inline() {
    fast_call_answered_inline(Up::Everything).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_everything_slow_call_polled_to_completed_result() {
    slow_call_polled_to_completed_result(Up::Everything).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_everything_input_answered_via_tasks_update() {
    input_answered_via_tasks_update(Up::Everything).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_everything_cancel_task() {
    cancel_task(Up::Everything).await;
}

/// server-everything's `simulate-research-query` is the upstream's own 2025-11-25 task,
/// which the gateway follows (docs/design.md §25): through ext-tasks, the stages as
/// status, the question answered by the application's handler via `tasks/update`, the
/// report as the completed result, and a cancel that reaches the upstream task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_everything_research_task_is_followed() {
    let s = Setup::start(Up::Everything).await;
    s.wait_tool("simulate-research-query").await;
    let f = Flow {
        tool: "simulate-research-query",
        args: json!({"topic": "python", "ambiguous": true}),
        answer: json!({"interpretation": "snake"}),
    };
    let r = s.run("input", &f).await;
    r.is_task();
    let asked = r.get("asked").as_array().cloned().unwrap_or_default();
    r.check(
        asked.len() == 1
            && asked[0]["kind"] == "elicitation"
            && asked[0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("python")),
        "the upstream's question reached the handler",
    );
    r.check(
        r.statuses().contains(&"input_required"),
        "input_required observed",
    );
    r.completed();
    r.check(
        r.first_text().contains("Research Report") && r.first_text().contains("snake"),
        "the report, with the answer",
    );

    let r = s
        .run(
            "cancel",
            &flow("simulate-research-query", json!({"topic": "go"})),
        )
        .await;
    r.is_task();
    r.check(
        r.get("server_status") == "cancelled",
        "the task is cancelled",
    );
    r.check(
        s.gw.proc
            .wait_log("upstream task cancelled", Duration::from_secs(20))
            .await
            .is_some(),
        "the cancel reached the upstream task",
    );
}
