//! The edge's `ProxyHttp`: picks a replica per request from its headers
//! ([`super::route`]), answers `/healthz` and `/metrics` itself, retries only a
//! connect failure (nothing was sent) and ejects a replica it cannot connect to until
//! the next health check interval is over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_load_balancing::selection::RoundRobin;
use pingora_load_balancing::selection::consistent::KetamaHashing;
use pingora_load_balancing::{Backend, LoadBalancer};
use pingora_proxy::{ProxyHttp, Session};

use super::route::{
    METHOD_HEADER, NAME_HEADER, PARAM_TASK_ID_HEADER, PROTOCOL_VERSION_HEADER, Route, RouteHeaders,
    SESSION_HEADER, route_request,
};

/// How long the edge waits for the next byte from a replica. Above the replicas'
/// SSE keep-alive (`server.keepalive_ms`, default 15 s) and their longest silent
/// reply (an inline call without SSE is answered within `tasks.sync_timeout_ms`,
/// default 300 s).
const UPSTREAM_READ_IDLE: Duration = Duration::from_secs(330);
/// A pooled connection to a replica is dropped after this long unused: below the
/// replicas' `server.idle_timeout_ms` (default 60 s), so the edge does not write a
/// POST into a connection the replica is closing (a sent POST is never retried).
const POOL_IDLE: Duration = Duration::from_secs(20);
/// Connecting to a replica: a loopback or LAN peer answers far sooner.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Ketama walks the ring past unhealthy replicas; this bounds the walk.
const MAX_ITERATIONS: usize = 256;

/// One configured replica.
pub(crate) struct Replica {
    pub(crate) addr: SocketAddr,
    /// `http(s)://host:port` as configured: the metric label and log field.
    pub(crate) name: String,
    /// The host as configured: over TLS, the SNI and the name the replica's
    /// certificate is verified for (requests and `/livez` probes alike).
    pub(crate) host: String,
    /// `https://`: TLS to this replica.
    pub(crate) tls: bool,
    /// Ejected until this many ms after the edge started (0: not ejected).
    ejected_until_ms: AtomicU64,
}

impl Replica {
    pub(crate) fn new(addr: SocketAddr, name: String, host: String, tls: bool) -> Self {
        Self {
            addr,
            name,
            host,
            tls,
            ejected_until_ms: AtomicU64::new(0),
        }
    }
}

pub(crate) struct EdgeProxy {
    pub(crate) ketama: Arc<LoadBalancer<KetamaHashing>>,
    pub(crate) round_robin: Arc<LoadBalancer<RoundRobin>>,
    pub(crate) replicas: Arc<Vec<Replica>>,
    /// Passive ejection lasts this long (the active checks decide after that).
    pub(crate) eject_for: Duration,
    pub(crate) started: Instant,
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) max_in_flight: usize,
}

/// Holds one of `edge.max_connections` slots while a request is in flight.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Per-request state.
pub(crate) struct Ctx {
    at: Instant,
    route: Route,
    /// Answered by the edge itself (`/healthz`, `/metrics`, the limit).
    own: bool,
    /// Replicas tried so far (a retry never picks one again).
    tried: Vec<SocketAddr>,
    retries: u32,
    /// The last replica refused the request before doing anything with it (a 503
    /// with the not-sent header): [`ProxyHttp::error_while_proxy`] keeps the retry.
    refused_unsent: bool,
    /// The request's span (docs/design.md §24 "Operations"), ended with the context.
    span: tracing::Span,
    _slot: Option<Slot>,
}

fn inet(b: &Backend) -> Option<SocketAddr> {
    b.addr.as_inet().copied()
}

