//! What this replica holds for the legacy sessions it serves, in memory
//! (docs/design.md §22 "Clients of the 2025 era"): the server→client requests relayed
//! on a call's stream and waiting for the client's answer, the calls a client may
//! cancel by `notifications/cancelled`, and the session-scoped state aggregated over a
//! shared upstream session — resource subscriptions (one upstream subscription per
//! resource, whoever asked) and log levels (the upstream at the most verbose level any
//! session asked for). The session records themselves live in the store
//! (`tasks/sessions.rs`); this is only what a replica holds for its live streams.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::protocol::RequestId;
use crate::upstream::InputAnswer;

/// A relayed request's key: (session, the gateway's request id).
type AnswerKey = (String, String);
/// A call's key: (session, the client's request id as JSON text).
type CallKey = (String, String);
/// An upstream session's resource: (upstream, upstream scope, uri).
type ResourceKey = (String, String, String);
/// An upstream session: (upstream, upstream scope).
type ScopeKey = (String, String);

#[derive(Default)]
pub struct LegacyLive {
    next_id: AtomicU64,
    answers: Mutex<HashMap<AnswerKey, oneshot::Sender<InputAnswer>>>,
    calls: Mutex<HashMap<CallKey, AbortHandle>>,
    /// Which sessions hold each upstream resource subscription.
    subscribers: Mutex<HashMap<ResourceKey, HashSet<String>>>,
    /// Each session's log level rank, per upstream session, and the level applied.
    log_levels: Mutex<HashMap<ScopeKey, ScopeLevels>>,
    /// The open GET stream of each session that has one here: the tasks the session
    /// creates are handed to it, and it announces their status changes
    /// (docs/design.md §25). Only the stream holds what it follows, so nothing
    /// outlives it.
    task_streams: Mutex<HashMap<String, (u64, mpsc::Sender<String>)>>,
}

/// The log levels asked for on one upstream session.
#[derive(Default)]
struct ScopeLevels {
    /// Each session's rank (`protocol::meta::LOG_LEVELS`, most verbose first).
    by_session: HashMap<String, usize>,
    /// The rank last set upstream.
    applied: Option<usize>,
}

/// Whether a change of subscribers needs an upstream call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubChange {
    /// The first subscriber: subscribe upstream.
    First,
    /// The last one left: unsubscribe upstream.
    Last,
    /// Others still hold it, or this session already did: nothing upstream.
    Shared,
}

