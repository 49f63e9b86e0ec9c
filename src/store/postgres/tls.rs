//! TLS to PostgreSQL (README "TLS", "PostgreSQL"): `sslmode` and `sslrootcert` of
//! `store.url`, and the rustls connector every connection of the store uses (the
//! pool, the migrations, the LISTEN and the publish connections).
//!
//! tokio-postgres 0.7 knows only `sslmode` disable/prefer/require and no
//! `sslrootcert`, so both are taken out of the URL here, before it parses the rest,
//! and what they mean is carried by the connector's verifier instead:
//!
//! | sslmode       | TLS                        | server certificate                     |
//! |---------------|----------------------------|----------------------------------------|
//! | `disable`     | never                      | —                                      |
//! | `prefer`      | when the server offers it  | not verified (as libpq)                |
//! | `require`     | always                     | chain verified, host name not checked  |
//! | `verify-ca`   | always                     | chain verified, host name not checked  |
//! | `verify-full` | always                     | chain and host name verified           |
//!
//! The chain is verified against the system roots plus `sslrootcert` (a PEM CA
//! file). `require` verifying the chain is stricter than libpq, which verifies
//! nothing under `require` unless a root file exists: taskgate has no switch that
//! skips verification where TLS is required.
//!
//! Channel binding is not offered ([`ChannelBinding::none`]): `tls-server-end-point`
//! needs the hash of the server certificate under the hash of its signature
//! algorithm, which means parsing X.509 (the crates tokio-postgres-rustls uses for
//! it are not in this build). SCRAM still authenticates both sides by the password;
//! what binding would add (the SCRAM exchange tied to this TLS session) the verified
//! certificate of `verify-full` gives already.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::Host;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::tls::{PROTOCOL_VERSIONS, TlsError, provider, root_store};

