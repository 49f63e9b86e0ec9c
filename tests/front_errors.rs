//! One test per row of the HTTP front's error table (docs/design.md §12 "HTTP front";
//! README "Bad input"), against the real binary: status code, JSON-RPC code, id echo.

mod common;

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};

async fn gateway() -> Gateway {
    Gateway::start(&format!("{}{}", jwt_auth(), demo_stdio_upstream(""))).await
}

fn client(gw: &Gateway) -> Client2026 {
    Client2026::new(gw, "/mcp", Some(token("alice", "acme")))
}

async fn post_raw(gw: &Gateway, headers: Vec<(&'static str, String)>, body: &str) -> Resp {
    raw(
        &gw.url("/mcp"),
        "POST",
        &headers,
        Bytes::from(body.to_string()),
    )
    .await
    .unwrap()
}

fn assert_rpc_error(r: &Resp, status: u16, code: i64, id: Option<Value>) {
    assert_eq!(
        r.status,
        status,
        "body: {}",
        String::from_utf8_lossy(&r.body)
    );
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["jsonrpc"], "2.0");
    match id {
        Some(id) => assert_eq!(v["id"], id, "{v}"),
        None => assert!(v.get("id").is_none(), "{v}"),
    }
}

#[tokio::test]
async fn error_table() {
    let gw = gateway().await;
    let c = client(&gw);
    let list = json!({});
    let good = c.body(json!(7), "tools/list", &list);

    // GET and DELETE → 405 with Allow: POST.
    for m in ["GET", "DELETE", "PUT"] {
        let r = raw(
            &gw.url("/mcp"),
            m,
            &c.headers("tools/list", &list),
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 405, "{m}");
        assert_eq!(r.header("allow").as_deref(), Some("POST"));
    }

    // Unknown path → 404.
    let r = raw(
        &gw.url("/nope"),
        "POST",
        &c.headers("tools/list", &list),
        Bytes::from(good.to_string()),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);

    // Content-Type → 415.
    let mut h = c.headers("tools/list", &list);
    h.retain(|(k, _)| *k != "content-type");
    h.push(("content-type", "text/plain".into()));
    assert_eq!(post_raw(&gw, h, &good.to_string()).await.status, 415);

    // Accept without SSE → 406.
    let mut h = c.headers("tools/list", &list);
    h.retain(|(k, _)| *k != "accept");
    h.push(("accept", "application/json".into()));
    assert_eq!(post_raw(&gw, h, &good.to_string()).await.status, 406);

    // Body over the cap (1 MiB default) → 413.
    let big = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta": meta(json!({})), "pad": "x".repeat(1_100_000)}});
    assert_eq!(
        post_raw(&gw, c.headers("tools/list", &list), &big.to_string())
            .await
            .status,
        413
    );

    // Parse error → 400 -32700 without id.
    let r = post_raw(&gw, c.headers("tools/list", &list), "{\"jsonrpc\":").await;
    assert_rpc_error(&r, 400, -32700, None);

    // Batch → 400 -32600.
    let r = post_raw(&gw, c.headers("tools/list", &list), &format!("[{good}]")).await;
    assert_rpc_error(&r, 400, -32600, None);

    // Envelope error (wrong jsonrpc) → 400 -32600 with the id echoed.
    let mut bad = good.clone();
    bad["jsonrpc"] = json!("1.0");
    let r = post_raw(&gw, c.headers("tools/list", &list), &bad.to_string()).await;
    assert_rpc_error(&r, 400, -32600, Some(json!(7)));

    // A JSON-RPC response from a client → 400 -32600.
    let r = post_raw(
        &gw,
        c.headers("tools/list", &list),
        r#"{"jsonrpc":"2.0","id":"r1","result":{}}"#,
    )
    .await;
    assert_rpc_error(&r, 400, -32600, Some(json!("r1")));

    // Missing MCP-Protocol-Version header → 400 -32020.
    let mut h = c.headers("tools/list", &list);
    h.retain(|(k, _)| *k != "mcp-protocol-version");
    let r = post_raw(&gw, h, &good.to_string()).await;
    assert_rpc_error(&r, 400, -32020, Some(json!(7)));

    // Mcp-Method mismatch → 400 -32020.
    let mut h = c.headers("tools/list", &list);
    h.retain(|(k, _)| *k != "mcp-method");
    h.push(("mcp-method", "prompts/list".into()));
    let r = post_raw(&gw, h, &good.to_string()).await;
    assert_rpc_error(&r, 400, -32020, Some(json!(7)));

    // Mcp-Name mismatch (plain and base64-encoded) → 400 -32020.
    let call = json!({"name": "echo", "arguments": {"text": "hi"}});
    let body = c.body(json!("n"), "tools/call", &call);
    let mut h = c.headers("tools/call", &call);
    h.retain(|(k, _)| *k != "mcp-name");
    h.push(("mcp-name", "other".into()));
    assert_rpc_error(
        &post_raw(&gw, h.clone(), &body.to_string()).await,
        400,
        -32020,
        Some(json!("n")),
    );
    h.retain(|(k, _)| *k != "mcp-name");
    h.push(("mcp-name", "=?base64?b3RoZXI=?=".into()));
    assert_rpc_error(
        &post_raw(&gw, h, &body.to_string()).await,
        400,
        -32020,
        Some(json!("n")),
    );

    // Missing _meta → 400 -32602.
    let no_meta = json!({"jsonrpc":"2.0","id":8,"method":"tools/list","params":{}});
    let r = post_raw(&gw, c.headers("tools/list", &list), &no_meta.to_string()).await;
    assert_rpc_error(&r, 400, -32602, Some(json!(8)));

    // Unsupported version → 400 -32022 with supported/requested.
    let mut old = good.clone();
    old["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2025-06-18");
    let mut h = c.headers("tools/list", &list);
    h.retain(|(k, _)| *k != "mcp-protocol-version");
    h.push(("mcp-protocol-version", "2025-06-18".into()));
    let r = post_raw(&gw, h, &old.to_string()).await;
    assert_rpc_error(&r, 400, -32022, Some(json!(7)));
    let v = r.json();
    assert_eq!(v["error"]["data"]["supported"], json!(["2026-07-28"]));
    assert_eq!(v["error"]["data"]["requested"], "2025-06-18");

    // Unknown and removed methods → 404 -32601.
    for m in [
        "nope/nothing",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "tasks/result",
        "tasks/list",
    ] {
        let body = c.body(json!(m), m, &json!({}));
        let r = post_raw(&gw, c.headers(m, &json!({})), &body.to_string()).await;
        assert_rpc_error(&r, 404, -32601, Some(json!(m)));
    }
    // initialize → 404 -32601 naming the supported versions.
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}});
    let r = post_raw(&gw, c.headers("initialize", &json!({})), &init.to_string()).await;
    assert_rpc_error(&r, 404, -32601, Some(json!(0)));
    assert_eq!(
        r.json()["error"]["data"]["supported"],
        json!(["2026-07-28"])
    );

    // Missing capability: tasks/get without the extension → 400 -32021.
    let tg = json!({"taskId": "tsk_AAAAAAAAAAAAAAAAAAAAAA"});
    let r = c
        .send("tasks/get", &tg, &c.body(json!(9), "tasks/get", &tg))
        .await;
    assert_rpc_error(&r, 400, -32021, Some(json!(9)));
    assert_eq!(
        r.json()["error"]["data"]["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({})
    );

    // Notifications → 202, empty body.
    let n = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}});
    let r = post_raw(
        &gw,
        c.headers("notifications/cancelled", &json!({})),
        &n.to_string(),
    )
    .await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());

    // Origin not allowed → 403; Host not allowed → 403.
    let mut h = c.headers("tools/list", &list);
    h.push(("origin", "http://evil.example.com".into()));
    assert_eq!(post_raw(&gw, h, &good.to_string()).await.status, 403);
    let mut h = c.headers("tools/list", &list);
    h.push(("host", "evil.example.com".into()));
    assert_eq!(post_raw(&gw, h, &good.to_string()).await.status, 403);
}

