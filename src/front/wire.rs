//! Wire validation of one client POST, in the order docs/design.md fixes (§12 "HTTP
//! front", "Order of checks"): JSON parse → envelope → headers vs body → `_meta` →
//! version → method. Pure functions over the body bytes and the headers, so every rule
//! is unit-testable and lives in this one file.

use std::sync::Arc;

use base64::Engine;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};

use crate::protocol::param_headers::{self, ToolHeaders};
use crate::protocol::params::Params;
use crate::protocol::{self, Method, PROTOCOL_VERSION, RequestId, RequestMeta, RpcError, error};

pub use crate::protocol::ValidRequest;

/// What a POST body turned out to be.
#[derive(Debug)]
pub enum Incoming {
    Request(Box<ValidRequest>),
    /// Notifications are acknowledged with 202 and never dispatched.
    Notification,
}

/// A rejection: HTTP status, JSON-RPC error, and the id when it could be parsed.
#[derive(Debug, Clone)]
pub struct Reject {
    pub status: StatusCode,
    pub id: Option<RequestId>,
    pub error: RpcError,
}

impl Reject {
    pub fn new(status: StatusCode, id: Option<RequestId>, error: RpcError) -> Self {
        Self { status, id, error }
    }
}

/// The marker of an encoded header value, `=?base64?{base64}?=` (SEP-2243 "Value
/// Encoding"); the prefix is matched without regard to ASCII case, as the SEP's server
/// table accepts `=?BASE64?…?=`.
const ENCODED_PREFIX: &[u8] = b"=?base64?";
const ENCODED_SUFFIX: &[u8] = b"?=";

/// The value without the optional whitespace around it (RFC 9110 OWS: SP and HTAB).
/// hyper already strips it from HTTP/1 fields; trimming here states the rule rather
/// than relying on the parser.
fn trim_ows(raw: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = raw.iter().position(|b| !ows(b)).unwrap_or(raw.len());
    let end = raw.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &raw[start..end]
}

/// The base64 text of a value in the encoded form, `None` for a literal value.
fn encoded_inner(v: &[u8]) -> Option<&[u8]> {
    let body_len = v
        .len()
        .checked_sub(ENCODED_PREFIX.len() + ENCODED_SUFFIX.len())?;
    let (prefix, rest) = v.split_at(ENCODED_PREFIX.len());
    (prefix.eq_ignore_ascii_case(ENCODED_PREFIX) && rest.ends_with(ENCODED_SUFFIX))
        .then(|| &rest[..body_len])
}

/// Decode an MCP header value (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`,
/// `Mcp-Param-*`), as SEP-2243 "Server Behavior" says: the surrounding whitespace is
/// trimmed; `=?base64?…?=` carries UTF-8 in padded standard base64 (unpadded or
/// otherwise undecodable text is refused, never read as a literal); anything else is a
/// literal and must be visible ASCII. `None` when the value is not valid.
pub fn decode_header_value(raw: &[u8]) -> Option<String> {
    let v = trim_ows(raw);
    if let Some(inner) = encoded_inner(v) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()?;
        return String::from_utf8(bytes).ok();
    }
    if v.iter().all(|b| (0x20..0x7f).contains(b)) {
        String::from_utf8(v.to_vec()).ok()
    } else {
        None
    }
}

/// Why an MCP header could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderFault {
    /// Not visible ASCII and not a valid `=?base64?…?=` value.
    Invalid,
    /// Sent more than once: which copy an intermediary acted on is unknowable, so a
    /// repeat counts as a mismatch with the body, never "first value wins".
    Repeated,
}

fn header_str(headers: &HeaderMap, name: &str) -> Result<Option<String>, HeaderFault> {
    match super::headers::single(headers, name) {
        Err(super::headers::Repeated) => Err(HeaderFault::Repeated),
        Ok(None) => Ok(None),
        Ok(Some(v)) => decode_header_value(v.as_bytes())
            .map(Some)
            .ok_or(HeaderFault::Invalid),
    }
}

/// What a header fault says in the `-32020` message.
fn fault_message(fault: HeaderFault, header: &str) -> String {
    match fault {
        HeaderFault::Invalid => format!("invalid {header} header"),
        HeaderFault::Repeated => format!("repeated {header} header"),
    }
}

