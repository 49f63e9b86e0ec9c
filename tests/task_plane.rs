//! The task plane never depends on the upstream plane (README "Task plane and upstream
//! plane"): `tasks/get|update|cancel` and `subscriptions/listen` answer from the store
//! whether the upstream is down, restarting or still warming up, with the upstream's
//! identity as last stored (or `{name, version: "unknown"}` if it never
//! answered); only methods that need the upstream get the retry-safety 503. Each test
//! restarts the real binary on the same store directory.

mod common;
mod tasks_support;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tasks_support::*;

const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// What the demo upstream says about itself in `initialize`.
fn demo_server_info() -> Value {
    json!({"name": "taskgate-demo", "version": "0.1.0"})
}

fn server_info_of(result: &Value) -> Value {
    result["_meta"][SERVER_INFO].clone()
}

fn body_text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// `[[upstream]] demo` that is down for good: an HTTP URL on a dead port.
fn dead_http_upstream() -> String {
    http_upstream("demo", "/mcp", "http://127.0.0.1:1/mcp", "")
}

/// `[[upstream]] demo` that is down for good: a stdio command that exits at once.
fn exiting_stdio_upstream() -> String {
    "[[upstream]]\nname = \"demo\"\npath = \"/mcp\"\ncommand = [\"false\"]\n".to_string()
}

fn body_with(upstream: &str) -> String {
    format!("{}{}{upstream}", jwt_auth(), tasks_section(""))
}

/// SIGTERM the gateway, wait for it to exit (its store is flushed and unlocked), and
/// hand back its directory so the next gateway can open the same store.
async fn stop(gw: Gateway) -> tempfile::TempDir {
    let Gateway { mut proc, dir, .. } = gw;
    proc.sigterm();
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = proc.child.try_wait() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gateway did not stop:\n{}",
            proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    dir
}

async fn readyz(gw: &Gateway) -> Resp {
    raw(&gw.url("/readyz"), "GET", &[], bytes::Bytes::new())
        .await
        .unwrap()
}

/// Terminal tasks left by a first run against a healthy stdio demo upstream.
struct Stored {
    completed: String,
    completed_snapshot: Value,
    cancelled: String,
}

async fn first_run_with_terminal_tasks() -> (tempfile::TempDir, Stored) {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");

    let completed = task_id(&create_task(&c, "sleep", json!({"ms": 50})).await);
    let completed_snapshot = poll_terminal(&c, &completed).await;
    assert_eq!(
        completed_snapshot["status"], "completed",
        "{completed_snapshot}"
    );
    assert_eq!(server_info_of(&completed_snapshot), demo_server_info());

    let cancelled = task_id(&create_task(&c, "sleep", json!({"ms": 60000})).await);
    let ack = ok_result(&tasks_cancel(&c, &cancelled).await);
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let done = poll_terminal(&c, &cancelled).await;
    assert_eq!(done["status"], "cancelled", "{done}");

    let stored = Stored {
        completed,
        completed_snapshot,
        cancelled,
    };
    (stop(gw).await, stored)
}

