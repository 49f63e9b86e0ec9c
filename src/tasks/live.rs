//! The promoted calls running in this process: how to stop one, where the answers to
//! its input requests go, and which tasks are between their write and their launch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::upstream::InputAnswer;

/// A promoted call that is running in this process.
struct Live {
    /// Aborting the call task drops the upstream call future, which cancels it
    /// upstream (transport contract).
    abort: AbortHandle,
    /// Answer channels of outstanding input requests, by input key.
    responders: HashMap<String, oneshot::Sender<InputAnswer>>,
    /// Answers that arrived before their key's channel was registered: the driver
    /// records the input request in the store first, so an owner who polls at once
    /// can answer in between. Handed over by [`LiveCalls::add_responder`].
    early: HashMap<String, Value>,
}

#[derive(Default)]
pub(super) struct LiveCalls {
    live: Mutex<HashMap<String, Live>>,
    /// Tasks between their write to the store and their launch ([`Creating`]): the
    /// orphan sweep leaves them alone, so a slow flush never looks like a lost call.
    creating: Mutex<HashSet<String>>,
    /// Set once the gateway stops: a promoted call that ends because its upstream is
    /// being shut down is then *not* settled, so its request route stays in the store
    /// and the next start resolves the task.
    draining: AtomicBool,
}

/// Marks a task as being created until dropped (after its launch, or when its
/// creation failed).
pub(super) struct Creating<'a> {
    calls: &'a LiveCalls,
    task_id: String,
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.calls.creating.lock().remove(&self.task_id);
    }
}

impl LiveCalls {
    pub(super) fn register(&self, task_id: &str, abort: AbortHandle) {
        let call = Live {
            abort,
            responders: HashMap::new(),
            early: HashMap::new(),
        };
        self.live.lock().insert(task_id.to_string(), call);
    }

    pub(super) fn add_responder(
        &self,
        task_id: &str,
        key: String,
        tx: oneshot::Sender<InputAnswer>,
    ) {
        if let Some(l) = self.live.lock().get_mut(task_id) {
            match l.early.remove(&key) {
                Some(answer) => {
                    let _ = tx.send(InputAnswer::Result(answer));
                }
                None => {
                    l.responders.insert(key, tx);
                }
            }
        }
    }

    /// Hand `answer` to the call of `task_id` if it runs here: to its channel for
    /// `key`, or kept for the channel the driver is about to register (see
    /// [`Live::early`]). `Err` gives the answer back when the call is not here.
    pub(super) fn offer_answer(
        &self,
        task_id: &str,
        key: &str,
        answer: Value,
    ) -> Result<(), Value> {
        let mut live = self.live.lock();
        let Some(l) = live.get_mut(task_id) else {
            return Err(answer);
        };
        match l.responders.remove(key) {
            Some(tx) => {
                let _ = tx.send(InputAnswer::Result(answer));
            }
            None => {
                l.early.insert(key.to_string(), answer);
            }
        }
        Ok(())
    }

    /// Stop a running call (cancel, expiry); `false` when it is not running here.
    pub(super) fn abort(&self, task_id: &str) -> bool {
        let live = self.live.lock().remove(task_id);
        match live {
            Some(l) => {
                l.abort.abort();
                true
            }
            None => false,
        }
    }

    /// Stop every call running here (the lease was lost: the takeover owns them now).
    pub(super) fn abort_all(&self) {
        let calls: Vec<Live> = self.live.lock().drain().map(|(_, l)| l).collect();
        for l in calls {
            l.abort.abort();
        }
    }

    pub(super) fn forget(&self, task_id: &str) {
        let gone = self.live.lock().remove(task_id);
        drop(gone);
    }

    /// Mark `task_id` as being created (see [`Creating`]).
    pub(super) fn creating(&self, task_id: &str) -> Creating<'_> {
        self.creating.lock().insert(task_id.to_string());
        Creating {
            calls: self,
            task_id: task_id.to_string(),
        }
    }

    /// Whether this process runs (or is about to launch) the call of `task_id`.
    pub(super) fn knows(&self, task_id: &str) -> bool {
        self.live.lock().contains_key(task_id) || self.creating.lock().contains(task_id)
    }

    /// Mark the gateway as stopping (see the `draining` field).
    pub(super) fn begin_shutdown(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(super) fn shutting_down(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_while_the_live_calls_are_locked_keeps_registering_them() {
        let calls = std::sync::Arc::new(LiveCalls::default());
        let held = calls.clone();
        let panicked = std::thread::spawn(move || {
            let _held = held.live.lock();
            panic!("a panic while the live calls are locked");
        })
        .join();
        assert!(panicked.is_err());
        let call = tokio::spawn(std::future::pending::<()>());
        // Used to skip the registration silently: a later cancel could not stop the call.
        calls.register("tsk_x", call.abort_handle());
        assert!(calls.abort("tsk_x"));
        assert!(call.await.expect_err("aborted").is_cancelled());
    }

    #[tokio::test]
    async fn an_answer_before_its_channel_is_handed_over() {
        let calls = LiveCalls::default();
        let call = tokio::spawn(std::future::pending::<()>());
        assert!(calls.offer_answer("tsk_x", "k", Value::Null).is_err());
        calls.register("tsk_x", call.abort_handle());
        assert!(calls.offer_answer("tsk_x", "k", Value::from(1)).is_ok());
        let (tx, rx) = oneshot::channel();
        calls.add_responder("tsk_x", "k".into(), tx);
        assert!(matches!(rx.await, Ok(InputAnswer::Result(v)) if v == 1));
        let _creating = calls.creating("tsk_y");
        assert!(calls.knows("tsk_x") && calls.knows("tsk_y"));
        calls.abort_all();
        assert!(!calls.knows("tsk_x"));
    }
}
