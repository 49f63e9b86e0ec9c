//! JSON-RPC error objects and the MCP error codes (MCP 2026-07-28 "Overview", "Error
//! Codes"; MCP Tasks extension, "Error Handling").

use serde_json::{Map, Value, json};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Implementation-defined throttling code (docs/design.md §8 "Flow control").
pub const THROTTLED: i64 = -32005;
/// Legacy resource-not-found; translated to `INVALID_PARAMS` toward modern clients.
pub const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;
pub const HEADER_MISMATCH: i64 = -32020;
pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// A JSON-RPC error object `{code, message, data?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn parse_error(msg: impl Into<String>) -> Self {
        Self::new(PARSE_ERROR, msg)
    }
    pub fn invalid_request(msg: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, msg)
    }
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("method not found: {method}"))
    }
    pub fn invalid_params(msg: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, msg)
    }
    pub fn header_mismatch(msg: impl Into<String>) -> Self {
        Self::new(HEADER_MISMATCH, msg)
    }

    /// `-32021` with `data.requiredCapabilities` shaped like `ClientCapabilities`.
    pub fn missing_capability(msg: impl Into<String>, required: Value) -> Self {
        Self::new(MISSING_CLIENT_CAPABILITY, msg)
            .with_data(json!({ "requiredCapabilities": required }))
    }

    /// `-32021` naming the tasks extension (MCP Tasks extension, "Capability
    /// Negotiation").
    pub fn tasks_extension_required(msg: impl Into<String>) -> Self {
        Self::missing_capability(msg, json!({ "extensions": { super::TASKS_EXTENSION: {} } }))
    }

    pub fn unsupported_version(requested: &str) -> Self {
        Self::new(
            UNSUPPORTED_PROTOCOL_VERSION,
            format!("unsupported protocol version: {requested}"),
        )
        .with_data(json!({ "supported": [super::PROTOCOL_VERSION], "requested": requested }))
    }

    /// Parse an error object received from an upstream; tolerant of odd shapes so a
    /// misbehaving upstream still yields a well-formed error downstream.
    pub fn from_value(v: &Value) -> Self {
        let code = v
            .get("code")
            .and_then(Value::as_i64)
            .unwrap_or(INTERNAL_ERROR);
        let message = v
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("upstream error")
            .to_string();
        let data = v.get("data").cloned();
        Self {
            code,
            message,
            data,
        }
    }

    pub fn to_value(&self) -> Value {
        let mut m = Map::with_capacity(3);
        m.insert("code".into(), Value::from(self.code));
        m.insert("message".into(), Value::from(self.message.clone()));
        if let Some(d) = &self.data {
            m.insert("data".into(), d.clone());
        }
        Value::Object(m)
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}
