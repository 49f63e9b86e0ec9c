//! `taskgate edge`: a stateless pingora front for several replicas (docs/design.md
//! §21, README "Running several replicas behind the edge").
//!
//! Task methods are routed by their task id with Ketama consistent hashing over the
//! healthy replicas, everything else round-robin (`route.rs`); both selectors share one
//! health registry, probed on `/livez` every `edge.health_interval_ms` by one
//! background service. The edge never reads a request body and verifies no tokens
//! (the replicas do). pingora runs its own runtimes, so [`run`] is called before any
//! tokio runtime exists and does not return until the server stops.

mod proxy;
mod route;

use std::collections::BTreeSet;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_trait::async_trait;
use futures_util::FutureExt;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{RunArgs, Server};
use pingora_core::services::background::background_service;
use pingora_http::RequestHeader;
use pingora_load_balancing::discovery::Static;
use pingora_load_balancing::health_check::{HealthObserve, HttpHealthCheck};
use pingora_load_balancing::selection::consistent::KetamaHashing;
use pingora_load_balancing::selection::{BackendIter, BackendSelection, RoundRobin};
use pingora_load_balancing::{Backend, Backends, HealthCheckService, HealthRegistry, LoadBalancer};

use pingora_core::connectors::ConnectorOptions;
use pingora_core::connectors::http::Connector as HttpConnector;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_load_balancing::health_check::HealthCheck;
use tokio_util::sync::CancellationToken;

use crate::config::EdgeConfig;
use crate::config::as_millis;
use crate::tls::server::ReloadingCert;
use proxy::{EdgeProxy, Replica};

/// How long stopping services may take after the grace period (pingora
/// `graceful_shutdown_timeout_seconds`).
const SHUTDOWN_TIMEOUT_S: u64 = 5;

/// How the edge process was asked to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct EdgeStart {
    /// Take the listening socket over from a running edge (pingora upgrade: start
    /// the new binary with `--upgrade`, then send the old one SIGQUIT).
    pub upgrade: bool,
    /// Daemonise (pingora writes `edge.pid_file`).
    pub daemon: bool,
}

/// Logs and records each replica's health changes (pingora calls this on a flip).
struct HealthLog {
    replicas: Arc<Vec<Replica>>,
}

#[async_trait]
impl HealthObserve for HealthLog {
    async fn observe(&self, target: &Backend, healthy: bool) {
        let addr = target.addr.as_inet().copied();
        let name = self
            .replicas
            .iter()
            .find(|r| Some(r.addr) == addr)
            .map(|r| r.name.clone())
            .unwrap_or_else(|| format!("{:?}", target.addr));
        crate::metrics::edge_replica_health(&name, healthy);
        if healthy {
            tracing::info!(target: "taskgate::edge", replica = %name, "replica healthy: back in the ring");
        } else {
            tracing::warn!(target: "taskgate::edge", replica = %name, "replica failed its /livez check: out of the ring");
        }
    }
}

/// Logs "listening" once the edge accepts connections. pingora binds the socket
/// inside `Server::run`, after this module has handed everything over, so the line
/// is written by a background service that connects to the listener until it
/// answers: an operator (or a script) waiting for the line can then connect.
struct ListeningLog {
    listen: std::net::SocketAddr,
    scheme: &'static str,
    health_interval_ms: u64,
    grace_period_s: u64,
}

