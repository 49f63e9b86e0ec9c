//! What the gateway sends to a legacy HTTP upstream (docs/design.md §14 "Upstream
//! sessions"), observed by a recording proxy between the gateway and the demo server:
//! static upstream credentials from config, session headers after `initialize`, and
//! never the client's token or its 2026 `_meta`/progress token.

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    headers: http::HeaderMap,
    body: Bytes,
}

/// A pass-through HTTP proxy to `target` (http://host:port) recording each request.
async fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<Seen>>>) {
    proxy(target, |_| false).await
}

/// [`recording_proxy`], except that a POST whose JSON body matches `stall` is not
/// forwarded: it is answered with SSE headers and then nothing, ever — an upstream
/// session that stopped answering.
async fn proxy(target: String, stall: fn(&Value) -> bool) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (log, client, target) = (log.clone(), client.clone(), target.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (log, client, target) = (log.clone(), client.clone(), target.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        log.lock().unwrap().push(Seen {
                            method: parts.method.to_string(),
                            headers: parts.headers.clone(),
                            body: body.clone(),
                        });
                        let msg: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        if stall(&msg) {
                            let silent = futures_util::stream::pending::<
                                Result<hyper::body::Frame<Bytes>, hyper::Error>,
                            >();
                            let resp = http::Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(http_body_util::StreamBody::new(silent).boxed())
                                .unwrap();
                            return Ok::<_, Infallible>(resp);
                        }
                        let uri = format!(
                            "{target}{}",
                            parts
                                .uri
                                .path_and_query()
                                .map(|p| p.as_str())
                                .unwrap_or("/")
                        );
                        let mut b = http::Request::builder().method(parts.method).uri(uri);
                        for (k, v) in parts.headers.iter() {
                            if k != http::header::HOST {
                                b = b.header(k, v);
                            }
                        }
                        let out = b.body(http_body_util::Full::new(body)).unwrap();
                        let resp: http::Response<
                            http_body_util::combinators::BoxBody<Bytes, hyper::Error>,
                        > = match client.request(out).await {
                            Ok(r) => r.map(|b| b.boxed()),
                            Err(_) => http::Response::builder()
                                .status(502)
                                .body(
                                    http_body_util::Empty::<Bytes>::new()
                                        .map_err(|never| match never {})
                                        .boxed(),
                                )
                                .unwrap(),
                        };
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}/mcp"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sees_static_credentials_never_the_client_token() {
    let demo = DemoHttp::start().await;
    let (proxy_url, seen) = recording_proxy(format!("http://127.0.0.1:{}", demo.port)).await;
    let upstream = http_upstream(
        "demo",
        "/mcp",
        &proxy_url,
        "headers = { Authorization = \"Bearer upstream-static-credential\", X-Upstream-Key = \"k-123\" }\n",
    );
    let gw = Gateway::start(&format!("{}{upstream}", jwt_auth())).await;
    gw.wait_ready().await;
    let client_token = token("alice", "acme");
    let c = Client2026::new(&gw, "/mcp", Some(client_token.clone()));

    // A call with a client progress token and 2026 _meta.
    let params = json!({"name": "sleep", "arguments": {"ms": 200, "steps": 2}});
    let mut body = c.body(json!(1), "tools/call", &params);
    body["params"]["_meta"]["progressToken"] = json!("client-progress-token-xyz");
    let r = c.send("tools/call", &params, &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = c.call_tool("echo", json!({"text": "hi"})).await;
    assert_eq!(first_text(&r.json()["result"]), "hi");

    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.len() >= 3,
        "initialize + initialized + calls expected: {seen:?}"
    );
    let mut saw_initialize = false;
    let mut saw_call = false;
    for s in &seen {
        let auth: Vec<_> = s.headers.get_all("authorization").iter().collect();
        assert_eq!(auth.len(), 1, "{} {:?}", s.method, s.headers);
        assert_eq!(auth[0], "Bearer upstream-static-credential");
        assert_eq!(
            s.headers.get("x-upstream-key").map(|v| v.as_bytes()),
            Some(&b"k-123"[..])
        );
        // The client's bearer token never leaves the gateway, in headers or body.
        for (k, v) in s.headers.iter() {
            assert!(
                !String::from_utf8_lossy(v.as_bytes()).contains(&client_token),
                "client token leaked upstream in header {k}"
            );
        }
        let text = String::from_utf8_lossy(&s.body);
        assert!(
            !text.contains(&client_token),
            "client token leaked in body: {text}"
        );
        if s.method != "POST" {
            continue;
        }
        let msg: Value = serde_json::from_slice(&s.body).unwrap_or(Value::Null);
        match msg["method"].as_str() {
            Some("initialize") => {
                saw_initialize = true;
                assert!(s.headers.get("mcp-session-id").is_none(), "{:?}", s.headers);
            }
            Some("tools/call") => {
                saw_call = true;
                // Session headers after initialize.
                assert!(s.headers.get("mcp-session-id").is_some(), "{:?}", s.headers);
                assert!(
                    s.headers.get("mcp-protocol-version").is_some(),
                    "{:?}",
                    s.headers
                );
                // No 2026 request _meta upstream; the progress token is the gateway's own.
                let meta = &msg["params"]["_meta"];
                assert!(
                    meta.get("io.modelcontextprotocol/protocolVersion")
                        .is_none(),
                    "2026 _meta forwarded: {msg}"
                );
                assert!(
                    meta.get("io.modelcontextprotocol/clientCapabilities")
                        .is_none(),
                    "2026 _meta forwarded: {msg}"
                );
                assert_ne!(meta["progressToken"], "client-progress-token-xyz", "{msg}");
                assert!(!text.contains("client-progress-token-xyz"), "{msg}");
            }
            _ => {}
        }
    }
    assert!(saw_initialize && saw_call, "{seen:?}");
    drop(demo);
}

