//! `[edge]`: `taskgate edge`, the pingora front for several replicas.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid, tls_pair};
use super::log_format::LogFormat;
use super::millis::millis;
use super::source::ConfigSource;

/// `[edge]`: `taskgate edge`, the pingora front for several replicas (docs/design.md
/// §21, README "Running several replicas behind the edge").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EdgeConfig {
    /// The edge's own listen address (required).
    pub listen: String,
    /// The replicas, as `http://host:port` (required, at least one, no duplicates).
    pub replicas: Vec<String>,
    /// Active `/livez` checks of every replica, this often.
    #[serde(rename = "health_interval_ms", deserialize_with = "millis")]
    pub health_interval: Duration,
    /// Graceful restart and upgrade: how long the old process keeps serving its
    /// connections after handing over the listener (pingora `grace_period_seconds`).
    pub grace_period_s: u64,
    /// pingora's pid file (written when daemonised).
    pub pid_file: PathBuf,
    /// The unix socket the listener is handed over on during an upgrade.
    pub upgrade_sock: PathBuf,
    /// Requests in flight at the edge at once; past it the edge answers 503.
    pub max_connections: usize,
    /// `log_format` as written; [`Self::log_format`] is read from it at load.
    #[serde(rename = "log_format")]
    log_format_written: String,
    /// `"text"` or `"json"` lines on stderr, as `server.log_format` for a replica.
    #[serde(skip)]
    pub log_format: LogFormat,
    /// TLS on the edge's listener: certificate chain and key, PEM.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA bundle (PEM) trusted for `https://` replicas, instead of the system roots
    /// (the replicas are the operator's own; pingora's connector takes one store).
    pub replica_ca_file: Option<PathBuf>,
    /// `[telemetry]` of the same file (the edge's own spans).
    #[serde(skip)]
    pub telemetry: super::TelemetryConfig,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            replicas: Vec::new(),
            health_interval: Duration::from_millis(1000),
            grace_period_s: 30,
            pid_file: PathBuf::from("data/edge.pid"),
            upgrade_sock: PathBuf::from("data/edge-upgrade.sock"),
            max_connections: 10_000,
            log_format_written: "text".into(),
            log_format: LogFormat::Text,
            telemetry: super::TelemetryConfig::default(),
            tls_cert: None,
            tls_key: None,
            replica_ca_file: None,
        }
    }
}

/// One replica of `edge.replicas`: where to connect (`host:port`, resolved at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaUrl {
    pub host: String,
    pub port: u16,
    /// `https://`: the edge speaks TLS to this replica.
    pub tls: bool,
}

impl ReplicaUrl {
    /// `http://host:port` or `https://host:port` with an optional trailing `/`; no
    /// path, query or user info.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (rest, tls) = match (s.strip_prefix("http://"), s.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            (None, None) => return Err(format!("{s:?}: must start with http:// or https://")),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(format!("{s:?}: must be http(s)://host:port with no path"));
        }
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?}: the port is required"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{s:?}: not a port number: {port:?}"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || host.contains(['[', ']']) {
            return Err(format!("{s:?}: no host"));
        }
        if host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{s:?}: not a host: {host:?}"));
        }
        Ok(Self {
            host: host.to_string(),
            port,
            tls,
        })
    }

    /// `host:port` as `ToSocketAddrs` reads it (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A file read by `taskgate edge`: `[edge]` only; other tables (a replica's) are
/// ignored, so one file may configure both.
#[derive(Debug, Clone, Default, Deserialize)]
struct EdgeOnly {
    #[serde(default)]
    edge: Option<EdgeConfig>,
    /// The edge exports its spans like a replica (docs/design.md §24).
    #[serde(default)]
    telemetry: super::TelemetryConfig,
}

impl EdgeConfig {
    /// The `[edge]` table of `source`, validated; missing → an error naming it.
    pub fn from_source(source: &ConfigSource) -> Result<Self, ConfigError> {
        let (path, text) = source.read()?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse { path, message },
            other => other,
        })
    }

    /// The `[edge]` table of a TOML text, validated.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let only: EdgeOnly = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        let mut edge = only
            .edge
            .ok_or_else(|| invalid("edge", "`taskgate edge` needs an [edge] table"))?;
        edge.build()?;
        edge.validate()?;
        only.telemetry.validate()?;
        edge.telemetry = only.telemetry;
        Ok(edge)
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        if self.listen.is_empty() {
            return Err(invalid("edge.listen", "required (e.g. \"127.0.0.1:8000\")"));
        }
        self.listen
            .parse()
            .map_err(|e| invalid("edge.listen", format!("not a socket address: {e}")))
    }

    /// `edge.replicas`, parsed (validation guarantees they parse).
    pub fn replica_urls(&self) -> Result<Vec<ReplicaUrl>, ConfigError> {
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                ReplicaUrl::parse(r).map_err(|p| invalid(format!("edge.replicas[{i}]"), p))
            })
            .collect()
    }

    /// Build the typed values from the keys read as written (once, after reading the
    /// file).
    pub(super) fn build(&mut self) -> Result<(), ConfigError> {
        self.log_format = LogFormat::from_key("edge.log_format", &self.log_format_written)?;
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        // pingora binds the listener itself and does not tell which port it picked,
        // so a port of 0 would leave clients (and the "listening" line) without one.
        if self.listen_addr()?.port() == 0 {
            return Err(invalid(
                "edge.listen",
                "needs a fixed port (0 would pick one nobody is told)",
            ));
        }
        if self.replicas.is_empty() {
            return Err(invalid(
                "edge.replicas",
                "required: at least one \"http://host:port\"",
            ));
        }
        let urls = self.replica_urls()?;
        for (i, u) in urls.iter().enumerate() {
            if u.tls != urls[0].tls {
                return Err(invalid(
                    format!("edge.replicas[{i}]"),
                    "all replicas use the same scheme (http:// or https://)",
                ));
            }
            if urls[..i].iter().any(|o| o.authority() == u.authority()) {
                return Err(invalid(
                    format!("edge.replicas[{i}]"),
                    format!("{} is listed twice", u.authority()),
                ));
            }
        }
        if self.replica_ca_file.is_some() && !urls[0].tls {
            return Err(invalid(
                "edge.replica_ca_file",
                "only applies to https:// replicas",
            ));
        }
        tls_pair(
            "edge.tls_cert",
            &self.tls_cert,
            "edge.tls_key",
            &self.tls_key,
        )?;
        if self.health_interval.is_zero() {
            return Err(invalid("edge.health_interval_ms", "must be > 0"));
        }
        if self.max_connections == 0 {
            return Err(invalid("edge.max_connections", "must be > 0"));
        }
        for (key, p) in [
            ("edge.pid_file", &self.pid_file),
            ("edge.upgrade_sock", &self.upgrade_sock),
        ] {
            if p.as_os_str().is_empty() || p.to_str().is_none() {
                return Err(invalid(key, "must be a non-empty UTF-8 path"));
            }
        }
        Ok(())
    }
}
