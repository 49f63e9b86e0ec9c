//! `[[upstream]]` and its `[upstream.tools.<name>]` tables: the legacy servers
//! behind the gateway.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use super::millis::{millis, opt_millis};

/// The paths the front answers itself before any upstream route (its path step,
/// and the `metrics_listen` listener): an upstream configured on one would be
/// unreachable, so the configuration refuses it.
pub const OPERATIONAL_PATHS: [&str; 4] = ["/metrics", "/healthz", "/readyz", "/livez"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    #[default]
    Shared,
    Tenant,
    Principal,
    /// One upstream session or child pool per 2025-era client session
    /// (docs/design.md §22); a request without a session gets its principal's.
    Session,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TaskMode {
    #[default]
    Optional,
    Required,
    Never,
}

/// What a plain client (one that cannot take a task: docs/design.md §2) gets for a
/// call still running at the deadline (docs/design.md §28 "Task handles for plain
/// clients").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlainClients {
    /// The call is held until it ends or `sync_timeout_ms` passes.
    #[default]
    Hold,
    /// The call becomes a task, answered with a handle as an ordinary tool result.
    Handle,
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
    /// `command` and `url` as written (exactly one is set); [`Self::transport`] is
    /// built from them at load, and they are empty from then on.
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    url: Option<String>,
    /// Where the upstream lives, from `command` or `url`.
    #[serde(skip, default = "UpstreamTransport::not_built")]
    pub transport: UpstreamTransport,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    #[serde(default, rename = "promote_after_ms", deserialize_with = "opt_millis")]
    pub promote_after: Option<Duration>,
    #[serde(default, rename = "call_timeout_ms", deserialize_with = "opt_millis")]
    pub call_timeout: Option<Duration>,
    #[serde(default)]
    pub stdio_processes: Option<usize>,
    /// Initialised idle children a stdio pool keeps ready beyond those in use
    /// (default 1; counted within `stdio_processes`, 0 when that is 1).
    #[serde(default)]
    pub stdio_spares: Option<usize>,
    #[serde(
        default = "default_cancel_grace",
        rename = "cancel_grace_ms",
        deserialize_with = "millis"
    )]
    pub cancel_grace: Duration,
    #[serde(
        default = "default_idle_reap",
        rename = "idle_reap_ms",
        deserialize_with = "millis"
    )]
    pub idle_reap: Duration,
    #[serde(default)]
    pub isolation: Isolation,
    /// What plain clients get for a slow call, unless a tool says otherwise.
    #[serde(default)]
    pub plain_clients: PlainClients,
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
fn default_cancel_grace() -> Duration {
    Duration::from_millis(5_000)
}
fn default_idle_reap() -> Duration {
    Duration::from_millis(300_000)
}
fn default_max_message_bytes() -> usize {
    32 * 1024 * 1024
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    #[serde(default, rename = "promote_after_ms", deserialize_with = "opt_millis")]
    pub promote_after: Option<Duration>,
    #[serde(default)]
    pub task: TaskMode,
    #[serde(default)]
    pub on_input: OnInput,
    pub idempotency_argument: Option<String>,
    #[serde(default, rename = "call_timeout_ms", deserialize_with = "opt_millis")]
    pub call_timeout: Option<Duration>,
    /// Overrides the upstream's `plain_clients` for this tool.
    #[serde(default)]
    pub plain_clients: Option<PlainClients>,
}

/// Where an upstream lives: an upstream table names exactly one of `command` and
/// `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTransport {
    /// `command`: a child process spoken to over stdio; `"@self"` as the program is
    /// the running executable.
    Stdio { program: String, args: Vec<String> },
    /// `url`: an `http://` or `https://` MCP endpoint.
    Http { url: String },
}

impl UpstreamTransport {
    /// What an upstream holds between reading the file and [`UpstreamConfig::build`]
    /// (serde needs a value for a field no key fills); no loaded configuration keeps
    /// it.
    fn not_built() -> Self {
        Self::Http { url: String::new() }
    }

    /// An `https://` url: the only transport TLS settings apply to.
    pub fn is_https(&self) -> bool {
        matches!(self, Self::Http { url } if url.starts_with("https://"))
    }
}

