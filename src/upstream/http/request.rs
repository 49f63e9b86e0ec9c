//! HTTP plumbing: building requests, one exchange with redirects, message POSTs, and
//! reading bodies within bounds.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;

use super::consts::{
    ACCEPT_POST, LAST_EVENT_ID, MAX_REDIRECTS, MESSAGE_TIMEOUT, SESSION_HEADER, SNIPPET_BYTES,
    VERSION_HEADER,
};
use super::session::Session;
use super::state::HttpUpstream;
use crate::upstream::UpstreamError;

/// Why a request could not be exchanged.
pub(super) enum SendError {
    /// Nothing reached the upstream (connection refused, connect timeout, …).
    Unreachable(String),
    /// The exchange failed after the request may have been sent.
    Failed(String),
}

impl SendError {
    pub(super) fn reason(self) -> String {
        match self {
            Self::Unreachable(r) | Self::Failed(r) => r,
        }
    }
}

/// Why a notification or response POST failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum PostError {
    /// Nothing reached the upstream.
    #[error("{0}")]
    Unreachable(String),
    /// The exchange broke or stalled: a transport-level failure of the session.
    #[error("{0}")]
    Transport(String),
    /// The upstream answered with an error status.
    #[error("HTTP {0}: {1}")]
    Status(StatusCode, String),
}

impl HttpUpstream {
    pub(super) fn build_request(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Bytes>,
        session: Option<&Session>,
        accept: &'static str,
        last_event_id: Option<&str>,
    ) -> Result<Request<Full<Bytes>>, SendError> {
        let mut req = Request::builder().method(method.clone()).uri(url);
        if let Some(h) = req.headers_mut() {
            for (k, v) in &self.headers {
                h.append(k.clone(), v.clone());
            }
            // Protocol headers go last and replace any static header of the same name.
            h.insert(ACCEPT, HeaderValue::from_static(accept));
            if body.is_some() {
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            if let Some(s) = session {
                if let Some(id) = &s.id
                    && let Ok(v) = HeaderValue::from_str(id)
                {
                    h.insert(SESSION_HEADER, v);
                }
                if let Some(ver) = &s.version
                    && let Ok(v) = HeaderValue::from_str(ver)
                {
                    h.insert(VERSION_HEADER, v);
                }
            }
            if let Some(id) = last_event_id
                && let Ok(v) = HeaderValue::from_str(id)
            {
                h.insert(LAST_EVENT_ID, v);
            }
            // The W3C context of the call's client span, the same as in its `_meta`
            // (docs/design.md §24 "Operations").
            if crate::telemetry::enabled() {
                let carrier = crate::telemetry::carrier_of(&tracing::Span::current());
                crate::telemetry::insert_headers(&carrier, h);
            }
        }
        req.body(Full::new(body.cloned().unwrap_or_default()))
            .map_err(|e| SendError::Unreachable(format!("cannot build request for {url}: {e}")))
    }

    /// One exchange, following 307/308 redirects (and remembering where they lead).
    pub(super) async fn send(
        &self,
        method: Method,
        body: Option<Bytes>,
        session: Option<&Session>,
        accept: &'static str,
        last_event_id: Option<&str>,
    ) -> Result<Response<Incoming>, SendError> {
        let mut url = self.url();
        for _ in 0..=MAX_REDIRECTS {
            let req =
                self.build_request(&method, &url, body.as_ref(), session, accept, last_event_id)?;
            let resp = self.client.request(req).await.map_err(|e| {
                let reason = format!("{url}: {}", error_chain(&e));
                if e.is_connect() {
                    // A failed TLS handshake is a connect failure too: nothing was sent.
                    if let Some(why) = crate::tls::failure_reason(&e) {
                        crate::metrics::tls_handshake_failed("outbound", &self.name, why);
                    }
                    SendError::Unreachable(reason)
                } else {
                    SendError::Failed(reason)
                }
            })?;
            let status = resp.status();
            if status != StatusCode::TEMPORARY_REDIRECT && status != StatusCode::PERMANENT_REDIRECT
            {
                return Ok(resp);
            }
            let next = resp
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|loc| resolve_location(&url, loc))
                .ok_or_else(|| {
                    SendError::Failed(format!(
                        "{url}: HTTP {status} without a usable Location (same scheme)"
                    ))
                })?;
            tracing::debug!(upstream = %self.name, from = %url, to = %next, "following redirect");
            {
                let mut inner = self.inner();
                if inner.url == url {
                    inner.url = next.clone();
                }
            }
            url = next;
        }
        Err(SendError::Failed(format!("{url}: too many redirects")))
    }

