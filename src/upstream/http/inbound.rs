//! Messages from the upstream on any stream: server→client requests and their
//! answers, progress routed by token, broadcast notifications.

use std::collections::HashMap;

use parking_lot::MutexGuard;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use super::session::Session;
use super::state::{HttpUpstream, ProgressTarget};
use crate::protocol::RpcError;
use crate::upstream::legacy_messages::Inbound;
use crate::upstream::{
    CallEvent, CallOutcome, InputAnswer, InputRequest, SessionNotification, legacy_messages,
};

impl HttpUpstream {
    /// Answer an upstream server→client request once `answer` resolves. Runs detached
    /// and holds only a weak reference, so a gateway that never answers leaks nothing
    /// but a parked task.
    pub(super) fn spawn_answer<F>(&self, session: Session, id: Value, answer: F)
    where
        F: Future<Output = InputAnswer> + Send + 'static,
    {
        let me = self.me.clone();
        tokio::spawn(async move {
            let answer = answer.await;
            let Some(me) = me.upgrade() else { return };
            if me.is_shutting_down() {
                return;
            }
            let msg = legacy_messages::answer(&id, &answer);
            if let Err(e) = me.post_message(&session, &msg).await {
                tracing::warn!(upstream = %me.name, id = %id, "answering upstream request failed: {e}");
                me.message_failed(&session, "answering an upstream request", &e);
            }
        });
    }
    /// Route one message received on a call's stream. Returns the call's outcome when
    /// this is the final response.
    pub(super) async fn handle_inbound(
        &self,
        msg: Value,
        ctx: &mut CallCtx<'_>,
    ) -> Option<CallOutcome> {
        let inbound = match legacy_messages::classify(msg) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(upstream = %self.name, "ignoring malformed message: {e}");
                return None;
            }
        };
        match inbound {
            Inbound::Response { id, outcome } => {
                if id_matches(&id, ctx.request_id) {
                    return Some(outcome);
                }
                tracing::debug!(upstream = %self.name, id = %id, "ignoring response to another request");
            }
            Inbound::Request { id, method, params } => match (method.as_str(), ctx.events) {
                ("elicitation/create" | "sampling/createMessage" | "roots/list", Some(events)) => {
                    let (respond, rx) = oneshot::channel();
                    let req = InputRequest {
                        method,
                        params,
                        respond,
                    };
                    // If the receiver is gone the request (and `respond`) is dropped,
                    // which the answer task below turns into an error answer.
                    let _ = events.send(CallEvent::Input(req)).await;
                    self.spawn_answer(ctx.session.clone(), id, async move {
                        rx.await.unwrap_or_else(|_| {
                            InputAnswer::Error(RpcError::internal(
                                "the gateway could not obtain an answer for this request",
                            ))
                        })
                    });
                }
                _ => {
                    let answer = crate::upstream::unowned_request_answer(&method);
                    self.spawn_answer(ctx.session.clone(), id, std::future::ready(answer));
                }
            },
            Inbound::Notification { method, params } => match method.as_str() {
                "notifications/progress" => {
                    if let Some((t, rest)) = legacy_messages::split_progress(params) {
                        match (ctx.events, &ctx.token) {
                            (Some(events), Some(token)) if &t == token => {
                                let _ = events.send(CallEvent::Progress(rest)).await;
                            }
                            // Another call's token on this stream: route it by token.
                            _ => self.route_progress(ctx.session.generation, &t, rest),
                        }
                    }
                }
                "notifications/message" => {
                    if let Some(events) = ctx.events {
                        let p = match params {
                            Some(Value::Object(m)) => m,
                            _ => Map::new(),
                        };
                        let _ = events.send(CallEvent::Log(p)).await;
                    }
                }
                "notifications/cancelled" => {}
                _ => self.broadcast(method, params),
            },
        }
        None
    }

    pub(super) fn progress_routes(&self) -> MutexGuard<'_, HashMap<u64, ProgressTarget>> {
        self.progress_routes.lock()
    }

    /// Deliver progress that arrived on a stream other than its call's own POST stream
    /// (the standalone GET stream, or another call's stream) to the call its token
    /// names, if that call is in flight in the session (`generation`) that carried it.
    /// Never waits: the caller may be the GET stream reader, which serves every call
    /// of the session; when the call's event queue is full this report is dropped,
    /// which loses nothing a later report will not replace.
    pub(super) fn route_progress(
        &self,
        generation: u64,
        token: &Value,
        params: Map<String, Value>,
    ) {
        let target = token.as_u64().and_then(|t| {
            self.progress_routes()
                .get(&t)
                .filter(|r| r.generation == generation)
                .and_then(|r| r.events.upgrade())
        });
        let Some(events) = target else {
            tracing::debug!(upstream = %self.name, token = %token, "progress for no call in flight dropped");
            return;
        };
        if events.try_send(CallEvent::Progress(params)).is_err() {
            tracing::debug!(upstream = %self.name, token = %token, "progress dropped: the call's event queue is full or closed");
        }
    }

    pub(super) fn broadcast(&self, method: String, params: Option<Value>) {
        // No receivers is normal (nobody listening): not an error.
        let _ = self
            .notifications
            .send(SessionNotification { method, params });
    }
}

/// Per-call routing context.
pub(super) struct CallCtx<'a> {
    /// The request's method, for what the logs say about a failure.
    pub(super) what: &'a str,
    pub(super) request_id: u64,
    pub(super) token: Option<Value>,
    pub(super) events: Option<&'a mpsc::Sender<CallEvent>>,
    pub(super) session: Session,
    pub(super) last_event_id: Option<String>,
    pub(super) retry_ms: Option<u64>,
}

impl<'a> CallCtx<'a> {
    pub(super) fn new(
        what: &'a str,
        request_id: u64,
        token: Option<Value>,
        events: Option<&'a mpsc::Sender<CallEvent>>,
        session: Session,
    ) -> Self {
        Self {
            what,
            request_id,
            token,
            events,
            session,
            last_event_id: None,
            retry_ms: None,
        }
    }
}

/// A call's entry in [`HttpUpstream::progress_routes`]; removed on drop, so the token
/// stops routing as soon as the call is answered, fails or is cancelled.
pub(super) struct ProgressRoute<'a> {
    pub(super) upstream: &'a HttpUpstream,
    pub(super) token: u64,
}

impl ProgressRoute<'_> {
    pub(super) fn register(&self, generation: u64, events: &mpsc::Sender<CallEvent>) {
        self.upstream.progress_routes().insert(
            self.token,
            ProgressTarget {
                generation,
                events: events.downgrade(),
            },
        );
    }
}

impl Drop for ProgressRoute<'_> {
    fn drop(&mut self) {
        self.upstream.progress_routes().remove(&self.token);
    }
}

pub(super) fn id_matches(id: &Value, ours: u64) -> bool {
    id.as_u64() == Some(ours) || id.as_str().is_some_and(|s| s == ours.to_string())
}

/// 2025-03-26 allowed batches; later revisions send single messages.
pub(super) fn split_batch(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items,
        other => vec![other],
    }
}
