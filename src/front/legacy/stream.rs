//! The standalone GET stream of a legacy session (MCP 2025-11-25 Streamable HTTP,
//! "Listening for Messages from the Server"): the upstream's list-changed
//! notifications and the updates of the resources this session subscribed to, with
//! keep-alive comments, until the client goes away or the session ends. No `id:`
//! lines, so no `Last-Event-ID` resumption: a client that loses the stream opens
//! another (docs/design.md §22 "Clients of the 2025 era").
//!
//! It also announces the status changes of the 2025-11-25 tasks this session created
//! here (`notifications/tasks/status`, docs/design.md §25).
//!
//! Opening it re-subscribes what the session record lists and this replica does not
//! hold yet: after a restart or a replica loss, the session's subscriptions follow
//! the stream to the replica that holds it now.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use super::super::gateway::Gateway;
use super::super::reply::{self, Body};
use super::live::SubChange;
use crate::auth::Principal;
use crate::protocol;
use crate::protocol::params::TaskRef;
use crate::store::SessionRecord;
use crate::tasks::{Change, dialect};
use crate::upstream::{Scope, Upstream};

/// The list-changed notifications relayed (the upstream sends only those it declares).
const LIST_CHANGED: [&str; 3] = [
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
];

pub(super) async fn open(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    rec: SessionRecord,
) -> Response<Body> {
    let sid = rec.session_id.clone();
    let own = Scope::session(&principal, &sid);
    let scope = upstream.scope_of(own);
    for uri in &rec.subscriptions {
        let change = gw
            .legacy
            .subscription(upstream.name(), &scope, uri, &sid, true);
        if change == SubChange::First {
            super::aggregate::subscribe_upstream(gw, upstream, own, uri, true).await;
        }
    }
    let mut notes = upstream.session_notifications(own);
    // Held while the stream is open: the session is in use here (never evicted or
    // expired), and its end (DELETE, expiry) on this replica ends the stream.
    let activity = gw.engine.sessions().activity(&sid);
    let live = gw.legacy.clone();
    let up = upstream.clone();
    let keepalive = gw.cfg.server.keepalive;
    let engine = gw.engine.clone();
    let mut changes = engine.subscribe_changes();
    // The status last announced per task, so each change is told once.
    let mut shown: HashMap<String, &'static str> = HashMap::new();
    let (tx, out) = mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        let ended = activity.ended();
        tokio::pin!(ended);
        let mut ticker = tokio::time::interval(keepalive);
        ticker.tick().await;
        // The headers go out at once with a first comment.
        if tx.send(reply::sse_keepalive()).await.is_err() {
            return;
        }
        loop {
            tokio::select! {
                n = notes.recv() => match n {
                    Ok(n) => {
                        let wanted = LIST_CHANGED.contains(&n.method.as_str())
                            || (n.method == "notifications/resources/updated"
                                && n.params.as_ref().and_then(|p| p.get("uri")).and_then(Value::as_str)
                                    .is_some_and(|u| live.subscribed(up.name(), &scope, &sid, u)));
                        if wanted {
                            let msg = protocol::notification(&n.method, n.params.unwrap_or_else(|| Value::Object(Default::default())));
                            if tx.send(reply::sse_event(&msg)).await.is_err() {
                                break;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                c = changes.recv() => {
                    let ids = match c {
                        Ok(Change::Task(id)) if live.follows(&sid, &id) => vec![id],
                        Ok(Change::Task(_)) => continue,
                        Ok(Change::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => live.followed(&sid),
                        Err(broadcast::error::RecvError::Closed) => break,
                    };
                    for id in ids {
                        let Ok(rec) = engine.owner_snapshot(&principal, up.name(), &TaskRef::to(&id)).await else {
                            live.unfollow(&sid, &id);
                            shown.remove(&id);
                            continue;
                        };
                        let status = dialect::status(&rec);
                        if shown.insert(id.clone(), status) != Some(status)
                            && tx.send(reply::sse_event(&dialect::status_notification(&rec))).await.is_err()
                        {
                            return;
                        }
                        if rec.status.is_terminal() {
                            live.unfollow(&sid, &id);
                            shown.remove(&id);
                        }
                    }
                }
                () = &mut ended => break,
                _ = ticker.tick() => {
                    if tx.send(reply::sse_keepalive()).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    reply::sse(out, ())
}
