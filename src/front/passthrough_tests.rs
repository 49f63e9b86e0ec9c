//! Passthrough fidelity of the typed params: every value a client passes through
//! (tool arguments, unknown params, `inputResponses` answers, `_meta` clientInfo)
//! reaches the upstream with the bytes the body's parse gives it, and the upstream's
//! params keep the key order they always had. The expected bytes are built from the
//! generated pieces as text, never through serde, so the test is an oracle for the
//! typed path and not a copy of it.
//!
//! Numbers keep their digits, sign and trailing zeros (`arbitrary_precision`); only an
//! exponent is spelled the parser's one way (`1e999` → `1e+999`, `-1E-400` →
//! `-1e-400`), as pinned by `wire.rs`'s own tests.

use http::HeaderMap;
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{Map, Value};

use super::relay::{RelayedRetry, WireRequest};
use super::relayed::decode_retry;
use super::wire::{self, Incoming};
use crate::protocol::params::{Field, Forward, Params};
use crate::protocol::{Method, PROTOCOL_VERSION, ValidRequest};
use crate::tasks::fingerprint;
use crate::tasks::params_fingerprint;
use crate::tasks::upstream_spec;
use crate::upstream::legacy_messages;

/// Number texts as sent, and as the parse spells them.
const NUMBERS: [(&str, &str); 9] = [
    ("1.5", "1.5"),
    ("1e999", "1e+999"),
    ("-0", "-0"),
    ("-0.0", "-0.0"),
    (
        "1234567890123456789012345678901234567890",
        "1234567890123456789012345678901234567890",
    ),
    (
        "-9999999999999999999999999999999999999999",
        "-9999999999999999999999999999999999999999",
    ),
    ("1.10", "1.10"),
    ("-1E-400", "-1e-400"),
    (
        "0.30000000000000000000000000000000000001",
        "0.30000000000000000000000000000000000001",
    ),
];

/// A JSON value, written out by hand.
#[derive(Debug, Clone)]
enum Tree {
    Num(usize),
    Str(String),
    Lit(&'static str),
    Arr(Vec<Tree>),
    Obj(Vec<Tree>),
}

impl Tree {
    /// The value's text: as sent (`parsed = false`) or as the parse gives it back.
    fn text(&self, parsed: bool) -> String {
        match self {
            Tree::Num(i) => {
                let (sent, back) = NUMBERS[i % NUMBERS.len()];
                if parsed { back } else { sent }.to_string()
            }
            Tree::Str(s) => serde_json::to_string(s).unwrap_or_default(),
            Tree::Lit(l) => (*l).to_string(),
            Tree::Arr(a) => {
                let items: Vec<String> = a.iter().map(|t| t.text(parsed)).collect();
                format!("[{}]", items.join(","))
            }
            // Keys are numbered, so one object never repeats a key; the `z`/`a` prefix
            // keeps the sent order away from sorted order.
            Tree::Obj(o) => {
                let items: Vec<String> = o
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let k = if i % 2 == 0 { 'z' } else { 'a' };
                        format!("\"{k}{i}\":{}", t.text(parsed))
                    })
                    .collect();
                format!("{{{}}}", items.join(","))
            }
        }
    }
}

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = prop_oneof![
        4 => (0..NUMBERS.len()).prop_map(Tree::Num),
        1 => "[a-zé\"\\\\ ]{0,6}".prop_map(Tree::Str),
        1 => proptest::sample::select(&["true", "false", "null"][..]).prop_map(Tree::Lit),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Tree::Arr),
            vec(inner, 0..4).prop_map(Tree::Obj),
        ]
    })
}

fn object() -> impl Strategy<Value = Tree> {
    vec(tree(), 0..4).prop_map(Tree::Obj)
}

/// The methods whose params go upstream, and the name field each needs.
const FORWARDED: [Method; 8] = [
    Method::ToolsCall,
    Method::PromptsGet,
    Method::ResourcesRead,
    Method::CompletionComplete,
    Method::ToolsList,
    Method::PromptsList,
    Method::ResourcesList,
    Method::ResourcesTemplatesList,
];

