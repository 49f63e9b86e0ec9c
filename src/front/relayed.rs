//! MRTR retries between replicas (docs/design.md §19 "Any replica answers"): a retry
//! whose `requestState` names another replica is sent to it through the store; that
//! replica serves it exactly as if the client had sent it there and the reply comes
//! back the same way.
//!
//! The holder serves the retry to the end before answering, so a streamed (SSE) reply
//! reaches the client in one piece when it is complete, not event by event.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::Gateway;
use super::reply::{self, Body};
use crate::auth::Principal;
use crate::protocol::{RpcError, ValidRequest};
use crate::tasks::replica::MrtrHandler;
use crate::upstream::Upstream;

/// Added to `sync_timeout_ms` while waiting for the holder: its own bound comes first.
const RELAY_MARGIN: Duration = Duration::from_secs(10);

/// A retry as the holder receives it: the caller was authenticated by the replica
/// that relays it (the store is shared and trusted by both).
#[derive(Serialize, Deserialize)]
struct RelayedRetry {
    tenant: String,
    subject: String,
    upstream: String,
    req: ValidRequest,
}

/// The holder's reply, as it would have gone to the client.
#[derive(Serialize, Deserialize)]
struct RelayedReply {
    status: u16,
    content_type: Option<String>,
    body: String,
}

fn invalid_state(req: &ValidRequest) -> Response<Body> {
    reply::rpc_error(
        StatusCode::OK,
        Some(&req.id),
        &RpcError::invalid_params("invalid or expired requestState"),
    )
}

/// Relay `req` to `replica` and answer with its reply. A holder that is gone (its
/// held calls went with it) answers like an unknown state.
pub async fn retry_at(
    gw: &Gateway,
    replica: &str,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    req: &ValidRequest,
) -> Response<Body> {
    let retry = RelayedRetry {
        tenant: principal.tenant.clone(),
        subject: principal.subject.clone(),
        upstream: upstream.name().to_string(),
        req: req.clone(),
    };
    let Ok(request) = serde_json::to_value(&retry) else {
        return invalid_state(req);
    };
    let wait = Duration::from_millis(gw.cfg.tasks.sync_timeout_ms) + RELAY_MARGIN;
    let Some(v) = gw.engine.relay_mrtr(replica, request, wait).await else {
        return invalid_state(req);
    };
    let Ok(r) = serde_json::from_value::<RelayedReply>(v) else {
        return invalid_state(req);
    };
    let mut resp = Response::new(reply::full(Bytes::from(r.body)));
    *resp.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Some(ct) = r.content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    resp
}

/// What serves retries relayed to this replica (installed on the engine at start).
pub fn handler(gw: Weak<Gateway>) -> MrtrHandler {
    Arc::new(move |request: Value| {
        let gw = gw.clone();
        Box::pin(async move {
            let reply = match (
                gw.upgrade(),
                serde_json::from_value::<RelayedRetry>(request),
            ) {
                (Some(gw), Ok(r)) => serve(&gw, r).await,
                _ => RelayedReply {
                    status: 503,
                    content_type: None,
                    body: String::new(),
                },
            };
            serde_json::to_value(reply).unwrap_or(Value::Null)
        })
    })
}

async fn serve(gw: &Gateway, r: RelayedRetry) -> RelayedReply {
    let principal = Principal {
        tenant: r.tenant,
        subject: r.subject,
    };
    let resp = match gw.upstreams.by_name(&r.upstream).cloned() {
        Some(up) => super::dispatch::dispatch(gw, &up, principal, r.req, Instant::now()).await,
        None => invalid_state(&r.req),
    };
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match resp.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(never) => match never {},
    };
    RelayedReply {
        status,
        content_type,
        body,
    }
}
