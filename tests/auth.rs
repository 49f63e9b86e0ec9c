//! Bearer JWT authentication through the real binary (docs/design.md §13 "Auth"): every
//! refusal is 401 (or 403 for scope) with an RFC 6750 challenge pointing at the RFC
//! 9728 metadata; HS256 and RS256 (JWKS file with rotation, JWKS URL over HTTP and
//! HTTPS with a private CA); the `token` CLI.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use common::*;
use http_body_util::Full;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const RSA1_KEY: &str = include_str!("../src/auth/testdata/rsa1.key.pem");
const RSA2_KEY: &str = include_str!("../src/auth/testdata/rsa2.key.pem");

const ISS: &str = ISSUER.issuer;
const AUD: &str = ISSUER.audience;

fn claims(sub: &str) -> Value {
    ISSUER.claims(sub, "acme", 600)
}

fn rs256(key_pem: &str, kid: &str, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some(kid.to_string());
    jsonwebtoken::encode(
        &h,
        claims,
        &EncodingKey::from_rsa_pem(key_pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn jwks(keys: &[(&str, &str)]) -> String {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(pem, kid)| {
            let k = EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap();
            let mut v = serde_json::to_value(Jwk::from_encoding_key(&k, Algorithm::RS256).unwrap())
                .unwrap();
            v["kid"] = json!(kid);
            v
        })
        .collect();
    json!({ "keys": keys }).to_string()
}

/// A gateway with `auth` in front of a demo HTTP upstream (auth does not depend on
/// the upstream transport; HTTP needs no stdio pool).
async fn start(auth: &str) -> (Gateway, DemoHttp) {
    let demo = DemoHttp::start().await;
    let gw = Gateway::start(&format!("{auth}{}", demo_http_upstream(demo.port, ""))).await;
    gw.wait_ready().await;
    (gw, demo)
}

async fn discover_with(gw: &Gateway, token: Option<&str>) -> Resp {
    Client2026::new(gw, "/mcp", token.map(str::to_string))
        .request("server/discover", json!({}))
        .await
}

fn prm_url(gw: &Gateway) -> String {
    format!("http://{}/.well-known/oauth-protected-resource", gw.addr)
}

#[track_caller]
fn assert_accepted(r: &Resp, what: &str) {
    assert_eq!(
        r.status,
        200,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["result"]["resultType"], "complete", "{what}");
}

#[track_caller]
fn assert_invalid_token(gw: &Gateway, r: &Resp, what: &str) {
    assert_eq!(
        r.status,
        401,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let www = r
        .header("www-authenticate")
        .unwrap_or_else(|| panic!("{what}: no challenge"));
    assert!(www.starts_with("Bearer "), "{what}: {www}");
    assert!(www.contains("error=\"invalid_token\""), "{what}: {www}");
    assert!(
        www.contains(&format!("resource_metadata=\"{}\"", prm_url(gw))),
        "{what}: {www}"
    );
    assert_eq!(r.json()["error"], "invalid_token", "{what}");
    // A refusal never reveals the upstream's answer.
    assert!(r.json().get("result").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_token_is_401_with_resource_metadata() {
    let (gw, _d) = start(&jwt_auth()).await;
    let r = discover_with(&gw, None).await;
    assert_eq!(r.status, 401, "{}", String::from_utf8_lossy(&r.body));
    let www = r.header("www-authenticate").expect("WWW-Authenticate");
    // RFC 6750 §3.1: no error code when no credentials were sent.
    assert_eq!(
        www,
        format!("Bearer resource_metadata=\"{}\"", prm_url(&gw))
    );
    // Sanity: the same request with a valid token is served.
    assert_accepted(
        &discover_with(&gw, Some(&token("alice", "acme"))).await,
        "valid",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hs256_tokens_are_401() {
    let (gw, _d) = start(&jwt_auth()).await;
    let now = now_s();
    let with = |patch: Value| {
        let mut c = claims("alice");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let alg_none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims("alice").to_string())
    );
    // A valid HS256 token with its signature stripped and the header switched to none.
    let good = token_with(claims("alice"));
    let mut parts = good.split('.');
    let _ = parts.next();
    let stripped = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
        parts.next().unwrap()
    );
    let cases: Vec<(&str, String)> = vec![
        ("garbage", "garbage".into()),
        ("three garbage parts", "a.b.c".into()),
        (
            "expired",
            token_with(with(json!({"exp": now - 3600, "iat": now - 7200}))),
        ),
        (
            "nbf far in the future",
            token_with(with(json!({"nbf": now + 86_400}))),
        ),
        ("no exp", token_with(with(json!({"exp": null})))),
        (
            "wrong issuer",
            token_with(with(json!({"iss": "https://evil.test"}))),
        ),
        ("no issuer", token_with(with(json!({"iss": null})))),
        (
            "wrong audience",
            token_with(with(json!({"aud": "someone-else"}))),
        ),
        ("alg none", alg_none),
        ("alg none, real claims", stripped),
        (
            "wrong HS secret",
            fixtures::hs256_token(
                "another-secret-0123456789abcdef0123456789",
                &claims("alice"),
            ),
        ),
        (
            "RS256 when only HS256 is allowed",
            rs256(RSA1_KEY, "r1", &claims("alice")),
        ),
        ("missing tenant", token_with(with(json!({"tenant": null})))),
        ("empty tenant", token_with(with(json!({"tenant": ""})))),
        ("missing sub", token_with(with(json!({"sub": null})))),
        ("tampered payload", {
            let mut p: Vec<String> = good.split('.').map(str::to_string).collect();
            p[1] = URL_SAFE_NO_PAD.encode(with(json!({"tenant": "other"})).to_string());
            p.join(".")
        }),
    ];
    for (what, tok) in &cases {
        let r = discover_with(&gw, Some(tok)).await;
        assert_invalid_token(&gw, &r, what);
    }
    // Leeway: expired 10 s ago is still inside the 30 s leeway.
    let r = discover_with(&gw, Some(&token_with(with(json!({"exp": now - 10}))))).await;
    assert_accepted(&r, "expired within leeway");
    assert_accepted(&discover_with(&gw, Some(&good)).await, "valid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_in_query_string_refused() {
    let (gw, _d) = start(&jwt_auth()).await;
    let tok = token("alice", "acme");
    let c = Client2026::new(&gw, "/mcp", Some(tok.clone()));
    let params = json!({});
    let body = c.body(json!(1), "server/discover", &params);
    for url in [
        gw.url(&format!("/mcp?access_token={tok}")),
        gw.url(&format!("/mcp?x=1&access%5Ftoken={tok}")),
    ] {
        // Also with a valid Authorization header: a query token is always refused.
        let r = raw(
            &url,
            "POST",
            &c.headers("server/discover", &params),
            Bytes::from(body.to_string()),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 401, "{url}: {}", String::from_utf8_lossy(&r.body));
        assert!(
            r.header("www-authenticate")
                .is_some_and(|w| w.contains("resource_metadata="))
        );
        assert!(r.json().get("result").is_none());
    }
    assert_accepted(&c.request("server/discover", params).await, "header only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_scope_missing_is_403() {
    let (gw, _d) = start(&format!("{}required_scope = \"mcp:call\"\n", jwt_auth())).await;
    let mut no_scope = claims("alice");
    no_scope["scope"] = json!("read write");
    for (what, c) in [
        ("no scope claim", claims("alice")),
        ("other scopes", no_scope),
    ] {
        let r = discover_with(&gw, Some(&token_with(c))).await;
        assert_eq!(
            r.status,
            403,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let www = r.header("www-authenticate").expect("challenge");
        assert!(www.contains("error=\"insufficient_scope\""), "{www}");
        assert!(www.contains("scope=\"mcp:call\""), "{www}");
        assert!(www.contains("resource_metadata="), "{www}");
        assert_eq!(r.json()["error"], "insufficient_scope");
    }
    let mut ok = claims("alice");
    ok["scope"] = json!("read mcp:call");
    assert_accepted(
        &discover_with(&gw, Some(&token_with(ok))).await,
        "scope string",
    );
    let mut ok = claims("bob");
    ok["scp"] = json!(["mcp:call"]);
    assert_accepted(
        &discover_with(&gw, Some(&token_with(ok))).await,
        "scp array",
    );
    // An invalid token is still 401, not 403.
    let mut bad = claims("carol");
    bad["scope"] = json!("mcp:call");
    bad["aud"] = json!("nope");
    assert_invalid_token(
        &gw,
        &discover_with(&gw, Some(&token_with(bad))).await,
        "bad aud",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_resource_metadata_needs_no_token() {
    let (gw, _d) = start(&jwt_auth()).await;
    let base = format!("http://{}", gw.addr);
    for (path, resource) in [
        ("/.well-known/oauth-protected-resource", base.clone()),
        (
            "/.well-known/oauth-protected-resource/mcp",
            format!("{base}/mcp"),
        ),
    ] {
        let r = raw(&gw.url(path), "GET", &[], Bytes::new()).await.unwrap();
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            r.header("content-type")
                .is_some_and(|c| c.starts_with("application/json"))
        );
        let v = r.json();
        assert_eq!(v["resource"], resource.as_str(), "{path}: {v}");
        assert_eq!(v["authorization_servers"], json!([ISS]), "{path}: {v}");
        assert_eq!(
            v["bearer_methods_supported"],
            json!(["header"]),
            "{path}: {v}"
        );
    }
    // Unknown upstream path → 404; healthz/readyz need no token either.
    let r = raw(
        &gw.url("/.well-known/oauth-protected-resource/nope"),
        "GET",
        &[],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    for p in ["/healthz", "/readyz"] {
        let r = raw(&gw.url(p), "GET", &[], Bytes::new()).await.unwrap();
        assert_eq!(r.status, 200, "{p}");
    }
}

fn rs_auth(key_source: &str) -> String {
    format!(
        "[auth]\nmode = \"jwt\"\nalgorithms = [\"RS256\"]\n{key_source}\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\njwks_refresh_min_ms = 100\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_jwks_file_rotation() {
    let keys_dir = tempfile::tempdir().unwrap();
    let path = keys_dir.path().join("jwks.json");
    std::fs::write(&path, jwks(&[(RSA1_KEY, "r1")])).unwrap();
    let (gw, _d) = start(&rs_auth(&format!("jwks_file = \"{}\"", path.display()))).await;

    assert_accepted(
        &discover_with(&gw, Some(&rs256(RSA1_KEY, "r1", &claims("a1")))).await,
        "r1",
    );
    // Not in the set yet.
    let r2_token = rs256(RSA2_KEY, "r2", &claims("a2"));
    assert_invalid_token(
        &gw,
        &discover_with(&gw, Some(&r2_token)).await,
        "r2 before rotation",
    );
    // HS256 is not configured → refused even with the right shape.
    assert_invalid_token(
        &gw,
        &discover_with(&gw, Some(&token("x", "acme"))).await,
        "HS256",
    );
    // A token for r1's kid signed with r2's key is refused.
    assert_invalid_token(
        &gw,
        &discover_with(&gw, Some(&rs256(RSA2_KEY, "r1", &claims("a3")))).await,
        "kid r1 signed by r2",
    );

    // Rotation: replace the file (atomically) with a set holding only r2.
    let tmp = keys_dir.path().join("jwks.json.new");
    std::fs::write(&tmp, jwks(&[(RSA2_KEY, "r2")])).unwrap();
    std::fs::rename(&tmp, &path).unwrap();

    let mut last = None;
    let accepted = {
        let start = std::time::Instant::now();
        let mut ok = false;
        while start.elapsed() < Duration::from_secs(15) {
            let r = discover_with(&gw, Some(&r2_token)).await;
            if r.status == 200 {
                ok = true;
                break;
            }
            last = Some(r);
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        ok
    };
    assert!(accepted, "r2 never accepted after rotation: {last:?}");
    // r1 is gone: a fresh r1 token (not in the verified-token cache) is refused.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_invalid_token(
        &gw,
        &discover_with(&gw, Some(&rs256(RSA1_KEY, "r1", &claims("fresh")))).await,
        "r1 after rotation",
    );
}

struct JwksServer {
    url: String,
    body: Arc<Mutex<String>>,
    hits: Arc<AtomicUsize>,
}

async fn jwks_server(initial: String) -> JwksServer {
    jwks_server_with(initial, None).await
}

/// A JWKS endpoint serving `body` over HTTP/1.1, or over HTTPS with `tls`.
async fn jwks_server_with(initial: String, tls: Option<Arc<rustls::ServerConfig>>) -> JwksServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let body = Arc::new(Mutex::new(initial));
    let hits = Arc::new(AtomicUsize::new(0));
    let (b, h) = (body.clone(), hits.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (b, h) = (b.clone(), h.clone());
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (b, h) = (b.clone(), h.clone());
                        async move {
                            let resp = if req.uri().path() == "/jwks.json" {
                                h.fetch_add(1, Ordering::SeqCst);
                                let text = b.lock().unwrap().clone();
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(text)))
                                    .unwrap()
                            } else {
                                http::Response::builder()
                                    .status(404)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap()
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                let http = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    None => {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    }
                    // A refused handshake (the gateway distrusts us) just ends here.
                    Some(a) => {
                        if let Ok(tls) = a.accept(stream).await {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                                .await;
                        }
                    }
                }
            });
        }
    });
    JwksServer {
        url: format!("{scheme}://localhost:{}/jwks.json", addr.port()),
        body,
        hits,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_jwks_url_and_rotation() {
    let srv = jwks_server(jwks(&[(RSA1_KEY, "r1")])).await;
    let (gw, _d) = start(&rs_auth(&format!("jwks_url = \"{}\"", srv.url))).await;
    assert_accepted(
        &discover_with(&gw, Some(&rs256(RSA1_KEY, "r1", &claims("u1")))).await,
        "r1 via URL",
    );
    assert!(srv.hits.load(Ordering::SeqCst) >= 1);

    *srv.body.lock().unwrap() = jwks(&[(RSA1_KEY, "r1"), (RSA2_KEY, "r2")]);
    let r2 = rs256(RSA2_KEY, "r2", &claims("u2"));
    let start = std::time::Instant::now();
    let mut last = None;
    while start.elapsed() < Duration::from_secs(15) {
        let r = discover_with(&gw, Some(&r2)).await;
        if r.status == 200 {
            last = None;
            break;
        }
        last = Some(r);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(last.is_none(), "r2 never accepted via jwks_url: {last:?}");
    // r1 still in the set.
    assert_accepted(
        &discover_with(&gw, Some(&rs256(RSA1_KEY, "r1", &claims("u3")))).await,
        "r1 still valid",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_token_is_accepted_by_the_same_gateway() {
    let (gw, _d) = start(&jwt_auth()).await;
    let mint = |extra: &[&str]| {
        let out = std::process::Command::new(bin())
            .args(["token", "--sub", "alice", "--tenant", "acme", "--config"])
            .arg(&gw.config_path)
            .args(extra)
            .env_remove("TASKGATE_HS256_SECRET")
            .output()
            .expect("run taskgate token");
        assert!(
            out.status.success(),
            "taskgate token failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        // Only the token on stdout.
        assert_eq!(stdout.trim().lines().count(), 1, "{stdout:?}");
        assert_eq!(stdout.trim().split('.').count(), 3, "{stdout:?}");
        stdout.trim().to_string()
    };
    let tok = mint(&[]);
    assert_accepted(&discover_with(&gw, Some(&tok)).await, "minted token");
    let tok = mint(&["--ttl", "5m", "--scope", "mcp:call"]);
    assert_accepted(
        &discover_with(&gw, Some(&tok)).await,
        "minted token with ttl/scope",
    );
    // Tampering with the minted token breaks it.
    let mut bad = tok.clone();
    bad.push('x');
    assert_invalid_token(
        &gw,
        &discover_with(&gw, Some(&bad)).await,
        "tampered minted",
    );
}

/// An HTTP/1.1-only server configuration for the JWKS endpoint (the gateway offers h2).
fn jwks_tls(files: &common::tls::CertFiles) -> Arc<rustls::ServerConfig> {
    let mut config = (*common::tls::server_config(files, None)).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_jwks_over_https_with_a_private_ca_and_rotation() {
    use common::tls::TestCa;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "idp");
    let srv = jwks_server_with(jwks(&[(RSA1_KEY, "r1")]), Some(jwks_tls(&ca.server("idp")))).await;
    let ca_key = format!(
        "jwks_url = \"{}\"\njwks_ca_file = {}",
        srv.url,
        toml_string(&ca.ca_file.display().to_string())
    );
    let (gw, _d) = start(&rs_auth(&ca_key)).await;
    assert_accepted(
        &discover_with(&gw, Some(&rs256(RSA1_KEY, "r1", &claims("u1")))).await,
        "r1 over https",
    );
    // An unknown kid refreshes the set over the same verified connection settings.
    *srv.body.lock().unwrap() = jwks(&[(RSA1_KEY, "r1"), (RSA2_KEY, "r2")]);
    let r2 = rs256(RSA2_KEY, "r2", &claims("u2"));
    let accepted = eventually_async(Duration::from_secs(15), || async {
        discover_with(&gw, Some(&r2)).await.status == 200
    })
    .await;
    assert!(
        accepted,
        "r2 never accepted over https: {}",
        gw.proc.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_server_with_a_wrong_ca_or_an_expired_certificate_is_refused() {
    use common::tls::{TestCa, Usage};
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "idp");
    let other = TestCa::new(dir.path(), "other");
    let expired = ca.issue("old", &["localhost"], Usage::Server, true);
    for (name, served, trusted, logged, reason) in [
        (
            "wrong CA",
            ca.server("idp"),
            &other.ca_file,
            "UnknownIssuer",
            "unknown_issuer",
        ),
        (
            "expired",
            expired.clone(),
            &ca.ca_file,
            "certificate expired",
            "expired",
        ),
    ] {
        let srv = jwks_server_with(jwks(&[(RSA1_KEY, "r1")]), Some(jwks_tls(&served))).await;
        let keys = format!(
            "jwks_url = \"{}\"\njwks_ca_file = {}",
            srv.url,
            toml_string(&trusted.display().to_string())
        );
        let (gw, _d) = start(&rs_auth(&keys)).await;
        let r = discover_with(&gw, Some(&rs256(RSA1_KEY, "r1", &claims("u1")))).await;
        assert_eq!(r.status, 401, "{name}: {r:?}");
        assert_eq!(
            srv.hits.load(Ordering::SeqCst),
            0,
            "{name}: the JWKS was served"
        );
        let said = eventually(Duration::from_secs(15), || {
            gw.proc.log_text().contains(logged)
        })
        .await;
        assert!(said, "{name}: {}", gw.proc.log_text());
        let m = raw(&gw.url("/metrics"), "GET", &[], Bytes::new())
            .await
            .unwrap();
        let m = String::from_utf8_lossy(&m.body).into_owned();
        let key = format!(
            "taskgate_tls_handshake_failures_total{{side=\"outbound\",peer=\"jwks\",reason=\"{reason}\"}}"
        );
        assert!(m.lines().any(|l| l.starts_with(&key)), "{name}: {key}\n{m}");
    }
}
