//! Tests for the auth module. Keys in `testdata/` were generated once with openssl
//! (RSA 2048 PKCS#1 + SPKI, EC P-256 PKCS#8 + SPKI) and are used only here.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::Full;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::*;
use crate::config::{AuthConfig, AuthMode};

const RSA1_KEY: &str = include_str!("testdata/rsa1.key.pem");
const RSA1_PUB: &str = include_str!("testdata/rsa1.pub.pem");
const RSA2_KEY: &str = include_str!("testdata/rsa2.key.pem");
const EC1_KEY: &str = include_str!("testdata/ec1.key.pem");
const EC1_PUB: &str = include_str!("testdata/ec1.pub.pem");
const EC2_KEY: &str = include_str!("testdata/ec2.key.pem");

const SECRET: &str = "test-secret-0123456789abcdef-0123456789abcdef";
const PUBLIC_URL: &str = "http://gw.example";
const PRM: &str = "http://gw.example/.well-known/oauth-protected-resource";

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn hs_cfg() -> AuthConfig {
    AuthConfig {
        hs256_secret: Some(SECRET.into()),
        ..AuthConfig::default()
    }
}

fn asym_cfg(algs: &[&str]) -> AuthConfig {
    AuthConfig {
        algorithms: algs.iter().map(|s| s.to_string()).collect(),
        ..AuthConfig::default()
    }
}

fn claims(sub: &str, tenant: &str) -> Value {
    json!({"sub": sub, "tenant": tenant, "exp": now() + 600, "iat": now()})
}

fn enc_key(alg: Algorithm, pem: &str) -> EncodingKey {
    match alg {
        Algorithm::HS256 => EncodingKey::from_secret(pem.as_bytes()).unwrap(),
        Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
        _ => unreachable!(),
    }
}

fn sign(alg: Algorithm, key: &str, kid: Option<&str>, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&h, claims, &enc_key(alg, key)).unwrap()
}

fn hs(claims: &Value) -> String {
    sign(Algorithm::HS256, SECRET, None, claims)
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    h
}

fn jwk(alg: Algorithm, key: &str, kid: &str) -> Value {
    let jwk = Jwk::from_encoding_key(&enc_key(alg, key), alg).unwrap();
    let mut v = serde_json::to_value(jwk).unwrap();
    v["kid"] = json!(kid);
    v
}

fn jwks(keys: &[(Algorithm, &str, &str)]) -> String {
    let keys: Vec<Value> = keys.iter().map(|(a, k, kid)| jwk(*a, k, kid)).collect();
    json!({ "keys": keys }).to_string()
}

fn auth(cfg: &AuthConfig) -> Authenticator {
    Authenticator::new(cfg, PUBLIC_URL).unwrap()
}

async fn ok(a: &Authenticator, token: &str) -> Principal {
    match a.authenticate(&bearer(token), None).await {
        Ok(p) => p,
        Err(f) => panic!("expected success, got {f:?}"),
    }
}

async fn fail(a: &Authenticator, token: &str) -> AuthFailure {
    match a.authenticate(&bearer(token), None).await {
        Ok(p) => panic!("expected failure, got {p:?}"),
        Err(f) => f,
    }
}

fn assert_invalid_token(f: &AuthFailure, desc: &str) {
    assert_eq!(f.status, StatusCode::UNAUTHORIZED, "{f:?}");
    assert_eq!(f.error, "invalid_token", "{f:?}");
    assert_eq!(f.description, desc, "{f:?}");
    assert_eq!(
        f.www_authenticate,
        format!(
            "Bearer error=\"invalid_token\", error_description=\"{desc}\", resource_metadata=\"{PRM}\""
        )
    );
    assert_eq!(
        f.body(),
        json!({"error": "invalid_token", "error_description": desc})
    );
}

/// A fresh file path in a temp dir that is removed when the returned guard drops.
fn temp_path(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("taskgate-auth-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

// ---------------------------------------------------------------- HS256 basics

#[tokio::test]
async fn hs256_valid() {
    let a = auth(&hs_cfg());
    assert!(a.is_enabled());
    let p = ok(&a, &hs(&claims("alice", "acme"))).await;
    assert_eq!(
        p,
        Principal {
            tenant: "acme".into(),
            subject: "alice".into()
        }
    );
}

#[tokio::test]
async fn bearer_scheme_is_case_insensitive() {
    let a = auth(&hs_cfg());
    let t = hs(&claims("alice", "acme"));
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("{scheme} {t}")).unwrap(),
        );
        assert!(a.authenticate(&h, None).await.is_ok(), "{scheme}");
    }
}

