//! Configuration contract (docs/design.md "Configuration contract"): TOML file, env
//! overrides for secrets, validated once at start-up with errors naming the key and the
//! problem.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The dev HS256 secret shipped in `config/taskgate.toml`; refusing it on a
/// non-loopback listener is part of the hardening in docs/design.md §12 "HTTP front".
pub const SHIPPED_DEV_SECRET: &str = "taskgate-dev-secret-change-me-0123456789abcdef";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config key `{key}`: {problem}")]
    Invalid { key: String, problem: String },
}

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

/// A certificate and its key: both set or neither.
fn tls_pair(
    cert_key: &str,
    cert: &Option<PathBuf>,
    key_key: &str,
    key: &Option<PathBuf>,
) -> Result<(), ConfigError> {
    match (cert, key) {
        (Some(_), None) => Err(invalid(key_key, format!("required with {cert_key}"))),
        (None, Some(_)) => Err(invalid(cert_key, format!("required with {key_key}"))),
        _ => Ok(()),
    }
}

/// The shipped `config/taskgate.toml`, compiled in so the file and the binary's
/// default cannot drift apart.
pub const SHIPPED_DEFAULT: &str = include_str!("../config/taskgate.toml");

/// Where `taskgate` looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "config/taskgate.toml";

/// The paths the front answers itself before any upstream route (its path step,
/// and the `metrics_listen` listener): an upstream configured on one would be
/// unreachable, so the configuration refuses it.
pub const OPERATIONAL_PATHS: [&str; 4] = ["/metrics", "/healthz", "/readyz", "/livez"];

/// Where a configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    File(PathBuf),
    /// [`SHIPPED_DEFAULT`]: no `--config` and no `./config/taskgate.toml`.
    Embedded,
}

impl ConfigSource {
    /// `--config` when given; else `./config/taskgate.toml` when it exists; else the
    /// embedded default, so the binary works outside the repository.
    pub fn resolve(explicit: Option<PathBuf>) -> Self {
        match explicit {
            Some(path) => Self::File(path),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                Self::File(PathBuf::from(DEFAULT_CONFIG_PATH))
            }
            None => Self::Embedded,
        }
    }

    /// The file's path (empty for the embedded default) and its text.
    fn read(&self) -> Result<(PathBuf, String), ConfigError> {
        match self {
            Self::File(path) => std::fs::read_to_string(path)
                .map(|text| (path.clone(), text))
                .map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                }),
            Self::Embedded => Ok((PathBuf::new(), SHIPPED_DEFAULT.to_string())),
        }
    }

    /// What the start-up log says about the source.
    pub fn describe(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Embedded => {
                "the built-in default (no --config, no ./config/taskgate.toml)".into()
            }
        }
    }
}

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
    #[serde(default, rename = "upstream")]
    pub upstreams: Vec<UpstreamConfig>,
    /// `[edge]`: read by `taskgate edge` only ([`EdgeConfig::from_source`]); a replica
    /// checks it when present, so one file can hold both.
    #[serde(default)]
    pub edge: Option<EdgeConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub max_body_bytes: usize,
    pub allowed_origins: Vec<String>,
    pub allowed_hosts: Vec<String>,
    pub keepalive_ms: u64,
    pub max_connections: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    /// An HTTP/1 keep-alive or h2c connection with no request in flight is closed after
    /// this long (a stream sending SSE is in flight, never idle).
    pub idle_timeout_ms: u64,
    pub drain_grace_ms: u64,
    pub metrics_listen: Option<String>,
    /// Public base URL (for RFC 9728 metadata); default `http://{listen}`.
    pub public_url: Option<String>,
    /// `text` or `json` log lines.
    pub log_format: String,
    /// This gateway's stable identity across restarts; names its directory under
    /// `store.runtime_dir`. Default: see [`Config::replica_id`].
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
            keepalive_ms: 15_000,
            max_connections: 10_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            drain_grace_ms: 30_000,
            metrics_listen: None,
            public_url: None,
            log_format: "text".into(),
            replica_id: None,
            tls_cert: None,
            tls_key: None,
            client_ca_file: None,
            metrics_tls_cert: None,
            metrics_tls_key: None,
        }
    }
}

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
    pub sweep_interval_ms: u64,
    pub tombstone_ttl_ms: u64,
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
    pub lease_ms: u64,
    /// postgres: how often a replica renews its lease.
    pub lease_renew_ms: u64,
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
            cache_capacity_bytes: 268_435_456,
            sweep_interval_ms: 5_000,
            tombstone_ttl_ms: 86_400_000,
            runtime_dir: None,
            url: None,
            url_env: None,
            pool_size: 16,
            schema: "taskgate".into(),
            lease_ms: 10_000,
            lease_renew_ms: 2_000,
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

