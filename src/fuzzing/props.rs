//! The proptest targets: strategies that build each module's `Case`, checked by the
//! same `check` the cargo-fuzz targets run. 256 cases each by default; set
//! `PROPTEST_CASES` for longer runs (README "Fuzzing").

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::{auth, config, framing, sse, wire};

/// Bytes of a stream made mostly of the given pieces, with some noise.
fn soup(pieces: &'static [&'static [u8]], len: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(
        prop_oneof![
            4 => proptest::sample::select(pieces).prop_map(<[u8]>::to_vec),
            1 => vec(any::<u8>(), 1..4),
        ],
        0..len,
    )
    .prop_map(|parts| parts.concat())
}

const SSE_PIECES: &[&[u8]] = &[
    b"data:",
    b"data: ",
    b"id:",
    b"id: ",
    b"event:",
    b"retry:",
    b"retry: 42",
    b":",
    b"x",
    b"hello",
    b"17",
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b"\0",
    b"\xEF\xBB\xBF",
    b" ",
    b"\xFF",
];

proptest! {
    #[test]
    fn line_framing_is_chunking_and_cancel_independent(
        stream in vec(prop_oneof![1 => Just(b'\n'), 4 => any::<u8>()], 0..400),
        max in 0usize..48,
        chunks in vec(1usize..40, 0..8),
        drops in vec(any::<bool>(), 0..8),
    ) {
        framing::check(&framing::Case { stream, max, chunks, drops });
    }

    #[test]
    fn sse_is_chunking_independent(
        stream in soup(SSE_PIECES, 64),
        max_event_bytes in 1usize..64,
        chunks in vec(1usize..16, 0..6),
    ) {
        sse::check(&sse::Case::Raw { stream, max_event_bytes, chunks });
    }

    #[test]
    fn sse_events_round_trip(
        events in vec(sse_event(), 0..6),
        bom in any::<bool>(),
        style in vec(any::<u8>(), 0..24),
    ) {
        sse::check(&sse::Case::Events { events, bom, style });
    }

    #[test]
    fn wire_any_body_and_headers(
        body in prop_oneof![
            vec(any::<u8>(), 0..64),
            json_message().prop_map(|v| v.to_string().into_bytes()),
        ],
        headers in vec((0..wire::HEADER_NAMES.len(), header_value()), 0..7),
    ) {
        wire::check(&wire::Case::Raw { body, headers });
    }

    #[test]
    fn wire_built_requests_and_single_faults(
        req in wire_request(),
        fault in 0..wire::FAULTS,
        extra in any::<u16>(),
    ) {
        let fault = wire::Fault::from_index(fault, extra.into());
        wire::check(&wire::Case::Built { req, fault });
    }

    #[test]
    fn auth_any_header_and_query(
        value in proptest::option::of(prop_oneof![
            vec(any::<u8>(), 0..40),
            (
                proptest::sample::select(&["Bearer ", "bearer\t", "Basic ", "Bearer", " BEARER  "][..]),
                "[A-Za-z0-9_.=-]{0,60}",
            ).prop_map(|(s, t)| format!("{s}{t}").into_bytes()),
        ]),
        query in proptest::option::of("[a-z_%0-9=&+]{0,24}"),
    ) {
        auth::check(&auth::Case::Header { value, query });
    }

    #[test]
    fn auth_signed_tokens(t in token()) {
        auth::check(&auth::Case::Signed(t));
    }

    #[test]
    fn jwks_any_document(doc in prop_oneof![
        vec(any::<u8>(), 0..64),
        jwks_soup().prop_map(|v| v.to_string().into_bytes()),
    ]) {
        auth::check(&auth::Case::Jwks(doc));
    }

    #[test]
    fn jwks_built_from_parts(keys in vec(jwk_spec(), 0..6)) {
        auth::check(&auth::Case::BuiltJwks(keys));
    }

    #[test]
    fn config_any_text(text in config_soup()) {
        config::check(&config::Case::Raw(text));
    }

    #[test]
    fn config_built_and_single_faults(cfg in built_config(), fault in 0..config::FAULTS.len()) {
        config::check(&config::Case::Built { cfg, fault });
    }
}