#[tokio::test]
async fn missing_header_is_bare_challenge() {
    let a = auth(&hs_cfg());
    let f = a.authenticate(&HeaderMap::new(), None).await.unwrap_err();
    assert_eq!(f.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        f.www_authenticate,
        format!("Bearer resource_metadata=\"{PRM}\"")
    );
    assert!(!f.www_authenticate.contains("error="));
}

#[tokio::test]
async fn non_bearer_scheme_and_duplicates_refused() {
    let a = auth(&hs_cfg());
    let mut h = HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_static("Basic YWxpY2U6cHc="),
    );
    let f = a.authenticate(&h, None).await.unwrap_err();
    assert_eq!(
        (f.status, f.error),
        (StatusCode::UNAUTHORIZED, "invalid_request")
    );

    let t = hs(&claims("alice", "acme"));
    let mut h = bearer(&t);
    h.append(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
    );
    let f = a.authenticate(&h, None).await.unwrap_err();
    assert_eq!(f.error, "invalid_request");

    let mut h = HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_static("Bearer "),
    );
    let f = a.authenticate(&h, None).await.unwrap_err();
    assert_eq!(f.error, "invalid_request");
}

#[tokio::test]
async fn garbage_refused() {
    let a = auth(&hs_cfg());
    for g in [
        "garbage",
        "a.b.c",
        "a.b",
        "....",
        "eyJhbGciOiJIUzI1NiJ9.e30",
    ] {
        let f = fail(&a, g).await;
        assert_invalid_token(&f, "malformed token");
    }
    let big = "x".repeat(20_000);
    assert_invalid_token(&fail(&a, &big).await, "token too large");
}

#[tokio::test]
async fn expired_refused_and_leeway_honoured() {
    let a = auth(&hs_cfg());
    let mut c = claims("alice", "acme");
    c["exp"] = json!(now() - 120);
    assert_invalid_token(&fail(&a, &hs(&c)).await, "token expired");
    // within the 30 s leeway
    c["exp"] = json!(now() - 10);
    ok(&a, &hs(&c)).await;
}

#[tokio::test]
async fn exp_required() {
    let a = auth(&hs_cfg());
    let c = json!({"sub": "alice", "tenant": "acme"});
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing exp claim");
}

#[tokio::test]
async fn nbf_in_future_refused() {
    let a = auth(&hs_cfg());
    let mut c = claims("alice", "acme");
    c["nbf"] = json!(now() + 600);
    assert_invalid_token(&fail(&a, &hs(&c)).await, "token not yet valid");
    c["nbf"] = json!(now() + 10); // within leeway
    ok(&a, &hs(&c)).await;
}

#[tokio::test]
async fn issuer_checked() {
    let cfg = AuthConfig {
        issuer: Some("https://idp.example".into()),
        ..hs_cfg()
    };
    let a = auth(&cfg);
    let mut c = claims("alice", "acme");
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing iss claim");
    c["iss"] = json!("https://evil.example");
    assert_invalid_token(&fail(&a, &hs(&c)).await, "wrong issuer");
    c["iss"] = json!("https://idp.example");
    ok(&a, &hs(&c)).await;
}

#[tokio::test]
async fn audience_checked() {
    let cfg = AuthConfig {
        audience: Some("taskgate".into()),
        ..hs_cfg()
    };
    let a = auth(&cfg);
    let mut c = claims("alice", "acme");
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing aud claim");
    c["aud"] = json!("other");
    assert_invalid_token(&fail(&a, &hs(&c)).await, "wrong audience");
    c["aud"] = json!(["other", "taskgate"]);
    ok(&a, &hs(&c)).await;
    // Without a configured audience, a token with `aud` is still accepted.
    let a = auth(&hs_cfg());
    ok(&a, &hs(&c)).await;
}

