//! Wire validation of a client POST (`front::wire`, `front::http_checks`,
//! `protocol::meta`).
//!
//! Properties, for any body and any headers:
//! - a rejection is 400 with one of the codes of the front's error table, or 404 with
//!   `-32601`, and nothing else;
//! - `-32700` exactly when the body is not JSON, and then no id;
//! - whenever the body is an object whose `id` is a string or an integer, a rejection
//!   echoes that id in its canonical spelling; an `id` of any other type gives
//!   `-32600` without one; no `id` gives a notification or an envelope error;
//! - an accepted request agrees with its headers: `Mcp-Method`, `MCP-Protocol-Version`
//!   and `Mcp-Name` (decoded from `=?base64?…?=` where so sent) equal the body, none of
//!   the single-valued headers repeats, and the params come back without `_meta`;
//! - Origin/Host: a missing, repeated or unreadable `Host` is 400, a repeated `Origin`
//!   403; a JSON `Content-Type` is accepted only alone and only when it is JSON;
//!   and an `Accept` naming both media types always admits the request.
//!
//! And for well-formed requests built from parts: they are accepted with exactly their
//! id, method and params; every header value round-trips through the encoding; and each
//! single fault (a header that differs, is missing or repeats, no `_meta`, another
//! version, an unserved method, a bad envelope, a cut-short body) gets its own code
//! and status with the id echoed where there is one.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use serde_json::{Map, Value, json};

use super::Bytes;
use crate::config::ServerConfig;
use crate::front::http_checks;
use crate::front::wire::{self, Incoming};
use crate::protocol::Method;
use crate::protocol::params::Params;
use crate::protocol::{self, PROTOCOL_VERSION, error};

/// Header names the fuzzer picks from (by index).
pub const HEADER_NAMES: [&str; 11] = [
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "idempotency-key",
    "mcp-param-a",
    "mcp-param-b",
    "host",
    "origin",
    "content-type",
    "accept",
    "x-other",
];

#[derive(Debug, Clone)]
pub enum Case {
    /// Any body with any headers (name index into [`HEADER_NAMES`], raw value).
    Raw {
        body: Vec<u8>,
        headers: Vec<(usize, Vec<u8>)>,
    },
    /// A well-formed request with one fault (or none).
    Built { req: Request, fault: Fault },
}

/// A well-formed request, built from parts.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: Id,
    /// An index into [`Method::ALL`].
    pub method: usize,
    /// `name` / `uri` / `taskId` for the methods that need one (any text).
    pub name: String,
    /// Extra params (their keys never start with `_`).
    pub params: Map<String, Value>,
    pub tasks: bool,
    pub log_level: Option<usize>,
    pub idempotency_key: Option<String>,
    /// Header encoding choices (cycled): plain when possible, or base64.
    pub encoding: u8,
}

