//! Per-request `_meta` (MCP 2026-07-28 "Overview", "_meta") and the client capabilities
//! it declares (MCP 2026-07-28 "Versioning", "Extension Negotiation"; MCP Tasks
//! extension, "Capability Negotiation").

use serde_json::{Map, Value};

use super::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION, RpcError,
    TASKS_EXTENSION,
};

/// Logging levels in ascending severity (RFC 5424 names, MCP 2026-07-28 "Logging").
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// Severity rank of a level name, `None` when the name is not a level.
pub fn log_level_rank(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

/// The request-scoped metadata every 2026 request carries.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RequestMeta {
    pub protocol_version: String,
    pub caps: ClientCaps,
    pub client_info: Option<Value>,
    pub log_level: Option<String>,
    pub progress_token: Option<Value>,
    /// The W3C trace context of `_meta` (SEP-414), unchecked: a malformed one is
    /// ignored by `telemetry`, never refused. Never persisted with what keeps a
    /// request's metadata: a context belongs to one request.
    #[serde(skip)]
    pub trace: super::TraceCarrier,
}

impl RequestMeta {
    /// Validate `params._meta`. Errors are `-32602` (HTTP 400, MCP 2026-07-28 "Overview",
    /// "_meta"); the version itself is checked separately so the order of checks holds
    /// (docs/design.md §12 "Order of checks").
    pub fn parse(params: Option<&Map<String, Value>>) -> Result<Self, RpcError> {
        let meta = params
            .and_then(|p| p.get("_meta"))
            .ok_or_else(|| RpcError::invalid_params("missing params._meta"))?;
        let meta = meta
            .as_object()
            .ok_or_else(|| RpcError::invalid_params("params._meta must be an object"))?;
        let protocol_version = match meta.get(META_PROTOCOL_VERSION) {
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "_meta[\"{META_PROTOCOL_VERSION}\"] must be a string"
                )));
            }
            None => {
                return Err(RpcError::invalid_params(format!(
                    "missing _meta[\"{META_PROTOCOL_VERSION}\"]"
                )));
            }
        };
        let caps = match meta.get(META_CLIENT_CAPABILITIES) {
            Some(Value::Object(o)) => ClientCaps(o.clone()),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "_meta[\"{META_CLIENT_CAPABILITIES}\"] must be an object"
                )));
            }
            None => {
                return Err(RpcError::invalid_params(format!(
                    "missing _meta[\"{META_CLIENT_CAPABILITIES}\"]"
                )));
            }
        };
        let client_info = match meta.get(META_CLIENT_INFO) {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "_meta[\"{META_CLIENT_INFO}\"] must be an object"
                )));
            }
        };
        let log_level = match meta.get(META_LOG_LEVEL) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if log_level_rank(s).is_some() => Some(s.clone()),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "_meta[\"{META_LOG_LEVEL}\"] must be one of {LOG_LEVELS:?}"
                )));
            }
        };
        let progress_token = match meta.get("progressToken") {
            None | Some(Value::Null) => None,
            Some(v @ Value::String(_)) => Some(v.clone()),
            Some(v @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(v.clone()),
            Some(_) => {
                return Err(RpcError::invalid_params(
                    "_meta.progressToken must be a string or an integer",
                ));
            }
        };
        Ok(Self {
            protocol_version,
            caps,
            client_info,
            log_level,
            progress_token,
            trace: super::TraceCarrier::from_meta(meta),
        })
    }
}

/// The `ClientCapabilities` object a request declared.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientCaps(pub Map<String, Value>);

/// A server→client input kind (docs/design.md §5 "Input requests").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    Elicitation,
    Sampling,
    Roots,
}

impl InputKind {
    /// The kind of a legacy server→client request method, if it is an input request.
    pub fn of_method(method: &str) -> Option<Self> {
        match method {
            "elicitation/create" => Some(Self::Elicitation),
            "sampling/createMessage" => Some(Self::Sampling),
            "roots/list" => Some(Self::Roots),
            _ => None,
        }
    }

    pub fn capability(self) -> &'static str {
        match self {
            Self::Elicitation => "elicitation",
            Self::Sampling => "sampling",
            Self::Roots => "roots",
        }
    }
}

impl ClientCaps {
    /// Whether the request declared the Tasks extension. The normative slot is
    /// `extensions["io.modelcontextprotocol/tasks"]`; a key placed directly under the
    /// capabilities is accepted leniently (docs/design.md §1 "Promotion") but never
    /// emitted.
    pub fn declares_tasks(&self) -> bool {
        let in_ext = self
            .0
            .get("extensions")
            .and_then(Value::as_object)
            .and_then(|e| e.get(TASKS_EXTENSION))
            .is_some_and(Value::is_object);
        in_ext || self.0.get(TASKS_EXTENSION).is_some_and(Value::is_object)
    }

    pub fn declares(&self, kind: InputKind) -> bool {
        self.0
            .get(kind.capability())
            .is_some_and(|v| v.is_object() || v.as_bool() == Some(true))
    }

    /// For elicitation, whether the declared capability admits a given mode.
    /// `{}` means form only (MCP 2025-11-25 "Elicitation", "Capabilities").
    pub fn elicitation_allows_mode(&self, mode: &str) -> bool {
        let Some(e) = self.0.get("elicitation").and_then(Value::as_object) else {
            return false;
        };
        if e.is_empty() {
            return mode == "form";
        }
        e.contains_key(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn parses_required_keys() {
        let p = params(json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
            "progressToken": 7
        }}));
        let m = RequestMeta::parse(Some(&p)).unwrap();
        assert_eq!(m.protocol_version, "2026-07-28");
        assert!(m.caps.declares_tasks());
        assert_eq!(m.progress_token, Some(json!(7)));
    }

    #[test]
    fn missing_caps_is_invalid_params() {
        let p = params(json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}));
        let e = RequestMeta::parse(Some(&p)).unwrap_err();
        assert_eq!(e.code, -32602);
        assert!(RequestMeta::parse(None).is_err());
    }

    #[test]
    fn bad_log_level_and_token() {
        let base = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        });
        let mut m = base.clone();
        m["io.modelcontextprotocol/logLevel"] = json!("loud");
        assert!(RequestMeta::parse(Some(&params(json!({"_meta": m})))).is_err());
        let mut m = base.clone();
        m["progressToken"] = json!(1.5);
        assert!(RequestMeta::parse(Some(&params(json!({"_meta": m})))).is_err());
    }

    #[test]
    fn input_kinds() {
        let c = ClientCaps(params(json!({"elicitation": {}, "roots": {}})));
        assert!(c.declares(InputKind::Elicitation));
        assert!(c.declares(InputKind::Roots));
        assert!(!c.declares(InputKind::Sampling));
        assert!(c.elicitation_allows_mode("form"));
        assert!(!c.elicitation_allows_mode("url"));
        assert!(!c.declares_tasks());
    }
}
