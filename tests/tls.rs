//! TLS with real handshakes (README "TLS"): a throwaway CA minted per test
//! (tests/common/tls.rs), the gateway terminating TLS on its listeners, and the
//! gateway speaking TLS to HTTPS legacy upstreams — the bundled demo server and a real
//! third-party one (FastMCP under uvicorn) — with and without client certificates.

mod common;
mod tasks_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use common::tls::{CertFiles, TestCa, Usage};
use common::*;
use tasks_support::*;

fn tls_server_keys(files: &CertFiles) -> String {
    format!(
        "tls_cert = {}\ntls_key = {}\n",
        toml_string(&files.cert.display().to_string()),
        toml_string(&files.key.display().to_string())
    )
}

fn https(gw: &Gateway, path: &str) -> String {
    format!("https://localhost:{}{path}", gw.addr.port())
}

/// A tasks client for `/mcp` over `https://`.
fn tls_client(gw: &Gateway, sub: &str, tenant: &str) -> Client2026 {
    Client2026 {
        url: https(gw, "/mcp"),
        ..tasks_client(gw, sub, tenant)
    }
}

/// Trust only `ca` (plus `identity`) for `https://` requests of this test.
fn trust(ca: &Path, identity: Option<&CertFiles>) {
    common::tls::trust(common::tls::client_config(ca, identity, &[]));
}

/// `GET path` trusting only `ca`, offering `alpn`; the error chain on failure.
async fn get(
    ca: &Path,
    identity: Option<&CertFiles>,
    alpn: &[&[u8]],
    url: &str,
) -> Result<(Resp, http::Version), String> {
    let config = common::tls::client_config(ca, identity, alpn);
    common::tls::request(config, url, "GET", &[], Bytes::new()).await
}

