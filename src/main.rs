//! The `taskgate` binary: the gateway (`serve`, the default), the front for several
//! replicas (`edge`, feature `edge`), a dev-token minter (`token`), the operator API's
//! client (`admin`), the move of a sled store into PostgreSQL (`store migrate`) and the
//! bundled demo legacy server (`demo-upstream`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use taskgate::auth::{self, Authenticator};
use taskgate::config::{AuthOnly, Config, ConfigSource, LogFormat, StoreBackend};
use taskgate::front::{self, Gateway};
use taskgate::store::TaskStore;
use taskgate::store::cluster::Cluster;
use taskgate::store::postgres::{PgSettings, PgStore};
use taskgate::store::sled::SledStore;
use taskgate::tasks::Engine;
use taskgate::tasks::mrtr::Holds;
use taskgate::upstream::{UpstreamSet, stdio};

/// jemalloc, not the system's malloc: under load a request's buffers are allocated on
/// one worker thread and freed on another, and glibc's arenas made that the largest
/// cost of a `tasks/get` that grew since the first benchmarks (benches/RESULTS.md,
/// "Issue 26"). The library and its tests keep the system allocator.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at start-up (a C string). Two arenas, not eight (four
/// per core): the runtime has two workers, and with 1M stored tasks under random
/// `tasks/get` RSS was 521 MB against 612 MB with the default. Freed pages go back to
/// the system after 200 ms rather than 10 s, from jemalloc's background thread: with
/// 1M stored tasks RSS after the load is 279 MB with sled's default cache, and
/// start-up stays at 0.8 s (0 ms returned 289 MB but took 2.3 s to start, as sled's
/// recovery frees as it goes; benches/RESULTS.md "Issue 32").
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_OPTIONS: &u8 =
    &b"narenas:2,background_thread:true,dirty_decay_ms:200,muzzy_decay_ms:200\0"[0];

#[derive(Parser)]
#[command(
    name = "taskgate",
    version,
    about = "MCP 2026-07-28 + Tasks gateway for legacy MCP servers"
)]
struct Cli {
    /// Configuration file (TOML). Default: ./config/taskgate.toml if it exists, else
    /// the built-in default (the shipped config/taskgate.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Listen address, overriding `server.listen` (e.g. 127.0.0.1:0 for any port).
    #[arg(long, global = true)]
    listen: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Print a dev token signed with the configured HS256 secret.
    Token {
        #[arg(long)]
        sub: String,
        #[arg(long)]
        tenant: String,
        /// Scope to include (repeatable).
        #[arg(long)]
        scope: Vec<String>,
        /// Lifetime, e.g. 30m, 1h, 2d.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Run the edge: the pingora front for several replicas (the `[edge]` table).
    Edge {
        /// Take the listener over from a running edge (then send it SIGQUIT).
        #[arg(long)]
        upgrade: bool,
        /// Run in the background (writes `edge.pid_file`).
        #[arg(long)]
        daemon: bool,
    },
    /// Call the operator API of a gateway (README "Operations").
    Admin {
        /// The gateway's operations listener (`server.metrics_listen`).
        #[arg(
            long,
            env = "TASKGATE_ADMIN_URL",
            default_value = "http://127.0.0.1:9090"
        )]
        url: String,
        /// A token with the `[admin] scope`.
        #[arg(long, env = "TASKGATE_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Trust this CA (PEM) for an `https://` URL, besides the system roots.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        what: AdminCommand,
    },
    /// Work on a task store while no gateway runs on it (README "Upgrades and data").
    Store {
        #[command(subcommand)]
        what: StoreCommand,
    },
    /// Run the bundled demo legacy MCP server (stdio, or HTTP with --http).
    DemoUpstream {
        /// Serve legacy Streamable HTTP on this address instead of stdio.
        #[arg(long)]
        http: Option<SocketAddr>,
        /// With --http: serve HTTPS with this certificate chain (PEM)…
        #[arg(long, requires = "http", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// …and this key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// With --tls-cert: require a client certificate signed by this CA (mTLS).
        #[arg(long, requires = "tls_cert")]
        client_ca: Option<PathBuf>,
    },
}

