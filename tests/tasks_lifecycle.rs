//! The tasks engine end to end against the real binary (docs/design.md §1 "Promotion"
//! to §6 "Cancel", §10 "Restart"; MCP Tasks extension, "Tasks" to "Task
//! Cancellation"; MCP 2026-07-28 "Multi Round-Trip Requests"): promotion, the task
//! shapes, terminal states, durability before the reply and across `kill -9`, input
//! round trips over stdio and HTTP upstreams, MRTR for clients without the extension,
//! and cancellation.

mod common;
mod tasks_support;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use serde_json::json;
use tasks_support::*;

// ---------------------------------------------------------------------------------
// Promotion and shapes
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_call_inline_slow_call_flat_task_with_progress() {
    let gw = start_ready(&stdio_body("", "")).await;
    let c = tasks_client(&gw, "alice", "acme");

    // Fast call: inline, no task.
    let r = c.call_tool("echo", json!({"text": "hi"})).await;
    let res = ok_result(&r);
    assert_eq!(res["resultType"], "complete", "{res}");
    assert!(res.get("taskId").is_none(), "{res}");
    assert_eq!(first_text(&res), "hi");

    // Slow call: a flat CreateTaskResult.
    let r = c.call_tool("sleep", json!({"ms": 1500, "steps": 5})).await;
    assert_eq!(r.status, 200);
    let v = msg(&r);
    assert_eq!(v["id"], 1, "{v}");
    let created = v["result"].clone();
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().expect("taskId").to_string();
    let rest = id.strip_prefix("tsk_").expect("tsk_ prefix");
    assert_eq!(rest.len(), 22, "{id}");
    assert!(
        rest.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{id}"
    );
    assert_eq!(created["status"], "working", "{created}");
    for k in ["createdAt", "lastUpdatedAt"] {
        let s = created[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k}: {created}"));
        assert!(is_iso8601(s), "{k} = {s}");
    }
    for k in ["ttlMs", "pollIntervalMs"] {
        assert!(
            created[k].as_u64().is_some_and(|n| n > 0),
            "{k} must be a positive integer: {created}"
        );
    }
    for k in [
        "task",
        "ttl",
        "pollInterval",
        "result",
        "error",
        "inputRequests",
        "requestState",
    ] {
        assert!(created.get(k).is_none(), "{k} must not appear: {created}");
    }

    // Poll: progress shows in statusMessage while working; then the exact result.
    let mut progress_seen = Vec::new();
    let done = poll_until_seen(
        &c,
        &id,
        Duration::from_secs(60),
        |r| {
            assert_eq!(r["resultType"], "complete", "{r}");
            assert_eq!(r["taskId"], id.as_str());
            if r["status"] == "working"
                && let Some(m) = r["statusMessage"].as_str()
                && m.contains('/')
            {
                progress_seen.push(m.to_string());
            }
        },
        |r| is_terminal(r["status"].as_str().unwrap_or_default()),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    // The upstream CallToolResult unchanged, rendered as a 2026 result (see
    // `completed_task_result_is_a_complete_result_with_server_info`).
    let mut upstream_part = done["result"].clone();
    let rendered = upstream_part.as_object_mut().unwrap();
    assert_eq!(
        rendered.remove("resultType"),
        Some(json!("complete")),
        "{done}"
    );
    assert!(rendered.remove("_meta").is_some(), "{done}");
    assert_eq!(
        upstream_part,
        json!({"content": [{"type": "text", "text": "slept 1500 ms"}]}),
        "result must be exactly the upstream CallToolResult: {done}"
    );
    assert!(done.get("error").is_none(), "{done}");
    assert!(done.get("inputRequests").is_none(), "{done}");
    assert!(
        !progress_seen.is_empty(),
        "upstream progress never showed up as statusMessage"
    );
}

/// A completed task's `result` is the original request's result type: a 2026
/// `CallToolResult` with its own `resultType: "complete"` and the upstream's identity
/// in `_meta` (docs/design.md, introduction: payload fidelity), in `tasks/get` and in the
/// `notifications/tasks` snapshot of a `subscriptions/listen` stream alike. Strict
/// clients (the TypeScript SDK's ext-tasks codec) reject it otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_task_result_is_a_complete_result_with_server_info() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&c, "sleep", json!({"ms": 1500})).await);
    let mut listen = SseStream::listen(&c, json!("sub"), json!({"taskIds": [id.clone()]})).await;
    assert_eq!(listen.status, 200);

    let check = |where_: &str, result: &serde_json::Value| {
        assert_eq!(result["resultType"], "complete", "{where_}: {result}");
        assert_eq!(
            result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "taskgate-demo",
            "{where_}: {result}"
        );
        assert!(
            result["_meta"]
                .get("io.modelcontextprotocol/related-task")
                .is_none(),
            "{where_}: {result}"
        );
        assert_eq!(
            result["content"],
            json!([{"type": "text", "text": "slept 1500 ms"}]),
            "{where_}: {result}"
        );
    };

    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    check("tasks/get", &done["result"]);
    // The same identity as the tasks/get result itself.
    assert_eq!(
        done["result"]["_meta"]["io.modelcontextprotocol/serverInfo"],
        done["_meta"]["io.modelcontextprotocol/serverInfo"],
        "{done}"
    );

    // The listen stream's terminal snapshot carries the same rendered result.
    let snapshot = loop {
        let n = listen
            .next(Duration::from_secs(30))
            .await
            .expect("listen stream ended before the completed snapshot");
        if n["method"] == "notifications/tasks"
            && is_terminal(n["params"]["status"].as_str().unwrap_or_default())
        {
            break n["params"].clone();
        }
    };
    assert_eq!(snapshot["status"], "completed", "{snapshot}");
    assert!(snapshot.get("resultType").is_none(), "{snapshot}");
    check("notifications/tasks", &snapshot["result"]);
    assert_eq!(snapshot["result"], done["result"], "{snapshot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_error_completes_and_rpc_error_fails() {
    let tools = "[upstream.tools.fail]\npromote_after_ms = 0\n[upstream.tools.rpc_error]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");

    // isError:true is a *completed* task (MCP Tasks extension, "Task Execution Errors").
    let id = task_id(&create_task(&c, "fail", json!({"message": "tool said no"})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert_eq!(first_text(&done["result"]), "tool said no");
    assert!(done.get("error").is_none(), "{done}");

    // An upstream JSON-RPC error is a *failed* task carrying that error.
    let id = task_id(
        &create_task(
            &c,
            "rpc_error",
            json!({"code": 4242, "message": "demo boom"}),
        )
        .await,
    );
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], 4242, "{done}");
    assert_eq!(done["error"]["message"], "demo boom", "{done}");
    assert!(done.get("result").is_none(), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_fails_the_task() {
    let tools = "[upstream.tools.crash]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&c, "crash", json!({})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], -32603, "{done}");
    let m = done["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("demo") && (m.contains("exit") || m.contains("fail")),
        "the message must say what happened: {done}"
    );
    // Terminal means terminal: still failed on later polls.
    for _ in 0..3 {
        let again = ok_result(&tasks_get(&c, &id).await);
        assert_eq!(again["status"], "failed");
        assert_eq!(again["error"], done["error"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_declaring_client_never_gets_a_task() {
    let gw = start_ready(&stdio_body("", "")).await;
    let c = plain_client(&gw, "alice", "acme", json!({"elicitation": {}}));
    let r = c.call_tool("sleep", json!({"ms": 1500})).await;
    let res = ok_result(&r);
    assert_eq!(res["resultType"], "complete", "{res}");
    assert!(res.get("taskId").is_none(), "{res}");
    assert_eq!(first_text(&res), "slept 1500 ms");
}

// ---------------------------------------------------------------------------------
// Durability
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_is_durable_before_the_reply() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let mut joins = Vec::new();
    for i in 0..50 {
        let c = tasks_client(&gw, "alice", "acme");
        joins.push(tokio::spawn(async move {
            let r = c.call_tool("sleep", json!({"ms": 2000})).await;
            let created = ok_result(&r);
            assert_eq!(created["resultType"], "task", "#{i}: {created}");
            let id = task_id(&created);
            // Immediately: the task must already be readable.
            let got = tasks_get(&c, &id).await;
            let v = msg(&got);
            assert!(
                v.get("error").is_none(),
                "#{i}: tasks/get right after creation failed: {v}"
            );
            assert_eq!(v["result"]["taskId"], id.as_str());
            id
        }));
    }
    let mut ids = HashSet::new();
    for j in joins {
        ids.insert(j.await.expect("creation task panicked"));
    }
    assert_eq!(ids.len(), 50, "task ids must be distinct");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_kill9_and_inflight_calls_fail() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");

    // A task that completes before the kill.
    let done_id = task_id(&create_task(&c, "sleep", json!({"ms": 50})).await);
    let done = poll_terminal(&c, &done_id).await;
    assert_eq!(done["status"], "completed", "{done}");

    // A task still in flight at the kill.
    let live_id = task_id(&create_task(&c, "sleep", json!({"ms": 5000})).await);
    let Gateway {
        mut proc,
        dir,
        config_path,
        ..
    } = gw;
    proc.kill9();
    drop(proc);

    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let c = tasks_client(&gw, "alice", "acme");

    let after = poll_terminal(&c, &live_id).await;
    assert_eq!(after["status"], "failed", "{after}");
    let m = after["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("gateway restarted while the call was in flight"),
        "{after}"
    );

    let kept = ok_result(&tasks_get(&c, &done_id).await);
    assert_eq!(kept["status"], "completed", "{kept}");
    assert_eq!(kept["result"], done["result"], "{kept}");
    assert_eq!(first_text(&kept["result"]), "slept 50 ms");

    // Still not visible to anyone else after the restart.
    let bob = tasks_client(&gw, "bob", "other");
    let v = msg(&tasks_get(&bob, &done_id).await);
    assert_eq!(v["error"]["code"], -32602, "{v}");
}

// ---------------------------------------------------------------------------------
// Input round trips
// ---------------------------------------------------------------------------------

async fn input_round_trip(gw: &Gateway) {
    let c = tasks_client(gw, "alice", "acme");
    let id = task_id(&create_task(&c, "elicit_twice", json!({})).await);
    let waiting = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
            && r["inputRequests"].as_object().is_some_and(|m| m.len() == 2)
    })
    .await;
    let reqs = waiting["inputRequests"].as_object().unwrap().clone();
    let mut first_key = None;
    let mut second_key = None;
    for (k, v) in &reqs {
        assert_eq!(v["method"], "elicitation/create", "{waiting}");
        assert!(v.get("jsonrpc").is_none() && v.get("id").is_none(), "{v}");
        match v["params"]["message"].as_str() {
            Some("First question") => first_key = Some(k.clone()),
            Some("Second question") => second_key = Some(k.clone()),
            other => panic!("unexpected question {other:?}: {waiting}"),
        }
    }
    let (k1, k2) = (first_key.unwrap(), second_key.unwrap());
    assert_ne!(k1, k2);

    // Answer one key only.
    let ack = ok_result(
        &tasks_update(
            &c,
            &id,
            json!({&k1: {"action": "accept", "content": {"answer": "alpha"}}}),
        )
        .await,
    );
    assert_eq!(ack["resultType"], "complete", "{ack}");
    for k in ["taskId", "status", "result", "error"] {
        assert!(ack.get(k).is_none(), "ack must be empty: {ack}");
    }
    let one_left = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["inputRequests"].as_object().is_some_and(|m| m.len() == 1)
    })
    .await;
    assert_eq!(one_left["status"], "input_required", "{one_left}");
    assert!(one_left["inputRequests"].get(&k2).is_some(), "{one_left}");
    assert!(one_left["inputRequests"].get(&k1).is_none(), "{one_left}");

    // Duplicate (already answered) and unknown keys: ack, nothing changes.
    let ack = ok_result(
        &tasks_update(
            &c,
            &id,
            json!({
                &k1: {"action": "accept", "content": {"answer": "DUPLICATE"}},
                "elicitation-999": {"action": "accept", "content": {"answer": "UNKNOWN"}},
                "nonsense": {"action": "accept", "content": {"answer": "UNKNOWN"}}
            }),
        )
        .await,
    );
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let still = ok_result(&tasks_get(&c, &id).await);
    assert_eq!(still["status"], "input_required", "{still}");
    assert_eq!(
        still["inputRequests"].as_object().map(|m| m.len()),
        Some(1),
        "{still}"
    );
    assert!(still["inputRequests"].get(&k2).is_some(), "{still}");

    // The second answer completes the call with both answers.
    let ack = ok_result(
        &tasks_update(
            &c,
            &id,
            json!({&k2: {"action": "accept", "content": {"answer": "beta"}}}),
        )
        .await,
    );
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let content = done["result"]["content"].as_array().expect("content");
    assert_eq!(content.len(), 2, "{done}");
    let a = content[0]["text"].as_str().unwrap_or_default();
    let b = content[1]["text"].as_str().unwrap_or_default();
    assert!(a.contains("accept") && a.contains("alpha"), "{done}");
    assert!(b.contains("accept") && b.contains("beta"), "{done}");
    let all = all_text(&done["result"]);
    assert!(
        !all.contains("DUPLICATE") && !all.contains("UNKNOWN"),
        "ignored answers leaked into the result: {done}"
    );
    assert!(done.get("inputRequests").is_none(), "{done}");

    // Updating a terminal task: ack, no change.
    let ack = ok_result(
        &tasks_update(
            &c,
            &id,
            json!({&k2: {"action": "accept", "content": {"answer": "late"}}}),
        )
        .await,
    );
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let again = ok_result(&tasks_get(&c, &id).await);
    assert_eq!(again["status"], "completed");
    assert_eq!(again["result"], done["result"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_round_trip_stdio_upstream() {
    let tools = "[upstream.tools.elicit_twice]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    input_round_trip(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_round_trip_http_upstream() {
    let (_up, url) = start_demo_http().await;
    let tools = "[upstream.tools.elicit_twice]\npromote_after_ms = 0\n";
    let gw = start_ready(&http_body(&url, "", tools)).await;
    input_round_trip(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_input_times_out_to_failed() {
    let tools = "[upstream.tools.elicit]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("input_timeout_ms = 1000", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&c, "elicit", json!({"message": "anyone?"})).await);
    let waiting = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["status"] == "input_required" || is_terminal(r["status"].as_str().unwrap_or_default())
    })
    .await;
    assert_eq!(waiting["status"], "input_required", "{waiting}");
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    let m = done["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !m.is_empty() && m.contains("input"),
        "a reason is required: {done}"
    );
    assert!(done["error"]["code"].is_i64(), "{done}");
    assert!(done.get("inputRequests").is_none(), "{done}");
}

// ---------------------------------------------------------------------------------
// MRTR for clients without the extension
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_round_trip_for_non_declaring_client() {
    let gw = start_ready(&stdio_body("", "")).await;
    let alice = plain_client(&gw, "alice", "acme", json!({"elicitation": {}}));
    let bob = plain_client(&gw, "bob", "other", json!({"elicitation": {}}));
    let params = json!({"name": "elicit", "arguments": {"message": "your name?"}});

    let r = alice
        .send(
            "tools/call",
            &params,
            &alice.body(json!("first"), "tools/call", &params),
        )
        .await;
    let v = msg(&r);
    assert_eq!(v["id"], "first");
    let res = v["result"].clone();
    assert_eq!(res["resultType"], "input_required", "{res}");
    assert!(res.get("taskId").is_none(), "{res}");
    let reqs = res["inputRequests"]
        .as_object()
        .expect("inputRequests")
        .clone();
    assert_eq!(reqs.len(), 1, "{res}");
    let (key, req) = reqs.iter().next().unwrap();
    assert_eq!(req["method"], "elicitation/create", "{res}");
    let state = res["requestState"]
        .as_str()
        .expect("requestState")
        .to_string();

    let retry = |state: &str| {
        let mut p = params.clone();
        p["inputResponses"] = json!({key: {"action": "accept", "content": {"answer": "x-marks"}}});
        p["requestState"] = json!(state);
        p
    };

    // Tampered state → -32602.
    let mut tampered = state.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let p = retry(&tampered);
    let v = msg(&alice
        .send("tools/call", &p, &alice.body(json!(2), "tools/call", &p))
        .await);
    assert_eq!(v["error"]["code"], -32602, "tampered state: {v}");
    assert_eq!(v["id"], 2);

    // Replayed by another principal → -32602.
    let p = retry(&state);
    let v = msg(&bob
        .send("tools/call", &p, &bob.body(json!(3), "tools/call", &p))
        .await);
    assert_eq!(v["error"]["code"], -32602, "foreign replay: {v}");
    assert!(v.get("result").is_none(), "{v}");

    // The genuine retry (new id, same params + answers + state) completes.
    let v = msg(&alice
        .send("tools/call", &p, &alice.body(json!(4), "tools/call", &p))
        .await);
    assert_eq!(v["id"], 4);
    let res = v["result"].clone();
    assert_eq!(res["resultType"], "complete", "{v}");
    let t = first_text(&res);
    assert!(t.contains("accept") && t.contains("x-marks"), "{res}");

    // The state is single-use.
    let v = msg(&alice
        .send("tools/call", &p, &alice.body(json!(5), "tools/call", &p))
        .await);
    assert_eq!(v["error"]["code"], -32602, "replayed state: {v}");
}

// ---------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_call_reaches_the_upstream() {
    let (_up, url) = start_demo_http().await;
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&http_body(&url, "", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let plain = plain_client(&gw, "alice", "acme", json!({}));

    let before = task_demo_stats(&plain).await["cancelled"].as_u64().unwrap();
    let id = task_id(&create_task(&c, "sleep", json!({"ms": 20000, "steps": 40})).await);
    // Wait until the upstream call is really running: its first progress report has
    // become the status message. ("working" alone is also true of a task whose call
    // has not reached the upstream yet; a cancel then has nothing to reach.)
    let running = poll_until(&c, &id, Duration::from_secs(20), |r| {
        r["status"] == "working" && r["statusMessage"] != "working"
    })
    .await;
    assert_eq!(running["status"], "working", "{running}");
    assert_ne!(running["statusMessage"], "working", "{running}");

    let ack = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(ack["resultType"], "complete", "{ack}");
    assert!(
        ack.get("status").is_none() && ack.get("taskId").is_none(),
        "{ack}"
    );

    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(
        done.get("result").is_none() && done.get("error").is_none(),
        "{done}"
    );

    // The upstream saw the cancellation.
    let mut after = before;
    for _ in 0..100 {
        after = task_demo_stats(&plain).await["cancelled"].as_u64().unwrap();
        if after > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        after > before,
        "upstream never observed notifications/cancelled (before {before}, after {after})"
    );

    // Idempotent: same ack, state unchanged.
    let again = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(again, ack);
    let still = ok_result(&tasks_get(&c, &id).await);
    assert_eq!(still["status"], "cancelled", "{still}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_settles_once() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let c = tasks_client(&gw, "alice", "acme");
    let mut outcomes = Vec::new();
    // Cancel at a spread of moments around the call's completion.
    for delay in [0u64, 150, 250, 300, 350, 450] {
        let id = task_id(&create_task(&c, "sleep", json!({"ms": 300})).await);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let ack = ok_result(&tasks_cancel(&c, &id).await);
        assert_eq!(ack["resultType"], "complete", "{ack}");
        let first = poll_terminal(&c, &id).await;
        let status = first["status"].as_str().unwrap().to_string();
        assert!(
            status == "completed" || status == "cancelled",
            "unexpected terminal state: {first}"
        );
        if status == "completed" {
            assert_eq!(first_text(&first["result"]), "slept 300 ms", "{first}");
        } else {
            assert!(first.get("result").is_none(), "{first}");
        }
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            let again = ok_result(&tasks_get(&c, &id).await);
            assert_eq!(
                again["status"], first["status"],
                "terminal state changed: {again}"
            );
            assert_eq!(again.get("result"), first.get("result"), "{again}");
            assert_eq!(again.get("error"), first.get("error"), "{again}");
        }
        outcomes.push(status);
    }
    eprintln!("cancel/completion race outcomes: {outcomes:?}");
}
