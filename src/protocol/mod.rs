//! JSON-RPC and MCP wire types shared by the front, the engine and the upstream client.
//!
//! Payloads stay `serde_json::Value` with `preserve_order`: the gateway is a proxy and
//! never round-trips arguments or results through lossy typed models (design.md,
//! "Payload fidelity").

pub mod error;
pub mod meta;

pub use error::RpcError;
pub use meta::{ClientCaps, RequestMeta};

use serde_json::{Map, Value};

/// The only client-facing protocol version (spec A1).
pub const PROTOCOL_VERSION: &str = "2026-07-28";
/// What the gateway offers a legacy upstream in `initialize` (spec C2).
pub const LEGACY_OFFER_VERSION: &str = "2025-11-25";
/// Extension id of the Tasks extension (spec B1).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
pub const META_RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// A JSON-RPC id: string or integer (never null in 2026, spec A2). Kept as the raw
/// value so it is echoed exactly as the client sent it.
pub type RequestId = Value;

/// Build a JSON-RPC success response.
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

/// Whether a JSON value is a valid 2026 request id (string or integer).
pub fn is_valid_id(v: &Value) -> bool {
    match v {
        Value::String(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}
