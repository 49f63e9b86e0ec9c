//! Upstreams by name, each with one transport per isolation scope (docs/design.md §14
//! "Upstream sessions", isolation), and the per-session `tools/list` cache that the
//! promotion decision reads `execution.taskSupport` from and the `Mcp-Param-*` header
//! map is derived from.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::http::{HttpOptions, HttpUpstream};
use super::identity::Identity;
use super::stdio::{StdioOptions, StdioPool};
use super::{
    CallEvent, CallOutcome, CallSpec, LegacyTransport, SessionRef, TaskChannel, TransportState,
    UpstreamError, UpstreamInfo,
};
use crate::auth::Principal;
use crate::config::{Isolation, UpstreamConfig, UpstreamTransport};
use crate::protocol::param_headers::ToolHeaders;
use crate::protocol::tool_results::{self, ToolsList};
use crate::protocol::{Method, RpcError};
use crate::telemetry;

/// An upstream that cannot be started as configured (its TLS files, so far).
#[derive(Debug, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct StartError {
    pub key: String,
    pub reason: String,
}

/// Whom an upstream session serves: the principal, and for a 2025-era client its
/// session (docs/design.md §22 "Clients of the 2025 era"), which only
/// `isolation = "session"` keys by.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub principal: &'a Principal,
    pub session: Option<&'a str>,
}

impl<'a> From<&'a Principal> for Scope<'a> {
    fn from(principal: &'a Principal) -> Self {
        Self {
            principal,
            session: None,
        }
    }
}

impl<'a> Scope<'a> {
    /// A 2025-era client session's scope.
    pub fn session(principal: &'a Principal, session: &'a str) -> Self {
        Self {
            principal,
            session: Some(session),
        }
    }
}

/// The key of a client session's own scope (`isolation = "session"`).
fn session_key(session: &str) -> String {
    format!("s:{session}")
}

/// Scope key for upstream state isolation: "" (shared), tenant, tenant + subject, or
/// a 2025-era client session. The tenant's length comes first, so no two `(tenant,
/// subject)` pairs share a key whatever characters (NUL included) their names hold.
/// Under `session`, a request without a session (a 2026-07-28 client) gets its
/// principal's scope: the narrowest it has.
fn scope_key(isolation: Isolation, scope: Scope<'_>) -> String {
    let p = scope.principal;
    match (isolation, scope.session) {
        (Isolation::Shared, _) => String::new(),
        (Isolation::Tenant, _) => format!("t:{}", p.tenant),
        (Isolation::Session, Some(s)) => session_key(s),
        (Isolation::Principal | Isolation::Session, _) => {
            format!("p:{}:{}\u{0}{}", p.tenant.len(), p.tenant, p.subject)
        }
    }
}

/// A scope's cached `tools/list` result (None until fetched or after list_changed).
type ToolsCache = Arc<Mutex<Option<Arc<Value>>>>;

struct Scoped {
    transport: Arc<dyn LegacyTransport>,
    last_used: Instant,
    /// Cached `tools/list` result (first page) of this upstream session.
    tools: ToolsCache,
}

/// One configured upstream.
pub struct Upstream {
    pub cfg: UpstreamConfig,
    /// Started eagerly at boot; serves the shared scope and `server/discover`.
    boot: Arc<dyn LegacyTransport>,
    boot_tools: ToolsCache,
    scopes: Mutex<HashMap<String, Scoped>>,
    pid_dir: PathBuf,
    /// The last `initialize` result of any scope, persisted (the task plane's view).
    identity: Arc<Identity>,
    /// How an HTTP upstream's server is verified, read once at start-up and shared by
    /// every scope's session.
    tls: Arc<rustls::ClientConfig>,
    /// Tools whose `x-mcp-header` annotations were found invalid and logged, so each is
    /// logged once.
    excluded_logged: Mutex<HashSet<String>>,
    /// Whether a `tools/call` found no header map to check against and said so.
    unchecked_logged: AtomicBool,
}