#[tokio::test]
async fn alg_none_refused() {
    let a = auth(&hs_cfg());
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims("alice", "acme").to_string());
    for t in [
        format!("{header}.{payload}."),
        format!("{header}.{payload}.c2ln"),
    ] {
        assert_invalid_token(&fail(&a, &t).await, "algorithm not allowed");
    }
    // Other algorithms jsonwebtoken knows but we do not allow.
    let c = claims("alice", "acme");
    let t = jsonwebtoken::encode(
        &Header::new(Algorithm::HS512),
        &c,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    assert_invalid_token(&fail(&a, &t).await, "algorithm not allowed");
}

#[tokio::test]
async fn wrong_key_refused() {
    let a = auth(&hs_cfg());
    let t = sign(
        Algorithm::HS256,
        "another-secret-0123456789abcdef-0123456789",
        None,
        &claims("alice", "acme"),
    );
    assert_invalid_token(&fail(&a, &t).await, "invalid signature");

    let cfg = AuthConfig {
        public_key_pem: Some(RSA1_PUB.into()),
        ..asym_cfg(&["RS256"])
    };
    let a = auth(&cfg);
    let t = sign(Algorithm::RS256, RSA2_KEY, None, &claims("alice", "acme"));
    assert_invalid_token(&fail(&a, &t).await, "invalid signature");
}

#[tokio::test]
async fn tampered_payload_refused() {
    let a = auth(&hs_cfg());
    let t = hs(&claims("alice", "acme"));
    let parts: Vec<&str> = t.split('.').collect();
    let evil = URL_SAFE_NO_PAD.encode(claims("mallory", "acme").to_string());
    let forged = format!("{}.{}.{}", parts[0], evil, parts[2]);
    assert_invalid_token(&fail(&a, &forged).await, "invalid signature");
}

#[tokio::test]
async fn alg_confusion_refused() {
    // Only RS256 configured: an HS256 token "signed" with the public key is refused
    // before any verification.
    let cfg = AuthConfig {
        public_key_pem: Some(RSA1_PUB.into()),
        ..asym_cfg(&["RS256"])
    };
    let a = auth(&cfg);
    let t = sign(Algorithm::HS256, RSA1_PUB, None, &claims("alice", "acme"));
    assert_invalid_token(&fail(&a, &t).await, "algorithm not allowed");
    // ES256 not configured either.
    let t = sign(Algorithm::ES256, EC1_KEY, None, &claims("alice", "acme"));
    assert_invalid_token(&fail(&a, &t).await, "algorithm not allowed");

    // HS256 + RS256 configured: HS256 verifies only with the secret, never the PEM.
    let cfg = AuthConfig {
        hs256_secret: Some(SECRET.into()),
        public_key_pem: Some(RSA1_PUB.into()),
        ..asym_cfg(&["HS256", "RS256"])
    };
    let a = auth(&cfg);
    let t = sign(Algorithm::HS256, RSA1_PUB, None, &claims("alice", "acme"));
    assert_invalid_token(&fail(&a, &t).await, "invalid signature");
    ok(&a, &hs(&claims("alice", "acme"))).await;
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, None, &claims("bob", "acme")),
    )
    .await;
}

#[tokio::test]
async fn missing_tenant_or_sub_refused() {
    let a = auth(&hs_cfg());
    let c = json!({"sub": "alice", "exp": now() + 600});
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing tenant claim");
    let c = json!({"sub": "alice", "tenant": "", "exp": now() + 600});
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing tenant claim");
    let c = json!({"sub": "alice", "tenant": 7, "exp": now() + 600});
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing tenant claim");
    let c = json!({"tenant": "acme", "exp": now() + 600});
    assert_invalid_token(&fail(&a, &hs(&c)).await, "missing sub claim");
}

#[tokio::test]
async fn custom_tenant_claim() {
    let cfg = AuthConfig {
        tenant_claim: "org_id".into(),
        ..hs_cfg()
    };
    let a = auth(&cfg);
    let c = json!({"sub": "alice", "org_id": "o-1", "tenant": "x", "exp": now() + 600});
    assert_eq!(ok(&a, &hs(&c)).await.tenant, "o-1");
}

