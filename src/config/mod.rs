//! Configuration contract (docs/design.md "Configuration contract"): TOML file, env
//! overrides for secrets, validated once at start-up with errors naming the key and the
//! problem.
//!
//! One file per table (or small group of tables), each holding its struct(s), their
//! defaults and that table's validation; this file holds the whole [`Config`] and loads
//! it: serde reads the file, `Config::build` turns the values the file gives as
//! strings or as a choice of keys into their types, and each table's `validate` checks
//! the rest (ARCHITECTURE.md, `config/`).

mod admin;
mod auth;
mod edge;
mod error;
mod legacy;
mod log_format;
mod millis;
mod server;
mod source;
mod store;
mod tasks;
mod telemetry;
#[cfg(test)]
mod tests;
mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use admin::AdminConfig;
pub use auth::{AuthConfig, AuthMode, SHIPPED_DEV_SECRET};
pub use edge::{EdgeConfig, ReplicaUrl};
pub use error::ConfigError;
pub use legacy::LegacyConfig;
pub use log_format::LogFormat;
pub use millis::as_millis;
pub use server::ServerConfig;
pub use source::{ConfigSource, DEFAULT_CONFIG_PATH, SHIPPED_DEFAULT};
pub use store::{StoreBackend, StoreConfig, StorePooler, is_pg_schema_name};
pub use tasks::{LimitsConfig, TasksConfig};
pub use telemetry::{TelemetryConfig, TraceExport};
pub use upstream::{
    Isolation, OPERATIONAL_PATHS, OnInput, PlainClients, TaskMode, ToolConfig, UpstreamConfig,
    UpstreamTransport, interpolate_env,
};

/// The part of a configuration `taskgate token` needs: `[auth]` alone, so a config
/// file holding only that table (or one whose other tables are for another setup)
/// mints tokens.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuthOnly {
    #[serde(default)]
    pub auth: AuthConfig,
}

impl AuthOnly {
    pub fn from_source(source: &ConfigSource) -> Result<AuthConfig, ConfigError> {
        let (path, text) = source.read()?;
        let only: AuthOnly = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path,
            message: e.to_string(),
        })?;
        Ok(only.auth)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub tasks: TasksConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `[legacy]`: bounds on 2025-era client sessions (§22).
    #[serde(default)]
    pub legacy: LegacyConfig,
    /// `[admin]`: the operator API (§24).
    #[serde(default)]
    pub admin: AdminConfig,
    /// `[telemetry]`: OpenTelemetry traces (§24).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default, rename = "upstream")]
    pub upstreams: Vec<UpstreamConfig>,
    /// `[edge]`: read by `taskgate edge` only ([`EdgeConfig::from_source`]); a replica
    /// checks it when present, so one file can hold both.
    #[serde(default)]
    pub edge: Option<EdgeConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // Relative paths in the file (store.path, auth.jwks_file) resolve against the
        // working directory, like every other command-line tool.
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Load the configuration `source` names.
    pub fn from_source(source: &ConfigSource) -> Result<Self, ConfigError> {
        match source {
            ConfigSource::File(path) => Self::load(path),
            ConfigSource::Embedded => Self::parse(SHIPPED_DEFAULT),
        }
    }

    /// Check the configuration again after a command-line override changed it.
    pub fn revalidate(&self) -> Result<(), ConfigError> {
        self.validate()
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        cfg.build()?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.server.listen_addr()
    }

    /// `server.replica_id`, or `<host name>-<port of server.listen>` made safe for a
    /// directory name (see [`ServerConfig::replica_id`]).
    pub fn replica_id(&self) -> String {
        self.server.replica_id()
    }

    /// The directory holding this replica's stdio pid records (README "Configuration").
    pub fn replica_run_dir(&self) -> PathBuf {
        self.store.runtime_dir().join(self.replica_id())
    }

    /// Build the typed values the file gives as strings or as a choice of keys (the log
    /// formats, each upstream's transport), so a bad one is refused naming its key.
    fn build(&mut self) -> Result<(), ConfigError> {
        if let Some(e) = &mut self.edge {
            e.build()?;
        }
        self.server.build()?;
        for (i, u) in self.upstreams.iter_mut().enumerate() {
            u.build(i)?;
        }
        Ok(())
    }

    /// Each table's check, in the order of the file's tables; the first problem found
    /// is the error.
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(e) = &self.edge {
            e.validate()?;
        }
        let listen = self.server.validate()?;
        self.store.validate()?;
        self.auth.validate(listen)?;
        self.tasks.validate()?;
        self.legacy.validate()?;
        self.admin.validate()?;
        self.telemetry.validate()?;
        upstream::validate_upstreams(&self.upstreams)
    }
}
