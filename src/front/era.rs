//! Which era a request speaks (docs/design.md §22 "Clients of the 2025 era"), decided
//! once, by the step [`DecideEra`] after the body read, which puts an [`Era`] into the
//! request's extensions for everything below it. A 2026 marker always wins — the
//! `MCP-Protocol-Version: 2026-07-28` header or the `_meta` protocol-version key —
//! and then §12 holds unchanged. Without one, a request is served in the legacy era
//! when it is `initialize` with a top-level `params.protocolVersion`, carries an
//! `Mcp-Session-Id`, or names a 2025-era `MCP-Protocol-Version`.
//!
//! The only other reader of the markers is the method gate, which must answer a
//! GET or DELETE that no era serves with 405 before auth ([`serves_bodiless`]).

use http::HeaderMap;
use serde_json::Value;

use super::stack::{ReadRequest, Resp, Step};
use super::wire::{self, Reject};
use crate::protocol::PROTOCOL_VERSION;
use crate::protocol::fields;
use crate::protocol::legacy::is_legacy_version;

/// The protocol era a request speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Era {
    /// MCP 2026-07-28: stateless, validated by `wire.rs`.
    Modern,
    /// MCP 2025-03-26 to 2025-11-25: a session (`front/legacy/`).
    Legacy,
}

/// The body of a POST without the 2026 header, parsed to find its era: the JSON-RPC
/// step takes it from here rather than parse the body twice. (Extensions must be
/// `Clone`; a request is never cloned.)
#[derive(Clone)]
pub(super) struct ParsedBody(pub(super) Result<Value, Box<Reject>>);

/// The step that decides the era (after the body read: a body may carry a marker).
#[derive(Clone, Copy)]
pub(super) struct DecideEra;

impl Step<ReadRequest> for DecideEra {
    type Kept = ();

    fn before(&self, req: &mut ReadRequest) -> Result<(), Resp> {
        let era = if req.method() != http::Method::POST {
            // The method gate passed a GET or DELETE only for a session.
            if serves_bodiless(req.headers()) {
                Era::Legacy
            } else {
                Era::Modern
            }
        } else if modern_by_header(req.headers()) {
            // Every valid 2026 request carries the header: the one test it pays.
            Era::Modern
        } else {
            let parsed = wire::parse(req.body());
            let era = match &parsed {
                Ok(v) if legacy_post(req.headers(), v) => Era::Legacy,
                _ => Era::Modern,
            };
            req.extensions_mut().insert(ParsedBody(parsed));
            era
        };
        req.extensions_mut().insert(era);
        Ok(())
    }
}

/// The legacy session header (MCP 2025-11-25 Streamable HTTP, "Session Management").
pub(super) const SESSION_HEADER: &str = "mcp-session-id";

/// The version header of both eras (MCP 2025-06-18 and later Streamable HTTP).
const VERSION_HEADER: &str = "mcp-protocol-version";

/// The 2026 header marker.
fn modern_by_header(headers: &HeaderMap) -> bool {
    headers
        .get(VERSION_HEADER)
        .is_some_and(|v| v.as_bytes() == PROTOCOL_VERSION.as_bytes())
}

/// A GET or DELETE: legacy when it names a session and no 2026 version. (Without a
/// session, no era serves it: 405.)
pub(super) fn serves_bodiless(headers: &HeaderMap) -> bool {
    !modern_by_header(headers) && headers.contains_key(SESSION_HEADER)
}

/// A POST without the 2026 header: does it speak the 2025 era?
fn legacy_post(headers: &HeaderMap, body: &Value) -> bool {
    let messages = match body {
        Value::Array(a) => a.as_slice(),
        one => std::slice::from_ref(one),
    };
    if messages.iter().any(fields::has_meta_protocol_version) {
        return false;
    }
    headers.contains_key(SESSION_HEADER)
        || headers
            .get(VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_legacy_version)
        || messages.iter().any(fields::is_versioned_initialize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;

    fn body(s: &str) -> Value {
        serde_json::from_str(s).unwrap_or(Value::Null)
    }

    #[test]
    fn legacy_markers() {
        let none = headers(&[]);
        assert!(legacy_post(&none, &body(INIT)));
        assert!(legacy_post(
            &headers(&[("mcp-session-id", "s")]),
            &json!({"jsonrpc":"2.0","id":1,"method":"ping"})
        ));
        assert!(legacy_post(
            &headers(&[("mcp-protocol-version", "2025-03-26")]),
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})
        ));
        assert!(legacy_post(&none, &json!([body(INIT)])));
        // No marker at all: the 2026 path answers (a missing header, -32020).
        assert!(!legacy_post(
            &none,
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})
        ));
        // `initialize` without a top-level protocolVersion is the 2026 path's 404.
        assert!(!legacy_post(
            &none,
            &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}})
        ));
        // An unknown version header is no 2025 marker either.
        assert!(!legacy_post(
            &headers(&[("mcp-protocol-version", "2024-11-05")]),
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})
        ));
    }

    #[test]
    fn a_2026_marker_wins() {
        let h = headers(&[
            ("mcp-session-id", "s"),
            ("mcp-protocol-version", "2026-07-28"),
        ]);
        assert!(modern_by_header(&h));
        assert!(!serves_bodiless(&h));
        // The `_meta` key wins over a session and a 2025 header, whatever its value.
        let h = headers(&[
            ("mcp-session-id", "s"),
            ("mcp-protocol-version", "2025-06-18"),
        ]);
        let m = json!({"jsonrpc":"2.0","id":1,"method":"tools/list",
            "params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-06-18"}}});
        assert!(!legacy_post(&h, &m));
        assert!(!legacy_post(&h, &json!([m])));
        assert!(serves_bodiless(&headers(&[("mcp-session-id", "s")])));
        assert!(!serves_bodiless(&headers(&[])));
    }
}