impl UpstreamConfig {
    /// Build [`Self::transport`] from the `command`/`url` keys of `upstream[i]`
    /// (once, after reading the file).
    pub(super) fn build(&mut self, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("upstream[{i}].{k}");
        self.transport = match (self.command.take(), self.url.take()) {
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
            (Some(command), None) => {
                let mut words = command.into_iter();
                let program = match words.next() {
                    Some(p) if !p.is_empty() => p,
                    _ => return Err(invalid(key("command"), "must name a program")),
                };
                let program = if program == "@self" {
                    std::env::current_exe()
                        .map(|p| p.to_string_lossy().into_owned())
                        .unwrap_or(program)
                } else {
                    program
                };
                UpstreamTransport::Stdio {
                    program,
                    args: words.collect(),
                }
            }
            (None, Some(url)) => {
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    return Err(invalid(key("url"), "must be an http:// or https:// URL"));
                }
                UpstreamTransport::Http { url }
            }
        };
        Ok(())
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

/// Check every `[[upstream]]`: each on its own, and names and paths unique.
pub(super) fn validate_upstreams(upstreams: &[UpstreamConfig]) -> Result<(), ConfigError> {
    if upstreams.is_empty() {
        return Err(invalid("upstream", "at least one [[upstream]] is required"));
    }
    let mut names = HashSet::new();
    let mut paths = HashSet::new();
    for (i, u) in upstreams.iter().enumerate() {
        let key = |k: &str| format!("upstream[{i}].{k}");
        if u.name.is_empty() {
            return Err(invalid(key("name"), "must not be empty"));
        }
        if !names.insert(u.name.clone()) {
            return Err(invalid(key("name"), format!("duplicate name {:?}", u.name)));
        }
        u.validate_path(i)?;
        if !paths.insert(u.path.clone()) {
            return Err(invalid(key("path"), format!("duplicate path {:?}", u.path)));
        }
        u.validate(i)?;
    }
    Ok(())
}

impl UpstreamConfig {
    /// What a plain client gets from `tool` at the deadline: the tool's setting, else
    /// the upstream's; a tool that never runs as a task is always held.
    pub fn plain_clients_of(&self, tool: &str) -> PlainClients {
        match self.tools.get(tool) {
            Some(t) if t.task == TaskMode::Never => PlainClients::Hold,
            Some(t) => t.plain_clients.unwrap_or(self.plain_clients),
            None => self.plain_clients,
        }
    }

    /// Whether any tool of this upstream may answer plain clients with a handle, which
    /// puts the task tools in their lists (a tool the configuration does not name
    /// follows the upstream's setting).
    pub fn offers_handles(&self) -> bool {
        self.plain_clients == PlainClients::Handle
            || self
                .tools
                .values()
                .any(|t| t.task != TaskMode::Never && t.plain_clients == Some(PlainClients::Handle))
    }

    fn validate_path(&self, i: usize) -> Result<(), ConfigError> {
        let key = format!("upstream[{i}].path");
        if !self.path.starts_with('/') || self.path.starts_with("/.well-known") {
            return Err(invalid(
                key,
                "must start with '/' and not be under /.well-known",
            ));
        }
        if OPERATIONAL_PATHS.contains(&self.path.as_str()) {
            return Err(invalid(key, "collides with an operational endpoint"));
        }
        Ok(())
    }

    /// Check `upstream[i]` beyond its name and path (which [`validate_upstreams`]
    /// checks against the other upstreams).
    fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("upstream[{i}].{k}");
        let https = self.transport.is_https();
        for (name, set) in [
            ("ca_file", self.ca_file.is_some()),
            ("client_cert", self.client_cert.is_some()),
            ("client_key", self.client_key.is_some()),
        ] {
            if set && !https {
                return Err(invalid(key(name), "only applies to an https:// url"));
            }
        }
        if self.client_cert.is_some() != self.client_key.is_some() {
            return Err(invalid(
                key("client_cert"),
                "client_cert and client_key go together",
            ));
        }
        if self.max_concurrency == 0 {
            return Err(invalid(key("max_concurrency"), "must be > 0"));
        }
        if self.stdio_processes == Some(0) {
            return Err(invalid(key("stdio_processes"), "must be > 0"));
        }
        if let Some(spares) = self.stdio_spares
            && spares > self.stdio_processes()
        {
            return Err(invalid(
                key("stdio_spares"),
                "must be <= stdio_processes (spares are counted within the pool)",
            ));
        }
        if self.max_message_bytes < 1024 {
            return Err(invalid(key("max_message_bytes"), "must be >= 1024"));
        }
        for (k, v) in &self.headers {
            if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                return Err(invalid(
                    key(&format!("headers.{k}")),
                    "not a valid header name",
                ));
            }
            interpolate_env(v).map_err(|p| invalid(key(&format!("headers.{k}")), p))?;
        }
        Ok(())
    }
}