/// `sslmode` of `store.url` (see the module documentation for what each means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, UrlError> {
        match s {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            "allow" => Err(UrlError::Allow),
            other => Err(UrlError::UnknownMode(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// Whether the connection fails rather than go on without TLS.
    pub fn requires_tls(self) -> bool {
        matches!(self, Self::Require | Self::VerifyCa | Self::VerifyFull)
    }

    fn tokio_mode(self) -> tokio_postgres::config::SslMode {
        match self {
            Self::Disable => tokio_postgres::config::SslMode::Disable,
            Self::Prefer => tokio_postgres::config::SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `sslrootcert` of `store.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// `sslrootcert=system`: the system roots only (as libpq 16).
    System,
    /// A PEM file of CA certificates, trusted besides the system roots.
    File(PathBuf),
}

/// Why `store.url` cannot be used. Never quotes the URL (it may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("sslmode={0:?} is not known; use disable, prefer, require, verify-ca or verify-full")]
    UnknownMode(String),
    #[error(
        "sslmode=allow is not supported: it tries plaintext first and TLS only when the \
         server refuses plaintext, which tokio-postgres cannot do and which protects \
         nothing prefer does not; use verify-full (or prefer, require)"
    )]
    Allow,
    #[error("sslrootcert is set but sslmode=disable uses no TLS; drop one of them")]
    RootCertWithoutTls,
    #[error(
        "sslrootcert=system needs sslmode=verify-full (its default), not {0}: public CAs \
         certify anyone's host name, so their certificates mean something only with the \
         host name checked"
    )]
    SystemRootsNeedFull(SslMode),
    #[error("sslrootcert is empty")]
    EmptyRootCert,
    #[error(
        "sslmode={0} needs TLS, but a host is a unix socket directory (PostgreSQL has no \
         TLS there); use a TCP host name or address, or sslmode=disable"
    )]
    UnixSocket(SslMode),
    #[error("sslrootcert {0}")]
    RootFile(#[source] TlsError),
    #[error("{0}")]
    Tls(#[source] TlsError),
    #[error("{0}")]
    Parse(String),
}

/// `store.url` understood: the tokio-postgres configuration of the rest of the URL
/// (its `sslmode` set from ours), and what TLS it asks for.
#[derive(Debug, Clone)]
pub struct PgUrl {
    pub config: tokio_postgres::Config,
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
}

/// Parse `url` (URL form `postgres://…?sslmode=…&sslrootcert=…` or key=value form
/// `host=… sslmode=…`), taking `sslmode` and `sslrootcert` out before tokio-postgres
/// sees it. The default `sslmode` is `prefer`, as libpq's (`verify-full` with
/// `sslrootcert=system`, as libpq's too).
pub fn parse_url(url: &str) -> Result<PgUrl, UrlError> {
    let split = split_tls_params(url);
    let root_cert = match split.sslrootcert.as_deref() {
        None => None,
        Some("") => return Err(UrlError::EmptyRootCert),
        Some("system") => Some(RootCert::System),
        Some(path) => Some(RootCert::File(PathBuf::from(path))),
    };
    let mode = match split.sslmode.as_deref() {
        Some(m) => SslMode::parse(m)?,
        None if root_cert == Some(RootCert::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    match (&root_cert, mode) {
        (Some(_), SslMode::Disable) => return Err(UrlError::RootCertWithoutTls),
        (Some(RootCert::System), m) if m != SslMode::VerifyFull => {
            return Err(UrlError::SystemRootsNeedFull(m));
        }
        _ => {}
    }
    let mut config: tokio_postgres::Config = split
        .rest
        .parse()
        .map_err(|e: tokio_postgres::Error| UrlError::Parse(crate::tls::error_chain(&e)))?;
    if mode.requires_tls()
        && config
            .get_hosts()
            .iter()
            .any(|h| matches!(h, Host::Unix(_)))
    {
        return Err(UrlError::UnixSocket(mode));
    }
    config.ssl_mode(mode.tokio_mode());
    Ok(PgUrl {
        config,
        mode,
        root_cert,
    })
}

impl PgUrl {
    /// The connector for this URL's `sslmode`, its CA file read now (so a file that
    /// cannot be read stops the start-up).
    pub fn connector(&self) -> Result<PgTls, UrlError> {
        let extra = match &self.root_cert {
            Some(RootCert::File(p)) => Some(p.as_path()),
            _ => None,
        };
        let root_err = |e: TlsError| match extra {
            Some(_) => UrlError::RootFile(e),
            None => UrlError::Tls(e),
        };
        let config = match self.mode {
            SslMode::Disable => return Ok(PgTls { config: None }),
            // As libpq: prefer verifies nothing unless a root file is given, and then
            // the chain (what libpq does with a root file, too).
            SslMode::Prefer if extra.is_none() => custom(Arc::new(Unverified(provider())))?,
            SslMode::Prefer | SslMode::Require | SslMode::VerifyCa => {
                let roots = Arc::new(root_store(extra).map_err(root_err)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| UrlError::Tls(TlsError::Config(format!("verifier: {e}"))))?;
                custom(Arc::new(ChainOnly(webpki)))?
            }
            SslMode::VerifyFull => {
                crate::tls::client::client_config(extra, None).map_err(root_err)?
            }
        };
        Ok(PgTls::new(config))
    }

    /// Whether every host the connection may reach is this machine (a loopback
    /// address, `localhost`, or a unix socket): no network to read or change the
    /// traffic on, so `prefer`'s lack of guarantees needs no warning. `hostaddr`,
    /// where given, is where the connection goes.
    pub fn is_loopback(&self) -> bool {
        let hosts = self.config.get_hosts();
        let addrs = self.config.get_hostaddrs();
        (0..hosts.len().max(addrs.len())).all(|i| match (addrs.get(i), hosts.get(i)) {
            (Some(ip), _) => ip.is_loopback(),
            (None, Some(Host::Tcp(h))) => is_loopback_name(h),
            (None, Some(Host::Unix(_))) => true,
            (None, None) => true,
        })
    }
}

fn is_loopback_name(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The warning `sslmode=prefer` deserves at start-up, if any.
pub(super) fn prefer_warning(url: &PgUrl) -> Option<&'static str> {
    (url.mode == SslMode::Prefer && !url.is_loopback()).then_some(
        "store.url: sslmode=prefer (the default) neither guarantees encryption nor \
         authenticates the server, so anyone on the path can read or change the traffic; \
         use sslmode=verify-full",
    )
}

/// The warning for a connection that went on without TLS, if any.
pub(super) fn plaintext_warning(url: &PgUrl, tls: bool) -> Option<&'static str> {
    (url.mode == SslMode::Prefer && !tls && !url.is_loopback()).then_some(
        "the PostgreSQL connection fell back to plaintext: the server offers no TLS \
         (sslmode=prefer); use sslmode=verify-full against a server with TLS",
    )
}

fn custom(verifier: Arc<dyn ServerCertVerifier>) -> Result<ClientConfig, UrlError> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .map_err(|e| UrlError::Tls(TlsError::Config(format!("TLS versions: {e}"))))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The URL with `sslmode` and `sslrootcert` taken out, and their values.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    rest: String,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Take `sslmode` and `sslrootcert` out of either form of connection string; the last
/// of a repeated key counts (as in libpq). A key=value string this cannot read is
/// passed on whole, for tokio-postgres to refuse with its own message.
fn split_tls_params(url: &str) -> Split {
    let is_url = ["postgres://", "postgresql://"]
        .iter()
        .any(|p| url.starts_with(p));
    if is_url {
        split_url_form(url)
    } else {
        split_key_value_form(url).unwrap_or_else(|| Split {
            rest: url.to_string(),
            sslmode: None,
            sslrootcert: None,
        })
    }
}

fn split_url_form(url: &str) -> Split {
    let mut out = Split {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let Some((head, query)) = url.split_once('?') else {
        out.rest = url.to_string();
        return out;
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match percent_decode(k).as_str() {
            "sslmode" => out.sslmode = Some(percent_decode(v)),
            "sslrootcert" => out.sslrootcert = Some(percent_decode(v)),
            _ => kept.push(pair),
        }
    }
    out.rest = if kept.is_empty() {
        head.to_string()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    out
}

/// tokio-postgres's key=value grammar: `key = value` pairs apart by white space; a
/// value is 'quoted' (with `\'` and `\\`) or runs to the next white space (with `\`
/// escaping the next character). Pairs other than ours are passed on as written.
fn split_key_value_form(s: &str) -> Option<Split> {
    let mut out = Split {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let mut kept: Vec<&str> = Vec::new();
    let mut it = s.char_indices().peekable();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut it);
        let Some(&(start, _)) = it.peek() else { break };
        let mut key_end = start;
        while let Some((i, c)) = it.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key_end = i + c.len_utf8();
        }
        if key_end == start {
            return None;
        }
        let key = &s[start..key_end];
        skip_ws(&mut it);
        it.next_if(|(_, c)| *c == '=')?;
        skip_ws(&mut it);
        let mut value = String::new();
        let end;
        if it.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match it.next()? {
                    (i, '\'') => {
                        end = i + 1;
                        break;
                    }
                    (_, '\\') => value.push(it.next()?.1),
                    (_, c) => value.push(c),
                }
            }
        } else {
            let mut last = None;
            while let Some((i, c)) = it.next_if(|(_, c)| !c.is_whitespace()) {
                last = Some(i + c.len_utf8());
                if c == '\\' {
                    if let Some((j, c2)) = it.next() {
                        value.push(c2);
                        last = Some(j + c2.len_utf8());
                    }
                } else {
                    value.push(c);
                }
            }
            end = last?;
        }
        match key {
            "sslmode" => out.sslmode = Some(value),
            "sslrootcert" => out.sslrootcert = Some(value),
            _ => kept.push(&s[start..end]),
        }
    }
    out.rest = kept.join(" ");
    Some(out)
}

/// `%XX` decoded (as tokio-postgres decodes URL parameters); a `%` not followed by
/// two hex digits stays as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `prefer` without a root file: any certificate chain is accepted (as libpq), but
/// the handshake signatures are still checked, so the session is with whoever holds
/// the key of the certificate presented.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `require`/`verify-ca`: the chain verified by webpki, the host name not. webpki
/// checks the name last, after chain, validity and revocation, so a name error means
/// everything before it passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The tokio-postgres TLS connector on tokio-rustls. `config` is `None` under
/// `sslmode=disable` (tokio-postgres then never asks for a handshake).
#[derive(Clone)]
pub struct PgTls {
    config: Option<Arc<ClientConfig>>,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTls")
            .field("tls", &self.config.is_some())
            .finish()
    }
}

impl PgTls {
    fn new(mut config: ClientConfig) -> Self {
        // What PostgreSQL 17's direct TLS (`sslnegotiation=direct`) requires, and what
        // libpq sends; older servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Self {
            config: Some(Arc::new(config)),
        }
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    /// `domain` is the URL's host (a name or an address), for SNI and verification;
    /// read at the handshake, so a unix socket's empty one under `disable` or
    /// `prefer` costs nothing.
    fn make_tls_connect(&mut self, domain: &str) -> io::Result<PgTlsConnect> {
        Ok(PgTlsConnect {
            config: self.config.clone(),
            domain: domain.to_string(),
        })
    }
}

/// One handshake to come (see [`PgTls`]).
pub struct PgTlsConnect {
    config: Option<Arc<ClientConfig>>,
    domain: String,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let Some(config) = self.config else {
                return Err(io::Error::other("TLS is off (sslmode=disable)"));
            };
            let bare = self.domain.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(bare.to_string()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("host {bare:?} is no host name or IP address for TLS: {e}"),
                )
            })?;
            match tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
            {
                Ok(s) => Ok(PgTlsStream(s)),
                Err(e) => {
                    if let Some(reason) = crate::tls::failure_reason(&e) {
                        crate::metrics::tls_handshake_failed("outbound", "postgres", reason);
                    }
                    Err(e)
                }
            }
        })
    }
}

