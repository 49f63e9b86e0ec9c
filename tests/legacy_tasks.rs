//! The 2025-11-25 task dialect for 2025-era clients, over raw HTTP against the real
//! binary and the demo upstream (docs/design.md §25, "The two task dialects, method by
//! method"): one test per row of the mapping table, plus ownership across sessions and
//! principals and a task seen from both eras.

mod common;
mod legacy_support;

use std::time::Duration;

use common::*;
use legacy_support::*;
use serde_json::{Value, json};

const TASKS_VERSION: &str = "2025-11-25";
const RELATED: &str = "io.modelcontextprotocol/related-task";

async fn gateway(sections: &str, upstream_extra: &str) -> Gateway {
    let gw = Gateway::start(&format!(
        "{}{sections}\n{}",
        jwt_auth(),
        demo_stdio_upstream(upstream_extra)
    ))
    .await;
    gw.wait_ready().await;
    gw
}

fn alice() -> Option<String> {
    Some(token("alice", "acme"))
}

async fn session(gw: &Gateway, tok: Option<String>, caps: Value) -> Legacy {
    let mut c = Legacy::new(gw, tok);
    c.initialize_as(caps, TASKS_VERSION).await;
    c
}

/// A task-augmented `tools/call`: the `CreateTaskResult`'s task.
async fn create(c: &Legacy, tool: &str, args: Value) -> Value {
    let r = c
        .request(
            json!("c"),
            "tools/call",
            json!({"name": tool, "arguments": args, "task": {"ttl": 60000}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let v = r.json();
    let t = v["result"]["task"].clone();
    assert!(t["taskId"].is_string(), "{v}");
    t
}

async fn get(c: &Legacy, task_id: &str) -> Value {
    let r = c
        .request(json!("g"), "tasks/get", json!({"taskId": task_id}))
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    r.json()
}

/// Poll `tasks/get` (at the advertised interval) until the task is terminal.
async fn until_terminal(c: &Legacy, task_id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(c, task_id).await;
        let s = v["result"]["status"].as_str().unwrap_or("").to_string();
        if ["completed", "failed", "cancelled"].contains(&s.as_str()) {
            return v["result"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "never terminal: {v}");
        let wait = v["result"]["pollInterval"].as_u64().unwrap_or(500).max(100);
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

fn assert_task_shape(t: &Value) {
    for k in ["taskId", "status", "createdAt", "lastUpdatedAt"] {
        assert!(t[k].is_string(), "{k}: {t}");
    }
    assert!(t["ttl"].is_u64() && t["pollInterval"].is_u64(), "{t}");
    for k in ["ttlMs", "pollIntervalMs", "resultType", "_meta", "result"] {
        assert!(t.get(k).is_none(), "{k} in {t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_and_tools_list_advertise_the_dialect_only_in_2025_11_25() {
    let gw = gateway("", "[upstream.tools.echo]\ntask = \"never\"\n").await;
    let mut c = Legacy::new(&gw, alice());
    let init = c.initialize_as(json!({}), TASKS_VERSION).await.json();
    assert_eq!(init["result"]["protocolVersion"], TASKS_VERSION, "{init}");
    assert_eq!(
        init["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{init}"
    );
    assert!(
        init["result"]["capabilities"].get("extensions").is_none(),
        "{init}"
    );
    let tools = c.request(json!(1), "tools/list", json!({})).await.json();
    let list = tools["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let by = |n: &str| {
        list.iter()
            .find(|t| t["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    // Every tool may run as a gateway task, the upstream's `required` included...
    assert_eq!(
        by("sleep")["execution"]["taskSupport"],
        "optional",
        "{tools}"
    );
    assert_eq!(
        by("slow_required")["execution"]["taskSupport"],
        "optional",
        "{tools}"
    );
    // ...but one configured `task = "never"`.
    assert!(by("echo").get("execution").is_none(), "{tools}");

    // An earlier version has neither the capability nor the marks.
    let mut old = Legacy::new(&gw, alice());
    let init = old.initialize(json!({})).await.json();
    assert!(
        init["result"]["capabilities"].get("tasks").is_none(),
        "{init}"
    );
    let tools = old.request(json!(1), "tools/list", json!({})).await.json();
    let sleep = tools["result"]["tools"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == "sleep").cloned())
        .unwrap_or_default();
    assert!(sleep.get("execution").is_none(), "{tools}");
}

/// Rows: the `CreateTaskResult` shape, `tasks/get`, `tasks/result` on a terminal task
/// and on one still working (it blocks, with status notifications), and a task of
/// either era seen from the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_and_result_in_2025_shapes() {
    let gw = gateway("", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let t = create(&c, "sleep", json!({"ms": 1500})).await;
    assert_task_shape(&t);
    assert_eq!(t["status"], "working", "{t}");
    let id = t["taskId"].as_str().unwrap_or_default().to_string();

    let g = get(&c, &id).await;
    assert_task_shape(&g["result"]);
    assert_eq!(g["result"]["taskId"], id.as_str(), "{g}");

    // Not terminal: tasks/result blocks, then answers the call's result.
    let mut ev = c
        .open(
            "POST",
            json!({"jsonrpc": "2.0", "id": "r", "method": "tasks/result", "params": {"taskId": id}}),
        )
        .await;
    assert_eq!(ev.status, 200);
    assert_eq!(
        ev.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    let (ended, msgs) = ev.drain(Duration::from_secs(30)).await;
    assert!(ended, "{msgs:?}");
    let status: Vec<&Value> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/tasks/status")
        .collect();
    assert!(
        status.iter().any(|n| n["params"]["status"] == "completed"
            && n["params"]["taskId"] == id.as_str()
            && n["params"]["_meta"].get(RELATED).is_none()),
        "{msgs:?}"
    );
    let last = msgs.last().cloned().unwrap_or_default();
    assert_eq!(last["id"], "r", "{msgs:?}");
    assert!(first_text(&last["result"]).contains("slept"), "{last}");
    assert_ne!(last["result"]["isError"], true, "{last}");
    assert_eq!(
        last["result"]["_meta"][RELATED]["taskId"],
        id.as_str(),
        "{last}"
    );
    assert!(last["result"].get("resultType").is_none(), "{last}");

    // Terminal: answered as JSON at once.
    let r = c
        .request(json!("r2"), "tasks/result", json!({"taskId": id}))
        .await;
    assert!(!r.is_sse(), "{}", text(&r));
    assert_eq!(r.json()["result"]["content"], last["result"]["content"]);

    // The same record in the 2026 dialect, for the same principal.
    let modern = Client2026::new(&gw, "/mcp", alice())
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
    let m = modern
        .request("tasks/get", json!({"taskId": id}))
        .await
        .json();
    assert_eq!(m["result"]["status"], "completed", "{m}");
    assert!(m["result"]["ttlMs"].is_u64(), "{m}");
}

/// Row: a `CallToolResult` with `isError: true` is `failed` in this dialect only, and
/// `tasks/result` returns it as the call would have; a JSON-RPC error is the
/// `tasks/result` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_are_failed_here_and_completed_in_2026() {
    let gw = gateway("", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let t = create(&c, "fail", json!({"message": "nope"})).await;
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    let end = until_terminal(&c, &id).await;
    assert_eq!(end["status"], "failed", "{end}");
    let r = c
        .request(json!(5), "tasks/result", json!({"taskId": id}))
        .await
        .json();
    assert_eq!(r["result"]["isError"], true, "{r}");
    let modern = Client2026::new(&gw, "/mcp", alice())
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
    let m = modern
        .request("tasks/get", json!({"taskId": id}))
        .await
        .json();
    assert_eq!(m["result"]["status"], "completed", "{m}");
    assert_eq!(m["result"]["result"]["isError"], true, "{m}");

    let t = create(&c, "rpc_error", json!({"code": -32042, "message": "bad"})).await;
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    assert_eq!(until_terminal(&c, &id).await["status"], "failed");
    let r = c
        .request(json!(6), "tasks/result", json!({"taskId": id}))
        .await
        .json();
    assert_eq!(r["id"], 6, "{r}");
    assert!(r.get("result").is_none(), "{r}");
    assert!(r["error"]["code"].is_i64(), "{r}");
}

/// Rows: `tasks/cancel` answers the task already `cancelled`; a terminal task is
/// refused with `-32602`; `tasks/result` of a cancelled task is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answers_cancelled_and_refuses_terminal_tasks() {
    let gw = gateway("", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let t = create(&c, "sleep", json!({"ms": 60000})).await;
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    let r = c
        .request(json!(1), "tasks/cancel", json!({"taskId": id}))
        .await
        .json();
    assert_task_shape(&r["result"]);
    assert_eq!(r["result"]["status"], "cancelled", "{r}");
    assert_eq!(get(&c, &id).await["result"]["status"], "cancelled");
    let again = c
        .request(json!(2), "tasks/cancel", json!({"taskId": id}))
        .await
        .json();
    assert_eq!(again["error"]["code"], -32602, "{again}");
    assert!(
        again["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("'cancelled'")),
        "{again}"
    );
    let res = c
        .request(json!(3), "tasks/result", json!({"taskId": id}))
        .await
        .json();
    assert_eq!(res["error"]["code"], -32603, "{res}");

    let done = create(&c, "echo", json!({"text": "hi"})).await;
    let done_id = done["taskId"].as_str().unwrap_or_default().to_string();
    assert_eq!(until_terminal(&c, &done_id).await["status"], "completed");
    let r = c
        .request(json!(4), "tasks/cancel", json!({"taskId": done_id}))
        .await
        .json();
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("'completed'")),
        "{r}"
    );
}

/// Row: a tool configured `task = "never"` called with `params.task` is `-32601`,
/// and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_tool_refuses_task_augmentation() {
    let gw = gateway("", "[upstream.tools.echo]\ntask = \"never\"\n").await;
    let c = session(&gw, alice(), json!({})).await;
    let r = c
        .request(
            json!(9),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}, "task": {}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let v = r.json();
    assert_eq!(v["error"]["code"], -32601, "{v}");
    assert_eq!(v["id"], 9, "{v}");
    let l = c.request(json!(1), "tasks/list", json!({})).await.json();
    assert_eq!(l["result"]["tasks"], json!([]), "{l}");
    // Without the augmentation the call is served as ever.
    let plain = c
        .request(
            json!(10),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}}),
        )
        .await
        .json();
    assert_eq!(first_text(&plain["result"]), "x", "{plain}");
    // A malformed augmentation is invalid params.
    let bad = c
        .request(
            json!(11),
            "tools/call",
            json!({"name": "sleep", "arguments": {"ms": 1}, "task": 5}),
        )
        .await
        .json();
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

/// Row: `tasks/result` on an expired task is `-32602` (expired), like `tasks/get`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_task_has_no_result() {
    let gw = gateway("[tasks]\nttl_ms = 1500\nresult_retention_ms = 1500\n", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let t = create(&c, "echo", json!({"text": "x"})).await;
    assert_eq!(t["ttl"], 1500, "{t}");
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for m in ["tasks/result", "tasks/get"] {
        let r = c.request(json!(1), m, json!({"taskId": id})).await.json();
        assert_eq!(r["error"]["code"], -32602, "{m}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("expired")),
            "{m}: {r}"
        );
    }
}

/// Input: the task is `input_required`; `tasks/result` delivers the elicitation on
/// its stream with the `related-task` key, the POSTed answer resumes the task, and the
/// same stream ends with the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_requests_travel_on_the_result_stream() {
    let gw = gateway("", "").await;
    let c = session(&gw, alice(), json!({"elicitation": {}})).await;
    let t = create(&c, "elicit", json!({"message": "name?"})).await;
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    let mut waited = false;
    for _ in 0..60 {
        if get(&c, &id).await["result"]["status"] == "input_required" {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(waited, "never input_required");
    let mut ev = c
        .open(
            "POST",
            json!({"jsonrpc": "2.0", "id": "r", "method": "tasks/result", "params": {"taskId": id}}),
        )
        .await;
    let ask = loop {
        let m = ev.next(Duration::from_secs(20)).await.expect("no request");
        if m["method"] == "elicitation/create" {
            break m;
        }
    };
    assert_eq!(
        ask["params"]["_meta"][RELATED]["taskId"],
        id.as_str(),
        "{ask}"
    );
    let answer = c
        .post(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"name": "Ada"}}}))
        .await;
    assert_eq!(answer.status, 202, "{}", text(&answer));
    let (ended, msgs) = ev.drain(Duration::from_secs(20)).await;
    assert!(ended, "{msgs:?}");
    let last = msgs.last().cloned().unwrap_or_default();
    assert_eq!(last["id"], "r", "{msgs:?}");
    assert!(
        last["result"]["content"].to_string().contains("Ada"),
        "{last}"
    );
}

/// `tasks/list`: the principal's own tasks, from every session and either era, and
/// nothing of another principal's; a foreign id reads like a never-issued one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_belong_to_the_principal_not_the_session() {
    let gw = gateway("", "").await;
    let one = session(&gw, alice(), json!({})).await;
    let two = session(&gw, alice(), json!({})).await;
    let a = create(&one, "echo", json!({"text": "1"})).await;
    let b = create(&two, "echo", json!({"text": "2"})).await;
    let modern = Client2026::new(&gw, "/mcp", alice())
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
    let m = modern
        .request(
            "tools/call",
            json!({"name": "sleep", "arguments": {"ms": 3000}}),
        )
        .await
        .json();
    let c = m["result"]["taskId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!c.is_empty(), "{m}");

    let listed = one.request(json!(1), "tasks/list", json!({})).await.json();
    let ids: Vec<&str> = listed["result"]["tasks"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["taskId"].as_str()).collect())
        .unwrap_or_default();
    for want in [&a["taskId"], &b["taskId"]] {
        assert!(ids.contains(&want.as_str().unwrap_or("?")), "{listed}");
    }
    assert!(ids.contains(&c.as_str()), "{listed}");
    assert!(listed["result"].get("nextCursor").is_none(), "{listed}");
    for t in listed["result"]["tasks"].as_array().into_iter().flatten() {
        assert_task_shape(t);
    }
    // The second session reads the first one's task.
    assert_eq!(
        get(&two, a["taskId"].as_str().unwrap_or_default()).await["result"]["taskId"],
        a["taskId"]
    );

    let bob = session(&gw, Some(token("bob", "acme")), json!({})).await;
    let l = bob.request(json!(1), "tasks/list", json!({})).await.json();
    assert_eq!(l["result"]["tasks"], json!([]), "{l}");
    let never = "tsk_AAAAAAAAAAAAAAAAAAAAAA";
    for m in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let foreign = bob
            .request(json!(7), m, json!({"taskId": a["taskId"]}))
            .await;
        let unknown = bob.request(json!(7), m, json!({"taskId": never})).await;
        assert_eq!(foreign.status, unknown.status, "{m}");
        assert_eq!(text(&foreign), text(&unknown), "{m}");
        assert_eq!(foreign.json()["error"]["code"], -32602, "{m}");
    }
    let bad = one
        .request(json!(1), "tasks/list", json!({"cursor": "not-a-cursor"}))
        .await
        .json();
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

/// A session of an earlier version has no task dialect: `tasks/*` is 404 and
/// `params.task` is ignored (the call is served as ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_versions_ignore_the_augmentation() {
    let gw = gateway("", "").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    let r = c
        .request(
            json!(1),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}, "task": {}}),
        )
        .await
        .json();
    assert_eq!(first_text(&r["result"]), "x", "{r}");
    assert!(r["result"].get("task").is_none(), "{r}");
    let l = c.request(json!(2), "tasks/list", json!({})).await;
    assert_eq!(l.status, 404, "{}", text(&l));
}