#[derive(Debug, Clone)]
pub enum Id {
    Str(String),
    Int(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    MethodHeaderDiffers,
    NoVersionHeader,
    VersionHeaderDiffers,
    NameHeaderDiffers,
    NoNameHeader,
    RepeatedHeader(usize),
    NoMeta,
    OtherVersion,
    UnservedMethod,
    BadJsonrpc,
    ParamsNotObject,
    BadLogLevel,
    BadIdempotencyKey,
    NoId,
    /// The body cut to this many bytes (modulo its length).
    Truncated(usize),
}

pub const FAULTS: usize = 16;

impl Fault {
    pub fn from_index(i: usize, extra: usize) -> Self {
        match i % FAULTS {
            0 => Self::None,
            1 => Self::MethodHeaderDiffers,
            2 => Self::NoVersionHeader,
            3 => Self::VersionHeaderDiffers,
            4 => Self::NameHeaderDiffers,
            5 => Self::NoNameHeader,
            6 => Self::RepeatedHeader(extra),
            7 => Self::NoMeta,
            8 => Self::OtherVersion,
            9 => Self::UnservedMethod,
            10 => Self::BadJsonrpc,
            11 => Self::ParamsNotObject,
            12 => Self::BadLogLevel,
            13 => Self::BadIdempotencyKey,
            14 => Self::NoId,
            _ => Self::Truncated(extra),
        }
    }
}

pub fn fuzz(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.bool() {
        let mut headers = Vec::new();
        for _ in 0..b.choose(8) {
            let name = b.choose(HEADER_NAMES.len());
            headers.push((name, b.short().to_vec()));
        }
        check(&Case::Raw {
            body: b.rest().to_vec(),
            headers,
        });
    } else {
        let id = if b.bool() {
            Id::Str(b.text())
        } else {
            Id::Int(i64::from_le_bytes(std::array::from_fn(|_| b.u8())))
        };
        let method = b.choose(Method::ALL.len());
        let fault = Fault::from_index(b.u8().into(), b.u16().into());
        let tasks = b.bool();
        let log_level = b.bool().then(|| b.choose(protocol::meta::LOG_LEVELS.len()));
        let idempotency_key = b.bool().then(|| b.text());
        let encoding = b.u8();
        let name = b.text();
        let mut params = Map::new();
        for _ in 0..b.choose(4) {
            let key = format!("k{}", b.text());
            let value: Value =
                serde_json::from_slice(b.short()).unwrap_or_else(|_| Value::String(b.text()));
            params.insert(key, value);
        }
        check(&Case::Built {
            req: Request {
                id,
                method,
                name,
                params,
                tasks,
                log_level,
                idempotency_key,
                encoding,
            },
            fault,
        });
    }
}

pub fn check(case: &Case) {
    match case {
        Case::Raw { body, headers } => {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                let name = HEADER_NAMES[name % HEADER_NAMES.len()];
                if let Ok(v) = HeaderValue::from_bytes(value) {
                    map.append(HeaderName::from_static(name), v);
                }
            }
            check_any(body, &map);
            check_http(&map);
        }
        Case::Built { req, fault } => check_built(req, *fault),
    }
}

/// How a client spells a header value: as it is when it is visible ASCII, has no
/// whitespace at either end and does not itself look encoded (in any case), else
/// `=?base64?…?=` (always padded: SEP-2243 refuses unpadded base64), as `choice` says.
pub fn encode_header_value(s: &str, choice: u8) -> String {
    let lower = s.to_ascii_lowercase();
    let looks_encoded = lower.starts_with("=?base64?") && lower.ends_with("?=");
    let spaced = s.starts_with(' ') || s.ends_with(' ');
    let plain = s.bytes().all(|b| (0x20..0x7f).contains(&b)) && !spaced && !looks_encoded;
    if plain && choice % 3 != 2 {
        return s.to_string();
    }
    format!("=?base64?{}?=", STANDARD.encode(s))
}

const TABLE: [i64; 6] = [
    error::PARSE_ERROR,
    error::INVALID_REQUEST,
    error::METHOD_NOT_FOUND,
    error::INVALID_PARAMS,
    error::HEADER_MISMATCH,
    error::UNSUPPORTED_PROTOCOL_VERSION,
];

fn decoded(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut all = headers.get_all(name).iter();
    let one = all.next()?;
    assert!(all.next().is_none(), "accepted with {name} repeated");
    Some(wire::decode_header_value(one.as_bytes()).expect("accepted an unreadable header"))
}

