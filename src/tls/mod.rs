//! TLS with rustls on the aws-lc-rs provider, verified by default (docs/design.md §26,
//! README "TLS").
//!
//! - [`client`]: what taskgate trusts when it connects out (JWKS over `https://`, HTTPS
//!   upstreams, PostgreSQL): the system roots plus an optional extra CA bundle per
//!   use, and an optional client certificate. There is no switch that skips
//!   verification (but PostgreSQL's libpq-compatible `sslmode=prefer`, whose own
//!   verifier is in `store::postgres`; README "TLS", "PostgreSQL").
//! - [`server`]: the certificate a listener presents, reloaded from disk without a
//!   restart, and the optional client-certificate requirement.
//!
//! Every configuration is built on one explicit provider ([`provider`]) with TLS 1.2
//! and 1.3 only, so nothing depends on which provider another crate installed as the
//! process default. The module names no other module of the crate but `metrics`.

pub mod client;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::{RootCertStore, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// TLS 1.3 and 1.2; nothing older (rustls implements nothing older either).
pub const PROTOCOL_VERSIONS: &[&SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Why a TLS configuration could not be built. Always names the file or setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{0}")]
    Config(String),
}

impl TlsError {
    fn file(path: &Path, reason: impl std::fmt::Display) -> Self {
        Self::File {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

/// The one crypto provider every configuration is built with: aws-lc-rs with its
/// default cipher suites and key exchange groups.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// Make [`provider`] the process default too, for libraries that build their own
/// configurations from it (pingora's listener and connector). Called by `main` before
/// anything else; a later install by such a library is then a no-op.
pub fn install_process_default() {
    let _ = CryptoProvider::install_default(rustls::crypto::aws_lc_rs::default_provider());
}

/// Every certificate in a PEM file (a chain: leaf first). Refuses an empty file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::file(path, pem_reason(&e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::file(path, pem_reason(&e)))?;
    if certs.is_empty() {
        return Err(TlsError::file(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::file(path, pem_reason(&e)))
}

fn pem_reason(e: &rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::NoItemsFound => "no PEM private key in the file".into(),
        rustls_pki_types::pem::Error::Io(io) => format!("cannot read: {io}"),
        other => format!("not valid PEM: {other:?}"),
    }
}

/// The system's trusted roots (`SSL_CERT_FILE`/`SSL_CERT_DIR` honoured), read once per
/// process. Unreadable entries are skipped: one bad file must not leave taskgate
/// trusting nothing, and an empty store is refused where it is used.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!(error = %e, "skipping an unreadable system root certificate");
        }
        found.certs
    })
}

/// The earliest `notAfter` of `certs` as Unix seconds: when the first certificate of a
/// chain or CA bundle expires. `None` when no certificate parses (rustls reads a
/// certificate's fields only in a handshake).
pub fn earliest_expiry(certs: &[CertificateDer<'_>]) -> Option<i64> {
    certs
        .iter()
        .filter_map(|c| x509_parser::parse_x509_certificate(c.as_ref()).ok())
        .map(|(_, cert)| cert.validity().not_after.timestamp())
        .min()
}

/// Record `taskgate_tls_cert_expiry_seconds{kind, name}` for certificates just loaded
/// (README "Operations"): `kind` `listener` with the listener's name, or `ca` with the
/// CA file's path. A chain nothing of which parses is logged and not recorded.
pub fn record_expiry(kind: &'static str, name: &str, certs: &[CertificateDer<'_>]) {
    match earliest_expiry(certs) {
        Some(not_after) => crate::metrics::tls_cert_expiry(kind, name, not_after),
        None => tracing::warn!(
            kind,
            name,
            "no notAfter could be read from the certificates; their expiry is not exported"
        ),
    }
}

/// Every certificate of the CA file at `path`, its expiry recorded (`kind` `ca`).
fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = load_certs(path)?;
    record_expiry("ca", &path.display().to_string(), &certs);
    Ok(certs)
}

