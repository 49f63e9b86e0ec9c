//! Bearer-token verification (`auth::Authenticator`, `auth::jwt`) and JWKS parsing
//! (`auth::jwks`).
//!
//! Properties:
//! - any `Authorization` value and query is answered 401 or 403 and never
//!   accepted unless it carries a token signed with a configured key; an
//!   `access_token` in the query is refused (401 `invalid_request`) whatever the
//!   header says;
//! - a signed token is accepted exactly when its algorithm is configured and its key
//!   is the configured one, it was not altered, `exp` is in the future, `nbf` is not,
//!   `iss` and `aud` are the configured ones, and `sub` and the tenant claim are
//!   non-empty strings; the principal is then exactly those two claims;
//! - any JWKS document parses or is refused without a panic, and any key it yields can
//!   be used to verify a token without a panic; a JWKS built from parts yields exactly
//!   its usable keys (RSA or EC P-256 signature keys whose `alg`, if any, fits), and
//!   key selection by `kid` and algorithm follows them.

use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Map, Value, json};

use super::{Bytes, complete};
use crate::auth::jwks::{self, Select};
use crate::auth::{Authenticator, Principal};
use crate::config::AuthConfig;

const RSA1_KEY: &str = include_str!("../auth/testdata/rsa1.key.pem");
const RSA1_PUB: &str = include_str!("../auth/testdata/rsa1.pub.pem");
const RSA2_KEY: &str = include_str!("../auth/testdata/rsa2.key.pem");
const EC1_KEY: &str = include_str!("../auth/testdata/ec1.key.pem");
const EC2_KEY: &str = include_str!("../auth/testdata/ec2.key.pem");
const SECRET: &str = "fuzz-secret-0123456789abcdef-0123456789abcdef";
const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "taskgate";
/// Far enough from any bound that the leeway and the clock never decide a case.
const HOUR: i64 = 3600;

#[derive(Debug, Clone)]
pub enum Case {
    /// A raw `Authorization` header value (absent when `None`) and query.
    Header {
        value: Option<Vec<u8>>,
        query: Option<String>,
    },
    /// A token signed from parts.
    Signed(Token),
    /// A raw JWKS document.
    Jwks(Vec<u8>),
    /// A JWKS document built from parts.
    BuiltJwks(Vec<JwkSpec>),
}

/// How a token is signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    Hs256,
    Hs256WrongSecret,
    Rs256,
    Rs256WrongKey,
    /// ES256 is not among the configured algorithms.
    Es256,
    /// `alg: none`, no signature.
    None,
}

pub const SIGNERS: [Signer; 6] = [
    Signer::Hs256,
    Signer::Hs256WrongSecret,
    Signer::Rs256,
    Signer::Rs256WrongKey,
    Signer::Es256,
    Signer::None,
];

/// A claim's value as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    Absent,
    Text(String),
    Number(i64),
    Null,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Absent,
    Past,
    Future,
    /// Not a number.
    Text,
}

#[derive(Debug, Clone)]
pub struct Token {
    pub signer: Signer,
    pub sub: Claim,
    pub tenant: Claim,
    pub exp: When,
    pub nbf: When,
    /// 0 absent, 1 right, 2 wrong.
    pub iss: u8,
    /// 0 absent, 1 right, 2 wrong, 3 an array holding the right one.
    pub aud: u8,
    pub kid: Option<String>,
    /// Change one character of this segment (0..3) at this position.
    pub tamper: Option<(usize, usize)>,
}

/// One key of a built JWKS.
#[derive(Debug, Clone)]
pub struct JwkSpec {
    /// 0 RSA (rsa1), 1 EC P-256 (ec1), 2 EC P-384, 3 `oct`, 4 RSA (rsa2), 5 EC (ec2).
    pub kty: u8,
    /// 0 absent, 1 `sig`, 2 `enc`.
    pub use_: u8,
    /// 0 absent, 1 RS256, 2 ES256, 3 HS256.
    pub alg: u8,
    /// Components replaced by text that is not base64url.
    pub broken: bool,
    pub kid: Option<String>,
}