/// `taskgate_store_healthy` and `taskgate_replica_lease_held` follow what `/readyz`
/// reports, sampled every second (README "Operations").
fn spawn_health_gauges(engine: &Arc<Engine>) {
    let engine = Arc::downgrade(engine);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(e) = engine.upgrade() else { return };
            taskgate::metrics::replica_health(e.store_healthy(), e.lease_held());
        }
    });
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Tasks: list a tenant's, show one, cancel one.
    Tasks {
        #[command(subcommand)]
        what: AdminTasks,
    },
    /// Every tenant's task counts by status.
    Tenants,
    /// Stop admitting new upstream calls on this replica (rolling deploys).
    Drain,
    /// Admit new upstream calls again.
    Undrain,
    /// Remove every trace of a tenant: cancel its live calls, then delete its tasks,
    /// routes, claims, tombstones, read marks, relays and sessions (audited; README
    /// "Removing a tenant's data").
    Purge {
        #[arg(long)]
        tenant: String,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Copy a sled store into a PostgreSQL schema (README "Moving to PostgreSQL").
    /// Stop the gateway first; a rerun resumes and copies only what is missing.
    Migrate {
        /// The sled store's directory (the gateway's `[store] path`).
        #[arg(long)]
        from: PathBuf,
        /// The PostgreSQL URL, with `sslmode`/`sslrootcert` as in `[store] url`.
        /// Default: `[store] url` or `url_env` of the configuration.
        #[arg(long)]
        to: Option<String>,
        /// The schema to write. Default: `[store] schema` of the configuration.
        #[arg(long)]
        schema: Option<String>,
        /// Entries per batch (one statement each).
        #[arg(long, default_value_t = 1000, hide = true)]
        batch_size: usize,
    },
}