/// Every task method answers from the store, without 503, while the upstream of the
/// restarted gateway is down; methods that need the upstream still get the 503.
async fn task_plane_answers_while_down(gw: &Gateway, s: &Stored) {
    let c = tasks_client(gw, "alice", "acme");

    // The upstream really is down.
    let r = readyz(gw).await;
    assert_eq!(r.status, 503, "{}", body_text(&r));

    // The stored terminal snapshots, with the stored serverInfo.
    let got = ok_result(&tasks_get(&c, &s.completed).await);
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"], s.completed_snapshot["result"], "{got}");
    assert_eq!(first_text(&got["result"]), "slept 50 ms");
    assert_eq!(server_info_of(&got), demo_server_info(), "{got}");
    let got = ok_result(&tasks_get(&c, &s.cancelled).await);
    assert_eq!(got["status"], "cancelled", "{got}");
    assert_eq!(server_info_of(&got), demo_server_info(), "{got}");

    // Cancel and update of terminal tasks: acknowledged, nothing changes.
    for id in [&s.completed, &s.cancelled] {
        let ack = ok_result(&tasks_cancel(&c, id).await);
        assert_eq!(ack["resultType"], "complete", "{ack}");
        assert_eq!(server_info_of(&ack), demo_server_info(), "{ack}");
        let ack =
            ok_result(&tasks_update(&c, id, json!({"elicitation-1": {"action": "accept"}})).await);
        assert_eq!(ack["resultType"], "complete", "{ack}");
    }
    let still = ok_result(&tasks_get(&c, &s.completed).await);
    assert_eq!(still["status"], "completed", "{still}");
    assert_eq!(still["result"], s.completed_snapshot["result"], "{still}");

    // A never-issued id, and someone else's task: the ordinary not-found (200).
    let bob = tasks_client(gw, "bob", "other");
    for (who, id) in [(&c, never_issued_id()), (&bob, s.completed.clone())] {
        for r in [tasks_get(who, &id).await, tasks_cancel(who, &id).await] {
            assert_eq!(r.status, 200, "{}", body_text(&r));
            let v = msg(&r);
            assert_eq!(v["error"]["code"], -32602, "{v}");
            assert_eq!(v["error"]["message"], "task not found", "{v}");
        }
    }

    // A listen is acknowledged at once from the store: own tasks only, and the list
    // flag the stored capabilities allow (the demo declares tools).
    let mut l = SseStream::listen(
        &c,
        json!("l1"),
        json!({"taskIds": [s.completed, never_issued_id()], "toolsListChanged": true}),
    )
    .await;
    assert_eq!(l.status, 200);
    let ack = l
        .next(Duration::from_secs(10))
        .await
        .expect("listen acknowledgement");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    let n = &ack["params"]["notifications"];
    assert_eq!(n["taskIds"], json!([s.completed]), "{ack}");
    assert_eq!(n["toolsListChanged"], true, "{ack}");

    // Methods that need the upstream: never sent, so 503 + Retry-After.
    let plain = plain_client(gw, "alice", "acme", json!({}));
    for method in ["tools/list", "server/discover"] {
        let r = plain.request(method, json!({})).await;
        assert_eq!(r.status, 503, "{method}: {}", body_text(&r));
        assert!(
            r.header("retry-after").is_some(),
            "{method}: {:?}",
            r.headers
        );
        assert_eq!(msg(&r)["error"]["code"], -32603, "{method}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_results_readable_while_http_upstream_is_unreachable() {
    let (dir, stored) = first_run_with_terminal_tasks().await;
    let gw = Gateway::start_in(dir, &body_with(&dead_http_upstream())).await;
    task_plane_answers_while_down(&gw, &stored).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_results_readable_while_stdio_upstream_exits_at_once() {
    let (dir, stored) = first_run_with_terminal_tasks().await;
    let gw = Gateway::start_in(dir, &body_with(&exiting_stdio_upstream())).await;
    task_plane_answers_while_down(&gw, &stored).await;
}

/// A store written before upstream identities were kept (or by a gateway whose
/// upstream never answered), fronted by an upstream that is down: the task plane
/// names the upstream by its configured name, version "unknown", and acknowledges no
/// list-changed or resource flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stored_identity_means_unknown_version_and_no_flags() {
    use taskgate::store::{TaskRecord, TaskStatus, TaskStore};

    let dir = tempfile::tempdir().unwrap();
    let id = taskgate::tasks::ids::new_task_id();
    {
        let cfg = taskgate::config::StoreConfig {
            path: dir.path().join("data"),
            ..Default::default()
        };
        let store = taskgate::store::sled::SledStore::open(&cfg).unwrap();
        let rec = TaskRecord {
            status: TaskStatus::Completed,
            status_message: Some("completed".into()),
            poll_interval_ms: 50,
            result: Some(json!({"content": [{"type": "text", "text": "kept"}]})),
            ..fixtures::task(&id, "acme", "alice", 3_600_000)
        };
        let route = fixtures::route("rt_seed", &id, "acme", "alice");
        store.create(&rec, &route, None).await.unwrap();
        store.remove_route("rt_seed").await.unwrap();
        store.flush().await.unwrap();
        assert!(store.upstream_identity("demo").await.unwrap().is_none());
    }

    let gw = Gateway::start_in(dir, &body_with(&dead_http_upstream())).await;
    let c = tasks_client(&gw, "alice", "acme");
    let unknown = json!({"name": "demo", "version": "unknown"});
    let got = ok_result(&tasks_get(&c, &id).await);
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(first_text(&got["result"]), "kept", "{got}");
    assert_eq!(server_info_of(&got), unknown, "{got}");
    let ack = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(server_info_of(&ack), unknown, "{ack}");
    let v = msg(&tasks_get(&c, &never_issued_id()).await);
    assert_eq!(v["error"]["code"], -32602, "{v}");

    let mut l = SseStream::listen(
        &c,
        json!(7),
        json!({
            "taskIds": [id],
            "toolsListChanged": true,
            "promptsListChanged": true,
            "resourcesListChanged": true,
            "resourceSubscriptions": ["demo://readme"]
        }),
    )
    .await;
    assert_eq!(l.status, 200);
    let ack = l
        .next(Duration::from_secs(10))
        .await
        .expect("listen acknowledgement");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    let n = ack["params"]["notifications"].as_object().unwrap().clone();
    assert_eq!(n.get("taskIds"), Some(&json!([id])), "{ack}");
    for flag in [
        "toolsListChanged",
        "promptsListChanged",
        "resourcesListChanged",
    ] {
        assert!(n.get(flag).is_none(), "{flag} acknowledged: {ack}");
    }
    assert!(
        n.get("resourceSubscriptions")
            .is_none_or(|r| r.as_array().is_some_and(Vec::is_empty)),
        "{ack}"
    );
}

/// A restart in front of a healthy stdio upstream whose child takes seconds to be
/// ready: `tasks/get` answers from the store at once, with the stored serverInfo,
/// while `/readyz` still says the upstream is starting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_get_after_restart_does_not_wait_for_a_child() {
    let (dir, stored) = first_run_with_terminal_tasks().await;
    let script = format!("sleep 3; exec '{}' demo-upstream", bin().display());
    let slow = format!(
        "[[upstream]]\nname = \"demo\"\npath = \"/mcp\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n",
        toml_string(&script)
    );
    let gw = Gateway::start_in(dir, &body_with(&slow)).await;
    let c = tasks_client(&gw, "alice", "acme");

    let t0 = Instant::now();
    let got = ok_result(&tasks_get(&c, &stored.completed).await);
    let took = t0.elapsed();
    let ready = readyz(&gw).await;
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["result"], stored.completed_snapshot["result"], "{got}");
    assert_eq!(server_info_of(&got), demo_server_info(), "{got}");
    assert_eq!(
        ready.status,
        503,
        "tasks/get took {took:?} and answered only once the upstream was ready: {}",
        body_text(&ready)
    );
    assert_eq!(
        ready.json()["upstreams"]["demo"]["state"],
        "starting",
        "{}",
        body_text(&ready)
    );

    // Once the child is up, the same answer (now from the live identity).
    gw.wait_ready().await;
    let again = ok_result(&tasks_get(&c, &stored.completed).await);
    assert_eq!(again["result"], got["result"]);
    assert_eq!(server_info_of(&again), demo_server_info(), "{again}");
}