/// One generated request: its params as `(key, value as sent, value as parsed)`, in
/// the body's order.
#[derive(Debug, Clone)]
struct Case {
    method: Method,
    entries: Vec<(String, String, String)>,
    client_info: Tree,
    answers: Option<Tree>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..FORWARDED.len(),
        object(),
        vec(tree(), 0..3),
        object(),
        proptest::option::of(object()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<prop::sample::Index>(),
        vec(any::<prop::sample::Index>(), 0..6),
    )
        .prop_map(
            |(m, args, unknown, client_info, answers, state, task, cursor, meta_at, swaps)| {
                let method = FORWARDED[m];
                let mut entries: Vec<(String, String, String)> = Vec::new();
                let mut put = |k: &str, t: &Tree| {
                    entries.push((k.to_string(), t.text(false), t.text(true)));
                };
                if let Some(field) = method.name_field() {
                    put(field, &Tree::Str("echo".into()));
                }
                if matches!(method, Method::ToolsCall | Method::PromptsGet) {
                    put("arguments", &args);
                }
                for (i, t) in unknown.iter().enumerate() {
                    put(&format!("x{i}"), t);
                }
                if let Some(a) = &answers {
                    put("inputResponses", a);
                }
                if state {
                    put("requestState", &Tree::Str("state-1".into()));
                }
                if task {
                    // The 2025-11-25 augmentation, which never reaches the upstream.
                    put("task", &Tree::Obj(vec![Tree::Num(0)]));
                }
                if cursor && method == Method::ToolsList {
                    put("cursor", &Tree::Str("c".into()));
                }
                // Shuffle, then put `_meta` anywhere.
                for s in &swaps {
                    let n = entries.len();
                    if n > 1 {
                        entries.swap(s.index(n), n - 1);
                    }
                }
                let meta = format!(
                    r#"{{"x-unknown":{},"{}":"{PROTOCOL_VERSION}","{}":{{}},"{}":{}}}"#,
                    Tree::Num(1).text(false),
                    crate::protocol::META_PROTOCOL_VERSION,
                    crate::protocol::META_CLIENT_CAPABILITIES,
                    crate::protocol::META_CLIENT_INFO,
                    client_info.text(false)
                );
                let at = meta_at.index(entries.len() + 1);
                entries.insert(at, ("_meta".into(), meta, String::new()));
                Case {
                    method,
                    entries,
                    client_info,
                    answers,
                }
            },
        )
}

fn object_text(entries: &[(String, String, String)], parsed: bool) -> String {
    let items: Vec<String> = entries
        .iter()
        .map(|(k, sent, back)| format!("\"{k}\":{}", if parsed { back } else { sent }))
        .collect();
    format!("{{{}}}", items.join(","))
}

/// What the upstream has always been sent: the body's params after `Map::remove` (a
/// swap with the last key under `preserve_order`) of `_meta`, then `inputResponses`,
/// then `requestState`, then `task`.
fn upstream_entries(c: &Case) -> Vec<(String, String, String)> {
    let mut e = c.entries.clone();
    for k in ["_meta", "inputResponses", "requestState", "task"] {
        if let Some(i) = e.iter().position(|(key, _, _)| key == k) {
            e.swap_remove(i);
        }
    }
    e
}

fn validate(c: &Case) -> ValidRequest {
    let m = c.method.as_str();
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"{m}","params":{}}}"#,
        object_text(&c.entries, false)
    );
    let mut h = HeaderMap::new();
    h.insert("mcp-protocol-version", PROTOCOL_VERSION.parse().unwrap());
    h.insert("mcp-method", m.parse().unwrap());
    if c.method.name_field().is_some() {
        h.insert("mcp-name", "echo".parse().unwrap());
    }
    match wire::validate(body.as_bytes(), &h) {
        Ok(Incoming::Request(r)) => *r,
        other => panic!("{body}: {other:?}"),
    }
}

/// The bytes of the request the upstream is sent for `fwd`.
fn upstream_bytes(method: Method, fwd: &Forward) -> String {
    let spec = upstream_spec(method, fwd, false);
    serde_json::to_string(&legacy_messages::request(7, &spec.method, spec.params)).unwrap()
}

fn forward_of(req: &ValidRequest) -> Forward {
    match req.params.forward() {
        Some(f) => f.clone(),
        None => panic!("{:?}", req.params),
    }
}

fn check(c: &Case) {
    let req = validate(c);
    let fwd = forward_of(&req);
    let m = c.method.as_str();
    let expected = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"{m}","params":{}}}"#,
        object_text(&upstream_entries(c), true)
    );
    assert_eq!(upstream_bytes(c.method, &fwd), expected);

    // The stdio throttle key is the name sent.
    let spec = upstream_spec(c.method, &fwd, false);
    let named = matches!(c.method, Method::ToolsCall | Method::PromptsGet);
    assert_eq!(spec.tool.as_deref(), named.then_some("echo"));

    // Answers pass through as sent, in the client's order.
    match (&c.answers, &fwd.mrtr.input_responses) {
        (Some(a), Field::Valid(r)) => {
            assert_eq!(serde_json::to_string(r).unwrap(), a.text(true));
        }
        (None, Field::Absent) => {}
        (a, r) => panic!("{a:?} vs {r:?}"),
    }
    let client_info = serde_json::to_string(&req.meta.client_info).unwrap();
    assert_eq!(client_info, c.client_info.text(true));

    // The requestState binding is what it was before the params were typed: a
    // fingerprint of the body's params without `_meta`, the MRTR fields and `task`.
    let body_params: Map<String, Value> =
        serde_json::from_str(&object_text(&c.entries, false)).unwrap();
    let mut old = body_params.clone();
    old.remove("_meta");
    old.remove("inputResponses");
    old.remove("requestState");
    old.remove("task");
    assert_eq!(
        params_fingerprint(c.method, &fwd.upstream),
        fingerprint(&serde_json::json!({"method": m, "params": Value::Object(old)}))
    );

    // A retry relayed to another replica is the same request there.
    let (head, params) = req.split();
    let Some(f) = params.forward().cloned() else {
        panic!("{params:?}")
    };
    let retry = RelayedRetry {
        tenant: "t".into(),
        subject: "s".into(),
        upstream: "u".into(),
        req: WireRequest::of(&head.with(f)),
    };
    // As the store carries it: a `Value`, written and read back as bytes.
    let sent = serde_json::to_vec(&serde_json::to_value(&retry).unwrap()).unwrap();
    let stored: Value = serde_json::from_slice(&sent).unwrap();
    let there = decode_retry(&stored).unwrap().req.into_request();
    let fwd_there = forward_of(&there);
    assert_eq!(upstream_bytes(there.method, &fwd_there), expected);
    assert_eq!(fwd_there, fwd);
}