#[tokio::test]
async fn discover_and_session_headers() {
    let gw = gateway().await;
    gw.wait_ready().await;
    let c = client(&gw);
    let mut h = c.headers("server/discover", &json!({}));
    h.push(("mcp-session-id", "client-made-up".into()));
    let body = c.body(json!("d"), "server/discover", &json!({}));
    let r = post_raw(&gw, h, &body.to_string()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.header("mcp-session-id").is_none(),
        "the gateway never mints sessions"
    );
    let v = r.json();
    assert_eq!(v["id"], "d");
    let res = &v["result"];
    assert_eq!(res["resultType"], "complete");
    assert_eq!(res["supportedVersions"], json!(["2026-07-28"]));
    assert_eq!(
        res["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({})
    );
    assert!(res["ttlMs"].is_u64());
    assert!(res["cacheScope"].is_string());
    assert_eq!(
        res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "taskgate-demo"
    );
}

/// Headers for a raw `tools/call` of `tool` (the body is written by hand, so that its
/// numbers and nesting are exactly what the test says).
fn call_headers(c: &Client2026, tool: &str) -> Vec<(&'static str, String)> {
    c.headers("tools/call", &json!({"name": tool}))
}

fn raw_call(tool: &str, id: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments},"_meta":{}}}}}"#,
        meta(json!({}))
    )
}

#[tokio::test]
async fn extreme_numbers_reach_the_upstream_unchanged() {
    let gw = gateway().await;
    let c = client(&gw);
    let args = r#"{"huge":1e999,"negzero":-0,"long":123456789012345678901234567890,"exact":1.10,"tiny":-1E-400}"#;
    let r = post_raw(
        &gw,
        call_headers(&c, "echo_arguments"),
        &raw_call("echo_arguments", "5", args),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["id"], 5, "{v}");
    // The demo upstream echoes the arguments it received as JSON text: every digit,
    // sign and trailing zero arrived; exponents are spelled one way (`e+`/`e-`), the
    // same JSON numbers.
    let expected = r#"{"huge":1e+999,"negzero":-0,"long":123456789012345678901234567890,"exact":1.10,"tiny":-1e-400}"#;
    assert_eq!(first_text(&v["result"]), expected, "{v}");
}

#[tokio::test]
async fn negative_zero_id_is_echoed_as_zero() {
    let gw = gateway().await;
    let c = client(&gw);
    let r = post_raw(
        &gw,
        call_headers(&c, "echo"),
        &raw_call("echo", "-0", r#"{"text":"z"}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains(r#""id":0,"#), "{text}");
    assert_eq!(first_text(&r.json()["result"]), "z");
}

#[tokio::test]
async fn nesting_past_the_parser_limit_is_invalid_request_with_id() {
    let gw = gateway().await;
    let c = client(&gw);
    let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
    let r = post_raw(
        &gw,
        call_headers(&c, "echo_arguments"),
        &raw_call("echo_arguments", r#""deep""#, &format!(r#"{{"x":{deep}}}"#)),
    )
    .await;
    assert_rpc_error(&r, 400, -32600, Some(json!("deep")));
    // Nested within the limit, the same call is served.
    let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let args = format!(r#"{{"x":{ok}}}"#);
    let r = post_raw(
        &gw,
        call_headers(&c, "echo_arguments"),
        &raw_call("echo_arguments", "2", &args),
    )
    .await;
    assert_eq!(first_text(&r.json()["result"]), args);
}
