//! Sending an MRTR retry to the replica that holds its call (docs/design.md §19 "Any
//! replica answers"): the retry and the holder's reply as they travel through the
//! store. The holder's side is `relayed.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::gateway::Gateway;
use super::reply::{self, Body};
use crate::auth::Principal;
use crate::protocol::params::{Forward, Params};
use crate::protocol::{Method, Request, RequestMeta, RpcError, ValidRequest};
use crate::upstream::Upstream;

/// Added to `sync_timeout_ms` while waiting for the holder: its own bound comes first.
const RELAY_MARGIN: Duration = Duration::from_secs(10);

/// A retry as the holder receives it: the caller was authenticated by the replica
/// that relays it (the store is shared and trusted by both).
#[derive(Serialize, Deserialize)]
pub(super) struct RelayedRetry {
    pub(super) tenant: String,
    pub(super) subject: String,
    pub(super) upstream: String,
    pub(super) req: WireRequest,
}

/// A request as it travels to the holder: the params as a map again, parsed there as
/// the wire parses them. The shape is the one replicas have always exchanged, so
/// replicas of mixed versions understand each other.
#[derive(Serialize, Deserialize)]
pub(super) struct WireRequest {
    id: Value,
    method: Method,
    params: Map<String, Value>,
    meta: RequestMeta,
    idempotency_key: Option<String>,
}

impl WireRequest {
    pub(super) fn of<P: AsRef<Forward>>(req: &Request<P>) -> Self {
        Self {
            id: req.id.clone(),
            method: req.method,
            params: req.params.as_ref().to_map(),
            meta: req.meta.clone(),
            idempotency_key: req.idempotency_key.clone(),
        }
    }

    pub(super) fn into_request(self) -> ValidRequest {
        ValidRequest {
            id: self.id,
            method: self.method,
            params: Params::parse(self.method, self.params),
            meta: self.meta,
            idempotency_key: self.idempotency_key,
        }
    }
}

/// The holder's reply, as it would have gone to the client.
#[derive(Serialize, Deserialize)]
pub(super) struct RelayedReply {
    pub(super) status: u16,
    pub(super) content_type: Option<String>,
    pub(super) body: String,
}

pub(super) fn invalid_state(id: &Value) -> Response<Body> {
    reply::rpc_error(
        StatusCode::OK,
        Some(id),
        &RpcError::invalid_params("invalid or expired requestState"),
    )
}

/// Relay `req` to `replica` and answer with its reply. A holder that is gone (its
/// held calls went with it) answers like an unknown state.
pub(super) async fn retry_at(
    gw: &Gateway,
    replica: &str,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    req: &Request<impl AsRef<Forward>>,
) -> Response<Body> {
    let retry = RelayedRetry {
        tenant: principal.tenant.clone(),
        subject: principal.subject.clone(),
        upstream: upstream.name().to_string(),
        req: WireRequest::of(req),
    };
    let Ok(request) = serde_json::to_value(&retry) else {
        return invalid_state(&req.id);
    };
    let wait = gw.cfg.tasks.sync_timeout + RELAY_MARGIN;
    let Some(v) = gw.engine.relay_mrtr(replica, request, wait).await else {
        return invalid_state(&req.id);
    };
    let Ok(r) = serde_json::from_value::<RelayedReply>(v) else {
        return invalid_state(&req.id);
    };
    let mut resp = Response::new(reply::full(Bytes::from(r.body)));
    *resp.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Some(ct) = r.content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    resp
}