/// The first `Mcp-Param-*` header that cannot be read, with why: sent more than once,
/// or a value with invalid characters or bad base64 (SEP-2243 "Server Behavior": such
/// a header is refused whether or not the tool's schema names it).
fn bad_param_header(headers: &HeaderMap) -> Option<(&str, HeaderFault)> {
    headers
        .keys()
        .map(http::HeaderName::as_str)
        .filter(|k| k.starts_with("mcp-param-"))
        .find_map(|k| {
            let mut all = headers.get_all(k).iter();
            let first = all.next()?;
            if all.next().is_some() {
                Some((k, HeaderFault::Repeated))
            } else if decode_header_value(first.as_bytes()).is_none() {
                Some((k, HeaderFault::Invalid))
            } else {
                None
            }
        })
}

/// Serde's nesting limit (128 levels) stops a parse; the envelope's own members are
/// read without it so the rejection can still echo the id.
const NESTING_LIMIT_MESSAGE: &str = "recursion limit exceeded";

/// The id of a body too deeply nested to parse, read from the top-level members only
/// (skipping a value does not recurse, so nesting does not stop it).
fn shallow_id(body: &[u8]) -> Option<RequestId> {
    /// Only the id; every other member is skipped without being parsed.
    #[derive(serde::Deserialize)]
    struct IdOnly<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let envelope: IdOnly<'_> = serde_json::from_slice(body).ok()?;
    let id: Value = serde_json::from_str(envelope.id?.get()).ok()?;
    protocol::canonical_id(id)
}

/// Where [`validate_with`] finds the `Mcp-Param-*` header map a called tool is checked
/// against (given the tool's name): asked only for a `tools/call`, so no other request
/// pays for it. `None` when no `tools/list` of the upstream was ever seen (the headers
/// then go unchecked).
pub type ToolHeaderLookup<'a> = &'a dyn Fn(&str) -> Option<Arc<ToolHeaders>>;

/// Validate a POST body against the headers, with no tool header map known (the
/// `Mcp-Param-*` headers are read but not compared with the arguments). The caller has
/// already checked path, method, Origin/Host, auth, Content-Type, Accept and size.
pub fn validate(body: &[u8], headers: &HeaderMap) -> Result<Incoming, Box<Reject>> {
    validate_with(body, headers, &|_| None)
}

/// [`validate`], with the upstream's tool header map for the `Mcp-Param-*` check of a
/// `tools/call`.
pub fn validate_with(
    body: &[u8],
    headers: &HeaderMap,
    tool_headers: ToolHeaderLookup<'_>,
) -> Result<Incoming, Box<Reject>> {
    validate_parsed(parse(body)?, headers, tool_headers)
}

/// Why a `tools/call`'s `Mcp-Param-*` headers disagree with its arguments (SEP-2243
/// "Server Behavior"), checked against the tool's annotated parameters: each one whose
/// argument has a value (not absent, not null) must come with its header, and the
/// decoded header must carry that value. A header for an argument without a value is
/// not expected and not refused.
fn param_header_mismatch(
    params: Option<&Map<String, Value>>,
    headers: &HeaderMap,
    tool_headers: ToolHeaderLookup<'_>,
) -> Option<String> {
    let (tool, args) = protocol::fields::tool_name_and_arguments(params?)?;
    let map = tool_headers(tool)?;
    for p in map.for_tool(tool) {
        let Some(value) = args.get(&p.property).filter(|v| !v.is_null()) else {
            continue;
        };
        // Repeated or unreadable parameter headers were refused before this.
        let header = headers
            .get(p.header_name())
            .and_then(|h| decode_header_value(h.as_bytes()));
        match header {
            None => return Some(format!("missing Mcp-Param-{} header", p.name)),
            Some(h) if !param_headers::header_matches(&h, value) => {
                return Some(format!(
                    "Mcp-Param-{} header does not match arguments.{}",
                    p.name, p.property
                ));
            }
            Some(_) => {}
        }
    }
    None
}

