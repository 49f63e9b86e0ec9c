//! Real 2025-era clients through the gateway (docs/design.md §22 "Clients of the 2025
//! era"): the TypeScript SDK 1.x (`@modelcontextprotocol/sdk` 1.32.2, `Client` +
//! `StreamableHTTPClientTransport`), `mcp-remote` 0.15.1 driven over stdio by the same
//! SDK, and the Python `mcp` 1.30 client (`streamablehttp_client` + `ClientSession`),
//! all installed by `scripts/install-peers.sh`. Each runs every flow on one session —
//! initialize, the lists, a fast and a slow call with progress, elicitation and
//! sampling answered by the client, a cancel, list-changed on the GET stream, a
//! resource subscription's update, DELETE — against the bundled demo server (stdio)
//! and server-everything (Streamable HTTP and stdio). Drivers:
//! `tests/peers/ts_legacy_client.mjs`, `tests/peers/mcp130_legacy_client.py`.

mod common;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use common::*;

fn require_peers() {
    for p in [
        node(),
        node_modules().join("@modelcontextprotocol/sdk/package.json"),
        node_modules().join("mcp-remote/dist/proxy.js"),
        everything_js(),
        peers().join("venv-mcp130/bin/python"),
    ] {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
            p.display()
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Up {
    DemoStdio,
    EverythingHttp,
    EverythingStdio,
}

#[derive(Clone, Copy, Debug)]
enum Driver {
    Ts,
    Remote,
    Py,
}

impl Up {
    /// What each flow calls on this upstream (the drivers' SPEC_JSON).
    fn spec(self) -> Value {
        match self {
            Up::DemoStdio => json!({
                "fast": {"tool": "echo", "args": {"text": "hi legacy"}},
                "slow": {"tool": "sleep", "args": {"ms": 1500, "steps": 3}},
                "elicit": {"tool": "elicit", "args": {"message": "Favourite colour?"},
                    "answer": {"answer": "octarine"}},
                "sample": {"tool": "sample", "args": {}},
                "cancel": {"tool": "sleep", "args": {"ms": 30000}},
                "touch": {"tool": "touch_tools", "args": {}},
                "subscribe": {"uri": "demo://counter", "tool": "counter", "args": {}},
            }),
            Up::EverythingHttp | Up::EverythingStdio => json!({
                "fast": {"tool": "echo", "args": {"message": "hi legacy"}},
                "slow": {"tool": "trigger-long-running-operation", "args": {"duration": 2, "steps": 2}},
                "elicit": {"tool": "trigger-elicitation-request", "args": {},
                    "answer": {"name": "Ada Lovelace", "check": true}},
                "sample": {"tool": "trigger-sampling-request", "args": {"prompt": "hi", "maxTokens": 10}},
                "cancel": {"tool": "trigger-long-running-operation", "args": {"duration": 30, "steps": 30}},
                "touch": null,
                "subscribe": {"uri": null, "tool": "toggle-subscriber-updates", "args": {}},
            }),
        }
    }

    fn fast_text(self) -> &'static str {
        match self {
            Up::DemoStdio => "hi legacy",
            _ => "Echo: hi legacy",
        }
    }
}

struct Setup {
    _everything: Option<Proc>,
    gw: Gateway,
    url: String,
}

impl Setup {
    async fn start(up: Up) -> Self {
        require_peers();
        let (everything, upstream) = match up {
            Up::DemoStdio => (None, demo_stdio_upstream("")),
            Up::EverythingHttp => {
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
            Up::EverythingStdio => (
                None,
                format!(
                    "[[upstream]]\nname = \"everything\"\npath = \"/mcp\"\ncommand = [\"{}\", \"{}\", \"stdio\"]\nmax_concurrency = 4\n",
                    node().display(),
                    everything_js().display()
                ),
            ),
        };
        let gw = Gateway::start(&format!("{}{upstream}", jwt_auth())).await;
        gw.wait_ready().await;
        if up != Up::DemoStdio {
            // server-everything registers its elicitation tool once the gateway's
            // upstream session declared the capability.
            let c = Client2026::new(&gw, "/mcp", Some(token("w", "acme")));
            let listed = eventually_async(Duration::from_secs(30), || async {
                c.request("tools/list", json!({})).await.json()["result"]["tools"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|t| t["name"] == "trigger-elicitation-request"))
            })
            .await;
            assert!(
                listed,
                "elicitation tool never listed\n{}",
                gw.proc.log_text()
            );
        }
        let url = gw.url("/mcp");
        Self {
            _everything: everything,
            gw,
            url,
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

    async fn run(
        &self,
        driver: Driver,
        scenario: &str,
        spec: &Value,
        token2: Option<String>,
    ) -> Value {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        let program = match driver {
            Driver::Ts | Driver::Remote => {
                args.push(repo_root().join("tests/peers/ts_legacy_client.mjs").into());
                args.push(node_modules().into());
                node()
            }
            Driver::Py => {
                args.push(
                    repo_root()
                        .join("tests/peers/mcp130_legacy_client.py")
                        .into(),
                );
                peers().join("venv-mcp130/bin/python")
            }
        };
        args.push(self.url.clone().into());
        args.push(token("legacy-user", "acme").into());
        args.push(scenario.into());
        args.push(spec.to_string().into());
        if let Some(t) = token2 {
            args.push(t.into());
        }
        let config_dir = tempfile::tempdir().unwrap();
        let dir = config_dir.path().to_path_buf();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(program)
                .args(args)
                .env("MCP_REMOTE_CONFIG_DIR", dir)
                .output()
                .expect("run the driver")
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let v: Value = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("{driver:?} {scenario}: no JSON report\nstdout:\n{stdout}\nstderr:\n{stderr}\n{}", self.logs()));
        assert_eq!(
            v["ok"],
            true,
            "{driver:?} {scenario}: {}\nstderr:\n{stderr}\n{}",
            v["error"].as_str().unwrap_or(""),
            self.logs()
        );
        v
    }
}

/// Every flow on one session, and what each must have produced.
async fn all_flows(up: Up, driver: Driver) {
    let s = Setup::start(up).await;
    let spec = up.spec();
    let scenario = if matches!(driver, Driver::Remote) {
        "remote"
    } else {
        "all"
    };
    let v = s.run(driver, scenario, &spec, None).await;
    let ctx = || format!("{driver:?} on {up:?}: {v}");
    // The legacy era: the gateway's own initialize, never the 2026 extension nor the
    // upstream's own tasks; these clients negotiate 2025-11-25, so the gateway's
    // 2025-11-25 task capability (docs/design.md §25).
    let caps = &v["capabilities"];
    assert!(
        caps.get("extensions").is_none()
            && caps["tasks"]
                == json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{}",
        ctx()
    );
    if up == Up::DemoStdio {
        assert_eq!(v["serverInfo"]["name"], "taskgate-demo", "{}", ctx());
    }
    assert!(
        v["tools"].as_array().is_some_and(|t| !t.is_empty()),
        "{}",
        ctx()
    );
    assert_eq!(v["fast"], up.fast_text(), "{}", ctx());
    assert!(
        v["slow"].as_str().is_some_and(|t| !t.is_empty()),
        "{}",
        ctx()
    );
    assert!(
        v["progress"].as_u64().is_some_and(|n| n >= 1),
        "progress relayed: {}",
        ctx()
    );
    assert_eq!(v["elicited"], 1, "{}", ctx());
    let elicit = v["elicit"].as_str().unwrap_or_default();
    assert!(
        elicit.contains("octarine") || elicit.contains("User provided"),
        "{}",
        ctx()
    );
    assert_eq!(v["sampled"], 1, "{}", ctx());
    assert!(
        v["sample"]
            .as_str()
            .is_some_and(|t| t.contains("sampled by")),
        "{}",
        ctx()
    );
    assert_eq!(v["cancel"], "aborted", "{}", ctx());
    assert!(
        v["cancelMs"].as_u64().is_some_and(|ms| ms < 10_000),
        "{}",
        ctx()
    );
    assert_eq!(v["afterCancel"], up.fast_text(), "{}", ctx());
    if up == Up::DemoStdio {
        assert!(
            v["listChanged"].as_u64().is_some_and(|n| n >= 1),
            "{}",
            ctx()
        );
    }
    // The subscribed resource's update reached the client on its GET stream.
    assert!(v["subscribed"].is_string(), "{}", ctx());
    assert_eq!(v["updates"], json!([v["subscribed"]]), "{}", ctx());
    if !matches!(driver, Driver::Remote) {
        // DELETE ended the session: its id is now unknown.
        assert_eq!(v["afterDelete"], 404, "{}", ctx());
        let sid = v["sessionId"].as_str().unwrap_or_default();
        assert!(sid.len() >= 32, "{}", ctx());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_on_demo_stdio() {
    all_flows(Up::DemoStdio, Driver::Ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_on_demo_stdio() {
    all_flows(Up::DemoStdio, Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_on_demo_stdio() {
    all_flows(Up::DemoStdio, Driver::Remote).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_on_everything_http() {
    all_flows(Up::EverythingHttp, Driver::Ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_on_everything_http() {
    all_flows(Up::EverythingHttp, Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_on_everything_http() {
    all_flows(Up::EverythingHttp, Driver::Remote).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_on_everything_stdio() {
    all_flows(Up::EverythingStdio, Driver::Ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_on_everything_stdio() {
    all_flows(Up::EverythingStdio, Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_on_everything_stdio() {
    all_flows(Up::EverythingStdio, Driver::Remote).await;
}

/// A session id replayed with another principal's token is answered 404, exactly as an
/// unknown session; the owner's requests still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_session_is_404_for_another_principal() {
    let s = Setup::start(Up::DemoStdio).await;
    let spec = Up::DemoStdio.spec();
    for driver in [Driver::Ts, Driver::Py] {
        let v = s
            .run(driver, "foreign", &spec, Some(token("mallory", "acme")))
            .await;
        assert_eq!(v["foreign"], 404, "{driver:?}: {v}");
        assert_eq!(v["owner"], 200, "{driver:?}: {v}");
    }
}

/// Both eras on one upstream at once: the 2026 client's call becomes a task and
/// completes while a legacy session runs every flow; neither sees the other's
/// messages, and the task is another tenant's `not found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_eras_at_once() {
    let s = Setup::start(Up::DemoStdio).await;
    let spec = Up::DemoStdio.spec();
    let modern = Client2026::new(&s.gw, "/mcp", Some(token("modern", "acme")))
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
    let call = modern.request(
        "tools/call",
        json!({"name": "sleep", "arguments": {"ms": 12000}}),
    );
    let (legacy, created) = tokio::join!(s.run(Driver::Ts, "all", &spec, None), call);
    assert_eq!(legacy["fast"], "hi legacy", "{legacy}");
    let task = created.json();
    let id = task["result"]["task"]["taskId"]
        .as_str()
        .or_else(|| task["result"]["taskId"].as_str())
        .map(str::to_string);
    if let Some(id) = id {
        let done = eventually_async(Duration::from_secs(30), || {
            let modern = &modern;
            let id = id.clone();
            async move {
                let r = modern.request("tasks/get", json!({"taskId": id})).await;
                r.json()["result"]["status"] == "completed"
            }
        })
        .await;
        assert!(done, "the 2026 task completes beside the legacy session");
        let stranger = Client2026::new(&s.gw, "/mcp", Some(token("modern", "other")))
            .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
        let r = stranger.request("tasks/get", json!({"taskId": id})).await;
        assert!(
            r.json()["error"].is_object(),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    } else {
        // Answered inline (the call beat its promotion deadline).
        assert_eq!(first_text(&task["result"]), "slept 12000 ms", "{task}");
    }
}