/// The demo upstream behind a proxy that never answers `tools/list`, and a gateway
/// with `sync_timeout_ms = 1500` in front of it.
async fn gateway_with_stalled_tools_list() -> (DemoHttp, Gateway) {
    let demo = DemoHttp::start().await;
    let (proxy_url, _seen) = proxy(format!("http://127.0.0.1:{}", demo.port), |m| {
        m["method"] == "tools/list"
    })
    .await;
    let body = format!(
        "{}[tasks]\nsync_timeout_ms = 1500\n{}",
        jwt_auth(),
        http_upstream("demo", "/mcp", &proxy_url, "")
    );
    let gw = Gateway::start(&body).await;
    gw.wait_ready().await;
    (demo, gw)
}

const PROMPTLY: std::time::Duration = std::time::Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tools_list_is_bounded_by_sync_timeout_ms() {
    let (_demo, gw) = gateway_with_stalled_tools_list().await;
    let limit = PROMPTLY;
    // The cached tools/list is served outside the inline race, but not without a bound.
    let plain = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(limit, plain.request("tools/list", json!({})))
        .await
        .expect("tools/list hung on the stalled upstream");
    let v = r.json();
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "answered before sync_timeout_ms: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_client_call_does_not_wait_on_the_tools_lookup() {
    let (_demo, gw) = gateway_with_stalled_tools_list().await;
    // Only a client without the tasks extension can be refused for a task-only tool,
    // so a client with it never waits on that lookup (a cold cache asks tools/list).
    let tasks = Client2026::new(&gw, "/mcp", Some(token("bob", "acme")))
        .with_caps(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
    let r = tokio::time::timeout(PROMPTLY, tasks.call_tool("echo", json!({"text": "hi"})))
        .await
        .expect("the call hung on the stalled tools lookup");
    assert_eq!(first_text(&r.json()["result"]), "hi", "{}", r.json());
}