/// Longest replica id (it becomes a directory name).
const MAX_REPLICA_ID: usize = 128;

/// Whether `id` can be used as a directory name as it is: ASCII letters, digits, `.`,
/// `_` and `-`, not starting with `.` (no `.`/`..`, no hidden directories).
fn is_replica_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REPLICA_ID
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Turn `raw` (a host name plus port) into a valid replica id: every other character
/// becomes `_`, leading dots are dropped, the length is capped.
fn sanitize_replica_id(raw: &str) -> String {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Jwt,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub tenant_claim: String,
    pub algorithms: Vec<String>,
    pub leeway_s: u64,
    pub resource: Option<String>,
    pub hs256_secret: Option<String>,
    pub hs256_secret_env: Option<String>,
    pub public_key_pem: Option<String>,
    pub jwks_file: Option<PathBuf>,
    pub jwks_url: Option<String>,
    /// Extra CA bundle (PEM) trusted for an `https://` `jwks_url`, besides the system
    /// roots.
    pub jwks_ca_file: Option<PathBuf>,
    pub required_scope: Option<String>,
    pub request_state_key_env: Option<String>,
    /// Minimum interval between JWKS refetches triggered by an unknown `kid`.
    pub jwks_refresh_min_ms: u64,
    /// How long a fetched JWKS is trusted before it is refetched.
    pub jwks_cache_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::Jwt,
            issuer: None,
            audience: None,
            tenant_claim: "tenant".into(),
            algorithms: vec!["HS256".into()],
            leeway_s: 30,
            resource: None,
            hs256_secret: None,
            hs256_secret_env: None,
            public_key_pem: None,
            jwks_file: None,
            jwks_url: None,
            jwks_ca_file: None,
            required_scope: None,
            request_state_key_env: None,
            jwks_refresh_min_ms: 10_000,
            jwks_cache_ms: 300_000,
        }
    }
}

