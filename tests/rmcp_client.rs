//! A real third-party 2026-07-28 + Tasks client end to end: the Rust MCP SDK `rmcp`
//! 3.11 (dev-dependency; `server/discover` lifecycle, Streamable HTTP via reqwest,
//! bearer token through `auth_header`) against the gateway fronting the bundled demo
//! legacy upstream over stdio. rmcp parses every result into its typed model, so these
//! tests also prove the gateway's wire shapes are what a real SDK accepts.

mod common;

use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, CreateTaskResult, GetTaskParams, Implementation, InputResponses, ProtocolVersion,
    TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use common::*;

/// Gateway in front of the demo stdio upstream, JWT auth, tasks after 200 ms.
async fn gateway() -> Gateway {
    let body = format!(
        "{}[tasks]\npromote_after_ms = 200\npoll_interval_ms = 100\n{}",
        jwt_auth(),
        demo_stdio_upstream("")
    );
    let gw = Gateway::start(&body).await;
    gw.wait_ready().await;
    gw
}

/// An rmcp client in `Discover` lifecycle mode (2026-07-28), declaring the tasks
/// extension (and, with `elicitation`, the elicitation capability).
async fn client(gw: &Gateway, elicitation: bool) -> RunningService<RoleClient, ClientConfig> {
    // The typed builder (`ClientCapabilities::builder().enable_tasks()`) is only
    // compiled with rmcp's `server`/`macros` features; the wire form is the same.
    let mut caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    if elicitation {
        caps["elicitation"] = json!({});
    }
    let caps: ClientCapabilities = serde_json::from_value(caps).unwrap();
    assert!(caps.supports_tasks());
    let info = ClientConfig::new(caps, Implementation::new("taskgate-rmcp-test", "0.1.0"));
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(gw.url("/mcp"))
            .auth_header(token("rmcp-user", "acme")),
    );
    info.serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap_or_else(|e| panic!("rmcp discover failed: {e:?}\n{}", gw.proc.log_text()))
}

fn args(v: Value) -> rmcp::model::JsonObject {
    serde_json::from_value(v).unwrap()
}

