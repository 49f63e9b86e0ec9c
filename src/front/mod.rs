//! The client-facing HTTP front (MCP 2026-07-28 Streamable HTTP; docs/design.md §12
//! "HTTP front").
//!
//! Each request passes the tower stack composed in `stack.rs`, whose order is the
//! order of checks of docs/design.md §12; the first failure answers.

pub mod conn;
pub mod dispatch;
pub mod http_checks;
pub mod inline;
pub mod relayed;
pub mod reply;
mod request_log;
mod stack;
pub mod subscriptions;
pub mod wire;

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::Config;
use crate::protocol::RpcError;
use crate::upstream::{TransportState, UpstreamSet};
use reply::Body;
use stack::{Req, Resp, Step, Target};

/// Everything a request handler needs, shared by all connections.
pub struct Gateway {
    pub cfg: Arc<Config>,
    pub auth: Arc<Authenticator>,
    pub upstreams: Arc<UpstreamSet>,
    pub engine: Arc<crate::tasks::Engine>,
    pub holds: Arc<crate::tasks::mrtr::Holds>,
}

const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// The response header naming the replica that answered.
pub const REPLICA_HEADER: &str = "taskgate-replica";

/// The outermost step: every reply names the replica that gave it
/// (`Taskgate-Replica`, docs/design.md §19), whichever step answered.
#[derive(Clone)]
struct ReplicaHeader(Option<HeaderValue>);

impl Step for ReplicaHeader {
    type Kept = ();

    fn before(&self, _req: &mut Req) -> Result<(), Resp> {
        Ok(())
    }

    fn after(&self, _kept: (), resp: &mut Resp) {
        if let Some(v) = &self.0 {
            resp.headers_mut().insert(REPLICA_HEADER, v.clone());
        }
    }
}

impl ReplicaHeader {
    fn of(gw: &Gateway) -> Self {
        Self(HeaderValue::from_str(gw.engine.replica_id()).ok())
    }
}

/// The path step, first of the stack: the operational and metadata endpoints are
/// answered here and need no token (docs/design.md §12 "HTTP front"); an upstream's
/// path goes on with its [`Target`]; any other path is 404.
#[derive(Clone)]
struct Route(Arc<Gateway>);

impl Step for Route {
    type Kept = ();

    fn before(&self, req: &mut Req) -> Result<(), Resp> {
        let gw = &self.0;
        let path = req.uri().path();
        // Every arm here is in `config::OPERATIONAL_PATHS`, which no upstream may use.
        match path {
            "/healthz" => return Err(reply::json(StatusCode::OK, &json!({"status": "ok"}))),
            "/readyz" => return Err(gw.readyz()),
            "/livez" => return Err(gw.livez()),
            "/metrics" => return Err(metrics_reply()),
            _ => {}
        }
        if let Some(rest) = path.strip_prefix(PRM_PATH) {
            if req.method() != Method::GET {
                return Err(method_not_allowed("GET"));
            }
            if rest.is_empty() || gw.upstreams.by_path(rest).is_some() {
                return Err(reply::json(
                    StatusCode::OK,
                    &gw.auth.resource_metadata(rest),
                ));
            }
            return Err(reply::empty(StatusCode::NOT_FOUND));
        }
        let Some(upstream) = gw.upstreams.by_path(path).cloned() else {
            return Err(reply::json(
                StatusCode::NOT_FOUND,
                &json!({"error": "not found", "path": path}),
            ));
        };
        req.extensions_mut().insert(Target(upstream));
        Ok(())
    }
}

impl Gateway {
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
        let lease = self.engine.lease_held();
        let ready = all_ready && store_ok && lease;
        reply::json(
            ok_or_unavailable(ready),
            &json!({
                "ready": ready,
                "store": if store_ok { "open" } else { "failed" },
                "lease": if lease { "held" } else { "lost" },
                "upstreams": states
            }),
        )
    }

    /// `/livez`: whether this replica itself can serve (store reachable, lease held,
    /// not draining), whatever its upstreams do: what a load balancer in front of
    /// several replicas asks (docs/design.md §21). `/readyz` also reports the
    /// upstreams, which every replica shares.
    fn livez(&self) -> Response<Body> {
        let store_ok = self.engine.store.healthy();
        let lease = self.engine.lease_held();
        let draining = self.engine.shutting_down();
        let live = store_ok && lease && !draining;
        reply::json(
            ok_or_unavailable(live),
            &json!({
                "live": live,
                "replica": self.engine.replica_id(),
                "store": if store_ok { "open" } else { "failed" },
                "lease": if lease { "held" } else { "lost" },
                "draining": draining,
            }),
        )
    }
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
pub async fn serve_ops(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<conn::ListenerTls>,
    shutdown: CancellationToken,
) {
    let policy = conn::ConnPolicy::from_config(&gw.cfg.server);
    let ops = tower::service_fn(move |req: Request<Incoming>| {
        let gw = gw.clone();
        async move {
            Ok::<_, Infallible>(match req.uri().path() {
                "/metrics" => metrics_reply(),
                "/healthz" => reply::json(StatusCode::OK, &json!({"status": "ok"})),
                "/livez" => gw.livez(),
                "/readyz" => gw.readyz(),
                _ => reply::empty(StatusCode::NOT_FOUND),
            })
        }
    });
    conn::serve(listener, tls, policy, shutdown, ops).await;
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
pub async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<conn::ListenerTls>,
    shutdown: CancellationToken,
) {
    let policy = conn::ConnPolicy::from_config(&gw.cfg.server);
    conn::serve(listener, tls, policy, shutdown, stack::build(gw)).await;
}

/// 200 for a probe that passes, 503 for one that does not (`/readyz`, `/livez`).
fn ok_or_unavailable(pass: bool) -> StatusCode {
    if pass {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}