#[async_trait]
impl BackgroundService for ListeningLog {
    async fn start(&self, _shutdown: pingora_core::server::ShutdownWatch) {
        let mut probe = self.listen;
        if probe.ip().is_unspecified() {
            probe.set_ip(match probe {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let started = Instant::now();
        while tokio::net::TcpStream::connect(probe).await.is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                tracing::warn!(target: "taskgate::edge", addr = %self.listen,
                    "the edge's listener does not accept connections after 30 s");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (listen, scheme) = (self.listen, self.scheme);
        tracing::info!(
            target: "taskgate::edge",
            addr = %listen,
            health_interval_ms = self.health_interval_ms,
            grace_period_s = self.grace_period_s,
            "taskgate edge listening on {scheme}://{listen}"
        );
    }
}

/// Re-reads the listener's certificate on change or SIGHUP (`tls::server`) for as long
/// as the edge runs: pingora owns the runtimes, so the watcher lives in a service.
struct CertificateWatch(Arc<ReloadingCert>);

#[async_trait]
impl BackgroundService for CertificateWatch {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let stop = CancellationToken::new();
        self.0.spawn_watcher(stop.clone());
        let _ = shutdown.changed().await;
        stop.cancel();
    }
}

/// One `/livez` probe per replica, each with its own host name: over `https://` the
/// name is the SNI and the name the replica's certificate must carry, and pingora's
/// HTTP check holds one name for all backends.
struct ReplicaHealth {
    checks: Vec<(std::net::SocketAddr, HttpHealthCheck)>,
    consecutive_failure: usize,
}

#[async_trait]
impl HealthCheck for ReplicaHealth {
    async fn check(&self, target: &Backend) -> pingora_core::Result<()> {
        let addr = target.addr.as_inet().copied();
        match self.checks.iter().find(|(a, _)| Some(*a) == addr) {
            Some((_, check)) => check.check(target).await,
            None => pingora_core::Error::e_explain(
                pingora_core::ErrorType::InternalError,
                "health check of an unknown replica",
            ),
        }
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        let addr = target.addr.as_inet().copied();
        if let Some((_, check)) = self.checks.iter().find(|(a, _)| Some(*a) == addr) {
            check.health_status_change(target, healthy).await;
        }
    }

    fn health_threshold(&self, success: bool) -> usize {
        if success { 1 } else { self.consecutive_failure }
    }
}

/// The `/livez` probe of one replica: a new connection (and TLS handshake) per probe,
/// so a replica that stopped accepting is noticed.
fn health_check(
    r: &Replica,
    interval: Duration,
    consecutive_failure: usize,
    options: Option<&ConnectorOptions>,
    replicas: &Arc<Vec<Replica>>,
) -> Result<HttpHealthCheck> {
    let mut check = HttpHealthCheck::new(&r.host, r.tls);
    if let Some(o) = options {
        check.set_connector(HttpConnector::new(Some(o.clone())));
    }
    check.req = RequestHeader::build("GET", b"/livez", None)
        .map_err(|e| anyhow::anyhow!("health check request: {e}"))?;
    // The SNI names the replica; the `Host` stays loopback, which a replica's DNS
    // rebinding check always admits (the probe is the edge's, not a client's).
    check
        .req
        .append_header("host", "localhost")
        .map_err(|e| anyhow::anyhow!("health check request: {e}"))?;
    check.consecutive_failure = consecutive_failure;
    // A probe slower than the interval counts as a failure.
    let probe_timeout = interval.clamp(Duration::from_millis(100), Duration::from_secs(1));
    check.peer_template.options.connection_timeout = Some(probe_timeout);
    check.peer_template.options.read_timeout = Some(probe_timeout);
    check.health_changed_callback = Some(Box::new(HealthLog {
        replicas: replicas.clone(),
    }));
    Ok(check)
}

/// `edge.replica_ca_file`, checked the way pingora's connector will load it (pingora
/// panics on a file it cannot use; here it is a start-up error naming the file).
fn replica_ca(cfg: &EdgeConfig) -> Result<Option<String>> {
    let Some(path) = &cfg.replica_ca_file else {
        return Ok(None);
    };
    let mut store = rustls::RootCertStore::empty();
    pingora_core::tls::load_ca_file_into_store(path, &mut store)
        .map_err(|e| anyhow::anyhow!("edge.replica_ca_file {}: {e}", path.display()))?;
    if store.is_empty() {
        anyhow::bail!(
            "edge.replica_ca_file {}: holds no certificate",
            path.display()
        );
    }
    // pingora reads the file itself; read once more for its expiry (README "Operations").
    if let Ok(certs) = crate::tls::load_certs(path) {
        crate::tls::record_expiry("ca", &path.display().to_string(), &certs);
    }
    Ok(Some(path.display().to_string()))
}

fn selector<S>(
    backends: &BTreeSet<Backend>,
    registry: &Arc<HealthRegistry>,
) -> Result<LoadBalancer<S>>
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    let view = Backends::new_with_health_registry(Static::new(backends.clone()), registry.clone());
    let lb = LoadBalancer::<S>::from_backends(view);
    // Static discovery: completes at once, no runtime needed.
    lb.update()
        .now_or_never()
        .context("static replica discovery blocked")?
        .map_err(|e| anyhow::anyhow!("replica discovery: {e}"))?;
    Ok(lb)
}

/// Resolve `edge.replicas` (blocking DNS, before any runtime exists).
fn resolve(cfg: &EdgeConfig) -> Result<Vec<Replica>> {
    let urls = cfg.replica_urls()?;
    let mut out: Vec<Replica> = Vec::new();
    for (i, u) in urls.iter().enumerate() {
        let addr = u
            .authority()
            .to_socket_addrs()
            .with_context(|| format!("edge.replicas[{i}]: resolving {}", u.authority()))?
            .next()
            .with_context(|| format!("edge.replicas[{i}]: {} has no address", u.authority()))?;
        if out.iter().any(|r| r.addr == addr) {
            anyhow::bail!("edge.replicas[{i}]: {addr} is already listed");
        }
        let scheme = if u.tls { "https" } else { "http" };
        let name = format!("{scheme}://{}", u.authority());
        out.push(Replica::new(addr, name, u.host.clone(), u.tls));
    }
    Ok(out)
}

/// Run the edge until it is stopped (SIGTERM: graceful; SIGINT: fast; SIGQUIT:
/// graceful upgrade, handing the listener to a new process started with `--upgrade`).
pub fn run(cfg: EdgeConfig, start: EdgeStart) -> Result<()> {
    let listen = cfg.listen_addr()?;
    let replicas = Arc::new(resolve(&cfg)?);
    // Before the certificates load: they record their expiry.
    crate::metrics::install_edge();
    // Before pingora builds anything: its loaders panic where this says why.
    let listener_cert = match cfg.tls_cert.as_deref().zip(cfg.tls_key.as_deref()) {
        Some((cert, key)) => {
            Some(ReloadingCert::load("edge", cert, key).context("edge.tls_cert / edge.tls_key")?)
        }
        None => None,
    };
    let replica_ca = replica_ca(&cfg)?;
    let backends: BTreeSet<Backend> = replicas
        .iter()
        .map(|r| Backend::new(&r.addr.to_string()))
        .collect::<pingora_core::Result<_>>()
        .map_err(|e| anyhow::anyhow!("edge.replicas: {e}"))?;

    for r in replicas.iter() {
        // Healthy until a check says otherwise (pingora's start state).
        crate::metrics::edge_replica_health(&r.name, true);
    }

    let conf = ServerConf {
        pid_file: cfg.pid_file.display().to_string(),
        upgrade_sock: cfg.upgrade_sock.display().to_string(),
        grace_period_seconds: Some(cfg.grace_period_s),
        graceful_shutdown_timeout_seconds: Some(SHUTDOWN_TIMEOUT_S),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        // Retries happen only on connect failures (`fail_to_connect`), once per replica.
        max_retries: replicas.len(),
        // The proxy's connector trusts exactly this bundle for https:// replicas (the
        // system roots when it is unset); the health checks get the same below.
        ca_file: replica_ca.clone(),
        ..ServerConf::default()
    };
    let probe_options = replica_ca.map(|ca| ConnectorOptions {
        ca_file: Some(ca),
        ..ConnectorOptions::new(0)
    });
    let opt = Opt {
        upgrade: start.upgrade,
        daemon: start.daemon,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let interval = cfg.health_interval;
    let registry = Arc::new(HealthRegistry::new());
    // Two failed probes in a row take a replica out, so one slow answer on a busy
    // host does not move its tasks; a dead replica also fails its first connect,
    // which ejects it at once (the passive path in `proxy.rs`).
    let consecutive_failure = 2;
    let checks = replicas
        .iter()
        .map(|r| {
            let check = health_check(
                r,
                interval,
                consecutive_failure,
                probe_options.as_ref(),
                &replicas,
            )?;
            Ok((r.addr, check))
        })
        .collect::<Result<Vec<_>>>()?;
    registry.set_health_check(Box::new(ReplicaHealth {
        checks,
        consecutive_failure,
    }));

    let ketama = Arc::new(selector::<KetamaHashing>(&backends, &registry)?);
    let round_robin = Arc::new(selector::<RoundRobin>(&backends, &registry)?);
    let mut health = HealthCheckService::new(registry);
    health.health_check_frequency = Some(interval);
    health.parallel_health_check = true;
    let health = background_service("replica health (/livez)", health);

    let proxy = EdgeProxy {
        ketama,
        round_robin,
        replicas: replicas.clone(),
        eject_for: interval.max(Duration::from_secs(1)),
        started: Instant::now(),
        in_flight: Arc::new(AtomicUsize::new(0)),
        max_in_flight: cfg.max_connections,
    };
    let mut service =
        pingora_proxy::http_proxy_service_with_name(&server.configuration, proxy, "taskgate edge");
    let scheme = match &listener_cert {
        Some(cert) => {
            // The paths are unused: the resolver serves the (reloading) certificate.
            let mut tls = TlsSettings::intermediate("", "")
                .map_err(|e| anyhow::anyhow!("edge TLS settings: {e}"))?;
            tls.set_cert_resolver(cert.clone());
            tls.enable_h2();
            service.add_tls_with_settings(&listen.to_string(), None, tls);
            server.add_service(background_service(
                "certificate reload",
                CertificateWatch(cert.clone()),
            ));
            "https"
        }
        None => {
            service.add_tcp(&listen.to_string());
            "http"
        }
    };
    server.add_service(health);
    server.add_service(service);
    server.add_service(background_service(
        "listening log",
        ListeningLog {
            listen,
            scheme,
            health_interval_ms: as_millis(cfg.health_interval),
            grace_period_s: cfg.grace_period_s,
        },
    ));
    for r in replicas.iter() {
        tracing::info!(target: "taskgate::edge", replica = %r.name, addr = %r.addr, "replica");
    }
    server.run(RunArgs::default());
    tracing::info!(target: "taskgate::edge", "taskgate edge stopped");
    Ok(())
}