impl EdgeProxy {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn replica(&self, addr: SocketAddr) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.addr == addr)
    }

    fn name_of(&self, addr: SocketAddr) -> String {
        self.replica(addr)
            .map(|r| r.name.clone())
            .unwrap_or_else(|| addr.to_string())
    }

    fn is_ejected(&self, addr: SocketAddr, now_ms: u64) -> bool {
        self.replica(addr)
            .is_some_and(|r| r.ejected_until_ms.load(Ordering::Relaxed) > now_ms)
    }

    fn eject(&self, addr: SocketAddr) {
        if let Some(r) = self.replica(addr) {
            let until = self.now_ms() + self.eject_for.as_millis() as u64;
            r.ejected_until_ms.store(until, Ordering::Relaxed);
            crate::metrics::edge_ejected(&r.name);
            tracing::warn!(
                target: "taskgate::edge",
                replica = %r.name,
                eject_ms = self.eject_for.as_millis() as u64,
                "replica ejected after a connect failure"
            );
        }
    }

    /// The replica for `route`, among the healthy ones not tried yet; ejected ones
    /// only when nothing else is left.
    fn pick(&self, route: &Route, tried: &[SocketAddr]) -> Option<Backend> {
        let now = self.now_ms();
        let fresh = |b: &Backend| inet(b).is_some_and(|a| !tried.contains(&a));
        let select = |accept: &dyn Fn(&Backend, bool) -> bool| match route {
            Route::Task(id) | Route::Session(id) => {
                self.ketama
                    .select_with(id.as_bytes(), MAX_ITERATIONS, |b, h| accept(b, h))
            }
            Route::Other => self
                .round_robin
                .select_with(b"", MAX_ITERATIONS, |b, h| accept(b, h)),
        };
        select(&|b, healthy| {
            healthy && fresh(b) && inet(b).is_some_and(|a| !self.is_ejected(a, now))
        })
        .or_else(|| select(&|b, healthy| healthy && fresh(b)))
    }

    /// How many replicas pass their health checks now.
    pub(crate) fn healthy_count(&self) -> usize {
        let backends = self.round_robin.backends();
        backends
            .get_backend()
            .iter()
            .filter(|b| backends.ready(b))
            .count()
    }

    async fn answer(
        &self,
        session: &mut Session,
        status: u16,
        content_type: &str,
        body: String,
        extra: &[(&'static str, &'static str)],
    ) -> Result<()> {
        let mut resp = ResponseHeader::build(status, Some(3 + extra.len()))?;
        resp.insert_header("content-type", content_type)?;
        resp.insert_header("content-length", body.len().to_string())?;
        resp.insert_header("cache-control", "no-store")?;
        for (k, v) in extra {
            resp.insert_header(*k, *v)?;
        }
        session.write_response_header(Box::new(resp), false).await?;
        session
            .write_response_body(Some(Bytes::from(body)), true)
            .await
    }
}

