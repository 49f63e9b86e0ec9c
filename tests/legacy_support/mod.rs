//! A raw-HTTP 2025-era client (docs/design.md §22 "Clients of the 2025 era") and an
//! SSE reader for its streams: shared by `legacy_wire.rs` and `edge.rs`.
// Included by several test crates; `pub` is how they reach the helpers.
#![allow(unreachable_pub)]
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::common::*;

pub const INIT_VERSION: &str = "2025-06-18";

/// A 2025-era client: no 2026 headers or `_meta`, a session once initialized.
pub struct Legacy {
    pub url: String,
    pub token: Option<String>,
    pub session: Option<String>,
    pub version: Option<String>,
}

impl Legacy {
    pub fn new(gw: &Gateway, token: Option<String>) -> Self {
        Self::at(gw.url("/mcp"), token)
    }

    /// A client of the endpoint at `url` (a replica's or the edge's).
    pub fn at(url: String, token: Option<String>) -> Self {
        Self {
            url,
            token,
            session: None,
            version: None,
        }
    }

    /// Another client presenting this one's session (and version) at `url`, with
    /// `token`: the same client on another replica, or another principal.
    pub fn presenting(&self, url: String, token: Option<String>) -> Self {
        Self {
            url,
            token,
            session: self.session.clone(),
            version: self.version.clone(),
        }
    }

    /// Open this session's standalone GET stream.
    pub async fn get_stream(&self) -> Events {
        Events::open(&self.url, "GET", &self.headers(), String::new()).await
    }

    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("content-type", "application/json".to_string()),
            ("accept", "application/json, text/event-stream".to_string()),
        ];
        if let Some(t) = &self.token {
            h.push(("authorization", format!("Bearer {t}")));
        }
        if let Some(s) = &self.session {
            h.push(("mcp-session-id", s.clone()));
        }
        if let Some(v) = &self.version {
            h.push(("mcp-protocol-version", v.clone()));
        }
        h
    }

    pub async fn post(&self, body: Value) -> Resp {
        self.post_with(&self.headers(), body.to_string()).await
    }

    pub async fn post_with(&self, h: &[(&'static str, String)], body: String) -> Resp {
        raw(&self.url, "POST", h, Bytes::from(body)).await.unwrap()
    }

    pub async fn initialize(&mut self, caps: Value) -> Resp {
        self.initialize_as(caps, INIT_VERSION).await
    }

    /// `initialize` asking for `version`.
    pub async fn initialize_as(&mut self, caps: Value, version: &str) -> Resp {
        let r = self
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": version,
                    "capabilities": caps,
                    "clientInfo": {"name": "legacy-test", "version": "1.0"}
                }}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", text(&r));
        self.session = r.header("mcp-session-id");
        self.version = Some(version.into());
        assert!(self.session.is_some(), "no session id: {:?}", r.headers);
        let n = self
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(n.status, 202, "{}", text(&n));
        r
    }

    pub async fn request(&self, id: Value, method: &str, params: Value) -> Resp {
        self.post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await
    }

    /// POST a request and read its answer as a stream of SSE events.
    pub async fn open(&self, method: &str, body: Value) -> Events {
        Events::open(&self.url, method, &self.headers(), body.to_string()).await
    }
}

pub fn text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// An SSE response read event by event.
pub struct Events {
    pub status: u16,
    pub headers: http::HeaderMap,
    body: hyper::body::Incoming,
    buf: String,
    ended: bool,
    pub comments: usize,
}

impl Events {
    pub async fn open(url: &str, method: &str, headers: &[(&str, String)], body: String) -> Self {
        let mut b = http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let req = b
            .body(http_body_util::Full::new(Bytes::from(body)))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(30), send(req))
            .await
            .expect("response headers timed out")
            .expect("request failed");
        Self {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.into_body(),
            buf: String::new(),
            ended: false,
            comments: 0,
        }
    }

    /// A response header's value.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// Whether the stream has ended (as opposed to a [`Events::next`] that timed out).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Read until the stream ends, for at most `limit`: whether it did, and the
    /// messages read on the way.
    pub async fn drain(&mut self, limit: Duration) -> (bool, Vec<Value>) {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(m) => seen.push(m),
                // The end of the stream, or the bound.
                None if self.ended || left.is_zero() => break,
                // A message that is no JSON: keep reading.
                None if Instant::now() < deadline => {}
                None => break,
            }
        }
        (self.ended, seen)
    }

    /// The next JSON-RPC message (keep-alive comments counted and skipped); `None`
    /// at the end of the stream or after `limit`.
    pub async fn next(&mut self, limit: Duration) -> Option<Value> {
        let deadline = Instant::now() + limit;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf[..end].to_string();
                self.buf = self.buf[end + 2..].to_string();
                assert!(
                    !block.lines().any(|l| l.starts_with("id:")),
                    "no SSE ids in this era: {block:?}"
                );
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|l| l.strip_prefix(' ').unwrap_or(l))
                    .collect();
                if data.is_empty() {
                    self.comments += 1;
                    continue;
                }
                return serde_json::from_str(&data.join("\n")).ok();
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
                        self.buf
                            .push_str(&String::from_utf8_lossy(&d).replace("\r\n", "\n"));
                    }
                }
            }
        }
    }
}