#[derive(Subcommand)]
enum AdminTasks {
    /// A tenant's tasks, oldest first.
    List {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        upstream: Option<String>,
        #[arg(long)]
        tool: Option<String>,
        /// Only tasks created at least this many milliseconds ago.
        #[arg(long)]
        min_age_ms: Option<u64>,
        #[arg(long)]
        limit: Option<usize>,
        /// The `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One task.
    Show { id: String },
    /// Cancel one task (audited under the token's subject).
    Cancel { id: String },
}

/// `taskgate admin …`: one call of the operator API, printed as a table or JSON.
async fn admin(
    url: &str,
    token: Option<&str>,
    ca_file: Option<&std::path::Path>,
    json: bool,
    what: AdminCommand,
) -> Result<()> {
    use http::Method;
    use taskgate::admin_client::{call, tasks_table, tenants_table};
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let (method, path) = match &what {
        AdminCommand::Tasks { what } => match what {
            AdminTasks::List {
                tenant,
                status,
                upstream,
                tool,
                min_age_ms,
                limit,
                cursor,
            } => {
                let mut q = vec![format!("tenant={}", enc(tenant))];
                let opt = [
                    ("status", status.clone()),
                    ("upstream", upstream.clone()),
                    ("tool", tool.clone()),
                    ("min_age_ms", min_age_ms.map(|n| n.to_string())),
                    ("limit", limit.map(|n| n.to_string())),
                    ("cursor", cursor.clone()),
                ];
                for (k, v) in opt {
                    if let Some(v) = v {
                        q.push(format!("{k}={}", enc(&v)));
                    }
                }
                (Method::GET, format!("/admin/tasks?{}", q.join("&")))
            }
            AdminTasks::Show { id } => (Method::GET, format!("/admin/tasks/{}", enc(id))),
            AdminTasks::Cancel { id } => (Method::POST, format!("/admin/tasks/{}/cancel", enc(id))),
        },
        AdminCommand::Tenants => (Method::GET, "/admin/tenants".to_string()),
        AdminCommand::Drain => (Method::POST, "/admin/drain".to_string()),
        AdminCommand::Undrain => (Method::POST, "/admin/undrain".to_string()),
        AdminCommand::Purge { tenant } => (
            Method::POST,
            format!("/admin/tenants/{}/purge", enc(tenant)),
        ),
    };
    let within = match what {
        // Bounded batches, but a tenant may hold millions of items.
        AdminCommand::Purge { .. } => std::time::Duration::from_secs(3600),
        _ => taskgate::admin_client::ANSWER_WITHIN,
    };
    let v = call(url, &path, method, token, ca_file, within).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let empty = Vec::new();
    match what {
        AdminCommand::Tasks {
            what: AdminTasks::List { .. },
        } => {
            println!("{}", tasks_table(v["tasks"].as_array().unwrap_or(&empty)));
            if let Some(within) = v["filtered_within_page"].as_array() {
                let names: Vec<&str> = within.iter().filter_map(|w| w.as_str()).collect();
                println!("(filtered within the page: {})", names.join(", "));
            }
            if let Some(c) = v["next_cursor"].as_str() {
                println!("next page: --cursor {c}");
            }
        }
        AdminCommand::Tasks { .. } => {
            println!("{}", tasks_table(std::slice::from_ref(&v["task"])));
        }
        AdminCommand::Tenants => {
            println!(
                "{}",
                tenants_table(v["tenants"].as_array().unwrap_or(&empty))
            );
        }
        AdminCommand::Drain | AdminCommand::Undrain => {
            println!("replica {} drained: {}", v["replica"], v["drained"]);
        }
        AdminCommand::Purge { .. } => {
            println!("{}", taskgate::admin_client::purge_table(&v["purge"]));
        }
    }
    Ok(())
}

/// `taskgate store migrate`: the sled store at `from` into PostgreSQL, with the
/// PostgreSQL settings of the configuration unless `to`/`schema` say otherwise
/// (docs/design.md §27 "Moving a sled store to PostgreSQL"). Fails when a count does
/// not match.
async fn store_migrate(
    source: ConfigSource,
    from: PathBuf,
    to: Option<String>,
    schema: Option<String>,
    batch: usize,
) -> Result<()> {
    use taskgate::store::postgres::PgImport;
    use taskgate::store::transfer::{self, Options, StderrProgress};

    let cfg = Config::from_source(&source)?;
    let mut pg = cfg.store.clone();
    if let Some(url) = to {
        pg.url = Some(url);
        pg.url_env = None;
    }
    if let Some(schema) = schema {
        pg.schema = schema;
    }
    let settings = PgSettings::from_config(&pg)
        .context("no PostgreSQL URL: give --to, or a --config whose [store] names one")?;
    // The move reads every page once: a large page cache would only hold memory.
    let sled = taskgate::config::StoreConfig {
        path: from,
        cache_capacity_bytes: cfg.store.cache_capacity_bytes.min(64 << 20),
        ..cfg.store.clone()
    };
    let store = transfer::open_source(&sled)?;
    let dest = PgImport::open(&settings)
        .await
        .with_context(|| format!("opening PostgreSQL (schema {})", settings.schema))?;
    eprintln!(
        "moving the sled store at {} into PostgreSQL schema {} (schema version {}, TLS {})",
        sled.path.display(),
        settings.schema,
        dest.migrated.version,
        if dest.migrated.tls { "on" } else { "off" }
    );
    let retention = taskgate::config::as_millis(cfg.tasks.result_retention);
    let fail = move |rec: &mut taskgate::store::TaskRecord, at_ms: u64| {
        taskgate::tasks::sweeper::fail_moved(rec, retention, at_ms);
    };
    let opts = Options {
        batch,
        fail_in_flight: &fail,
    };
    let report = transfer::transfer(&store, &dest, &opts, &mut StderrProgress::new()).await?;
    print_migrate_report(&report);
    if !report.matches() {
        anyhow::bail!(
            "the counts do not match (see the table above): the destination lacks rows \
             of the source; run the command again"
        );
    }
    Ok(())
}

/// The tasks found in flight, then each kind's counts, on stdout.
fn print_migrate_report(report: &taskgate::store::transfer::Report) {
    use taskgate::admin_client::table;
    use taskgate::store::transfer::Kind;
    use taskgate::tasks::clock::iso8601;

    if !report.in_flight.is_empty() {
        println!(
            "{} task(s) were in flight when the sled store was closed; they are failed on \
             PostgreSQL with a reason:",
            report.in_flight.len()
        );
        let rows: Vec<Vec<String>> = report
            .in_flight
            .iter()
            .map(|t| {
                vec![
                    t.task_id.clone(),
                    t.tenant.clone(),
                    t.tool.clone(),
                    iso8601(t.since_ms),
                    if t.failed_before {
                        "failed by an earlier run".into()
                    } else {
                        "failed now".into()
                    },
                ]
            })
            .collect();
        println!(
            "{}\n",
            table(&["TASK", "TENANT", "TOOL", "SINCE", "STATE"], &rows)
        );
    }
    let rows: Vec<Vec<String>> = Kind::ALL
        .iter()
        .map(|k| {
            let t = report.tally(*k);
            let mut notes = Vec::new();
            if t.kept > 0 {
                notes.push(format!("{} kept PostgreSQL's newer row", t.kept));
            }
            if t.skipped > 0 {
                notes.push(format!("{} skipped: their task is gone", t.skipped));
            }
            if *k == Kind::Tasks && !report.in_flight.is_empty() {
                notes.push(format!("{} in flight, failed", report.in_flight.len()));
            }
            let total = k.table_rows(&report.tables);
            if total != t.in_destination() {
                notes.push(format!("the table holds {total} in all"));
            }
            if !t.matches() {
                notes.push("MISMATCH".into());
            }
            vec![
                k.name().to_string(),
                t.source.to_string(),
                t.in_destination().to_string(),
                t.copied.to_string(),
                (t.already + t.kept).to_string(),
                notes.join("; "),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "KIND",
                "SLED",
                "POSTGRESQL",
                "COPIED",
                "ALREADY THERE",
                "NOTE"
            ],
            &rows
        )
    );
    if report.routes > 0 {
        println!(
            "request routes: {} (not copied: no call is in flight after the move)",
            report.routes
        );
    }
    match (report.matches(), report.copied()) {
        (false, _) => println!("counts: MISMATCH"),
        (true, 0) => println!("counts: match; copied 0 new rows (everything was already there)"),
        (true, n) => println!("counts: match; copied {n} rows"),
    }
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TASKGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(taskgate::logsink::Sink)
        // Colour codes only for a terminal, not in files and pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    taskgate::logsink::flush_on_panic();
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Logging, and traces when `[telemetry]` or the `OTEL_*` variables name a collector
/// (docs/design.md §24 "Operations"). Without one the subscriber is exactly the
/// plain one; with one, the gateway's spans go to the exporter only, so log lines
/// read the same either way.
fn init_logs_and_traces(
    json: bool,
    telemetry: &taskgate::config::TelemetryConfig,
    instance: &str,
    role: &'static str,
) -> Result<Option<taskgate::telemetry::Telemetry>> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let Some(export) = telemetry.export(|k| std::env::var(k).ok())? else {
        init_tracing(json);
        return Ok(None);
    };
    let traces = taskgate::telemetry::start(&export, instance, role)?;
    let target = taskgate::telemetry::TARGET;
    let env_filter = || {
        tracing_subscriber::EnvFilter::try_from_env("TASKGATE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    // The exporter sees its spans and the events inside them (as span events).
    let otel = traces.layer().with_filter(filter_fn(move |m| {
        m.target() == target || (m.is_event() && *m.level() <= tracing::Level::INFO)
    }));
    let not_ours = filter_fn(move |m| m.target() != target);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(taskgate::logsink::Sink)
        .with_ansi(ansi);
    taskgate::logsink::flush_on_panic();
    let registry = tracing_subscriber::registry().with(otel);
    if json {
        registry
            .with(logs.json().with_filter(env_filter()).with_filter(not_ours))
            .init();
    } else {
        registry
            .with(logs.with_filter(env_filter()).with_filter(not_ours))
            .init();
    }
    tracing::info!(collector = %export.url, sample_ratio = export.sample_ratio,
        service = %export.service_name, "exporting traces over OTLP/HTTP");
    Ok(Some(traces))
}

fn main() -> Result<()> {
    // Before any library builds a TLS configuration from the process default.
    taskgate::tls::install_process_default();
    let r = run();
    // Log lines are written by a background thread; write out the last ones.
    taskgate::logsink::flush();
    r
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    // Built only by the commands that need it: pingora builds its own runtimes, so
    // the edge must start before any tokio runtime exists.
    let tokio_runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")
    };
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            tokio_runtime()?.block_on(serve(ConfigSource::resolve(cli.config), cli.listen))
        }
        Command::Edge { upgrade, daemon } => edge(
            ConfigSource::resolve(cli.config),
            cli.listen,
            upgrade,
            daemon,
        ),
        Command::Token {
            sub,
            tenant,
            scope,
            ttl,
        } => {
            let auth_cfg = AuthOnly::from_source(&ConfigSource::resolve(cli.config))?;
            let ttl = auth::parse_ttl(&ttl).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
            let token = auth::mint_token(&auth_cfg, &sub, &tenant, &scope, ttl)?;
            println!("{token}");
            Ok(())
        }
        Command::Admin {
            url,
            token,
            ca_file,
            json,
            what,
        } => tokio_runtime()?.block_on(admin(
            &url,
            token.as_deref(),
            ca_file.as_deref(),
            json,
            what,
        )),
        Command::Store {
            what:
                StoreCommand::Migrate {
                    from,
                    to,
                    schema,
                    batch_size,
                },
        } => {
            init_tracing(false);
            let source = ConfigSource::resolve(cli.config);
            tokio_runtime()?.block_on(store_migrate(source, from, to, schema, batch_size))
        }
        Command::DemoUpstream {
            http,
            tls_cert,
            tls_key,
            client_ca,
        } => {
            init_tracing(false);
            // The demo's `crash` tool ends the process with `exit`; log lines still
            // buffered in the background writer go out first.
            extern "C" fn flush_logs_at_exit() {
                taskgate::logsink::flush();
            }
            // SAFETY: registers a plain function with no captured state; it only
            // writes buffered bytes to stderr.
            unsafe {
                libc::atexit(flush_logs_at_exit);
            }
            let tls = match tls_cert.zip(tls_key) {
                Some((cert, key)) => {
                    let pair = taskgate::tls::server::ReloadingCert::load("demo", &cert, &key)?;
                    Some(taskgate::tls::server::server_config(
                        pair,
                        client_ca.as_deref(),
                    )?)
                }
                None => None,
            };
            tokio_runtime()?.block_on(async move {
                match http {
                    Some(addr) => taskgate::demo::run_http(addr, tls).await,
                    None => taskgate::demo::run_stdio().await,
                }
            })
        }
    }
}

