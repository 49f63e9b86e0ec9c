//! The client-facing HTTP front through the real binary (docs/design.md §12 "HTTP
//! front"): DNS rebinding protection and CORS, the JSON-or-SSE choice with keep-alives,
//! header and body read timeouts, and "a client that goes away cancels the upstream
//! call".

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

per_transport!(
    json_or_sse_with_keepalive,
    client_disconnect_cancels_upstream_call,
    sync_timeout_cancels_and_answers_32021,
    sync_timeout_shorter_than_keepalive_answers_400_before_any_header,
    sync_timeout_after_sse_headers_is_the_final_event,
);

fn body_text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

async fn http_gateway(server_extra: &str) -> DemoSetup {
    let s = DemoSetup::start(Transport::Http, server_extra, "").await;
    s.gw.wait_ready().await;
    s
}

/// `server/discover` with extra headers (replacing same-named defaults).
async fn discover_with_headers(s: &DemoSetup, extra: &[(&'static str, String)]) -> Resp {
    let c = s.client();
    let params = json!({});
    let mut h = c.headers("server/discover", &params);
    h.retain(|(k, _)| !extra.iter().any(|(e, _)| e.eq_ignore_ascii_case(k)));
    h.extend(extra.iter().cloned());
    raw(
        &c.url,
        "POST",
        &h,
        Bytes::from(c.body(json!(1), "server/discover", &params).to_string()),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_rebinding_origin_and_host() {
    let s = http_gateway("").await;
    // Foreign Origin / Host → 403, before auth (no token needed to be refused).
    for (k, v) in [
        ("origin", "http://evil.example"),
        ("origin", "https://evil.example:443"),
        ("origin", "null"),
        ("origin", "http://localhost.evil.example"),
        ("origin", "http://127.0.0.1.evil.example"),
        ("host", "evil.example"),
        ("host", "evil.example:8080"),
        ("host", "localhost.evil.example"),
    ] {
        let r = discover_with_headers(&s, &[(k, v.to_string())]).await;
        assert_eq!(r.status, 403, "{k}: {v}: {}", body_text(&r));
        assert!(r.json().get("result").is_none());
        let r = raw(
            &s.gw.url("/mcp"),
            "POST",
            &[(k, v.to_string())],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 403, "{k}: {v} without token");
    }
    // Loopback origins (any port) and loopback hosts are allowed.
    for (k, v) in [
        ("origin", "http://localhost:5173".to_string()),
        ("origin", "http://127.0.0.1:9".to_string()),
        ("origin", "http://[::1]:3000".to_string()),
        ("host", format!("localhost:{}", s.gw.addr.port())),
        ("host", format!("127.0.0.1:{}", s.gw.addr.port())),
    ] {
        let r = discover_with_headers(&s, &[(k, v.clone())]).await;
        assert_eq!(r.status, 200, "{k}: {v}: {}", body_text(&r));
    }
    // Preflight from a foreign origin is refused.
    let r = raw(
        &s.gw.url("/mcp"),
        "OPTIONS",
        &[
            ("origin", "http://evil.example".into()),
            ("access-control-request-method", "POST".into()),
        ],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    assert!(r.header("access-control-allow-origin").is_none());
}

const APP: &str = "https://app.example";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_and_hosts_admit_and_preflight_is_answered() {
    let s = http_gateway(&format!(
        "allowed_origins = [\"{APP}\"]\nallowed_hosts = [\"mcp.example\"]\n"
    ))
    .await;
    let r = discover_with_headers(&s, &[("origin", APP.to_string())]).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    let r = discover_with_headers(&s, &[("origin", "https://other.example".into())]).await;
    assert_eq!(r.status, 403, "{}", body_text(&r));
    let r =
        discover_with_headers(&s, &[("host", format!("mcp.example:{}", s.gw.addr.port()))]).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    let r = discover_with_headers(&s, &[("host", "mcp.example".into())]).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));

    // Preflight: no token, answered with CORS headers for that origin.
    let r = raw(
        &s.gw.url("/mcp"),
        "OPTIONS",
        &[
            ("origin", APP.into()),
            ("access-control-request-method", "POST".into()),
            (
                "access-control-request-headers",
                "authorization, content-type, mcp-protocol-version, mcp-method, mcp-name".into(),
            ),
        ],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert!(
        r.status == 204 || r.status == 200,
        "{}: {:?}",
        r.status,
        r.headers
    );
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some(APP)
    );
    let methods = r.header("access-control-allow-methods").unwrap_or_default();
    assert!(methods.contains("POST"), "{methods}");
    let allow_headers = r
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    for h in [
        "authorization",
        "content-type",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
    ] {
        assert!(
            allow_headers.contains(h),
            "{h} missing from {allow_headers}"
        );
    }
}

/// A browser can only read the POST answer if it carries CORS headers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_actual_response_carries_allow_origin() {
    let s = http_gateway(&format!("allowed_origins = [\"{APP}\"]\n")).await;
    let r = discover_with_headers(&s, &[("origin", APP.to_string())]).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some(APP),
        "POST response to an admitted browser origin lacks CORS headers: {:?}",
        r.headers
    );
    // Error answers (here: 401 without a token) must be readable by the browser too,
    // or it cannot see the WWW-Authenticate challenge.
    let c = Client2026::new(&s.gw, "/mcp", None);
    let params = json!({});
    let mut h = c.headers("server/discover", &params);
    h.push(("origin", APP.into()));
    let r = raw(
        &c.url,
        "POST",
        &h,
        Bytes::from(c.body(json!(1), "server/discover", &params).to_string()),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some(APP)
    );
    let expose = r
        .header("access-control-expose-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(expose.contains("www-authenticate"), "expose: {expose:?}");
}

async fn json_or_sse_with_keepalive(t: Transport) {
    let s = DemoSetup::start(t, "", "").await;
    s.gw.wait_ready().await;
    let c = s.client();

    // Fast → application/json.
    let r = c.call_tool("echo", json!({"text": "fast"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(first_text(&r.json()["result"]), "fast");

    // Slower than keepalive_ms (1000), no progress asked → SSE with keep-alives.
    let r = c.call_tool("sleep", json!({"ms": 2500})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert!(r.is_sse(), "{:?}", r.headers);
    assert_eq!(r.header("cache-control").as_deref(), Some("no-cache"));
    assert_eq!(r.header("x-accel-buffering").as_deref(), Some("no"));
    let text = body_text(&r);
    assert!(
        text.lines().any(|l| l.starts_with(':')),
        "no keep-alive comment: {text:?}"
    );
    assert!(!text.lines().any(|l| l.starts_with("id:")), "{text:?}");
    // No notifications were asked for, so the only message is the final result, last.
    let msgs = r.sse_messages();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["id"], 1);
    assert_eq!(first_text(&msgs[0]["result"]), "slept 2500 ms");
    let last_block = text
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .last()
        .unwrap();
    assert!(
        last_block.contains("\"slept 2500 ms\""),
        "last event: {last_block:?}"
    );
}

/// Read from `s` until EOF/reset (→ Ok(bytes read)) or `limit` passes (→ Err).
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    Err(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_read_timeout_closes_connection() {
    let s = http_gateway("header_timeout_ms = 500\n").await;
    let mut stalled = TcpStream::connect(s.gw.addr).await.unwrap();
    stalled
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        .await
        .unwrap();
    // A well-behaved client is still served meanwhile.
    let r = s.client().call_tool("echo", json!({"text": "ok"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    let got = read_until_closed(&mut stalled, Duration::from_secs(20)).await;
    assert!(
        got.is_ok(),
        "stalled header connection was not closed: {got:?}"
    );
    // Only an error status (e.g. 408) may precede the close, never a served request.
    let got = String::from_utf8_lossy(&got.unwrap()).into_owned();
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 4"), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_read_timeout_408_or_close() {
    let s = http_gateway("body_timeout_ms = 500\n").await;
    let c = s.client();
    let params = json!({});
    let headers: Vec<(&str, String)> = c.headers("tools/list", &params).into_iter().collect();
    // Announce 100 bytes, send 10, stall.
    let mut req = http1_request(s.gw.addr, "/mcp", &headers, &[b'{'; 100]);
    req.truncate(req.len() - 90);
    let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
    conn.write_all(&req).await.unwrap();
    let got = read_until_closed(&mut conn, Duration::from_secs(20)).await;
    match got {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                text.is_empty() || text.starts_with("HTTP/1.1 408"),
                "expected 408 or a close: {text:?}"
            );
        }
        Err(bytes) => {
            // Still open: acceptable only if a 408 was sent.
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                text.starts_with("HTTP/1.1 408"),
                "no 408 and not closed: {text:?}"
            );
        }
    }
    // The gateway keeps serving.
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
}

async fn client_disconnect_cancels_upstream_call(t: Transport) {
    let s = DemoSetup::start_traced(t, "", "", UPSTREAM_EXTRA).await;
    s.gw.wait_ready().await;
    let c = s.client();
    let before = demo_stats(&c).await;
    assert_eq!(before["cancelled"], 0, "{before}");

    let params = json!({"name": "sleep", "arguments": {"ms": 10000}});
    let body = c.body(json!(1), "tools/call", &params).to_string();
    let headers: Vec<(&str, String)> = c.headers("tools/call", &params).into_iter().collect();
    let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
    conn.write_all(&http1_request(s.gw.addr, "/mcp", &headers, body.as_bytes()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(conn);
    assert_upstream_cancelled(&s, &c, "sleep").await;
}

/// stdio: two children, so a call can run while the cancelled child is reserved.
const UPSTREAM_EXTRA: &str = "max_concurrency = 2\n";

/// The upstream saw the cancellation of its `tool` call. HTTP: the demo server's
/// `stats.cancelled` (one process, shared stats). stdio: each child has its own stats
/// and a child whose cancelled call never answers is killed and replaced
/// (docs/design.md §14 "Upstream sessions"), so the proof is on the wire: the gateway
/// wrote `notifications/cancelled` for that call's upstream request id to the child's
/// stdin.
async fn assert_upstream_cancelled(s: &DemoSetup, c: &Client2026, tool: &str) {
    let start = Instant::now();
    loop {
        let done = match &s.stdin_log {
            Some(log) => traced_cancel_of(log, tool),
            None => demo_stats(c).await["cancelled"].as_u64().unwrap_or(0) >= 1,
        };
        if done {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "upstream {tool} call was not cancelled: stats {} / stdin {:?}",
            demo_stats(c).await,
            s.stdin_log.as_deref().map(traced_messages)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The upstream stays usable afterwards.
    let r = c.call_tool("echo", json!({"text": "still here"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(first_text(&r.json()["result"]), "still here");
}

/// docs/design.md §2 "Clients without the tasks extension": a client without the tasks
/// extension is held up to `sync_timeout_ms` (SSE keep-alives meanwhile); then the
/// upstream call is cancelled and the client gets -32021 naming the tasks extension as
/// the final SSE event.
async fn sync_timeout_cancels_and_answers_32021(t: Transport) {
    let s =
        DemoSetup::start_traced(t, "", "[tasks]\nsync_timeout_ms = 3500\n", UPSTREAM_EXTRA).await;
    s.gw.wait_ready().await;
    let c = s.client();
    let before = demo_stats(&c).await;
    assert_eq!(before["cancelled"], 0, "{before}");

    let r = c.call_tool("sleep", json!({"ms": 30000})).await;
    assert_eq!(
        r.status,
        200,
        "headers were sent before the timeout: {}",
        body_text(&r)
    );
    assert!(r.is_sse(), "{:?}", r.headers);
    let text = body_text(&r);
    assert!(text.lines().any(|l| l.starts_with(':')), "{text:?}");
    let msgs = r.sse_messages();
    let last = msgs.last().expect("a final event");
    assert_eq!(last["id"], 1, "{msgs:?}");
    assert!(last.get("result").is_none(), "{last}");
    assert_eq!(last["error"]["code"], -32021, "{last}");
    assert_eq!(
        last["error"]["data"]["requiredCapabilities"],
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
        "{last}"
    );
    // The upstream call was cancelled, not left running.
    assert_upstream_cancelled(&s, &c, "sleep").await;
}

/// `sync_timeout_ms` shorter than `keepalive_ms`, so the gateway would still be holding
/// the response headers when the sync timer is due (docs/design.md §2 "Clients without
/// the tasks extension": a sync timeout before any header was sent → 400 `-32021`).
const SHORT_SYNC: &str = "[tasks]\nsync_timeout_ms = 2000\n";
const LONG_KEEPALIVE: &str = "keepalive_ms = 15000\n";

/// The -32021 of a sync timeout: names the tasks extension and echoes the id.
#[track_caller]
fn assert_sync_timeout_error(v: &serde_json::Value, id: &serde_json::Value) {
    assert_eq!(&v["id"], id, "{v}");
    assert!(v.get("result").is_none(), "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"],
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
        "{v}"
    );
}

/// docs/design.md §2 "Clients without the tasks extension" with `sync_timeout_ms` (2 s)
/// < `keepalive_ms` (15 s): the sync timer runs from the request's start, not from the
/// end of the JSON hold window, so a hung call from a client without the extension gets
/// HTTP 400 `-32021` long before a keep-alive would have been due, and the upstream
/// call is cancelled.
async fn sync_timeout_shorter_than_keepalive_answers_400_before_any_header(t: Transport) {
    let s = DemoSetup::start_traced(t, LONG_KEEPALIVE, SHORT_SYNC, UPSTREAM_EXTRA).await;
    s.gw.wait_ready().await;
    let c = s.client();
    let before = demo_stats(&c).await;
    assert_eq!(before["cancelled"], 0, "{before}");

    let params = json!({"name": "sleep", "arguments": {"ms": 60000}});
    let body = c.body(json!("sync-1"), "tools/call", &params);
    let started = Instant::now();
    let r = c.send("tools/call", &params, &body).await;
    let took = started.elapsed();
    // Generous: the point is "about sync_timeout_ms", not "about keepalive_ms".
    assert!(
        took < Duration::from_secs(10),
        "answered after {took:?} (sync_timeout_ms = 2000, keepalive_ms = 15000)"
    );
    assert_eq!(r.status, 400, "{}", body_text(&r));
    assert!(
        !r.is_sse(),
        "no header may have gone out first: {:?}",
        r.headers
    );
    assert_sync_timeout_error(&r.json(), &json!("sync-1"));
    assert_upstream_cancelled(&s, &c, "sleep").await;
}

/// The same timeout when SSE headers already went out (the request asked for progress,
/// so the response streams at once): 200, and the error is the stream's final event.
async fn sync_timeout_after_sse_headers_is_the_final_event(t: Transport) {
    let s = DemoSetup::start_traced(t, LONG_KEEPALIVE, SHORT_SYNC, UPSTREAM_EXTRA).await;
    s.gw.wait_ready().await;
    let c = s.client();
    let params = json!({"name": "sleep", "arguments": {"ms": 60000, "steps": 60}});
    let mut body = c.body(json!("sync-2"), "tools/call", &params);
    body["params"]["_meta"]["progressToken"] = json!("p-1");
    let started = Instant::now();
    let r = c.send("tools/call", &params, &body).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert!(r.is_sse(), "{:?}", r.headers);
    let msgs = r.sse_messages();
    let last = msgs.last().expect("a final event");
    assert_sync_timeout_error(last, &json!("sync-2"));
    // Progress before the timeout went out as notifications, ahead of the error.
    assert!(
        msgs[..msgs.len() - 1]
            .iter()
            .all(|m| m["method"] == "notifications/progress"),
        "{msgs:?}"
    );
    assert_upstream_cancelled(&s, &c, "sleep").await;
}

/// `max_connections`: with the cap reached, a further connection is not served until a
/// held one closes.
/// One HTTP/1.1 request on `conn`; the first bytes of the answer (the connection
/// stays open).
async fn send_once(conn: &mut TcpStream, req: &[u8], limit: Duration) -> Option<String> {
    conn.write_all(req).await.ok()?;
    let mut buf = vec![0u8; 16384];
    let n = tokio::time::timeout(limit, conn.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// An inline `tools/call` request (no tasks extension), raw HTTP/1.1 keep-alive.
fn call_request(s: &DemoSetup, tool: &str, args: serde_json::Value) -> Vec<u8> {
    let c = s.client();
    let params = json!({"name": tool, "arguments": args});
    let body = c.body(json!(1), "tools/call", &params).to_string();
    let headers: Vec<(&str, String)> = c.headers("tools/call", &params).into_iter().collect();
    http1_request(s.gw.addr, "/mcp", &headers, body.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_busy_connections_hold_and_idle_ones_make_room() {
    let s = http_gateway("max_connections = 2\n").await;
    let echo = call_request(&s, "echo", json!({"text": "third"}));
    // Two connections busy with slow inline calls hold both slots: a third waits.
    let slow = call_request(&s, "sleep", json!({"ms": 4000}));
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
        conn.write_all(&slow).await.unwrap();
        busy.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut third = TcpStream::connect(s.gw.addr).await.unwrap();
    let early = send_once(&mut third, &echo, Duration::from_millis(1000)).await;
    assert!(early.is_none(), "served beyond max_connections: {early:?}");
    // Once a busy connection's call is answered it is idle, and the waiting client
    // gets its slot.
    let text = send_once(&mut third, b"", Duration::from_secs(30)).await;
    let text = text.expect("third connection served once a slot freed");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    drop(busy);
    drop(third);

    // Two idle keep-alive connections at the cap: a new client is served at once, by
    // closing the one idle the longest.
    let s = http_gateway("max_connections = 2\n").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
        let text = send_once(&mut conn, &echo, Duration::from_secs(20)).await;
        assert!(text.is_some_and(|t| t.starts_with("HTTP/1.1 200")));
        held.push(conn);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut new = TcpStream::connect(s.gw.addr).await.unwrap();
    let text = send_once(&mut new, &echo, Duration::from_secs(10)).await;
    assert!(
        text.as_deref()
            .is_some_and(|t| t.starts_with("HTTP/1.1 200")),
        "a new client was not served while idle connections held the cap: {text:?}"
    );
    let oldest = read_until_closed(&mut held[0], Duration::from_secs(10)).await;
    assert!(oldest.is_ok(), "the longest-idle connection was not closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_that_never_send_a_byte_are_closed_and_starve_no_one() {
    let s = http_gateway("max_connections = 20\nheader_timeout_ms = 1500\n").await;
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(s.gw.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The cap is full of silent sockets; a normal client is served anyway.
    let r = s.client().call_tool("echo", json!({"text": "ok"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    // And every silent socket is closed by the header timeout.
    for conn in &mut silent {
        let got = read_until_closed(conn, Duration::from_secs(20)).await;
        assert!(got.is_ok(), "a socket that never spoke was kept open");
        assert!(got.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keepalive_is_closed_but_sse_streams_are_not_idle() {
    let s = http_gateway("idle_timeout_ms = 1000\nkeepalive_ms = 300\n").await;
    // An idle keep-alive connection is closed after idle_timeout_ms.
    let echo = call_request(&s, "echo", json!({"text": "idle"}));
    let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
    let text = send_once(&mut conn, &echo, Duration::from_secs(20)).await;
    assert!(text.is_some_and(|t| t.starts_with("HTTP/1.1 200")));
    let closed = read_until_closed(&mut conn, Duration::from_secs(20)).await;
    assert!(closed.is_ok(), "an idle keep-alive connection stayed open");
    // A held call streaming SSE keep-alives for 3 s (three idle timeouts) is answered
    // in full.
    let slow = call_request(&s, "sleep", json!({"ms": 3000}));
    let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
    conn.write_all(&slow).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        match tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if String::from_utf8_lossy(&got).contains("slept 3000 ms") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("text/event-stream"), "{text}");
    assert!(
        text.contains("slept 3000 ms"),
        "the SSE stream was cut: {text}"
    );
}

/// The quiet gap between two requests on a kept-alive connection is `idle_timeout_ms`'s;
/// `header_timeout_ms` times a head from its first byte. hyper's head timer ran
/// through the gap too, so an idle connection was closed at the header timeout (10 s
/// by default, not the 60 s documented) under clients and the edge that reused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_outlives_the_header_timeout() {
    let s = http_gateway("header_timeout_ms = 500\nidle_timeout_ms = 6000\n").await;
    let echo = call_request(&s, "echo", json!({"text": "again"}));
    let ok = |t: Option<String>| t.is_some_and(|t| t.starts_with("HTTP/1.1 200"));
    let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
    assert!(ok(
        send_once(&mut conn, &echo, Duration::from_secs(20)).await
    ));
    // Three header timeouts of quiet, then the next request on the same connection.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = send_once(&mut conn, &echo, Duration::from_secs(20)).await;
    assert!(ok(again.clone()), "closed at the header timeout: {again:?}");
    // The same after a request answered within the millisecond its head arrived.
    let health = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let mut fast = TcpStream::connect(s.gw.addr).await.unwrap();
    assert!(ok(
        send_once(&mut fast, health, Duration::from_secs(20)).await
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = send_once(&mut fast, health, Duration::from_secs(20)).await;
    assert!(ok(again.clone()), "closed at the header timeout: {again:?}");
    // A head begun on a kept-alive connection and left unfinished is cut at the header
    // timeout, long before the idle timeout would.
    let mut stalled = TcpStream::connect(s.gw.addr).await.unwrap();
    assert!(ok(
        send_once(&mut stalled, &echo, Duration::from_secs(20)).await
    ));
    stalled
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 12")
        .await
        .unwrap();
    let got = read_until_closed(&mut stalled, Duration::from_secs(3)).await;
    assert!(got.is_ok(), "an unfinished head was kept: {got:?}");
    // So is a new connection's short head, whole in the protocol sniff's first bytes.
    let mut short = TcpStream::connect(s.gw.addr).await.unwrap();
    short.write_all(b"POST /mcp HTTP/1.1\r\n").await.unwrap();
    let got = read_until_closed(&mut short, Duration::from_secs(3)).await;
    assert!(got.is_ok(), "a short unfinished head was kept: {got:?}");
    // And the idle timeout still closes the quiet one.
    let closed = read_until_closed(&mut conn, Duration::from_secs(30)).await;
    assert!(closed.is_ok(), "an idle keep-alive connection stayed open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listener_closes_silent_sockets_too() {
    let port = free_port();
    let s = http_gateway(&format!(
        "metrics_listen = \"127.0.0.1:{port}\"\nheader_timeout_ms = 1000\n"
    ))
    .await;
    let _ = &s;
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let got = read_until_closed(&mut silent, Duration::from_secs(20)).await;
    assert!(
        got.is_ok(),
        "a silent socket on metrics_listen was kept open"
    );
    let r = raw(
        &format!("http://127.0.0.1:{port}/healthz"),
        "GET",
        &[],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
}

/// Send `head` (request line and headers, no blank line) plus `body` on a fresh
/// connection and read until the gateway closes it or 10 s pass.
async fn exchange(s: &DemoSetup, head: &str, body: &[u8]) -> (String, bool) {
    let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
    let mut req = format!("{head}\r\n\r\n").into_bytes();
    req.extend_from_slice(body);
    conn.write_all(&req).await.unwrap();
    match read_until_closed(&mut conn, Duration::from_secs(10)).await {
        Ok(b) => (String::from_utf8_lossy(&b).into_owned(), true),
        Err(b) => (String::from_utf8_lossy(&b).into_owned(), false),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_single_valued_headers_are_refused() {
    let s = http_gateway("").await;
    let port = s.gw.addr.port();
    let local = format!("127.0.0.1:{port}");
    // (header, values, expected status): a repeat is never "first value wins".
    let cases: Vec<(&'static str, Vec<String>, u16)> = vec![
        ("host", vec![local.clone(), "evil.example".into()], 400),
        ("host", vec![local.clone(), local.clone()], 400),
        (
            "origin",
            vec!["http://localhost".into(), "http://evil.example".into()],
            403,
        ),
        (
            "origin",
            vec!["http://localhost".into(), "http://localhost".into()],
            403,
        ),
        (
            "content-type",
            vec!["application/json".into(), "application/json".into()],
            415,
        ),
        (
            "authorization",
            vec![format!("Bearer {}", token("alice", "acme")); 2],
            401,
        ),
    ];
    for (name, values, status) in cases {
        let mut extra: Vec<(&'static str, String)> = Vec::new();
        for v in values {
            extra.push((name, v));
        }
        let r = discover_with_headers(&s, &extra).await;
        assert_eq!(r.status, status, "{name}: {}", body_text(&r));
        assert!(r.json().get("result").is_none(), "{name}");
    }
    // A repeated MCP header is a header/body mismatch (-32020) with the id echoed,
    // even when one of the copies matches the body.
    let c = s.client();
    for (name, second) in [
        ("mcp-method", "tools/list"),
        ("mcp-protocol-version", "2025-06-18"),
        ("mcp-name", "other"),
        ("idempotency-key", "k2"),
        ("mcp-param-region", "eu"),
    ] {
        let params = json!({"name": "echo", "arguments": {"text": "x"}});
        let mut h = c.headers("tools/call", &params);
        let first = h
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| "k1".to_string());
        if !h.iter().any(|(k, _)| *k == name) {
            h.push((name, first));
        }
        h.push((name, second.to_string()));
        let body = c.body(json!("rep-1"), "tools/call", &params);
        let r = raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{name}: {}", body_text(&r));
        let v = r.json();
        assert_eq!(v["error"]["code"], -32020, "{name}: {v}");
        assert_eq!(v["id"], "rep-1", "{name}: {v}");
    }
    // Accept is a list and may repeat.
    let mut h = c.headers("server/discover", &json!({}));
    h.retain(|(k, _)| *k != "accept");
    h.push(("accept", "application/json".into()));
    h.push(("accept", "text/event-stream".into()));
    let body = c.body(json!(1), "server/discover", &json!({}));
    let r = raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", body_text(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http11_request_without_host_is_400() {
    let s = http_gateway("").await;
    let c = s.client();
    let params = json!({});
    let body = c.body(json!(1), "server/discover", &params).to_string();
    let mut head = "POST /mcp HTTP/1.1".to_string();
    for (k, v) in c.headers("server/discover", &params) {
        head.push_str(&format!("\r\n{k}: {v}"));
    }
    head.push_str(&format!("\r\ncontent-length: {}", body.len()));
    let (reply, _) = exchange(&s, &head, body.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    // The same request with its Host is served.
    let with_host = head.replacen("HTTP/1.1", &format!("HTTP/1.1\r\nhost: {}", s.gw.addr), 1);
    let (reply, _) = exchange(
        &s,
        &format!("{with_host}\r\nconnection: close"),
        body.as_bytes(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

/// hyper's own framing rules, pinned: they are what keeps request smuggling out, and a
/// hyper upgrade must not silently change them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_body_framing_is_refused_or_read_as_chunked() {
    let s = http_gateway("").await;
    let c = s.client();
    let params = json!({});
    let body = c.body(json!(1), "server/discover", &params).to_string();
    let mut head = format!("POST /mcp HTTP/1.1\r\nhost: {}", s.gw.addr);
    for (k, v) in c.headers("server/discover", &params) {
        head.push_str(&format!("\r\n{k}: {v}"));
    }
    // Two different Content-Length values → 400.
    let two = format!(
        "{head}\r\ncontent-length: {}\r\ncontent-length: {}",
        body.len(),
        body.len() + 1
    );
    let (reply, _) = exchange(&s, &two, body.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    // Content-Length + Transfer-Encoding: the body is read as chunked (the length is
    // ignored), the request is served, and the connection is closed afterwards.
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    let both = format!("{head}\r\ncontent-length: 5\r\ntransfer-encoding: chunked");
    let (reply, closed) = exchange(&s, &both, chunked.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("supportedVersions"), "{reply}");
    assert!(closed, "connection kept open after CL + TE: {reply}");
}

/// Write `bytes` one at a time, `every` apart, until the peer closes the connection
/// or everything is sent; returns whether the peer closed it first.
async fn dribble(mut conn: TcpStream, bytes: Vec<u8>, every: Duration) -> bool {
    for b in bytes {
        if conn.write_all(&[b]).await.is_err() {
            return true;
        }
        tokio::time::sleep(every).await;
    }
    read_until_closed(&mut conn, Duration::from_secs(20))
        .await
        .is_ok()
}

/// Slow clients at `max_connections`: sockets that send nothing, slowloris heads (a
/// byte every 100 ms, so no single read ever stalls) and slow bodies fill the cap; a
/// normal client is still served, the slow heads are cut by `header_timeout_ms`
/// (a deadline for the whole head, not per read) and the slow bodies by
/// `body_timeout_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_slow_bodies_at_the_cap_starve_no_one() {
    let s = http_gateway("max_connections = 6\nheader_timeout_ms = 1500\nbody_timeout_ms = 1500\n")
        .await;
    let c = s.client();
    let params = json!({});
    let headers: Vec<(&str, String)> = c.headers("tools/list", &params).into_iter().collect();
    let body = c.body(json!(1), "tools/list", &params).to_string();
    let full = http1_request(s.gw.addr, "/mcp", &headers, body.as_bytes());
    let head_len = full.len() - body.len();
    let every = Duration::from_millis(100);

    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(s.gw.addr).await.unwrap());
    }
    let mut slow = Vec::new();
    for _ in 0..2 {
        // Slowloris: the head, byte by byte (it would take ~full.len() × 100 ms).
        let conn = TcpStream::connect(s.gw.addr).await.unwrap();
        slow.push(("head", tokio::spawn(dribble(conn, full.clone(), every))));
    }
    for _ in 0..2 {
        // Slow body: the whole head at once, then the body byte by byte.
        let mut conn = TcpStream::connect(s.gw.addr).await.unwrap();
        conn.write_all(&full[..head_len]).await.unwrap();
        let rest = full[head_len..].to_vec();
        slow.push(("body", tokio::spawn(dribble(conn, rest, every))));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The cap is full of slow clients; a normal one is served anyway.
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        c.call_tool("echo", json!({"text": "normal"})),
    )
    .await
    .expect("a normal client was not served while slow clients held the cap");
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(first_text(&r.json()["result"]), "normal");

    // Every slow client is cut off, though it never stopped sending.
    for (kind, h) in slow {
        assert!(h.await.unwrap(), "a slow {kind} kept its connection");
    }
    for conn in &mut silent {
        let got = read_until_closed(conn, Duration::from_secs(20)).await;
        assert!(got.is_ok(), "a silent socket was kept open");
    }
    // And the gateway still serves.
    let r = c.call_tool("echo", json!({"text": "after"})).await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
}

/// docs/design.md §22 "Clients of the 2025 era": the 2025-11-25 `task` augmentation on
/// a 2026 call never reaches the upstream (which could start a task of its own that
/// nothing tracks); the call is the gateway's, answered inline here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_param_is_stripped_before_upstream() {
    let s = DemoSetup::start_traced(Transport::Stdio, "", "", "").await;
    s.gw.wait_ready().await;
    let c = s.client();
    let r = c
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}, "task": {"ttl": 1000}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", body_text(&r));
    assert_eq!(first_text(&r.json()["result"]), "x");
    let log = s.stdin_log.as_deref().unwrap();
    let calls: Vec<_> = traced_messages(log)
        .into_iter()
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sent = &calls[0]["params"];
    assert!(sent.get("task").is_none(), "{sent}");
    assert_eq!(sent["arguments"], json!({"text": "x"}), "{sent}");
}
