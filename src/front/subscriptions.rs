//! `subscriptions/listen` (MCP 2026-07-28 `subscriptions/listen`; docs/design.md §15 "Notifications"): an SSE stream that starts
//! with the acknowledgement and then relays the notifications the filter asked for,
//! each tagged with the listen request's id as `subscriptionId`.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::gateway::Gateway;
use super::pump;
use super::reply::{self, Body};
use crate::auth::Principal;
use crate::protocol::RequestId;
use crate::protocol::params::{ListenParams, TaskRef};
use crate::protocol::{self, META_SUBSCRIPTION_ID};
use crate::tasks::Change;
use crate::upstream::{SessionNotification, TransportState, Upstream, UpstreamInfo};

/// List-changed filter flags asked for, with the server capability each needs: an
/// upstream that does not declare the feature never sends its list changes, so the
/// flag is not acknowledged (nor is any while the identity is the placeholder of an
/// upstream that never answered).
fn list_flags(p: &ListenParams) -> [(bool, &'static str, &'static str); 3] {
    [
        (p.tools_list_changed, "toolsListChanged", "tools"),
        (p.prompts_list_changed, "promptsListChanged", "prompts"),
        (
            p.resources_list_changed,
            "resourcesListChanged",
            "resources",
        ),
    ]
}

/// The filter flag that admits an upstream session notification.
fn flag_for(method: &str) -> Option<&'static str> {
    match method {
        "notifications/tools/list_changed" => Some("toolsListChanged"),
        "notifications/prompts/list_changed" => Some("promptsListChanged"),
        "notifications/resources/list_changed" => Some("resourcesListChanged"),
        _ => None,
    }
}

fn tagged(method: &str, params: Option<Value>, sub_id: &Value) -> Value {
    let mut p = match params {
        Some(Value::Object(o)) => o,
        _ => Map::new(),
    };
    let meta = p.entry("_meta").or_insert_with(|| json!({}));
    if let Value::Object(m) = meta {
        m.insert(META_SUBSCRIPTION_ID.into(), sub_id.clone());
    }
    protocol::notification(method, Value::Object(p))
}

pub fn open(
    upstream: &Arc<Upstream>,
    principal: &Principal,
    id: &RequestId,
    filter: &ListenParams,
    info: &UpstreamInfo,
    gw: &Gateway,
) -> Response<Body> {
    // Resource updates need the legacy `resources/subscribe` per uri (MCP 2025-11-25 "Resources", "Subscriptions").
    let can_subscribe = crate::protocol::fields::can_subscribe_resources(&info.capabilities);
    let mut honoured = Map::new();
    for (asked, flag, capability) in list_flags(filter) {
        if asked && info.capabilities.contains_key(capability) {
            honoured.insert(flag.into(), Value::Bool(true));
        }
    }
    // Subscribing needs the upstream to answer `resources/subscribe`; the
    // acknowledgement never waits for one that is down or still starting (README
    // "Task plane and upstream plane"): its resources are then acknowledged as not
    // subscribed, and the client may listen again later.
    let can_subscribe = can_subscribe && upstream.state() == TransportState::Ready;
    let names_uris = filter.resource_subscriptions.is_some();
    let wanted_uris = filter.resource_subscriptions.clone().unwrap_or_default();
    let wanted_tasks = filter.task_ids.clone();
    let sub_id = id.clone();
    let rx = upstream.session_notifications(principal);
    let up = upstream.clone();
    let who = principal.clone();
    let task_rx = gw.engine.subscribe_changes();
    let engine = gw.engine.clone();
    let keepalive = gw.cfg.server.keepalive;
    let (tx, out) = mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        // Only the caller's own tasks are acknowledged; others are dropped silently.
        let mut task_ids: Vec<String> = Vec::new();
        if let Some(ids) = wanted_tasks {
            for id in ids {
                if engine
                    .resolve(&who, up.name(), &TaskRef::to(&id))
                    .await
                    .is_ok()
                    && !task_ids.contains(&id)
                {
                    task_ids.push(id);
                }
            }
            honoured.insert("taskIds".into(), json!(task_ids));
        }
        let mut uris: Vec<String> = Vec::new();
        if can_subscribe {
            for uri in wanted_uris {
                if uris.contains(&uri) {
                    continue;
                }
                if subscribe(&engine, &up, &who, "resources/subscribe", &uri).await {
                    uris.push(uri);
                }
            }
        }
        if !uris.is_empty() || names_uris {
            honoured.insert("resourceSubscriptions".into(), json!(uris));
        }
        let ack = tagged(
            "notifications/subscriptions/acknowledged",
            Some(json!({ "notifications": Value::Object(honoured.clone()) })),
            &sub_id,
        );
        if tx.send(reply::sse_event(&ack)).await.is_ok() {
            // Only a stream that follows tasks hears their changes.
            let changes = (!task_ids.is_empty()).then_some(task_rx);
            let listen = Listen {
                engine: engine.clone(),
                up: up.clone(),
                who: who.clone(),
                honoured,
                uris: uris.clone(),
                task_ids,
                sub_id,
                shown: Shown::new(),
            };
            let src = pump::Sources {
                notes: rx,
                changes,
                followed: None,
                ended: Box::pin(std::future::pending()),
            };
            pump::pump(listen, src, &tx, keepalive).await;
        }
        for uri in &uris {
            subscribe(&engine, &up, &who, "resources/unsubscribe", uri).await;
        }
    });
    reply::sse(out, ())
}