/// A working task is cancelled and its upstream goes down right after the ack (so the
/// `notifications/cancelled` may never arrive): the task still ends `cancelled`, in
/// this run and after a restart with the upstream still down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_working_task_ends_cancelled_when_upstream_goes_down() {
    let mut demo = DemoHttp::start().await;
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let body = http_body(&demo.url(), "", tools);
    let gw = start_ready(&body).await;
    let c = tasks_client(&gw, "alice", "acme");

    let id = task_id(&create_task(&c, "sleep", json!({"ms": 60000, "steps": 120})).await);
    // The call is running upstream: its progress has become the status message.
    poll_until(&c, &id, Duration::from_secs(20), |r| {
        r["status"] == "working" && r["statusMessage"] != "working"
    })
    .await;
    let ack = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(ack["resultType"], "complete", "{ack}");
    demo.proc.kill9();

    for _ in 0..10 {
        let got = ok_result(&tasks_get(&c, &id).await);
        assert_eq!(got["status"], "cancelled", "{got}");
        assert!(got.get("error").is_none(), "{got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Restarted with the upstream still down: still cancelled, read from the store.
    let dir = stop(gw).await;
    let gw = Gateway::start_in(dir, &body).await;
    let c = tasks_client(&gw, "alice", "acme");
    let r = readyz(&gw).await;
    assert_eq!(r.status, 503, "{}", body_text(&r));
    let got = ok_result(&tasks_get(&c, &id).await);
    assert_eq!(got["status"], "cancelled", "{got}");
    assert_eq!(server_info_of(&got), demo_server_info(), "{got}");
    let again = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(again["resultType"], "complete", "{again}");
    let got = ok_result(&tasks_get(&c, &id).await);
    assert_eq!(got["status"], "cancelled", "{got}");
}
