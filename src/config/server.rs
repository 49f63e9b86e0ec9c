//! `[server]`: the client listener, its limits and timeouts, TLS, logging and the
//! replica's identity.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid, tls_pair};
use super::log_format::LogFormat;
use super::millis::millis;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub max_body_bytes: usize,
    pub allowed_origins: Vec<String>,
    pub allowed_hosts: Vec<String>,
    #[serde(rename = "keepalive_ms", deserialize_with = "millis")]
    pub keepalive: Duration,
    pub max_connections: usize,
    #[serde(rename = "header_timeout_ms", deserialize_with = "millis")]
    pub header_timeout: Duration,
    #[serde(rename = "body_timeout_ms", deserialize_with = "millis")]
    pub body_timeout: Duration,
    /// An HTTP/1 keep-alive or h2c connection with no request in flight is closed after
    /// this long (a stream sending SSE is in flight, never idle).
    #[serde(rename = "idle_timeout_ms", deserialize_with = "millis")]
    pub idle_timeout: Duration,
    #[serde(rename = "drain_grace_ms", deserialize_with = "millis")]
    pub drain_grace: Duration,
    pub metrics_listen: Option<String>,
    /// Public base URL (for RFC 9728 metadata); default `http://{listen}`.
    pub public_url: Option<String>,
    /// `log_format` as written; [`Self::log_format`] is read from it at load.
    #[serde(rename = "log_format")]
    log_format_written: String,
    /// `text` or `json` log lines.
    #[serde(skip)]
    pub log_format: LogFormat,
    /// This gateway's stable identity across restarts; names its directory under
    /// `store.runtime_dir`. Default: see [`Self::replica_id()`].
    pub replica_id: Option<String>,
    /// TLS on the client listener: certificate chain and key, PEM (README "TLS").
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// With `tls_cert`: a client certificate signed by this CA is required at the
    /// handshake (in addition to the bearer token).
    pub client_ca_file: Option<PathBuf>,
    /// TLS on `metrics_listen`, separately from the client listener.
    pub metrics_tls_cert: Option<PathBuf>,
    pub metrics_tls_key: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 1_048_576,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            keepalive: Duration::from_millis(15_000),
            max_connections: 10_000,
            header_timeout: Duration::from_millis(10_000),
            body_timeout: Duration::from_millis(30_000),
            idle_timeout: Duration::from_millis(60_000),
            drain_grace: Duration::from_millis(30_000),
            metrics_listen: None,
            public_url: None,
            log_format_written: "text".into(),
            log_format: LogFormat::Text,
            replica_id: None,
            tls_cert: None,
            tls_key: None,
            client_ca_file: None,
            metrics_tls_cert: None,
            metrics_tls_key: None,
        }
    }
}

/// Longest replica id (it becomes a directory name).
pub(super) const MAX_REPLICA_ID: usize = 128;

/// Whether `id` can be used as a directory name as it is: ASCII letters, digits, `.`,
/// `_` and `-`, not starting with `.` (no `.`/`..`, no hidden directories).
pub(super) fn is_replica_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REPLICA_ID
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Turn `raw` (a host name plus port) into a valid replica id: every other character
/// becomes `_`, leading dots are dropped, the length is capped.
pub(super) fn sanitize_replica_id(raw: &str) -> String {
    let mut id: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .trim_start_matches('.')
        .to_string();
    id.truncate(MAX_REPLICA_ID);
    if id.is_empty() {
        id.push_str("taskgate");
    }
    id
}

/// The kernel's host name, or `localhost` if it cannot be read.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname(2) writes at most `buf.len()` bytes into `buf`, which lives
    // for the whole call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(h) if !h.is_empty() => h.to_string(),
        _ => "localhost".into(),
    }
}

impl ServerConfig {
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen
            .parse()
            .map_err(|e| invalid("server.listen", format!("not a socket address: {e}")))
    }

    /// `replica_id`, or `<host name>-<port of listen>` made safe for a directory name.
    /// The configured port, not the bound one: with `listen = "…:0"` the id is
    /// `<host>-0`, so it stays the same across restarts (a restart must find the pid
    /// records of the run before it).
    pub fn replica_id(&self) -> String {
        if let Some(id) = &self.replica_id {
            return id.clone();
        }
        let port = self.listen_addr().map(|a| a.port()).unwrap_or_default();
        sanitize_replica_id(&format!("{}-{port}", host_name()))
    }

    /// Build the typed values from the keys read as written (once, after reading the
    /// file).
    pub(super) fn build(&mut self) -> Result<(), ConfigError> {
        self.log_format = LogFormat::from_key("server.log_format", &self.log_format_written)?;
        Ok(())
    }

    /// Check `[server]`; the parsed `listen` address is what `[auth]` checks against.
    pub(super) fn validate(&self) -> Result<SocketAddr, ConfigError> {
        let listen = self.listen_addr()?;
        if let Some(m) = &self.metrics_listen {
            m.parse::<SocketAddr>().map_err(|e| {
                invalid(
                    "server.metrics_listen",
                    format!("not a socket address: {e}"),
                )
            })?;
        }
        tls_pair(
            "server.tls_cert",
            &self.tls_cert,
            "server.tls_key",
            &self.tls_key,
        )?;
        if self.client_ca_file.is_some() && self.tls_cert.is_none() {
            return Err(invalid(
                "server.client_ca_file",
                "needs server.tls_cert and server.tls_key (client certificates are checked in the TLS handshake)",
            ));
        }
        tls_pair(
            "server.metrics_tls_cert",
            &self.metrics_tls_cert,
            "server.metrics_tls_key",
            &self.metrics_tls_key,
        )?;
        if self.metrics_tls_cert.is_some() && self.metrics_listen.is_none() {
            return Err(invalid(
                "server.metrics_tls_cert",
                "needs server.metrics_listen",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be > 0"));
        }
        if self.keepalive.is_zero() {
            return Err(invalid("server.keepalive_ms", "must be > 0"));
        }
        if self.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be > 0"));
        }
        if self.header_timeout.is_zero() {
            return Err(invalid("server.header_timeout_ms", "must be > 0"));
        }
        if self.idle_timeout.is_zero() {
            return Err(invalid("server.idle_timeout_ms", "must be > 0"));
        }
        if let Some(id) = &self.replica_id
            && !is_replica_id(id)
        {
            // A configured id is used as a directory name verbatim, never rewritten:
            // two ids that sanitised to one name would share (and kill) pid records.
            return Err(invalid(
                "server.replica_id",
                format!(
                    "must be 1-{MAX_REPLICA_ID} ASCII letters, digits, '.', '_' or '-', not starting with '.'"
                ),
            ));
        }
        Ok(listen)
    }
}