/// The session's GET stream announces the status changes of the tasks it created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_get_stream_announces_status_changes() {
    let gw = gateway("", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let mut stream = c.get_stream().await;
    assert_eq!(stream.status, 200);
    let t = create(&c, "sleep", json!({"ms": 800})).await;
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        if let Some(m) = stream.next(Duration::from_secs(1)).await {
            let done = m["method"] == "notifications/tasks/status"
                && m["params"]["taskId"] == id.as_str()
                && m["params"]["status"] == "completed";
            seen.push(m);
            if done {
                assert_task_shape(&seen[seen.len() - 1]["params"]);
                return;
            }
        }
    }
    panic!("no completed status on the GET stream: {seen:?}");
}

/// `tasks/get` faster than the advertised `pollInterval` is throttled as a 2026 poll
/// is (docs/design.md §8): 429 + `Retry-After`, `-32005`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_are_limited_at_the_advertised_interval() {
    let gw = gateway("[tasks]\npoll_interval_ms = 5000\n", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let t = create(&c, "sleep", json!({"ms": 10000})).await;
    assert_eq!(t["pollInterval"], 5000, "{t}");
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    let mut throttled = None;
    for _ in 0..10 {
        let r = c
            .request(json!("p"), "tasks/get", json!({"taskId": id}))
            .await;
        if r.status == 429 {
            throttled = Some(r);
            break;
        }
    }
    let r = throttled.expect("ten polls at once were never throttled");
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    assert_eq!(r.json()["error"]["code"], -32005, "{}", text(&r));
    assert_eq!(r.json()["id"], "p");
}

/// Input the session did not declare is answered by the gateway as for an inline
/// call (roots: an empty list), so the task completes instead of failing with the
/// 2026 `-32021`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_roots_are_answered_not_failed() {
    let gw = gateway("", "").await;
    let c = session(&gw, alice(), json!({})).await;
    let t = create(&c, "roots", json!({})).await;
    let id = t["taskId"].as_str().unwrap_or_default().to_string();
    let end = until_terminal(&c, &id).await;
    assert_eq!(end["status"], "completed", "{end}");
    let r = c
        .request(json!(1), "tasks/result", json!({"taskId": id}))
        .await
        .json();
    assert!(r.get("error").is_none(), "{r}");
}
