//! HTTP responses: JSON bodies, JSON-RPC errors with the right status, and SSE streams
//! (docs/design.md §12 "HTTP front", JSON or SSE).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::protocol::{self, RequestId, RpcError};

pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

pub fn json<T: serde::Serialize + ?Sized>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A JSON-RPC error response with the given HTTP status, echoing the id if known.
pub fn rpc_error(status: StatusCode, id: Option<&RequestId>, err: &RpcError) -> Response<Body> {
    crate::telemetry::record_rpc_error(err.code);
    json(status, &protocol::error_response(id, err))
}

/// 503 + `Retry-After` for an unavailable upstream or a full queue.
pub fn unavailable(id: Option<&RequestId>, err: &RpcError, retry_after_s: u64) -> Response<Body> {
    let mut r = rpc_error(StatusCode::SERVICE_UNAVAILABLE, id, err);
    if let Ok(v) = HeaderValue::from_str(&retry_after_s.max(1).to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The 503 of a replica that takes no new upstream calls (lease lost, or drained by
/// an operator), marked as never processed so the edge retries it on another
/// replica; `None` when this replica takes calls.
pub fn not_accepting(
    engine: &crate::tasks::Engine,
    id: Option<&RequestId>,
) -> Option<Response<Body>> {
    let (why, message) = if !engine.lease_held() {
        (
            "lease-lost",
            "this replica lost its store lease; retry (another replica)",
        )
    } else if engine.drained() {
        (
            "draining",
            "this replica is draining for a deploy; retry (another replica)",
        )
    } else {
        return None;
    };
    let mut r = unavailable(id, &RpcError::internal(message), 1);
    r.headers_mut().insert(
        crate::protocol::NOT_SENT_HEADER,
        HeaderValue::from_static(why),
    );
    Some(r)
}

/// One SSE event carrying a JSON-RPC message (no `id:` lines: 2026 streams are not
/// resumable, MCP 2026-07-28 Streamable HTTP, "Receiving Messages").
pub fn sse_event(msg: &Value) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"event: message\ndata: ");
    // serde_json never emits raw newlines, so one `data:` line is enough.
    out.extend_from_slice(&serde_json::to_vec(msg).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

pub fn sse_keepalive() -> Bytes {
    Bytes::from_static(b": keep-alive\n\n")
}

/// An SSE response whose frames come from `rx`. `guard` lives as long as the body:
/// when the client goes away hyper drops the body, and with it the guard (which
/// cancels whatever the stream was waiting for).
pub fn sse<G: Send + Sync + 'static>(rx: mpsc::Receiver<Bytes>, guard: G) -> Response<Body> {
    let stream = futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), (rx, guard)))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// `GET /metrics`: Prometheus text format, no token (docs/design.md §12 "HTTP front").
pub fn metrics() -> Response<Body> {
    let mut r = Response::new(full(crate::metrics::render()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// 405 with the `Allow` header naming the one method the path serves.
pub fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = rpc_error(
        StatusCode::METHOD_NOT_ALLOWED,
        None,
        &RpcError::invalid_request(format!("only {allow} is allowed")),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}