/// The roots a connection verifies its server against: the system roots plus every
/// certificate of `extra_ca_file` (whose expiry is recorded under its path).
pub fn root_store(extra_ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let (_, skipped) = roots.add_parsable_certificates(system_roots().iter().cloned());
    if skipped > 0 {
        tracing::debug!(skipped, "system root certificates rustls cannot use");
    }
    if let Some(path) = extra_ca_file {
        for cert in load_ca_file(path)? {
            roots
                .add(cert)
                .map_err(|e| TlsError::file(path, format!("not a usable CA certificate: {e}")))?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::Config(
            "no trusted root certificates: the system store is empty and no CA file is set".into(),
        ));
    }
    Ok(roots)
}

/// An error with all its sources, `outer: inner: …`: hyper's own messages ("client
/// error (Connect)") say nothing of why a handshake failed; rustls's, at the end of the
/// chain, do.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// A short, fixed name for why a TLS handshake failed, for metrics labels; `None` when
/// no rustls error is in the chain (a plain connection failure).
pub fn failure_reason(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(reason_of(tls));
        }
        // `io::Error::source` skips the error it wraps (it answers that error's own
        // source), and hyper-rustls wraps tokio-rustls's io::Error in another one: step
        // into the wrapped error itself.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The `reason` label values of `taskgate_tls_handshake_failures_total`.
pub const FAILURE_REASONS: [&str; 7] = [
    "unknown_issuer",
    "expired",
    "name_mismatch",
    "bad_certificate",
    "peer_alert",
    "handshake",
    // Inbound only: the client did not finish within `server.header_timeout_ms`.
    "timeout",
];

fn reason_of(e: &rustls::Error) -> &'static str {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "unknown_issuer",
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => "expired",
            C::NotValidForName | C::NotValidForNameContext { .. } => "name_mismatch",
            _ => "bad_certificate",
        },
        rustls::Error::NoCertificatesPresented => "bad_certificate",
        rustls::Error::AlertReceived(_) => "peer_alert",
        _ => "handshake",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_found_through_io_and_hyper_style_chains() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        assert_eq!(failure_reason(&io), Some("unknown_issuer"));
        // hyper-rustls: io::Error(Other, io::Error(InvalidData, rustls::Error)).
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let outer = std::io::Error::other(inner);
        assert_eq!(failure_reason(&outer), Some("expired"));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(failure_reason(&plain), None);
        for r in ["unknown_issuer", "expired", "name_mismatch", "peer_alert"] {
            assert!(FAILURE_REASONS.contains(&r));
        }
    }

    /// A self-signed certificate valid until `year-month-day` 00:00 UTC.
    fn cert_until(year: i32, month: u8, day: u8) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, month, day);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn the_earliest_not_after_of_a_chain_is_its_expiry() {
        // 2030-05-01 and 2028-02-29 00:00:00 UTC as Unix seconds.
        let leaf = cert_until(2030, 5, 1);
        assert_eq!(
            earliest_expiry(std::slice::from_ref(&leaf)),
            Some(1_903_824_000)
        );
        let intermediate = cert_until(2028, 2, 29);
        assert_eq!(
            earliest_expiry(&[leaf.clone(), intermediate.clone()]),
            Some(1_835_395_200)
        );
        assert_eq!(earliest_expiry(&[intermediate, leaf]), Some(1_835_395_200));
        // Nothing that parses: no expiry rather than a made-up one; a bad entry beside
        // a good one is skipped.
        assert_eq!(earliest_expiry(&[]), None);
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01]);
        assert_eq!(earliest_expiry(std::slice::from_ref(&garbage)), None);
        let expired = cert_until(2021, 1, 1);
        assert_eq!(earliest_expiry(&[garbage, expired]), Some(1_609_459_200));
    }

    #[test]
    fn files_that_hold_no_certificate_or_key_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = load_certs(&empty).unwrap_err().to_string();
        assert!(
            err.contains("empty.pem") && err.contains("no PEM certificate"),
            "{err}"
        );
        let err = load_key(&empty).unwrap_err().to_string();
        assert!(err.contains("no PEM private key"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = load_certs(&missing).unwrap_err().to_string();
        assert!(
            err.contains("missing.pem") && err.contains("cannot read"),
            "{err}"
        );
    }
}