impl Upstream {
    fn start_transport(
        cfg: &UpstreamConfig,
        pid_dir: &std::path::Path,
        identity: &Arc<Identity>,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Arc<dyn LegacyTransport> {
        match &cfg.transport {
            UpstreamTransport::Stdio { program, args } => StdioPool::start(StdioOptions {
                name: cfg.name.clone(),
                program: program.clone(),
                args: args.clone(),
                env: cfg.env.clone(),
                processes: cfg.stdio_processes(),
                spares: cfg.stdio_spares(),
                cancel_grace: cfg.cancel_grace,
                idle_reap: cfg.idle_reap,
                max_message_bytes: cfg.max_message_bytes,
                pid_dir: pid_dir.to_path_buf(),
                identity: Some(identity.clone()),
            }),
            UpstreamTransport::Http { url } => HttpUpstream::start(HttpOptions {
                name: cfg.name.clone(),
                url: url.clone(),
                // Validated at start-up (config::Config::parse), so resolution cannot fail
                // here unless the environment changed in between.
                headers: cfg.resolved_headers().unwrap_or_default(),
                max_message_bytes: cfg.max_message_bytes,
                identity: Some(identity.clone()),
                tls: tls.clone(),
            }),
        }
    }

    /// The TLS client configuration of an upstream (README "TLS"): for `https://`, the
    /// system roots plus `ca_file` and the optional client certificate; for anything
    /// else, one that trusts nothing.
    fn client_tls(cfg: &UpstreamConfig) -> Result<Arc<rustls::ClientConfig>, StartError> {
        let failed = |key: &str, e: crate::tls::TlsError| StartError {
            key: format!("upstream {:?} {key}", cfg.name),
            reason: e.to_string(),
        };
        if !cfg.transport.is_https() {
            return crate::tls::client::plaintext_only().map_err(|e| failed("url", e));
        }
        let identity = match (&cfg.client_cert, &cfg.client_key) {
            (Some(cert), Some(key)) => Some(crate::tls::client::ClientIdentity { cert, key }),
            _ => None,
        };
        let key = if identity.is_some() {
            "ca_file/client_cert/client_key"
        } else {
            "ca_file"
        };
        crate::tls::client::client_config(cfg.ca_file.as_deref(), identity)
            .map(Arc::new)
            .map_err(|e| failed(key, e))
    }

    /// Watch a transport's session notifications and drop the cached `tools/list`
    /// when the upstream says the list changed.
    fn watch_tools(transport: &Arc<dyn LegacyTransport>, cache: ToolsCache) {
        let mut rx = transport.notifications();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(n) if n.method == "notifications/tools/list_changed" => {
                        let mut c = cache.lock();
                        *c = None;
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let mut c = cache.lock();
                        *c = None;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        });
    }

    /// Start the boot transport; `stored` and `stored_tool_headers` are what earlier
    /// runs learned (the identity, the tools' header map).
    pub fn start(
        cfg: UpstreamConfig,
        pid_dir: PathBuf,
        stored: Option<UpstreamInfo>,
        stored_tool_headers: Option<ToolHeaders>,
    ) -> Result<Arc<Self>, StartError> {
        let tls = Self::client_tls(&cfg)?;
        let identity = Identity::new(&cfg.name, stored, stored_tool_headers);
        let boot = Self::start_transport(&cfg, &pid_dir, &identity, &tls);
        let boot_tools = Arc::new(Mutex::new(None));
        Self::watch_tools(&boot, boot_tools.clone());
        Ok(Arc::new(Self {
            cfg,
            boot,
            boot_tools,
            scopes: Mutex::new(HashMap::new()),
            pid_dir,
            identity,
            tls,
            excluded_logged: Mutex::new(HashSet::new()),
            unchecked_logged: AtomicBool::new(false),
        }))
    }

    /// An upstream served by one given transport (every isolation scope shares it):
    /// for driving the engine against a scripted upstream.
    #[cfg(test)]
    pub fn from_transport(
        mut cfg: UpstreamConfig,
        transport: Arc<dyn LegacyTransport>,
    ) -> Arc<Self> {
        let identity = Identity::new(&cfg.name, None, None);
        cfg.isolation = Isolation::Shared;
        Arc::new(Self {
            cfg,
            boot: transport,
            boot_tools: Arc::new(Mutex::new(None)),
            scopes: Mutex::new(HashMap::new()),
            pid_dir: PathBuf::new(),
            identity,
            tls: crate::tls::client::plaintext_only().expect("a TLS configuration"),
            excluded_logged: Mutex::new(HashSet::new()),
            unchecked_logged: AtomicBool::new(false),
        })
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Which upstream session serves `scope` (its isolation key): state kept per
    /// upstream session, such as one resource subscription whoever asked for it, is
    /// keyed by this.
    pub fn scope_of<'a>(&self, scope: impl Into<Scope<'a>>) -> String {
        scope_key(self.cfg.isolation, scope.into())
    }

