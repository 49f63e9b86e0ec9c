//! The tasks engine (design.md policies 1–11, 15): promotes slow `tools/call`s to
//! durable tasks and serves `tasks/get`, `tasks/update`, `tasks/cancel`.
//!
//! - `promote.rs`: the promotion decision (which deadline, which mode).
//! - `call.rs`: the deadline race and durable creation before the handle goes out.
//! - `driver.rs`: a promoted call running in the background (progress, input, result).
//! - `methods.rs`: the `tasks/*` methods and the ownership check.
//! - `sweeper.rs`: expiry, tombstones and restart recovery.
//! - `seen.rs`: read marks, for counting outcomes nobody collected.
//! - `snapshot.rs`: the wire shapes.

pub mod call;
pub mod clock;
pub mod driver;
pub mod ids;
pub mod methods;
pub mod promote;
pub mod seen;
pub mod snapshot;
pub mod sweeper;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::{broadcast, oneshot};

use crate::config::Config;
use crate::store::{TaskRecord, TaskStore};
use crate::upstream::InputAnswer;

/// A promoted call that is running in this process.
struct Live {
    /// Aborting the call task drops the upstream call future, which cancels it
    /// upstream (transport contract).
    abort: tokio::task::AbortHandle,
    /// Answer channels of outstanding input requests, by input key.
    responders: HashMap<String, oneshot::Sender<InputAnswer>>,
}

/// Shared state of the tasks engine.
pub struct Engine {
    pub store: Arc<dyn TaskStore>,
    pub cfg: Arc<Config>,
    live: Mutex<HashMap<String, Live>>,
    /// Task ids whose record changed (for `subscriptions/listen`).
    changes: broadcast::Sender<String>,
    /// Terminal snapshots the owner received, waiting to be marked in the store.
    seen: seen::SeenMarks,
    /// Tasks with a terminal write that no flush has covered yet (by writer count):
    /// sled shows a write before it is durable, so a reader that finds such a task
    /// terminal flushes first ([`Engine::durable`]); otherwise a crash could turn a
    /// result a client already read back into "gateway restarted" (README
    /// "Durability").
    unflushed: Mutex<HashMap<String, usize>>,
}

impl Engine {
    pub fn new(store: Arc<dyn TaskStore>, cfg: Arc<Config>) -> Arc<Self> {
        let (changes, _) = broadcast::channel(1024);
        Arc::new(Self {
            store,
            cfg,
            live: Mutex::new(HashMap::new()),
            changes,
            seen: seen::SeenMarks::default(),
            unflushed: Mutex::new(HashMap::new()),
        })
    }

    /// Note a terminal write of `task_id` that is about to be made; call
    /// [`Engine::terminal_flushed`] once a flush after it resolved.
    fn terminal_writing(&self, task_id: &str) {
        if let Ok(mut u) = self.unflushed.lock() {
            *u.entry(task_id.to_string()).or_default() += 1;
        }
    }

    fn terminal_flushed(&self, task_id: &str) {
        if let Ok(mut u) = self.unflushed.lock()
            && let Some(n) = u.get_mut(task_id)
        {
            *n -= 1;
            if *n == 0 {
                u.remove(task_id);
            }
        }
    }

    /// Before `rec` (just read) is shown to anyone: if it is terminal and that write
    /// may not be durable yet, flush (a flush started after the read covers it).
    pub async fn durable(&self, rec: &TaskRecord) -> Result<(), crate::store::StoreError> {
        let pending = rec.status.is_terminal()
            && self
                .unflushed
                .lock()
                .map_or(true, |u| u.contains_key(&rec.task_id));
        if pending {
            self.store.flush().await?;
        }
        Ok(())
    }

    pub fn subscribe_changes(&self) -> broadcast::Receiver<String> {
        self.changes.subscribe()
    }

    fn changed(&self, task_id: &str) {
        let _ = self.changes.send(task_id.to_string());
    }

    fn register_live(&self, task_id: &str, abort: tokio::task::AbortHandle) {
        if let Ok(mut live) = self.live.lock() {
            live.insert(
                task_id.to_string(),
                Live {
                    abort,
                    responders: HashMap::new(),
                },
            );
        }
    }

    fn add_responder(&self, task_id: &str, key: String, tx: oneshot::Sender<InputAnswer>) {
        if let Ok(mut live) = self.live.lock()
            && let Some(l) = live.get_mut(task_id)
        {
            l.responders.insert(key, tx);
        }
    }

    fn take_responder(&self, task_id: &str, key: &str) -> Option<oneshot::Sender<InputAnswer>> {
        self.live
            .lock()
            .ok()?
            .get_mut(task_id)?
            .responders
            .remove(key)
    }

    /// Stop a running call (cancel, expiry); a no-op when it is not running here.
    fn abort_live(&self, task_id: &str) {
        let live = self.live.lock().ok().and_then(|mut l| l.remove(task_id));
        if let Some(l) = live {
            l.abort.abort();
        }
    }

    fn forget_live(&self, task_id: &str) {
        if let Ok(mut l) = self.live.lock() {
            l.remove(task_id);
        }
    }
}

/// Canonical JSON (object keys sorted) so equal arguments fingerprint equally.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                if let Some(x) = m.get(k) {
                    out.insert(k.clone(), canonical(x));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Hex SHA-256 of the canonical arguments (idempotency conflict check).
pub fn fingerprint(args: &Value) -> String {
    let bytes = serde_json::to_vec(&canonical(args)).unwrap_or_default();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprint_ignores_key_order() {
        assert_eq!(
            fingerprint(&json!({"a": 1, "b": {"c": 2, "d": 3}})),
            fingerprint(&json!({"b": {"d": 3, "c": 2}, "a": 1}))
        );
        assert_ne!(fingerprint(&json!({"a": 1})), fingerprint(&json!({"a": 2})));
    }
}