impl AuthConfig {
    /// The HS256 secret after env override: `hs256_secret_env` names a variable that,
    /// when set, wins over the inline `hs256_secret`; `TASKGATE_HS256_SECRET` always wins.
    pub fn resolved_hs256_secret(&self) -> Option<String> {
        if let Ok(v) = std::env::var("TASKGATE_HS256_SECRET")
            && !v.is_empty()
        {
            return Some(v);
        }
        if let Some(name) = &self.hs256_secret_env
            && let Ok(v) = std::env::var(name)
            && !v.is_empty()
        {
            return Some(v);
        }
        self.hs256_secret.clone()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    pub promote_after_ms: u64,
    pub ttl_ms: u64,
    pub result_retention_ms: u64,
    pub poll_interval_ms: u64,
    pub max_poll_interval_ms: u64,
    pub sync_timeout_ms: u64,
    pub input_timeout_ms: u64,
    pub input_gather_ms: u64,
    pub max_result_bytes: usize,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            promote_after_ms: 1_000,
            ttl_ms: 3_600_000,
            result_retention_ms: 3_600_000,
            poll_interval_ms: 1_000,
            max_poll_interval_ms: 30_000,
            sync_timeout_ms: 300_000,
            input_timeout_ms: 600_000,
            input_gather_ms: 50,
            max_result_bytes: 16_777_216,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub poll_burst: u32,
    pub requests_per_second: u32,
    pub max_live_tasks_per_tenant: u64,
    pub queue_size: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            poll_burst: 3,
            requests_per_second: 0,
            max_live_tasks_per_tenant: 10_000,
            queue_size: 1024,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    #[default]
    Shared,
    Tenant,
    Principal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TaskMode {
    #[default]
    Optional,
    Required,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnInput {
    #[default]
    Task,
    Mrtr,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    #[serde(default)]
    pub promote_after_ms: Option<u64>,
    #[serde(default)]
    pub call_timeout_ms: Option<u64>,
    #[serde(default)]
    pub stdio_processes: Option<usize>,
    /// Initialised idle children a stdio pool keeps ready beyond those in use
    /// (default 1; counted within `stdio_processes`, 0 when that is 1).
    #[serde(default)]
    pub stdio_spares: Option<usize>,
    #[serde(default = "default_cancel_grace_ms")]
    pub cancel_grace_ms: u64,
    #[serde(default = "default_idle_reap_ms")]
    pub idle_reap_ms: u64,
    #[serde(default)]
    pub isolation: Isolation,
    /// Upper bound for one stdio line or SSE event from this upstream.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// For an `https://` `url`: an extra CA bundle (PEM) trusted besides the system
    /// roots, and an optional client certificate and key for mutual TLS.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
}

fn default_path() -> String {
    "/mcp".into()
}
fn default_max_concurrency() -> usize {
    16
}
fn default_cancel_grace_ms() -> u64 {
    5_000
}
fn default_idle_reap_ms() -> u64 {
    300_000
}
fn default_max_message_bytes() -> usize {
    32 * 1024 * 1024
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    pub promote_after_ms: Option<u64>,
    #[serde(default)]
    pub task: TaskMode,
    #[serde(default)]
    pub on_input: OnInput,
    pub idempotency_argument: Option<String>,
    pub call_timeout_ms: Option<u64>,
}

/// Where an upstream lives, after validation.
#[derive(Debug, Clone)]
pub enum UpstreamTarget {
    Stdio { program: String, args: Vec<String> },
    Http { url: String },
}

impl UpstreamConfig {
    pub fn target(&self) -> UpstreamTarget {
        match (&self.command, &self.url) {
            (Some(cmd), _) => {
                let mut it = cmd.iter().cloned();
                let program = it.next().unwrap_or_default();
                let program = if program == "@self" {
                    std::env::current_exe()
                        .map(|p| p.to_string_lossy().into_owned())
                        .unwrap_or(program)
                } else {
                    program
                };
                UpstreamTarget::Stdio {
                    program,
                    args: it.collect(),
                }
            }
            (None, url) => UpstreamTarget::Http {
                url: url.clone().unwrap_or_default(),
            },
        }
    }

    pub fn stdio_processes(&self) -> usize {
        self.stdio_processes.unwrap_or(self.max_concurrency).max(1)
    }

    /// Spares per pool: a single-child pool has none (its one child is the spare).
    pub fn stdio_spares(&self) -> usize {
        let processes = self.stdio_processes();
        if processes == 1 {
            0
        } else {
            self.stdio_spares.unwrap_or(1).min(processes)
        }
    }

    /// Static upstream headers with `${VAR}` expanded from the environment.
    pub fn resolved_headers(&self) -> Result<Vec<(String, String)>, ConfigError> {
        self.headers
            .iter()
            .map(|(k, v)| {
                interpolate_env(v)
                    .map(|v| (k.clone(), v))
                    .map_err(|p| invalid(format!("upstream.{}.headers.{k}", self.name), p))
            })
            .collect()
    }
}

/// Expand `${NAME}` from the environment; a missing variable is an error, not "".
pub fn interpolate_env(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("unterminated `${` in value".into());
        };
        let name = &after[..end];
        match std::env::var(name) {
            Ok(v) => out.push_str(&v),
            Err(_) => return Err(format!("environment variable `{name}` is not set")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
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
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.server
            .listen
            .parse()
            .map_err(|e| invalid("server.listen", format!("not a socket address: {e}")))
    }

    /// `server.replica_id`, or `<host name>-<port of server.listen>` made safe for a
    /// directory name. The configured port, not the bound one: with `listen = "…:0"`
    /// the id is `<host>-0`, so it stays the same across restarts (a restart must find
    /// the pid records of the run before it).
    pub fn replica_id(&self) -> String {
        if let Some(id) = &self.server.replica_id {
            return id.clone();
        }
        let port = self.listen_addr().map(|a| a.port()).unwrap_or_default();
        sanitize_replica_id(&format!("{}-{port}", host_name()))
    }

    /// The directory holding this replica's stdio pid records (README "Configuration").
    pub fn replica_run_dir(&self) -> PathBuf {
        self.store.runtime_dir().join(self.replica_id())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(e) = &self.edge {
            e.validate()?;
        }
        let listen = self.listen_addr()?;
        if let Some(m) = &self.server.metrics_listen {
            m.parse::<SocketAddr>().map_err(|e| {
                invalid(
                    "server.metrics_listen",
                    format!("not a socket address: {e}"),
                )
            })?;
        }
        let s = &self.server;
        tls_pair("server.tls_cert", &s.tls_cert, "server.tls_key", &s.tls_key)?;
        if s.client_ca_file.is_some() && s.tls_cert.is_none() {
            return Err(invalid(
                "server.client_ca_file",
                "needs server.tls_cert and server.tls_key (client certificates are checked in the TLS handshake)",
            ));
        }
        tls_pair(
            "server.metrics_tls_cert",
            &s.metrics_tls_cert,
            "server.metrics_tls_key",
            &s.metrics_tls_key,
        )?;
        if s.metrics_tls_cert.is_some() && s.metrics_listen.is_none() {
            return Err(invalid(
                "server.metrics_tls_cert",
                "needs server.metrics_listen",
            ));
        }
        if self.server.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be > 0"));
        }
        if self.server.keepalive_ms == 0 {
            return Err(invalid("server.keepalive_ms", "must be > 0"));
        }
        if self.server.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be > 0"));
        }
        if self.server.header_timeout_ms == 0 {
            return Err(invalid("server.header_timeout_ms", "must be > 0"));
        }
        if self.server.idle_timeout_ms == 0 {
            return Err(invalid("server.idle_timeout_ms", "must be > 0"));
        }
        if !matches!(self.server.log_format.as_str(), "text" | "json") {
            return Err(invalid("server.log_format", "must be \"text\" or \"json\""));
        }
        if let Some(id) = &self.server.replica_id
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
        if self
            .store
            .runtime_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(invalid("store.runtime_dir", "must not be empty"));
        }
        if self.store.backend == StoreBackend::Postgres {
            if self.store.url.is_some() && self.store.url_env.is_some() {
                return Err(invalid("store.url", "set `url` or `url_env`, not both"));
            }
            if self.store.url.is_none() && self.store.url_env.is_none() {
                return Err(invalid(
                    "store.url",
                    "backend \"postgres\" needs `url` or `url_env`",
                ));
            }
            if self.store.pool_size == 0 {
                return Err(invalid("store.pool_size", "must be > 0"));
            }
            if self.store.lease_renew_ms == 0 {
                return Err(invalid("store.lease_renew_ms", "must be > 0"));
            }
            // At least two renewals per lease: one slow round trip must not lose it.
            if self.store.lease_ms < 2 * self.store.lease_renew_ms {
                return Err(invalid(
                    "store.lease_ms",
                    "must be at least twice store.lease_renew_ms",
                ));
            }
            if !is_pg_schema_name(&self.store.schema) {
                return Err(invalid(
                    "store.schema",
                    format!(
                        "must be 1-{MAX_PG_IDENTIFIER} lower-case ASCII letters, digits or '_', not starting with a digit or \"pg_\""
                    ),
                ));
            }
        }
        // auth
        match self.auth.mode {
            AuthMode::None => {
                if !listen.ip().is_loopback() {
                    return Err(invalid(
                        "auth.mode",
                        "\"none\" is only allowed on a loopback `server.listen`",
                    ));
                }
            }
            AuthMode::Jwt => {
                if self.auth.algorithms.is_empty() {
                    return Err(invalid(
                        "auth.algorithms",
                        "must name at least one algorithm",
                    ));
                }
                for a in &self.auth.algorithms {
                    if !matches!(a.as_str(), "HS256" | "RS256" | "ES256") {
                        return Err(invalid(
                            "auth.algorithms",
                            format!("unsupported algorithm {a:?} (HS256, RS256, ES256)"),
                        ));
                    }
                }
                let secret = self.auth.resolved_hs256_secret();
                let has_hs = self.auth.algorithms.iter().any(|a| a == "HS256");
                let has_asym = self.auth.algorithms.iter().any(|a| a != "HS256");
                if has_hs && secret.is_none() {
                    return Err(invalid(
                        "auth.hs256_secret",
                        "HS256 is enabled but no secret is set (hs256_secret, hs256_secret_env or TASKGATE_HS256_SECRET)",
                    ));
                }
                if let Some(s) = &secret {
                    if has_hs && s.len() < 32 {
                        return Err(invalid("auth.hs256_secret", "must be at least 32 bytes"));
                    }
                    if has_hs && s == SHIPPED_DEV_SECRET && !listen.ip().is_loopback() {
                        return Err(invalid(
                            "auth.hs256_secret",
                            "the shipped dev secret is refused on a non-loopback `server.listen`",
                        ));
                    }
                }
                let key_sources = [
                    self.auth.public_key_pem.is_some(),
                    self.auth.jwks_file.is_some(),
                    self.auth.jwks_url.is_some(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if has_asym && key_sources == 0 {
                    return Err(invalid(
                        "auth.algorithms",
                        "RS256/ES256 need one of public_key_pem, jwks_file, jwks_url",
                    ));
                }
                if key_sources > 1 {
                    return Err(invalid(
                        "auth",
                        "set only one of public_key_pem, jwks_file, jwks_url",
                    ));
                }
                match &self.auth.jwks_url {
                    Some(u) if !u.starts_with("http://") && !u.starts_with("https://") => {
                        return Err(invalid(
                            "auth.jwks_url",
                            "must be an http:// or https:// URL",
                        ));
                    }
                    Some(u) if u.starts_with("https://") => {}
                    _ if self.auth.jwks_ca_file.is_some() => {
                        return Err(invalid(
                            "auth.jwks_ca_file",
                            "only applies to an https:// jwks_url",
                        ));
                    }
                    _ => {}
                }
                if self.auth.tenant_claim.is_empty() {
                    return Err(invalid("auth.tenant_claim", "must not be empty"));
                }
            }
        }
        // tasks
        let t = &self.tasks;
        if t.ttl_ms == 0 {
            return Err(invalid("tasks.ttl_ms", "must be > 0"));
        }
        if t.poll_interval_ms == 0 {
            return Err(invalid("tasks.poll_interval_ms", "must be > 0"));
        }
        if t.max_poll_interval_ms < t.poll_interval_ms {
            return Err(invalid(
                "tasks.max_poll_interval_ms",
                "must be >= tasks.poll_interval_ms",
            ));
        }
        if t.sync_timeout_ms == 0 {
            return Err(invalid("tasks.sync_timeout_ms", "must be > 0"));
        }
        // upstreams
        if self.upstreams.is_empty() {
            return Err(invalid("upstream", "at least one [[upstream]] is required"));
        }
        let mut names = std::collections::HashSet::new();
        let mut paths = std::collections::HashSet::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let key = |k: &str| format!("upstream[{i}].{k}");
            if u.name.is_empty() {
                return Err(invalid(key("name"), "must not be empty"));
            }
            if !names.insert(u.name.clone()) {
                return Err(invalid(key("name"), format!("duplicate name {:?}", u.name)));
            }
            if !u.path.starts_with('/') || u.path.starts_with("/.well-known") {
                return Err(invalid(
                    key("path"),
                    "must start with '/' and not be under /.well-known",
                ));
            }
            if OPERATIONAL_PATHS.contains(&u.path.as_str()) {
                return Err(invalid(
                    key("path"),
                    "collides with an operational endpoint",
                ));
            }
            if !paths.insert(u.path.clone()) {
                return Err(invalid(key("path"), format!("duplicate path {:?}", u.path)));
            }
            match (&u.command, &u.url) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        key("command"),
                        "set either `command` or `url`, not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        key("command"),
                        "one of `command` or `url` is required",
                    ));
                }
                (Some(c), None) if c.is_empty() || c[0].is_empty() => {
                    return Err(invalid(key("command"), "must name a program"));
                }
                (None, Some(url))
                    if !url.starts_with("http://") && !url.starts_with("https://") =>
                {
                    return Err(invalid(key("url"), "must be an http:// or https:// URL"));
                }
                _ => {}
            }
            let https = u
                .url
                .as_deref()
                .is_some_and(|url| url.starts_with("https://"));
            for (name, set) in [
                ("ca_file", u.ca_file.is_some()),
                ("client_cert", u.client_cert.is_some()),
                ("client_key", u.client_key.is_some()),
            ] {
                if set && !https {
                    return Err(invalid(key(name), "only applies to an https:// url"));
                }
            }
            if u.client_cert.is_some() != u.client_key.is_some() {
                return Err(invalid(
                    key("client_cert"),
                    "client_cert and client_key go together",
                ));
            }
            if u.max_concurrency == 0 {
                return Err(invalid(key("max_concurrency"), "must be > 0"));
            }
            if u.stdio_processes == Some(0) {
                return Err(invalid(key("stdio_processes"), "must be > 0"));
            }
            if let Some(spares) = u.stdio_spares
                && spares > u.stdio_processes()
            {
                return Err(invalid(
                    key("stdio_spares"),
                    "must be <= stdio_processes (spares are counted within the pool)",
                ));
            }
            if u.max_message_bytes < 1024 {
                return Err(invalid(key("max_message_bytes"), "must be >= 1024"));
            }
            for (k, v) in &u.headers {
                if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    return Err(invalid(
                        key(&format!("headers.{k}")),
                        "not a valid header name",
                    ));
                }
                interpolate_env(v).map_err(|p| invalid(key(&format!("headers.{k}")), p))?;
            }
        }
        Ok(())
    }
}

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
    pub health_interval_ms: u64,
    /// Graceful restart and upgrade: how long the old process keeps serving its
    /// connections after handing over the listener (pingora `grace_period_seconds`).
    pub grace_period_s: u64,
    /// pingora's pid file (written when daemonised).
    pub pid_file: PathBuf,
    /// The unix socket the listener is handed over on during an upgrade.
    pub upgrade_sock: PathBuf,
    /// Requests in flight at the edge at once; past it the edge answers 503.
    pub max_connections: usize,
    /// `"text"` or `"json"` lines on stderr, as `server.log_format` for a replica.
    pub log_format: String,
    /// TLS on the edge's listener: certificate chain and key, PEM.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA bundle (PEM) trusted for `https://` replicas, instead of the system roots
    /// (the replicas are the operator's own; pingora's connector takes one store).
    pub replica_ca_file: Option<PathBuf>,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            replicas: Vec::new(),
            health_interval_ms: 1000,
            grace_period_s: 30,
            pid_file: PathBuf::from("data/edge.pid"),
            upgrade_sock: PathBuf::from("data/edge-upgrade.sock"),
            max_connections: 10_000,
            log_format: "text".into(),
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
        let edge = only
            .edge
            .ok_or_else(|| invalid("edge", "`taskgate edge` needs an [edge] table"))?;
        edge.validate()?;
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
        if self.health_interval_ms == 0 {
            return Err(invalid("edge.health_interval_ms", "must be > 0"));
        }
        if self.max_connections == 0 {
            return Err(invalid("edge.max_connections", "must be > 0"));
        }
        if !matches!(self.log_format.as_str(), "text" | "json") {
            return Err(invalid("edge.log_format", "must be \"text\" or \"json\""));
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
[auth]
mode = "none"
[[upstream]]
name = "demo"
command = ["@self", "demo-upstream"]
"#;

    const EDGE: &str = "[edge]\nlisten = \"127.0.0.1:8000\"\nreplicas = [\"http://127.0.0.1:8081\", \"http://localhost:8082/\"]\n";

    #[test]
    fn no_upstream_on_an_operational_path() {
        for path in OPERATIONAL_PATHS {
            let text = MIN.replace(
                "name = \"demo\"",
                &format!("name = \"demo\"\npath = \"{path}\""),
            );
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(err.contains("operational endpoint"), "{path}: {err}");
        }
    }

    #[test]
    fn edge_table_gets_defaults_and_parses_replicas() {
        let e = EdgeConfig::parse(EDGE).unwrap();
        assert_eq!(e.health_interval_ms, 1000);
        assert_eq!(e.grace_period_s, 30);
        assert_eq!(e.max_connections, 10_000);
        assert_eq!(e.log_format, "text");
        let urls = e.replica_urls().unwrap();
        assert_eq!(urls[0].authority(), "127.0.0.1:8081");
        assert_eq!(
            urls[1],
            ReplicaUrl {
                host: "localhost".into(),
                port: 8082,
                tls: false,
            }
        );
        // Other tables are a replica's business; the edge ignores them.
        let both = format!("{MIN}{EDGE}");
        assert!(EdgeConfig::parse(&both).is_ok());
        // And a replica accepts (and checks) an [edge] table.
        assert!(Config::parse(&both).unwrap().edge.is_some());
    }

    #[test]
    fn edge_errors_name_the_key() {
        let err = |text: &str| EdgeConfig::parse(text).unwrap_err().to_string();
        assert!(
            err("[server]\n").contains("`edge`"),
            "{}",
            err("[server]\n")
        );
        assert!(err("[edge]\nreplicas = [\"http://a:1\"]\n").contains("edge.listen"));
        assert!(err("[edge]\nlisten = \"127.0.0.1:1\"\n").contains("edge.replicas"));
        let port_0 = err("[edge]\nlisten = \"127.0.0.1:0\"\nreplicas = [\"http://a:1\"]\n");
        assert!(
            port_0.contains("edge.listen") && port_0.contains("fixed port"),
            "{port_0}"
        );
        for bad in [
            "https://a:1",
            "http://a",
            "http://a:1/mcp",
            "http://:1",
            "http://a:0",
            "a:1",
            "http://u@a:1",
        ] {
            let text = format!(
                "[edge]\nlisten = \"127.0.0.1:1\"\nreplicas = [\"http://b:2\", \"{bad}\"]\n"
            );
            assert!(
                err(&text).contains("edge.replicas[1]"),
                "{bad}: {}",
                err(&text)
            );
        }
        let dup =
            "[edge]\nlisten = \"127.0.0.1:1\"\nreplicas = [\"http://b:2\", \"http://b:2/\"]\n";
        assert!(err(dup).contains("listed twice"), "{}", err(dup));
        assert!(
            err(&format!("{EDGE}health_interval_ms = 0\n")).contains("edge.health_interval_ms")
        );
        assert!(err(&format!("{EDGE}max_connections = 0\n")).contains("edge.max_connections"));
        assert!(err(&format!("{EDGE}log_format = \"xml\"\n")).contains("edge.log_format"));
        assert!(err(&format!("{EDGE}pid_file = \"\"\n")).contains("edge.pid_file"));
        assert!(err(&format!("{EDGE}bogus = 1\n")).contains("bogus"));
        assert!(ReplicaUrl::parse("http://[::1]:9/").unwrap().authority() == "[::1]:9");
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MIN).unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:8080");
        assert_eq!(c.tasks.promote_after_ms, 1000);
        assert_eq!(c.upstreams[0].path, "/mcp");
        assert_eq!(c.upstreams[0].stdio_processes(), 16);
        assert_eq!(c.upstreams[0].stdio_spares(), 1);
    }

    #[test]
    fn stdio_spares_are_counted_within_the_pool() {
        let parse = |extra: &str| {
            Config::parse(&format!(
                "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"d\"\ncommand = [\"x\"]\n{extra}"
            ))
        };
        let one = parse("stdio_processes = 1\nstdio_spares = 1\n").unwrap();
        assert_eq!(
            one.upstreams[0].stdio_spares(),
            0,
            "a one-child pool has no spare"
        );
        let two = parse("stdio_processes = 4\nstdio_spares = 2\n").unwrap();
        assert_eq!(two.upstreams[0].stdio_spares(), 2);
        let err = parse("stdio_processes = 2\nstdio_spares = 3\n").unwrap_err();
        assert!(err.to_string().contains("stdio_spares"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("[server]\nlisten_addr = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
    }

    #[test]
    fn auth_none_refused_off_loopback() {
        let text = MIN.replace("[auth]", "[server]\nlisten = \"0.0.0.0:8080\"\n[auth]");
        let err = Config::parse(&text).unwrap_err();
        assert!(err.to_string().contains("auth.mode"), "{err}");
    }

    #[test]
    fn upstream_needs_command_or_url() {
        let err = Config::parse("[auth]\nmode=\"none\"\n[[upstream]]\nname=\"x\"\n").unwrap_err();
        assert!(err.to_string().contains("upstream[0].command"), "{err}");
    }

    #[test]
    fn hs256_needs_secret() {
        let err = Config::parse("[[upstream]]\nname=\"x\"\nurl=\"http://127.0.0.1:1/mcp\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("auth.hs256_secret"), "{err}");
    }

    #[test]
    fn replica_id_and_runtime_dir_defaults() {
        let c = Config::parse(MIN).unwrap();
        assert_eq!(c.store.runtime_dir(), PathBuf::from("data/run"));
        let id = c.replica_id();
        assert!(id.ends_with("-8080"), "{id}");
        assert!(is_replica_id(&id), "{id}");
        assert_eq!(c.replica_run_dir(), PathBuf::from("data/run").join(&id));

        let text = MIN.replace(
            "[auth]",
            "[server]\nreplica_id = \"gw-a.1\"\n[store]\npath = \"s\"\nruntime_dir = \"/tmp/r\"\n[auth]",
        );
        let c = Config::parse(&text).unwrap();
        assert_eq!(c.replica_id(), "gw-a.1");
        assert_eq!(c.replica_run_dir(), PathBuf::from("/tmp/r/gw-a.1"));
    }

    #[test]
    fn bad_replica_id_is_refused() {
        for bad in ["", "..", ".hidden", "a/b", "a b", "ü"] {
            let text = MIN.replace("[auth]", &format!("[server]\nreplica_id = {bad:?}\n[auth]"));
            let err = Config::parse(&text).unwrap_err();
            assert!(
                err.to_string().contains("server.replica_id"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn default_replica_id_is_sanitised() {
        assert_eq!(sanitize_replica_id("host/x y-8080"), "host_x_y-8080");
        assert_eq!(sanitize_replica_id("..-0"), "-0");
        assert_eq!(sanitize_replica_id("..."), "taskgate");
        assert_eq!(sanitize_replica_id(&"h".repeat(300)).len(), MAX_REPLICA_ID);
        assert!(is_replica_id(&sanitize_replica_id("hôst:name-1")));
    }

    #[test]
    fn env_interpolation() {
        // SAFETY: test-only, single-threaded use of a unique variable name.
        unsafe { std::env::set_var("TG_TEST_TOKEN_X", "abc") };
        assert_eq!(
            interpolate_env("Bearer ${TG_TEST_TOKEN_X}").unwrap(),
            "Bearer abc"
        );
        assert!(interpolate_env("${TG_TEST_NOPE_NOPE}").is_err());
    }

    #[test]
    fn store_backend_keys() {
        let c = Config::parse(MIN).unwrap();
        assert_eq!(c.store.backend, StoreBackend::Sled);
        let pg = |keys: &str| MIN.replace("[auth]", &format!("[store]\n{keys}\n[auth]"));
        let c = Config::parse(&pg("backend = \"postgres\"\nurl = \"postgres://u@h/db\"")).unwrap();
        assert_eq!(c.store.backend, StoreBackend::Postgres);
        assert_eq!(
            (c.store.pool_size, c.store.schema.as_str()),
            (16, "taskgate")
        );
        assert_eq!(c.store.postgres_url().unwrap(), "postgres://u@h/db");
        // SAFETY: test-only, single-threaded use of a unique variable name.
        unsafe { std::env::set_var("TG_TEST_PG_URL_X", "postgres://e@h/db") };
        let c = Config::parse(&pg(
            "backend = \"postgres\"\nurl_env = \"TG_TEST_PG_URL_X\"",
        ))
        .unwrap();
        assert_eq!(c.store.postgres_url().unwrap(), "postgres://e@h/db");
        for (keys, named) in [
            ("backend = \"postgres\"", "store.url"),
            (
                "backend = \"postgres\"\nurl = \"x\"\nurl_env = \"Y\"",
                "store.url",
            ),
            (
                "backend = \"postgres\"\nurl = \"x\"\npool_size = 0",
                "store.pool_size",
            ),
            (
                "backend = \"postgres\"\nurl = \"x\"\nschema = \"Bad-Name\"",
                "store.schema",
            ),
            (
                "backend = \"postgres\"\nurl = \"x\"\nschema = \"pg_x\"",
                "store.schema",
            ),
        ] {
            let err = Config::parse(&pg(keys)).unwrap_err();
            assert!(err.to_string().contains(named), "{keys}: {err}");
        }
        assert!(Config::parse(&pg("backend = \"mysql\"")).is_err());
    }
}
