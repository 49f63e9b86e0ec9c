//! The HTTP-level steps of the request path (docs/design.md §12 "HTTP front", "Order of
//! checks"), each a layer of the stack `build` composes in `mod.rs`: Origin/Host
//! against DNS rebinding, CORS, POST only, auth, Content-Type and Accept, and the body
//! read within `max_body_bytes` and the body timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version, header};
use http_body_util::{BodyExt, Limited};
use serde_json::json;

use super::gateway::Gateway;
use super::headers::{Repeated, single};
use super::reply::{self, method_not_allowed};
use super::stack::{AsyncStep, LogFields, ReadRequest, Req, Resp, Step};
use crate::config::ServerConfig;
use crate::protocol::RpcError;

fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[');
    let h = h.split(']').next().unwrap_or(h);
    let name = if host.starts_with('[') {
        h
    } else {
        h.rsplit_once(':').map(|(n, _)| n).unwrap_or(h)
    };
    matches!(name.to_ascii_lowercase().as_str(), "localhost" | "::1")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
        || name.to_ascii_lowercase().ends_with(".localhost")
}

/// The host part of an Origin (`scheme://host[:port]`), lowercased, with port.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.trim_end_matches('/'))
}

/// Why Origin/Host refused a request: a malformed request (400) or one the DNS
/// rebinding rules do not admit (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReject {
    pub status: StatusCode,
    pub reason: String,
}

impl HostReject {
    fn bad(reason: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
        }
    }
    fn forbidden(reason: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            reason: reason.into(),
        }
    }
}

/// The authority the request names: `Host` on HTTP/1.x, which must appear exactly once
/// (RFC 9112 §3.2), or `:authority` on HTTP/2 (RFC 9113 §8.3.1), where a `Host`
/// header, if also sent, must agree with it.
fn request_authority(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<String, HostReject> {
    let host = single(headers, header::HOST)
        .map_err(|Repeated| HostReject::bad("repeated Host header"))?
        .map(|h| {
            h.to_str()
                .map(str::to_string)
                .map_err(|_| HostReject::bad("invalid Host header"))
        })
        .transpose()?;
    if version == Version::HTTP_2
        && let Some(authority) = uri.authority()
    {
        if let Some(h) = &host
            && !h.eq_ignore_ascii_case(authority.as_str())
        {
            return Err(HostReject::bad("Host header does not match :authority"));
        }
        return Ok(authority.as_str().to_string());
    }
    host.ok_or_else(|| HostReject::bad("missing Host header"))
}

/// Origin and Host against DNS rebinding (docs/design.md §12 "HTTP front"): a missing
/// or repeated `Host` is a malformed request (400); a disallowed `Host`, a disallowed
/// `Origin` or a repeated `Origin` is refused (403).
pub fn check_origin_host(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    cfg: &ServerConfig,
) -> Result<(), HostReject> {
    let host = request_authority(version, uri, headers)?;
    let origin = single(headers, header::ORIGIN)
        .map_err(|Repeated| HostReject::forbidden("repeated Origin header"))?;
    if let Some(origin) = origin {
        let origin = origin
            .to_str()
            .map_err(|_| HostReject::forbidden("invalid Origin header"))?;
        let allowed = cfg.allowed_origins.iter().any(|o| o == origin || o == "*")
            || origin_authority(origin).is_some_and(is_loopback_host);
        if !allowed {
            return Err(HostReject::forbidden(format!(
                "origin {origin:?} is not allowed"
            )));
        }
    }
    let allowed = is_loopback_host(&host)
        || cfg.allowed_hosts.iter().any(|h| {
            h.eq_ignore_ascii_case(&host)
                || host
                    .rsplit_once(':')
                    .is_some_and(|(name, _)| h.eq_ignore_ascii_case(name))
        });
    if !allowed {
        return Err(HostReject::forbidden(format!(
            "host {host:?} is not allowed"
        )));
    }
    Ok(())
}

fn media_type(v: &str) -> &str {
    v.split(';').next().unwrap_or("").trim()
}

/// Exactly one `Content-Type`, and it is JSON (a repeated one is refused like a wrong
/// one: 415).
pub fn content_type_is_json(headers: &HeaderMap) -> bool {
    single(headers, header::CONTENT_TYPE)
        .ok()
        .flatten()
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| media_type(v).eq_ignore_ascii_case("application/json"))
}