    /// The transport (and its tools cache) serving a scope.
    fn scoped(&self, scope: Scope<'_>) -> (Arc<dyn LegacyTransport>, ToolsCache) {
        let key = scope_key(self.cfg.isolation, scope);
        if key.is_empty() {
            return (self.boot.clone(), self.boot_tools.clone());
        }
        let mut scopes = self.scopes.lock();
        let entry = scopes.entry(key).or_insert_with_key(|key| {
            // A client session's own pool keeps no spare: it serves one client, and
            // a spare per session would double the children.
            let cfg = if key.starts_with("s:") {
                let mut c = self.cfg.clone();
                c.stdio_spares = Some(0);
                std::borrow::Cow::Owned(c)
            } else {
                std::borrow::Cow::Borrowed(&self.cfg)
            };
            let transport = Self::start_transport(&cfg, &self.pid_dir, &self.identity, &self.tls);
            let tools = Arc::new(Mutex::new(None));
            Self::watch_tools(&transport, tools.clone());
            Scoped {
                transport,
                last_used: Instant::now(),
                tools,
            }
        });
        entry.last_used = Instant::now();
        (entry.transport.clone(), entry.tools.clone())
    }

    /// Session notifications (list changes, resource updates) of a scope.
    pub fn session_notifications<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
    ) -> tokio::sync::broadcast::Receiver<super::SessionNotification> {
        self.scoped(scope.into()).0.notifications()
    }

    /// A 2025-era client session ended: under `isolation = "session"` its upstream
    /// session (or stdio pool) goes with it, at once rather than at `idle_reap_ms`.
    pub async fn end_session_scope(&self, session: &str) {
        if self.cfg.isolation != Isolation::Session {
            return;
        }
        let ended = self.scopes.lock().remove(&session_key(session));
        if let Some(s) = ended {
            s.transport.shutdown().await;
        }
    }

    /// Identity for `server/discover`, initialising the boot transport if needed.
    pub async fn info(&self) -> Result<Arc<UpstreamInfo>, UpstreamError> {
        if let Some(i) = self.boot.info() {
            return Ok(i);
        }
        self.boot.ensure_ready().await
    }

    /// The identity for the task plane, without waiting for (or starting) anything:
    /// the boot transport's once it has initialised, else the last one any scope
    /// learned (in this run or, from the store, an earlier one), else
    /// `{name, version: "unknown"}` with no capabilities (README "Task plane and
    /// upstream plane").
    pub fn identity(&self) -> Arc<UpstreamInfo> {
        self.boot
            .info()
            .unwrap_or_else(|| Arc::new(self.identity.current()))
    }

    /// Wakes when the task-plane identity changes (to keep it durable).
    pub fn identity_changes(&self) -> tokio::sync::watch::Receiver<Option<UpstreamInfo>> {
        self.identity.changes()
    }

    /// The `Mcp-Param-*` header map of this upstream's tools, from the last
    /// `tools/list` of any scope (or the stored one); `None` when none is known.
    pub fn tool_headers(&self) -> Option<Arc<ToolHeaders>> {
        self.identity.tool_headers()
    }

    /// The header map a `tools/call`'s `Mcp-Param-*` headers are checked against
    /// (docs/design.md §12 "HTTP front"). While none is known (no `tools/list` seen in
    /// this run, none stored by an earlier one) they go unchecked, which is logged once.
    pub fn tool_headers_to_check(&self) -> Option<Arc<ToolHeaders>> {
        let map = self.identity.tool_headers();
        if map.is_none()
            && !self.unchecked_logged.load(Ordering::Relaxed)
            && !self.unchecked_logged.swap(true, Ordering::Relaxed)
        {
            tracing::info!(
                upstream = %self.name(),
                "no tools/list of this upstream known yet: Mcp-Param-* headers are not checked until one is"
            );
        }
        map
    }

    /// Wakes when the tools' header map changes (to keep it durable).
    pub fn tool_header_changes(&self) -> tokio::sync::watch::Receiver<Option<Arc<ToolHeaders>>> {
        self.identity.tool_header_changes()
    }

    /// Derive the header map from a fetched `tools/list` and publish it; a tool whose
    /// annotations are invalid is left out (not checked) and logged once.
    fn learn_tool_headers(&self, list: &Value) {
        let (headers, excluded) = ToolHeaders::from_tools_list(list);
        if !excluded.is_empty() {
            let mut logged = self.excluded_logged.lock();
            for e in excluded {
                if logged.insert(e.tool.clone()) {
                    tracing::warn!(
                        upstream = %self.name(),
                        tool = %e.tool,
                        reason = %e.reason,
                        "invalid x-mcp-header annotation: the tool's Mcp-Param-* headers are not checked"
                    );
                }
            }
        }
        self.identity.learned_tool_headers(headers);
    }

    pub fn state(&self) -> TransportState {
        self.boot.state()
    }

    /// Call the upstream in the scope of the principal and `spec.session`. Dropping the
    /// future cancels it.
    /// Admission (the concurrency limit) is the caller's: the engine takes a slot
    /// before it calls this.
    pub async fn call(
        &self,
        principal: &Principal,
        mut spec: CallSpec,
        events: mpsc::Sender<CallEvent>,
    ) -> Result<CallOutcome, UpstreamError> {
        spec.tenant = Some(principal.tenant.clone());
        let started = std::time::Instant::now();
        let scope = Scope {
            principal,
            session: spec.session.as_deref(),
        };
        let (transport, _) = self.scoped(scope);
        transport.ensure_ready().await?;
        // The client span of this call (docs/design.md §24 "Operations"): its context
        // goes upstream in `_meta`, and in the headers of an HTTP upstream (taken
        // from the current span when the request is built).
        let span = telemetry::client_span(
            &spec.method,
            spec.tool.as_deref(),
            self.name(),
            match self.cfg.transport {
                UpstreamTransport::Stdio { .. } => "pipe",
                UpstreamTransport::Http { .. } => "tcp",
            },
        );
        if !span.is_none() {
            telemetry::carrier_of(&span).write_into_params(&mut spec.params);
        }
        let r = transport.call(spec, events).instrument(span.clone()).await;
        let outcome = match &r {
            Ok(CallOutcome::Result(v)) => {
                if tool_results::is_tool_error(v) {
                    telemetry::record_error(&span, "tool_error");
                }
                "ok"
            }
            Ok(CallOutcome::Error(e)) => {
                telemetry::record_error(&span, &e.code.to_string());
                "rpc_error"
            }
            Err(e) => {
                telemetry::record_error(&span, e.kind());
                "failed"
            }
        };
        crate::metrics::upstream_call(self.name(), outcome, started.elapsed());
        r
    }

    /// `tools/list` (first page) for a scope, from the session cache when it is fresh.
    pub async fn tools_list<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
    ) -> Result<CallOutcome, UpstreamError> {
        self.cached_tools(scope.into())
            .await
            .map(|r| r.map_or_else(CallOutcome::Error, |v| CallOutcome::Result((*v).clone())))
    }

    /// The cached list, shared rather than copied: `tools/call` consults it on every
    /// call (`tool_task_support`), and the list can be large. `Err` holds an upstream
    /// JSON-RPC error, which is not cached.
    async fn cached_tools(
        &self,
        scope: Scope<'_>,
    ) -> Result<Result<Arc<Value>, RpcError>, UpstreamError> {
        let (transport, cache) = self.scoped(scope);
        if let Some(v) = cache.lock().clone() {
            return Ok(Ok(v));
        }
        transport.ensure_ready().await?;
        let (tx, _rx) = mpsc::channel(1);
        let out = transport
            .call(
                CallSpec {
                    method: Method::ToolsList.as_str().into(),
                    tool: None,
                    params: Map::new(),
                    want_progress: false,
                    tenant: None,
                    session: None,
                },
                tx,
            )
            .await?;
        Ok(match out {
            CallOutcome::Result(v) => {
                let v = Arc::new(v);
                {
                    let mut c = cache.lock();
                    *c = Some(v.clone());
                }
                self.learn_tool_headers(&v);
                Ok(v)
            }
            CallOutcome::Error(e) => Err(e),
        })
    }

    /// The upstream's `execution.taskSupport` for a tool, from the cached tools list.
    pub async fn tool_task_support(&self, principal: &Principal, tool: &str) -> Option<String> {
        let list = self.cached_tools(principal.into()).await.ok()?.ok()?;
        ToolsList::of(&list)
            .find(tool)?
            .task_support()
            .map(str::to_string)
    }

    /// The tool's `execution.taskSupport` (`optional` or `required`) when a
    /// `tools/call` of it runs as the upstream's own task (docs/design.md §25): the
    /// server advertises `tasks.requests.tools.call` and the tool declares support.
    /// `None` for every other tool.
    pub async fn upstream_task_support(&self, principal: &Principal, tool: &str) -> Option<String> {
        // The server's capability first: most servers have none, and reading it is
        // cheaper than the tools lookup (the hot path of every `tools/call`).
        let transport = match self.identity.advertises_tasks() {
            Some(false) => return None,
            Some(true) => None,
            // No identity shared yet (the transport may not report one): its own.
            None => Some(self.scoped(principal.into()).0),
        };
        let advertised = |t: &Option<Arc<dyn LegacyTransport>>| {
            t.as_ref().is_none_or(|t| {
                t.info()
                    .is_some_and(|i| super::identity::advertises_tasks(&i))
            })
        };
        if transport.as_ref().is_some_and(|t| t.info().is_some()) && !advertised(&transport) {
            return None;
        }
        // Listing the tools initialises the scope's session if none did yet.
        self.tool_task_support(principal, tool)
            .await
            .filter(|s| matches!(s.as_str(), "optional" | "required"))
            .filter(|_| advertised(&transport))
    }

    /// Pin the scope's upstream session (HTTP) or a child (stdio) for an upstream
    /// task's life.
    pub async fn pin(&self, scope: Scope<'_>) -> Result<Arc<dyn TaskChannel>, UpstreamError> {
        let (transport, _) = self.scoped(scope);
        transport.ensure_ready().await?;
        transport.pin().await
    }

    /// The session of an upstream task a previous process recorded, in the
    /// principal's scope; `None` where it cannot be reached again (stdio).
    pub fn adopt(
        &self,
        principal: &Principal,
        session: &SessionRef,
    ) -> Option<Arc<dyn TaskChannel>> {
        self.scoped(principal.into()).0.adopt(session)
    }

    /// Drop scoped transports idle for longer than `idle_reap_ms` (never one that
    /// holds upstream tasks).
    pub async fn reap_idle(&self) {
        let idle = self.cfg.idle_reap;
        let stale: Vec<Arc<dyn LegacyTransport>> = {
            let mut scopes = self.scopes.lock();
            let keys: Vec<String> = scopes
                .iter()
                .filter(|(_, s)| s.last_used.elapsed() > idle && s.transport.live_tasks() == 0)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| scopes.remove(&k).map(|s| s.transport))
                .collect()
        };
        for t in stale {
            t.shutdown().await;
        }
    }

    pub async fn shutdown(&self) {
        let scoped: Vec<Arc<dyn LegacyTransport>> = self
            .scopes
            .lock()
            .drain()
            .map(|(_, v)| v.transport)
            .collect();
        for t in scoped {
            t.shutdown().await;
        }
        self.boot.shutdown().await;
    }
}

