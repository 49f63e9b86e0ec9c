//! The few fields the gateway reads out of messages it otherwise passes through as
//! the client or the upstream sent them: the envelope's version, the era markers of a
//! body, a tool call's name and arguments, a log notification's level, a resource
//! notification's URI, an upstream capability. Each is read here, by name, so the
//! wire shape is spelled in one place and the layers above see only the value
//! (ARCHITECTURE.md "One request path for both eras").

use serde_json::{Map, Value};

use super::META_PROTOCOL_VERSION;
use super::meta::log_level_rank;

/// `"jsonrpc": "2.0"` (JSON-RPC 2.0, "Request object"), in either era.
pub fn is_jsonrpc_2(msg: &Map<String, Value>) -> bool {
    msg.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
}

/// `params._meta`'s protocol version (MCP 2026-07-28 "`_meta`"), when a string.
pub fn meta_protocol_version(params: Option<&Map<String, Value>>) -> Option<&str> {
    params?
        .get("_meta")?
        .get(META_PROTOCOL_VERSION)
        .and_then(Value::as_str)
}

/// The 2026 body marker of a message: the `_meta` protocol-version key, whatever its
/// value (a wrong value is the 2026 path's `-32022` to answer).
pub fn has_meta_protocol_version(msg: &Value) -> bool {
    msg.get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key(META_PROTOCOL_VERSION))
}

/// The 2025-era body marker: `initialize` with a top-level `params.protocolVersion`
/// string (MCP 2025-11-25 "Lifecycle").
pub fn is_versioned_initialize(msg: &Value) -> bool {
    msg.get("method").and_then(Value::as_str) == Some("initialize")
        && msg
            .get("params")
            .and_then(|p| p.get("protocolVersion"))
            .is_some_and(Value::is_string)
}

/// A `tools/call`'s `name` and `arguments`, when both have their types.
pub fn tool_name_and_arguments(params: &Map<String, Value>) -> Option<(&str, &Map<String, Value>)> {
    let tool = params.get("name").and_then(Value::as_str)?;
    let args = params.get("arguments").and_then(Value::as_object)?;
    Some((tool, args))
}

/// The severity rank of a `notifications/message`'s `level`.
pub fn log_level(params: &Map<String, Value>) -> Option<usize> {
    params
        .get("level")
        .and_then(Value::as_str)
        .and_then(log_level_rank)
}

/// `params.uri` of a notification (`notifications/resources/updated`), when a string.
pub fn notified_uri(params: Option<&Value>) -> Option<&str> {
    params?.get("uri").and_then(Value::as_str)
}

/// Whether server capabilities declare `resources.subscribe: true`.
pub fn can_subscribe_resources(caps: &Map<String, Value>) -> bool {
    caps.get("resources")
        .and_then(|r| r.get("subscribe"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// `_meta.progressToken` of a request's `_meta`.
pub fn progress_token(meta: &Value) -> Option<Value> {
    meta.get("progressToken").cloned()
}

/// `params.requestId` of `notifications/cancelled`.
pub fn cancelled_request(params: &Map<String, Value>) -> Option<&Value> {
    params.get("requestId")
}

/// The `method` of a JSON-RPC request value.
pub fn method_of(request: &Value) -> Option<&str> {
    request.get("method").and_then(Value::as_str)
}

/// A `CallToolResult` that says `isError: true`.
pub fn is_error_result(result: &Value) -> bool {
    result.get("isError") == Some(&Value::Bool(true))
}

/// `params.message` of `notifications/progress`.
pub fn progress_message(params: &Map<String, Value>) -> Option<&str> {
    params.get("message").and_then(Value::as_str)
}

/// A tool's `name` in a `tools/list` result.
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("name").and_then(Value::as_str)
}