fn sse_event() -> impl Strategy<Value = sse::Ev> {
    (
        proptest::option::of("[^\r\n\0]{0,8}"),
        proptest::option::of("[^\r\n]{0,8}"),
        vec("[^\r\n]{0,8}", 0..3),
        proptest::option::of(any::<u64>()),
        vec("[^\r\n]{0,6}", 0..2),
    )
        .prop_map(|(id, event, data, retry, comments)| sse::Ev {
            id,
            event,
            data,
            retry,
            comments,
        })
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::sample::select(
            &[
                "2026-07-28",
                "2025-06-18",
                "tools/call",
                "tools/list",
                "=?base64?dG9vbHMvY2FsbA==?=",
                "=?base64?dG9vbHMvY2FsbA?=",
                "=?base64?!!?=",
                "echo",
                "127.0.0.1",
                "localhost:8080",
                "[::1]:80",
                "evil.example",
                "gw.example",
                "http://localhost:3000",
                "https://app.example",
                "application/json",
                "Application/JSON; charset=utf-8",
                "text/event-stream",
                "*/*",
                "",
            ][..]
        )
        .prop_map(|s| s.as_bytes().to_vec()),
        vec(any::<u8>(), 0..12),
    ]
}

fn small_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        Just(json!(1.5)),
        Just(json!(u64::MAX)),
        proptest::sample::select(&["2.0", "tools/list", "tools/call", "echo", "", "x"][..])
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..3).prop_map(Value::Array),
            vec(("[a-z_]{0,4}", inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn meta_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        })),
        Just(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/logLevel": "loud"
        })),
        Just(json!({"io.modelcontextprotocol/protocolVersion": 7})),
        small_value(),
    ]
}

/// A JSON object with envelope-ish members.
fn json_message() -> impl Strategy<Value = Value> {
    let member = prop_oneof![
        Just("jsonrpc"),
        Just("id"),
        Just("method"),
        Just("params"),
        Just("result"),
        Just("x"),
    ];
    let params = (
        small_value(),
        proptest::option::of(meta_value()),
        proptest::option::of("[a-z]{0,3}"),
    )
        .prop_map(|(v, meta, name)| {
            let mut p = match v {
                Value::Object(o) => o,
                _ => Map::new(),
            };
            if let Some(m) = meta {
                p.insert("_meta".into(), m);
            }
            if let Some(n) = name {
                p.insert("name".into(), json!(n));
            }
            Value::Object(p)
        });
    vec((member, prop_oneof![small_value(), params]), 0..6)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

fn wire_request() -> impl Strategy<Value = wire::Request> {
    (
        prop_oneof![
            any::<String>().prop_map(wire::Id::Str),
            any::<i64>().prop_map(wire::Id::Int),
        ],
        0..wire::SERVED_METHODS_COUNT,
        prop_oneof![
            "[a-z_/]{0,12}",
            any::<String>(),
            Just("=?base64?aGk=?=".to_string())
        ],
        vec(("k[a-z]{0,4}", small_value()), 0..3),
        any::<bool>(),
        proptest::option::of(0..8usize),
        proptest::option::of(prop_oneof!["[ -~]{0,12}", any::<String>()]),
        any::<u8>(),
    )
        .prop_map(
            |(id, method, name, params, tasks, log_level, idempotency_key, encoding)| {
                wire::Request {
                    id,
                    method,
                    name,
                    params: params.into_iter().collect(),
                    tasks,
                    log_level,
                    idempotency_key,
                    encoding,
                }
            },
        )
}

fn claim() -> impl Strategy<Value = auth::Claim> {
    prop_oneof![
        Just(auth::Claim::Absent),
        "[a-z]{0,4}".prop_map(auth::Claim::Text),
        any::<String>().prop_map(auth::Claim::Text),
        any::<i64>().prop_map(auth::Claim::Number),
        Just(auth::Claim::Null),
    ]
}

fn when() -> impl Strategy<Value = auth::When> {
    proptest::sample::select(
        &[
            auth::When::Absent,
            auth::When::Past,
            auth::When::Future,
            auth::When::Text,
        ][..],
    )
}

fn token() -> impl Strategy<Value = auth::Token> {
    (
        proptest::sample::select(&auth::SIGNERS[..]),
        claim(),
        claim(),
        // Mostly valid times and issuers, so acceptance is exercised too.
        prop_oneof![3 => Just(auth::When::Future), 1 => when()],
        prop_oneof![2 => Just(auth::When::Absent), 1 => when()],
        prop_oneof![3 => Just(1u8), 1 => 0..3u8],
        prop_oneof![3 => Just(1u8), 1 => 0..4u8],
        proptest::option::of("[a-z0-9]{0,6}"),
        proptest::option::of((0..3usize, any::<usize>())),
    )
        .prop_map(
            |(signer, sub, tenant, exp, nbf, iss, aud, kid, tamper)| auth::Token {
                signer,
                sub,
                tenant,
                exp,
                nbf,
                iss,
                aud,
                kid,
                tamper,
            },
        )
}

fn jwk_spec() -> impl Strategy<Value = auth::JwkSpec> {
    (
        0..6u8,
        0..3u8,
        0..4u8,
        prop_oneof![5 => Just(false), 1 => Just(true)],
        proptest::option::of(prop_oneof!["[ab]", "[a-z0-9]{0,6}"]),
    )
        .prop_map(|(kty, use_, alg, broken, kid)| auth::JwkSpec {
            kty,
            use_,
            alg,
            broken,
            kid,
        })
}

fn jwks_soup() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        Just("kty"),
        Just("use"),
        Just("alg"),
        Just("kid"),
        Just("n"),
        Just("e"),
        Just("x"),
        Just("y"),
        Just("crv"),
    ];
    let text = proptest::sample::select(
        &[
            "RSA", "EC", "oct", "sig", "enc", "RS256", "ES256", "P-256", "AQAB", "AA", "", "!",
        ][..],
    )
    .prop_map(Value::from);
    let key = vec((field, prop_oneof![text, small_value()]), 0..8)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    prop_oneof![
        vec(key, 0..4).prop_map(|keys| json!({ "keys": keys })),
        small_value(),
    ]
}