/// How often `taskgate_upstream_up` samples each upstream's state.
const STATE_SAMPLE: Duration = Duration::from_secs(1);

/// All configured upstreams.
pub struct UpstreamSet {
    upstreams: Vec<Arc<Upstream>>,
}

impl UpstreamSet {
    /// Start every upstream; `stored` and `stored_tool_headers` hold what earlier runs
    /// learned (identities, tools' header maps), by upstream name.
    pub fn start(
        cfgs: &[UpstreamConfig],
        pid_dir: PathBuf,
        stored: &HashMap<String, UpstreamInfo>,
        stored_tool_headers: &HashMap<String, ToolHeaders>,
    ) -> Result<Self, StartError> {
        let upstreams = cfgs
            .iter()
            .map(|c| {
                Upstream::start(
                    c.clone(),
                    pid_dir.clone(),
                    stored.get(&c.name).cloned(),
                    stored_tool_headers.get(&c.name).cloned(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        for u in &upstreams {
            crate::metrics::upstream_configured(u.name());
        }
        Ok(Self { upstreams })
    }

    pub fn by_path(&self, path: &str) -> Option<&Arc<Upstream>> {
        self.upstreams.iter().find(|u| u.cfg.path == path)
    }

    pub fn by_name(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.upstreams.iter().find(|u| u.cfg.name == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.upstreams.iter()
    }

    /// Start the background loops: one that reaps each upstream's idle isolation
    /// scopes, and one that samples every upstream's state (what `/readyz` reports)
    /// into `taskgate_upstream_up` every second (README "Operations"), until the set
    /// is dropped.
    pub fn spawn_reaper(&self) {
        let all: Vec<std::sync::Weak<Upstream>> =
            self.upstreams.iter().map(Arc::downgrade).collect();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(STATE_SAMPLE);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let live: Vec<Arc<Upstream>> =
                    all.iter().filter_map(std::sync::Weak::upgrade).collect();
                if live.is_empty() {
                    return;
                }
                for u in live {
                    crate::metrics::upstream_up(u.name(), u.state() == TransportState::Ready);
                }
            }
        });
        for u in &self.upstreams {
            if u.cfg.isolation == Isolation::Shared {
                continue;
            }
            let u = u.clone();
            let every =
                (u.cfg.idle_reap / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    u.reap_idle().await;
                }
            });
        }
    }

    pub async fn shutdown(&self) {
        let all = self.upstreams.iter().map(|u| u.shutdown());
        futures_util::future::join_all(all).await;
    }
}