pub fn fuzz(data: &[u8]) {
    let mut b = Bytes::new(data);
    let case = match b.choose(4) {
        0 => {
            let query = b.bool().then(|| b.text());
            let value = b.bool().then(|| b.rest().to_vec());
            Case::Header { value, query }
        }
        1 => {
            let claim = |b: &mut Bytes<'_>| match b.choose(4) {
                0 => Claim::Absent,
                1 => Claim::Text(b.text()),
                2 => Claim::Number(i64::from(b.u16())),
                _ => Claim::Null,
            };
            let when = |b: &mut Bytes<'_>| match b.choose(4) {
                0 => When::Absent,
                1 => When::Past,
                2 => When::Future,
                _ => When::Text,
            };
            Case::Signed(Token {
                signer: SIGNERS[b.choose(SIGNERS.len())],
                sub: claim(&mut b),
                tenant: claim(&mut b),
                exp: when(&mut b),
                nbf: when(&mut b),
                iss: b.u8() % 3,
                aud: b.u8() % 4,
                kid: b.bool().then(|| b.text()),
                tamper: b.bool().then(|| (b.choose(3), usize::from(b.u16()))),
            })
        }
        2 => Case::Jwks(b.rest().to_vec()),
        _ => Case::BuiltJwks(
            (0..b.choose(6))
                .map(|_| JwkSpec {
                    kty: b.u8() % 6,
                    use_: b.u8() % 3,
                    alg: b.u8() % 4,
                    broken: b.u8().is_multiple_of(8),
                    kid: b.bool().then(|| b.text()),
                })
                .collect(),
        ),
    };
    check(&case);
}

pub fn check(case: &Case) {
    match case {
        Case::Header { value, query } => check_header(value.as_deref(), query.as_deref()),
        Case::Signed(t) => check_signed(t),
        Case::Jwks(bytes) => check_jwks(bytes),
        Case::BuiltJwks(keys) => check_built_jwks(keys),
    }
}

/// HS256 + RS256 (rsa1), with issuer and audience: the gateway under test.
fn authenticator() -> &'static Authenticator {
    static A: OnceLock<Authenticator> = OnceLock::new();
    A.get_or_init(|| {
        let cfg = AuthConfig {
            hs256_secret: Some(SECRET.into()),
            algorithms: vec!["HS256".into(), "RS256".into()],
            public_key_pem: Some(RSA1_PUB.into()),
            issuer: Some(ISSUER.into()),
            audience: Some(AUDIENCE.into()),
            ..AuthConfig::default()
        };
        Authenticator::new(&cfg, "http://gw.example").expect("the fuzz auth config is valid")
    })
}

/// The principal, or the refusal's status and RFC 6750 error code.
fn authenticate(
    value: Option<HeaderValue>,
    query: Option<&str>,
) -> Result<Principal, (u16, &'static str)> {
    let mut h = HeaderMap::new();
    if let Some(v) = value {
        h.insert(http::header::AUTHORIZATION, v);
    }
    complete(authenticator().authenticate(&h, query), 4).map_err(|f| (f.status.as_u16(), f.error))
}

fn check_header(value: Option<&[u8]>, query: Option<&str>) {
    let header = value.and_then(|v| HeaderValue::from_bytes(v).ok());
    match authenticate(header.clone(), query) {
        Ok(p) => {
            // Only a token minted with a configured key gets here; the fuzzer can
            // reach one only by keeping a seed's signed token intact.
            assert!(!p.tenant.is_empty() && !p.subject.is_empty(), "{p:?}");
        }
        Err(status) => assert!(
            matches!(
                status,
                (401, "invalid_request" | "invalid_token") | (403, "insufficient_scope")
            ),
            "refused with {status:?}"
        ),
    }
    let q = format!("{}&access_token=x", query.unwrap_or(""));
    assert_eq!(
        authenticate(header, Some(&q)),
        Err((401, "invalid_request")),
        "query token admitted"
    );
}

fn now() -> i64 {
    i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap_or(i64::MAX)
}

fn claims(t: &Token) -> Value {
    let mut c = Map::new();
    let mut put = |k: &str, v: &Claim| match v {
        Claim::Absent => {}
        Claim::Text(s) => {
            c.insert(k.into(), json!(s));
        }
        Claim::Number(n) => {
            c.insert(k.into(), json!(n));
        }
        Claim::Null => {
            c.insert(k.into(), Value::Null);
        }
    };
    put("sub", &t.sub);
    put("tenant", &t.tenant);
    for (k, w) in [("exp", t.exp), ("nbf", t.nbf)] {
        match w {
            When::Absent => {}
            When::Past => {
                c.insert(k.into(), json!(now() - HOUR));
            }
            When::Future => {
                c.insert(k.into(), json!(now() + HOUR));
            }
            When::Text => {
                c.insert(k.into(), json!("soon"));
            }
        }
    }
    match t.iss {
        1 => {
            c.insert("iss".into(), json!(ISSUER));
        }
        2 => {
            c.insert("iss".into(), json!("https://other.example"));
        }
        _ => {}
    }
    match t.aud {
        1 => {
            c.insert("aud".into(), json!(AUDIENCE));
        }
        2 => {
            c.insert("aud".into(), json!("someone-else"));
        }
        3 => {
            c.insert("aud".into(), json!(["someone-else", AUDIENCE]));
        }
        _ => {}
    }
    c.insert("iat".into(), json!(now()));
    Value::Object(c)
}