/// `Accept` must admit both `application/json` and `text/event-stream` (MCP 2026-07-28
/// Streamable HTTP, "Sending Messages").
pub fn accept_allows_json_and_sse(headers: &HeaderMap) -> bool {
    admits(headers, "application/json") && admits(headers, "text/event-stream")
}

/// Whether the media ranges `Accept` lists admit the media type `t` (exactly, `*/*` or
/// `major/*`; media types compare case-insensitively). Every POST checks two, so the
/// ranges are walked in place, without copies.
fn admits(headers: &HeaderMap, t: &str) -> bool {
    let (major, _) = t.split_once('/').unwrap_or((t, ""));
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(media_type)
        .any(|r| {
            r.eq_ignore_ascii_case(t)
                || r == "*/*"
                || r.strip_suffix("/*")
                    .is_some_and(|m| m.eq_ignore_ascii_case(major))
        })
}

/// Origin and Host (step 2 of the order of checks): a refusal is a plain JSON error
/// naming the reason, not a JSON-RPC one (nothing of the body has been read).
#[derive(Clone)]
pub(super) struct OriginHost(pub(super) Arc<Gateway>);

impl Step for OriginHost {
    type Kept = ();

    fn before(&self, req: &mut Req) -> Result<(), Resp> {
        match check_origin_host(req.version(), req.uri(), req.headers(), &self.0.cfg.server) {
            Ok(()) => Ok(()),
            Err(rej) => {
                let error = if rej.status == StatusCode::FORBIDDEN {
                    "forbidden"
                } else {
                    "bad request"
                };
                Err(reply::json(
                    rej.status,
                    &json!({"error": error, "reason": rej.reason}),
                ))
            }
        }
    }
}

/// CORS for origins that passed [`OriginHost`]: answers the preflight, and lets an
/// admitted browser origin read the answer (the preflight alone is not enough).
#[derive(Clone, Copy)]
pub(super) struct Cors;

impl Step for Cors {
    /// The request's `Origin`, echoed to an admitted browser.
    type Kept = Option<HeaderValue>;

    fn before(&self, req: &mut Req) -> Result<Self::Kept, Resp> {
        if req.method() == Method::OPTIONS {
            return Err(preflight(req.headers()));
        }
        Ok(req.headers().get(header::ORIGIN).cloned())
    }

    fn after(&self, origin: Self::Kept, resp: &mut Resp) {
        if let Some(origin) = origin {
            let h = resp.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("www-authenticate, retry-after, mcp-session-id"),
            );
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
    }
}

/// CORS preflight, answered only for origins the config admits (docs/design.md §12
/// "HTTP front"); without an `Origin` it is an `OPTIONS` like any other method.
fn preflight(headers: &HeaderMap) -> Resp {
    let Some(origin) = headers.get(header::ORIGIN).cloned() else {
        return method_not_allowed("POST");
    };
    let mut r = reply::empty(StatusCode::NO_CONTENT);
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, accept, mcp-protocol-version, mcp-method, mcp-name, idempotency-key, mcp-session-id",
        ),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    r
}

/// POST on an upstream's path; GET and DELETE too for a 2025-era session (an
/// `Mcp-Session-Id` and no 2026 version: docs/design.md §22 "Clients of the 2025
/// era"). Anything else: 405 `Allow: POST`.
#[derive(Clone, Copy)]
pub(super) struct MethodGate;

impl Step for MethodGate {
    type Kept = ();

    fn before(&self, req: &mut Req) -> Result<(), Resp> {
        let m = req.method();
        if m == Method::POST
            || ((m == Method::GET || m == Method::DELETE)
                && super::era::serves_bodiless(req.headers()))
        {
            Ok(())
        } else {
            Err(method_not_allowed("POST"))
        }
    }
}