/// The value of one sample in the Prometheus text (0 when absent).
fn sample(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metrics_text(url: &str) -> String {
    let r = raw(url, "GET", &[], Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200);
    String::from_utf8_lossy(&r.body).into_owned()
}

// ---------------------------------------------------------------------------------
// Inbound: the listener

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_serves_h2_and_http1_over_tls() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "front");
    let cert = ca.server("gw");
    let gw = Gateway::start_with_server(
        &tls_server_keys(&cert),
        &format!("{}{}", jwt_auth(), demo_stdio_upstream("")),
    )
    .await;
    assert!(
        gw.proc
            .log_text()
            .contains("taskgate listening on https://"),
        "{}",
        gw.proc.log_text()
    );
    gw.wait_ready_at(&https(&gw, "/readyz"), &ca.ca_file, None)
        .await;
    trust(&ca.ca_file, None);
    let c = tls_client(&gw, "alice", "acme");
    let r = c.call_tool("echo", json!({"text": "over tls"})).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(first_text(&r.json()["result"]), "over tls");

    // ALPN picks the protocol: h2 when offered, HTTP/1.1 otherwise.
    let healthz = https(&gw, "/healthz");
    let (r, v) = get(&ca.ca_file, None, &[b"h2", b"http/1.1"], &healthz)
        .await
        .unwrap();
    assert_eq!((r.status, v), (200, http::Version::HTTP_2));
    let (r, v) = get(&ca.ca_file, None, &[b"http/1.1"], &healthz)
        .await
        .unwrap();
    assert_eq!((r.status, v), (200, http::Version::HTTP_11));

    // curl, as an operator would check it.
    for (flag, want) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
            ])
            .arg("--cacert")
            .arg(&ca.ca_file)
            .arg(flag)
            .arg(&healthz)
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text, format!("200 {want}"), "curl {flag}: {out:?}");
    }

    // A client that does not trust the CA is refused; plain HTTP gets no answer.
    let other = TestCa::new(dir.path(), "other");
    let err = get(&other.ca_file, None, &[], &healthz).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(
        raw(
            &format!("http://{}/healthz", gw.addr),
            "GET",
            &[],
            Bytes::new()
        )
        .await
        .is_err()
    );
    // The refusals are counted on the gateway's side too, once its side of each
    // handshake has ended (which may be after the client gave up).
    let counted = "taskgate_tls_handshake_failures_total{side=\"inbound\",peer=\"listener\"";
    let mut m = String::new();
    for _ in 0..100 {
        m = metrics_text(&https(&gw, "/metrics")).await;
        if sample(&m, counted) >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sample(&m, counted) >= 2.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_required_and_never_replaces_the_token() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "front");
    let clients = TestCa::new(dir.path(), "clients");
    let server = ca.server("gw");
    let alice = clients.issue("alice", &["alice"], Usage::Client, false);
    let strangers = TestCa::new(dir.path(), "strangers");
    let mallory = strangers.issue("mallory", &["mallory"], Usage::Client, false);
    let server_keys = format!(
        "{}client_ca_file = {}\n",
        tls_server_keys(&server),
        toml_string(&clients.ca_file.display().to_string())
    );
    let gw = Gateway::start_with_server(
        &server_keys,
        &format!("{}{}", jwt_auth(), demo_stdio_upstream("")),
    )
    .await;
    let healthz = https(&gw, "/healthz");
    // Under TLS 1.3 the client's side of the handshake ends before the gateway
    // judges the certificate, so the client sees the refusal as an alert or as a
    // connection closed before its request went out, depending on timing. Either
    // way no request is served; the gateway's own count names the reason.
    for (who, id) in [("no certificate", None), ("another CA", Some(&mallory))] {
        let err = get(&ca.ca_file, id, &[], &healthz).await.unwrap_err();
        assert!(!err.is_empty(), "{who}");
    }
    let (r, _) = get(&ca.ca_file, Some(&alice), &[], &healthz).await.unwrap();
    assert_eq!(r.status, 200);
    let inbound = "taskgate_tls_handshake_failures_total{side=\"inbound\",peer=\"listener\"";
    for reason in ["bad_certificate", "unknown_issuer"] {
        let line = format!("{inbound},reason=\"{reason}\"}}");
        let mut m = String::new();
        for _ in 0..100 {
            let r = get(&ca.ca_file, Some(&alice), &[], &https(&gw, "/metrics"))
                .await
                .unwrap();
            m = String::from_utf8_lossy(&r.0.body).into_owned();
            if sample(&m, &line) >= 1.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(sample(&m, &line) >= 1.0, "{reason}: {m}");
    }
    // The stdio upstream starts in the background: a call before it is up is a 503.
    gw.wait_ready_at(&https(&gw, "/readyz"), &ca.ca_file, Some(&alice))
        .await;

    // With the certificate but without a token: still 401.
    trust(&ca.ca_file, Some(&alice));
    let anonymous = Client2026 {
        token: None,
        ..tls_client(&gw, "alice", "acme")
    };
    let r = anonymous.call_tool("echo", json!({"text": "x"})).await;
    assert_eq!(r.status, 401, "{r:?}");
    let r = tls_client(&gw, "alice", "acme")
        .call_tool("echo", json!({"text": "both"}))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
}