const TOML_PIECES: &[&[u8]] = &[
    b"[server]\n",
    b"[auth]\n",
    b"[tasks]\n",
    b"[store]\n",
    b"[[upstream]]\n",
    b"[upstream.tools.t]\n",
    b"mode = \"none\"\n",
    b"name = \"u\"\n",
    b"command = [\"@self\"]\n",
    b"url = \"http://127.0.0.1:1/mcp\"\n",
    b"listen = \"127.0.0.1:0\"\n",
    b"listen = \"0.0.0.0:1\"\n",
    b"headers = { a = \"${HOME}\" }\n",
    b"headers = { a = \"${\" }\n",
    b"path = \"/x\"\n",
    b"max_concurrency = 0\n",
    b"ttl_ms = 1\n",
    b"replica_id = \"r\"\n",
    b"= ",
    b"[[",
    b"\"",
    b"{",
    b"\n",
];

fn config_soup() -> impl Strategy<Value = String> {
    soup(TOML_PIECES, 16).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn built_config() -> impl Strategy<Value = config::Built> {
    let upstream = (
        any::<bool>(),
        1..=u16::MAX,
        any::<u16>(),
        proptest::option::of("t[a-z]{0,3}"),
    )
        .prop_map(
            |(stdio, max_concurrency, extra, tool)| config::BuiltUpstream {
                stdio,
                max_concurrency,
                max_message_extra: extra.into(),
                tool,
            },
        );
    (
        any::<u16>(),
        any::<bool>(),
        any::<u8>(),
        1..u32::MAX,
        1..u32::MAX,
        any::<u32>(),
        vec(upstream, 1..4),
    )
        .prop_map(
            |(
                port,
                auth_none,
                secret_extra,
                max_body_bytes,
                poll_interval_ms,
                poll_spread,
                upstreams,
            )| {
                config::Built {
                    port,
                    auth_none,
                    secret_extra,
                    max_body_bytes,
                    poll_interval_ms,
                    poll_spread,
                    upstreams,
                }
            },
        )
}