proptest! {
    #[test]
    fn passthrough_values_reach_the_upstream_as_parsed(c in case()) {
        check(&c);
    }

    #[test]
    fn task_update_answers_pass_through_as_parsed(answers in object(), id_first in any::<bool>()) {
        let a = format!(r#""inputResponses":{}"#, answers.text(false));
        let t = r#""taskId":"tsk_x""#;
        let meta = format!(
            r#""_meta":{{"{}":"{PROTOCOL_VERSION}","{}":{{}}}}"#,
            crate::protocol::META_PROTOCOL_VERSION,
            crate::protocol::META_CLIENT_CAPABILITIES
        );
        let params = if id_first { format!("{t},{meta},{a}") } else { format!("{a},{meta},{t}") };
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/update","params":{{{params}}}}}"#);
        let mut h = HeaderMap::new();
        h.insert("mcp-protocol-version", PROTOCOL_VERSION.parse().unwrap());
        h.insert("mcp-method", "tasks/update".parse().unwrap());
        h.insert("mcp-name", "tsk_x".parse().unwrap());
        let Ok(Incoming::Request(r)) = wire::validate(body.as_bytes(), &h) else {
            panic!("{body}")
        };
        let Params::TaskUpdate(u) = &r.params else { panic!("{:?}", r.params) };
        let Field::Valid(got) = &u.input_responses else { panic!("{u:?}") };
        prop_assert_eq!(serde_json::to_string(got).unwrap(), answers.text(true));
        prop_assert_eq!(u.task.task_id.valid().map(String::as_str), Some("tsk_x"));
    }
}

/// One case written out, so a reader sees the bytes the property is about.
#[test]
fn one_call_goes_upstream_as_parsed() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"requestState":"s","name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"arguments":{"n":[1.5,1e999,-0,1234567890123456789012345678901234567890]},"inputResponses":{"k":{"v":-0.0}},"x":{"y":1.10}}}"#;
    let mut h = HeaderMap::new();
    h.insert("mcp-protocol-version", PROTOCOL_VERSION.parse().unwrap());
    h.insert("mcp-method", "tools/call".parse().unwrap());
    h.insert("mcp-name", "echo".parse().unwrap());
    let Ok(Incoming::Request(r)) = wire::validate(body.as_bytes(), &h) else {
        panic!("{body}")
    };
    // requestState, name, _meta, arguments, inputResponses, x
    // − _meta: x takes its slot; − inputResponses: last already; − requestState:
    // arguments takes its slot.
    assert_eq!(
        upstream_bytes(r.method, &forward_of(&r)),
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"n":[1.5,1e+999,-0,1234567890123456789012345678901234567890]},"name":"echo","x":{"y":1.10}}}"#
    );
}

/// A retry relayed to the replica holding its call keeps its answers' number text:
/// read with `serde_json::from_value`, an answer's `-0` arrived as `0`.
#[test]
fn a_relayed_answer_keeps_its_number_text() {
    let stored: Value = serde_json::from_str(
        r#"{"tenant":"t","subject":"s","upstream":"u","req":{"id":1,"method":"tools/call","params":{"name":"echo","inputResponses":{"k":{"n":-0,"m":1.10}},"requestState":"st"},"meta":{"protocol_version":"2026-07-28","caps":{},"client_info":null,"log_level":null,"progress_token":null},"idempotency_key":null}}"#,
    )
    .unwrap();
    let req = decode_retry(&stored).unwrap().req.into_request();
    let fwd = forward_of(&req);
    let Field::Valid(answers) = &fwd.mrtr.input_responses else {
        panic!("{fwd:?}")
    };
    assert_eq!(
        serde_json::to_string(answers).unwrap(),
        r#"{"k":{"n":-0,"m":1.10}}"#
    );
    assert_eq!(fwd.mrtr.request_state, Field::Valid("st".into()));
}