/// Replace `live` by `new` the way a deploy does: write beside it, then rename.
fn swap(new: &CertFiles, live: &CertFiles) {
    for (from, to) in [(&new.key, &live.key), (&new.cert, &live.cert)] {
        let tmp = to.with_extension("tmp");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, to).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_certificate_reaches_new_connections_and_open_streams_keep_flowing() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let old_ca = TestCa::new(dir.path(), "old");
    let new_ca = TestCa::new(dir.path(), "new");
    let live = CertFiles {
        cert: dir.path().join("live.pem"),
        key: dir.path().join("live-key.pem"),
    };
    swap(&old_ca.server("gw"), &live);
    let gw = Gateway::start_with_server(
        &format!("{}keepalive_ms = 200\n", tls_server_keys(&live)),
        &format!(
            "{}{}{}",
            jwt_auth(),
            tasks_section(""),
            demo_stdio_upstream("")
        ),
    )
    .await;
    gw.wait_ready_at(&https(&gw, "/readyz"), &old_ca.ca_file, None)
        .await;

    // An SSE stream open on the old certificate: a listen stream on a task that ends
    // after the swap.
    trust(&old_ca.ca_file, None);
    let c = tls_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&c, "sleep", json!({"ms": 4000})).await);
    let mut stream =
        SseStream::listen(&c, json!("listen-1"), json!({"taskIds": [id.clone()]})).await;
    assert_eq!(stream.status, 200);

    swap(&new_ca.server("gw"), &live);
    let healthz = https(&gw, "/healthz");
    let start = Instant::now();
    while get(&new_ca.ca_file, None, &[], &healthz).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the new certificate was never served:\n{}",
            gw.proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = get(&old_ca.ca_file, None, &[], &healthz).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // The stream opened before the swap still delivers, and new connections (new CA)
    // see the same task.
    trust(&new_ca.ca_file, None);
    assert_eq!(ok_result(&tasks_get(&c, &id).await)["status"], "working");
    let done = stream
        .task_reached(&id, "completed", Duration::from_secs(30))
        .await;
    assert!(
        done.is_some(),
        "the open stream stopped delivering:\n{}",
        gw.proc.log_text()
    );

    // A broken pair (garbage certificate) is refused; the new pair keeps serving.
    std::fs::write(&live.cert, "not a certificate").unwrap();
    let m_url = https(&gw, "/metrics");
    let start = Instant::now();
    loop {
        let m = metrics_text(&m_url).await;
        if sample(
            &m,
            "taskgate_tls_certificate_reloads_total{listener=\"listener\",outcome=\"refused\"}",
        ) >= 1.0
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (r, _) = get(&new_ca.ca_file, None, &[], &healthz).await.unwrap();
    assert_eq!(r.status, 200);
    // Counted first, then logged: the line follows.
    let logged = eventually(Duration::from_secs(10), || {
        gw.proc
            .log_text()
            .contains("new TLS certificate refused; the previous one keeps serving")
    })
    .await;
    assert!(logged, "{}", gw.proc.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listen_has_its_own_certificate() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let ops = TestCa::new(dir.path(), "ops");
    let cert = ops.server("ops");
    let port = free_port();
    let server = format!(
        "metrics_listen = \"127.0.0.1:{port}\"\nmetrics_tls_cert = {}\nmetrics_tls_key = {}\n",
        toml_string(&cert.cert.display().to_string()),
        toml_string(&cert.key.display().to_string())
    );
    let gw = Gateway::start_with_server(
        &server,
        &format!("{}{}", jwt_auth(), demo_stdio_upstream("")),
    )
    .await;
    // The client listener stays plain HTTP; the ops listener is TLS only.
    gw.wait_ready().await;
    let url = format!("https://localhost:{port}/metrics");
    let (r, _) = get(&ops.ca_file, None, &[], &url).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("taskgate_fail_closed_total"));
    assert!(
        raw(
            &format!("http://127.0.0.1:{port}/metrics"),
            "GET",
            &[],
            Bytes::new()
        )
        .await
        .is_err()
    );
}

/// `taskgate_tls_cert_expiry_seconds` (README "Operations"): the listener's chain and
/// the client CA file from start-up, the listener's again after a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_expiry_is_exported_and_follows_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "front");
    let clients = TestCa::new(dir.path(), "clients");
    let live = CertFiles {
        cert: dir.path().join("live.pem"),
        key: dir.path().join("live-key.pem"),
    };
    swap(&ca.server("gw"), &live);
    let port = free_port();
    let server = format!(
        "{}{}metrics_listen = \"127.0.0.1:{port}\"\n",
        tls_server_keys(&live),
        ca_key("client_ca_file", &clients.ca_file)
    );
    let gw = Gateway::start_with_server(
        &server,
        &format!("{}{}", jwt_auth(), demo_stdio_upstream("")),
    )
    .await;
    let url = format!("http://127.0.0.1:{port}/metrics");
    let listener = "taskgate_tls_cert_expiry_seconds{kind=\"listener\",name=\"listener\"}";
    let client_ca = format!(
        "taskgate_tls_cert_expiry_seconds{{kind=\"ca\",name=\"{}\"}}",
        clients.ca_file.display()
    );
    // TestCa's certificates end 2099-01-01 00:00:00 UTC; its expired ones 2021-01-01.
    const Y2099: f64 = 4_070_908_800.0;
    const Y2021: f64 = 1_609_459_200.0;
    let m = metrics_text(&url).await;
    assert_eq!(sample(&m, listener), Y2099, "{m}");
    assert_eq!(sample(&m, &client_ca), Y2099, "{m}");

    // A new pair (one that has already expired: served all the same, and now visible).
    swap(
        &ca.issue("old", &["localhost", "127.0.0.1"], Usage::Server, true),
        &live,
    );
    let start = Instant::now();
    loop {
        let m = metrics_text(&url).await;
        if sample(&m, listener) == Y2021 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the reloaded certificate's expiry never showed:\n{m}\n{}",
            gw.proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------
// Outbound: HTTPS legacy upstreams

/// The demo legacy server over HTTPS (`--tls-cert`), optionally requiring client
/// certificates signed by `client_ca`.
async fn demo_https(cert: &CertFiles, client_ca: Option<&Path>) -> (Proc, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut cmd = Command::new(bin());
        cmd.arg("demo-upstream")
            .arg("--http")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--tls-cert")
            .arg(&cert.cert)
            .arg("--tls-key")
            .arg(&cert.key);
        if let Some(ca) = client_ca {
            cmd.arg("--client-ca").arg(ca);
        }
        let p = Proc::spawn(cmd);
        if p.wait_log("listening on https://", Duration::from_secs(30))
            .await
            .is_some()
        {
            return (p, port);
        }
    }
    panic!("the HTTPS demo upstream did not start");
}

