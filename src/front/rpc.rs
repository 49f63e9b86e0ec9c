//! The JSON-RPC service, the innermost of the stack (`build` in `mod.rs`): it takes a
//! request whose body has been read and whose era the era step decided, and hands it
//! to what serves that era: wire validation (`wire.rs`) and then the dispatch shared
//! by both eras (`dispatch.rs`) for a 2026 request; the session (`legacy/`), which
//! ends in the same dispatch, for a 2025-era one.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::StatusCode;
use tokio::time::Instant;
use tracing::Instrument;

use super::dispatch::dispatch;
use super::era::{Era, ParsedBody};
use super::gateway::Gateway;
use super::legacy;
use super::reply;
use super::stack::{LogFields, ReadRequest, Received, Resp, RespFuture, Target};
use super::wire;
use crate::auth::Principal;
use crate::protocol::RpcError;
use crate::telemetry;

/// The JSON-RPC service over a request whose body has been read: parse → envelope →
/// headers vs body → `_meta` → version → method ([`wire::validate`]), then capability
/// → rate limits → params and ownership ([`dispatch`]).
#[derive(Clone)]
pub(super) struct Rpc(pub(super) Arc<Gateway>);

impl tower::Service<ReadRequest> for Rpc {
    type Response = Resp;
    type Error = Infallible;
    type Future = RespFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ReadRequest) -> Self::Future {
        let gw = self.0.clone();
        Box::pin(async move { Ok(serve_rpc(&gw, req).await) })
    }
}

async fn serve_rpc(gw: &Gateway, req: ReadRequest) -> Resp {
    let (mut parts, bytes) = req.into_parts();
    // A body the era step parsed to decide is not parsed again.
    let parsed = parts.extensions.remove::<ParsedBody>();
    let ext = &parts.extensions;
    // The path and auth steps put these in the extensions of every request they pass
    // on; a request without them never left those steps.
    let (Some(Target(upstream)), Some(principal)) = (
        ext.get::<Target>().cloned(),
        ext.get::<Principal>().cloned(),
    ) else {
        tracing::error!("a request reached the JSON-RPC service without its route or principal");
        return reply::rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            &RpcError::internal("internal error"),
        );
    };
    let received = ext.get::<Received>().map_or_else(Instant::now, |r| r.0);
    // The 2025-era paths, like the heavy arms of `dispatch`, are boxed: a future is as
    // large as its largest state and is moved whole into the box the service returns,
    // so unboxed, every `tasks/get` would carry and copy the 48 KB state of a
    // `tools/call` (ARCHITECTURE.md "The request path").
    // The method gate passed a GET or DELETE only for a 2025-era session.
    if parts.method == http::Method::GET {
        return Box::pin(legacy::serve_get(gw, &upstream, principal, &parts)).await;
    }
    if parts.method == http::Method::DELETE {
        return Box::pin(legacy::serve_delete(gw, &upstream, principal, &parts)).await;
    }
    // The era the era step decided (docs/design.md §22 "Clients of the 2025 era").
    let tool_headers = |tool: &str| super::task_tools::tool_headers(gw, &upstream, tool);
    if ext.get::<Era>() == Some(&Era::Legacy) {
        let body = match parsed {
            Some(ParsedBody(p)) => p,
            None => wire::parse(&bytes),
        };
        return match body {
            Ok(v) => {
                let post = legacy::serve_post(gw, &upstream, principal, &parts, v, received);
                Box::pin(post).await
            }
            Err(rej) => reply::rpc_error(rej.status, rej.id.as_ref(), &rej.error),
        };
    }
    let validated = match parsed {
        Some(ParsedBody(Ok(v))) => wire::validate_parsed(v, &parts.headers, &tool_headers),
        Some(ParsedBody(Err(rej))) => Err(rej),
        None => wire::validate_with(&bytes, &parts.headers, &tool_headers),
    };
    let valid = match validated {
        Ok(wire::Incoming::Notification) => return reply::empty(StatusCode::ACCEPTED),
        Ok(wire::Incoming::Request(r)) => r,
        Err(rej) => return reply::rpc_error(rej.status, rej.id.as_ref(), &rej.error),
    };
    if let Some(log) = ext.get::<LogFields>() {
        log.update(|l| {
            l.method = Some(valid.method);
            if valid.method.is_task_method() {
                l.task_id = valid.params.task_id().map(|t| t.chars().take(64).collect());
            }
        });
    }
    // Without traces the request is served exactly as before they existed.
    if !telemetry::enabled() {
        return dispatch(gw, &upstream, principal, *valid, received).await;
    }
    let target = valid
        .params
        .forward()
        .and_then(|f| telemetry::target_of(valid.method.as_str(), f.upstream.as_map()));
    let span = telemetry::server_span(telemetry::Incoming {
        method: valid.method.as_str(),
        target,
        protocol_version: &valid.meta.protocol_version,
        session: None,
        request_id: &valid.id,
        headers: &parts.headers,
        meta: &valid.meta.trace,
    });
    telemetry::record_principal_of(&span, &principal.tenant, &principal.subject);
    Box::pin(dispatch(gw, &upstream, principal, *valid, received).instrument(span)).await
}