/// Call `tool` and expect a task handle (the call was promoted).
async fn start_task(
    c: &RunningService<RoleClient, ClientConfig>,
    gw: &Gateway,
    tool: &'static str,
    arguments: Value,
) -> CreateTaskResult {
    let r = c
        .call_tool_once(CallToolRequestParams::new(tool).with_arguments(args(arguments)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e:?}\n{}", gw.proc.log_text()));
    match r {
        CallToolResponse::Task(t) => t,
        other => panic!("expected a task, got {other:?}"),
    }
}

/// `tasks/get` through rmcp until the status is `until` or terminal.
async fn poll(
    c: &RunningService<RoleClient, ClientConfig>,
    id: &str,
    until: TaskStatus,
    gw: &Gateway,
) -> rmcp::model::DetailedTask {
    let start = Instant::now();
    let mut wait = 100;
    loop {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        match c.peer().get_task(GetTaskParams::new(id)).await {
            Ok(r) => {
                let t = r.task;
                if t.status() == until || t.status().is_terminal() {
                    return t;
                }
                wait = t.task.poll_interval_ms.unwrap_or(200).clamp(50, 2000) + 20;
            }
            // A poll faster than the advertised interval is answered 429 / -32005.
            Err(e) if format!("{e:?}").contains("32005") => wait = 500,
            Err(e) => panic!("tasks/get {id}: {e:?}\n{}", gw.proc.log_text()),
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "task {id} never reached {until:?}\n{}",
            gw.proc.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_discover_list_and_inline_call() {
    let gw = gateway().await;
    let c = client(&gw, false).await;
    let tools = c.list_tools(None).await.expect("tools/list");
    let names: Vec<String> = tools.tools.iter().map(|t| t.name.to_string()).collect();
    for n in ["echo", "sleep", "elicit"] {
        assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
    }
    // A fast call stays inline even for a tasks client.
    let r = c
        .call_tool_once(
            CallToolRequestParams::new("echo").with_arguments(args(json!({"text": "hi rmcp"}))),
        )
        .await
        .expect("echo");
    match r {
        CallToolResponse::Complete(res) => {
            assert_eq!(res.content[0].as_text().unwrap().text, "hi rmcp")
        }
        other => panic!("expected inline result, got {other:?}"),
    }
    c.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_task_create_poll_result() {
    let gw = gateway().await;
    let c = client(&gw, false).await;
    let created = start_task(&c, &gw, "sleep", json!({"ms": 1500})).await;
    let id = created.task.task_id.clone();
    assert!(id.starts_with("tsk_"), "{id}");
    assert!(
        matches!(created.task.status, TaskStatus::Working),
        "{:?}",
        created.task.status
    );
    assert!(created.task.poll_interval_ms.is_some());

    let t = poll(&c, &id, TaskStatus::Completed, &gw).await;
    let TaskPayload::Completed { result } = t.payload else {
        panic!("expected completed, got {:?}", t.payload)
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result.clone()))
        .unwrap_or_else(|e| panic!("result not a CallToolResult ({e}): {result:?}"));
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert!(!result.content.is_empty(), "{result:?}");
    c.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_task_input_required_update_completes() {
    let gw = gateway().await;
    let c = client(&gw, true).await;
    let created = start_task(&c, &gw, "elicit", json!({"message": "Favourite colour?"})).await;
    let id = created.task.task_id.clone();

    let t = poll(&c, &id, TaskStatus::InputRequired, &gw).await;
    let TaskPayload::InputRequired { input_requests } = t.payload else {
        panic!("expected input_required, got {:?}", t.payload)
    };
    assert_eq!(input_requests.len(), 1, "{input_requests:?}");
    let (key, req) = input_requests.iter().next().unwrap();
    let req = serde_json::to_value(req).unwrap();
    assert_eq!(req["method"], "elicitation/create", "{req}");
    assert_eq!(req["params"]["message"], "Favourite colour?", "{req}");

    let mut answers = InputResponses::new();
    answers.insert(
        key.clone(),
        json!({"action": "accept", "content": {"answer": "octarine"}}),
    );
    c.peer()
        .update_task(UpdateTaskParams::new(id.clone(), answers))
        .await
        .unwrap_or_else(|e| panic!("tasks/update: {e:?}\n{}", gw.proc.log_text()));

    let t = poll(&c, &id, TaskStatus::Completed, &gw).await;
    let TaskPayload::Completed { result } = t.payload else {
        panic!("expected completed, got {:?}", t.payload)
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
    let text = &result.content[0].as_text().unwrap().text;
    assert!(
        text.contains("accept") && text.contains("octarine"),
        "{text}"
    );
    c.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_task_cancel() {
    let gw = gateway().await;
    let c = client(&gw, false).await;
    let created = start_task(&c, &gw, "sleep", json!({"ms": 20000})).await;
    let id = created.task.task_id.clone();
    c.peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap_or_else(|e| panic!("tasks/cancel: {e:?}\n{}", gw.proc.log_text()));
    let t = poll(&c, &id, TaskStatus::Cancelled, &gw).await;
    assert_eq!(t.status(), TaskStatus::Cancelled, "{t:?}");
    // Cancelling a terminal task acks again and changes nothing.
    c.peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("second cancel acks");
    let again = c.peer().get_task(GetTaskParams::new(id.clone())).await;
    if let Ok(again) = again {
        assert_eq!(again.task.status(), TaskStatus::Cancelled);
    }
    c.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_foreign_task_is_not_found() {
    let gw = gateway().await;
    let owner = client(&gw, false).await;
    let r = owner
        .call_tool_once(
            CallToolRequestParams::new("sleep").with_arguments(args(json!({"ms": 3000}))),
        )
        .await
        .expect("sleep");
    let CallToolResponse::Task(created) = r else {
        panic!("expected a task")
    };
    // Another principal (different token) sees "not found" for the same id.
    let caps: ClientCapabilities =
        serde_json::from_value(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
            .unwrap();
    let other = ClientConfig::new(caps, Implementation::new("intruder", "0"))
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(gw.url("/mcp"))
                    .auth_header(token("mallory", "acme")),
            ),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("second client");
    let e = other
        .peer()
        .get_task(GetTaskParams::new(created.task.task_id.clone()))
        .await
        .expect_err("foreign task must not be visible");
    assert!(format!("{e:?}").contains("32602"), "{e:?}");
    owner.cancel().await.ok();
    other.cancel().await.ok();
}

/// Poll through rmcp until the upstream reports a stage of its own.
async fn under_way(c: &RunningService<RoleClient, ClientConfig>, id: &str, gw: &Gateway) {
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Ok(r) = c.peer().get_task(GetTaskParams::new(id)).await {
            let m = r.task.task.status_message.clone().unwrap_or_default();
            if m.ends_with("...") {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            gw.proc.log_text()
        );
    }
}

fn report(t: rmcp::model::DetailedTask) -> String {
    let TaskPayload::Completed { result } = t.payload else {
        panic!("expected completed, got {:?}", t.payload)
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
    result.content[0].as_text().unwrap().text.clone()
}

/// rmcp against server-everything's research task through the gateway: input, result,
/// cancel, and a gateway SIGKILL mid-task that the restarted gateway re-attaches to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_follows_server_everything_research_through_a_restart() {
    let (_everything, port) = start_everything_http().await;
    let gw = everything_gateway(port, "poll_interval_ms = 100\n").await;
    let c = client(&gw, true).await;

    // Input: the ambiguous query asks which Python is meant.
    let created = start_task(
        &c,
        &gw,
        "simulate-research-query",
        json!({"topic": "python", "ambiguous": true}),
    )
    .await;
    assert_eq!(created.task.ttl_ms, Some(300000), "{created:?}");
    let id = created.task.task_id.clone();
    let t = poll(&c, &id, TaskStatus::InputRequired, &gw).await;
    let TaskPayload::InputRequired { input_requests } = t.payload else {
        panic!("expected input_required, got {:?}", t.payload)
    };
    let key = input_requests.keys().next().cloned().expect("a request");
    let mut answers = InputResponses::new();
    answers.insert(
        key,
        json!({"action": "accept", "content": {"interpretation": "snake"}}),
    );
    c.peer()
        .update_task(UpdateTaskParams::new(id.clone(), answers))
        .await
        .unwrap_or_else(|e| panic!("tasks/update: {e:?}\n{}", gw.proc.log_text()));
    let text = report(poll(&c, &id, TaskStatus::Completed, &gw).await);
    assert!(
        text.contains("Research Report") && text.contains("snake"),
        "{text}"
    );

    // Cancel reaches the upstream task.
    let created = start_task(&c, &gw, "simulate-research-query", json!({"topic": "go"})).await;
    let id = created.task.task_id.clone();
    under_way(&c, &id, &gw).await;
    c.peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap_or_else(|e| panic!("tasks/cancel: {e:?}\n{}", gw.proc.log_text()));
    let t = poll(&c, &id, TaskStatus::Cancelled, &gw).await;
    assert_eq!(t.status(), TaskStatus::Cancelled);
    assert!(
        gw.proc
            .wait_log("upstream task cancelled", Duration::from_secs(20))
            .await
            .is_some(),
        "{}",
        gw.proc.log_text()
    );

    // SIGKILL mid-task: the restarted gateway re-attaches and the task completes.
    let created = start_task(&c, &gw, "simulate-research-query", json!({"topic": "rust"})).await;
    let id = created.task.task_id.clone();
    under_way(&c, &id, &gw).await;
    c.cancel().await.ok();
    let gw = gw.kill9_and_relaunch().await;
    let c = client(&gw, true).await;
    let text = report(poll(&c, &id, TaskStatus::Completed, &gw).await);
    assert!(
        text.contains("Research Report") && text.contains("rust"),
        "{text}"
    );
    c.cancel().await.ok();
}
