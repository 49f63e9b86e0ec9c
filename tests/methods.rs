//! Every served method through the real binary, against the bundled demo legacy
//! server over BOTH transports (stdio child and legacy Streamable HTTP). Each body is
//! `async fn NAME(t: Transport)`; `per_transport!` generates `stdio::NAME` and
//! `http::NAME`.

#[macro_use]
mod common;

use common::*;
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

per_transport!(
    discover,
    tools_list,
    tools_call_echo_fail_rpc_error,
    prompts,
    resources,
    completion,
    progress_uses_client_token,
    log_messages_only_with_log_level,
    elicit_without_capability_is_32021,
    slow_required_without_tasks_is_32021,
    tools_list_after_touch_tools,
);

async fn setup(t: Transport) -> DemoSetup {
    let s = DemoSetup::start(t, "", "").await;
    s.gw.wait_ready().await;
    s
}

fn body_text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// 200 + JSON + a `complete` result with the demo's serverInfo; returns the result.
fn ok_result(r: &Resp) -> Value {
    assert_eq!(r.status, 200, "{}", body_text(r));
    let v = r.json();
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["id"], 1, "{v}");
    assert!(v.get("error").is_none(), "{v}");
    let res = v["result"].clone();
    assert_eq!(res["resultType"], "complete", "{res}");
    assert_eq!(
        res["_meta"][SERVER_INFO],
        json!({"name": "taskgate-demo", "version": "0.1.0"}),
        "{res}"
    );
    res
}

fn assert_cache_hints(res: &Value) {
    assert!(res["ttlMs"].is_u64(), "ttlMs: {res}");
    assert!(
        matches!(res["cacheScope"].as_str(), Some("public" | "private")),
        "cacheScope: {res}"
    );
}

fn assert_no_cache_hints(res: &Value) {
    assert!(res.get("ttlMs").is_none(), "{res}");
    assert!(res.get("cacheScope").is_none(), "{res}");
}

async fn discover(t: Transport) {
    let s = setup(t).await;
    let r = s.client().request("server/discover", json!({})).await;
    assert!(!r.is_sse());
    let res = ok_result(&r);
    assert_eq!(res["supportedVersions"], json!(["2026-07-28"]));
    assert_cache_hints(&res);
    let caps = &res["capabilities"];
    // The upstream's capabilities, passed through...
    assert_eq!(caps["tools"], json!({"listChanged": true}), "{caps}");
    assert_eq!(caps["prompts"], json!({}), "{caps}");
    assert_eq!(caps["resources"]["subscribe"], true, "{caps}");
    assert_eq!(caps["completions"], json!({}), "{caps}");
    // ...plus the tasks extension, and never the legacy `tasks` capability.
    assert_eq!(caps["extensions"][TASKS], json!({}), "{caps}");
    assert!(caps.get("tasks").is_none(), "{caps}");
    assert!(
        res["instructions"]
            .as_str()
            .is_some_and(|i| i.contains("Demo")),
        "{res}"
    );
    // serverInfo only in _meta.
    assert!(res.get("serverInfo").is_none(), "{res}");
}