#[async_trait]
impl ProxyHttp for EdgeProxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            at: Instant::now(),
            route: Route::Other,
            own: false,
            tried: Vec::new(),
            retries: 0,
            refused_unsent: false,
            span: tracing::Span::none(),
            _slot: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let req = session.req_header();
        let path = req.uri.path();
        if req.method == http::Method::GET && (path == "/healthz" || path == "/metrics") {
            ctx.own = true;
            if path == "/healthz" {
                let healthy = self.healthy_count();
                let body = serde_json::json!({
                    "status": "ok",
                    "replicas": {"healthy": healthy, "configured": self.replicas.len()},
                })
                .to_string();
                self.answer(session, 200, "application/json", body, &[])
                    .await?;
            } else {
                let body = crate::metrics::render();
                self.answer(session, 200, "text/plain; version=0.0.4", body, &[])
                    .await?;
            }
            return Ok(true);
        }
        let h = |name: &str| req.headers.get(name).map(|v| v.as_bytes());
        let text = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        ctx.span =
            crate::telemetry::edge_span(text(METHOD_HEADER), text(NAME_HEADER), &req.headers);
        ctx.route = route_request(RouteHeaders {
            protocol_version: h(PROTOCOL_VERSION_HEADER),
            session: h(SESSION_HEADER),
            mcp_method: h(METHOD_HEADER),
            mcp_name: h(NAME_HEADER),
            param_task_id: h(PARAM_TASK_ID_HEADER),
        });
        // Keep the body (up to pingora's retry buffer) so a request a replica refused
        // unprocessed can go to another one.
        session.enable_retry_buffering();
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        ctx._slot = Some(Slot(self.in_flight.clone()));
        if before >= self.max_in_flight {
            ctx.own = true;
            let body = r#"{"error":"the edge is at edge.max_connections"}"#.to_string();
            self.answer(
                session,
                503,
                "application/json",
                body,
                &[("retry-after", "1")],
            )
            .await?;
            return Ok(true);
        }
        Ok(false)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let Some(backend) = self.pick(&ctx.route, &ctx.tried) else {
            return Err(Error::explain(
                ErrorType::HTTPStatus(503),
                "no healthy replica",
            ));
        };
        let Some(addr) = inet(&backend) else {
            return Err(Error::explain(
                ErrorType::InternalError,
                "replica without an inet address",
            ));
        };
        ctx.tried.push(addr);
        // Over TLS the SNI is the configured host, and pingora verifies the replica's
        // certificate for it (an empty SNI would turn verification off: never here).
        let mut peer = match self.replica(addr) {
            Some(r) if r.tls => HttpPeer::new(addr, true, r.host.clone()),
            _ => HttpPeer::new(addr, false, String::new()),
        };
        peer.options.connection_timeout = Some(CONNECT_TIMEOUT);
        peer.options.read_timeout = Some(UPSTREAM_READ_IDLE);
        peer.options.idle_timeout = Some(POOL_IDLE);
        Ok(Box::new(peer))
    }

    /// The edge's span context goes on to the replica as the W3C headers (replacing
    /// the client's: the replica's span is the edge span's child).
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut pingora_http::RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if ctx.span.is_none() {
            return Ok(());
        }
        let carrier = crate::telemetry::carrier_of(&ctx.span);
        for (k, v) in carrier.pairs() {
            upstream_request.insert_header(k, v.to_string())?;
        }
        Ok(())
    }

    /// Nothing was sent: the request may go to another replica, and this one sits
    /// out until the next health check interval is over.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(addr) = peer._address.as_inet().copied() {
            self.eject(addr);
            crate::metrics::edge_retry(&self.name_of(addr));
        }
        if ctx.tried.len() < self.replicas.len() {
            ctx.retries += 1;
            e.set_retry(true);
        }
        e
    }

    /// A replica that lost its lease or is draining answers 503 with the not-sent
    /// header before doing anything with the request (docs/design.md §24): the same
    /// request goes to another replica, while one is left untried. Any other answer
    /// passes through, so a processed request is never sent twice.
    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if resp.status.as_u16() != 503 || ctx.tried.len() >= self.replicas.len() {
            return Ok(());
        }
        let Some(why) = resp.headers.get(crate::protocol::NOT_SENT_HEADER) else {
            return Ok(());
        };
        let why = String::from_utf8_lossy(why.as_bytes()).into_owned();
        if let Some(addr) = ctx.tried.last() {
            crate::metrics::edge_retry(&self.name_of(*addr));
        }
        ctx.retries += 1;
        ctx.refused_unsent = true;
        let mut e = Error::explain(
            ErrorType::HTTPStatus(503),
            format!("replica refused the request unprocessed ({why})"),
        );
        e.set_retry(true);
        Err(e)
    }

    /// pingora's default policy, except for a refusal marked unprocessed: that one
    /// may be retried whatever the method, as long as the whole body was kept.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let whole_body = !session.as_ref().retry_buffer_truncated();
        if std::mem::take(&mut ctx.refused_unsent) {
            e.set_retry(whole_body);
        } else if !session.req_header().method.is_idempotent() || !whole_body {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        e
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        let elapsed = ctx.at.elapsed();
        crate::telemetry::record_http_status(&ctx.span, status);
        let class = if ctx.own { "edge" } else { ctx.route.class() };
        crate::metrics::edge_request(class, status, elapsed);
        let req = session.req_header();
        let mcp_method = req
            .headers
            .get(METHOD_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        let replica = ctx
            .tried
            .last()
            .filter(|_| !ctx.own)
            .map(|a| self.name_of(*a))
            .unwrap_or_else(|| "-".into());
        let task = match &ctx.route {
            Route::Task(id) => id.as_str(),
            // A session id is not logged: it names a client's session to anyone who
            // holds that client's token.
            Route::Session(_) | Route::Other => "-",
        };
        let error = e.map(|e| e.to_string());
        tracing::info!(
            target: "taskgate::edge",
            method = mcp_method,
            path = req.uri.path(),
            route = class,
            task,
            replica = %replica,
            retries = ctx.retries,
            status,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            error = error.as_deref().unwrap_or("-"),
            "request"
        );
    }
}