/// Step 1, JSON parse, for both eras (docs/design.md §22 "Clients of the 2025 era":
/// which era a body speaks is read from the parsed body). Numbers keep their text
/// (`arbitrary_precision`), so valid JSON is never refused for a number; only nesting
/// past the parser's limit is, and that is an invalid request, not a parse error.
pub fn parse(body: &[u8]) -> Result<Value, Box<Reject>> {
    let bad = |id: Option<RequestId>, e: RpcError| Reject::new(StatusCode::BAD_REQUEST, id, e);
    serde_json::from_slice(body).map_err(|e| {
        Box::new(if e.to_string().starts_with(NESTING_LIMIT_MESSAGE) {
            bad(
                shallow_id(body),
                RpcError::invalid_request("the message is nested more than 128 levels deep"),
            )
        } else {
            bad(None, RpcError::parse_error(format!("parse error: {e}")))
        })
    })
}

/// Steps 2–6 over a parsed 2026 body.
pub fn validate_parsed(
    value: Value,
    headers: &HeaderMap,
    tool_headers: ToolHeaderLookup<'_>,
) -> Result<Incoming, Box<Reject>> {
    validate_inner(value, headers, tool_headers).map_err(Box::new)
}

// The rejection is boxed once at the public boundary; inside, plain values keep the
// early returns readable.
#[allow(clippy::result_large_err)]
fn validate_inner(
    value: Value,
    headers: &HeaderMap,
    tool_headers: ToolHeaderLookup<'_>,
) -> Result<Incoming, Reject> {
    let bad = |id: Option<RequestId>, e: RpcError| Reject::new(StatusCode::BAD_REQUEST, id, e);

    // 2. Envelope.
    let Value::Object(mut msg) = value else {
        let what = if value.is_array() {
            "batches are not supported"
        } else {
            "a JSON-RPC message must be an object"
        };
        return Err(bad(None, RpcError::invalid_request(what)));
    };
    let id = match msg.remove("id") {
        None => None,
        Some(id) => match protocol::canonical_id(id) {
            Some(id) => Some(id),
            None => {
                return Err(bad(
                    None,
                    RpcError::invalid_request("id must be a string or an integer"),
                ));
            }
        },
    };
    if !protocol::fields::is_jsonrpc_2(&msg) {
        return Err(bad(
            id,
            RpcError::invalid_request("jsonrpc must be \"2.0\""),
        ));
    }
    let method = match msg.remove("method") {
        Some(Value::String(m)) if !m.is_empty() => m,
        Some(_) => {
            return Err(bad(
                id,
                RpcError::invalid_request("method must be a string"),
            ));
        }
        None => {
            let what = if msg.contains_key("result") || msg.contains_key("error") {
                "clients never send JSON-RPC responses in 2026-07-28"
            } else {
                "missing method"
            };
            return Err(bad(id, RpcError::invalid_request(what)));
        }
    };
    let params = match msg.remove("params") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => {
            return Err(bad(
                id,
                RpcError::invalid_request("params must be an object"),
            ));
        }
    };
    let Some(id) = id else {
        // A notification: acknowledged, never dispatched (docs/design.md §12 "HTTP
        // front").
        return Ok(Incoming::Notification);
    };

    // `initialize` from a legacy client carries no 2026 headers or `_meta`; answer
    // with the method error that names the supported versions (MCP 2026-07-28
    // "Versioning": a modern-only server names them in any error to `initialize`).
    if method == "initialize" {
        return Err(Reject::new(
            StatusCode::NOT_FOUND,
            Some(id),
            RpcError::new(
                error::METHOD_NOT_FOUND,
                "initialize was removed in 2026-07-28; this server is stateless",
            )
            .with_data(json!({ "supported": [PROTOCOL_VERSION] })),
        ));
    }

    // 3. Headers vs body (MCP 2026-07-28 Streamable HTTP, "Server Validation").
    let mismatch = |what: String| bad(Some(id.clone()), RpcError::header_mismatch(what));
    let body_version = protocol::fields::meta_protocol_version(params.as_ref());
    match header_str(headers, "mcp-protocol-version") {
        Err(f) => return Err(mismatch(fault_message(f, "MCP-Protocol-Version"))),
        Ok(None) => return Err(mismatch("missing MCP-Protocol-Version header".into())),
        Ok(Some(h)) => {
            if let Some(b) = body_version
                && h != b
            {
                return Err(mismatch(format!(
                    "MCP-Protocol-Version header {h:?} does not match _meta protocolVersion {b:?}"
                )));
            }
        }
    }
    match header_str(headers, "mcp-method") {
        Err(f) => return Err(mismatch(fault_message(f, "Mcp-Method"))),
        Ok(None) => return Err(mismatch("missing Mcp-Method header".into())),
        Ok(Some(h)) if h != method => {
            return Err(mismatch(format!(
                "Mcp-Method header {h:?} does not match method {method:?}"
            )));
        }
        Ok(Some(_)) => {}
    }
    // Unknown methods are refused at step 6; until then they have no name field.
    let served = Method::from_wire(&method);
    let name_field = served.and_then(Method::name_field);
    if let Some(field) = name_field {
        let body_name = params.as_ref().and_then(|p| p.get(field));
        let header =
            header_str(headers, "mcp-name").map_err(|f| mismatch(fault_message(f, "Mcp-Name")))?;
        match (header, body_name) {
            (None, Some(_)) => return Err(mismatch("missing Mcp-Name header".into())),
            (Some(h), Some(Value::String(b))) if &h != b => {
                return Err(mismatch(format!(
                    "Mcp-Name header does not match params.{field}"
                )));
            }
            (Some(_), Some(v)) if !v.is_string() => {
                return Err(mismatch(format!("params.{field} must be a string")));
            }
            _ => {}
        }
    }

    if name_field.is_none() && matches!(header_str(headers, "mcp-name"), Err(HeaderFault::Repeated))
    {
        return Err(mismatch(fault_message(HeaderFault::Repeated, "Mcp-Name")));
    }
    if let Some((name, fault)) = bad_param_header(headers) {
        return Err(mismatch(fault_message(fault, name)));
    }
    // Only a `tools/call` carries tool arguments, so only it looks the map up.
    if served == Some(Method::ToolsCall)
        && let Some(what) = param_header_mismatch(params.as_ref(), headers, tool_headers)
    {
        return Err(mismatch(what));
    }
    // A repeated key is a header fault like the others; an unreadable one is a bad
    // parameter, answered after the method checks below.
    let idempotency_key = header_str(headers, "idempotency-key");
    if idempotency_key == Err(HeaderFault::Repeated) {
        return Err(mismatch(fault_message(
            HeaderFault::Repeated,
            "Idempotency-Key",
        )));
    }

    // 4. `_meta`.
    let meta = RequestMeta::parse(params.as_ref()).map_err(|e| bad(Some(id.clone()), e))?;

    // 5. Version.
    if meta.protocol_version != PROTOCOL_VERSION {
        return Err(bad(
            Some(id),
            RpcError::unsupported_version(&meta.protocol_version),
        ));
    }

    // 6. Method. Removed in 2026-07-28 (its "Changelog"; the MCP Tasks extension has
    // no `tasks/result` or `tasks/list`) or never served: 404 `-32601`.
    let Some(method) = served else {
        return Err(Reject::new(
            StatusCode::NOT_FOUND,
            Some(id),
            RpcError::method_not_found(&method),
        ));
    };

    let Ok(idempotency_key) = idempotency_key else {
        return Err(bad(
            Some(id),
            RpcError::invalid_params("invalid Idempotency-Key header"),
        ));
    };
    let idempotency_key = idempotency_key.filter(|k| !k.is_empty());
    let mut params = params.unwrap_or_default();
    params.remove("_meta");
    // The method is known: it picks the parser of its params. Parsing refuses nothing;
    // a malformed field is refused later, after the capability and limit checks
    // (docs/design.md §12 "Order of checks").
    let params = Params::parse(method, params);
    Ok(Incoming::Request(Box::new(ValidRequest {
        id,
        method,
        params,
        meta,
        idempotency_key,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn meta() -> Value {
        json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        })
    }

    fn ok_headers(method: &str) -> HeaderMap {
        headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
        ])
    }

    fn reject(body: Value, h: &HeaderMap) -> Reject {
        *validate(body.to_string().as_bytes(), h).unwrap_err()
    }

    #[test]
    fn parse_error_has_no_id() {
        let r = *validate(b"{not json", &ok_headers("x")).unwrap_err();
        assert_eq!(r.error.code, -32700);
        assert!(r.id.is_none());
    }

    #[test]
    fn batch_is_invalid_request() {
        let r = *validate(b"[]", &ok_headers("x")).unwrap_err();
        assert_eq!((r.status.as_u16(), r.error.code), (400, -32600));
    }

    #[test]
    fn valid_tools_list() {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":meta()}});
        let Incoming::Request(r) =
            validate(body.to_string().as_bytes(), &ok_headers("tools/list")).unwrap()
        else {
            panic!("not a request")
        };
        assert_eq!(r.method, Method::ToolsList);
        let Params::Forward(f) = &r.params else {
            panic!("{:?}", r.params)
        };
        assert!(f.upstream.as_map().is_empty());
    }

    #[test]
    fn method_header_mismatch() {
        let body =
            json!({"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"_meta":meta()}});
        let r = reject(body, &ok_headers("prompts/list"));
        assert_eq!((r.status.as_u16(), r.error.code), (400, -32020));
        assert_eq!(r.id, Some(json!("a")));
    }

    #[test]
    fn name_header_base64() {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"héllo","arguments":{},"_meta":meta()}});
        let mut h = ok_headers("tools/call");
        h.insert("mcp-name", "=?base64?aMOpbGxv?=".parse().unwrap());
        assert!(validate(body.to_string().as_bytes(), &h).is_ok());
        h.insert("mcp-name", "hello".parse().unwrap());
        assert_eq!(reject(body, &h).error.code, -32020);
    }

    #[test]
    fn missing_meta_and_bad_version() {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"});
        let r = reject(body, &ok_headers("tools/list"));
        assert_eq!((r.status.as_u16(), r.error.code), (400, -32602));
        let mut m = meta();
        m["io.modelcontextprotocol/protocolVersion"] = json!("2025-06-18");
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":m}});
        let h = headers(&[
            ("mcp-protocol-version", "2025-06-18"),
            ("mcp-method", "tools/list"),
        ]);
        let r = reject(body, &h);
        assert_eq!(r.error.code, -32022);
        assert_eq!(r.error.data.unwrap()["requested"], "2025-06-18");
    }

    #[test]
    fn removed_methods_are_404() {
        for m in [
            "ping",
            "tasks/list",
            "tasks/result",
            "logging/setLevel",
            "resources/subscribe",
        ] {
            let body = json!({"jsonrpc":"2.0","id":1,"method":m,"params":{"_meta":meta()}});
            let r = reject(body, &ok_headers(m));
            assert_eq!((r.status.as_u16(), r.error.code), (404, -32601), "{m}");
        }
    }

    #[test]
    fn notification_accepted() {
        let body = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{}});
        assert!(matches!(
            validate(body.to_string().as_bytes(), &HeaderMap::new()).unwrap(),
            Incoming::Notification
        ));
    }

    fn call_body(args: &str, id: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{args},"_meta":{}}}}}"#,
            meta()
        )
    }

    fn call_headers() -> HeaderMap {
        let mut h = ok_headers("tools/call");
        h.insert("mcp-name", "echo".parse().unwrap());
        h
    }

    #[test]
    fn numbers_in_arguments_keep_their_text() {
        let body = call_body(
            r#"{"big":1e999,"neg":-0,"long":123456789012345678901234567890,"f":1.10}"#,
            "7",
        );
        let Incoming::Request(r) = validate(body.as_bytes(), &call_headers()).unwrap() else {
            panic!("not a request")
        };
        // Digits, sign and trailing zeros are kept; only the exponent is spelled the
        // parser's one way (`e+`), which is the same JSON number.
        let Params::ToolsCall(p) = &r.params else {
            panic!("{:?}", r.params)
        };
        assert_eq!(
            serde_json::to_string(&p.fwd.upstream.as_map()["arguments"]).unwrap(),
            r#"{"big":1e+999,"neg":-0,"long":123456789012345678901234567890,"f":1.10}"#
        );
    }

    #[test]
    fn negative_zero_id_is_the_integer_zero() {
        let body = call_body("{}", "-0");
        let Incoming::Request(r) = validate(body.as_bytes(), &call_headers()).unwrap() else {
            panic!("not a request")
        };
        assert_eq!(serde_json::to_string(&r.id).unwrap(), "0");
        for bad_id in ["1.5", "1e2", "null", "[1]", "true"] {
            let r = *validate(call_body("{}", bad_id).as_bytes(), &call_headers()).unwrap_err();
            assert_eq!(r.error.code, -32600, "{bad_id}");
        }
    }

    #[test]
    fn nesting_past_the_limit_is_invalid_request_with_id() {
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        let body = call_body(&format!(r#"{{"x":{deep}}}"#), r#""deep-1""#);
        let r = *validate(body.as_bytes(), &call_headers()).unwrap_err();
        assert_eq!((r.status.as_u16(), r.error.code), (400, -32600));
        assert_eq!(r.id, Some(json!("deep-1")));
        // Within the limit it is an ordinary request.
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(
            validate(
                call_body(&format!(r#"{{"x":{ok}}}"#), "1").as_bytes(),
                &call_headers()
            )
            .is_ok()
        );
    }

    /// SEP-2243 "Conformance Test Cases", the server table: what a header value decodes
    /// to, `None` for a value refused.
    #[test]
    fn sep_2243_server_table() {
        for (raw, want) in [
            ("=?base64?SGVsbG8=?=", Some("Hello")),
            ("=?base64?SGVsbG8?=", None),
            ("=?base64?SGVs!!!bG8=?=", None),
            ("SGVsbG8=", Some("SGVsbG8=")),
            ("=?base64?SGVsbG8=", Some("=?base64?SGVsbG8=")),
            ("=?BASE64?SGVsbG8=?=", Some("Hello")),
            ("=?Base64?SGVsbG8=?=", Some("Hello")),
            // The encoded form carries what a literal cannot.
            ("=?base64?aMOpbGxv?=", Some("héllo")),
            ("=?base64?ICBwYWRkZWQg?=", Some("  padded ")),
            ("=?base64??=", Some("")),
            ("", Some("")),
            // Too short to hold both markers: a literal.
            ("=?base64?=", Some("=?base64?=")),
            // Not UTF-8 once decoded.
            ("=?base64?/w==?=", None),
        ] {
            assert_eq!(
                decode_header_value(raw.as_bytes()).as_deref(),
                want,
                "{raw:?}"
            );
        }
    }

    /// RFC 9110 OWS around a value is not part of it; inside a literal a tab is not
    /// visible ASCII.
    #[test]
    fn header_whitespace_is_trimmed() {
        for (raw, want) in [
            (" Hello", Some("Hello")),
            ("Hello \t", Some("Hello")),
            ("\t =?base64?SGVsbG8=?= ", Some("Hello")),
            ("a b", Some("a b")),
            ("a\tb", None),
            (" \t ", Some("")),
        ] {
            assert_eq!(
                decode_header_value(raw.as_bytes()).as_deref(),
                want,
                "{raw:?}"
            );
        }
        assert_eq!(decode_header_value(b"caf\xe9"), None);
    }

    /// Strict padding holds for `Mcp-Name` too: an unpadded value is refused, not
    /// decoded leniently.
    #[test]
    fn unpadded_name_header_is_a_mismatch() {
        // "hél" is 4 bytes of UTF-8: padded "aMOpbA==", unpadded "aMOpbA".
        let body = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"hél","arguments":{},"_meta":meta()}});
        let mut h = ok_headers("tools/call");
        h.insert("mcp-name", "=?base64?aMOpbA?=".parse().unwrap());
        let r = reject(body.clone(), &h);
        assert_eq!((r.status.as_u16(), r.error.code), (400, -32020));
        assert_eq!(r.id, Some(json!(3)));
        assert_eq!(r.error.message, "invalid Mcp-Name header");
        h.insert("mcp-name", "=?base64?aMOpbA==?=".parse().unwrap());
        assert!(validate(body.to_string().as_bytes(), &h).is_ok());
    }

    /// An `Mcp-Param-*` header that cannot be read is refused whatever the tool's
    /// schema (none is given here), on any method, with the id.
    #[test]
    fn unreadable_param_header_is_a_mismatch() {
        let body = call_body("{}", r#""p-1""#);
        for bad in [
            "=?base64?SGVsbG8?=",
            "=?base64?SGVs!!!bG8=?=",
            "=?base64?/w==?=",
        ] {
            let mut h = call_headers();
            h.insert("mcp-param-region", bad.parse().unwrap());
            let r = *validate(body.as_bytes(), &h).unwrap_err();
            assert_eq!((r.status.as_u16(), r.error.code), (400, -32020), "{bad}");
            assert_eq!(r.id, Some(json!("p-1")), "{bad}");
            assert_eq!(r.error.message, "invalid mcp-param-region header");
        }
        let mut h = call_headers();
        h.insert(
            "mcp-param-region",
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        assert_eq!(reject_raw(&body, &h).error.code, -32020);
        let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":meta()}});
        let mut h = ok_headers("tools/list");
        h.insert("mcp-param-x", "=?base64?eA?=".parse().unwrap());
        assert_eq!(reject(list.clone(), &h).error.code, -32020);
        // Readable values pass, in either form; nothing checks them against a schema.
        for good in [
            "eu-west",
            "=?base64?SGVsbG8=?=",
            "SGVsbG8=",
            "=?base64?SGVsbG8=",
        ] {
            let mut h = call_headers();
            h.insert("mcp-param-region", good.parse().unwrap());
            assert!(validate(body.as_bytes(), &h).is_ok(), "{good}");
        }
    }

    /// The header map of one tool, `route`: `region` (string), `zone` (integer) and
    /// `fast` (boolean) travel as `Mcp-Param-Region`/`-Zone`/`-Fast`.
    fn route_headers(_tool: &str) -> Option<Arc<ToolHeaders>> {
        let list = json!({"tools": [{"name": "route", "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "zone": {"type": "integer", "x-mcp-header": "Zone"},
            "fast": {"type": "boolean", "x-mcp-header": "Fast"},
            "note": {"type": "string"}
        }}}]});
        Some(Arc::new(ToolHeaders::from_tools_list(&list).0))
    }

    fn route_call(args: Value, extra: &[(&str, &str)]) -> Result<Incoming, Box<Reject>> {
        let body = json!({"jsonrpc":"2.0","id":"r","method":"tools/call","params":{"name":"route","arguments":args,"_meta":meta()}});
        let mut h = ok_headers("tools/call");
        h.insert("mcp-name", "route".parse().unwrap());
        for (k, v) in extra {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        validate_with(body.to_string().as_bytes(), &h, &route_headers)
    }

    fn route_mismatch(args: Value, extra: &[(&str, &str)]) -> String {
        let r = route_call(args, extra).unwrap_err();
        assert_eq!((r.status.as_u16(), r.error.code), (400, -32020));
        assert_eq!(r.id, Some(json!("r")));
        r.error.message
    }

    #[test]
    fn param_headers_must_carry_their_arguments() {
        let ok = |args: Value, extra: &[(&str, &str)]| {
            let r = route_call(args.clone(), extra);
            assert!(r.is_ok(), "{args} {extra:?}: {r:?}");
        };
        ok(json!({"region": "eu"}), &[("mcp-param-region", "eu")]);
        ok(
            json!({"region": "Zürich"}),
            &[("mcp-param-region", "=?base64?WsO8cmljaA==?=")],
        );
        ok(
            json!({"region": "SGVsbG8="}),
            &[("mcp-param-region", "SGVsbG8=")],
        );
        ok(
            json!({"region": "Hello"}),
            &[("mcp-param-region", "=?BASE64?SGVsbG8=?=")],
        );
        ok(
            json!({"region": "eu", "zone": 3}),
            &[("mcp-param-region", "eu"), ("mcp-param-zone", "3")],
        );
        ok(json!({"zone": 3}), &[("mcp-param-zone", "3.0")]);
        ok(json!({"fast": false}), &[("mcp-param-fast", "false")]);
        // No value, no header expected; one sent anyway is not refused.
        ok(json!({}), &[]);
        ok(json!({"region": null, "note": "n"}), &[]);
        ok(json!({"region": null}), &[("mcp-param-region", "eu")]);
        ok(
            json!({"zone": 3}),
            &[("mcp-param-zone", "3"), ("mcp-param-region", "eu")],
        );

        assert_eq!(
            route_mismatch(json!({"region": "eu"}), &[]),
            "missing Mcp-Param-Region header"
        );
        assert_eq!(
            route_mismatch(json!({"region": "eu"}), &[("mcp-param-region", "EU")]),
            "Mcp-Param-Region header does not match arguments.region"
        );
        assert_eq!(
            route_mismatch(
                json!({"region": "eu", "zone": 3}),
                &[("mcp-param-region", "eu")]
            ),
            "missing Mcp-Param-Zone header"
        );
        assert_eq!(
            route_mismatch(json!({"zone": 3}), &[("mcp-param-zone", "4")]),
            "Mcp-Param-Zone header does not match arguments.zone"
        );
        assert_eq!(
            route_mismatch(json!({"fast": true}), &[("mcp-param-fast", "1")]),
            "Mcp-Param-Fast header does not match arguments.fast"
        );
        assert_eq!(
            route_mismatch(
                json!({"region": "Hello"}),
                &[("mcp-param-region", "=?base64?SGVsbG8?=")]
            ),
            "invalid mcp-param-region header"
        );
        // A literal that merely looks encoded is compared as it is.
        assert_eq!(
            route_mismatch(
                json!({"region": "Hello"}),
                &[("mcp-param-region", "=?base64?SGVsbG8=")]
            ),
            "Mcp-Param-Region header does not match arguments.region"
        );
    }

    #[test]
    fn the_map_is_asked_for_tools_call_only() {
        let asked = std::cell::Cell::new(0);
        let lookup = |tool: &str| {
            asked.set(asked.get() + 1);
            route_headers(tool)
        };
        let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":meta()}});
        let mut h = ok_headers("tools/list");
        h.insert("mcp-param-region", "x".parse().unwrap());
        assert!(validate_with(list.to_string().as_bytes(), &h, &lookup).is_ok());
        assert_eq!(asked.get(), 0);
        // Unknown map: nothing is compared.
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"route","arguments":{"region":"eu"},"_meta":meta()}});
        let mut h = ok_headers("tools/call");
        h.insert("mcp-name", "route".parse().unwrap());
        assert!(validate_with(body.to_string().as_bytes(), &h, &|_| None).is_ok());
        assert!(validate(body.to_string().as_bytes(), &h).is_ok());
        assert!(validate_with(body.to_string().as_bytes(), &h, &lookup).is_err());
        assert_eq!(asked.get(), 1);
    }

    /// Headers vs body comes before `_meta`: the mismatch answers first.
    #[test]
    fn param_mismatch_precedes_meta() {
        let body = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"route","arguments":{"region":"eu"}}});
        let mut h = ok_headers("tools/call");
        h.insert("mcp-name", "route".parse().unwrap());
        let r = validate_with(body.to_string().as_bytes(), &h, &route_headers).unwrap_err();
        assert_eq!((r.error.code, r.id), (-32020, Some(json!(5))));
        h.insert("mcp-param-region", "eu".parse().unwrap());
        let r = validate_with(body.to_string().as_bytes(), &h, &route_headers).unwrap_err();
        assert_eq!(r.error.code, -32602);
    }

    fn reject_raw(body: &str, h: &HeaderMap) -> Reject {
        *validate(body.as_bytes(), h).unwrap_err()
    }

    #[test]
    fn repeated_mcp_headers_are_a_mismatch() {
        let body = call_body("{}", "9");
        for name in [
            "mcp-protocol-version",
            "mcp-method",
            "mcp-name",
            "idempotency-key",
            "mcp-param-x",
        ] {
            let mut h = call_headers();
            let v = h.get(name).cloned().unwrap_or_else(|| "v".parse().unwrap());
            h.append(name, v.clone());
            h.append(name, v);
            let r = *validate(body.as_bytes(), &h).unwrap_err();
            assert_eq!((r.status.as_u16(), r.error.code), (400, -32020), "{name}");
            assert_eq!(r.id, Some(json!(9)), "{name}");
        }
        // Accept may repeat (it is a list), and a single Mcp-Param-* is fine.
        let mut h = call_headers();
        h.append("mcp-param-x", "v".parse().unwrap());
        assert!(validate(body.as_bytes(), &h).is_ok());
    }
}