/// The bearer token (docs/design.md §13 "Auth"): the [`Principal`](crate::auth::Principal)
/// goes on in the request's extensions, and its tenant and subject into the log line.
#[derive(Clone)]
pub(super) struct Authenticate(pub(super) Arc<Gateway>);

impl AsyncStep<Req> for Authenticate {
    type Out = Req;

    async fn check(&self, mut req: Req) -> Result<Req, Resp> {
        match self
            .0
            .auth
            .authenticate(req.headers(), req.uri().query())
            .await
        {
            Ok(p) => {
                if let Some(log) = req.extensions().get::<LogFields>() {
                    log.update(|l| {
                        l.tenant = Some(p.tenant.clone());
                        l.subject = Some(p.subject.clone());
                    });
                }
                req.extensions_mut().insert(p);
                Ok(req)
            }
            Err(f) => {
                let mut r = reply::json(f.status, &f.body());
                if let Ok(v) = HeaderValue::from_str(&f.www_authenticate) {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
                }
                Err(r)
            }
        }
    }
}

/// Content negotiation: a JSON body (415), and an `Accept` that admits both answers
/// the gateway may give, JSON and SSE (406).
#[derive(Clone, Copy)]
pub(super) struct Negotiate;

impl Step for Negotiate {
    type Kept = ();

    fn before(&self, req: &mut Req) -> Result<(), Resp> {
        // A legacy session's GET stream is SSE only; its DELETE has no body and no
        // answer to negotiate (the method gate admitted them for a session only).
        if req.method() == Method::DELETE {
            return Ok(());
        }
        if req.method() == Method::GET {
            return if admits(req.headers(), "text/event-stream") {
                Ok(())
            } else {
                Err(reply::rpc_error(
                    StatusCode::NOT_ACCEPTABLE,
                    None,
                    &RpcError::invalid_request("Accept must allow text/event-stream"),
                ))
            };
        }
        if !content_type_is_json(req.headers()) {
            return Err(reply::rpc_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                None,
                &RpcError::invalid_request("Content-Type must be application/json"),
            ));
        }
        if !accept_allows_json_and_sse(req.headers()) {
            return Err(reply::rpc_error(
                StatusCode::NOT_ACCEPTABLE,
                None,
                &RpcError::invalid_request(
                    "Accept must allow both application/json and text/event-stream",
                ),
            ));
        }
        Ok(())
    }
}

/// The body, read whole: at most `max_body_bytes` (413) within `body_timeout_ms` (408).
#[derive(Clone)]
pub(super) struct ReadBody(pub(super) Arc<Gateway>);

/// Bodies refused for their declared size are still read up to this size (see
/// `drain_body`), and for at most this long.
const REFUSED_BODY_DRAIN_BYTES: usize = 8 * 1024 * 1024;
const REFUSED_BODY_DRAIN_TIME: Duration = Duration::from_secs(2);

impl AsyncStep<Req> for ReadBody {
    type Out = ReadRequest;

    async fn check(&self, req: Req) -> Result<ReadRequest, Resp> {
        let max = self.0.cfg.server.max_body_bytes;
        let too_large = || {
            reply::rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                &RpcError::invalid_request(format!("body larger than {max} bytes")),
            )
        };
        let declared_len = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let body_timeout = self.0.cfg.server.body_timeout;
        if let Some(n) = declared_len
            && n > max
        {
            // Read what the client is sending before refusing it: hyper closes the
            // connection after the reply, and closing a socket with unread data resets
            // it, so the client may see the reset instead of the 413 (nginx's
            // "lingering close"). Bounded in bytes and time.
            if n <= REFUSED_BODY_DRAIN_BYTES {
                drain_body(req.into_body(), body_timeout.min(REFUSED_BODY_DRAIN_TIME)).await;
            }
            return Err(too_large());
        }
        let (parts, body) = req.into_parts();
        let bytes: Bytes =
            match tokio::time::timeout(body_timeout, Limited::new(body, max).collect()).await {
                Err(_) => {
                    return Err(reply::rpc_error(
                        StatusCode::REQUEST_TIMEOUT,
                        None,
                        &RpcError::invalid_request("timed out reading the request body"),
                    ));
                }
                Ok(Err(e)) => {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        return Err(too_large());
                    }
                    return Err(reply::rpc_error(
                        StatusCode::BAD_REQUEST,
                        None,
                        &RpcError::invalid_request("could not read the request body"),
                    ));
                }
                Ok(Ok(c)) => c.to_bytes(),
            };
        Ok(Request::from_parts(parts, bytes))
    }
}

