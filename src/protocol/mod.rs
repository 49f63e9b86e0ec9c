//! JSON-RPC and MCP wire types shared by the front, the engine and the upstream client.
//!
//! Payloads stay `serde_json::Value` with `preserve_order`: the gateway is a proxy and
//! never round-trips arguments or results through lossy typed models (docs/design.md,
//! introduction: payload fidelity).

pub mod error;
pub mod fields;
pub mod initialize;
pub mod legacy;
pub mod loose;
pub mod meta;
pub mod method;
pub mod param_headers;
pub mod params;
pub mod results;
pub mod task_shapes;
pub mod tool_results;
pub mod trace;
pub mod upstream_info;

pub use error::RpcError;
pub use meta::{ClientCaps, RequestMeta};
pub use method::Method;
pub use trace::TraceCarrier;
pub use upstream_info::UpstreamInfo;

use serde_json::{Map, Value};

/// The only client-facing protocol version (MCP 2026-07-28 "Versioning").
pub const PROTOCOL_VERSION: &str = "2026-07-28";
/// What the gateway offers a legacy upstream in `initialize` (MCP 2025-11-25
/// "Lifecycle", "Initialization").
pub const LEGACY_OFFER_VERSION: &str = "2025-11-25";
/// Extension id of the Tasks extension (MCP Tasks extension, "Extension Identifier").
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The response header of a 503 a replica gave before doing anything with the
/// request (its lease lost, or an operator drained it): the edge may send the same
/// request to another replica (docs/design.md §24). Its value says why.
pub const NOT_SENT_HEADER: &str = "taskgate-not-sent";

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
pub const META_RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// A JSON-RPC id: string or integer (never null in MCP 2026-07-28, "Overview",
/// "Requests"). Kept as the raw value so it is echoed exactly as the client sent it.
pub type RequestId = Value;

/// A request that passed wire validation (the front's `wire` module builds it), with
/// the params its method takes: [`ValidRequest`] until the front routes it, then the
/// one method's params.
#[derive(Debug, Clone)]
pub struct Request<P> {
    pub id: RequestId,
    pub method: Method,
    pub params: P,
    pub meta: RequestMeta,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
}

/// A validated request of any served method.
pub type ValidRequest = Request<params::Params>;

impl<P> Request<P> {
    /// The params apart from the rest of the request, so a route can take them by
    /// value.
    pub fn split(self) -> (Request<()>, P) {
        let Request {
            id,
            method,
            params,
            meta,
            idempotency_key,
        } = self;
        let head = Request {
            id,
            method,
            params: (),
            meta,
            idempotency_key,
        };
        (head, params)
    }
}

impl Request<()> {
    pub fn with<P>(self, params: P) -> Request<P> {
        Request {
            id: self.id,
            method: self.method,
            params,
            meta: self.meta,
            idempotency_key: self.idempotency_key,
        }
    }
}

/// Build a JSON-RPC success response.
/// A JSON-RPC response whose result is written by its own `Serialize` (a
/// `tasks/get` answer, straight from the snapshot): the same JSON as [`response`].
#[derive(serde::Serialize)]
pub struct ResponseOf<'a, T: serde::Serialize> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    result: T,
}

impl<'a, T: serde::Serialize> ResponseOf<'a, T> {
    pub fn new(id: &'a RequestId, result: T) -> Self {
        Self {
            jsonrpc: "2.0",
            id,
            result,
        }
    }
}

pub fn response(id: &RequestId, result: Value) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), id.clone());
    m.insert("result".into(), result);
    Value::Object(m)
}

/// Build a JSON-RPC error response; `id` is omitted only when it could not be parsed.
pub fn error_response(id: Option<&RequestId>, err: &RpcError) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    if let Some(id) = id {
        m.insert("id".into(), id.clone());
    }
    m.insert("error".into(), err.to_value());
    Value::Object(m)
}

/// Build a JSON-RPC notification.
pub fn notification(method: &str, params: Value) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("method".into(), Value::from(method));
    m.insert("params".into(), params);
    Value::Object(m)
}

/// The request id a JSON value stands for: a string, or an integer in canonical form
/// (`-0` is the integer 0 and is echoed as `0`; `1.0` and `1e2` are not integers).
/// `None` when the value is not a valid 2026 request id.
pub fn canonical_id(v: Value) -> Option<RequestId> {
    match v {
        Value::String(_) => Some(v),
        // With `arbitrary_precision` a number keeps its text; rebuild it from the
        // integer so the echo is the canonical spelling.
        Value::Number(n) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_u64().map(Value::from)),
        _ => None,
    }
}
