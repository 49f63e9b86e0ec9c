//! The client-facing HTTP front (MCP 2026-07-28 Streamable HTTP; docs/design.md §12
//! "HTTP front").
//!
//! Each request passes, in this order: path → HTTP method → Origin/Host → auth →
//! Content-Type/Accept/size → wire validation (`wire.rs`) → dispatch (`dispatch.rs`).
//! The first failure answers.

pub mod conn;
pub mod dispatch;
pub mod http_checks;
pub mod inline;
pub mod reply;
pub mod subscriptions;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::Config;
use crate::protocol::RpcError;
use crate::upstream::{TransportState, UpstreamSet};
use reply::Body;

/// Everything a request handler needs, shared by all connections.
pub struct Gateway {
    pub cfg: Arc<Config>,
    pub auth: Arc<Authenticator>,
    pub upstreams: Arc<UpstreamSet>,
    pub engine: Arc<crate::tasks::Engine>,
    pub holds: Arc<crate::tasks::mrtr::Holds>,
}

const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

impl Gateway {
    /// Serve one HTTP request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();

        // Operational and metadata endpoints: no token (docs/design.md §12 "HTTP front").
        match path.as_str() {
            "/healthz" => return reply::json(StatusCode::OK, &json!({"status": "ok"})),
            "/readyz" => return self.readyz(),
            "/metrics" => return metrics_reply(),
            _ => {}
        }
        if let Some(rest) = path.strip_prefix(PRM_PATH) {
            if req.method() != Method::GET {
                return method_not_allowed("GET");
            }
            if rest.is_empty() || self.upstreams.by_path(rest).is_some() {
                return reply::json(StatusCode::OK, &self.auth.resource_metadata(rest));
            }
            return reply::empty(StatusCode::NOT_FOUND);
        }

        let Some(upstream) = self.upstreams.by_path(&path).cloned() else {
            return reply::json(
                StatusCode::NOT_FOUND,
                &json!({"error": "not found", "path": path}),
            );
        };

        // Origin/Host before anything else that reveals behaviour (DNS rebinding).
        if let Err(rej) = http_checks::check_origin_host(
            req.version(),
            req.uri(),
            req.headers(),
            &self.cfg.server,
        ) {
            let error = if rej.status == StatusCode::FORBIDDEN {
                "forbidden"
            } else {
                "bad request"
            };
            return reply::json(rej.status, &json!({"error": error, "reason": rej.reason}));
        }
        if req.method() == Method::OPTIONS {
            return self.preflight(&req);
        }
        // A browser origin that passed the check above may read the answer (CORS);
        // the preflight alone is not enough.
        let cors_origin = req.headers().get(header::ORIGIN).cloned();
        let mut resp = self.handle_mcp(req, upstream).await;
        if let Some(origin) = cors_origin {
            let h = resp.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("www-authenticate, retry-after"),
            );
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        resp
    }

    /// POST on an upstream path, after the Origin/Host check: one log line and one
    /// metrics sample per request (README "Limits and metrics"). Never logs tokens.
    async fn handle_mcp(
        self: Arc<Self>,
        req: Request<Incoming>,
        upstream: Arc<crate::upstream::Upstream>,
    ) -> Response<Body> {
        let started = std::time::Instant::now();
        let mut log = ReqLog::default();
        let upstream_name = upstream.name().to_string();
        let resp = self
            .handle_mcp_inner(req, upstream, &mut log, started.into())
            .await;
        let status = resp.status().as_u16();
        let elapsed = started.elapsed();
        let method = log.method.as_deref().unwrap_or("-");
        crate::metrics::request(method, status, elapsed);
        tracing::info!(
            target: "taskgate::request",
            upstream = %upstream_name,
            method,
            tenant = log.tenant.as_deref().unwrap_or("-"),
            subject = log.subject.as_deref().unwrap_or("-"),
            task = log.task_id.as_deref().unwrap_or("-"),
            status,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "request"
        );
        resp
    }

    async fn handle_mcp_inner(
        self: Arc<Self>,
        req: Request<Incoming>,
        upstream: Arc<crate::upstream::Upstream>,
        log: &mut ReqLog,
        received: tokio::time::Instant,
    ) -> Response<Body> {
        if req.method() != Method::POST {
            return method_not_allowed("POST");
        }

        let principal = match self
            .auth
            .authenticate(req.headers(), req.uri().query())
            .await
        {
            Ok(p) => {
                log.tenant = Some(p.tenant.clone());
                log.subject = Some(p.subject.clone());
                p
            }
            Err(f) => {
                let mut r = reply::json(f.status, &f.body());
                if let Ok(v) = HeaderValue::from_str(&f.www_authenticate) {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
                }
                return r;
            }
        };

        if !http_checks::content_type_is_json(req.headers()) {
            return reply::rpc_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                None,
                &RpcError::invalid_request("Content-Type must be application/json"),
            );
        }
        if !http_checks::accept_allows_json_and_sse(req.headers()) {
            return reply::rpc_error(
                StatusCode::NOT_ACCEPTABLE,
                None,
                &RpcError::invalid_request(
                    "Accept must allow both application/json and text/event-stream",
                ),
            );
        }
        let max = self.cfg.server.max_body_bytes;
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
        let body_timeout = Duration::from_millis(self.cfg.server.body_timeout_ms);
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
            return too_large();
        }
        let (parts, body) = req.into_parts();
        let bytes: Bytes =
            match tokio::time::timeout(body_timeout, Limited::new(body, max).collect()).await {
                Err(_) => {
                    return reply::rpc_error(
                        StatusCode::REQUEST_TIMEOUT,
                        None,
                        &RpcError::invalid_request("timed out reading the request body"),
                    );
                }
                Ok(Err(e)) => {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        return too_large();
                    }
                    return reply::rpc_error(
                        StatusCode::BAD_REQUEST,
                        None,
                        &RpcError::invalid_request("could not read the request body"),
                    );
                }
                Ok(Ok(c)) => c.to_bytes(),
            };

        let valid = match wire::validate(&bytes, &parts.headers) {
            Ok(wire::Incoming::Notification) => return reply::empty(StatusCode::ACCEPTED),
            Ok(wire::Incoming::Request(r)) => r,
            Err(rej) => return reply::rpc_error(rej.status, rej.id.as_ref(), &rej.error),
        };
        log.method = Some(valid.method.clone());
        if valid.method.starts_with("tasks/") {
            log.task_id = valid
                .params
                .get("taskId")
                .and_then(serde_json::Value::as_str)
                .map(|t| t.chars().take(64).collect());
        }
        dispatch::dispatch(&self, &upstream, principal, *valid, received).await
    }

    fn readyz(&self) -> Response<Body> {
        let mut all_ready = true;
        let mut states = serde_json::Map::new();
        for u in self.upstreams.iter() {
            let s = match u.state() {
                TransportState::Ready => json!({"state": "ready"}),
                TransportState::Starting => {
                    all_ready = false;
                    json!({"state": "starting"})
                }
                TransportState::Down(reason) => {
                    all_ready = false;
                    json!({"state": "down", "reason": reason})
                }
            };
            states.insert(u.name().to_string(), s);
        }
        // A store that failed a write or flush cannot hand out task ids (docs/design.md
        // §16 "Durability, store failures and upgrades").
        let store_ok = self.engine.store.healthy();
        let ready = all_ready && store_ok;
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        reply::json(
            status,
            &json!({
                "ready": ready,
                "store": if store_ok { "open" } else { "failed" },
                "upstreams": states
            }),
        )
    }

    /// CORS preflight, answered only for origins the config admits (docs/design.md §12
    /// "HTTP front").
    fn preflight(&self, req: &Request<Incoming>) -> Response<Body> {
        let Some(origin) = req.headers().get(header::ORIGIN).cloned() else {
            return method_not_allowed("POST");
        };
        let mut r = reply::empty(StatusCode::NO_CONTENT);
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("POST"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(
                "authorization, content-type, accept, mcp-protocol-version, mcp-method, mcp-name, idempotency-key",
            ),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        r
    }
}

