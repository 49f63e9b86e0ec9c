//! 2025-era clients on the same endpoint, over raw HTTP against the real binary
//! (docs/design.md §22 "Clients of the 2025 era"): era precedence, the session
//! lifecycle (initialize from the stored identity, the session bound to its principal,
//! DELETE), forwarded methods with the upstream's answers as sent, calls held with SSE
//! keep-alives, progress with the client's token, server→client requests relayed on
//! the call's stream and answered by a POST, cancellation, the GET stream, and every
//! row of the legacy error table.

mod common;
mod legacy_support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use legacy_support::*;
use serde_json::{Value, json};

async fn demo_gateway(sections: &str) -> Gateway {
    let gw = Gateway::start(&format!(
        "{}{sections}\n{}",
        jwt_auth(),
        demo_stdio_upstream("")
    ))
    .await;
    gw.wait_ready().await;
    gw
}

fn alice() -> Option<String> {
    Some(token("alice", "acme"))
}

fn assert_error(r: &Resp, status: u16, code: i64, id: Option<Value>) {
    assert_eq!(r.status, status, "{}", text(r));
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    match id {
        Some(id) => assert_eq!(v["id"], id, "{v}"),
        None => assert!(v.get("id").is_none_or(Value::is_null), "{v}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lifecycle_and_forwarded_methods() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    let init = c.initialize(json!({})).await;
    let v = init.json();
    assert_eq!(v["id"], 0, "{v}");
    let r = &v["result"];
    assert_eq!(r["protocolVersion"], INIT_VERSION, "{v}");
    assert_eq!(r["serverInfo"]["name"], "taskgate-demo", "{v}");
    assert!(r["instructions"].is_string(), "{v}");
    // Neither task dialect is advertised in this era.
    assert!(r["capabilities"].get("tasks").is_none(), "{v}");
    assert!(r["capabilities"].get("extensions").is_none(), "{v}");
    assert!(r["capabilities"]["tools"].is_object(), "{v}");
    let sid = c.session.clone().unwrap_or_default();
    assert!(
        sid.len() >= 32 && sid.bytes().all(|b| (0x21..0x7f).contains(&b)),
        "{sid:?}"
    );

    let ping = c.request(json!("p"), "ping", json!({})).await;
    assert_eq!(
        ping.json(),
        json!({"jsonrpc": "2.0", "id": "p", "result": {}})
    );

    // The upstream's answers as sent: no 2026 decorations.
    let tools = c.request(json!(2), "tools/list", json!({})).await;
    assert_eq!(tools.status, 200, "{}", text(&tools));
    let t = tools.json();
    assert!(
        t["result"]["tools"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{t}"
    );
    assert!(t["result"].get("resultType").is_none(), "{t}");
    let echo = c
        .request(
            json!(3),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hi"}}),
        )
        .await;
    assert_eq!(echo.status, 200);
    assert_eq!(
        echo.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        echo.json()["result"]["content"][0]["text"],
        "hi",
        "{}",
        text(&echo)
    );
    let prompt = c
        .request(
            json!(4),
            "prompts/get",
            json!({"name": "greeting", "arguments": {"name": "Ann"}}),
        )
        .await;
    assert_eq!(
        prompt.json()["result"]["messages"][0]["content"]["text"],
        "Hello, Ann!"
    );
    let missing = c
        .request(json!(5), "resources/read", json!({"uri": "demo://nope"}))
        .await;
    // The upstream's own error passes through as sent.
    assert_error(&missing, 200, -32002, Some(json!(5)));

    // Hidden until the 2025-11-25 task dialect is translated: 404 -32601.
    for m in ["tasks/get", "tasks/list", "tasks/result", "tasks/cancel"] {
        let r = c.request(json!(6), m, json!({"taskId": "x"})).await;
        assert_error(&r, 404, -32601, Some(json!(6)));
    }
    let unknown = c.request(json!(7), "no/such", json!({})).await;
    assert_error(&unknown, 200, -32601, Some(json!(7)));
    let discover = c.request(json!(8), "server/discover", json!({})).await;
    assert_error(&discover, 200, -32601, Some(json!(8)));

    // DELETE ends the session; it is then unknown.
    let del = raw(&c.url, "DELETE", &c.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(del.status, 204, "{}", text(&del));
    let after = c.request(json!(9), "ping", json!({})).await;
    assert_error(&after, 404, -32600, Some(json!(9)));
    let again = raw(&c.url, "DELETE", &c.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(again.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiation_and_precedence() {
    let gw = demo_gateway("").await;
    let c = Legacy::new(&gw, alice());
    for (asked, answered) in [
        ("2025-03-26", "2025-03-26"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
    ] {
        let r = c
            .post(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "n", "version": "1"}
            }}))
            .await;
        assert_eq!(r.json()["result"]["protocolVersion"], answered, "{asked}");
    }
    // A 2026 marker wins: initialize with the 2026 header is §12's 404.
    let mut h = c.headers();
    h.push(("mcp-protocol-version", "2026-07-28".into()));
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "n", "version": "1"}
    }});
    let r = c.post_with(&h, init.to_string()).await;
    assert_error(&r, 404, -32601, Some(json!(1)));
    assert!(r.header("mcp-session-id").is_none());
    // A 2026 client that sends a session id is served as a 2026 client.
    let c26 = Client2026::new(&gw, "/mcp", alice());
    let mut h = c26.headers("tools/list", &json!({}));
    h.push(("mcp-session-id", "whatever".into()));
    let body = c26.body(json!(2), "tools/list", &json!({}));
    let r = c.post_with(&h, body.to_string()).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["result"]["resultType"], "complete");
    // The `_meta` key wins over a session and a 2025 header: the 2026 path's -32022.
    let h = vec![
        ("content-type", "application/json".to_string()),
        ("accept", "application/json, text/event-stream".to_string()),
        (
            "authorization",
            format!("Bearer {}", token("alice", "acme")),
        ),
        ("mcp-session-id", "whatever".into()),
        ("mcp-protocol-version", "2025-06-18".into()),
        ("mcp-method", "tools/list".into()),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2025-06-18",
            "io.modelcontextprotocol/clientCapabilities": {}}}});
    let r = c.post_with(&h, body.to_string()).await;
    assert_error(&r, 400, -32022, Some(json!(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_its_principal() {
    let gw = demo_gateway("").await;
    let mut a = Legacy::new(&gw, alice());
    a.initialize(json!({})).await;
    let mut bob = Legacy::new(&gw, Some(token("bob", "acme")));
    bob.session = a.session.clone();
    bob.version = a.version.clone();
    let foreign = bob.request(json!(1), "tools/list", json!({})).await;
    let mut nobody = Legacy::new(&gw, Some(token("bob", "acme")));
    nobody.session = Some("mcs_never-issued-0000000000000000000000000000".into());
    nobody.version = a.version.clone();
    let unknown = nobody.request(json!(1), "tools/list", json!({})).await;
    assert_error(&foreign, 404, -32600, Some(json!(1)));
    assert_eq!(
        foreign.body, unknown.body,
        "a foreign session reads like an unknown one"
    );
    // Another tenant, same subject name: the same.
    let mut other = Legacy::new(&gw, Some(token("alice", "other")));
    other.session = a.session.clone();
    assert_eq!(
        other.request(json!(1), "tools/list", json!({})).await.body,
        unknown.body
    );
    // Bob's DELETE and GET cannot touch it either.
    let del = raw(&bob.url, "DELETE", &bob.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(del.status, 404);
    let get = raw(&bob.url, "GET", &bob.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(get.status, 404);
    // Every request is still authenticated: the session is no credential.
    let mut anon = Legacy::new(&gw, None);
    anon.session = a.session.clone();
    assert_eq!(anon.request(json!(1), "ping", json!({})).await.status, 401);
    // The owner's session still works.
    let ok = a.request(json!(2), "ping", json!({})).await;
    assert_eq!(ok.status, 200, "{}", text(&ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_error_table() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    // Malformed JSON → 400 -32700; an invalid envelope → 400 -32600 (id echoed).
    let r = c.post_with(&c.headers(), "{\"jsonrpc\":".into()).await;
    assert_error(&r, 400, -32700, None);
    let r = c
        .post(json!({"jsonrpc": "1.0", "id": 4, "method": "ping"}))
        .await;
    assert_error(&r, 400, -32600, Some(json!(4)));
    let r = c
        .post(json!({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": [1]}))
        .await;
    assert_error(&r, 400, -32600, Some(json!(5)));
    // An unsupported MCP-Protocol-Version after initialize → 400.
    let mut h = c.headers();
    h.retain(|(k, _)| *k != "mcp-protocol-version");
    h.push(("mcp-protocol-version", "2024-11-05".into()));
    let r = c
        .post_with(
            &h,
            json!({"jsonrpc": "2.0", "id": 6, "method": "ping"}).to_string(),
        )
        .await;
    assert_error(&r, 400, -32600, Some(json!(6)));
    assert!(r.json()["error"]["data"]["supported"].is_array());
    // Without the header the 2025-03-26 default is assumed: accepted.
    h.retain(|(k, _)| *k != "mcp-protocol-version");
    let r = c
        .post_with(
            &h,
            json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}).to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    // A 2025 version header but no session → 400.
    let mut nos = Legacy::new(&gw, alice());
    nos.version = Some(INIT_VERSION.into());
    let r = nos.request(json!(8), "tools/list", json!({})).await;
    assert_error(&r, 400, -32600, Some(json!(8)));
    // A batch outside 2025-03-26 → 400 -32600.
    let r = c
        .post(json!([{"jsonrpc": "2.0", "id": 9, "method": "ping"}]))
        .await;
    assert_error(&r, 400, -32600, Some(json!(9)));
    // GET without a session is no era's: 405. GET whose Accept refuses SSE: 406.
    let r = raw(&c.url, "GET", &nos.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    let mut h = c.headers();
    h.retain(|(k, _)| *k != "accept");
    h.push(("accept", "application/json".into()));
    let r = raw(&c.url, "GET", &h, Bytes::new()).await.unwrap();
    assert_eq!(r.status, 406);
    // No token → 401, as in every era.
    let mut anon = Legacy::new(&gw, None);
    anon.session = c.session.clone();
    let r = raw(&anon.url, "GET", &anon.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    // A client's response to nothing it was asked is acknowledged and ignored.
    let r = c
        .post(json!({"jsonrpc": "2.0", "id": "g-999", "result": {}}))
        .await;
    assert_eq!(r.status, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_2025_03_26() {
    let gw = demo_gateway("").await;
    let c = Legacy::new(&gw, alice());
    let r = c
        .post(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}
        }}))
        .await;
    let mut c = c;
    c.session = r.header("mcp-session-id");
    let r = c
        .post(json!([
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "b"}}}
        ]))
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let v = r.json();
    let answers = v.as_array().cloned().unwrap_or_default();
    assert_eq!(answers.len(), 2, "{v}");
    assert_eq!(answers[0]["id"], 1);
    assert_eq!(answers[1]["result"]["content"][0]["text"], "b", "{v}");
    let r = c
        .post(json!([{"jsonrpc": "2.0", "method": "notifications/initialized"}]))
        .await;
    assert_eq!(r.status, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_call_streams_progress_and_keepalives() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    let body = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 2500, "steps": 2}, "_meta": {"progressToken": "tok-1"}}});
    let mut ev = c.open("POST", body).await;
    assert_eq!(ev.status, 200);
    assert_eq!(
        ev.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let mut progress = Vec::new();
    let final_msg = loop {
        let Some(m) = ev.next(Duration::from_secs(20)).await else {
            panic!("stream ended without an answer")
        };
        if m["method"] == "notifications/progress" {
            progress.push(m["params"].clone());
        } else if m.get("id").is_some() {
            break m;
        }
    };
    assert_eq!(final_msg["id"], 11);
    assert_eq!(
        final_msg["result"]["content"][0]["text"], "slept 2500 ms",
        "{final_msg}"
    );
    assert_eq!(progress.len(), 2, "{progress:?}");
    assert!(
        progress.iter().all(|p| p["progressToken"] == "tok-1"),
        "{progress:?}"
    );
    assert!(ev.comments >= 1, "keep-alive comments while held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_timeout_ends_the_call_with_32603() {
    let gw = demo_gateway("[tasks]\nsync_timeout_ms = 2000\n").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    let body = json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 20000}}});
    let mut ev = c.open("POST", body).await;
    let last = loop {
        match ev.next(Duration::from_secs(20)).await {
            Some(m) if m.get("id").is_some() => break m,
            Some(_) => {}
            None => panic!("no final event"),
        }
    };
    assert_eq!(last["id"], 12);
    assert_eq!(last["error"]["code"], -32603, "{last}");
    assert!(
        last["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("sync_timeout_ms")),
        "{last}"
    );
    assert!(
        ev.next(Duration::from_secs(5)).await.is_none(),
        "the stream ends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elicitation_is_relayed_and_answered_on_the_session() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({"elicitation": {}})).await;
    let body = json!({"jsonrpc": "2.0", "id": 13, "method": "tools/call", "params": {
        "name": "elicit", "arguments": {}}});
    let mut ev = c.open("POST", body).await;
    let ask = loop {
        match ev.next(Duration::from_secs(20)).await {
            Some(m) if m["method"] == "elicitation/create" => break m,
            Some(_) => {}
            None => panic!("no elicitation relayed"),
        }
    };
    let gid = ask["id"].clone();
    assert!(gid.is_string(), "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": gid, "result": {"action": "accept", "content": {"answer": "42"}}});
    let r = c.post(answer).await;
    assert_eq!(r.status, 202, "{}", text(&r));
    let done = loop {
        match ev.next(Duration::from_secs(20)).await {
            Some(m) if m.get("id") == Some(&json!(13)) => break m,
            Some(_) => {}
            None => panic!("no answer"),
        }
    };
    let out = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(out.contains("accept") && out.contains("42"), "{done}");

    // A session that did not declare elicitation is never asked: the upstream hears
    // -32601 and the tool reports it.
    let mut plain = Legacy::new(&gw, alice());
    plain.initialize(json!({})).await;
    let r = plain
        .request(
            json!(14),
            "tools/call",
            json!({"name": "elicit", "arguments": {}}),
        )
        .await;
    let v = r.json();
    assert_eq!(v["id"], 14, "{v}");
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("failed")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_notification_stops_the_upstream_call() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    let body = json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 30000}}});
    let started = Instant::now();
    let mut ev = c.open("POST", body).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = c
        .post(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": "slow", "reason": "user"}}),
        )
        .await;
    assert_eq!(r.status, 202);
    // The held stream ends well before the call would have.
    while ev.next(Duration::from_secs(20)).await.is_some() {}
    assert!(started.elapsed() < Duration::from_secs(20));
    // The upstream is free again.
    let r = c
        .request(
            json!(2),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "after"}}),
        )
        .await;
    assert_eq!(r.json()["result"]["content"][0]["text"], "after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_relays_list_changed() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    let mut get = Events::open(&c.url, "GET", &c.headers(), String::new()).await;
    assert_eq!(get.status, 200);
    let r = c
        .request(
            json!(1),
            "tools/call",
            json!({"name": "touch_tools", "arguments": {}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let n = get.next(Duration::from_secs(10)).await;
    assert_eq!(
        n.as_ref().map(|n| n["method"].clone()),
        Some(json!("notifications/tools/list_changed")),
        "{n:?}"
    );
    // Resource updates reach the sessions that subscribed, and only those; the
    // upstream holds one subscription whoever asked (two sessions subscribe, one
    // leaves, the other still hears).
    let mut other = Legacy::new(&gw, Some(token("bob", "acme")));
    other.initialize(json!({})).await;
    let mut other_get = Events::open(&other.url, "GET", &other.headers(), String::new()).await;
    let mut third = Legacy::new(&gw, alice());
    third.initialize(json!({})).await;
    let mut third_get = Events::open(&third.url, "GET", &third.headers(), String::new()).await;
    for s in [&c, &third] {
        let r = s
            .request(
                json!(2),
                "resources/subscribe",
                json!({"uri": "demo://counter"}),
            )
            .await;
        assert_eq!(r.json()["result"], json!({}), "{}", text(&r));
    }
    let u = third
        .request(
            json!(3),
            "resources/unsubscribe",
            json!({"uri": "demo://counter"}),
        )
        .await;
    assert_eq!(u.json()["result"], json!({}), "{}", text(&u));
    let r = c
        .request(
            json!(1),
            "tools/call",
            json!({"name": "counter", "arguments": {}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let n = get.next(Duration::from_secs(10)).await;
    assert_eq!(
        n,
        Some(
            json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
            "params": {"uri": "demo://counter"}})
        )
    );
    assert_eq!(
        other_get.next(Duration::from_secs(2)).await,
        None,
        "bob never subscribed"
    );
    assert_eq!(
        third_get.next(Duration::from_secs(1)).await,
        None,
        "unsubscribed"
    );
    // logging/setLevel: a level is checked, then answered {}.
    let bad = c
        .request(json!(4), "logging/setLevel", json!({"level": "loud"}))
        .await;
    assert_error(&bad, 200, -32602, Some(json!(4)));
    let ok = c
        .request(json!(5), "logging/setLevel", json!({"level": "error"}))
        .await;
    assert_eq!(ok.json()["result"], json!({}), "{}", text(&ok));
    // DELETE ends the GET stream too.
    let del = raw(&c.url, "DELETE", &c.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(del.status, 204);
    assert!(
        get.next(Duration::from_secs(10)).await.is_none(),
        "stream ended"
    );
}

/// A session outlives its gateway: after a restart on the same store the same
/// `Mcp-Session-Id` is served, and the first GET stream re-subscribes what the session
/// record lists (docs/design.md §22).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_continues_across_a_restart() {
    let gw = demo_gateway("").await;
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    let s = c
        .request(
            json!(1),
            "resources/subscribe",
            json!({"uri": "demo://counter"}),
        )
        .await;
    assert_eq!(s.json()["result"], json!({}), "{}", text(&s));

    let Gateway {
        proc,
        dir,
        config_path,
        ..
    } = gw;
    proc.sigterm();
    let mut proc = proc;
    let start = Instant::now();
    while proc.child.try_wait().ok().flatten().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gateway did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(proc);
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let mut again = Legacy::new(&gw, alice());
    again.session = c.session.clone();
    again.version = c.version.clone();
    let ping = again.request(json!(2), "ping", json!({})).await;
    assert_eq!(ping.status, 200, "{}\n{}", text(&ping), gw.proc.log_text());
    let mut get = Events::open(&again.url, "GET", &again.headers(), String::new()).await;
    assert_eq!(get.status, 200);
    let r = again
        .request(
            json!(3),
            "tools/call",
            json!({"name": "counter", "arguments": {}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let n = get.next(Duration::from_secs(10)).await;
    assert_eq!(
        n.as_ref().map(|n| n["method"].clone()),
        Some(json!("notifications/resources/updated")),
        "{n:?}"
    );
    // Another principal still cannot use it.
    let mut bob = Legacy::new(&gw, Some(token("bob", "acme")));
    bob.session = c.session.clone();
    assert_eq!(bob.request(json!(4), "ping", json!({})).await.status, 404);
}

/// `isolation = "session"`: each client session gets an upstream child of its own
/// (the demo counts per child), ended with the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_isolation_gives_each_session_its_own_upstream() {
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_auth(),
        demo_stdio_upstream("isolation = \"session\"\nstdio_processes = 1\n")
    ))
    .await;
    gw.wait_ready().await;
    let count = |r: &Resp| first_text(&r.json()["result"]);
    let mut a = Legacy::new(&gw, alice());
    a.initialize(json!({})).await;
    let mut b = Legacy::new(&gw, alice());
    b.initialize(json!({})).await;
    let counter = json!({"name": "counter", "arguments": {}});
    for want in ["count=1", "count=2"] {
        let r = a.request(json!(1), "tools/call", counter.clone()).await;
        assert_eq!(count(&r), want, "{}", text(&r));
    }
    let r = b.request(json!(1), "tools/call", counter.clone()).await;
    assert_eq!(
        count(&r),
        "count=1",
        "b has a child of its own: {}",
        text(&r)
    );
    let children = child_processes(gw.pid()).len();
    // DELETE ends the session's child at once.
    let del = raw(&a.url, "DELETE", &a.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(del.status, 204);
    let gone = eventually_async(Duration::from_secs(20), || async {
        child_processes(gw.pid()).len() < children
    })
    .await;
    assert!(gone, "a's child still runs:\n{}", gw.proc.log_text());
    let r = b.request(json!(2), "tools/call", counter.clone()).await;
    assert_eq!(count(&r), "count=2", "{}", text(&r));
}

/// `[legacy] max_sessions_per_principal`: at the cap a new session closes the least
/// recently seen idle one; when every session is in use (a GET stream open here) the
/// new one is refused with 429 + `Retry-After`, `-32005`; other principals are not
/// affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_capped_per_principal() {
    let gw = demo_gateway("[legacy]\nmax_sessions_per_principal = 2\n").await;
    let mut a = Legacy::new(&gw, alice());
    a.initialize(json!({})).await;
    // Last-seen times are in milliseconds: two sessions opened within one would tie,
    // and the premise below is that `b` is the newer.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut b = Legacy::new(&gw, alice());
    b.initialize(json!({})).await;
    // `b` was seen last: `a` is the one a third session evicts.
    let mut c = Legacy::new(&gw, alice());
    c.initialize(json!({})).await;
    assert_eq!(a.request(json!(1), "ping", json!({})).await.status, 404);
    assert_eq!(b.request(json!(1), "ping", json!({})).await.status, 200);
    // Both sessions in use: the next one is refused.
    let _gb = Events::open(&b.url, "GET", &b.headers(), String::new()).await;
    let _gc = Events::open(&c.url, "GET", &c.headers(), String::new()).await;
    let refused = Legacy::new(&gw, alice())
        .post(
            json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {
            "protocolVersion": INIT_VERSION, "capabilities": {},
            "clientInfo": {"name": "n", "version": "1"}}}),
        )
        .await;
    assert_error(&refused, 429, -32005, Some(json!(9)));
    assert!(
        refused.header("retry-after").is_some(),
        "{:?}",
        refused.headers
    );
    assert!(refused.header("mcp-session-id").is_none());
    // Another principal has a cap of its own.
    let mut other = Legacy::new(&gw, Some(token("bob", "acme")));
    other.initialize(json!({})).await;
    let m = raw(&gw.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    let metrics = text(&m);
    assert!(
        metrics.contains("taskgate_legacy_sessions_total{event=\"evicted\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("taskgate_legacy_sessions_total{event=\"refused\"} 1"),
        "{metrics}"
    );
}

/// `logging/setLevel` over a shared upstream session: the upstream is set to the most
/// verbose level any session asked for, and each session hears only its own level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_levels_are_per_session() {
    let gw = demo_gateway("").await;
    let mut verbose = Legacy::new(&gw, alice());
    verbose.initialize(json!({})).await;
    let mut quiet = Legacy::new(&gw, alice());
    quiet.initialize(json!({})).await;
    for (s, level) in [(&verbose, "debug"), (&quiet, "error")] {
        let r = s
            .request(json!(1), "logging/setLevel", json!({"level": level}))
            .await;
        assert_eq!(r.json()["result"], json!({}), "{}", text(&r));
    }
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 300}}});
    // The demo logs "sleep started" at info: the debug session hears it...
    let mut ev = verbose.open("POST", call.clone()).await;
    let mut logs = Vec::new();
    loop {
        match ev.next(Duration::from_secs(20)).await {
            Some(m) if m["method"] == "notifications/message" => logs.push(m["params"].clone()),
            Some(m) if m.get("id").is_some() => break,
            Some(_) => {}
            None => panic!("no answer"),
        }
    }
    assert!(
        logs.iter().any(|l| l["level"] == "info"),
        "the debug session hears info: {logs:?}"
    );
    // ...the error session does not: a quiet, quick call is one JSON answer.
    let r = quiet.post(call).await;
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json"),
        "{}",
        text(&r)
    );
    assert_eq!(first_text(&r.json()["result"]), "slept 300 ms");
}
