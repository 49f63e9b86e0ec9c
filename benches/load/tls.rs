//! TLS on the front against plaintext, side by side in one run (README "TLS"): two
//! gateways on the same seeded task set and the same demo upstream, one with
//! `server.tls_cert`, measured alternately. Rows: inline `tools/call echo` and
//! `tasks/get` on kept-alive connections (the cost of record encryption), then one new
//! connection per request for `/healthz` — plain TCP, a full TLS handshake, and a
//! resumed one (TLS 1.3 session tickets) — which is what clients that do not pool pay.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use super::harness::{
    Stats, check_completed, check_echo, check_hello, client, cpu_us_per, median_run, run_load,
};
use super::processes::{Gateway, gateway_config, start_gateway_with};
use super::report::{Report, err_note, ms};
use super::requests::{echo_body_2026, gw_req, seed, token};
use super::scenarios::get_maker;
use super::{MakeReq, Opts};

const TASKS: u64 = 2_000;
const PRINCIPALS: u64 = 200;

type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A CA and a `localhost` server certificate signed by it, as PEM files in `dir`:
/// (CA, certificate, key).
fn mint(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let files = (
        dir.join("ca.pem"),
        dir.join("gw.pem"),
        dir.join("gw-key.pem"),
    );
    std::fs::write(&files.0, issuer.pem()).unwrap();
    std::fs::write(&files.1, cert.pem()).unwrap();
    std::fs::write(&files.2, key.serialize_pem()).unwrap();
    files
}

/// An HTTP/1.1 client over TLS trusting `ca`; `resume` keeps rustls's session cache
/// (the default), `pool` keeps connections alive between requests.
fn tls_client(ca: &Path, resume: bool, pool: bool) -> TlsClient {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(if pool { 4096 } else { 0 })
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// A plaintext client that opens a new connection per request.
fn unpooled() -> Client<HttpConnector, Full<Bytes>> {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(conn)
}

/// `make`'s requests sent to `https://localhost:PORT` instead of `http://ADDR`.
fn over_tls(make: MakeReq, port: u16) -> MakeReq {
    Arc::new(move |n| {
        let mut req = make(n);
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        *req.uri_mut() = format!("https://localhost:{port}{path}").parse().unwrap();
        req
    })
}

fn healthz(addr: SocketAddr) -> MakeReq {
    Arc::new(move |_| {
        http::Request::get(format!("http://{addr}/healthz"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    })
}

/// One point, the median of `RUNS`: its stats and the gateway's CPU µs per request.
#[allow(clippy::too_many_arguments)]
fn point<C>(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    c: &Client<C, Full<Bytes>>,
    gw: &Gateway,
    conc: usize,
    make: &MakeReq,
    check: super::harness::Check,
) -> (Stats, f64)
where
    C: Connect + Clone + Send + Sync + 'static,
{
    median_run(|| {
        let cpu0 = gw.proc.cpu_secs();
        let s = rt.block_on(run_load(c, conc, o.warmup, o.duration, make.clone(), check));
        let cpu = cpu_us_per(&gw.proc, cpu0, &s);
        (s, cpu)
    })
}

pub(super) fn tls(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    up: SocketAddr,
    work: &Path,
) {
    let dir = work.join("tls");
    let (plain_dir, tls_dir) = (dir.join("plain"), dir.join("tls"));
    for d in [&plain_dir, &tls_dir] {
        std::fs::create_dir_all(d).unwrap();
        seed(d, TASKS, PRINCIPALS, 1000);
    }
    let (ca, cert, key) = mint(&dir);
    let plain = start_gateway_with(&plain_dir, &gateway_config(&plain_dir.join("data"), up));
    let with_tls = gateway_config(&tls_dir.join("data"), up).replacen(
        "[server]\n",
        &format!(
            "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            cert.display(),
            key.display()
        ),
        1,
    );
    let secure = start_gateway_with(&tls_dir, &with_tls);
    let port = secure.addr.port();
    let (pc, tc) = (client(), tls_client(&ca, true, true));

    rep.section(
        "TLS on the front vs plaintext (same run, same seeded tasks, same upstream)",
        &[
            "request",
            "c",
            "front",
            "req/s",
            "p50",
            "p99",
            "gateway CPU µs/req",
            "TLS/plain CPU",
            "errors",
        ],
    );
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("alice", "acme"))).unwrap();
    let mut row = |what: &str, conc: usize, p: (Stats, f64), t: (Stats, f64)| {
        for (front, (s, cpu)) in [("plaintext", &p), ("TLS", &t)] {
            rep.row(&[
                what.to_string(),
                conc.to_string(),
                front.to_string(),
                format!("{:.0}", s.rps()),
                ms(s.p50()),
                ms(s.p99()),
                format!("{cpu:.0}"),
                if front == "TLS" {
                    format!("{:.2}×", t.1 / p.1)
                } else {
                    "1.00×".into()
                },
                format!("{}{}", s.errors + s.refused, err_note(s)),
            ]);
        }
    };
    for conc in [1usize, 32] {
        let (a, b) = (plain.addr, bearer.clone());
        let echo: MakeReq =
            Arc::new(move |n| gw_req(a, &b, "tools/call", "echo", echo_body_2026(n)));
        let (a, b) = (secure.addr, bearer.clone());
        let echo_tls = over_tls(
            Arc::new(move |n| gw_req(a, &b, "tools/call", "echo", echo_body_2026(n))),
            port,
        );
        let p = point(rt, o, &pc, &plain, conc, &echo, check_echo);
        let t = point(rt, o, &tc, &secure, conc, &echo_tls, check_echo);
        row("inline tools/call echo", conc, p, t);
    }
    for conc in [1usize, 32] {
        let get = get_maker(plain.addr, TASKS, PRINCIPALS);
        let get_tls = over_tls(get_maker(secure.addr, TASKS, PRINCIPALS), port);
        let p = point(rt, o, &pc, &plain, conc, &get, check_completed);
        let t = point(rt, o, &tc, &secure, conc, &get_tls, check_completed);
        row("tasks/get", conc, p, t);
    }
    // A new connection per request.
    let conc = 8;
    let fresh = unpooled();
    let (full, resumed) = (tls_client(&ca, false, false), tls_client(&ca, true, false));
    let (plain_healthz, tls_healthz) = (healthz(plain.addr), over_tls(healthz(secure.addr), port));
    let p = point(rt, o, &fresh, &plain, conc, &plain_healthz, check_hello);
    let f = point(rt, o, &full, &secure, conc, &tls_healthz, check_hello);
    let r = point(rt, o, &resumed, &secure, conc, &tls_healthz, check_hello);
    for (front, (s, cpu)) in [
        ("new TCP connection", &p),
        ("full TLS handshake", &f),
        ("resumed TLS session", &r),
    ] {
        rep.row(&[
            "GET /healthz, one connection each".into(),
            conc.to_string(),
            front.into(),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{cpu:.0}"),
            format!("{:.2}×", cpu / p.1),
            format!("{}{}", s.errors + s.refused, err_note(s)),
        ]);
    }
    rep.note(
        "TLS: rustls on aws-lc-rs, TLS 1.3 (X25519, AES-128-GCM or ChaCha20 as negotiated), ECDSA P-256 certificate, HTTP/1.1. \
         Kept-alive rows reuse connections (pool of 4096); \"one connection each\" opens a new connection per request, \
         \"resumed\" with rustls's session cache (TLS 1.3 tickets), \"full\" with resumption disabled. \
         Each row is the median run (by req/s) of 3; gateway CPU includes the warm-up.",
    );
}