/// A TLS session to PostgreSQL.
pub struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    /// None: see the module documentation.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> (String, Option<&'static str>, Option<String>) {
        let sp = split_tls_params(s);
        let mode = sp.sslmode.map(|m| SslMode::parse(&m).unwrap().as_str());
        (sp.rest, mode, sp.sslrootcert)
    }

    #[test]
    fn the_url_form_loses_only_sslmode_and_sslrootcert() {
        assert_eq!(
            split(
                "postgres://u:p@db.example:5433/app?sslmode=verify-full&application_name=x&sslrootcert=/etc/ca%20dir/ca.pem"
            ),
            (
                "postgres://u:p@db.example:5433/app?application_name=x".into(),
                Some("verify-full"),
                Some("/etc/ca dir/ca.pem".into())
            )
        );
        assert_eq!(
            split("postgresql://u@h/db?sslmode=require"),
            ("postgresql://u@h/db".into(), Some("require"), None)
        );
        assert_eq!(
            split("postgres://u@h/db"),
            ("postgres://u@h/db".into(), None, None)
        );
        // The last of a repeated key counts.
        assert_eq!(
            split("postgres://u@h/db?sslmode=disable&sslmode=verify-ca").1,
            Some("verify-ca")
        );
    }

    #[test]
    fn the_key_value_form_loses_only_sslmode_and_sslrootcert() {
        assert_eq!(
            split(
                "host=db.example  sslmode = verify-ca user=u sslrootcert='/etc/my ca\\'s.pem' password=p\\ q"
            ),
            (
                "host=db.example user=u password=p\\ q".into(),
                Some("verify-ca"),
                Some("/etc/my ca's.pem".into())
            )
        );
        assert_eq!(
            split("host=h dbname=d"),
            ("host=h dbname=d".into(), None, None)
        );
        // What this cannot read goes to tokio-postgres whole (which refuses it).
        let bad = "host=h sslmode";
        assert_eq!(split(bad).0, bad);
        assert!(parse_url(bad).is_err());
    }

    #[test]
    fn modes_map_onto_tokio_postgres_and_default_to_prefer() {
        use tokio_postgres::config::SslMode as T;
        let cases = [
            ("postgres://u@db.example/d", SslMode::Prefer, T::Prefer),
            (
                "postgres://u@db.example/d?sslmode=disable",
                SslMode::Disable,
                T::Disable,
            ),
            (
                "host=db.example sslmode=require",
                SslMode::Require,
                T::Require,
            ),
            (
                "postgres://u@db.example/d?sslmode=verify-ca",
                SslMode::VerifyCa,
                T::Require,
            ),
            (
                "postgres://u@db.example/d?sslmode=verify-full",
                SslMode::VerifyFull,
                T::Require,
            ),
            (
                "postgres://u@db.example/d?sslrootcert=system",
                SslMode::VerifyFull,
                T::Require,
            ),
        ];
        for (url, mode, tokio) in cases {
            let p = parse_url(url).unwrap();
            assert_eq!((p.mode, p.config.get_ssl_mode()), (mode, tokio), "{url}");
            p.connector().unwrap();
        }
    }

    #[test]
    fn refusals_say_why_and_never_quote_the_url() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing-ca.pem");
        let cases = [
            ("sslmode=allow".to_string(), "allow is not supported"),
            (
                "sslmode=verify_full".to_string(),
                "\"verify_full\" is not known",
            ),
            (
                format!("sslmode=disable&sslrootcert={}", missing.display()),
                "sslmode=disable uses no TLS",
            ),
            (
                "sslmode=require&sslrootcert=system".to_string(),
                "needs sslmode=verify-full",
            ),
            ("sslrootcert=".to_string(), "sslrootcert is empty"),
        ];
        for (query, want) in cases {
            let url = format!("postgres://u:secret@db.example/d?{query}");
            let err = parse_url(&url).unwrap_err().to_string();
            assert!(err.contains(want), "{query}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
        // An unreadable root file is refused when the connector is built, by name.
        let url = format!(
            "postgres://u:secret@db.example/d?sslmode=verify-full&sslrootcert={}",
            missing.display()
        );
        let err = parse_url(&url)
            .unwrap()
            .connector()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing-ca.pem") && err.contains("cannot read"),
            "{err}"
        );
        // TLS cannot go over a unix socket.
        let err = parse_url("host=/run/postgresql sslmode=verify-full")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unix socket"), "{err}");
        let p = parse_url("host=/run/postgresql").unwrap();
        assert_eq!(p.mode, SslMode::Prefer);
        assert!(p.is_loopback());
    }

    #[test]
    fn prefer_warns_only_off_this_machine() {
        let warn = |url: &str| prefer_warning(&parse_url(url).unwrap()).is_some();
        let fallback = |url: &str, tls| plaintext_warning(&parse_url(url).unwrap(), tls).is_some();
        for local in [
            "postgres://u@localhost/d",
            "postgres://u@127.0.0.1:5432/d",
            "postgres://u@[::1]:5432/d",
            "host=/tmp",
            "host=db.example hostaddr=127.0.0.1",
        ] {
            assert!(!warn(local), "{local}");
            assert!(!fallback(local, false), "{local}");
        }
        for remote in [
            "postgres://u@db.example/d",
            "postgres://u@192.0.2.7/d",
            "host=localhost,db.example",
        ] {
            assert!(warn(remote), "{remote}");
            assert!(fallback(remote, false), "{remote}");
            assert!(!fallback(remote, true), "{remote}");
        }
        for strict in ["disable", "require", "verify-ca", "verify-full"] {
            let url = format!("postgres://u@db.example/d?sslmode={strict}");
            assert!(!warn(&url) && !fallback(&url, false), "{strict}");
        }
    }
}
