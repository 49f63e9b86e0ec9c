//! Inbound TLS: the certificate a listener presents, reloaded without a restart, and
//! the optional client-certificate requirement (README "TLS", "Inbound").
//!
//! [`ReloadingCert`] is the listener's certificate resolver. It reads the certificate
//! chain and key once at start-up (a broken pair stops the start) and again whenever
//! either file changes on disk or the process gets SIGHUP. A new pair that does not
//! load — half written, a key that does not fit the certificate — is logged and
//! counted, and the previous one keeps serving: a bad deploy never takes the listener
//! down. Connections already open keep the certificate they were accepted with. Each
//! pair that loads (and the client CA file) sets `taskgate_tls_cert_expiry_seconds` to
//! its earliest `notAfter` (README "Operations").

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::{
    PROTOCOL_VERSIONS, TlsError, load_ca_file, load_certs, load_key, provider, record_expiry,
};

/// How often the certificate files are checked for a change.
pub const RELOAD_POLL: Duration = Duration::from_secs(1);

/// What identifies one version of the two files on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    cert: Option<(SystemTime, u64)>,
    key: Option<(SystemTime, u64)>,
}

impl FileStamp {
    fn of(cert: &Path, key: &Path) -> Self {
        let stamp = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        Self {
            cert: stamp(cert),
            key: stamp(key),
        }
    }
}

/// A listener's certificate and key, reloaded from disk (see the module docs).
#[derive(Debug)]
pub struct ReloadingCert {
    /// Names the listener in logs and metrics (`listener`, `metrics_listen`, `edge`).
    listener: &'static str,
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files as last read (successfully or not).
    seen: Mutex<FileStamp>,
}

impl ReloadingCert {
    /// Read the pair; an error here stops the start-up.
    pub fn load(listener: &'static str, cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let seen = FileStamp::of(cert, key);
        let current = read_pair(cert, key)?;
        record_expiry("listener", listener, &current.cert);
        Ok(Arc::new(Self {
            listener,
            cert_path: cert.to_path_buf(),
            key_path: key.to_path_buf(),
            current: RwLock::new(Arc::new(current)),
            seen: Mutex::new(seen),
        }))
    }

    /// The pair new handshakes present.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().clone()
    }

    /// Reload when either file changed since it was last read; `Some(outcome)` when it
    /// tried.
    pub fn reload_if_changed(&self) -> Option<Result<(), TlsError>> {
        let now = FileStamp::of(&self.cert_path, &self.key_path);
        {
            let mut seen = self.seen.lock();
            if *seen == now {
                return None;
            }
            *seen = now;
        }
        Some(self.reload())
    }

    /// Read both files again; on success new handshakes present the new pair, on
    /// failure the previous one stays. Logged and counted either way.
    pub fn reload(&self) -> Result<(), TlsError> {
        match read_pair(&self.cert_path, &self.key_path) {
            Ok(pair) => {
                record_expiry("listener", self.listener, &pair.cert);
                *self.current.write() = Arc::new(pair);
                crate::metrics::tls_certificate_reload(self.listener, "loaded");
                tracing::info!(
                    listener = self.listener,
                    cert = %self.cert_path.display(),
                    "TLS certificate reloaded; new connections get it"
                );
                Ok(())
            }
            Err(e) => {
                crate::metrics::tls_certificate_reload(self.listener, "refused");
                tracing::error!(
                    listener = self.listener,
                    error = %e,
                    "new TLS certificate refused; the previous one keeps serving"
                );
                Err(e)
            }
        }
    }

    /// Check the files every [`RELOAD_POLL`] and reload on SIGHUP, until `stop`.
    pub fn spawn_watcher(self: &Arc<Self>, stop: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut hangup = match tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::hangup(),
            ) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "no SIGHUP handler; certificates reload on file change only");
                    None
                }
            };
            let mut tick = tokio::time::interval(RELOAD_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {
                        let _ = this.reload_if_changed();
                    }
                    Some(()) = async {
                        match hangup.as_mut() {
                            Some(h) => h.recv().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        *this.seen.lock() = FileStamp::of(&this.cert_path, &this.key_path);
                        let _ = this.reload();
                    }
                }
            }
        });
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert)?;
    let key_der = load_key(key)?;
    CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| TlsError::File {
        path: key.to_path_buf(),
        reason: format!("does not fit the certificate in {}: {e}", cert.display()),
    })
}

/// A listener's server configuration: TLS 1.2+, ALPN `h2` then `http/1.1`, the
/// reloading certificate, and — with `client_ca_file` — a client certificate signed by
/// that CA required at the handshake (it adds to the bearer token, never replaces it).
pub fn server_config(
    cert: Arc<ReloadingCert>,
    client_ca_file: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .map_err(|e| TlsError::Config(format!("TLS versions: {e}")))?;
    let builder = match client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_ca_file(path)? {
                roots.add(c).map_err(|e| TlsError::File {
                    path: path.to_path_buf(),
                    reason: format!("not a usable CA certificate: {e}"),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::File {
                    path: path.to_path_buf(),
                    reason: format!("cannot verify clients with it: {e}"),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