/// What the per-request log line says about a request (filled as it is checked).
#[derive(Default)]
struct ReqLog {
    method: Option<String>,
    tenant: Option<String>,
    subject: Option<String>,
    task_id: Option<String>,
}

/// `GET /metrics`: Prometheus text format, no token (docs/design.md §12 "HTTP front").
fn metrics_reply() -> Response<Body> {
    let mut r = Response::new(reply::full(crate::metrics::render()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// The optional `server.metrics_listen` listener: `/metrics`, `/healthz` and
/// `/readyz` only, under the same connection rules as the main listener.
pub async fn serve_ops(gw: Arc<Gateway>, listener: TcpListener, shutdown: CancellationToken) {
    let policy = conn::ConnPolicy::from_config(&gw.cfg.server);
    conn::serve(listener, policy, shutdown, move |req: Request<Incoming>| {
        let gw = gw.clone();
        async move {
            match req.uri().path() {
                "/metrics" => metrics_reply(),
                "/healthz" => reply::json(StatusCode::OK, &json!({"status": "ok"})),
                "/readyz" => gw.readyz(),
                _ => reply::empty(StatusCode::NOT_FOUND),
            }
        }
    })
    .await;
}

fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = reply::rpc_error(
        StatusCode::METHOD_NOT_ALLOWED,
        None,
        &RpcError::invalid_request(format!("only {allow} is allowed")),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Accept connections until `shutdown` fires, then drain for `drain_grace_ms`.
pub async fn serve(gw: Arc<Gateway>, listener: TcpListener, shutdown: CancellationToken) {
    let policy = conn::ConnPolicy::from_config(&gw.cfg.server);
    conn::serve(listener, policy, shutdown, move |req: Request<Incoming>| {
        gw.clone().handle(req)
    })
    .await;
}

/// Bodies refused for their declared size are still read up to this size (see
/// `drain_body`), and for at most this long.
const REFUSED_BODY_DRAIN_BYTES: usize = 8 * 1024 * 1024;
const REFUSED_BODY_DRAIN_TIME: Duration = Duration::from_secs(2);

/// Read and discard a request body, for at most `within`.
async fn drain_body(mut body: hyper::body::Incoming, within: Duration) {
    let _ = tokio::time::timeout(within, async move {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
}
