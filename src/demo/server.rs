//! Transport-independent protocol core of the demo legacy MCP server.
//!
//! A [`Session`] receives one JSON-RPC message at a time through
//! [`Session::handle`] and emits everything it has to say through a [`Sink`]:
//! the sink passed with a request receives the messages *related* to that
//! request (progress, log messages, server→client requests) followed by the
//! final response; the session's *standalone* sink receives unsolicited
//! messages (list-changed notifications, the optional `roots/list` on init).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::call::{Answer, CallCtx, Peer, ToolOutcome};
pub use super::call::{ClientCaps, NullSink, Outbound, Sink, Stats, Transport};
use super::tools;

/// Protocol versions the demo accepts, newest first.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// Version answered when the client asks for one we do not support.
pub const LATEST_VERSION: &str = "2025-11-25";

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub transport: Transport,
    /// After `notifications/initialized`, send a `roots/list` request and
    /// ignore the answer (like server-everything).
    pub send_roots_on_init: bool,
}

/// Shape of an incoming JSON-RPC message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    Request,
    Notification,
    Response,
    Invalid,
}

pub fn classify(msg: &Value) -> MessageKind {
    let Some(obj) = msg.as_object() else {
        return MessageKind::Invalid;
    };
    let has_id = obj.get("id").is_some_and(|v| !v.is_null());
    match obj.get("method") {
        Some(Value::String(_)) if has_id => MessageKind::Request,
        Some(Value::String(_)) => MessageKind::Notification,
        Some(_) => MessageKind::Invalid,
        None if has_id && (obj.contains_key("result") || obj.contains_key("error")) => {
            MessageKind::Response
        }
        None => MessageKind::Invalid,
    }
}

// The demo speaks the same JSON-RPC as the gateway: one set of wire types.
pub use crate::protocol::{RpcError, notification};

pub fn result_msg(id: Value, result: Value) -> Value {
    crate::protocol::response(&id, result)
}