#[cfg(feature = "edge")]
fn edge(
    source: ConfigSource,
    listen_override: Option<String>,
    upgrade: bool,
    daemon: bool,
) -> Result<()> {
    let mut cfg = taskgate::config::EdgeConfig::from_source(&source)?;
    if let Some(listen) = listen_override {
        cfg.listen = listen;
        cfg.validate()?;
    }
    let instance = format!("edge-{}", std::process::id());
    let traces = init_logs_and_traces(
        cfg.log_format == LogFormat::Json,
        &cfg.telemetry,
        &instance,
        "edge",
    )?;
    tracing::info!(config = %source.describe(), "edge configuration loaded");
    let r = taskgate::edge::run(cfg, taskgate::edge::EdgeStart { upgrade, daemon });
    if let Some(t) = traces {
        t.shutdown();
    }
    r
}

#[cfg(not(feature = "edge"))]
fn edge(_: ConfigSource, _: Option<String>, _: bool, _: bool) -> Result<()> {
    anyhow::bail!(
        "this taskgate was built without the `edge` feature (cargo build --features edge)"
    )
}

async fn serve(source: ConfigSource, listen_override: Option<String>) -> Result<()> {
    let mut cfg = Config::from_source(&source)?;
    if let Some(listen) = listen_override {
        cfg.server.listen = listen;
        cfg.revalidate()?;
    }
    let traces = init_logs_and_traces(
        cfg.server.log_format == LogFormat::Json,
        &cfg.telemetry,
        &cfg.replica_id(),
        "replica",
    )?;
    tracing::info!(config = %source.describe(), "configuration loaded");
    // The metrics recorder is process-wide by design (the `metrics` facade); installed
    // before the store opens, so the expiry of its CA file is recorded too.
    taskgate::metrics::install();
    let listen = cfg.listen_addr()?;

    // The store lock first: it is what makes this gateway the only one on this store,
    // and a second instance must stop here having changed nothing — above all, before
    // it looks for leftover children to kill (README "Stdio children and pid records").
    let (store, cluster): (Arc<dyn TaskStore>, Option<Arc<dyn Cluster>>) = match cfg.store.backend {
        StoreBackend::Sled => (
            SledStore::open(&cfg.store).with_context(|| {
                format!("opening the task store at {}", cfg.store.path.display())
            })?,
            None,
        ),
        // Shared by replicas: no lock to take; the migrations serialise on an
        // advisory lock of their own, and each replica holds a lease instead.
        StoreBackend::Postgres => {
            let settings = PgSettings::from_config(&cfg.store)?;
            let pg = PgStore::open(&settings).await.with_context(|| {
                format!(
                    "opening the postgres task store (schema {})",
                    settings.schema
                )
            })?;
            (pg.clone(), Some(pg))
        }
    };

    let pid_dir = cfg.replica_run_dir();
    std::fs::create_dir_all(&pid_dir).with_context(|| format!("creating {}", pid_dir.display()))?;
    let legacy = stdio::kill_legacy_leftovers(&cfg.store.legacy_pid_dir());
    let current = stdio::kill_leftovers(&pid_dir);
    let killed = legacy.killed + current.killed;
    if killed > 0 {
        tracing::warn!(
            killed,
            "killed upstream children left over from a previous run"
        );
    }
    if current.kept > 0 {
        tracing::info!(
            kept = current.kept,
            dir = %pid_dir.display(),
            "pid records of another running gateway with this replica id left alone"
        );
    }
    tracing::info!(replica_id = %cfg.replica_id(), pid_dir = %pid_dir.display(), "stdio pid records");

    // The limits belong to this gateway and are handed to what enforces them.
    let limits = taskgate::limits::Limits::from_config(&cfg);
    seed_task_gauge(store.clone());
    seed_session_gauge(store.clone());
    if cluster.is_some() {
        recount_task_gauge(store.clone(), cfg.store.sweep_interval);
    }
    let metrics_listener = match &cfg.server.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding server.metrics_listen {addr}"))?,
        ),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let s = &cfg.server;
    let listener_tls = tls_for_listener(
        "listener",
        s.tls_cert.as_deref().zip(s.tls_key.as_deref()),
        s.client_ca_file.as_deref(),
        &shutdown,
    )
    .context("server.tls_cert / tls_key / client_ca_file")?;
    let metrics_tls = tls_for_listener(
        "metrics_listen",
        s.metrics_tls_cert
            .as_deref()
            .zip(s.metrics_tls_key.as_deref()),
        None,
        &shutdown,
    )
    .context("server.metrics_tls_cert / metrics_tls_key")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let local = listener.local_addr()?;
    let scheme = if listener_tls.is_some() {
        "https"
    } else {
        "http"
    };
    // The bound address, not the configured one: `listen = "…:0"` picks a port.
    let public_url = cfg
        .server
        .public_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{local}"));
    let auth = Arc::new(Authenticator::new(&cfg.auth, &public_url)?);
    let cfg = Arc::new(cfg);
    let holds = Holds::new(
        request_state_key(&cfg, store.as_ref()).await?,
        cfg.tasks.input_timeout,
        cluster.as_ref().map(|_| cfg.replica_id()),
    );
    let engine = Engine::new(store.clone(), cfg.clone(), limits.clone(), holds);
    observe_transitions(&engine, limits.clone());
    // The seat first: recovery then resolves this replica's earlier epochs only.
    if let Some(c) = &cluster {
        let seat = engine
            .join_cluster(c.clone())
            .await
            .context("registering this replica's lease")?;
        tracing::info!(replica = %seat.replica_id, epoch = seat.epoch, "replica registered");
    }
    let stored = engine.stored_identities().await;
    let stored_tool_headers = engine.stored_tool_headers().await;
    let upstreams = Arc::new(
        UpstreamSet::start(&cfg.upstreams, pid_dir, &stored, &stored_tool_headers)
            .context("starting the upstreams")?,
    );
    upstreams.spawn_reaper();
    engine.persist_identities(&upstreams);
    engine.persist_tool_headers(&upstreams);

    let recovered = engine
        .recover(&upstreams)
        .await
        .context("recovering tasks after restart")?;
    if recovered > 0 {
        tracing::warn!(
            recovered,
            "tasks whose calls were in flight at the last stop are now failed"
        );
    }
    let gw = Arc::new(Gateway {
        cfg: cfg.clone(),
        auth,
        upstreams: upstreams.clone(),
        engine: engine.clone(),
        limits,
        legacy: Default::default(),
        shadowed: Default::default(),
    });
    engine.on_relayed_mrtr(front::relayed::handler(Arc::downgrade(&gw)));
    engine.spawn_cluster(shutdown.clone());
    engine.spawn_sweeper(shutdown.clone());
    spawn_health_gauges(&engine);
    engine.spawn_seen_marker();
    spawn_signal_handler(shutdown.clone());
    for u in &cfg.upstreams {
        tracing::info!(upstream = %u.name, path = %u.path, "serving upstream");
    }
    if let Some(l) = metrics_listener {
        if let Ok(a) = l.local_addr() {
            let scheme = if metrics_tls.is_some() {
                "https"
            } else {
                "http"
            };
            tracing::info!(addr = %a, "metrics on {scheme}://{a}/metrics");
        }
        tokio::spawn(front::serve_ops(
            gw.clone(),
            l,
            metrics_tls,
            shutdown.clone(),
        ));
    }
    tracing::info!(addr = %local, "taskgate listening on {scheme}://{local}");
    front::serve(gw, listener, listener_tls, shutdown).await;
    // From here a promoted call ended by the upstream shutdown keeps its request
    // route, so the next start resolves its task (docs/design.md §10 "Restart").
    engine.begin_shutdown();
    tracing::info!("draining done; stopping upstreams");
    upstreams.shutdown().await;
    // Reads served while draining are marked too (README "Limits and metrics").
    engine.write_seen().await;
    if let Err(e) = engine.flush().await {
        tracing::error!(error = %e, "final store flush failed");
    }
    tracing::info!("taskgate stopped");
    // The spans of the last requests go out (bounded by the export timeout).
    if let Some(t) = traces {
        t.shutdown();
    }
    Ok(())
}