    /// An HTTP error status answered to a written request, as a transport error with a
    /// snippet of the body. Never `Unavailable`: even a 502/503/504 comes after the
    /// request was written, and a proxy (or the server) may have started it, so the
    /// client must not be told that a retry is safe.
    pub(super) async fn status_error(&self, what: &str, resp: Response<Incoming>) -> UpstreamError {
        let status = resp.status();
        let snippet = body_snippet(resp.into_body()).await;
        let reason = format!("{what}: HTTP {status}: {snippet}");
        if status.is_server_error() {
            self.broken(reason)
        } else {
            self.protocol(reason)
        }
    }

    /// POST a notification or response; expects 202 (any 2xx is accepted). Bounded by
    /// `MESSAGE_TIMEOUT`: a live server acknowledges a message at once.
    pub(super) async fn post_message(
        &self,
        session: &Session,
        msg: &Value,
    ) -> Result<(), PostError> {
        let body =
            Bytes::from(serde_json::to_vec(msg).map_err(|e| PostError::Transport(e.to_string()))?);
        let send = self.send(Method::POST, Some(body), Some(session), ACCEPT_POST, None);
        let resp = match tokio::time::timeout(MESSAGE_TIMEOUT, send).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(SendError::Unreachable(reason))) => return Err(PostError::Unreachable(reason)),
            Ok(Err(SendError::Failed(reason))) => return Err(PostError::Transport(reason)),
            Err(_) => {
                return Err(PostError::Transport(format!(
                    "not acknowledged within {MESSAGE_TIMEOUT:?}"
                )));
            }
        };
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(PostError::Status(
                status,
                body_snippet(resp.into_body()).await,
            ))
        }
    }
}

pub(super) fn is_event_stream<B>(resp: &Response<B>) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// Resolve a `Location` header against the URL it answered. Only `http` targets.
pub(super) fn resolve_location(base: &str, loc: &str) -> Option<String> {
    let loc = loc.trim();
    let uri: http::Uri = base.parse().ok()?;
    let scheme = uri.scheme_str()?;
    // Only to the same scheme: a redirect never downgrades https:// to http://, and an
    // http:// upstream is not moved to a TLS endpoint its configuration never named.
    if let Some((target, _)) = loc.split_once("://") {
        return (target.eq_ignore_ascii_case(scheme)).then(|| loc.to_string());
    }
    let authority = uri.authority()?.as_str();
    if let Some(rest) = loc.strip_prefix("//") {
        return Some(format!("{scheme}://{rest}"));
    }
    if loc.starts_with('/') {
        return Some(format!("{scheme}://{authority}{loc}"));
    }
    let path = uri.path();
    let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
    Some(format!("{scheme}://{authority}{dir}{loc}"))
}

pub(super) enum ReadError {
    TooLarge,
    Io(String),
}

pub(super) async fn read_capped(mut body: Incoming, max: usize) -> Result<Bytes, ReadError> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Io(error_chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Up to [`SNIPPET_BYTES`] of an error body, for error messages.
pub(super) async fn body_snippet(mut body: Incoming) -> String {
    let mut buf = Vec::new();
    let read = async {
        while buf.len() < SNIPPET_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
    snippet(&buf)
}

pub(super) fn snippet(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(SNIPPET_BYTES)];
    let s = String::from_utf8_lossy(cut).trim().to_string();
    if s.is_empty() {
        "(empty body)".into()
    } else {
        s
    }
}

pub(super) use crate::tls::error_chain;
