//! `[store]`: which backend keeps the tasks, and its settings.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use super::millis::millis;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Which backend keeps the tasks (README "Store backends").
    pub backend: StoreBackend,
    /// sled: the store directory. Also the parent of the default `runtime_dir` on
    /// either backend.
    pub path: PathBuf,
    pub strict_fsync: bool,
    pub cache_capacity_bytes: u64,
    #[serde(rename = "sweep_interval_ms", deserialize_with = "millis")]
    pub sweep_interval: Duration,
    #[serde(rename = "tombstone_ttl_ms", deserialize_with = "millis")]
    pub tombstone_ttl: Duration,
    /// Where stdio pid records live (one directory per replica id). Default
    /// `<path>/run`: see [`StoreConfig::runtime_dir`].
    pub runtime_dir: Option<PathBuf>,
    /// postgres: the connection URL (`postgres://user@host:port/db`), or
    pub url: Option<String>,
    /// the name of an environment variable holding it (keeps passwords out of files).
    pub url_env: Option<String>,
    /// postgres: connections in the pool.
    pub pool_size: usize,
    /// postgres: the schema holding taskgate's tables (created by the migrations).
    pub schema: String,
    /// postgres: how long a replica's lease lasts past each renewal, on the database
    /// clock. A replica silent for this long loses its in-flight calls to the others
    /// (README "Several replicas").
    #[serde(rename = "lease_ms", deserialize_with = "millis")]
    pub lease: Duration,
    /// postgres: how often a replica renews its lease.
    #[serde(rename = "lease_renew_ms", deserialize_with = "millis")]
    pub lease_renew: Duration,
    /// postgres: what sits between the gateway and PostgreSQL (docs/design.md §27
    /// "Connection poolers").
    pub pooler: StorePooler,
}

/// `[store] pooler`: whether a connection pooler that hands out a server connection
/// per transaction sits in front of PostgreSQL (README "Behind a connection pooler").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorePooler {
    /// Each connection is the gateway's for its lifetime (PostgreSQL itself, or a
    /// pooler in session mode): session settings ride in the start-up packet.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`): nothing
    /// may outlive a transaction, so settings are `SET LOCAL` per transaction and no
    /// prepared statement is kept.
    Transaction,
}

/// `[store] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// Embedded, one process: the default.
    #[default]
    Sled,
    /// Shared by several replicas.
    Postgres,
}

/// Longest PostgreSQL identifier (NAMEDATALEN - 1).
const MAX_PG_IDENTIFIER: usize = 63;

/// Whether `s` is a schema name used as it is, without quoting: lower-case ASCII
/// letters, digits and `_`, not starting with a digit, not a `pg_` system name.
pub fn is_pg_schema_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PG_IDENTIFIER
        && !s.starts_with("pg_")
        && !s.as_bytes()[0].is_ascii_digit()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl StoreConfig {
    /// The PostgreSQL URL: `url`, or the value of the variable `url_env` names.
    pub fn postgres_url(&self) -> Result<String, ConfigError> {
        if let Some(u) = &self.url {
            return Ok(u.clone());
        }
        match &self.url_env {
            Some(name) => match std::env::var(name) {
                Ok(v) if !v.is_empty() => Ok(v),
                _ => Err(invalid(
                    "store.url_env",
                    format!("environment variable `{name}` is not set"),
                )),
            },
            None => Err(invalid(
                "store.url",
                "backend \"postgres\" needs `url` or `url_env`",
            )),
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Sled,
            path: PathBuf::from("data"),
            strict_fsync: false,
            // 16 MiB (256 MiB before): with 1M stored tasks the larger cache held RSS
            // near 600 MB while reads gained little (benches/RESULTS.md "Issue 32").
            cache_capacity_bytes: 16_777_216,
            sweep_interval: Duration::from_millis(5_000),
            tombstone_ttl: Duration::from_millis(86_400_000),
            runtime_dir: None,
            url: None,
            url_env: None,
            pool_size: 16,
            schema: "taskgate".into(),
            lease: Duration::from_millis(10_000),
            lease_renew: Duration::from_millis(2_000),
            pooler: StorePooler::None,
        }
    }
}

impl StoreConfig {
    /// `runtime_dir`, or `<path>/run` (`data/run` with the default `path`): next to the
    /// store by default, so gateways on different stores never share pid records
    /// unless told to.
    pub fn runtime_dir(&self) -> PathBuf {
        self.runtime_dir
            .clone()
            .unwrap_or_else(|| self.path.join("run"))
    }

    /// Where gateways before `runtime_dir` existed recorded their stdio children.
    pub fn legacy_pid_dir(&self) -> PathBuf {
        self.path.join("children")
    }
}

impl StoreConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self
            .runtime_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(invalid("store.runtime_dir", "must not be empty"));
        }
        if self.backend == StoreBackend::Postgres {
            if self.url.is_some() && self.url_env.is_some() {
                return Err(invalid("store.url", "set `url` or `url_env`, not both"));
            }
            if self.url.is_none() && self.url_env.is_none() {
                return Err(invalid(
                    "store.url",
                    "backend \"postgres\" needs `url` or `url_env`",
                ));
            }
            if self.pool_size == 0 {
                return Err(invalid("store.pool_size", "must be > 0"));
            }
            if self.lease_renew.is_zero() {
                return Err(invalid("store.lease_renew_ms", "must be > 0"));
            }
            // At least two renewals per lease: one slow round trip must not lose it.
            if self.lease < self.lease_renew.saturating_mul(2) {
                return Err(invalid(
                    "store.lease_ms",
                    "must be at least twice store.lease_renew_ms",
                ));
            }
            if !is_pg_schema_name(&self.schema) {
                return Err(invalid(
                    "store.schema",
                    format!(
                        "must be 1-{MAX_PG_IDENTIFIER} lower-case ASCII letters, digits or '_', not starting with a digit or \"pg_\""
                    ),
                ));
            }
        }
        Ok(())
    }
}
