//! Edges of the tasks engine beyond the main lifecycle (docs/design.md §1 "Promotion",
//! §5 "Input requests", §6 "Cancel", §9 "Idempotency", §11 "Expiry", §14 "Upstream
//! sessions"): expiry stopping a running call, undeclared input kinds, input before the
//! deadline, MRTR-then-task composition, cancel while waiting for input, idempotency
//! keys from a tool argument, result size caps and call timeouts.

mod common;
mod tasks_support;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::json;
use tasks_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_stops_the_running_upstream_call() {
    let (_up, url) = start_demo_http().await;
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let body = http_body(&url, "ttl_ms = 1500\nresult_retention_ms = 1", tools);
    let gw = start_with_store("sweep_interval_ms = 200", &body).await;
    let alice = tasks_client(&gw, "alice", "acme");
    let plain = plain_client(&gw, "alice", "acme", json!({}));
    let before = task_demo_stats(&plain).await["cancelled"].as_u64().unwrap();

    let id = task_id(&create_task(&alice, "sleep", json!({"ms": 60000})).await);
    let first = ok_result(&tasks_get(&alice, &id).await);
    assert_eq!(first["status"], "working", "{first}");

    // Poll until gone: it must never have left `working` by itself.
    let err = loop {
        let v = msg(&tasks_get(&alice, &id).await);
        if let Some(e) = v.get("error") {
            break e.clone();
        }
        assert_eq!(v["result"]["status"], "working", "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(err["message"], "task expired", "{err}");

    // The sweeper cancelled the upstream call (docs/design.md §11 "Expiry").
    let mut after = before;
    for _ in 0..150 {
        after = task_demo_stats(&plain).await["cancelled"].as_u64().unwrap();
        if after > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        after > before,
        "expired task's upstream call was never cancelled:\n{}",
        gw.proc.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_input_kind_fails_the_task_and_the_inline_call() {
    let tools = "[upstream.tools.sample]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    // Declares the extension and elicitation, but not sampling.
    let c = tasks_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&c, "sample", json!({"prompt": "hi"})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], -32021, "{done}");
    assert_eq!(
        done["error"]["data"]["requiredCapabilities"]["sampling"],
        json!({}),
        "{done}"
    );
    assert!(done.get("inputRequests").is_none(), "{done}");

    // Inline (no extension): HTTP 400 -32021 naming sampling.
    let p = plain_client(&gw, "alice", "acme", json!({"elicitation": {}}));
    let r = p.call_tool("sample", json!({"prompt": "hi"})).await;
    let v = msg(&r);
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"]["sampling"],
        json!({}),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_before_the_deadline_promotes_at_once() {
    // A deadline far beyond the harness's 60 s HTTP timeout: only an immediate
    // promotion on input can answer in time.
    let tools = "[upstream.tools.elicit]\npromote_after_ms = 300000\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let created = create_task(&c, "elicit", json!({"message": "now?"})).await;
    assert!(created.get("inputRequests").is_none(), "{created}");
    let id = task_id(&created);
    let waiting = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
    })
    .await;
    let reqs = waiting["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(reqs.len(), 1, "{waiting}");
    let (key, req) = reqs.iter().next().unwrap();
    assert_eq!(req["params"]["message"], "now?", "{waiting}");
    ok_result(
        &tasks_update(
            &c,
            &id,
            json!({key: {"action": "accept", "content": {"answer": "yes"}}}),
        )
        .await,
    );
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(first_text(&done["result"]).contains("yes"), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_input_mrtr_answers_mrtr_rounds_for_a_declaring_client() {
    let tools = "[upstream.tools.elicit]\non_input = \"mrtr\"\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let params = json!({"name": "elicit", "arguments": {"message": "mrtr first"}});
    let v = msg(&c
        .send(
            "tools/call",
            &params,
            &c.body(json!(1), "tools/call", &params),
        )
        .await);
    let res = v["result"].clone();
    assert_eq!(res["resultType"], "input_required", "{v}");
    assert!(res.get("taskId").is_none(), "{res}");
    let key = res["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an input request");
    let mut p = params.clone();
    p["inputResponses"] = json!({key: {"action": "accept", "content": {"answer": "composed"}}});
    p["requestState"] = res["requestState"].clone();
    let v = msg(&c
        .send("tools/call", &p, &c.body(json!(2), "tools/call", &p))
        .await);
    let res = &v["result"];
    assert!(v.get("error").is_none(), "{v}");
    match res["resultType"].as_str() {
        Some("complete") => assert!(first_text(res).contains("composed"), "{v}"),
        Some("task") => {
            let done = poll_terminal(&c, &task_id(res)).await;
            assert!(first_text(&done["result"]).contains("composed"), "{done}");
        }
        _ => panic!("unexpected result after the MRTR round: {v}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_waiting_for_input() {
    let tools = "[upstream.tools.elicit]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&c, "elicit", json!({})).await);
    let waiting = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
    })
    .await;
    let key = waiting["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .unwrap();
    let ack = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(ack["resultType"], "complete");
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done.get("inputRequests").is_none(), "{done}");
    // A late answer is acknowledged and changes nothing.
    let ack = ok_result(
        &tasks_update(
            &c,
            &id,
            json!({key: {"action": "accept", "content": {"answer": "late"}}}),
        )
        .await,
    );
    assert_eq!(ack["resultType"], "complete");
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let again = ok_result(&tasks_get(&c, &id).await);
        assert_eq!(again["status"], "cancelled", "{again}");
        assert!(again.get("result").is_none(), "{again}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_from_a_tool_argument() {
    let (_up, url) = start_demo_http().await;
    let tools = "[upstream.tools.counter]\nidempotency_argument = \"key\"\n";
    let gw = start_ready(&http_body(&url, "", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let a = create_task(&c, "counter", json!({"key": "arg-key"})).await;
    let b = create_task(&c, "counter", json!({"key": "arg-key"})).await;
    assert_eq!(task_id(&a), task_id(&b));
    let done = poll_terminal(&c, &task_id(&a)).await;
    assert_eq!(first_text(&done["result"]), "count=1", "{done}");

    // Without the extension, a keyed argument → 400 -32021, nothing runs.
    let plain = plain_client(&gw, "alice", "acme", json!({}));
    let r = plain.call_tool("counter", json!({"key": "arg-key"})).await;
    let v = msg(&r);
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    // Unkeyed tool on the same upstream still runs synchronously.
    let r = plain.call_tool("stats", json!({})).await;
    let stats: serde_json::Value = serde_json::from_str(&first_text(&ok_result(&r))).unwrap();
    assert_eq!(stats["counter"]["arg-key"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_result_and_call_timeout_fail_the_task() {
    let tools = "[upstream.tools.big]\npromote_after_ms = 0\n[upstream.tools.sleep]\npromote_after_ms = 0\ncall_timeout_ms = 500\n";
    let gw = start_ready(&stdio_body("max_result_bytes = 4096", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");

    let id = task_id(&create_task(&c, "big", json!({"bytes": 100000})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], -32603, "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("too large")),
        "{done}"
    );
    assert!(done.get("result").is_none(), "{done}");

    let id = task_id(&create_task(&c, "sleep", json!({"ms": 30000})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("call_timeout_ms")),
        "{done}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_for_tasks_requires_the_extension_and_required_tools_refuse_plain_clients() {
    let gw = start_ready(&stdio_body("", "")).await;
    let plain = plain_client(&gw, "alice", "acme", json!({}));
    let params = json!({"notifications": {"taskIds": [never_issued_id()]}});
    let body = plain.body(json!("l"), "subscriptions/listen", &params);
    let r = raw(
        &plain.url,
        "POST",
        &plain.headers("subscriptions/listen", &params),
        Bytes::from(body.to_string()),
    )
    .await
    .unwrap();
    let v = msg(&r);
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(v["id"], "l");

    // An upstream tool marked taskSupport:"required" refuses a non-declaring client.
    let r = plain.call_tool("slow_required", json!({"ms": 10})).await;
    let v = msg(&r);
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXT],
        json!({}),
        "{v}"
    );
}

/// Poll the demo's `cancelled` counter until it exceeds `before`.
async fn wait_upstream_cancel(plain: &Client2026, before: u64) -> u64 {
    let mut after = before;
    for _ in 0..150 {
        after = task_demo_stats(plain).await["cancelled"].as_u64().unwrap();
        if after > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    after
}

/// Send `tools/call sleep {ms: 60000}` as client `c` on a raw TCP connection, wait
/// until it reaches the upstream, close the socket, and require the upstream to see
/// a cancellation.
async fn hang_up_cancels(who: &str, c: &Client2026, plain: &Client2026) {
    use tokio::io::AsyncWriteExt;
    let before = task_demo_stats(plain).await["cancelled"].as_u64().unwrap();
    let calls_before = task_demo_stats(plain).await["calls"].as_u64().unwrap();

    let params = json!({"name": "sleep", "arguments": {"ms": 60000}});
    let body = c.body(json!(1), "tools/call", &params).to_string();
    let addr = c
        .url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in c.headers("tools/call", &params) {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    sock.write_all(req.as_bytes()).await.unwrap();

    let mut reached = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calls = task_demo_stats(plain).await["calls"].as_u64().unwrap();
        // `calls` counts the stats calls themselves too; the sleep adds one more.
        if calls > calls_before + 1 {
            reached = true;
            break;
        }
    }
    assert!(reached, "{who}: the sleep call never reached the upstream");
    // Hang up.
    let _ = sock.shutdown().await;
    drop(sock);
    let after = wait_upstream_cancel(plain, before).await;
    assert!(
        after > before,
        "{who}: closing the connection while waiting inline did not cancel the upstream call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_an_inline_request_cancels_the_upstream_call() {
    let (_up, url) = start_demo_http().await;
    let gw = start_ready(&http_body(&url, "", "")).await;
    let plain = plain_client(&gw, "alice", "acme", json!({}));
    hang_up_cancels("plain", &plain, &plain).await;
}

/// docs/design.md §6 "Cancel": a declaring client that hangs up while its call is still
/// racing the promotion deadline (no task handle returned yet) is "waiting inline" too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_before_a_task_handle_is_returned_cancels_the_upstream_call() {
    let (_up, url) = start_demo_http().await;
    // A deadline no test waits for: the call stays in the promotion race.
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 300000\n";
    let gw = start_ready(&http_body(&url, "", tools)).await;
    let plain = plain_client(&gw, "alice", "acme", json!({}));
    let declaring = tasks_client(&gw, "alice", "acme");
    hang_up_cancels("declaring", &declaring, &plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_timeout_answers_minus_32021_and_cancels_upstream() {
    let (_up, url) = start_demo_http().await;
    let gw = start_ready(&http_body(&url, "sync_timeout_ms = 1000", "")).await;
    let plain = plain_client(&gw, "alice", "acme", json!({}));
    let before = task_demo_stats(&plain).await["cancelled"].as_u64().unwrap();
    let r = plain.call_tool("sleep", json!({"ms": 30000})).await;
    let v = msg(&r);
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXT],
        json!({}),
        "{v}"
    );
    let after = wait_upstream_cancel(&plain, before).await;
    assert!(
        after > before,
        "sync timeout did not cancel the upstream call"
    );
}
