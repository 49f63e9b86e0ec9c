//! MRTR retries between replicas, the holder's side (docs/design.md §19 "Any replica
//! answers"): a retry whose `requestState` names this replica was sent here through
//! the store (`relay.rs`); it is served exactly as if the client had sent it here and
//! the reply goes back the same way.
//!
//! The holder serves the retry to the end before answering, so a streamed (SSE) reply
//! reaches the client in one piece when it is complete, not event by event.

use std::sync::{Arc, Weak};

use http::header;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::time::Instant;

use super::gateway::Gateway;
use super::relay::{RelayedReply, RelayedRetry, invalid_state};
use crate::auth::Principal;
use crate::tasks::MrtrHandler;

/// What serves retries relayed to this replica (installed on the engine at start).
pub fn handler(gw: Weak<Gateway>) -> MrtrHandler {
    Arc::new(move |request: Value| {
        let gw = gw.clone();
        Box::pin(async move {
            let reply = match (gw.upgrade(), decode_retry(&request)) {
                (Some(gw), Some(r)) => serve(&gw, r).await,
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

/// The retry in a relayed request. Read from its text, not with `from_value`: a
/// `Value` deserializer hands a number that parses as an integer over as one, so an
/// answer's `-0` would arrive as `0`; the text parser keeps every number's text.
pub(super) fn decode_retry(request: &Value) -> Option<RelayedRetry> {
    let text = serde_json::to_vec(request).ok()?;
    serde_json::from_slice(&text).ok()
}

async fn serve(gw: &Gateway, r: RelayedRetry) -> RelayedReply {
    let principal = Principal {
        tenant: r.tenant,
        subject: r.subject,
    };
    let req = r.req.into_request();
    let resp = match gw.upstreams.by_name(&r.upstream).cloned() {
        Some(up) => super::dispatch::dispatch(gw, &up, principal, req, Instant::now()).await,
        None => invalid_state(&req.id),
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