/// TLS for one listener (README "TLS"): the certificate pair read now (an error stops
/// the start), then watched for changes and SIGHUP until `shutdown`.
fn tls_for_listener(
    name: &'static str,
    pair: Option<(&std::path::Path, &std::path::Path)>,
    client_ca: Option<&std::path::Path>,
    shutdown: &CancellationToken,
) -> Result<Option<front::conn::ListenerTls>> {
    let Some((cert, key)) = pair else {
        return Ok(None);
    };
    let reloading = taskgate::tls::server::ReloadingCert::load(name, cert, key)?;
    let config = taskgate::tls::server::server_config(reloading.clone(), client_ca)?;
    reloading.spawn_watcher(shutdown.clone());
    if client_ca.is_some() {
        tracing::info!(
            listener = name,
            "client certificates required at the TLS handshake"
        );
    }
    Ok(Some(front::conn::ListenerTls::new(config, name)))
}

/// The MRTR `requestState` HMAC key: from the environment variable named by
/// `auth.request_state_key_env` (≥ 32 bytes), else generated once and kept in the store.
async fn request_state_key(cfg: &Config, store: &dyn TaskStore) -> Result<[u8; 32]> {
    if let Some(var) = &cfg.auth.request_state_key_env
        && let Ok(v) = std::env::var(var)
    {
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, v.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(d.as_ref());
        if v.len() < 32 {
            anyhow::bail!("auth.request_state_key_env: ${var} must hold at least 32 bytes");
        }
        return Ok(key);
    }
    Ok(store.secret("mrtr-request-state").await?)
}