/// The token as signed, or `None` when the signer cannot produce it.
pub fn sign(t: &Token) -> String {
    let claims = claims(t);
    let (alg, key) = match t.signer {
        Signer::Hs256 => (Algorithm::HS256, hs_key(SECRET.as_bytes())),
        Signer::Hs256WrongSecret => (
            Algorithm::HS256,
            hs_key(b"another-secret-0123456789abcdef-0123"),
        ),
        Signer::Rs256 => (Algorithm::RS256, rsa_key(RSA1_KEY)),
        Signer::Rs256WrongKey => (Algorithm::RS256, rsa_key(RSA2_KEY)),
        Signer::Es256 => (Algorithm::ES256, ec_key(EC1_KEY)),
        Signer::None => {
            let mut header = json!({"alg": "none", "typ": "JWT"});
            if let Some(k) = &t.kid {
                header["kid"] = json!(k);
            }
            return format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(header.to_string()),
                URL_SAFE_NO_PAD.encode(claims.to_string())
            );
        }
    };
    let mut header = Header::new(alg);
    header.kid = t.kid.clone();
    jsonwebtoken::encode(&header, &claims, &key).expect("signing with a test key works")
}

fn hs_key(secret: &[u8]) -> EncodingKey {
    EncodingKey::from_secret(secret).expect("test key")
}

fn rsa_key(pem: &str) -> EncodingKey {
    EncodingKey::from_rsa_pem(pem.as_bytes()).expect("test key")
}

fn ec_key(pem: &str) -> EncodingKey {
    EncodingKey::from_ec_pem(pem.as_bytes()).expect("test key")
}

/// Replace the character at `pos` (modulo the segment's length) of segment `seg` by
/// another base64url character; `None` when the segment is empty.
fn tamper(token: &str, seg: usize, pos: usize) -> Option<String> {
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let part = parts.get_mut(seg)?;
    if part.is_empty() {
        return None;
    }
    let mut bytes = part.clone().into_bytes();
    let i = pos % bytes.len();
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    *part = String::from_utf8(bytes).ok()?;
    Some(parts.join("."))
}

fn non_empty_text(c: &Claim) -> Option<&str> {
    match c {
        Claim::Text(s) if !s.is_empty() => Some(s),
        _ => None,
    }
}

fn check_signed(t: &Token) {
    let mut token = sign(t);
    let mut tampered = false;
    if let Some((seg, pos)) = t.tamper
        && let Some(altered) = tamper(&token, seg, pos)
    {
        token = altered;
        tampered = true;
    }
    let accept = matches!(t.signer, Signer::Hs256 | Signer::Rs256)
        && !tampered
        && t.exp == When::Future
        && matches!(t.nbf, When::Absent | When::Past)
        && t.iss == 1
        && matches!(t.aud, 1 | 3);
    let principal = match (non_empty_text(&t.tenant), non_empty_text(&t.sub)) {
        (Some(tenant), Some(sub)) if accept => Some(Principal {
            tenant: tenant.into(),
            subject: sub.into(),
        }),
        _ => None,
    };
    let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("a JWT is ASCII");
    let got = authenticate(Some(value), None);
    match principal {
        Some(p) => assert_eq!(got, Ok(p), "{t:?}"),
        None => assert_eq!(got.map_err(|(s, _)| s), Err(401), "{t:?}"),
    }
}

/// A token of each asymmetric algorithm, for trying keys on.
fn probe_tokens() -> &'static [(Algorithm, String)] {
    static T: OnceLock<Vec<(Algorithm, String)>> = OnceLock::new();
    T.get_or_init(|| {
        let claims = json!({"sub": "s", "tenant": "t", "exp": now() + HOUR});
        let rs = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &rsa_key(RSA1_KEY));
        let es = jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, &ec_key(EC1_KEY));
        vec![
            (Algorithm::RS256, rs.expect("test key")),
            (Algorithm::ES256, es.expect("test key")),
        ]
    })
}

fn check_jwks(bytes: &[u8]) {
    let Ok(set) = jwks::parse_jwks(bytes) else {
        return;
    };
    assert!(set.len() >= 1, "an accepted JWKS has a key");
    for (alg, token) in probe_tokens() {
        if let Select::Found(k) = set.select(*alg, None) {
            let mut v = jsonwebtoken::Validation::new(*alg);
            v.validate_aud = false;
            let _ = jsonwebtoken::decode::<Value>(token, &k.key, &v);
        }
    }
}

