//! Helpers shared by the tasks-engine integration tests (`tasks_lifecycle.rs`,
//! `tasks_isolation.rs`): config builders, task polling, an HTTP demo upstream, and a
//! streaming SSE reader for `subscriptions/listen`.
// Included by several test crates; `pub` is how they reach the helpers, so the
// crate-wide `unreachable_pub` lint does not apply here.
#![allow(unreachable_pub)]
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::common::*;

pub const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
pub const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// Capabilities of a client that declares the tasks extension (and elicitation).
pub fn tasks_caps() -> Value {
    json!({"extensions": {TASKS_EXT: {}}, "elicitation": {}})
}

/// A client for `/mcp` that declares the tasks extension.
pub fn tasks_client(gw: &Gateway, sub: &str, tenant: &str) -> Client2026 {
    Client2026::new(gw, "/mcp", Some(token(sub, tenant))).with_caps(tasks_caps())
}

/// A client for `/mcp` that does NOT declare the tasks extension.
pub fn plain_client(gw: &Gateway, sub: &str, tenant: &str, caps: Value) -> Client2026 {
    Client2026::new(gw, "/mcp", Some(token(sub, tenant))).with_caps(caps)
}

/// `[tasks]` (short promotion and poll interval, plus `extra` keys) and a permissive
/// `[limits]` so test polling is never throttled.
pub fn tasks_section(extra: &str) -> String {
    format!(
        "[tasks]\npromote_after_ms = 200\npoll_interval_ms = 50\n{extra}\n[limits]\npoll_burst = 100000\n"
    )
}

/// Config body: JWT auth + `[tasks]` + a stdio demo upstream with `upstream_extra`
/// (which may end with `[upstream.tools.NAME]` tables).
pub fn stdio_body(tasks_extra: &str, upstream_extra: &str) -> String {
    format!(
        "{}{}{}",
        jwt_auth(),
        tasks_section(tasks_extra),
        demo_stdio_upstream(upstream_extra)
    )
}

/// Config body with an HTTP demo upstream at `url`.
pub fn http_body(url: &str, tasks_extra: &str, upstream_extra: &str) -> String {
    format!(
        "{}{}{}",
        jwt_auth(),
        tasks_section(tasks_extra),
        http_upstream("demo", "/mcp", url, upstream_extra)
    )
}

/// Start a gateway with extra `[store]` keys (the stock `Gateway::start` writes
/// `[store]` itself, so a second `[store]` table is not possible there).
pub async fn start_with_store(store_extra: &str, body: &str) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("taskgate.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n[store]\n{}{store_extra}\n{body}",
        store_keys(dir.path())
    );
    std::fs::write(&config_path, text).unwrap();
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    gw
}

/// Start a gateway (stock harness) and wait until it is ready.
pub async fn start_ready(body: &str) -> Gateway {
    let gw = Gateway::start(body).await;
    gw.wait_ready().await;
    gw
}

/// Run `taskgate demo-upstream --http 127.0.0.1:0`; returns the process and its URL.
pub async fn start_demo_http() -> (Proc, String) {
    let mut cmd = Command::new(bin());
    cmd.arg("demo-upstream")
        .arg("--http")
        .arg(format!("127.0.0.1:{}", free_port()));
    let p = Proc::spawn(cmd);
    let line = p
        .wait_log("listening on http://", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("demo upstream did not start:\n{}", p.log_text()));
    let url = line
        .rsplit("listening on ")
        .next()
        .unwrap()
        .trim()
        .to_string();
    (p, url)
}

/// The JSON-RPC message of a response; panics on a non-JSON body.
pub fn msg(r: &Resp) -> Value {
    let v = r.json();
    assert!(
        !v.is_null(),
        "no JSON-RPC message (status {}): {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    v
}

/// The `result` of a successful response.
pub fn ok_result(r: &Resp) -> Value {
    let v = msg(r);
    assert_eq!(r.status, 200, "{v}");
    assert!(v.get("error").is_none(), "unexpected error: {v}");
    v["result"].clone()
}

/// Send `method` with `params`, retrying on 429 (a future poll limiter) so polling
/// tests never depend on timing.
pub async fn send_retrying(c: &Client2026, method: &str, params: Value) -> Resp {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.request(method, params.clone()).await;
        if r.status != 429 || Instant::now() > deadline {
            return r;
        }
        let wait = msg(&r)["error"]["data"]["retryAfterMs"]
            .as_u64()
            .unwrap_or(100);
        tokio::time::sleep(Duration::from_millis(wait.clamp(10, 2000))).await;
    }
}

pub async fn tasks_get(c: &Client2026, id: &str) -> Resp {
    send_retrying(c, "tasks/get", json!({"taskId": id})).await
}

pub async fn tasks_update(c: &Client2026, id: &str, responses: Value) -> Resp {
    send_retrying(
        c,
        "tasks/update",
        json!({"taskId": id, "inputResponses": responses}),
    )
    .await
}

pub async fn tasks_cancel(c: &Client2026, id: &str) -> Resp {
    send_retrying(c, "tasks/cancel", json!({"taskId": id})).await
}

pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// Poll `tasks/get` until `pred(result)` holds; returns that result. Every poll must
/// succeed. `seen` receives each intermediate result.
pub async fn poll_until_seen(
    c: &Client2026,
    id: &str,
    limit: Duration,
    mut seen: impl FnMut(&Value),
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < limit {
        let r = tasks_get(c, id).await;
        let res = ok_result(&r);
        seen(&res);
        if pred(&res) {
            return res;
        }
        last = res;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {id}: condition not reached within {limit:?}; last: {last}");
}

pub async fn poll_until(
    c: &Client2026,
    id: &str,
    limit: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    poll_until_seen(c, id, limit, |_| {}, pred).await
}

/// Poll until the task is terminal; returns the terminal `tasks/get` result.
pub async fn poll_terminal(c: &Client2026, id: &str) -> Value {
    poll_until(c, id, Duration::from_secs(60), |r| {
        is_terminal(r["status"].as_str().unwrap_or_default())
    })
    .await
}

/// Start a tool call expected to become a task; returns the `CreateTaskResult`.
pub async fn create_task(c: &Client2026, tool: &str, args: Value) -> Value {
    let r = c.call_tool(tool, args).await;
    let res = ok_result(&r);
    assert_eq!(res["resultType"], "task", "expected a task: {res}");
    assert!(
        res["taskId"]
            .as_str()
            .is_some_and(|t| t.starts_with("tsk_")),
        "{res}"
    );
    res
}

pub fn task_id(create: &Value) -> String {
    create["taskId"].as_str().unwrap().to_string()
}

/// A well-formed task id that was never issued: `tsk_` + base64url of 16 random
/// bytes, the shape of a real one.
pub fn never_issued_id() -> String {
    use base64::Engine as _;
    let b: [u8; 16] = rand::random();
    format!(
        "tsk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    )
}

/// Loose ISO 8601 check: `YYYY-MM-DDTHH:MM:SS` then fraction/offset.
pub fn is_iso8601(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
        && b[10] == b'T'
        && b[11..13].iter().all(u8::is_ascii_digit)
        && b[13] == b':'
        && b[14..16].iter().all(u8::is_ascii_digit)
        && b[16] == b':'
        && b[17..19].iter().all(u8::is_ascii_digit)
        && (s.ends_with('Z') || s[19..].contains('+') || s[19..].contains('-'))
}

/// Text of every content block of a tools/call result, joined by '\n'.
pub fn all_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Parse the demo `stats` tool output (JSON text).
pub async fn task_demo_stats(c: &Client2026) -> Value {
    let r = c.call_tool("stats", json!({})).await;
    let res = ok_result(&r);
    assert_eq!(res["resultType"], "complete", "{res}");
    serde_json::from_str(&first_text(&res)).unwrap_or_else(|e| panic!("stats: {e}: {res}"))
}

/// A POST whose SSE response body is read incrementally (for `subscriptions/listen`).
pub struct SseStream {
    pub status: u16,
    pub headers: http::HeaderMap,
    body: hyper::body::Incoming,
    buf: Vec<u8>,
    ended: bool,
}

impl SseStream {
    pub async fn open(url: &str, headers: &[(&str, String)], body: Bytes) -> Self {
        let mut b = http::Request::builder().method("POST").uri(url);
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let req = b.body(Full::new(body)).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(30), send(req))
            .await
            .expect("listen: response headers timed out")
            .expect("listen: request failed");
        Self {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.into_body(),
            buf: Vec::new(),
            ended: false,
        }
    }

    /// Open `subscriptions/listen` with JSON-RPC id `id` and `notifications` filter.
    pub async fn listen(c: &Client2026, id: Value, notifications: Value) -> Self {
        let params = json!({"notifications": notifications});
        let body = c.body(id, "subscriptions/listen", &params);
        let h = c.headers("subscriptions/listen", &params);
        Self::open(&c.url, &h, Bytes::from(body.to_string())).await
    }

    fn take_event(&mut self) -> Option<Option<Value>> {
        let text = String::from_utf8_lossy(&self.buf).replace("\r\n", "\n");
        let end = text.find("\n\n")?;
        let block = text[..end].to_string();
        let rest = text.as_bytes()[end + 2..].to_vec();
        self.buf = rest;
        let data: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .collect();
        if data.is_empty() {
            return Some(None); // a comment (keep-alive) or empty block
        }
        Some(serde_json::from_str(&data.join("\n")).ok())
    }

    /// The first `notifications/tasks` snapshot of task `id` in `status` within
    /// `limit`, skipping every other message; `None` if the stream ends first.
    pub async fn task_reached(&mut self, id: &str, status: &str, limit: Duration) -> Option<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let n = self.next(left).await?;
            if n["method"] == "notifications/tasks"
                && n["params"]["taskId"] == id
                && n["params"]["status"] == status
            {
                return Some(n["params"].clone());
            }
        }
    }

    /// The next JSON message on the stream, skipping keep-alive comments; `None` on
    /// end of stream or after `limit`.
    pub async fn next(&mut self, limit: Duration) -> Option<Value> {
        let deadline = Instant::now() + limit;
        loop {
            while let Some(ev) = self.take_event() {
                if let Some(v) = ev {
                    return Some(v);
                }
            }
            if self.ended {
                return None;
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.body.frame()).await {
                Err(_) => return None,
                Ok(None) | Ok(Some(Err(_))) => self.ended = true,
                Ok(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
            }
        }
    }
}
