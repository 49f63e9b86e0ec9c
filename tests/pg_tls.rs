//! The gateway's PostgreSQL connections over TLS (README "TLS", "PostgreSQL"), against
//! the TLS-only cluster `scripts/pg.sh` starts (`TASKGATE_TEST_PG_URL` says
//! `sslmode=verify-full` with its throwaway CA; these tests fail, never skip, without
//! it) and plaintext clusters of their own (tests/faults_support's `PgCluster`):
//! plaintext refused by the server, `prefer` falling back to plaintext (and warning
//! when the server is not on this machine), a CA that did not sign the server's
//! certificate refused under `verify-full` and `require` alike, the host name checked
//! by `verify-full` only, and SCRAM over TLS without channel binding.

mod common;
mod faults_support;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::tls::TestCa;
use common::*;
use faults_support::PgCluster;

const TLS_ON: &str = "PostgreSQL connection: TLS on";
const TLS_OFF: &str = "PostgreSQL connection: TLS off";
const PREFER_WARNING: &str = "sslmode=prefer (the default) neither guarantees encryption";
const FALLBACK_WARNING: &str = "fell back to plaintext";

/// A gateway config on PostgreSQL at `url`, in a fresh schema.
fn config(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("taskgate.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {}\nbackend = \"postgres\"\n\
         url = {}\nschema = \"{}\"\npool_size = 2\n{}{}",
        toml_string(&dir.join("data").display().to_string()),
        toml_string(url),
        unique_schema(),
        jwt_auth(),
        demo_stdio_upstream("")
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A gateway that must come up; its log when ready.
async fn start_ok(url: &str) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), url);
    let gw = Gateway::launch(dir, path).await;
    gw.wait_ready().await;
    gw
}

/// A gateway that must refuse to start: it exits non-zero (within a generous bound)
/// without ever listening; its stderr.
async fn start_refused(url: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), url);
    let mut cmd = Command::new(bin());
    cmd.arg("--config").arg(&path).current_dir(dir.path());
    cmd.env("TASKGATE_LOG", "info,taskgate=debug");
    let mut proc = Proc::spawn(cmd);
    let status = proc.wait_exit(Duration::from_secs(60)).await;
    // The stderr reader thread may still be draining the last lines.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = proc.log_text();
    assert!(!status.success(), "exit {status}:\n{log}");
    assert!(!log.contains("taskgate listening on"), "{log}");
    log
}

/// The test cluster's URL with its query string replaced by `query`.
fn with_query(query: &str) -> String {
    let url = pg_url();
    let base = url.split_once('?').map(|(b, _)| b).unwrap_or(&url);
    format!("{base}?{query}")
}

/// The test cluster's CA file (`sslrootcert` of its URL).
fn cluster_ca() -> String {
    let url = pg_url();
    url.split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("sslrootcert="))
        .unwrap_or_else(|| panic!("no sslrootcert in {url}: scripts/pg.sh mints a CA"))
        .to_string()
}