fn ca_key(key: &str, path: &Path) -> String {
    format!("{key} = {}\n", toml_string(&path.display().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_serves_inline_promoted_cancelled_and_input_calls_over_h2() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "up");
    let (demo, port) = demo_https(&ca.server("demo"), None).await;
    let gw = start_ready(&http_body(
        &format!("https://localhost:{port}/mcp"),
        "",
        &ca_key("ca_file", &ca.ca_file),
    ))
    .await;
    let c = tasks_client(&gw, "alice", "acme");

    let r = c.call_tool("echo", json!({"text": "through tls"})).await;
    assert_eq!(first_text(&r.json()["result"]), "through tls", "{r:?}");

    let id = task_id(&create_task(&c, "sleep", json!({"ms": 800})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");

    let id = task_id(&create_task(&c, "sleep", json!({"ms": 30000})).await);
    ok_result(&tasks_cancel(&c, &id).await);
    let cancelled = poll_terminal(&c, &id).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let stats = demo_stats(&c).await;
    assert!(
        eventually(Duration::from_secs(10), || {
            demo.log_text().contains("ALPN h2")
        })
        .await,
        "h2 was not negotiated:\n{}",
        demo.log_text()
    );
    assert!(stats["calls"].as_u64().unwrap_or(0) >= 3, "{stats}");

    let id = task_id(&create_task(&c, "elicit", json!({"message": "Colour?"})).await);
    let waiting = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
    })
    .await;
    let key = waiting["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .unwrap();
    ok_result(
        &tasks_update(
            &c,
            &id,
            json!({key: {"action": "accept", "content": {"answer": "teal"}}}),
        )
        .await,
    );
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(all_text(&done["result"]).contains("teal"), "{done}");
}

/// A server certificate nobody configured to trust, or one that expired: the call is
/// never sent (503 + Retry-After), and the reason is in the log and the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_or_expired_upstream_certificate_is_never_sent_to() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "up");
    let other = TestCa::new(dir.path(), "other");
    let expired = ca.issue("old", &["localhost"], Usage::Server, true);
    let (_good, good_port) = demo_https(&ca.server("demo"), None).await;
    let (_old, old_port) = demo_https(&expired, None).await;
    let body = format!(
        "{}{}{}{}",
        jwt_auth(),
        tasks_section(""),
        http_upstream(
            "wrongca",
            "/wrong",
            &format!("https://localhost:{good_port}/mcp"),
            &ca_key("ca_file", &other.ca_file),
        ),
        http_upstream(
            "expired",
            "/expired",
            &format!("https://localhost:{old_port}/mcp"),
            &ca_key("ca_file", &ca.ca_file),
        ),
    );
    let gw = Gateway::start(&body).await;
    for path in ["/wrong", "/expired"] {
        let c = Client2026::new(&gw, path, Some(token("alice", "acme")));
        let r = c.call_tool("echo", json!({"text": "x"})).await;
        assert_eq!(r.status, 503, "{path}: {r:?}");
        assert!(r.headers.contains_key("retry-after"), "{path}: {r:?}");
    }
    // The background initialize logs rustls's reason for each upstream.
    let logged = eventually(Duration::from_secs(20), || {
        let log = gw.proc.log_text();
        log.contains("invalid peer certificate: UnknownIssuer")
            && log.contains("invalid peer certificate: certificate expired")
    })
    .await;
    assert!(logged, "{}", gw.proc.log_text());
    // … and counts it under the upstream's name.
    let m = metrics_text(&gw.url("/metrics")).await;
    for (name, reason) in [("wrongca", "unknown_issuer"), ("expired", "expired")] {
        let key = format!(
            "taskgate_tls_handshake_failures_total{{side=\"outbound\",peer=\"{name}\",reason=\"{reason}\"}}"
        );
        assert!(sample(&m, &key) >= 1.0, "{key}:\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_an_upstream_that_requires_it() {
    let _trust = common::tls::exclusive_trust().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "up");
    let clients = TestCa::new(dir.path(), "gwclients");
    let gw_cert = clients.issue("gateway", &["taskgate"], Usage::Client, false);
    let (demo, port) = demo_https(&ca.server("demo"), Some(&clients.ca_file)).await;
    let with_cert = format!(
        "{}{}{}",
        ca_key("ca_file", &ca.ca_file),
        ca_key("client_cert", &gw_cert.cert),
        ca_key("client_key", &gw_cert.key)
    );
    let body = format!(
        "{}{}{}",
        jwt_auth(),
        http_upstream(
            "nocert",
            "/nocert",
            &format!("https://localhost:{port}/mcp"),
            &ca_key("ca_file", &ca.ca_file),
        ),
        http_upstream(
            "mtls",
            "/mtls",
            &format!("https://localhost:{port}/mcp"),
            &with_cert
        ),
    );
    let gw = Gateway::start(&body).await;
    let c = Client2026::new(&gw, "/mtls", Some(token("alice", "acme")));
    let start = Instant::now();
    let r = loop {
        let r = c.call_tool("echo", json!({"text": "mutual"})).await;
        if r.status == 200 || start.elapsed() > Duration::from_secs(20) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(first_text(&r.json()["result"]), "mutual", "{r:?}");
    let c = Client2026::new(&gw, "/nocert", Some(token("alice", "acme")));
    let r = c.call_tool("echo", json!({"text": "x"})).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        demo.log_text().contains("TLS handshake failed"),
        "{}",
        demo.log_text()
    );
}

/// A real third-party legacy server over HTTPS: the Python SDK's FastMCP under
/// uvicorn with `ssl_certfile`/`ssl_keyfile` (HTTP/1.1 only: uvicorn speaks no h2).
/// Its venv is one of the peers in `.peers/`: feature `external-tests` (Cargo.toml).
#[cfg(feature = "external-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_under_uvicorn_over_https() {
    let _trust = common::tls::exclusive_trust().await;
    let python = peers().join("venv-mcp130/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash scripts/install-peers.sh` first",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "py");
    let cert = ca.server("fastmcp");
    let port = free_port();
    let mut cmd = Command::new(&python);
    cmd.arg(repo_root().join("tests/fixtures/fastmcp_tls_server.py"))
        .arg(port.to_string())
        .arg(&cert.cert)
        .arg(&cert.key);
    let server = Proc::spawn(cmd);
    assert!(
        server
            .wait_log("Uvicorn running on https://", Duration::from_secs(60))
            .await
            .is_some(),
        "FastMCP did not start:\n{}",
        server.log_text()
    );
    let gw = start_ready(&http_body(
        &format!("https://localhost:{port}/mcp"),
        "",
        &format!(
            "{}[upstream.tools.slow]\npromote_after_ms = 100\n",
            ca_key("ca_file", &ca.ca_file)
        ),
    ))
    .await;
    let c = tasks_client(&gw, "alice", "acme");
    let r = c.call_tool("add", json!({"a": 2, "b": 40})).await;
    assert_eq!(all_text(&r.json()["result"]), "42", "{r:?}");
    let id = task_id(&create_task(&c, "slow", json!({"ms": 600})).await);
    let done = poll_terminal(&c, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(all_text(&done["result"]).contains("slept 600"), "{done}");
    let id = task_id(&create_task(&c, "slow", json!({"ms": 30000})).await);
    ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(poll_terminal(&c, &id).await["status"], "cancelled");
}

impl GatewayTlsExt for Gateway {
    async fn wait_ready_at(&self, url: &str, ca: &Path, identity: Option<&CertFiles>) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok((r, _)) = get(ca, identity, &[], url).await
                && r.status == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("gateway not ready:\n{}", self.proc.log_text());
    }
}

trait GatewayTlsExt {
    /// Poll `url` (a `/readyz`) over TLS trusting `ca`, presenting `identity` if given.
    async fn wait_ready_at(&self, url: &str, ca: &Path, identity: Option<&CertFiles>);
}