async fn tools_list(t: Transport) {
    let s = setup(t).await;
    let res = ok_result(&s.client().request("tools/list", json!({})).await);
    assert_cache_hints(&res);
    let names: Vec<&str> = res["tools"]
        .as_array()
        .expect("tools array")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for want in [
        "echo",
        "sleep",
        "elicit",
        "fail",
        "rpc_error",
        "stats",
        "slow_required",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // Tool definitions pass through unchanged (execution.taskSupport, schemas).
    let slow = res["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "slow_required")
        .unwrap();
    assert_eq!(slow["execution"], json!({"taskSupport": "required"}));
    let echo = res["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .unwrap();
    assert_eq!(
        echo["inputSchema"],
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    );
}

async fn tools_call_echo_fail_rpc_error(t: Transport) {
    let s = setup(t).await;
    let c = s.client();

    // echo: exact content, no cache hints on a tools/call result.
    let text = "héllo \"wörld\" ✓ {json} \\ 12345678901234567890";
    let r = c.call_tool("echo", json!({"text": text})).await;
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    let res = ok_result(&r);
    assert_eq!(
        res["content"],
        json!([{"type": "text", "text": text}]),
        "{res}"
    );
    assert!(res.get("isError").is_none(), "{res}");
    assert_no_cache_hints(&res);

    // fail: a tool error is a result with isError:true.
    let res = ok_result(&c.call_tool("fail", json!({"message": "boom"})).await);
    assert_eq!(res["isError"], true, "{res}");
    assert_eq!(first_text(&res), "boom");

    // rpc_error: the upstream's JSON-RPC error passes through (HTTP 200).
    let r = c
        .call_tool(
            "rpc_error",
            json!({"code": -32000, "message": "demo went wrong"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    let v = r.json();
    assert_eq!(v["id"], 1, "{v}");
    assert!(v.get("result").is_none(), "{v}");
    assert_eq!(v["error"]["code"], -32000, "{v}");
    assert_eq!(v["error"]["message"], "demo went wrong", "{v}");

    // Unknown tool → the upstream's -32602 passes through.
    let r = c.call_tool("no_such_tool", json!({})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(r.json()["error"]["code"], -32602, "{}", body_text(&r));
}

async fn prompts(t: Transport) {
    let s = setup(t).await;
    let c = s.client();
    let res = ok_result(&c.request("prompts/list", json!({})).await);
    assert_cache_hints(&res);
    assert_eq!(res["prompts"][0]["name"], "greeting", "{res}");
    assert_eq!(res["prompts"][0]["arguments"][0]["required"], true, "{res}");

    let res = ok_result(
        &c.request(
            "prompts/get",
            json!({"name": "greeting", "arguments": {"name": "Zoë"}}),
        )
        .await,
    );
    assert_no_cache_hints(&res);
    assert_eq!(
        res["messages"],
        json!([{"role": "user", "content": {"type": "text", "text": "Hello, Zoë!"}}]),
        "{res}"
    );

    let r = c.request("prompts/get", json!({"name": "nope"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(r.json()["error"]["code"], -32602, "{}", body_text(&r));
}

async fn resources(t: Transport) {
    let s = setup(t).await;
    let c = s.client();
    let res = ok_result(&c.request("resources/list", json!({})).await);
    assert_cache_hints(&res);
    let uris: Vec<&str> = res["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert_eq!(uris, vec!["demo://counter", "demo://readme"]);

    let res = ok_result(&c.request("resources/templates/list", json!({})).await);
    assert_cache_hints(&res);
    assert_eq!(
        res["resourceTemplates"][0]["uriTemplate"], "demo://item/{id}",
        "{res}"
    );

    let res = ok_result(
        &c.request("resources/read", json!({"uri": "demo://item/42"}))
            .await,
    );
    assert_cache_hints(&res);
    assert_eq!(
        res["contents"],
        json!([{"uri": "demo://item/42", "mimeType": "text/plain", "text": "Item 42"}]),
        "{res}"
    );

    // Unknown resource: legacy -32002 is translated to -32602 (never -32002 in 2026).
    let r = c
        .request("resources/read", json!({"uri": "demo://missing"}))
        .await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    let v = r.json();
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["data"]["uri"], "demo://missing", "{v}");
}

async fn completion(t: Transport) {
    let s = setup(t).await;
    let res = ok_result(
        &s.client()
            .request(
                "completion/complete",
                json!({"ref": {"type": "ref/prompt", "name": "greeting"},
                       "argument": {"name": "name", "value": "ch"}}),
            )
            .await,
    );
    assert_eq!(
        res["completion"],
        json!({"values": ["Charlie"], "total": 1, "hasMore": false}),
        "{res}"
    );
    assert_no_cache_hints(&res);
}

/// Send `tools/call` with extra `_meta` keys.
async fn call_with_meta(c: &Client2026, tool: &str, args: Value, extra_meta: Value) -> Resp {
    let params = json!({"name": tool, "arguments": args});
    let mut body = c.body(json!(1), "tools/call", &params);
    for (k, v) in extra_meta.as_object().unwrap() {
        body["params"]["_meta"][k] = v.clone();
    }
    c.send("tools/call", &params, &body).await
}

async fn progress_uses_client_token(t: Transport) {
    let s = setup(t).await;
    let c = s.client();
    for token in [json!("client-tök-1"), json!(4242)] {
        let r = call_with_meta(
            &c,
            "sleep",
            json!({"ms": 600, "steps": 3}),
            json!({"progressToken": token}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", body_text(&r));
        assert!(r.is_sse(), "progress requested → SSE: {:?}", r.headers);
        assert_eq!(r.header("cache-control").as_deref(), Some("no-cache"));
        assert_eq!(r.header("x-accel-buffering").as_deref(), Some("no"));
        let msgs = r.sse_messages();
        let progress: Vec<&Value> = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        assert!(!progress.is_empty(), "no progress in {msgs:?}");
        let mut last = f64::MIN;
        for p in &progress {
            assert_eq!(p["params"]["progressToken"], token, "client token: {p}");
            assert!(p.get("id").is_none(), "{p}");
            let v = p["params"]["progress"].as_f64().expect("progress number");
            assert!(v > last, "progress must increase: {msgs:?}");
            last = v;
        }
        // The final result is the last event.
        let final_msg = msgs.last().unwrap();
        assert_eq!(final_msg["id"], 1, "{msgs:?}");
        assert_eq!(first_text(&final_msg["result"]), "slept 600 ms");
        assert_eq!(final_msg["result"]["resultType"], "complete");
        // No `id:` lines on 2026 streams.
        assert!(
            !body_text(&r).lines().any(|l| l.starts_with("id:")),
            "{}",
            body_text(&r)
        );
    }

    // Without a token: a fast answer is plain JSON, no notifications.
    let r = c.call_tool("sleep", json!({"ms": 200, "steps": 2})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(first_text(&r.json()["result"]), "slept 200 ms");
}

async fn log_messages_only_with_log_level(t: Transport) {
    let s = setup(t).await;
    let c = s.client();
    let logs = |r: &Resp| -> Vec<Value> {
        r.sse_messages()
            .into_iter()
            .filter(|m| m["method"] == "notifications/message")
            .collect()
    };

    // logLevel info: the demo's "sleep started" (level info) is relayed.
    let r = call_with_meta(
        &c,
        "sleep",
        json!({"ms": 300}),
        json!({"io.modelcontextprotocol/logLevel": "info"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert!(r.is_sse(), "{:?}", r.headers);
    let l = logs(&r);
    assert!(!l.is_empty(), "no notifications/message: {}", body_text(&r));
    assert_eq!(l[0]["params"]["level"], "info", "{l:?}");
    assert_eq!(l[0]["params"]["data"], "sleep started", "{l:?}");
    assert_eq!(first_text(&r.json()["result"]), "slept 300 ms");

    // logLevel error: the info message is below it.
    let r = call_with_meta(
        &c,
        "sleep",
        json!({"ms": 300}),
        json!({"io.modelcontextprotocol/logLevel": "error"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert!(logs(&r).is_empty(), "{}", body_text(&r));
    assert_eq!(first_text(&r.json()["result"]), "slept 300 ms");

    // No logLevel: no notifications/message at all (and plain JSON).
    let r = c.call_tool("sleep", json!({"ms": 300})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert!(!r.is_sse(), "{:?}", r.headers);
    assert!(
        !body_text(&r).contains("notifications/message"),
        "{}",
        body_text(&r)
    );
}

async fn elicit_without_capability_is_32021(t: Transport) {
    let s = setup(t).await;
    let c = s.client(); // declares nothing
    let r = c.call_tool("elicit", json!({"message": "name?"})).await;
    assert_eq!(r.status, 400, "{}", body_text(&r));
    let v = r.json();
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert!(
        v["error"]["data"]["requiredCapabilities"]["elicitation"].is_object(),
        "{v}"
    );
    // The gateway still works afterwards (the upstream call was cancelled, not stuck).
    let res = ok_result(&c.call_tool("echo", json!({"text": "after"})).await);
    assert_eq!(first_text(&res), "after");
}

async fn slow_required_without_tasks_is_32021(t: Transport) {
    let s = setup(t).await;
    let r = s
        .client()
        .call_tool("slow_required", json!({"ms": 10}))
        .await;
    assert_eq!(r.status, 400, "{}", body_text(&r));
    let v = r.json();
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"],
        json!({"extensions": {TASKS: {}}}),
        "{v}"
    );
}

async fn tools_list_after_touch_tools(t: Transport) {
    let s = setup(t).await;
    let c = s.client();
    ok_result(&c.request("tools/list", json!({})).await);
    let res = ok_result(&c.call_tool("touch_tools", json!({})).await);
    assert_eq!(first_text(&res), "ok");
    // The cached list is invalidated; fetching again must still work, repeatedly.
    for _ in 0..3 {
        let res = ok_result(&c.request("tools/list", json!({})).await);
        assert_cache_hints(&res);
        assert!(
            res["tools"]
                .as_array()
                .is_some_and(|a| a.iter().any(|t| t["name"] == "echo")),
            "{res}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The taskSupport decision still sees the (re-read) list.
    let r = c.call_tool("slow_required", json!({"ms": 10})).await;
    assert_eq!(r.status, 400, "{}", body_text(&r));
}
