//! Pieces of the legacy session protocol shared by both transports: the
//! `initialize` handshake (MCP 2025-11-25 "Lifecycle"), inbound message classification, cancellation.

use serde_json::{Map, Value, json};

use super::{CallOutcome, UpstreamInfo};
use crate::protocol::initialize::InitializeResult;
use crate::protocol::{LEGACY_OFFER_VERSION, RpcError};

/// Versions the gateway can speak upstream, newest first. Whatever older version the
/// server answers with is accepted (MCP 2025-11-25 "Lifecycle", version negotiation).
pub const LEGACY_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The `initialize` request the gateway sends (offers 2025-11-25).
pub fn initialize_request(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY_OFFER_VERSION,
            "capabilities": super::gateway_client_capabilities(),
            "clientInfo": { "name": "taskgate", "version": env!("CARGO_PKG_VERSION") }
        }
    })
}

pub fn initialized_notification() -> Value {
    json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })
}

/// Parse an `initialize` result; refuses versions the gateway cannot speak.
pub fn parse_initialize_result(result: &Value) -> Result<UpstreamInfo, String> {
    let result = InitializeResult::of(result)
        .ok_or_else(|| "initialize result is not an object".to_string())?;
    let version = result
        .protocol_version()
        .ok_or_else(|| "initialize result has no protocolVersion".to_string())?;
    if !LEGACY_VERSIONS.contains(&version) {
        return Err(format!(
            "upstream answered unsupported protocol version {version}"
        ));
    }
    let capabilities = result.capabilities().cloned().unwrap_or_default();
    let server_info = result
        .server_info()
        .cloned()
        .unwrap_or_else(|| json!({"name": "unknown", "version": "0"}));
    let instructions = result.instructions().map(str::to_string);
    Ok(UpstreamInfo {
        protocol_version: version.to_string(),
        capabilities,
        server_info,
        instructions,
    })
}

/// A message received from an upstream, classified.
#[derive(Debug)]
pub enum Inbound {
    Response {
        id: Value,
        outcome: CallOutcome,
    },
    Request {
        id: Value,
        method: String,
        params: Option<Value>,
    },
    Notification {
        method: String,
        params: Option<Value>,
    },
}

/// Classify one JSON-RPC message (a 2025-03-26 batch must be split by the caller).
pub fn classify(msg: Value) -> Result<Inbound, String> {
    let Value::Object(mut m) = msg else {
        return Err("message is not a JSON object".into());
    };
    let method = m.remove("method");
    let id = m.remove("id");
    match (method, id) {
        (Some(Value::String(method)), Some(id)) if !id.is_null() => Ok(Inbound::Request {
            id,
            method,
            params: m.remove("params"),
        }),
        (Some(Value::String(method)), _) => Ok(Inbound::Notification {
            method,
            params: m.remove("params"),
        }),
        (None, Some(id)) => {
            if let Some(err) = m.remove("error") {
                Ok(Inbound::Response {
                    id,
                    outcome: CallOutcome::Error(RpcError::from_value(&err)),
                })
            } else if let Some(result) = m.remove("result") {
                Ok(Inbound::Response {
                    id,
                    outcome: CallOutcome::Result(result),
                })
            } else {
                Err("response has neither result nor error".into())
            }
        }
        _ => Err("message is neither request, notification nor response".into()),
    }
}

/// A JSON-RPC request to the upstream.
pub fn request(id: u64, method: &str, params: Map<String, Value>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": Value::Object(params) })
}

/// The JSON-RPC response the gateway sends for an upstream server→client request.
pub fn answer(id: &Value, answer: &super::InputAnswer) -> Value {
    match answer {
        super::InputAnswer::Result(r) => json!({ "jsonrpc": "2.0", "id": id, "result": r }),
        super::InputAnswer::Error(e) => {
            json!({ "jsonrpc": "2.0", "id": id, "error": e.to_value() })
        }
    }
}

/// Legacy `notifications/cancelled` for one of the gateway's upstream request ids.
pub fn cancelled(request_id: u64, reason: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": request_id, "reason": reason }
    })
}

/// Extract the progress token and strip it, returning the remaining params.
pub fn split_progress(params: Option<Value>) -> Option<(Value, Map<String, Value>)> {
    let Some(Value::Object(mut p)) = params else {
        return None;
    };
    let token = p.remove("progressToken")?;
    Some((token, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_kinds() {
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":1,"result":{}})),
            Ok(Inbound::Response { .. })
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":"a","method":"ping"})),
            Ok(Inbound::Request { .. })
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","method":"notifications/progress","params":{}})),
            Ok(Inbound::Notification { .. })
        ));
        assert!(classify(json!([1])).is_err());
    }

    #[test]
    fn initialize_result_versions() {
        let ok = json!({"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"x","version":"1"}});
        assert_eq!(
            parse_initialize_result(&ok).unwrap().protocol_version,
            "2025-06-18"
        );
        let bad = json!({"protocolVersion":"2026-07-28","capabilities":{}});
        assert!(parse_initialize_result(&bad).is_err());
    }
}
