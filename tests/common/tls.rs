//! A throwaway certificate authority per test (rcgen), and HTTPS clients that trust it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::Resp;

/// What `https://` requests through `common::send` trust (one test per process under
/// nextest, so one setting per test).
static TRUST: std::sync::Mutex<Option<rustls::ClientConfig>> = std::sync::Mutex::new(None);

/// Held for its whole run by a test that calls [`trust`]: the setting is process-wide,
/// and where nextest runs one test per process, plain `cargo test` runs a file's tests
/// as threads of one process.
pub async fn exclusive_trust() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}

/// Trust `config` (its roots and client identity) for `https://` requests from now on.
pub fn trust(config: rustls::ClientConfig) {
    *TRUST.lock().unwrap() = Some(config);
}

/// A client for `https://` URLs under [`trust`], offering h2 and HTTP/1.1.
pub fn https_client() -> Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
> {
    let mut config = TRUST
        .lock()
        .unwrap()
        .clone()
        .expect("tls::trust was not called before an https:// request");
    config.alpn_protocols.clear();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_all_versions()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// A certificate chain and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA whose certificate is written to `<dir>/<name>-ca.pem`.
pub struct TestCa {
    name: String,
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub ca_file: PathBuf,
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("taskgate test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, issuer.pem()).unwrap();
        Self {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            issuer,
            ca_file,
        }
    }

    /// A server certificate for `localhost` and `127.0.0.1`, valid now.
    pub fn server(&self, file: &str) -> CertFiles {
        self.issue(file, &["localhost", "127.0.0.1"], Usage::Server, false)
    }

    /// A leaf for `sans`, written to `<dir>/<ca>-<file>.pem` and `…-key.pem`;
    /// `expired` makes one that ended in 2021.
    pub fn issue(&self, file: &str, sans: &[&str], usage: Usage, expired: bool) -> CertFiles {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{}-{file}", self.name));
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = if expired {
            rcgen::date_time_ymd(2021, 1, 1)
        } else {
            rcgen::date_time_ymd(2099, 1, 1)
        };
        params.extended_key_usages = vec![match usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = CertFiles {
            cert: self.dir.join(format!("{}-{file}.pem", self.name)),
            key: self.dir.join(format!("{}-{file}-key.pem", self.name)),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

/// A client configuration trusting only `ca_file` (and presenting `identity`), with
/// `alpn` offered.
pub fn client_config(
    ca_file: &Path,
    identity: Option<&CertFiles>,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(ca_file) {
        roots.add(c).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder
            .with_client_auth_cert(load_certs(&id.cert), load_key(&id.key))
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

fn load_certs(path: &Path) -> Vec<rustls_pki_types::CertificateDer<'static>> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(|c| c.unwrap())
        .collect()
}

fn load_key(path: &Path) -> rustls_pki_types::PrivateKeyDer<'static> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::PrivateKeyDer::from_pem_file(path).unwrap()
}

/// A server configuration for an in-test HTTPS server (`h2` and `http/1.1`).
pub fn server_config(files: &CertFiles, client_ca: Option<&Path>) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs(ca) {
                roots.add(c).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(load_certs(&files.cert), load_key(&files.key))
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One HTTPS request trusting `config`'s roots; `Err` carries the whole error chain
/// (a refused handshake says why). `h2_only` forces HTTP/2 (ALPN must agree).
pub async fn request(
    config: rustls::ClientConfig,
    url: &str,
    method: &str,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<(Resp, http::Version), String> {
    let mut config = config;
    let alpn = std::mem::take(&mut config.alpn_protocols);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    let connector = if alpn.iter().any(|p| p == b"h2") && alpn.len() == 1 {
        builder.enable_http2().build()
    } else if alpn.iter().any(|p| p == b"h2") {
        builder.enable_all_versions().build()
    } else {
        builder.enable_http1().build()
    };
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    let req = b.body(Full::new(body)).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| chain(&e))?;
    let version = resp.version();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect())
        .await
        .map_err(|_| "body timeout".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((
        Resp {
            status,
            headers,
            body,
        },
        version,
    ))
}

pub use taskgate::tls::error_chain as chain;
