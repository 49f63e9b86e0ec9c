//! What a legacy upstream said about itself in its `initialize` result (MCP 2025-11-25
//! "Lifecycle", "Initialization"). One type for both sides of the seam: the upstream
//! client reports it, and the store keeps the last one per upstream, so it lives in
//! the layer both may name (ARCHITECTURE.md "Layers").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An upstream's identity as clients see it. `server_info` and `capabilities` are kept
/// as the upstream sent them: the JSON text keeps key order and number text (serde_json
/// `preserve_order` + `arbitrary_precision`), so what a client reads while the upstream
/// is down (the stored copy) equals what it read while it was up. The field order is
/// the stored record's (`store::sled` module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamInfo {
    /// The legacy protocol version the upstream answered with.
    pub protocol_version: String,
    pub server_info: Value,
    pub capabilities: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}