/// Ask the upstream to (un)subscribe a resource; `true` when it accepted.
async fn subscribe(
    engine: &crate::tasks::Engine,
    up: &Upstream,
    who: &Principal,
    method: &str,
    uri: &str,
) -> bool {
    let mut params = Map::new();
    params.insert("uri".into(), Value::from(uri));
    let (tx, _rx) = mpsc::channel(1);
    let spec = crate::upstream::CallSpec {
        method: method.into(),
        tool: None,
        params,
        want_progress: false,
        tenant: None,
        session: None,
    };
    matches!(
        engine.call_upstream(up, who, spec, tx).await,
        Ok(crate::upstream::CallOutcome::Result(_))
    )
}

/// What a subscriber was last shown of each task: a hash of the snapshot without its
/// adaptive `pollIntervalMs`, so a resync (which reads every subscribed task again,
/// every poll interval when change fan-out polls; docs/design.md §27 "Connection
/// poolers") tells only what changed.
type Shown = HashMap<String, u64>;

fn shown_hash(detailed: &Map<String, Value>) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (k, v) in detailed {
        if k != "pollIntervalMs" {
            k.hash(&mut h);
            v.to_string().hash(&mut h);
        }
    }
    h.finish()
}

/// Send the current snapshot of `id`, equal to what tasks/get returns now (MCP Tasks
/// extension, "Task Status Notifications"): the same read path (owned, unexpired,
/// durable, poll interval adapted), so a completed result carries the upstream's
/// current identity. With `only_changed`, nothing is sent when the subscriber was
/// shown the same already. `false` once the client is gone.
#[allow(clippy::too_many_arguments)]
async fn send_snapshot(
    tx: &mpsc::Sender<Bytes>,
    engine: &Arc<crate::tasks::Engine>,
    up: &Arc<Upstream>,
    who: &Principal,
    id: &str,
    sub_id: &Value,
    shown: &mut Shown,
    only_changed: bool,
) -> bool {
    let Ok(rec) = engine
        .owner_snapshot(who, up.name(), &TaskRef::to(id))
        .await
    else {
        return true;
    };
    let info = up.identity();
    let detailed = crate::tasks::detailed(&rec, &info.server_info);
    let hash = shown_hash(&detailed);
    if shown.insert(id.to_string(), hash) == Some(hash) && only_changed {
        return true;
    }
    let n = tagged("notifications/tasks", Some(Value::Object(detailed)), sub_id);
    if tx.send(reply::sse_event(&n)).await.is_err() {
        return false;
    }
    // Only the owner's task ids are on this stream (`open`).
    engine.note_seen(&rec);
    true
}

/// A `subscriptions/listen` stream: the notifications its filter admits and the
/// snapshots of the caller's tasks it named, each tagged with the request's id.
struct Listen {
    engine: Arc<crate::tasks::Engine>,
    up: Arc<Upstream>,
    who: Principal,
    honoured: Map<String, Value>,
    uris: Vec<String>,
    task_ids: Vec<String>,
    sub_id: Value,
    shown: Shown,
}

impl pump::Stream for Listen {
    fn notification(&mut self, n: SessionNotification) -> Option<Value> {
        let admitted = flag_for(&n.method).is_some_and(|f| self.honoured.contains_key(f))
            || (n.method == "notifications/resources/updated"
                && crate::protocol::fields::notified_uri(n.params.as_ref())
                    .is_some_and(|u| self.uris.iter().any(|x| x == u)));
        admitted.then(|| tagged(&n.method, n.params, &self.sub_id))
    }

    fn changed(&mut self, c: Result<Change, RecvError>) -> pump::Reread {
        match c {
            Ok(Change::Task(id)) => pump::Reread::Tasks {
                ids: self
                    .task_ids
                    .iter()
                    .filter(|t| **t == id)
                    .cloned()
                    .collect(),
                only_changed: false,
            },
            // Changes were missed (the store's listener reconnected, or this receiver
            // fell behind), or the fan-out polls: read every task again and tell what
            // changed.
            Ok(Change::Resync) | Err(RecvError::Lagged(_)) => pump::Reread::Tasks {
                ids: self.task_ids.clone(),
                only_changed: true,
            },
            Err(RecvError::Closed) => pump::Reread::Stop,
        }
    }

    /// The tasks are named when the stream opens.
    fn follow(&mut self, _id: String) -> Option<String> {
        None
    }

    async fn announce(&mut self, id: &str, only_changed: bool, tx: &mpsc::Sender<Bytes>) -> bool {
        send_snapshot(
            tx,
            &self.engine,
            &self.up,
            &self.who,
            id,
            &self.sub_id,
            &mut self.shown,
            only_changed,
        )
        .await
    }
}