/// The properties that hold for every body and every set of headers.
pub fn check_any(body: &[u8], headers: &HeaderMap) {
    let result = wire::validate(body, headers);
    if let Err(r) = &result {
        assert!(TABLE.contains(&r.error.code), "unexpected code {r:?}");
        assert_eq!(
            r.status == StatusCode::NOT_FOUND,
            r.error.code == error::METHOD_NOT_FOUND,
            "status and code disagree: {r:?}"
        );
        assert!(
            matches!(r.status.as_u16(), 400 | 404),
            "unexpected status {r:?}"
        );
    }
    let parsed: Result<Value, _> = serde_json::from_slice(body);
    let value = match parsed {
        Ok(v) => v,
        Err(e) => {
            let r = result
                .as_ref()
                .expect_err("accepted a body that is not JSON");
            if e.to_string().starts_with("recursion limit exceeded") {
                assert_eq!(r.error.code, error::INVALID_REQUEST, "{r:?}");
            } else {
                assert_eq!(r.error.code, error::PARSE_ERROR, "{r:?}");
                assert!(r.id.is_none(), "a parse error echoed an id: {r:?}");
            }
            return;
        }
    };
    if let Err(r) = &result {
        assert_ne!(
            r.error.code,
            error::PARSE_ERROR,
            "JSON refused as unparsable"
        );
    }
    let Value::Object(msg) = value else {
        let r = result.as_ref().expect_err("accepted a non-object");
        assert_eq!((r.error.code, &r.id), (error::INVALID_REQUEST, &None));
        return;
    };
    let id = match msg.get("id") {
        None => None,
        Some(raw) => match protocol::canonical_id(raw.clone()) {
            Some(id) => Some(id),
            None => {
                let r = result.as_ref().expect_err("accepted a bad id");
                assert_eq!((r.error.code, &r.id), (error::INVALID_REQUEST, &None));
                return;
            }
        },
    };
    let Some(id) = id else {
        match &result {
            Ok(Incoming::Notification) => {
                assert_eq!(msg.get("jsonrpc"), Some(&json!("2.0")));
                assert!(
                    msg.get("method")
                        .and_then(Value::as_str)
                        .is_some_and(|m| !m.is_empty())
                );
                assert!(matches!(
                    msg.get("params"),
                    None | Some(Value::Null) | Some(Value::Object(_))
                ));
            }
            Ok(Incoming::Request(r)) => panic!("a request without an id: {r:?}"),
            Err(r) => {
                assert_eq!(
                    (r.error.code, &r.id),
                    (error::INVALID_REQUEST, &None),
                    "{r:?}"
                )
            }
        }
        return;
    };
    let v = match result {
        Err(r) => {
            assert_eq!(r.id.as_ref(), Some(&id), "the id was not echoed: {r:?}");
            return;
        }
        Ok(Incoming::Notification) => panic!("a message with an id taken as a notification"),
        Ok(Incoming::Request(v)) => v,
    };
    // An accepted request agrees with its body and headers.
    assert_eq!(v.id, id);
    assert_eq!(msg.get("jsonrpc"), Some(&json!("2.0")));
    assert_eq!(msg.get("method"), Some(&json!(v.method.as_str())));
    let mut params = match msg.get("params") {
        Some(Value::Object(p)) => p.clone(),
        other => panic!("accepted params {other:?}"),
    };
    let meta = params.remove("_meta").expect("accepted without _meta");
    assert_eq!(Params::parse(v.method, params.clone()), v.params);
    assert_eq!(
        meta.get(protocol::META_PROTOCOL_VERSION),
        Some(&json!(PROTOCOL_VERSION))
    );
    assert_eq!(v.meta.protocol_version, PROTOCOL_VERSION);
    assert_eq!(
        decoded(headers, "mcp-method").as_deref(),
        Some(v.method.as_str())
    );
    assert_eq!(
        decoded(headers, "mcp-protocol-version").as_deref(),
        Some(PROTOCOL_VERSION)
    );
    if let Some(field) = v.method.name_field()
        && let Some(body_name) = params.get(field)
    {
        assert_eq!(
            decoded(headers, "mcp-name").map(Value::String).as_ref(),
            Some(body_name),
            "Mcp-Name vs params.{field}"
        );
    }
    // Mcp-Name on a method without a name is ignored, but never repeated.
    assert!(
        headers.get_all("mcp-name").iter().count() <= 1,
        "Mcp-Name repeated"
    );
    let key = decoded(headers, "idempotency-key").filter(|k| !k.is_empty());
    assert_eq!(key, v.idempotency_key);
    for name in headers
        .keys()
        .filter(|k| k.as_str().starts_with("mcp-param-"))
    {
        assert_eq!(headers.get_all(name).iter().count(), 1, "{name} repeated");
        decoded(headers, name.as_str());
    }
}

