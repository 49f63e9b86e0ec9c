//! The client-facing HTTP front (MCP 2026-07-28 Streamable HTTP; docs/design.md §12
//! "HTTP front").
//!
//! Each request passes the tower stack composed in `build` from the steps of
//! `paths.rs`, `http_checks.rs`, `request_log.rs` and `dispatch.rs`, whose order is the
//! order of checks of docs/design.md §12; the first failure answers. The files import
//! one way (tests/layering.rs): this one composes and serves; the steps build on
//! `stack.rs` (the step machinery), `gateway.rs` (the shared state) and `reply.rs`.

mod admin;
mod answer;
mod answers;
pub mod conn;
pub mod dispatch;
mod era;
mod gateway;
mod head_clock;
mod headers;
mod held;
pub mod http_checks;
pub mod inline;
pub mod legacy;
mod paths;
mod pump;
mod relay;
pub mod relayed;
pub mod reply;
mod request_log;
mod rpc;
mod stack;
pub mod subscriptions;
mod task_tools;
pub mod wire;

#[cfg(test)]
mod passthrough_tests;

pub use gateway::Gateway;
pub use paths::REPLICA_HEADER;

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder};

use stack::{Async, Read, Req, Resp, RespFuture, StepLayer};

/// The client-facing request path, built once per listener and cloned per connection.
///
/// The order is the order of checks in docs/design.md §12 (the first failure answers).
/// Outermost, before them, every answer gets the `Taskgate-Replica` header
/// ([`paths::ReplicaHeader`]).
///
/// 1. path: operational endpoints and the protected-resource metadata are answered
///    here; anything but an upstream's path is 404 ([`paths::Route`]);
/// 2. Origin/Host against DNS rebinding, 403/400 ([`http_checks::OriginHost`]);
/// 3. CORS: preflight answered, admitted origins may read the answer
///    ([`http_checks::Cors`]);
///    — from here on each request gets one log line and one metrics sample
///    ([`request_log::RequestLog`]) —
/// 4. HTTP method: POST only, 405 ([`http_checks::PostOnly`]);
/// 5. auth: bearer token, 401/403 ([`http_checks::Authenticate`]);
/// 6. content negotiation: `Content-Type` 415, `Accept` 406
///    ([`http_checks::Negotiate`]);
/// 7. size: `max_body_bytes` 413, body read timeout 408
///    ([`http_checks::ReadBody`]);
///    — the era is decided here, once ([`era::DecideEra`]): a 2025-era request
///    goes on to `legacy/`'s session, then the same dispatch —
/// 8. the JSON-RPC steps over the body, one service ([`rpc::Rpc`]): parse
///    → envelope → headers vs body → `_meta` → version → method (`wire.rs`) →
///    capability → rate limits → params and ownership (`dispatch.rs`). Each needs what
///    the one before parsed, so splitting them into layers would only pass the parsed
///    message along.
///
/// tower-http is not used: its CORS layer answers every `OPTIONS` as a preflight with
/// 200 and its own `Vary` list (the gateway answers 204 for admitted origins only, and
/// 405 without an `Origin`); its body-limit and timeout layers answer 413/408 with
/// their own plain bodies, where the protocol requires a JSON-RPC error; its trace
/// layer opens a span around every event of the request, where the gateway writes one
/// line whose fields (tenant, method, task) are learned inside the stack; and the
/// gateway mints no request ids (a header it would add to every answer).
fn build(
    gw: Arc<Gateway>,
) -> impl Service<Req, Response = Resp, Error = Infallible, Future = RespFuture>
+ Clone
+ Send
+ Sync
+ 'static {
    ServiceBuilder::new()
        .layer(StepLayer(paths::ReplicaHeader::of(&gw)))
        .layer(StepLayer(paths::Route(gw.clone())))
        .layer(StepLayer(http_checks::OriginHost(gw.clone())))
        .layer(StepLayer(http_checks::Cors))
        .layer(StepLayer(request_log::RequestLog))
        .layer(StepLayer(http_checks::MethodGate))
        .layer(StepLayer(Async(http_checks::Authenticate(gw.clone()))))
        .layer(StepLayer(http_checks::Negotiate))
        .layer(StepLayer(Async(http_checks::ReadBody(gw.clone()))))
        .layer(StepLayer(Read(era::DecideEra)))
        .service(rpc::Rpc(gw))
}

/// The optional `server.metrics_listen` listener: `/metrics`, `/healthz`, `/readyz`,
/// `/livez` and the operator API under `/admin/` (`admin.rs`), under the same
/// connection rules as the main listener.
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
            let path = req.uri().path();
            if path == "/admin" || path.starts_with("/admin/") {
                return admin::serve(gw, req).await;
            }
            Ok::<_, Infallible>(match path {
                "/metrics" => reply::metrics(),
                "/healthz" => reply::json(StatusCode::OK, &json!({"status": "ok"})),
                "/livez" => gw.livez(),
                "/readyz" => gw.readyz(),
                _ => reply::empty(StatusCode::NOT_FOUND),
            })
        }
    });
    conn::serve(listener, tls, policy, shutdown, ops).await;
}

/// Accept connections until `shutdown` fires, then drain for `drain_grace_ms`.
pub async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<conn::ListenerTls>,
    shutdown: CancellationToken,
) {
    let policy = conn::ConnPolicy::from_config(&gw.cfg.server);
    conn::serve(listener, tls, policy, shutdown, build(gw)).await;
}