#[tokio::test]
async fn insufficient_scope_is_403() {
    let cfg = AuthConfig {
        required_scope: Some("tasks".into()),
        ..hs_cfg()
    };
    let a = auth(&cfg);
    let mut c = claims("alice", "acme");
    let f = fail(&a, &hs(&c)).await;
    assert_eq!(f.status, StatusCode::FORBIDDEN);
    assert_eq!(f.error, "insufficient_scope");
    assert_eq!(
        f.www_authenticate,
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"tasks\", resource_metadata=\"{PRM}\""
        )
    );
    c["scope"] = json!("read write");
    assert_eq!(fail(&a, &hs(&c)).await.status, StatusCode::FORBIDDEN);
    c["scope"] = json!("read tasks");
    ok(&a, &hs(&c)).await;
    let mut c = claims("alice", "acme");
    c["scp"] = json!(["x", "tasks"]);
    ok(&a, &hs(&c)).await;
}

#[tokio::test]
async fn query_string_token_refused() {
    let a = auth(&hs_cfg());
    let t = hs(&claims("alice", "acme"));
    for q in [
        format!("access_token={t}"),
        format!("a=1&access_token={t}"),
        "access%5Ftoken=x".to_string(),
    ] {
        let f = a.authenticate(&bearer(&t), Some(&q)).await.unwrap_err();
        assert_eq!(f.status, StatusCode::UNAUTHORIZED);
        assert_eq!(f.error, "invalid_request");
        assert_eq!(f.description, "tokens in the query string are refused");
        assert!(f.www_authenticate.contains("error=\"invalid_request\""));
        assert!(!f.www_authenticate.contains(&t));
    }
    // An unrelated query is fine.
    assert!(
        a.authenticate(&bearer(&t), Some("x=access_token"))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn failures_never_echo_the_token() {
    let a = auth(&hs_cfg());
    let mut c = claims("alice", "acme");
    c["exp"] = json!(now() - 1000);
    let t = hs(&c);
    let f = fail(&a, &t).await;
    assert!(!f.www_authenticate.contains(&t) && !f.description.contains("alice"));
}

#[tokio::test]
async fn verified_token_cache() {
    let a = auth(&hs_cfg());
    let t = hs(&claims("alice", "acme"));
    ok(&a, &t).await;
    ok(&a, &t).await;
    assert_eq!(a.cache.len(), 1);
    // Refused tokens are not cached.
    let _ = fail(&a, "garbage").await;
    assert_eq!(a.cache.len(), 1);

    let c = cache::TokenCache::new(160);
    assert_eq!(c.capacity(), 160);
    let p = Principal::anonymous();
    c.insert(cache::digest("t"), p.clone(), 100, 50);
    assert_eq!(c.get(&cache::digest("t"), 99), Some(p.clone()));
    assert_eq!(c.get(&cache::digest("t"), 100), None); // honoured only until exp
    for i in 0..500 {
        c.insert(cache::digest(&i.to_string()), p.clone(), 100, 50);
        assert!(c.len() <= 160);
    }
    assert!(
        c.len() > 100,
        "evictions keep most of the cache: {}",
        c.len()
    );
}

// ---------------------------------------------------------------- static PEM keys

#[tokio::test]
async fn rs256_and_es256_with_pem() {
    let a = auth(&AuthConfig {
        public_key_pem: Some(RSA1_PUB.into()),
        ..asym_cfg(&["RS256"])
    });
    let p = ok(
        &a,
        &sign(
            Algorithm::RS256,
            RSA1_KEY,
            Some("whatever"),
            &claims("alice", "acme"),
        ),
    )
    .await;
    assert_eq!(p.subject, "alice");

    let a = auth(&AuthConfig {
        public_key_pem: Some(EC1_PUB.into()),
        ..asym_cfg(&["ES256"])
    });
    ok(
        &a,
        &sign(Algorithm::ES256, EC1_KEY, None, &claims("alice", "acme")),
    )
    .await;
    let t = sign(Algorithm::ES256, EC2_KEY, None, &claims("alice", "acme"));
    assert_invalid_token(&fail(&a, &t).await, "invalid signature");
}

#[tokio::test]
async fn pem_from_file_path() {
    let (_dir_path, path) = temp_path("ec.pub.pem");
    std::fs::write(&path, EC1_PUB).unwrap();
    let a = auth(&AuthConfig {
        public_key_pem: Some(path.display().to_string()),
        ..asym_cfg(&["ES256"])
    });
    ok(
        &a,
        &sign(Algorithm::ES256, EC1_KEY, None, &claims("alice", "acme")),
    )
    .await;
}

#[test]
fn init_errors_name_the_key() {
    let e = Authenticator::new(
        &AuthConfig {
            public_key_pem: Some(
                "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n".into(),
            ),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.public_key_pem");
    let e = Authenticator::new(
        &AuthConfig {
            public_key_pem: Some("/nonexistent/key.pem".into()),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.public_key_pem");
    // EC key but only RS256 allowed
    let e = Authenticator::new(
        &AuthConfig {
            public_key_pem: Some(EC1_PUB.into()),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.public_key_pem");
    let e = Authenticator::new(
        &AuthConfig {
            jwks_file: Some("/nonexistent/jwks.json".into()),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.jwks_file");
    let (_dir_bad, bad) = temp_path("bad.json");
    std::fs::write(&bad, r#"{"keys":[{"kty":"oct","k":"AAAA"}]}"#).unwrap();
    let e = Authenticator::new(
        &AuthConfig {
            jwks_file: Some(bad),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.jwks_file");
    let e = Authenticator::new(
        &AuthConfig {
            jwks_url: Some("ftp://idp.example/jwks".into()),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.jwks_url");
    // An https:// URL is verified against a CA file that must exist and hold a CA.
    let e = Authenticator::new(
        &AuthConfig {
            jwks_url: Some("https://idp.example/jwks".into()),
            jwks_ca_file: Some("/nonexistent/ca.pem".into()),
            ..asym_cfg(&["RS256"])
        },
        PUBLIC_URL,
    )
    .err()
    .unwrap();
    assert_eq!(e.key, "auth.jwks_ca_file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let e = Authenticator::new(&AuthConfig::default(), PUBLIC_URL)
        .err()
        .unwrap();
    assert_eq!(e.key, "auth.hs256_secret");
    assert!(e.to_string().contains("auth.hs256_secret"));
}

// ---------------------------------------------------------------- JWKS file

#[tokio::test]
async fn jwks_file_two_kids_and_rotation() {
    let (_dir_path, path) = temp_path("jwks.json");
    std::fs::write(
        &path,
        jwks(&[
            (Algorithm::RS256, RSA1_KEY, "r1"),
            (Algorithm::ES256, EC1_KEY, "e1"),
        ]),
    )
    .unwrap();
    let cfg = AuthConfig {
        jwks_file: Some(path.clone()),
        jwks_refresh_min: Duration::from_millis(200),
        ..asym_cfg(&["RS256", "ES256"])
    };
    let a = auth(&cfg);
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("a", "t")),
    )
    .await;
    ok(
        &a,
        &sign(Algorithm::ES256, EC1_KEY, Some("e1"), &claims("a", "t")),
    )
    .await;
    // kid that names a key of the other type
    let t = sign(Algorithm::ES256, EC1_KEY, Some("r1"), &claims("a", "t"));
    assert_invalid_token(
        &fail(&a, &t).await,
        "key does not match the token algorithm",
    );
    // no kid: exactly one RSA key fits → used
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, None, &claims("b", "t")),
    )
    .await;

    // Rotation: r2 appears in the file; the unknown kid triggers a re-read.
    std::fs::write(
        &path,
        jwks(&[
            (Algorithm::RS256, RSA2_KEY, "r2"),
            (Algorithm::ES256, EC1_KEY, "e1"),
        ]),
    )
    .unwrap();
    ok(
        &a,
        &sign(Algorithm::RS256, RSA2_KEY, Some("r2"), &claims("a", "t")),
    )
    .await;
    // r1 is gone now (a fresh token, not in the verified cache)
    let t = sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("c", "t"));
    assert_invalid_token(&fail(&a, &t).await, "unknown signing key");

    // Another rotation right away is rate limited...
    std::fs::write(&path, jwks(&[(Algorithm::ES256, EC2_KEY, "e2")])).unwrap();
    let t = sign(Algorithm::ES256, EC2_KEY, Some("e2"), &claims("a", "t"));
    assert_invalid_token(&fail(&a, &t).await, "unknown signing key");
    // ...and picked up once the interval has passed.
    tokio::time::sleep(Duration::from_millis(250)).await;
    ok(&a, &t).await;
}

#[tokio::test]
async fn jwks_without_kid_ambiguous() {
    let (_dir_path, path) = temp_path("jwks.json");
    std::fs::write(
        &path,
        jwks(&[
            (Algorithm::RS256, RSA1_KEY, "r1"),
            (Algorithm::RS256, RSA2_KEY, "r2"),
        ]),
    )
    .unwrap();
    let a = auth(&AuthConfig {
        jwks_file: Some(path),
        ..asym_cfg(&["RS256"])
    });
    let t = sign(Algorithm::RS256, RSA1_KEY, None, &claims("a", "t"));
    assert_invalid_token(
        &fail(&a, &t).await,
        "token has no kid and several keys match",
    );
    ok(
        &a,
        &sign(Algorithm::RS256, RSA2_KEY, Some("r2"), &claims("a", "t")),
    )
    .await;
}

#[test]
fn jwks_parsing_skips_unusable_keys() {
    let mut doc: Value =
        serde_json::from_str(&jwks(&[(Algorithm::RS256, RSA1_KEY, "r1")])).unwrap();
    let keys = doc["keys"].as_array_mut().unwrap();
    keys.push(json!({"kty": "oct", "k": "AAAA", "kid": "h"}));
    keys.push(json!({"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA", "kid": "p384"}));
    keys.push(json!({"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB", "kid": "enc"}));
    keys.push(json!({"kty": "RSA", "kid": "broken"}));
    keys.push(json!({"kty": "RSA", "alg": "ES256", "n": "AQAB", "e": "AQAB"}));
    let set = jwks::parse_jwks(doc.to_string().as_bytes()).unwrap();
    assert_eq!(set.len(), 1);
    assert!(jwks::parse_jwks(b"not json").is_err());
    assert!(jwks::parse_jwks(b"{}").is_err());
}

// ---------------------------------------------------------------- JWKS URL

struct JwksServer {
    url: String,
    body: Arc<Mutex<String>>,
    hits: Arc<AtomicUsize>,
}

async fn jwks_server(initial: String) -> JwksServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Arc::new(Mutex::new(initial));
    let hits = Arc::new(AtomicUsize::new(0));
    let (b, h) = (body.clone(), hits.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (b, h) = (b.clone(), h.clone());
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (b, h) = (b.clone(), h.clone());
                        async move {
                            assert_eq!(req.uri().path(), "/jwks");
                            h.fetch_add(1, Ordering::SeqCst);
                            let text = b.lock().clone();
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(text)))
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    JwksServer {
        url: format!("http://{addr}/jwks"),
        body,
        hits,
    }
}

#[tokio::test]
async fn jwks_url_cached_refetched_and_rate_limited() {
    let srv = jwks_server(jwks(&[(Algorithm::RS256, RSA1_KEY, "r1")])).await;
    let cfg = AuthConfig {
        jwks_url: Some(srv.url.clone()),
        jwks_refresh_min: Duration::from_millis(300),
        jwks_cache: Duration::from_millis(60_000),
        ..asym_cfg(&["RS256", "ES256"])
    };
    let a = Arc::new(auth(&cfg));
    assert_eq!(srv.hits.load(Ordering::SeqCst), 0, "no fetch before use");
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("a", "t")),
    )
    .await;
    assert_eq!(srv.hits.load(Ordering::SeqCst), 1);
    // Different tokens (so the verified-token cache does not help): JWKS cached.
    for i in 0..5 {
        ok(
            &a,
            &sign(
                Algorithm::RS256,
                RSA1_KEY,
                Some("r1"),
                &claims(&format!("u{i}"), "t"),
            ),
        )
        .await;
    }
    assert_eq!(srv.hits.load(Ordering::SeqCst), 1);
    assert_eq!(a.verifier.as_ref().unwrap().jwks_key_count(), 1);

    // The IdP adds e1. Right after the last fetch, the refetch is rate limited.
    *srv.body.lock() = jwks(&[
        (Algorithm::RS256, RSA1_KEY, "r1"),
        (Algorithm::ES256, EC1_KEY, "e1"),
    ]);
    let t_e1 = sign(Algorithm::ES256, EC1_KEY, Some("e1"), &claims("a", "t"));
    assert_invalid_token(&fail(&a, &t_e1).await, "unknown signing key");
    assert_eq!(srv.hits.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(350)).await;
    ok(&a, &t_e1).await;
    assert_eq!(srv.hits.load(Ordering::SeqCst), 2);

    // A flood of random kids: at most one refetch per interval, single-flight.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let mut tasks = Vec::new();
    for i in 0..50 {
        let a = a.clone();
        let t = sign(
            Algorithm::RS256,
            RSA1_KEY,
            Some(&format!("rnd{i}")),
            &claims("x", "t"),
        );
        tasks.push(tokio::spawn(async move {
            a.authenticate(&bearer(&t), None).await
        }));
    }
    for t in tasks {
        let f = t.await.unwrap().unwrap_err();
        assert_eq!(f.description, "unknown signing key");
    }
    assert_eq!(srv.hits.load(Ordering::SeqCst), 3);
    // Known keys keep working during the flood.
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("z", "t")),
    )
    .await;
    assert_eq!(srv.hits.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn jwks_url_cache_expiry_refetches() {
    let srv = jwks_server(jwks(&[(Algorithm::ES256, EC1_KEY, "e1")])).await;
    let cfg = AuthConfig {
        jwks_url: Some(srv.url.clone()),
        jwks_refresh_min: Duration::from_millis(0),
        jwks_cache: Duration::from_millis(200),
        ..asym_cfg(&["ES256"])
    };
    let a = auth(&cfg);
    a.prefetch_keys().await;
    assert_eq!(srv.hits.load(Ordering::SeqCst), 1);
    ok(
        &a,
        &sign(Algorithm::ES256, EC1_KEY, Some("e1"), &claims("a", "t")),
    )
    .await;
    assert_eq!(srv.hits.load(Ordering::SeqCst), 1);
    // The IdP drops e1; after the cache period the set is refetched and e1 is refused.
    *srv.body.lock() = jwks(&[(Algorithm::ES256, EC2_KEY, "e2")]);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let t = sign(Algorithm::ES256, EC1_KEY, Some("e1"), &claims("b", "t"));
    assert_invalid_token(&fail(&a, &t).await, "unknown signing key");
    assert!(srv.hits.load(Ordering::SeqCst) >= 2);
    ok(
        &a,
        &sign(Algorithm::ES256, EC2_KEY, Some("e2"), &claims("a", "t")),
    )
    .await;
}

#[tokio::test]
async fn jwks_url_down_fails_closed() {
    // A port that nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = AuthConfig {
        jwks_url: Some(format!("http://127.0.0.1:{port}/jwks")),
        jwks_refresh_min: Duration::from_millis(0),
        ..asym_cfg(&["RS256"])
    };
    let a = auth(&cfg);
    let t = sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("a", "t"));
    assert_invalid_token(&fail(&a, &t).await, "signing keys unavailable");
    let t = sign(Algorithm::RS256, RSA1_KEY, None, &claims("a", "t"));
    assert_invalid_token(&fail(&a, &t).await, "signing keys unavailable");
}

#[tokio::test]
async fn jwks_url_bad_document_keeps_previous_set() {
    let srv = jwks_server(jwks(&[(Algorithm::RS256, RSA1_KEY, "r1")])).await;
    let cfg = AuthConfig {
        jwks_url: Some(srv.url.clone()),
        jwks_refresh_min: Duration::from_millis(0),
        ..asym_cfg(&["RS256"])
    };
    let a = auth(&cfg);
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("a", "t")),
    )
    .await;
    *srv.body.lock() = "not json".into();
    let t = sign(Algorithm::RS256, RSA2_KEY, Some("r2"), &claims("a", "t"));
    assert_invalid_token(&fail(&a, &t).await, "unknown signing key");
    ok(
        &a,
        &sign(Algorithm::RS256, RSA1_KEY, Some("r1"), &claims("b", "t")),
    )
    .await;
}

// ---------------------------------------------------------------- metadata, none, mint

#[test]
fn resource_metadata_documents() {
    let a = auth(&AuthConfig {
        issuer: Some("https://idp.example".into()),
        required_scope: Some("tasks".into()),
        ..hs_cfg()
    });
    assert_eq!(
        a.resource_metadata(""),
        json!({
            "resource": "http://gw.example",
            "bearer_methods_supported": ["header"],
            "authorization_servers": ["https://idp.example"],
            "scopes_supported": ["tasks"],
        })
    );
    assert_eq!(
        a.resource_metadata("/mcp")["resource"],
        "http://gw.example/mcp"
    );

    let a = Authenticator::new(
        &AuthConfig {
            resource: Some("https://api.example/mcp".into()),
            ..hs_cfg()
        },
        "http://gw.example/",
    )
    .unwrap();
    let doc = a.resource_metadata("/mcp");
    assert_eq!(doc["resource"], "https://api.example/mcp");
    assert!(doc.get("authorization_servers").is_none());
    assert!(doc.get("scopes_supported").is_none());
}

/// Behind a TLS-terminating edge the listener is plain HTTP; the challenge must still
/// send clients to the https:// metadata `auth.resource` names.
#[tokio::test]
async fn the_challenge_follows_auth_resource() {
    let a = Authenticator::new(
        &AuthConfig {
            resource: Some("https://api.example:8443/mcp".into()),
            ..hs_cfg()
        },
        "http://10.0.0.7:8080",
    )
    .unwrap();
    let f = a.authenticate(&HeaderMap::new(), None).await.unwrap_err();
    assert_eq!(
        f.www_authenticate,
        "Bearer resource_metadata=\"https://api.example:8443/.well-known/oauth-protected-resource\""
    );
}

#[tokio::test]
async fn mode_none_is_anonymous() {
    let a = auth(&AuthConfig {
        mode: AuthMode::None,
        ..AuthConfig::default()
    });
    assert!(!a.is_enabled());
    let p = a
        .authenticate(&HeaderMap::new(), Some("access_token=x"))
        .await
        .unwrap();
    assert_eq!(p, Principal::anonymous());
    assert_eq!(p.tenant, "default");
    assert_eq!(p.subject, "anonymous");
    let p = a.authenticate(&bearer("garbage"), None).await.unwrap();
    assert_eq!(p, Principal::anonymous());
}

#[tokio::test]
async fn mint_round_trips() {
    let cfg = AuthConfig {
        issuer: Some("https://idp.example".into()),
        audience: Some("taskgate".into()),
        required_scope: Some("tasks".into()),
        ..hs_cfg()
    };
    let a = auth(&cfg);
    let t = mint_token(
        &cfg,
        "alice",
        "acme",
        &["tasks".into(), "read".into()],
        Duration::from_secs(3600),
    )
    .unwrap();
    assert_eq!(
        ok(&a, &t).await,
        Principal {
            tenant: "acme".into(),
            subject: "alice".into()
        }
    );
    let t = mint_token(&cfg, "alice", "acme", &[], Duration::from_secs(60)).unwrap();
    assert_eq!(fail(&a, &t).await.status, StatusCode::FORBIDDEN);

    assert!(matches!(
        mint_token(
            &asym_cfg(&["RS256"]),
            "a",
            "b",
            &[],
            Duration::from_secs(60)
        ),
        Err(MintError::Hs256Disabled)
    ));
    assert!(matches!(
        mint_token(&hs_cfg(), "", "b", &[], Duration::from_secs(60)),
        Err(MintError::Invalid(_))
    ));
}

#[test]
fn ttl_parsing() {
    assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_ttl("30m"), Ok(Duration::from_secs(1800)));
    assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_ttl("2d"), Ok(Duration::from_secs(172_800)));
    assert_eq!(parse_ttl("120"), Ok(Duration::from_secs(120)));
    for bad in [
        "",
        "h",
        "0s",
        "1w",
        "-1h",
        "1.5h",
        "99999999999999999999d",
        "18446744073709551615d",
    ] {
        assert!(parse_ttl(bad).is_err(), "{bad}");
    }
}

#[test]
fn authenticator_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Authenticator>();
    check::<AuthFailure>();
}