/// The test cluster's port.
fn cluster_port() -> u16 {
    faults_support::url_addr(&pg_url()).port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_the_suite_runs_over_verify_full() {
    // What every other PostgreSQL test of the suite connects with.
    let url = pg_url();
    assert!(url.contains("sslmode=verify-full"), "{url}");
    let gw = start_ok(&url).await;
    let line = gw
        .proc
        .wait_log(TLS_ON, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no TLS line:\n{}", gw.proc.log_text()));
    assert!(line.contains("(sslmode=verify-full)"), "{line}");
    let log = gw.proc.log_text();
    assert!(!log.contains(PREFER_WARNING), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_plaintext_is_refused_by_the_server() {
    let log = start_refused(&with_query("sslmode=disable")).await;
    assert!(
        log.contains("no pg_hba.conf entry") && log.contains("no encryption"),
        "{log}"
    );
    assert!(log.contains("opening the postgres task store"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_prefer_uses_tls_when_offered_and_plaintext_when_not() {
    // The TLS cluster offers it: prefer takes it (unverified: no sslrootcert).
    let gw = start_ok(&with_query("sslmode=prefer")).await;
    let line = gw.proc.wait_log(TLS_ON, Duration::from_secs(5)).await;
    assert!(
        line.is_some_and(|l| l.contains("(sslmode=prefer)")),
        "{}",
        gw.proc.log_text()
    );
    drop(gw);

    // A plaintext server on the loopback: prefer (the default) goes on without TLS,
    // and warns of nothing (no network on the path).
    let pg = tokio::task::spawn_blocking(PgCluster::start).await.unwrap();
    let gw = start_ok(&pg.url()).await;
    let line = gw.proc.wait_log(TLS_OFF, Duration::from_secs(5)).await;
    assert!(
        line.is_some_and(|l| l.contains("(sslmode=prefer)")),
        "{}",
        gw.proc.log_text()
    );
    let log = gw.proc.log_text();
    assert!(
        !log.contains(PREFER_WARNING) && !log.contains(FALLBACK_WARNING),
        "{log}"
    );
    drop(gw);

    // The same server, required to speak TLS: refused, by name.
    let log = start_refused(&format!("{}?sslmode=require", pg.url())).await;
    assert!(log.contains("server does not support TLS"), "{log}");
}

/// This machine's address on its default route (no packet is sent to find it).
fn non_loopback_ipv4() -> Option<Ipv4Addr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // TEST-NET-3: a `connect` of UDP only picks the route.
    s.connect("203.0.113.1:9").ok()?;
    match s.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_prefer_off_this_machine_warns_twice() {
    let ip = non_loopback_ipv4().unwrap_or_else(|| {
        panic!("this test needs a non-loopback IPv4 address (a default route) on the machine")
    });
    let pg = tokio::task::spawn_blocking(move || PgCluster::start_on(ip.into()))
        .await
        .unwrap();
    let gw = start_ok(&pg.url()).await;
    for needle in [PREFER_WARNING, FALLBACK_WARNING, TLS_OFF] {
        assert!(
            gw.proc
                .wait_log(needle, Duration::from_secs(5))
                .await
                .is_some(),
            "{needle}:\n{}",
            gw.proc.log_text()
        );
    }
    assert!(gw.proc.log_text().contains("use sslmode=verify-full"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_another_ca_is_refused_under_verify_full_and_require() {
    let dir = tempfile::tempdir().unwrap();
    let other = TestCa::new(dir.path(), "other");
    let ca = other.ca_file.display().to_string();
    for mode in ["verify-full", "verify-ca", "require"] {
        let log = start_refused(&with_query(&format!("sslmode={mode}&sslrootcert={ca}"))).await;
        assert!(
            log.contains("error performing TLS handshake")
                && log.contains("invalid peer certificate")
                && log.contains("UnknownIssuer"),
            "{mode}: {log}"
        );
    }
    // Without any root that signed it (the system roots only): refused too, where
    // libpq's `require` would have gone on unverified.
    let log = start_refused(&with_query("sslmode=require")).await;
    assert!(
        log.contains("UnknownIssuer") || log.contains("no trusted root certificates"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_verify_full_checks_the_host_name_verify_ca_does_not() {
    // The name the certificate does not carry, the address of the cluster
    // (`hostaddr`): TLS is verified against the name, the connection goes to the
    // address.
    let ca = cluster_ca();
    let url = |mode: &str| {
        format!(
            "postgres://postgres@not-in-the-cert.test:{}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={ca}",
            cluster_port()
        )
    };
    let log = start_refused(&url("verify-full")).await;
    assert!(
        log.contains("invalid peer certificate")
            && log.contains("certificate not valid for name \"not-in-the-cert.test\""),
        "{log}"
    );
    for mode in ["verify-ca", "require"] {
        let gw = start_ok(&url(mode)).await;
        let line = gw.proc.wait_log(TLS_ON, Duration::from_secs(5)).await;
        assert!(
            line.is_some_and(|l| l.contains(&format!("(sslmode={mode})"))),
            "{mode}: {}",
            gw.proc.log_text()
        );
    }
    // The names it does carry pass verify-full: localhost (the suite's URL) and the
    // address 127.0.0.1.
    let gw = start_ok(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        cluster_port()
    ))
    .await;
    assert!(
        gw.proc
            .wait_log(TLS_ON, Duration::from_secs(5))
            .await
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_scram_works_without_channel_binding_and_the_password_is_not_logged() {
    const PASSWORD: &str = "scram-pw-3b1f9c";
    let admin = taskgate::store::postgres::connect_url(&pg_url())
        .await
        .unwrap();
    // The role scripts/pg.sh's pg_hba.conf sends through SCRAM; once per cluster.
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'taskgate_scram') THEN
                 CREATE ROLE taskgate_scram LOGIN PASSWORD '{PASSWORD}';
               END IF;
             END $$;
             GRANT CREATE ON DATABASE postgres TO taskgate_scram;"
        ))
        .await
        .unwrap();
    let ca = cluster_ca();
    let port = cluster_port();
    let wrong = format!(
        "postgres://taskgate_scram:wrong-pw@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    );
    let log = start_refused(&wrong).await;
    assert!(log.contains("password authentication failed"), "{log}");
    assert!(!log.contains("wrong-pw"), "{log}");

    let url = format!(
        "postgres://taskgate_scram:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    );
    let gw = start_ok(&url).await;
    assert!(
        gw.proc
            .wait_log(TLS_ON, Duration::from_secs(5))
            .await
            .is_some(),
        "{}",
        gw.proc.log_text()
    );
    let log = gw.proc.log_text();
    assert!(!log.contains(PASSWORD), "{log}");
}
