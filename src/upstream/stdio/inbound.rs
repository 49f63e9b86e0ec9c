//! Routing what a child writes: responses to the call in flight, server→client
//! requests, notifications and progress.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::child::Child;
use crate::protocol::RpcError;
use crate::upstream::legacy_messages::Inbound;
use crate::upstream::{
    CallEvent, CallOutcome, InputAnswer, InputRequest, SessionNotification, UpstreamInfo,
    legacy_messages,
};

pub(super) async fn dispatch_line(
    shared: &Shared,
    child: &Arc<Child>,
    bytes: &[u8],
    init: &mut Option<(u64, oneshot::Sender<Result<UpstreamInfo, String>>)>,
) {
    let text = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    if text.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let msg: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(_) => {
            // Stdout should carry MCP only, but stray prints are common; they are not
            // worth killing a child over.
            let preview: String = String::from_utf8_lossy(text).chars().take(200).collect();
            tracing::warn!(upstream = %shared.name(), pid = child.pid,
                "ignoring non-JSON stdout line: {preview}");
            return;
        }
    };
    match msg {
        // 2025-03-26 batches: handle each element as its own message.
        Value::Array(items) => {
            for item in items {
                dispatch(shared, child, item, init).await;
            }
        }
        other => dispatch(shared, child, other, init).await,
    }
}

pub(super) async fn dispatch(
    shared: &Shared,
    child: &Arc<Child>,
    msg: Value,
    init: &mut Option<(u64, oneshot::Sender<Result<UpstreamInfo, String>>)>,
) {
    let inbound = match legacy_messages::classify(msg) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(upstream = %shared.name(), pid = child.pid, "ignoring message: {e}");
            return;
        }
    };
    match inbound {
        Inbound::Response { id, outcome } => {
            if let Some((init_id, _)) = init
                && id.as_u64() == Some(*init_id)
            {
                let Some((_, tx)) = init.take() else { return };
                let result = match outcome {
                    CallOutcome::Result(r) => legacy_messages::parse_initialize_result(&r),
                    CallOutcome::Error(e) => Err(format!("initialize failed: {e}")),
                };
                if result.is_ok() {
                    // Queued before any call request can be, so ordering holds.
                    child.send(&legacy_messages::initialized_notification());
                }
                let _ = tx.send(result);
                return;
            }
            let active = {
                let mut a = child.active.lock();
                if a.as_ref()
                    .is_some_and(|x| id.as_u64() == Some(x.request_id))
                {
                    a.take()
                } else {
                    None
                }
            };
            match active {
                Some(active) => {
                    active.token.cancel();
                    // If the call was abandoned the receiver belongs to the grace
                    // task, which only needs to know the child settled.
                    let _ = active.reply.send(Ok(outcome));
                }
                None => {
                    tracing::debug!(upstream = %shared.name(), pid = child.pid, %id,
                        "discarding response to no in-flight request");
                }
            }
        }
        Inbound::Request { id, method, params } => {
            handle_request(shared, child, id, method, params).await;
        }
        Inbound::Notification { method, params } => {
            handle_notification(shared, child, method, params).await;
        }
    }
}

/// The in-flight, non-abandoned call's routing (cloned out so no lock is held across
/// an await).
pub(super) fn current_call(
    child: &Child,
) -> Option<(mpsc::Sender<CallEvent>, CancellationToken, Option<String>)> {
    let guard = child.active.lock();
    let a = guard.as_ref()?;
    if a.token.is_cancelled() {
        return None;
    }
    Some((a.events.clone(), a.token.clone(), a.progress_token.clone()))
}

/// Deliver an event to the call without ever blocking the reader past the call's end:
/// a closed receiver drops it, an abandoned call stops the wait.
pub(super) async fn deliver(
    events: &mpsc::Sender<CallEvent>,
    token: &CancellationToken,
    ev: CallEvent,
) -> bool {
    tokio::select! {
        r = events.send(ev) => r.is_ok(),
        () = token.cancelled() => false,
    }
}

pub(super) async fn handle_request(
    shared: &Shared,
    child: &Arc<Child>,
    id: Value,
    method: String,
    params: Option<Value>,
) {
    let is_input = matches!(
        method.as_str(),
        "elicitation/create" | "sampling/createMessage" | "roots/list"
    );
    if method == "ping" || !is_input {
        child.send(&legacy_messages::answer(
            &id,
            &crate::upstream::unowned_request_answer(&method),
        ));
        return;
    }
    let Some((events, token, _)) = current_call(child) else {
        // Attribution is a security boundary: with no call in flight nobody may see it.
        tracing::info!(upstream = %shared.name(), pid = child.pid, %method,
            "answering upstream request no call owns");
        child.send(&legacy_messages::answer(
            &id,
            &crate::upstream::unowned_request_answer(&method),
        ));
        return;
    };
    let (respond, answer_rx) = oneshot::channel();
    let ev = CallEvent::Input(InputRequest {
        method: method.clone(),
        params,
        respond,
    });
    // If delivery fails the event (and `respond`) is dropped, so `answer_rx` resolves
    // to an error right away below.
    deliver(&events, &token, ev).await;
    let child = child.clone();
    // Answering may take a human's time: don't hold up the reader meanwhile.
    tokio::spawn(async move {
        let answer = tokio::select! {
            r = answer_rx => r.unwrap_or_else(|_| InputAnswer::Error(RpcError::internal(
                format!("{method} was not answered by the gateway client"),
            ))),
            () = token.cancelled() => InputAnswer::Error(RpcError::internal(
                "the request this input belongs to is no longer in flight",
            )),
            () = child.gone.cancelled() => return,
        };
        child.send(&legacy_messages::answer(&id, &answer));
    });
}

pub(super) async fn handle_notification(
    shared: &Shared,
    child: &Arc<Child>,
    method: String,
    params: Option<Value>,
) {
    match method.as_str() {
        "notifications/progress" => {
            let Some((token, rest)) = legacy_messages::split_progress(params) else {
                return;
            };
            match current_call(child) {
                Some((events, call_token, Some(mine))) if token.as_str() == Some(mine.as_str()) => {
                    deliver(&events, &call_token, CallEvent::Progress(rest)).await;
                }
                _ => {
                    tracing::debug!(upstream = %shared.name(), pid = child.pid, %token,
                        "dropping progress for no in-flight call");
                }
            }
        }
        "notifications/message" => {
            let Some(Value::Object(p)) = params else {
                return;
            };
            match current_call(child) {
                Some((events, token, _)) => {
                    deliver(&events, &token, CallEvent::Log(p)).await;
                }
                None => {
                    let text = Value::Object(p).to_string();
                    tracing::info!(upstream = %shared.name(), pid = child.pid,
                        "upstream log outside any call: {text}");
                }
            }
        }
        "notifications/tools/list_changed"
        | "notifications/prompts/list_changed"
        | "notifications/resources/list_changed"
        | "notifications/resources/updated" => {
            // No subscribers is fine: nobody is listening yet.
            let _ = shared
                .notifications
                .send(SessionNotification { method, params });
        }
        _ => {
            tracing::debug!(upstream = %shared.name(), pid = child.pid, %method,
                "ignoring upstream notification");
        }
    }
}