/// Status transitions feed the task metrics, and free the limits' per-task state once
/// a task is terminal or gone.
fn observe_transitions(engine: &Engine, limits: Arc<taskgate::limits::Limits>) {
    use taskgate::store::now_ms;
    engine.observe(Box::new(|t| {
        taskgate::metrics::task_moved(t.from.map(|s| s.as_str()), t.to.map(|s| s.as_str()));
        if let (Some(from), Some(to)) = (t.from, t.to)
            && to.is_terminal()
            && !from.is_terminal()
        {
            let secs = now_ms().saturating_sub(t.created_at_ms) as f64 / 1000.0;
            taskgate::metrics::task_finished(to.as_str(), secs);
        }
    }));
    engine.observe(Box::new(move |t| {
        let finished =
            t.from.is_some_and(|f| !f.is_terminal()) && t.to.is_some_and(|s| s.is_terminal());
        if finished || t.to.is_none() {
            limits.task_done(t.task_id);
        }
    }));
}

/// Seed the `taskgate_tasks` gauge from the records the store holds. Counting a large
/// store takes seconds (1M records), so it runs on its own thread, off the start-up
/// path; transitions that race the count can skew the gauge by a few (the gauge is an
/// operational view, not an invariant).
fn seed_task_gauge(store: Arc<dyn TaskStore>) {
    let rt = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        match rt.block_on(store.count_by_status()) {
            Ok(counts) => {
                let total: u64 = counts.iter().map(|(_, n)| n).sum();
                for (status, n) in counts {
                    taskgate::metrics::task_gauge(status.as_str(), n as f64);
                }
                tracing::info!(
                    tasks = total,
                    elapsed_ms = t0.elapsed().as_millis() as u64,
                    "task gauge counted from the store"
                );
            }
            Err(e) => tracing::warn!(error = %e, "counting the stored tasks failed"),
        }
        // The pass pulled every record through the store's cache; hand the memory it
        // freed back to the OS instead of keeping it in the allocator.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free heap pages; no pointers change.
        unsafe {
            libc::malloc_trim(0);
        }
    });
}

