//! The standalone GET stream of a session.

use std::sync::Weak;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::consts::{ACCEPT_SSE, INITIAL_BACKOFF, MAX_BACKOFF};
use super::inbound::split_batch;
use super::request::is_event_stream;
use super::session::Session;
use super::state::HttpUpstream;
use crate::upstream::legacy_messages;
use crate::upstream::legacy_messages::Inbound;
use crate::upstream::sse::SseParser;

/// The standalone GET stream of one session: unsolicited notifications, requests no
/// call owns, and progress that some servers send here for a call (routed by token).
/// Reconnects with backoff while that session is current; stops on 405.
pub(super) async fn listen(me: Weak<HttpUpstream>, session: Session, stop: CancellationToken) {
    let mut backoff = INITIAL_BACKOFF;
    let mut last_id: Option<String> = None;
    // Ended with the session (retired and unused): a dead session's GET stream may
    // stay open without a byte forever (python-sdk 1.9), so waiting for it to close
    // would leak the connection.
    let ended = session.live.ended.clone();
    loop {
        let (resp, max) = {
            let Some(up) = me.upgrade() else { return };
            let current = up
                .current_session()
                .is_some_and(|s| s.generation == session.generation);
            if !current || up.is_shutting_down() {
                return;
            }
            let resp = tokio::select! {
                _ = stop.cancelled() => return,
                _ = ended.cancelled() => return,
                r = up.send(Method::GET, None, Some(&session), ACCEPT_SSE, last_id.as_deref()) => r,
            };
            match resp {
                Ok(r) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                    tracing::debug!(upstream = %up.name, "upstream offers no GET stream");
                    return;
                }
                Ok(r) if r.status() == StatusCode::NOT_FOUND && session.id.is_some() => {
                    up.lose_session(&session, "session expired (404 on GET stream)");
                    return;
                }
                Ok(r) if r.status().is_success() && is_event_stream(&r) => {
                    (Some(r), up.max_message_bytes)
                }
                Ok(r) if r.status().is_success() => {
                    tracing::debug!(upstream = %up.name, "GET answered without an event stream; not listening");
                    return;
                }
                Ok(r) => {
                    let status = r.status();
                    tracing::debug!(upstream = %up.name, %status, "GET stream refused");
                    (None, 0)
                }
                Err(e) => {
                    tracing::debug!(upstream = %up.name, "GET stream failed: {}", e.reason());
                    (None, 0)
                }
            }
        };
        if let Some(resp) = resp {
            backoff = INITIAL_BACKOFF;
            let mut body = resp.into_body();
            let mut parser = SseParser::new(max);
            loop {
                let frame = tokio::select! {
                    _ = stop.cancelled() => return,
                _ = ended.cancelled() => return,
                    f = body.frame() => f,
                };
                let Some(Ok(frame)) = frame else { break };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let Ok(events) = parser.feed(&data) else {
                    if let Some(up) = me.upgrade() {
                        tracing::warn!(upstream = %up.name, "oversized event on GET stream; reconnecting");
                    }
                    break;
                };
                for ev in events {
                    if let Some(id) = ev.id.filter(|id| !id.is_empty()) {
                        last_id = Some(id);
                    }
                    if ev.data.is_empty() {
                        continue;
                    }
                    let Some(up) = me.upgrade() else { return };
                    let Ok(value) = serde_json::from_str::<Value>(&ev.data) else {
                        tracing::warn!(upstream = %up.name, "invalid JSON on GET stream");
                        continue;
                    };
                    for msg in split_batch(value) {
                        match legacy_messages::classify(msg) {
                            Ok(Inbound::Request { id, method, .. }) => {
                                let answer = crate::upstream::unowned_request_answer(&method);
                                up.spawn_answer(session.clone(), id, std::future::ready(answer));
                            }
                            Ok(Inbound::Notification { method, params }) => match method.as_str() {
                                // Progress names its call by our token (module docs).
                                "notifications/progress" => {
                                    if let Some((t, rest)) = legacy_messages::split_progress(params)
                                    {
                                        up.route_progress(session.generation, &t, rest);
                                    }
                                }
                                "notifications/message" | "notifications/cancelled" => {
                                    tracing::debug!(upstream = %up.name, %method, "unattributed notification dropped");
                                }
                                _ => up.broadcast(method, params),
                            },
                            Ok(Inbound::Response { .. }) | Err(_) => {}
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
                _ = ended.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