/// Read and discard a request body, for at most `within`.
async fn drain_body(mut body: hyper::body::Incoming, within: Duration) {
    let _ = tokio::time::timeout(within, async move {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    fn check(pairs: &[(&str, &str)]) -> Result<(), u16> {
        let uri = Uri::from_static("/mcp");
        check_origin_host(Version::HTTP_11, &uri, &h(pairs), &ServerConfig::default())
            .map_err(|r| r.status.as_u16())
    }

    #[test]
    fn loopback_hosts() {
        for host in ["localhost:8080", "127.0.0.1:9", "[::1]:80", "localhost"] {
            assert_eq!(check(&[("host", host)]), Ok(()), "{host}");
        }
        assert_eq!(check(&[("host", "evil.example.com")]), Err(403));
        assert_eq!(
            check(&[("host", "localhost"), ("origin", "http://evil.example.com")]),
            Err(403)
        );
        assert_eq!(
            check(&[("host", "localhost"), ("origin", "http://localhost:3000")]),
            Ok(())
        );
    }

    #[test]
    fn repeated_or_missing_host_and_repeated_origin() {
        assert_eq!(check(&[]), Err(400));
        assert_eq!(
            check(&[("host", "127.0.0.1"), ("host", "evil.example")]),
            Err(400)
        );
        assert_eq!(
            check(&[("host", "127.0.0.1"), ("host", "127.0.0.1")]),
            Err(400)
        );
        assert_eq!(
            check(&[
                ("host", "127.0.0.1"),
                ("origin", "http://localhost"),
                ("origin", "http://evil.example")
            ]),
            Err(403)
        );
    }

    #[test]
    fn h2_authority_stands_for_host() {
        let cfg = ServerConfig::default();
        let uri = Uri::from_static("http://127.0.0.1:8080/mcp");
        assert!(check_origin_host(Version::HTTP_2, &uri, &HeaderMap::new(), &cfg).is_ok());
        let evil = Uri::from_static("http://evil.example/mcp");
        let r = check_origin_host(Version::HTTP_2, &evil, &HeaderMap::new(), &cfg);
        assert_eq!(r.map_err(|r| r.status.as_u16()), Err(403));
        let r = check_origin_host(
            Version::HTTP_2,
            &Uri::from_static("/mcp"),
            &HeaderMap::new(),
            &cfg,
        );
        assert_eq!(r.map_err(|r| r.status.as_u16()), Err(400));
    }

    #[test]
    fn repeated_content_type_is_refused() {
        assert!(content_type_is_json(&h(&[(
            "content-type",
            "application/json"
        )])));
        assert!(!content_type_is_json(&h(&[
            ("content-type", "application/json"),
            ("content-type", "application/json")
        ])));
    }

    #[test]
    fn accept_rules() {
        assert!(accept_allows_json_and_sse(&h(&[(
            "accept",
            "application/json, text/event-stream"
        )])));
        assert!(accept_allows_json_and_sse(&h(&[("accept", "*/*")])));
        assert!(!accept_allows_json_and_sse(&h(&[(
            "accept",
            "application/json"
        )])));
        assert!(!accept_allows_json_and_sse(&HeaderMap::new()));
        // Case-insensitive, parameters ignored, `major/*`, ranges over several headers.
        assert!(accept_allows_json_and_sse(&h(&[(
            "accept",
            "Application/JSON;q=0.9, TEXT/*"
        )])));
        assert!(accept_allows_json_and_sse(&h(&[
            ("accept", "application/json"),
            ("accept", "text/event-stream")
        ])));
        assert!(!accept_allows_json_and_sse(&h(&[(
            "accept",
            "application/json, image/*"
        )])));
        assert!(!accept_allows_json_and_sse(&h(&[(
            "accept",
            "application/json, textx/*, text/event-streamx"
        )])));
    }
}