/// Seed `taskgate_legacy_sessions_open` from the sessions the store holds (bounded by
/// principals × the per-principal cap: one quick pass, off the start-up path all the
/// same).
fn seed_session_gauge(store: Arc<dyn TaskStore>) {
    tokio::spawn(async move {
        match store.count_sessions().await {
            Ok(n) => taskgate::metrics::legacy_sessions_open(n as f64),
            Err(e) => tracing::warn!(error = %e, "counting the stored legacy sessions failed"),
        }
    });
}

/// On a store shared by replicas, count `taskgate_tasks` (and
/// `taskgate_legacy_sessions_open`) afresh every ten sweep
/// intervals: the transitions other replicas make never reach this one's gauge, so
/// moving it by its own transitions alone lets the replicas' gauges drift apart.
/// The count is one `GROUP BY` query; a transition racing it is corrected by the next.
fn recount_task_gauge(store: Arc<dyn TaskStore>, sweep_interval: std::time::Duration) {
    let every = sweep_interval
        .saturating_mul(10)
        .max(std::time::Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match store.count_by_status().await {
                Ok(counts) => {
                    let counts: Vec<(&'static str, u64)> =
                        counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
                    taskgate::metrics::task_gauge_recounted(&counts);
                }
                Err(e) => tracing::warn!(error = %e, "recounting the stored tasks failed"),
            }
            match store.count_sessions().await {
                Ok(n) => taskgate::metrics::legacy_sessions_recounted(n),
                Err(e) => {
                    tracing::warn!(error = %e, "recounting the stored legacy sessions failed")
                }
            }
        }
    });
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot install SIGTERM handler");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        shutdown.cancel();
    });
}