/// The public JWK of a test key, as a JSON object.
fn public_jwk(kty: u8) -> Map<String, Value> {
    let (alg, key) = match kty {
        0 => (Algorithm::RS256, rsa_key(RSA1_KEY)),
        4 => (Algorithm::RS256, rsa_key(RSA2_KEY)),
        5 => (Algorithm::ES256, ec_key(EC2_KEY)),
        _ => (Algorithm::ES256, ec_key(EC1_KEY)),
    };
    let jwk = Jwk::from_encoding_key(&key, alg).expect("test key");
    let mut v = serde_json::to_value(jwk).expect("a JWK serialises");
    let Some(o) = v.as_object_mut() else {
        panic!("a JWK is an object");
    };
    for k in ["alg", "kid", "use", "key_ops"] {
        o.remove(k);
    }
    o.clone()
}

fn built_key(spec: &JwkSpec) -> Value {
    let mut o = match spec.kty {
        2 => {
            let mut o = public_jwk(1);
            o.insert("crv".into(), json!("P-384"));
            o
        }
        3 => {
            let mut o = Map::new();
            o.insert("kty".into(), json!("oct"));
            o.insert("k".into(), json!(URL_SAFE_NO_PAD.encode(SECRET)));
            o
        }
        k => public_jwk(k),
    };
    if spec.broken {
        for k in ["n", "e", "x", "y"] {
            if o.contains_key(k) {
                o.insert(k.into(), json!("!not base64!"));
            }
        }
    }
    match spec.use_ {
        1 => {
            o.insert("use".into(), json!("sig"));
        }
        2 => {
            o.insert("use".into(), json!("enc"));
        }
        _ => {}
    }
    match spec.alg {
        1 => {
            o.insert("alg".into(), json!("RS256"));
        }
        2 => {
            o.insert("alg".into(), json!("ES256"));
        }
        3 => {
            o.insert("alg".into(), json!("HS256"));
        }
        _ => {}
    }
    if let Some(k) = &spec.kid {
        o.insert("kid".into(), json!(k));
    }
    Value::Object(o)
}

/// The algorithm family a built key serves, if the JWKS parser must keep it.
fn usable(spec: &JwkSpec) -> Option<Algorithm> {
    let family = match spec.kty {
        0 | 4 => Algorithm::RS256,
        1 | 5 => Algorithm::ES256,
        _ => return None,
    };
    let alg_fits = match spec.alg {
        0 => true,
        1 => family == Algorithm::RS256,
        2 => family == Algorithm::ES256,
        _ => false,
    };
    (spec.use_ != 2 && alg_fits && !spec.broken).then_some(family)
}

fn check_built_jwks(keys: &[JwkSpec]) {
    let doc = json!({"keys": keys.iter().map(built_key).collect::<Vec<_>>()});
    let bytes = doc.to_string().into_bytes();
    check_jwks(&bytes);
    let usable: Vec<(Algorithm, Option<&str>)> = keys
        .iter()
        .filter_map(|k| usable(k).map(|a| (a, k.kid.as_deref())))
        .collect();
    let parsed = jwks::parse_jwks(&bytes);
    let set = match parsed {
        Ok(set) => set,
        Err(_) => {
            assert!(usable.is_empty(), "refused a JWKS with usable keys {doc}");
            return;
        }
    };
    assert_eq!(set.len(), usable.len(), "{doc}");
    for alg in [Algorithm::RS256, Algorithm::ES256] {
        // Without a kid: exactly one fitting key is found, none is unknown, several
        // are ambiguous.
        let fitting = usable.iter().filter(|(a, _)| *a == alg).count();
        match (set.select(alg, None), fitting) {
            (Select::Found(_), 1) | (Select::Unknown, 0) | (Select::Refused(_), 2..) => {}
            (_, n) => panic!("{alg:?} without kid, {n} fitting keys: wrong selection {doc}"),
        }
        for (_, kid) in &usable {
            let Some(kid) = kid else { continue };
            let same: Vec<_> = usable.iter().filter(|(_, k)| *k == Some(*kid)).collect();
            let fits = same.iter().any(|(a, _)| *a == alg);
            match set.select(alg, Some(kid)) {
                Select::Found(_) => assert!(fits, "{alg:?} kid {kid:?}: {doc}"),
                Select::Refused(_) => assert!(!fits, "{alg:?} kid {kid:?}: {doc}"),
                Select::Unknown => panic!("{alg:?} kid {kid:?} unknown: {doc}"),
            }
        }
    }
}