impl LegacyLive {
    /// A fresh id for a request relayed to a client, registered with where its
    /// answer goes.
    pub fn relay(&self, session: &str, respond: oneshot::Sender<InputAnswer>) -> String {
        let id = format!("g-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        self.answers
            .lock()
            .insert((session.to_string(), id.clone()), respond);
        id
    }

    /// The client answered a relayed request. An id this session was not asked (or
    /// answered already) is ignored: only the session a request was relayed on can
    /// answer it.
    pub fn answer(&self, session: &str, id: &RequestId, answer: InputAnswer) -> bool {
        let Some(id) = id.as_str() else { return false };
        let sender = self
            .answers
            .lock()
            .remove(&(session.to_string(), id.to_string()));
        sender.is_some_and(|s| s.send(answer).is_ok())
    }

    /// Whether any of the requests relayed with `ids` waits for the client's answer.
    pub fn awaiting(&self, session: &str, ids: &[String]) -> bool {
        let a = self.answers.lock();
        ids.iter()
            .any(|id| a.contains_key(&(session.to_string(), id.clone())))
    }

    /// Forget relayed requests still unanswered when their call ended.
    pub fn forget(&self, session: &str, ids: &[String]) {
        let mut a = self.answers.lock();
        for id in ids {
            a.remove(&(session.to_string(), id.clone()));
        }
    }

    pub fn call_started(&self, session: &str, id: &RequestId, h: AbortHandle) {
        self.calls.lock().insert(call_key(session, id), h);
    }

    pub fn call_ended(&self, session: &str, id: &RequestId) {
        self.calls.lock().remove(&call_key(session, id));
    }

    /// A GET stream of `session` opened: the tasks the session creates from now on
    /// come out of the receiver (the newest stream of a session takes them).
    /// The token names this stream to [`LegacyLive::close_task_stream`].
    pub fn open_task_stream(&self, session: &str) -> (u64, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel(64);
        let token = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.task_streams
            .lock()
            .insert(session.to_string(), (token, tx));
        (token, rx)
    }

    /// A GET stream ended: forget its channel, unless a newer stream replaced it.
    pub fn close_task_stream(&self, session: &str, token: u64) {
        let mut streams = self.task_streams.lock();
        if streams.get(session).is_some_and(|(t, _)| *t == token) {
            streams.remove(session);
        }
    }

    /// `session` created `task_id`: its GET stream, if one is open here, follows it.
    /// A stream that is full or gone misses it (the notification is optional: MCP
    /// 2025-11-25 "Tasks", "Task Notifications").
    pub fn task_created(&self, session: &str, task_id: &str) {
        if let Some((_, tx)) = self.task_streams.lock().get(session) {
            let _ = tx.try_send(task_id.to_string());
        }
    }

    /// The session ended: stop its calls here, forget its relayed requests.
    pub fn end_calls(&self, session: &str) {
        let calls: Vec<AbortHandle> = {
            let mut c = self.calls.lock();
            let keys: Vec<CallKey> = c.keys().filter(|k| k.0 == session).cloned().collect();
            keys.into_iter().filter_map(|k| c.remove(&k)).collect()
        };
        for h in calls {
            h.abort();
        }
        self.answers.lock().retain(|k, _| k.0 != session);
    }

    /// `notifications/cancelled` from the client: stop its call, if it is running
    /// here for this session.
    pub fn cancel(&self, session: &str, id: &RequestId) -> bool {
        let h = self.calls.lock().remove(&call_key(session, id));
        h.map(|h| h.abort()).is_some()
    }

    /// `session` subscribes (`on`) to or leaves a resource of an upstream session.
    pub fn subscription(
        &self,
        upstream: &str,
        scope: &str,
        uri: &str,
        session: &str,
        on: bool,
    ) -> SubChange {
        let key = (upstream.to_string(), scope.to_string(), uri.to_string());
        let mut subs = self.subscribers.lock();
        let set = subs.entry(key.clone()).or_default();
        let was_empty = set.is_empty();
        let changed = if on {
            set.insert(session.to_string())
        } else {
            set.remove(session)
        };
        let now_empty = set.is_empty();
        if now_empty {
            subs.remove(&key);
        }
        match (changed, was_empty, now_empty) {
            (true, true, false) => SubChange::First,
            (true, false, true) => SubChange::Last,
            _ => SubChange::Shared,
        }
    }

    /// The resources `session` holds on an upstream session (its GET stream relays
    /// updates for these only).
    pub fn subscribed(&self, upstream: &str, scope: &str, session: &str, uri: &str) -> bool {
        self.subscribers
            .lock()
            .get(&(upstream.to_string(), scope.to_string(), uri.to_string()))
            .is_some_and(|s| s.contains(session))
    }

    /// Every resource `session` holds, to leave when it ends.
    pub fn subscriptions_of(&self, session: &str) -> Vec<(String, String, String)> {
        self.subscribers
            .lock()
            .iter()
            .filter(|(_, s)| s.contains(session))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// `session` asks for log messages at `rank` and above (`None`: it ended). The
    /// answer is the level to set upstream, when the most verbose level asked for
    /// changed: more verbose at once, less verbose when the last session that wanted
    /// more is gone. With no session left the level stays (the protocol has no
    /// "unset").
    pub fn log_level(
        &self,
        upstream: &str,
        scope: &str,
        session: &str,
        rank: Option<usize>,
    ) -> Option<usize> {
        let mut all = self.log_levels.lock();
        let levels = all
            .entry((upstream.to_string(), scope.to_string()))
            .or_default();
        match rank {
            Some(r) => levels.by_session.insert(session.to_string(), r),
            None => levels.by_session.remove(session),
        };
        let want = levels.by_session.values().min().copied()?;
        if levels.applied == Some(want) {
            return None;
        }
        levels.applied = Some(want);
        Some(want)
    }
}

fn call_key(session: &str, id: &RequestId) -> CallKey {
    (session.to_string(), id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_upstream_subscription_per_resource() {
        let l = LegacyLive::default();
        assert_eq!(l.subscription("u", "", "r", "a", true), SubChange::First);
        assert_eq!(l.subscription("u", "", "r", "a", true), SubChange::Shared);
        assert_eq!(l.subscription("u", "", "r", "b", true), SubChange::Shared);
        assert!(l.subscribed("u", "", "b", "r"));
        assert!(!l.subscribed("u", "", "c", "r"));
        assert_eq!(l.subscription("u", "", "r", "a", false), SubChange::Shared);
        assert_eq!(l.subscription("u", "", "r", "a", false), SubChange::Shared);
        assert_eq!(l.subscription("u", "", "r", "b", false), SubChange::Last);
        // Another upstream session is another subscription.
        assert_eq!(l.subscription("u", "t:x", "r", "a", true), SubChange::First);
        assert_eq!(l.subscriptions_of("a").len(), 1);
    }

    #[test]
    fn the_most_verbose_level_is_applied() {
        let l = LegacyLive::default();
        // debug = 0 … emergency = 7
        assert_eq!(l.log_level("u", "", "a", Some(3)), Some(3));
        assert_eq!(l.log_level("u", "", "b", Some(0)), Some(0));
        assert_eq!(l.log_level("u", "", "a", Some(4)), None);
        assert_eq!(l.log_level("u", "", "b", None), Some(4));
        assert_eq!(l.log_level("u", "", "a", None), None);
    }

    #[test]
    fn answers_reach_only_their_session() {
        let l = LegacyLive::default();
        let (tx, mut rx) = oneshot::channel();
        let id = l.relay("s1", tx);
        assert!(!l.answer("s2", &json!(id), InputAnswer::Result(json!({}))));
        assert!(rx.try_recv().is_err());
        assert!(l.answer("s1", &json!(id), InputAnswer::Result(json!({"ok": 1}))));
        assert!(matches!(rx.try_recv(), Ok(InputAnswer::Result(_))));
        assert!(!l.answer("s1", &json!(id), InputAnswer::Result(json!({}))));
    }
}