pub fn error_msg(id: Value, err: &RpcError) -> Value {
    crate::protocol::error_response(Some(&id), err)
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

use crate::protocol::meta::log_level_rank as level_rank;

type PendingTx = oneshot::Sender<Result<Value, Value>>;

struct Inner {
    config: SessionConfig,
    stats: Arc<Stats>,
    standalone: Arc<dyn Sink>,
    caps: Mutex<ClientCaps>,
    protocol_version: Mutex<Option<String>>,
    initialized: AtomicBool,
    log_level: Mutex<Option<String>>,
    /// In-flight `tools/call`s by request id; `None` until the task is spawned.
    in_flight: Mutex<HashMap<String, Option<tokio::task::AbortHandle>>>,
    /// Outstanding server→client requests by our id (`srv-N`).
    pending: Mutex<HashMap<String, PendingTx>>,
    next_srv_id: AtomicU64,
    /// Resources this session subscribed to: `counter` reports `demo://counter`
    /// changes to a subscriber (MCP 2025-11-25 "Resources", "Subscriptions").
    subscriptions: Mutex<std::collections::HashSet<String>>,
    expired: AtomicBool,
}

/// One legacy MCP session (cheap to clone).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl Session {
    pub fn new(config: SessionConfig, stats: Arc<Stats>, standalone: Arc<dyn Sink>) -> Self {
        Session {
            inner: Arc::new(Inner {
                config,
                stats,
                standalone,
                caps: Mutex::new(ClientCaps::default()),
                protocol_version: Mutex::new(None),
                initialized: AtomicBool::new(false),
                log_level: Mutex::new(None),
                in_flight: Mutex::new(HashMap::new()),
                pending: Mutex::new(HashMap::new()),
                next_srv_id: AtomicU64::new(1),
                subscriptions: Mutex::new(std::collections::HashSet::new()),
                expired: AtomicBool::new(false),
            }),
        }
    }

    pub fn transport(&self) -> Transport {
        self.inner.config.transport
    }
    pub fn stats(&self) -> &Arc<Stats> {
        &self.inner.stats
    }
    pub fn caps(&self) -> ClientCaps {
        self.inner.caps.lock().clone()
    }
    pub fn protocol_version(&self) -> Option<String> {
        self.inner.protocol_version.lock().clone()
    }
    pub fn is_initialized(&self) -> bool {
        self.inner.initialized.load(Ordering::SeqCst)
    }
    /// True once `expire_session` has run (HTTP layer then forgets the session).
    pub fn is_expired(&self) -> bool {
        self.inner.expired.load(Ordering::SeqCst)
    }
    pub fn expire(&self) {
        self.inner.expired.store(true, Ordering::SeqCst);
    }
    /// Whether this session subscribed to `uri`.
    pub(crate) fn subscribed(&self, uri: &str) -> bool {
        self.inner.subscriptions.lock().contains(uri)
    }
    pub(crate) fn standalone(&self) -> &Arc<dyn Sink> {
        &self.inner.standalone
    }
    pub fn in_flight_count(&self) -> usize {
        self.inner.in_flight.lock().len()
    }

    /// Handles one incoming JSON-RPC message. Output related to a request goes
    /// to `sink`; `tools/call` runs in its own task.
    pub fn handle(&self, msg: Value, sink: Arc<dyn Sink>) {
        match classify(&msg) {
            MessageKind::Request => {
                let id = msg.get("id").cloned().unwrap_or(Value::Null);
                let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
                let params = msg.get("params").cloned().unwrap_or_else(|| json!({}));
                if method == "tools/call" {
                    self.spawn_call(id, params, sink);
                } else {
                    let reply = match self.dispatch(method, &params) {
                        Ok(r) => result_msg(id, r),
                        Err(e) => error_msg(id, &e),
                    };
                    sink.send(Outbound::Message(reply));
                }
            }
            MessageKind::Notification => {
                let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
                let params = msg.get("params").cloned().unwrap_or_else(|| json!({}));
                self.handle_notification(method, &params);
            }
            MessageKind::Response => self.handle_response(&msg),
            MessageKind::Invalid => {
                if let Some(id) = msg.get("id").filter(|v| !v.is_null()) {
                    sink.send(Outbound::Message(error_msg(
                        id.clone(),
                        &RpcError::new(-32600, "Invalid Request"),
                    )));
                } else {
                    tracing::debug!("demo: ignoring invalid message {msg}");
                }
            }
        }
    }

    fn handle_notification(&self, method: &str, params: &Value) {
        match method {
            "notifications/initialized" => {
                self.inner.initialized.store(true, Ordering::SeqCst);
                if self.inner.config.send_roots_on_init {
                    let session = self.clone();
                    let sink = self.inner.standalone.clone();
                    tokio::spawn(async move {
                        let r = session.request(&sink, "roots/list", json!({})).await;
                        tracing::debug!("demo: roots/list on init answered: {r:?}");
                    });
                }
            }
            "notifications/cancelled" => {
                let Some(req) = params.get("requestId") else {
                    return;
                };
                let entry = self.inner.in_flight.lock().remove(&id_key(req));
                if let Some(handle) = entry {
                    self.inner.stats.cancelled.fetch_add(1, Ordering::SeqCst);
                    if let Some(h) = handle {
                        h.abort();
                    }
                }
            }
            _ => {}
        }
    }

    fn handle_response(&self, msg: &Value) {
        let Some(id) = msg.get("id").and_then(Value::as_str) else {
            return;
        };
        let Some(tx) = self.inner.pending.lock().remove(id) else {
            tracing::debug!("demo: response for unknown request {id}");
            return;
        };
        let outcome = match msg.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
        };
        let _ = tx.send(outcome);
    }

    fn spawn_call(&self, id: Value, params: Value, sink: Arc<dyn Sink>) {
        self.inner.stats.calls.fetch_add(1, Ordering::SeqCst);
        let key = id_key(&id);
        self.inner.in_flight.lock().insert(key.clone(), None);
        let session = self.clone();
        let task_key = key.clone();
        let handle = tokio::spawn(async move {
            let ctx = CallCtx {
                session: Box::new(session.clone()),
                sink,
                progress_token: params.pointer("/_meta/progressToken").cloned(),
                expire_after: AtomicBool::new(false),
            };
            let outcome = match params.get("name").and_then(Value::as_str) {
                Some(name) => {
                    let args = params
                        .get("arguments")
                        .cloned()
                        .unwrap_or_else(|| json!({}));
                    tools::call(&ctx, name, &args).await
                }
                None => ToolOutcome::Error(RpcError::invalid_params("missing tool name")),
            };
            // Removing ourselves from the in-flight table decides the race
            // with a cancellation: if the entry is gone we were cancelled.
            if session.inner.in_flight.lock().remove(&task_key).is_none() {
                return;
            }
            // Mark the session expired before the answer leaves, so that a
            // request sent after receiving it deterministically gets 404.
            if ctx.expire_after.load(Ordering::SeqCst) {
                session.expire();
            }
            match outcome {
                ToolOutcome::Result(r) => ctx.sink.send(Outbound::Message(result_msg(id, r))),
                ToolOutcome::Error(e) => ctx.sink.send(Outbound::Message(error_msg(id, &e))),
                ToolOutcome::NoResponse => {}
            }
        });
        let mut map = self.inner.in_flight.lock();
        match map.get_mut(&key) {
            Some(slot) => *slot = Some(handle.abort_handle()),
            // Finished already (harmless) or cancelled before we got here.
            None => handle.abort(),
        }
    }

    fn dispatch(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        match method {
            "initialize" => Ok(self.initialize(params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": tools::list()})),
            "prompts/list" => Ok(json!({"prompts": [{
                "name": "greeting",
                "description": "Greets someone by name",
                "arguments": [{"name": "name", "description": "Who to greet", "required": true}],
            }]})),
            "prompts/get" => {
                let name = params.get("name").and_then(Value::as_str).unwrap_or("");
                if name != "greeting" {
                    return Err(RpcError::invalid_params(format!("Unknown prompt: {name}")));
                }
                let who = params
                    .pointer("/arguments/name")
                    .and_then(Value::as_str)
                    .unwrap_or("world");
                Ok(json!({
                    "description": "Greets someone by name",
                    "messages": [{"role": "user", "content": {"type": "text", "text": format!("Hello, {who}!")}}],
                }))
            }
            "resources/list" => Ok(json!({"resources": [
                {"uri": "demo://counter", "name": "counter", "description": "Side-effect counters", "mimeType": "application/json"},
                {"uri": "demo://readme", "name": "readme", "description": "About this server", "mimeType": "text/plain"},
            ]})),
            "resources/templates/list" => Ok(json!({"resourceTemplates": [
                {"uriTemplate": "demo://item/{id}", "name": "item", "description": "A demo item", "mimeType": "text/plain"},
            ]})),
            "resources/read" => {
                let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
                let (mime, text) = match uri {
                    "demo://counter" => (
                        "application/json",
                        self.inner.stats.snapshot()["counter"].to_string(),
                    ),
                    "demo://readme" => ("text/plain", README.to_string()),
                    _ => match uri.strip_prefix("demo://item/") {
                        Some(id) if !id.is_empty() => ("text/plain", format!("Item {id}")),
                        _ => {
                            let mut e = RpcError::new(-32002, "Resource not found");
                            e.data = Some(json!({"uri": uri}));
                            return Err(e);
                        }
                    },
                };
                Ok(json!({"contents": [{"uri": uri, "mimeType": mime, "text": text}]}))
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
                let mut subs = self.inner.subscriptions.lock();
                if method == "resources/subscribe" {
                    subs.insert(uri.to_string());
                } else {
                    subs.remove(uri);
                }
                Ok(json!({}))
            }
            "completion/complete" => {
                let is_greeting = params.pointer("/ref/type").and_then(Value::as_str)
                    == Some("ref/prompt")
                    && params.pointer("/ref/name").and_then(Value::as_str) == Some("greeting");
                let arg = params.pointer("/argument/name").and_then(Value::as_str);
                let prefix = params
                    .pointer("/argument/value")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_lowercase();
                let values: Vec<&str> = if is_greeting && arg == Some("name") {
                    NAMES
                        .iter()
                        .copied()
                        .filter(|n| n.to_lowercase().starts_with(&prefix))
                        .collect()
                } else {
                    Vec::new()
                };
                Ok(
                    json!({"completion": {"values": values, "total": values.len(), "hasMore": false}}),
                )
            }
            "logging/setLevel" => {
                let level = params.get("level").and_then(Value::as_str).unwrap_or("");
                if level_rank(level).is_none() {
                    return Err(RpcError::invalid_params(format!("Invalid level: {level}")));
                }
                *self.inner.log_level.lock() = Some(level.to_string());
                Ok(json!({}))
            }
            _ => Err(RpcError::new(-32601, format!("Method not found: {method}"))),
        }
    }

    fn initialize(&self, params: &Value) -> Value {
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        let version = match requested {
            Some(v) if SUPPORTED_VERSIONS.contains(&v) => v,
            _ => LATEST_VERSION,
        };
        *self.inner.protocol_version.lock() = Some(version.to_string());
        let caps = params.get("capabilities");
        let has = |k: &str| caps.and_then(|c| c.get(k)).is_some_and(|v| !v.is_null());
        *self.inner.caps.lock() = ClientCaps {
            elicitation: has("elicitation"),
            sampling: has("sampling"),
            roots: has("roots"),
        };
        json!({
            "protocolVersion": version,
            "capabilities": {
                "tools": {"listChanged": true},
                "prompts": {},
                "resources": {"subscribe": true},
                "completions": {},
                "logging": {},
            },
            "serverInfo": {"name": "taskgate-demo", "version": "0.1.0"},
            "instructions": "Demo legacy MCP server bundled with taskgate. Try the echo, sleep, elicit and stats tools.",
        })
    }

    /// Sends a server→client request through `sink` and waits for the answer.
    /// `Err` carries the client's JSON-RPC error object.
    pub(crate) async fn request(
        &self,
        sink: &Arc<dyn Sink>,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        let n = self.inner.next_srv_id.fetch_add(1, Ordering::SeqCst);
        let id = format!("srv-{n}");
        let (tx, rx) = oneshot::channel();
        self.inner.pending.lock().insert(id.clone(), tx);
        let _guard = PendingGuard {
            session: self,
            id: id.clone(),
        };
        sink.send(Outbound::Message(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        ));
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(json!({"code": -32603, "message": "request abandoned"})),
        }
    }

    /// Whether a log message at `level` should be emitted.
    pub(crate) fn log_enabled(&self, level: &str) -> bool {
        match self.inner.log_level.lock().as_deref() {
            None => true,
            Some(min) => level_rank(level) >= level_rank(min),
        }
    }
}