/// Origin/Host, Content-Type and Accept.
pub fn check_http(headers: &HeaderMap) {
    let mut cfg = ServerConfig::default();
    cfg.allowed_hosts = vec!["gw.example".into()];
    cfg.allowed_origins = vec!["https://app.example".into()];
    let uri = Uri::from_static("/mcp");
    let hosts: Vec<_> = headers.get_all(http::header::HOST).iter().collect();
    let origins = headers.get_all(http::header::ORIGIN).iter().count();
    let r = http_checks::check_origin_host(Version::HTTP_11, &uri, headers, &cfg);
    match &r {
        Err(e) => assert!(matches!(e.status.as_u16(), 400 | 403), "{e:?}"),
        Ok(()) => assert!(hosts.len() == 1 && origins <= 1, "admitted {headers:?}"),
    }
    if hosts.len() != 1 || hosts[0].to_str().is_err() {
        assert_eq!(r.map_err(|e| e.status.as_u16()), Err(400), "{headers:?}");
    } else if origins > 1 {
        assert_eq!(r.map_err(|e| e.status.as_u16()), Err(403), "{headers:?}");
    }
    // The same request with a plainly allowed Host and no Origin always passes.
    let mut plain = headers.clone();
    plain.remove(http::header::ORIGIN);
    plain.insert(
        http::header::HOST,
        HeaderValue::from_static("gw.example:443"),
    );
    assert_eq!(
        http_checks::check_origin_host(Version::HTTP_11, &uri, &plain, &cfg),
        Ok(())
    );

    if http_checks::content_type_is_json(headers) {
        let all: Vec<_> = headers.get_all(http::header::CONTENT_TYPE).iter().collect();
        assert_eq!(all.len(), 1, "accepted a repeated Content-Type");
        let v = all[0]
            .to_str()
            .expect("accepted an unreadable Content-Type");
        let media = v.split(';').next().unwrap_or("").trim();
        assert!(media.eq_ignore_ascii_case("application/json"), "{v:?}");
    }
    let mut both = headers.clone();
    both.append(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    assert!(http_checks::accept_allows_json_and_sse(&both));
}

impl Request {
    fn method(&self) -> Method {
        Method::ALL[self.method % Method::ALL.len()]
    }

    fn id_value(&self) -> Value {
        match &self.id {
            Id::Str(s) => json!(s),
            Id::Int(i) => json!(i),
        }
    }

    fn meta(&self) -> Value {
        let mut caps = json!({});
        if self.tasks {
            caps["extensions"] = json!({ protocol::TASKS_EXTENSION: {} });
        }
        let mut meta = json!({
            protocol::META_PROTOCOL_VERSION: PROTOCOL_VERSION,
            protocol::META_CLIENT_CAPABILITIES: caps,
        });
        if let Some(l) = self.log_level {
            let levels = protocol::meta::LOG_LEVELS;
            meta[protocol::META_LOG_LEVEL] = json!(levels[l % levels.len()]);
        }
        meta
    }

    /// The params as sent, `_meta` excluded.
    fn params(&self) -> Map<String, Value> {
        let mut p: Map<String, Value> = self
            .params
            .iter()
            .filter(|(k, _)| !k.starts_with('_'))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(field) = self.method().name_field() {
            p.insert(field.into(), json!(self.name));
        }
        p
    }
}

fn header(v: &str) -> HeaderValue {
    HeaderValue::from_str(v).expect("an encoded header value is visible ASCII")
}

fn check_built(req: &Request, fault: Fault) {
    let method = req.method();
    let name_field = method.name_field();
    let method = method.as_str();
    // Every header value round-trips through the client's encoding.
    for (i, s) in [req.name.as_str(), method, PROTOCOL_VERSION]
        .iter()
        .enumerate()
    {
        let enc = encode_header_value(s, req.encoding.wrapping_add(i as u8));
        assert_eq!(
            wire::decode_header_value(enc.as_bytes()).as_deref(),
            Some(*s),
            "{enc:?}"
        );
    }

    let mut msg = json!({"jsonrpc": "2.0", "id": req.id_value(), "method": method});
    let mut params = req.params();
    params.insert("_meta".into(), req.meta());
    msg["params"] = Value::Object(params);
    let mut h = HeaderMap::new();
    let enc = |s: &str, n: u8| header(&encode_header_value(s, req.encoding.wrapping_add(n)));
    h.insert("mcp-protocol-version", enc(PROTOCOL_VERSION, 1));
    h.insert("mcp-method", enc(method, 2));
    if name_field.is_some() {
        h.insert("mcp-name", enc(&req.name, 0));
    }
    if let Some(k) = &req.idempotency_key {
        h.insert("idempotency-key", enc(k, 3));
    }
    h.insert("mcp-param-a", HeaderValue::from_static("x"));

    let id = protocol::canonical_id(req.id_value());
    let mut want: Result<(), (u16, i64)> = Ok(());
    let mismatch = Err((400, error::HEADER_MISMATCH));
    match fault {
        Fault::None => {}
        Fault::MethodHeaderDiffers => {
            h.insert("mcp-method", enc(&format!("{method}x"), 2));
            want = mismatch;
        }
        Fault::NoVersionHeader => {
            h.remove("mcp-protocol-version");
            want = mismatch;
        }
        Fault::VersionHeaderDiffers => {
            h.insert("mcp-protocol-version", header("2025-06-18"));
            want = mismatch;
        }
        Fault::NameHeaderDiffers => {
            if name_field.is_some() {
                h.insert("mcp-name", enc(&format!("{}-", req.name), 0));
                want = mismatch;
            }
        }
        Fault::NoNameHeader => {
            if name_field.is_some() {
                h.remove("mcp-name");
                want = mismatch;
            }
        }
        Fault::RepeatedHeader(which) => {
            let names = [
                "mcp-protocol-version",
                "mcp-method",
                "mcp-name",
                "idempotency-key",
                "mcp-param-a",
            ];
            let name = names[which % names.len()];
            let v = h
                .get(name)
                .cloned()
                .unwrap_or_else(|| HeaderValue::from_static("v"));
            h.append(name, v);
            h.append(name, HeaderValue::from_static("v"));
            want = mismatch;
        }
        Fault::NoMeta => {
            if let Some(p) = msg["params"].as_object_mut() {
                p.remove("_meta");
            }
            want = Err((400, error::INVALID_PARAMS));
        }
        Fault::OtherVersion => {
            msg["params"]["_meta"][protocol::META_PROTOCOL_VERSION] = json!("2025-11-25");
            h.insert("mcp-protocol-version", header("2025-11-25"));
            want = Err((400, error::UNSUPPORTED_PROTOCOL_VERSION));
        }
        Fault::UnservedMethod => {
            msg["method"] = json!("tasks/list");
            h.insert("mcp-method", header("tasks/list"));
            h.remove("mcp-name");
            want = Err((404, error::METHOD_NOT_FOUND));
        }
        Fault::BadJsonrpc => {
            msg["jsonrpc"] = json!("1.0");
            want = Err((400, error::INVALID_REQUEST));
        }
        Fault::ParamsNotObject => {
            msg["params"] = json!([]);
            want = Err((400, error::INVALID_REQUEST));
        }
        Fault::BadLogLevel => {
            msg["params"]["_meta"][protocol::META_LOG_LEVEL] = json!("loud");
            want = Err((400, error::INVALID_PARAMS));
        }
        Fault::BadIdempotencyKey => {
            let raw = HeaderValue::from_bytes(b"caf\xe9").expect("obs-text is a valid value");
            h.insert("idempotency-key", raw);
            want = Err((400, error::INVALID_PARAMS));
        }
        Fault::NoId => {
            if let Some(m) = msg.as_object_mut() {
                m.remove("id");
            }
        }
        Fault::Truncated(_) => {}
    }
    let mut body = msg.to_string().into_bytes();
    if let Fault::Truncated(n) = fault {
        body.truncate(n % body.len());
        want = Err((400, error::PARSE_ERROR));
    }
    check_any(&body, &h);
    let got = wire::validate(&body, &h);
    match (want, got) {
        (Ok(()), Ok(Incoming::Notification)) => assert_eq!(fault, Fault::NoId),
        (Ok(()), Ok(Incoming::Request(v))) => {
            assert_ne!(fault, Fault::NoId);
            assert_eq!(Some(&v.id), id.as_ref());
            assert_eq!(v.method.as_str(), method);
            assert_eq!(v.params, Params::parse(v.method, req.params()));
            assert_eq!(v.meta.caps.declares_tasks(), req.tasks);
            let key = req.idempotency_key.clone().filter(|k| !k.is_empty());
            assert_eq!(v.idempotency_key, key);
        }
        (Ok(()), Err(r)) => panic!("{fault:?}: refused a well-formed request: {r:?}"),
        (Err(w), Ok(_)) => panic!("{fault:?}: accepted, wanted {w:?}"),
        (Err((status, code)), Err(r)) => {
            assert_eq!(
                (r.status.as_u16(), r.error.code),
                (status, code),
                "{fault:?}: {r:?}"
            );
            let want_id = if code == error::PARSE_ERROR { None } else { id };
            assert_eq!(r.id, want_id, "{fault:?}");
        }
    }
}

/// How many methods [`Method::ALL`] has (for strategies indexing it).
pub const SERVED_METHODS_COUNT: usize = Method::ALL.len();
