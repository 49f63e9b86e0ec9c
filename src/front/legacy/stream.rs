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
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::super::gateway::Gateway;
use super::super::pump;
use super::super::reply::{self, Body};
use super::dialect;
use super::live::SubChange;
use crate::auth::Principal;
use crate::protocol;
use crate::protocol::params::TaskRef;
use crate::store::SessionRecord;
use crate::tasks::ErrorClass;
use crate::tasks::{Change, Engine};
use crate::upstream::{Scope, SessionNotification, Upstream};

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
    let notes = upstream.session_notifications(own);
    // Held while the stream is open: the session is in use here (never evicted or
    // expired), and its end (DELETE, expiry) on this replica ends the stream.
    let activity = gw.engine.sessions().activity(&sid);
    let live = gw.legacy.clone();
    let keepalive = gw.cfg.server.keepalive;
    // Only a 2025-11-25 session has tasks to announce: only its stream hears task
    // changes at all.
    let dialect_session = super::tasks::speaks_tasks(&rec.protocol_version);
    let opened = dialect_session.then(|| live.open_task_stream(&sid));
    let (token, created) = match opened {
        Some((t, rx)) => (Some(t), Some(rx)),
        None => (None, None),
    };
    let changes = dialect_session.then(|| gw.engine.subscribe_changes());
    let stream = SessionStream {
        engine: gw.engine.clone(),
        principal,
        up: upstream.clone(),
        live: live.clone(),
        scope,
        sid: sid.clone(),
        followed: HashMap::new(),
    };
    let (tx, out) = mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        // However the stream ends, its channel for new tasks goes with it.
        let _closing = token.map(|t| StreamClose {
            live,
            session: sid,
            token: t,
        });
        let src = pump::Sources {
            notes,
            changes,
            followed: created,
            ended: Box::pin(activity.ended()),
        };
        // The headers go out at once with a first comment.
        if tx.send(reply::sse_keepalive()).await.is_err() {
            return;
        }
        pump::pump(stream, src, &tx, keepalive).await;
        drop(activity);
    });
    reply::sse(out, ())
}

/// A session's GET stream: the list changes, the updates of the resources it
/// subscribed to, and the status of the unfinished tasks it created here (with the
/// status last announced for each, so each change is told once).
struct SessionStream {
    engine: Arc<Engine>,
    principal: Principal,
    up: Arc<Upstream>,
    live: Arc<super::live::LegacyLive>,
    scope: String,
    sid: String,
    followed: HashMap<String, &'static str>,
}

impl pump::Stream for SessionStream {
    fn notification(&mut self, n: SessionNotification) -> Option<Value> {
        let wanted = LIST_CHANGED.contains(&n.method.as_str())
            || (n.method == "notifications/resources/updated"
                && crate::protocol::fields::notified_uri(n.params.as_ref()).is_some_and(|u| {
                    self.live
                        .subscribed(self.up.name(), &self.scope, &self.sid, u)
                }));
        wanted.then(|| {
            protocol::notification(
                &n.method,
                n.params
                    .unwrap_or_else(|| Value::Object(Default::default())),
            )
        })
    }

    fn changed(&mut self, c: Result<Change, RecvError>) -> pump::Reread {
        let ids = match c {
            Ok(Change::Task(id)) if self.followed.contains_key(&id) => vec![id],
            Ok(Change::Task(_)) => return pump::Reread::Nothing,
            Ok(Change::Resync) | Err(RecvError::Lagged(_)) => {
                self.followed.keys().cloned().collect()
            }
            Err(RecvError::Closed) => return pump::Reread::Detach,
        };
        pump::Reread::Tasks {
            ids,
            only_changed: true,
        }
    }

    /// As its CreateTaskResult said: a change from here on is told.
    fn follow(&mut self, id: String) -> Option<String> {
        if self.followed.len() >= FOLLOWED_TASKS {
            return None;
        }
        self.followed.insert(id.clone(), "working");
        Some(id)
    }

    async fn announce(&mut self, id: &str, _only_changed: bool, tx: &mpsc::Sender<Bytes>) -> bool {
        announce(
            &self.engine,
            &self.principal,
            self.up.name(),
            tx,
            &mut self.followed,
            id,
        )
        .await
    }
}

/// Forgets a GET stream's channel for new tasks when the stream ends.
struct StreamClose {
    live: Arc<super::live::LegacyLive>,
    session: String,
    token: u64,
}

impl Drop for StreamClose {
    fn drop(&mut self) {
        self.live.close_task_stream(&self.session, self.token);
    }
}

/// How many unfinished tasks one GET stream follows; a session that keeps more polls
/// the rest (the notification is optional: MCP 2025-11-25 "Tasks", "Task
/// Notifications").
const FOLLOWED_TASKS: usize = 256;

/// Read a followed task and announce its status if it changed; a terminal or gone task
/// is followed no more, and a store that cannot answer now is asked again on the next
/// change. `false` when the client went away.
async fn announce(
    engine: &Engine,
    principal: &Principal,
    upstream: &str,
    tx: &mpsc::Sender<Bytes>,
    followed: &mut HashMap<String, &'static str>,
    id: &str,
) -> bool {
    let rec = match engine
        .owner_snapshot(principal, upstream, &TaskRef::to(id))
        .await
    {
        Ok(rec) => rec,
        Err(f) if matches!(f.class, ErrorClass::RetryLater(_)) => return true,
        Err(_) => {
            followed.remove(id);
            return true;
        }
    };
    let status = dialect::status(&rec);
    if followed.insert(id.to_string(), status) != Some(status)
        && tx
            .send(reply::sse_event(&dialect::status_notification(&rec)))
            .await
            .is_err()
    {
        return false;
    }
    if rec.status.is_terminal() {
        followed.remove(id);
    }
    true
}