/// Removes an outstanding server→client request when its waiter goes away.
struct PendingGuard<'a> {
    session: &'a Session,
    id: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.session.inner.pending.lock().remove(&self.id);
    }
}

impl Peer for Session {
    fn transport(&self) -> Transport {
        Session::transport(self)
    }
    fn caps(&self) -> ClientCaps {
        Session::caps(self)
    }
    fn stats(&self) -> &Arc<Stats> {
        Session::stats(self)
    }
    fn log_enabled(&self, level: &str) -> bool {
        Session::log_enabled(self, level)
    }
    fn standalone(&self) -> &Arc<dyn Sink> {
        Session::standalone(self)
    }
    fn subscribed(&self, uri: &str) -> bool {
        Session::subscribed(self, uri)
    }
    fn request<'a>(
        &'a self,
        sink: &'a Arc<dyn Sink>,
        method: &'a str,
        params: Value,
    ) -> Answer<'a> {
        Box::pin(Session::request(self, sink, method, params))
    }
}

const NAMES: [&str; 6] = ["Alice", "Bob", "Carol", "Charlie", "Dave", "Eve"];

const README: &str =
    "taskgate-demo: a legacy (2025-11-25) MCP server bundled with taskgate for tests and demos.\n";

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::mpsc;

    /// Sink that forwards everything into a channel.
    pub(crate) struct ChanSink(pub mpsc::UnboundedSender<Outbound>);

    impl Sink for ChanSink {
        fn send(&self, out: Outbound) {
            let _ = self.0.send(out);
        }
    }

    struct Harness {
        session: Session,
        sink: Arc<dyn Sink>,
        rx: mpsc::UnboundedReceiver<Outbound>,
    }

    impl Harness {
        fn new(transport: Transport) -> Self {
            let (tx, rx) = mpsc::unbounded_channel();
            let sink: Arc<dyn Sink> = Arc::new(ChanSink(tx));
            let session = Session::new(
                SessionConfig {
                    transport,
                    send_roots_on_init: false,
                },
                Arc::new(Stats::default()),
                sink.clone(),
            );
            Harness { session, sink, rx }
        }

        fn send(&self, msg: Value) {
            self.session.handle(msg, self.sink.clone());
        }

        async fn next(&mut self) -> Value {
            loop {
                let out = tokio::time::timeout(Duration::from_secs(5), self.rx.recv())
                    .await
                    .expect("timed out waiting for output")
                    .expect("channel closed");
                if let Outbound::Message(v) = out {
                    return v;
                }
            }
        }

        async fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
            self.send(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
            loop {
                let m = self.next().await;
                if m["id"] == json!(id) {
                    return m;
                }
            }
        }

        async fn init(&mut self, caps: Value) {
            let r = self
                .call(
                    0,
                    "initialize",
                    json!({"protocolVersion":"2025-06-18","capabilities":caps,"clientInfo":{"name":"t","version":"1"}}),
                )
                .await;
            assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
            self.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        }
    }

    #[tokio::test]
    async fn initialize_negotiates_version_and_caps() {
        let mut h = Harness::new(Transport::Stdio);
        let r = h
            .call(
                1,
                "initialize",
                json!({"protocolVersion":"2099-01-01","capabilities":{"elicitation":{},"roots":{"listChanged":true}},"clientInfo":{"name":"t","version":"1"}}),
            )
            .await;
        let res = &r["result"];
        assert_eq!(res["protocolVersion"], "2025-11-25");
        assert_eq!(res["serverInfo"]["name"], "taskgate-demo");
        assert_eq!(res["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(res["capabilities"]["resources"]["subscribe"], true);
        assert!(res["instructions"].is_string());
        assert_eq!(
            h.session.caps(),
            ClientCaps {
                elicitation: true,
                sampling: false,
                roots: true
            }
        );
        for v in SUPPORTED_VERSIONS {
            let mut h = Harness::new(Transport::Stdio);
            let r = h
                .call(
                    1,
                    "initialize",
                    json!({"protocolVersion": v, "capabilities": {}}),
                )
                .await;
            assert_eq!(r["result"]["protocolVersion"], v);
        }
    }

    #[tokio::test]
    async fn basic_methods() {
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({})).await;
        assert_eq!(h.call(1, "ping", json!({})).await["result"], json!({}));
        let tools = h.call(2, "tools/list", json!({})).await;
        let list = tools["result"]["tools"].as_array().expect("tools");
        assert!(list.iter().all(|t| t["inputSchema"]["type"] == "object"));
        let slow = list
            .iter()
            .find(|t| t["name"] == "slow_required")
            .expect("slow_required");
        assert_eq!(slow["execution"]["taskSupport"], "required");
        let r = h.call(3, "nope/nope", json!({})).await;
        assert_eq!(r["error"]["code"], -32601);
        let r = h
            .call(4, "resources/read", json!({"uri":"demo://missing"}))
            .await;
        assert_eq!(r["error"]["code"], -32002);
        assert_eq!(r["error"]["message"], "Resource not found");
        let r = h
            .call(5, "resources/read", json!({"uri":"demo://item/7"}))
            .await;
        assert_eq!(r["result"]["contents"][0]["text"], "Item 7");
        let r = h
            .call(
                6,
                "completion/complete",
                json!({"ref":{"type":"ref/prompt","name":"greeting"},"argument":{"name":"name","value":"c"}}),
            )
            .await;
        assert_eq!(
            r["result"]["completion"]["values"],
            json!(["Carol", "Charlie"])
        );
        let r = h
            .call(
                7,
                "prompts/get",
                json!({"name":"greeting","arguments":{"name":"Bob"}}),
            )
            .await;
        assert_eq!(r["result"]["messages"][0]["content"]["text"], "Hello, Bob!");
        let r = h
            .call(8, "logging/setLevel", json!({"level":"warning"}))
            .await;
        assert_eq!(r["result"], json!({}));
        let r = h
            .call(9, "resources/subscribe", json!({"uri":"demo://counter"}))
            .await;
        assert_eq!(r["result"], json!({}));
        let r = h
            .call(10, "tools/call", json!({"name":"no_such_tool"}))
            .await;
        assert_eq!(r["error"]["code"], -32602);
    }

    #[tokio::test]
    async fn tools_echo_fail_rpc_error_counter_stats_big() {
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({})).await;
        let r = h
            .call(
                1,
                "tools/call",
                json!({"name":"echo","arguments":{"text":"hi"}}),
            )
            .await;
        assert_eq!(
            r["result"],
            json!({"content":[{"type":"text","text":"hi"}]})
        );
        let r = h.call(2, "tools/call", json!({"name":"fail"})).await;
        assert_eq!(r["result"]["isError"], true);
        let r = h.call(3, "tools/call", json!({"name":"rpc_error"})).await;
        assert_eq!(r["error"]["code"], -32000);
        assert_eq!(r["error"]["message"], "demo failure");
        let r = h
            .call(
                4,
                "tools/call",
                json!({"name":"rpc_error","arguments":{"code":-32050,"message":"boom"}}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32050);
        h.call(5, "tools/call", json!({"name":"counter"})).await;
        let r = h
            .call(
                6,
                "tools/call",
                json!({"name":"counter","arguments":{"key":"default"}}),
            )
            .await;
        assert_eq!(r["result"]["content"][0]["text"], "count=2");
        let r = h
            .call(
                7,
                "tools/call",
                json!({"name":"big","arguments":{"bytes":1000}}),
            )
            .await;
        assert_eq!(
            r["result"]["content"][0]["text"].as_str().map(str::len),
            Some(1000)
        );
        let r = h.call(8, "tools/call", json!({"name":"stats"})).await;
        let stats: Value =
            serde_json::from_str(r["result"]["content"][0]["text"].as_str().expect("text"))
                .expect("json");
        assert_eq!(
            stats,
            json!({"pid":std::process::id(),"calls":8,"cancelled":0,"counter":{"default":2}})
        );
        let r = h
            .call(9, "tools/call", json!({"name":"expire_session"}))
            .await;
        assert_eq!(r["result"]["content"][0]["text"], "not supported");
    }

    #[tokio::test]
    async fn sleep_emits_log_and_progress() {
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({})).await;
        h.send(json!({"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"sleep","arguments":{"ms":30,"steps":3},"_meta":{"progressToken":"tok"}}}));
        let log = h.next().await;
        assert_eq!(log["method"], "notifications/message");
        assert_eq!(log["params"]["data"], "sleep started");
        for i in 1..=3 {
            let p = h.next().await;
            assert_eq!(p["method"], "notifications/progress");
            assert_eq!(p["params"]["progressToken"], "tok");
            assert_eq!(p["params"]["progress"], i);
            assert_eq!(p["params"]["total"], 3);
            assert_eq!(p["params"]["message"], format!("step {i}/3"));
        }
        let r = h.next().await;
        assert_eq!(r["id"], "s");
        assert_eq!(r["result"]["content"][0]["text"], "slept 30 ms");
    }

    #[tokio::test]
    async fn cancel_stops_call_without_response() {
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({})).await;
        h.call(1, "logging/setLevel", json!({"level":"error"}))
            .await;
        h.send(json!({"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":10000}}}));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(h.session.in_flight_count(), 1);
        h.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":42,"reason":"x"}}));
        // The next message must be the stats answer, not a response for 42.
        let r = h.call(2, "tools/call", json!({"name":"stats"})).await;
        let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(text.contains("\"cancelled\":1"), "{text}");
        assert_eq!(h.session.in_flight_count(), 0);
    }

    #[tokio::test]
    async fn elicitation_roundtrip_and_concurrent() {
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({"elicitation":{}})).await;
        h.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"elicit","arguments":{"message":"name?"}}}));
        let req = h.next().await;
        assert_eq!(req["method"], "elicitation/create");
        assert_eq!(req["id"], "srv-1");
        assert_eq!(req["params"]["message"], "name?");
        h.send(json!({"jsonrpc":"2.0","id":"srv-1","result":{"action":"accept","content":{"answer":"42"}}}));
        let r = h.next().await;
        assert_eq!(
            r["result"]["content"][0]["text"],
            "elicited: accept {\"answer\":\"42\"}"
        );

        h.send(
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"elicit_twice"}}),
        );
        let a = h.next().await;
        let b = h.next().await;
        assert_eq!(a["method"], "elicitation/create");
        assert_eq!(b["method"], "elicitation/create");
        // Answer in reverse order.
        h.send(json!({"jsonrpc":"2.0","id":b["id"],"result":{"action":"decline"}}));
        h.send(json!({"jsonrpc":"2.0","id":a["id"],"result":{"action":"accept","content":{"answer":"x"}}}));
        let r = h.next().await;
        assert_eq!(r["id"], 2);
        assert_eq!(
            r["result"]["content"][0]["text"],
            "elicited: accept {\"answer\":\"x\"}"
        );
        assert_eq!(r["result"]["content"][1]["text"], "elicited: decline null");
    }

    #[tokio::test]
    async fn capability_gated_tools() {
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({})).await;
        for name in ["elicit", "sample", "roots"] {
            let r = h.call(1, "tools/call", json!({"name":name})).await;
            assert_eq!(r["result"]["isError"], true, "{name}");
        }
        let mut h = Harness::new(Transport::Stdio);
        h.init(json!({"sampling":{},"roots":{}})).await;
        h.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sample","arguments":{"prompt":"hey"}}}));
        let req = h.next().await;
        assert_eq!(req["method"], "sampling/createMessage");
        assert_eq!(req["params"]["messages"][0]["content"]["text"], "hey");
        h.send(json!({"jsonrpc":"2.0","id":req["id"],"result":{"role":"assistant","content":{"type":"text","text":"sampled!"},"model":"m"}}));
        let r = h.next().await;
        assert_eq!(r["result"]["content"][0]["text"], "sampled!");
        h.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"roots"}}));
        let req = h.next().await;
        assert_eq!(req["method"], "roots/list");
        h.send(json!({"jsonrpc":"2.0","id":req["id"],"result":{"roots":[{"uri":"file:///tmp"}]}}));
        let r = h.next().await;
        assert_eq!(
            r["result"]["content"][0]["text"],
            "[{\"uri\":\"file:///tmp\"}]"
        );
    }

    #[tokio::test]
    async fn touch_tools_goes_to_standalone_and_roots_on_init() {
        let (tx, mut srx) = mpsc::unbounded_channel();
        let standalone: Arc<dyn Sink> = Arc::new(ChanSink(tx));
        let (rtx, mut rrx) = mpsc::unbounded_channel();
        let req_sink: Arc<dyn Sink> = Arc::new(ChanSink(rtx));
        let session = Session::new(
            SessionConfig {
                transport: Transport::Http,
                send_roots_on_init: true,
            },
            Arc::new(Stats::default()),
            standalone,
        );
        session.handle(
            json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}}),
            req_sink.clone(),
        );
        session.handle(
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
            req_sink.clone(),
        );
        let Some(Outbound::Message(m)) = srx.recv().await else {
            panic!("expected roots/list")
        };
        assert_eq!(m["method"], "roots/list");
        session.handle(
            json!({"jsonrpc":"2.0","id":m["id"],"result":{"roots":[]}}),
            req_sink.clone(),
        );
        session.handle(
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"touch_tools"}}),
            req_sink.clone(),
        );
        let Some(Outbound::Message(m)) = srx.recv().await else {
            panic!("expected list_changed")
        };
        assert_eq!(m["method"], "notifications/tools/list_changed");
        let _init = rrx.recv().await;
        let Some(Outbound::Message(r)) = rrx.recv().await else {
            panic!("expected response")
        };
        assert_eq!(r["result"]["content"][0]["text"], "ok");
    }
}
