//! What a tool sees of the session that called it: where its messages go, what
//! the client declared, and a way to ask the client something ([`Peer`]).
//! `tools.rs` knows only this file; `server.rs` implements [`Peer`] for its
//! session, so the two import one way (server → tools → call).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::protocol::{RpcError, notification};

/// Something the session wants to deliver to the client.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A JSON-RPC message (notification, request or response).
    Message(Value),
    /// HTTP only: emit an SSE priming event with `retry:` and close the
    /// connection without ending the stream (2025-11-25 polling).
    PollDisconnect { retry_ms: u64 },
    /// HTTP only: drop the connection without answering (the `crash` tool).
    Abort,
}

/// Destination of outbound messages.
pub trait Sink: Send + Sync {
    fn send(&self, out: Outbound);
}

/// A sink that discards everything (for POSTed notifications/responses).
pub struct NullSink;

impl Sink for NullSink {
    fn send(&self, _out: Outbound) {}
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http,
}

/// Client capabilities declared in `initialize`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientCaps {
    pub elicitation: bool,
    pub sampling: bool,
    pub roots: bool,
}

/// Per-process counters observable through the `stats` tool.
#[derive(Default)]
pub struct Stats {
    pub calls: AtomicU64,
    pub cancelled: AtomicU64,
    pub counters: Mutex<BTreeMap<String, u64>>,
}

impl Stats {
    pub fn snapshot(&self) -> Value {
        let counters: serde_json::Map<String, Value> = self
            .counters
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        json!({
            // Which process answered: tells tests which stdio child served a call.
            "pid": std::process::id(),
            "calls": self.calls.load(Ordering::SeqCst),
            "cancelled": self.cancelled.load(Ordering::SeqCst),
            "counter": counters,
        })
    }

    pub fn bump(&self, key: &str) -> u64 {
        let mut m = self.counters.lock();
        let v = m.entry(key.to_string()).or_insert(0);
        *v += 1;
        *v
    }
}

/// What a tool produced.
pub(crate) enum ToolOutcome {
    Result(Value),
    Error(RpcError),
    /// Send nothing (the `crash` tool on HTTP).
    NoResponse,
}

/// A future a [`Peer`] returns: the client's answer, or its JSON-RPC error object.
pub(crate) type Answer<'a> = Pin<Box<dyn Future<Output = Result<Value, Value>> + Send + 'a>>;

/// The calling session, as far as a tool may use it.
pub(crate) trait Peer: Send + Sync {
    fn transport(&self) -> Transport;
    fn caps(&self) -> ClientCaps;
    fn stats(&self) -> &Arc<Stats>;
    /// Whether a log message at `level` should be emitted.
    fn log_enabled(&self, level: &str) -> bool;
    /// Where unsolicited messages go (list-changed notifications).
    fn standalone(&self) -> &Arc<dyn Sink>;
    /// Whether the client subscribed to the resource `uri`.
    fn subscribed(&self, uri: &str) -> bool;
    /// Send a server→client request through `sink` and wait for the answer.
    fn request<'a>(&'a self, sink: &'a Arc<dyn Sink>, method: &'a str, params: Value)
    -> Answer<'a>;
}

/// Context of one `tools/call`.
pub(crate) struct CallCtx {
    pub session: Box<dyn Peer>,
    pub sink: Arc<dyn Sink>,
    pub progress_token: Option<Value>,
    /// Set by `expire_session`: forget the session after answering.
    pub expire_after: AtomicBool,
}

impl CallCtx {
    pub(super) fn notify(&self, method: &str, params: Value) {
        self.sink
            .send(Outbound::Message(notification(method, params)));
    }

    pub(super) fn progress(&self, progress: u64, total: u64, message: String) {
        if let Some(token) = &self.progress_token {
            self.notify(
                "notifications/progress",
                json!({"progressToken": token, "progress": progress, "total": total, "message": message}),
            );
        }
    }

    pub(super) fn log(&self, level: &str, data: Value) {
        if self.session.log_enabled(level) {
            self.notify(
                "notifications/message",
                json!({"level": level, "logger": "taskgate-demo", "data": data}),
            );
        }
    }

    pub(super) async fn request(&self, method: &str, params: Value) -> Result<Value, Value> {
        self.session.request(&self.sink, method, params).await
    }
}
