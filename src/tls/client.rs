//! Outbound TLS: the configuration a connection out of taskgate verifies its server
//! with (README "TLS", "Outbound").
//!
//! The server is verified against the system roots plus an optional extra CA bundle of
//! that use (`auth.jwks_ca_file`, `[[upstream]] ca_file`, …), host name included.
//! There is deliberately no way to turn verification off: a private CA goes into the
//! CA file instead.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use rustls::ClientConfig;

use super::{PROTOCOL_VERSIONS, TlsError, load_certs, load_key, provider, root_store};

/// A client certificate and its key, both PEM files (mutual TLS to an upstream).
#[derive(Debug, Clone, Copy)]
pub struct ClientIdentity<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
}

/// A verifying client configuration, without ALPN (each use sets its own).
pub fn client_config(
    extra_ca_file: Option<&Path>,
    identity: Option<ClientIdentity<'_>>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .map_err(|e| TlsError::Config(format!("TLS versions: {e}")))?
        .with_root_certificates(root_store(extra_ca_file)?);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some(id) => {
            let certs = load_certs(id.cert)?;
            let key = load_key(id.key)?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| TlsError::File {
                    path: id.key.to_path_buf(),
                    reason: format!("does not fit the client certificate: {e}"),
                })
        }
    }
}

/// The hyper connector of the HTTP clients (upstreams, JWKS): `http://` as before and
/// `https://` verified by `tls`, with HTTP/2 offered by ALPN.
pub type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;

pub fn https_connector(tls: &ClientConfig, connect_timeout: Duration) -> HttpsConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    let mut config = tls.clone();
    // hyper-rustls sets the ALPN list itself and refuses a preset one.
    config.alpn_protocols.clear();
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http)
}

/// A configuration that trusts nothing, for clients configured with an `http://` URL:
/// should anything lead one to `https://`, its handshake fails instead of going out
/// against roots nobody chose for it.
pub fn plaintext_only() -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .map_err(|e| TlsError::Config(format!("TLS versions: {e}")))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Ok(Arc::new(config))
}
