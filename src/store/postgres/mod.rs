//! The PostgreSQL [`TaskStore`]: one database shared by several gateway replicas
//! (README "Store backends", ARCHITECTURE.md "PostgreSQL schema").
//!
//! - Every write commits before it returns, with `synchronous_commit = on` (set on
//!   each connection at start-up), so [`TaskStore::flush`] has nothing left to do: a
//!   task id that a create returned is already on the primary's disk.
//! - A create is one statement (data-modifying CTEs: claim the idempotency key, insert
//!   the task, insert its request route), so one round trip, all or nothing.
//! - Updates are compare-and-swap on the row's `version` column: read, apply, write
//!   where the version is unchanged, retry otherwise. The read is skipped when this
//!   store wrote the task last and that write is still current (`last_written.rs`).
//! - Records are stored as the bytes of their JSON (`bytea`), never `jsonb`.
//! - Reads go to the connection's server, which must be the primary (the URL names it).
//! - The schema comes from the versioned files under `migrations/postgres/`, applied at
//!   start-up in one transaction under an advisory lock, so replicas starting together
//!   neither race nor apply a migration twice.
//! - Every connection (pool, migrations, LISTEN, publish) goes through [`PgTls`], with
//!   the `sslmode`/`sslrootcert` of `store.url` (README "TLS", "PostgreSQL").
//! - Every statement is declared in `statements.rs` (the migrations' in `migrate.rs`)
//!   with its parameters by name, numbered once when the store is built (`sql.rs`), and
//!   prepared once per pooled connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::FutureExt;
use rand::RngCore;
use tokio_postgres::error::SqlState;

mod cluster;
mod import;
mod last_written;
mod migrate;
mod purge;
mod sessions;
mod sql;
mod statements;
mod tls;

pub use import::{Batch, PgImport, SessionRow, TableRows, TaskRow, TombstoneRow};
pub use migrate::{LATEST_MIGRATION, Migrated, migrate};
use sql::Pooling;
pub use sql::SqlError;
pub use tls::{PgTls, PgTlsConnect, PgTlsStream, PgUrl, RootCert, SslMode, UrlError, parse_url};

use statements::{
    CountByStatus, CreateKeyed, CreatePlain, ExpiredTasks, GetIdempotency, GetSecret, GetTask,
    GetTombstone, GetUpstreamIdentity, HeldRoutes, ListOwned, ListTenant, LiveTasks, LookupOwned,
    MarkSeen, PutRoute, PutSecret, PutUpstreamIdentity, RecoverableRoutes, RemoveRoute, Statements,
    SweepTombstones, TenantCounts, UpdateRead, UpdateWrite,
};

use super::cluster::Seat;
use super::{
    Corruption, Created, Expired, IdempotencyEntry, IoError, Owned, OwnedSession, OwnerCursor,
    Purged, QuotaCreated, RequestRoute, SCHEMA_VERSION, SessionCreated, SessionRecord,
    SessionUpdate, SetupError, StoreError, StoredIdentity, TaskRecord, TaskStatus, TaskStore,
    TenantCount, Tombstone, Update,
};
use crate::config::as_millis;
use crate::config::{StoreConfig, StorePooler, is_pg_schema_name};
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use futures_util::future::BoxFuture;

/// Longest any one store operation may take (pool wait, connect and query together).
/// Past it the operation fails, so a database that hangs turns into errors (503s and
/// `/readyz` 503) instead of requests that never answer.
const OP_TIMEOUT: Duration = super::OPERATION_LIMIT;
/// Connecting to the database, and waiting for a pooled connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the health probe runs: it is what turns `/readyz` back to 200 on its own
/// once the database is back while no request is coming in.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// The server-side `statement_timeout` of pooled connections, below [`OP_TIMEOUT`]: a
/// statement the database is still running when the gateway is about to give up on it
/// is cancelled there (rolled back) rather than committing after the client was told it
/// failed. It narrows that window; a commit whose reply is lost can still happen
/// (docs/design.md §16).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(8);

/// What the backend needs from `[store]`.
#[derive(Debug, Clone)]
pub struct PgSettings {
    pub url: String,
    pub pool_size: usize,
    pub schema: String,
    /// How long a replica's lease lasts past each renewal (`store.lease_ms`).
    pub lease_ms: u64,
    /// What sits between the gateway and PostgreSQL (`store.pooler`).
    pub pooler: StorePooler,
}

impl PgSettings {
    pub fn from_config(cfg: &StoreConfig) -> Result<Self, StoreError> {
        let url = cfg
            .postgres_url()
            .map_err(|e| SetupError::Config(Arc::new(e)))?;
        Ok(Self {
            url,
            pool_size: cfg.pool_size.max(1),
            schema: cfg.schema.clone(),
            lease_ms: as_millis(cfg.lease),
            pooler: cfg.pooler,
        })
    }

    /// `store.url` parsed, its TLS settings taken out ([`parse_url`]).
    fn parsed_url(&self) -> Result<PgUrl, StoreError> {
        Ok(parse_url(&self.url).map_err(url_error)?)
    }

    /// The connection settings: the URL, and with it the TLS connector of its
    /// `sslmode`. Every connection's session has `search_path` (so every statement
    /// names tables unqualified) and `synchronous_commit = on` (so a commit is flushed
    /// before it is acknowledged, whatever the server's default): directly, both are
    /// sent in the start-up packet, no extra round trip per connection; behind a
    /// transaction pooler, which refuses that option, they go with each transaction
    /// ([`PgSettings::pooling`]).
    fn pg_config(&self) -> Result<(tokio_postgres::Config, PgTls), StoreError> {
        if !is_pg_schema_name(&self.schema) {
            return Err(SetupError::Schema(self.schema.clone()).into());
        }
        let url = self.parsed_url()?;
        let tls = url.connector().map_err(url_error)?;
        let mut c = url.config;
        if self.pooler == StorePooler::None {
            let mut options = c.get_options().unwrap_or_default().to_string();
            for (k, v) in self.session_settings() {
                if !options.is_empty() {
                    options.push(' ');
                }
                options.push_str(&format!("-c {k}={v}"));
            }
            c.options(&options);
        }
        if c.get_application_name().is_none() {
            c.application_name("taskgate");
        }
        if c.get_connect_timeout().is_none() {
            c.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok((c, tls))
    }

    /// The settings every session needs (see [`PgSettings::pg_config`]).
    fn session_settings(&self) -> [(&'static str, &str); 2] {
        [
            ("search_path", self.schema.as_str()),
            ("synchronous_commit", "on"),
        ]
    }

    /// How statements reach the server with `extra` settings beyond the session's
    /// (docs/design.md §27 "Connection poolers").
    fn pooling(&self, extra: &[(&'static str, &str)]) -> Pooling {
        match self.pooler {
            StorePooler::None => Pooling::Direct,
            StorePooler::Transaction => {
                let mut all = self.session_settings().to_vec();
                all.extend_from_slice(extra);
                Pooling::transaction(&all)
            }
        }
    }
}

/// One connection to `url`, with the TLS its `sslmode`/`sslrootcert` ask for, its
/// driver on a task of its own: for tools and tests that query the database
/// themselves (the store opens its own connections).
pub async fn connect_url(url: &str) -> Result<tokio_postgres::Client, StoreError> {
    let parsed = parse_url(url).map_err(url_error)?;
    let tls = parsed.connector().map_err(url_error)?;
    let (client, conn) = parsed
        .config
        .connect(tls)
        .await
        .map_err(|e| IoError::Connect(Arc::new(e)))?;
    tokio::spawn(conn);
    Ok(client)
}

fn url_error(e: UrlError) -> SetupError {
    SetupError::Url(Arc::new(e))
}

/// An error inside this backend, before it becomes a [`StoreError`].
#[derive(Debug)]
enum PgError {
    Pool(deadpool_postgres::PoolError),
    Db(tokio_postgres::Error),
    Timeout,
    Corrupt(Corruption),
    /// A fenced write found that this replica no longer holds the call.
    Fenced,
    /// The connection is not what the settings say it is (`SetupError::Pooler`).
    Setup(SetupError),
}

impl From<deadpool_postgres::PoolError> for PgError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Pool(e)
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e)
    }
}

impl PgError {
    /// Whether the database (not the request) is at fault: unreachable, restarting,
    /// out of connections, too slow. Those turn the store unhealthy.
    fn is_outage(&self) -> bool {
        match self {
            Self::Pool(_) | Self::Timeout => true,
            // No SQLSTATE: the connection itself failed. Class 08 (connection
            // exception), 57 (operator intervention: shutdown, crash recovery) and 53
            // (insufficient resources) are outages too.
            Self::Db(e) => match e.code() {
                None => true,
                Some(c) => {
                    let c = c.code();
                    c.starts_with("08") || c.starts_with("57") || c.starts_with("53")
                }
            },
            Self::Corrupt(_) | Self::Fenced | Self::Setup(_) => false,
        }
    }

    /// `op` names the operation in the error's text.
    fn into_store(self, op: &'static str) -> StoreError {
        match self {
            Self::Corrupt(m) => StoreError::Corrupt(m),
            Self::Fenced => StoreError::Fenced,
            Self::Setup(e) => StoreError::Setup(e),
            Self::Timeout => IoError::TimedOut {
                op,
                after: OP_TIMEOUT,
            }
            .into(),
            Self::Pool(e) => IoError::Pool {
                op,
                source: Arc::new(e),
            }
            .into(),
            Self::Db(e) => IoError::Postgres {
                op,
                source: Arc::new(e),
            }
            .into(),
        }
    }
}

/// The server's message when there is one (`Error`'s Display says only "db error"),
/// else the error with its causes (only they say why a TLS handshake failed).
pub(super) fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => crate::tls::error_chain(e),
    }
}

/// See the module documentation.
pub struct PgStore {
    pool: Pool,
    /// Every statement, numbered once (`statements.rs`).
    sql: Statements,
    /// How the statements reach the server; also what a transaction of this store
    /// applies first ([`Pooling::enter`]).
    pooling: Pooling,
    schema: String,
    healthy: AtomicBool,
    /// For the dedicated LISTEN connection (a pooled one would drop notifications).
    pg_config: tokio_postgres::Config,
    /// The TLS connector of every connection.
    tls: PgTls,
    lease_ms: u64,
    /// This replica's seat once registered ([`super::cluster::Cluster::register`]):
    /// request routes written after that name it.
    seat: parking_lot::RwLock<Option<Seat>>,
    /// The connection change notifications are published on (`synchronous_commit =
    /// off`, never a pooled one: see `cluster.rs`).
    publisher: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    /// This store itself, for the listener task it starts.
    me: std::sync::OnceLock<Weak<PgStore>>,
    /// The version of each live task this store wrote last, so its next write can skip
    /// the read (`last_written.rs`).
    last_written: last_written::LastWritten,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Migrate, then open the pool and check that it reaches the database.
    pub async fn open(settings: &PgSettings) -> Result<Arc<Self>, StoreError> {
        let started = Instant::now();
        let url = settings.parsed_url()?;
        if let Some(w) = tls::prefer_warning(&url) {
            tracing::warn!("{w}");
        }
        let m = migrate(settings).await?;
        tracing::info!(
            "PostgreSQL connection: TLS {} (sslmode={})",
            if m.tls { "on" } else { "off" },
            url.mode
        );
        if let Some(w) = tls::plaintext_warning(&url, m.tls) {
            tracing::warn!("{w}");
        }
        if m.newer_release() {
            // Allowed: `migrate` refused anything older than the release before the
            // one that migrated (docs/design.md §27 "Mixed versions").
            tracing::warn!(
                schema = %settings.schema,
                version = m.version,
                known = LATEST_MIGRATION,
                "the database schema was migrated by the next release (version {}); this taskgate \
                 knows version {LATEST_MIGRATION} and serves it beside that release until it is upgraded",
                m.version
            );
        }
        let store = Self::connect_lazy(settings)?;
        store
            .run("start-up check", async {
                let c = store.pool.get().await?;
                c.simple_query("SELECT 1").await?;
                Ok(())
            })
            .await?;
        tracing::info!(
            schema = %settings.schema,
            version = m.version,
            applied = m.applied,
            pool_size = settings.pool_size,
            ms = started.elapsed().as_millis() as u64,
            "postgres store ready"
        );
        Ok(store)
    }

    /// The pool, without connecting yet and without migrating (for [`PgStore::open`] and for
    /// tests that migrate on their own). Starts the health probe when called inside a
    /// tokio runtime.
    pub fn connect_lazy(settings: &PgSettings) -> Result<Arc<Self>, StoreError> {
        let (pg_config, tls) = settings.pg_config()?;
        let mut pooled = pg_config.clone();
        let timeout = STATEMENT_TIMEOUT.as_millis().to_string();
        let pooling = settings.pooling(&[("statement_timeout", &timeout)]);
        if let Pooling::Direct = pooling {
            let mut options = pooled.get_options().unwrap_or_default().to_string();
            options.push_str(&format!(" -c statement_timeout={timeout}"));
            pooled.options(&options);
        }
        let mgr = Manager::from_config(
            pooled,
            tls.clone(),
            ManagerConfig {
                // A connection that broke is noticed when used (the error marks the
                // store unhealthy) and dropped by the pool; no check query per use.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| SetupError::Pool(Arc::new(e)))?;
        let sql = Statements::new(&pooling).map_err(SetupError::Statement)?;
        let store = Arc::new(Self {
            pool,
            sql,
            pooling,
            schema: settings.schema.clone(),
            healthy: AtomicBool::new(true),
            pg_config,
            tls,
            lease_ms: settings.lease_ms,
            seat: parking_lot::RwLock::new(None),
            publisher: tokio::sync::Mutex::new(None),
            me: std::sync::OnceLock::new(),
            last_written: Default::default(),
        });
        let _ = store.me.set(Arc::downgrade(&store));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(probe(Arc::downgrade(&store)));
        }
        Ok(store)
    }

    /// The schema this store uses.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The request routes `rows` lists (`route_id`, `record`).
    fn decode_routes(rows: &[tokio_postgres::Row]) -> Result<Vec<RequestRoute>, PgError> {
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                let bytes: Vec<u8> = row.try_get(1)?;
                decode(&format!("request_routes/{id}"), &bytes)
            })
            .collect()
    }

    /// The `replica_id`/`epoch` columns of a route written now: this replica's seat,
    /// or NULLs before one is registered.
    fn seat_columns(&self) -> (Option<String>, Option<i64>) {
        match self.seat.read().clone() {
            Some(s) => (Some(s.replica_id), Some(s.epoch)),
            None => (None, None),
        }
    }

    /// Run one operation with the time limit, keeping the health flag current. While
    /// the store is marked unreachable the operation fails at once instead: one
    /// request never waits out the operation limit twice (a creation is several
    /// operations), and requests do not pile up on stalled connections. The health
    /// probe and the lease's own operations ([`PgStore::attempt`]) still reach the
    /// database, and their first success lifts this.
    async fn run<T>(
        &self,
        what: &'static str,
        op: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, StoreError> {
        if !self.healthy.load(Ordering::Relaxed) {
            return Err(IoError::Unreachable {
                op: what,
                probe_every: PROBE_INTERVAL,
            }
            .into());
        }
        self.attempt(what, op).await
    }

    /// [`PgStore::run`] without the shortcut: always tries the database.
    async fn attempt<T>(
        &self,
        what: &'static str,
        op: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, StoreError> {
        let r = match tokio::time::timeout(OP_TIMEOUT, op).await {
            Ok(r) => r,
            Err(_) => Err(PgError::Timeout),
        };
        match r {
            Ok(v) => {
                self.healthy.store(true, Ordering::Relaxed);
                Ok(v)
            }
            Err(e) => {
                if e.is_outage() {
                    if self.healthy.swap(false, Ordering::Relaxed) {
                        tracing::error!(error = %e.as_display(), "postgres store unreachable");
                    }
                } else {
                    self.healthy.store(true, Ordering::Relaxed);
                }
                Err(e.into_store(what))
            }
        }
    }
}

impl PgError {
    fn as_display(&self) -> String {
        match self {
            Self::Pool(e) => e.to_string(),
            Self::Db(e) => db_message(e),
            Self::Timeout => "timeout".into(),
            Self::Corrupt(m) => m.to_string(),
            Self::Fenced => "fenced".into(),
            Self::Setup(e) => e.to_string(),
        }
    }
}

/// Ping the database every [`PROBE_INTERVAL`] while the store lives, so that health
/// follows the database both ways without waiting for traffic.
async fn probe(store: Weak<PgStore>) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(s) = store.upgrade() else { return };
        let _ = s
            .attempt("health probe", async {
                let c = s.pool.get().await?;
                c.simple_query("SELECT 1").await?;
                Ok(())
            })
            .await;
    }
}

/// `u64` milliseconds as PostgreSQL `bigint` (saturating: no real time is that far).
fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, PgError> {
    crate::store::probe::decode();
    serde_json::from_slice(bytes)
        .map_err(|e| PgError::Corrupt(Corruption::from(format!("{what}: {e}")).caused_by(e)))
}

fn encode<T: serde::Serialize>(what: &str, v: &T) -> Result<Vec<u8>, PgError> {
    serde_json::to_vec(v)
        .map_err(|e| PgError::Corrupt(Corruption::from(format!("{what}: {e}")).caused_by(e)))
}

fn parse_status(s: &str) -> Result<TaskStatus, PgError> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| PgError::Corrupt(format!("task_routes.status: unknown status {s:?}").into()))
}

impl PgStore {
    /// A creation, under the tenant's quota when `max_live` is given: one statement,
    /// so one round trip before the handle goes out.
    async fn create_now(
        &self,
        task: &TaskRecord,
        route: &RequestRoute,
        key: Option<&[u8]>,
        max_live: Option<u64>,
    ) -> Result<QuotaCreated, PgError> {
        let mut rec = task.clone();
        rec.v = SCHEMA_VERSION;
        let record = encode("task record", &rec)?;
        let route_record = encode("request route", route)?;
        let (replica, epoch) = self.seat_columns();
        let max_live = max_live.map(ms);
        let c = self.pool.get().await?;
        let r = match key {
            None => self
                .sql
                .create_plain
                .query_one(
                    &c,
                    &CreatePlain {
                        task_id: &rec.task_id,
                        tenant: &rec.tenant,
                        subject: &rec.subject,
                        status: rec.status.as_str(),
                        expires_at_ms: ms(rec.expires_at_ms),
                        record: &record,
                        route_id: &route.route_id,
                        route_task_id: route.task_id.as_deref(),
                        upstream: &route.upstream,
                        route_record: &route_record,
                        replica_id: replica.as_deref(),
                        epoch,
                        task_upstream: &rec.upstream,
                        created_at_ms: ms(rec.created_at_ms),
                        max_live,
                    },
                )
                .await
                .and_then(|row| {
                    let created: i64 = row.try_get(0)?;
                    let live: Option<i64> = row.try_get(1)?;
                    Ok(match live {
                        Some(n) if created == 0 => QuotaCreated::OverQuota {
                            live: n.max(0) as u64,
                        },
                        _ => QuotaCreated::Done(Created::New),
                    })
                }),
            Some(k) => {
                let row = self
                    .sql
                    .create_keyed
                    .query_one(
                        &c,
                        &CreateKeyed {
                            key: k,
                            task_id: &rec.task_id,
                            args_fingerprint: &rec.args_fingerprint,
                            tenant: &rec.tenant,
                            subject: &rec.subject,
                            status: rec.status.as_str(),
                            expires_at_ms: ms(rec.expires_at_ms),
                            record: &record,
                            route_id: &route.route_id,
                            route_task_id: route.task_id.as_deref(),
                            upstream: &route.upstream,
                            route_record: &route_record,
                            replica_id: replica.as_deref(),
                            epoch,
                            task_upstream: &rec.upstream,
                            created_at_ms: ms(rec.created_at_ms),
                            max_live,
                        },
                    )
                    .await;
                match row {
                    Err(e) => Err(e),
                    Ok(row) => {
                        let created: i64 = row.try_get(0)?;
                        if created > 0 {
                            self.last_written.remember(1, rec, record.len());
                            return Ok(QuotaCreated::Done(Created::New));
                        }
                        let task_id: Option<String> = row.try_get(1)?;
                        let fp: Option<String> = row.try_get(2)?;
                        let live: Option<i64> = row.try_get(3)?;
                        match (task_id, fp, live) {
                            (Some(task_id), Some(args_fingerprint), _) => {
                                return Ok(QuotaCreated::Done(Created::Existing(
                                    IdempotencyEntry {
                                        task_id,
                                        args_fingerprint,
                                    },
                                )));
                            }
                            (_, _, Some(n)) if max_live.is_some_and(|m| n >= m) => {
                                return Ok(QuotaCreated::OverQuota {
                                    live: n.max(0) as u64,
                                });
                            }
                            // The claim that beat this one committed after this
                            // statement's snapshot was taken: read it now.
                            _ => {
                                drop(c);
                                return match self.idempotency_now(k).await? {
                                    Some(e) => Ok(QuotaCreated::Done(Created::Existing(e))),
                                    None => Err(PgError::Corrupt(
                                        "idempotency: key was claimed but no entry was found"
                                            .into(),
                                    )),
                                };
                            }
                        }
                    }
                }
            }
        };
        match r {
            Ok(v) => {
                if matches!(v, QuotaCreated::Done(Created::New)) {
                    // A row is created at version 1.
                    self.last_written.remember(1, rec, record.len());
                }
                Ok(v)
            }
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                let what = format!(
                    "task_routes/{}: a task or route with this id already exists ({})",
                    rec.task_id,
                    db_message(&e)
                );
                Err(PgError::Corrupt(Corruption::from(what).caused_by(e)))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn get_now(&self, task_id: &str) -> Result<Option<TaskRecord>, PgError> {
        let c = self.pool.get().await?;
        match self
            .sql
            .get_task
            .query_opt(&c, &GetTask { task_id })
            .await?
        {
            None => Ok(None),
            Some(row) => {
                let bytes: Vec<u8> = row.try_get(0)?;
                decode(&format!("task_routes/{task_id}"), &bytes).map(Some)
            }
        }
    }

    /// A compare-and-swap update; with `release` (a fenced call's last write), a write
    /// that leaves the record terminal removes the route in the same statement. Returns
    /// the record after the call and whether the route went.
    async fn update_now(
        &self,
        task_id: &str,
        route_id: Option<&str>,
        f: &mut (dyn FnMut(&mut TaskRecord) -> bool + Send),
        release: bool,
    ) -> Result<(Option<TaskRecord>, bool), PgError> {
        let c = self.pool.get().await?;
        // This store's own last write, if it is still current: write at its version
        // without reading. Anything else (another writer since, the fence fell, the
        // edit declines a record that may be stale) goes on to the read below.
        if let Some((version, mut rec)) = self.last_written.take(task_id)
            && f(&mut rec)
            && let Some(done) = self
                .write_at(&c, task_id, version, rec, route_id, release)
                .await?
        {
            return Ok(done);
        }
        loop {
            // The fence (`route_id`; none for an unfenced write): the route still names
            // its seat and that seat's lease is live. Read with the record and
            // re-checked by the write itself, so a takeover between the two still wins.
            let read = UpdateRead { task_id, route_id };
            let Some(row) = self.sql.update_read.query_opt(&c, &read).await? else {
                return Ok((None, false));
            };
            let version: i64 = row.try_get(0)?;
            let bytes: Vec<u8> = row.try_get(1)?;
            let holds: bool = row.try_get(2)?;
            if !holds {
                return Err(PgError::Fenced);
            }
            let old: TaskRecord = decode(&format!("task_routes/{task_id}"), &bytes)?;
            let mut rec = old.clone();
            if !f(&mut rec) {
                return Ok((Some(old), false));
            }
            if let Some(done) = self
                .write_at(&c, task_id, version, rec, route_id, release)
                .await?
            {
                return Ok(done);
            }
            // Another writer won the round, the task expired, or the fence fell
            // between read and write: read again (a fallen fence fails there).
        }
    }

    /// The write of a compare-and-swap update: `rec` where the row is still at
    /// `version` (and the fence holds). `None` if it wrote nothing; otherwise the record
    /// written and whether the route went, remembered for the next write.
    async fn write_at(
        &self,
        c: &deadpool_postgres::Object,
        task_id: &str,
        version: i64,
        mut rec: TaskRecord,
        route_id: Option<&str>,
        release: bool,
    ) -> Result<Option<(Option<TaskRecord>, bool)>, PgError> {
        rec.task_id = task_id.to_string();
        rec.v = SCHEMA_VERSION;
        let record = encode("task record", &rec)?;
        let write = UpdateWrite {
            task_id,
            version,
            tenant: &rec.tenant,
            subject: &rec.subject,
            status: rec.status.as_str(),
            expires_at_ms: ms(rec.expires_at_ms),
            record: &record,
            route_id,
            upstream: &rec.upstream,
            created_at_ms: ms(rec.created_at_ms),
            release: release && route_id.is_some() && rec.status.is_terminal(),
        };
        let row = self.sql.update_write.query_one(c, &write).await?;
        let (written, removed): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        if written != 1 {
            return Ok(None);
        }
        if !rec.status.is_terminal() {
            self.last_written
                .remember(version + 1, rec.clone(), record.len());
        }
        Ok(Some((Some(rec), removed == 1)))
    }

    async fn idempotency_now(&self, key: &[u8]) -> Result<Option<IdempotencyEntry>, PgError> {
        let c = self.pool.get().await?;
        match self
            .sql
            .idempotency
            .query_opt(&c, &GetIdempotency { key })
            .await?
        {
            None => Ok(None),
            Some(row) => Ok(Some(IdempotencyEntry {
                task_id: row.try_get(0)?,
                args_fingerprint: row.try_get(1)?,
            })),
        }
    }

    async fn expire_now(
        &self,
        task_id: &str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> Result<Option<Expired>, PgError> {
        let c = self.pool.get().await?;
        let expire = statements::Expire {
            task_id,
            now_ms: ms(now_ms),
            tombstone_until_ms: ms(tombstone_until_ms),
        };
        let Some(row) = self.sql.expire.query_opt(&c, &expire).await? else {
            return Ok(None);
        };
        let bytes: Vec<u8> = row.try_get(0)?;
        let seen: bool = row.try_get(1)?;
        let record = decode(&format!("task_routes/{task_id}"), &bytes)?;
        Ok(Some(Expired { record, seen }))
    }

    async fn list_owned_now(
        &self,
        tenant: &str,
        subject: &str,
        upstream: &str,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, PgError> {
        // PostgreSQL text holds no NUL, so no row names such an owner or upstream.
        if [tenant, subject, upstream].iter().any(|s| s.contains('\0')) {
            return Ok(Vec::new());
        }
        let (after_ms, after_id) = cursor_params(after);
        let c = self.pool.get().await?;
        let page = ListOwned {
            tenant,
            subject,
            upstream,
            after_ms,
            after_id,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        let rows = self.sql.list_owned.query(&c, &page).await?;
        decode_records(&rows, "task_routes (owner index)")
    }

    async fn list_tenant_now(
        &self,
        tenant: &str,
        status: TaskStatus,
        after: Option<&OwnerCursor>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, PgError> {
        // As `list_owned_now`: no row holds a NUL, and a cursor is cut at one.
        if tenant.contains('\0') {
            return Ok(Vec::new());
        }
        let (after_ms, after_id) = cursor_params(after);
        let c = self.pool.get().await?;
        let page = ListTenant {
            tenant,
            status: status.as_str(),
            after_ms,
            after_id,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        let rows = self.sql.list_tenant.query(&c, &page).await?;
        decode_records(&rows, "task_routes (tenant index)")
    }

    async fn tenant_counts_now(&self) -> Result<Vec<TenantCount>, PgError> {
        let c = self.pool.get().await?;
        let rows = self.sql.tenant_counts.query(&c, &TenantCounts {}).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let status: String = row.try_get(1)?;
            // A status this version does not know (a newer writer's) is left out.
            let Some(status) = TaskStatus::parse(&status) else {
                continue;
            };
            let n: i64 = row.try_get(2)?;
            out.push(TenantCount {
                tenant: row.try_get(0)?,
                status,
                tasks: u64::try_from(n).unwrap_or(0),
            });
        }
        Ok(out)
    }

    async fn mark_seen_now(&self, task_ids: &[String]) -> Result<(), PgError> {
        if task_ids.is_empty() {
            return Ok(());
        }
        let c = self.pool.get().await?;
        match self.sql.mark_seen.execute(&c, &MarkSeen { task_ids }).await {
            Ok(_) => Ok(()),
            // A task expired between the SELECT and the insert: its mark is skipped,
            // as for any task that is gone (and the others of this batch with it,
            // which at worst counts them unread).
            Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn secret_now(&self, name: &str) -> Result<[u8; 32], PgError> {
        let c = self.pool.get().await?;
        for _ in 0..2 {
            if let Some(row) = self.sql.secret.query_opt(&c, &GetSecret { name }).await? {
                let bytes: Vec<u8> = row.try_get(0)?;
                return <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                    PgError::Corrupt(format!("store_secrets/{name}: not 32 bytes").into())
                });
            }
            let mut fresh = [0u8; 32];
            rand::rng().fill_bytes(&mut fresh);
            let put = PutSecret {
                name,
                secret: &fresh,
            };
            self.sql.put_secret.execute(&c, &put).await?;
        }
        Err(PgError::Corrupt(
            format!("store_secrets/{name}: inserted but not found").into(),
        ))
    }
}

/// The `(after_ms, after_id)` parameters of a page query resuming after `after`
/// (`-1, ""` for the first page). A cursor id with a NUL is cut at it: no stored id
/// lies between the cut and the whole (none holds a NUL), so "after" selects the
/// same rows.
fn cursor_params(after: Option<&OwnerCursor>) -> (i64, &str) {
    match after {
        Some(c) => (
            ms(c.created_at_ms),
            c.task_id.split('\0').next().unwrap_or_default(),
        ),
        None => (-1, ""),
    }
}

/// The task records of a page query's rows (the record is column 0).
fn decode_records(rows: &[tokio_postgres::Row], what: &str) -> Result<Vec<TaskRecord>, PgError> {
    rows.iter()
        .map(|row| {
            let bytes: Vec<u8> = row.try_get(0)?;
            decode(what, &bytes)
        })
        .collect()
}

impl TaskStore for PgStore {
    fn create<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<Created, StoreError>> {
        self.run("create", async move {
            match self.create_now(task, route, idempotency_key, None).await? {
                QuotaCreated::Done(c) => Ok(c),
                // Unreachable without a quota; named rather than assumed.
                QuotaCreated::OverQuota { live } => Err(PgError::Corrupt(
                    format!("create: refused over a quota it was not given ({live} live)").into(),
                )),
            }
        })
        .boxed()
    }

    fn create_within_quota<'a>(
        &'a self,
        task: &'a TaskRecord,
        route: &'a RequestRoute,
        idempotency_key: Option<&'a [u8]>,
        max_live: u64,
    ) -> BoxFuture<'a, Result<QuotaCreated, StoreError>> {
        self.run("create", async move {
            self.create_now(task, route, idempotency_key, Some(max_live))
                .await
        })
        .boxed()
    }

    /// Every write committed (synchronously) before it returned: nothing to do.
    fn flush(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn get<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        self.run("get", async move { self.get_now(task_id).await })
            .boxed()
    }

    fn update<'a>(
        &'a self,
        task_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        self.run("update", async move {
            Ok(self.update_now(task_id, None, f, false).await?.0)
        })
        .boxed()
    }

    fn update_fenced<'a>(
        &'a self,
        task_id: &'a str,
        route_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, StoreError>> {
        self.run("update", async move {
            Ok(self.update_now(task_id, Some(route_id), f, false).await?.0)
        })
        .boxed()
    }

    fn update_fenced_releasing<'a>(
        &'a self,
        task_id: &'a str,
        route_id: &'a str,
        f: Update<'a>,
    ) -> BoxFuture<'a, Result<(Option<TaskRecord>, bool), StoreError>> {
        self.run("update", async move {
            self.update_now(task_id, Some(route_id), f, true).await
        })
        .boxed()
    }

    fn put_route<'a>(&'a self, route: &'a RequestRoute) -> BoxFuture<'a, Result<(), StoreError>> {
        self.run("put_route", async move {
            let record = encode("request route", route)?;
            let c = self.pool.get().await?;
            let (replica, epoch) = self.seat_columns();
            let put = PutRoute {
                route_id: &route.route_id,
                task_id: route.task_id.as_deref(),
                upstream: &route.upstream,
                record: &record,
                replica_id: replica.as_deref(),
                epoch,
            };
            self.sql.put_route.execute(&c, &put).await?;
            Ok(())
        })
        .boxed()
    }

    fn remove_route<'a>(&'a self, route_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.run("remove_route", async move {
            let c = self.pool.get().await?;
            let remove = RemoveRoute { route_id };
            self.sql.remove_route.execute(&c, &remove).await?;
            Ok(())
        })
        .boxed()
    }

    fn routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        // Before any seat is registered (one gateway on the schema, or tests) every
        // route is this process's; after, only the routes of this replica's earlier
        // epochs, and those no seat names (written before replicas held leases).
        self.run("routes", async move {
            let (replica, epoch) = self.seat_columns();
            let c = self.pool.get().await?;
            let seat = RecoverableRoutes {
                replica_id: replica.as_deref(),
                epoch,
            };
            Self::decode_routes(&self.sql.routes.query(&c, &seat).await?)
        })
        .boxed()
    }

    fn held_routes(&self) -> BoxFuture<'_, Result<Vec<RequestRoute>, StoreError>> {
        // Without a seat every route is this process's (one gateway on the schema).
        self.run("held_routes", async move {
            let (replica, epoch) = self.seat_columns();
            let c = self.pool.get().await?;
            let seat = HeldRoutes {
                replica_id: replica.as_deref(),
                epoch,
            };
            Self::decode_routes(&self.sql.held_routes.query(&c, &seat).await?)
        })
        .boxed()
    }

    fn idempotency_get<'a>(
        &'a self,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<IdempotencyEntry>, StoreError>> {
        self.run(
            "idempotency_get",
            async move { self.idempotency_now(key).await },
        )
        .boxed()
    }

    fn count_by_status(&self) -> BoxFuture<'_, Result<Vec<(TaskStatus, u64)>, StoreError>> {
        self.run("count_by_status", async move {
            let c = self.pool.get().await?;
            let rows = self
                .sql
                .count_by_status
                .query(&c, &CountByStatus {})
                .await?;
            rows.iter()
                .map(|row| {
                    let status: String = row.try_get(0)?;
                    let n: i64 = row.try_get(1)?;
                    Ok((parse_status(&status)?, n.max(0) as u64))
                })
                .collect()
        })
        .boxed()
    }

    fn expired(&self, now_ms: u64, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        self.run("expired", async move {
            let c = self.pool.get().await?;
            let due = ExpiredTasks {
                now_ms: ms(now_ms),
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
            };
            let rows = self.sql.expired.query(&c, &due).await?;
            rows.iter()
                .map(|r| r.try_get::<_, String>(0).map_err(PgError::from))
                .collect()
        })
        .boxed()
    }

    fn expire<'a>(
        &'a self,
        task_id: &'a str,
        now_ms: u64,
        tombstone_until_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Expired>, StoreError>> {
        self.run("expire", async move {
            self.expire_now(task_id, now_ms, tombstone_until_ms).await
        })
        .boxed()
    }

    fn mark_seen<'a>(&'a self, task_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        self.run(
            "mark_seen",
            async move { self.mark_seen_now(task_ids).await },
        )
        .boxed()
    }

    fn lookup_owned<'a>(
        &'a self,
        task_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<Owned, StoreError>> {
        self.run("lookup_owned", async move {
            // PostgreSQL text holds no NUL, so no row can name such an owner.
            if tenant.contains('\0') || subject.contains('\0') {
                return Ok(Owned::Unknown);
            }
            let c = self.pool.get().await?;
            // One statement probes both tables by primary key on every path, and the
            // owner is matched on the columns beside the record: another principal's
            // task or tombstone reads like an id never issued, and nothing of it is
            // decoded (docs/design.md §7 "Ownership").
            let owner = LookupOwned {
                task_id,
                tenant,
                subject,
            };
            crate::store::probe::read();
            let row = self.sql.lookup_owned.query_one(&c, &owner).await?;
            let record: Option<Vec<u8>> = row.try_get(0)?;
            let expired: bool = row.try_get(1)?;
            Ok(match record {
                Some(bytes) => {
                    Owned::Record(Box::new(decode(&format!("task_routes/{task_id}"), &bytes)?))
                }
                None if expired => Owned::Expired,
                None => Owned::Unknown,
            })
        })
        .boxed()
    }

    fn list_owned<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        upstream: &'a str,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        self.run("list_owned", async move {
            self.list_owned_now(tenant, subject, upstream, after, limit)
                .await
        })
        .boxed()
    }

    fn tombstone<'a>(
        &'a self,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, StoreError>> {
        self.run("tombstone", async move {
            let c = self.pool.get().await?;
            let tomb = GetTombstone { task_id };
            let Some(row) = self.sql.tombstone.query_opt(&c, &tomb).await? else {
                return Ok(None);
            };
            let at: i64 = row.try_get(3)?;
            Ok(Some(Tombstone {
                v: SCHEMA_VERSION,
                task_id: task_id.to_string(),
                tenant: row.try_get(0)?,
                subject: row.try_get(1)?,
                idempotency_index_key: row.try_get(2)?,
                expires_at_ms: at.max(0) as u64,
            }))
        })
        .boxed()
    }

    fn sweep_tombstones(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        self.run("sweep_tombstones", async move {
            let c = self.pool.get().await?;
            let due = SweepTombstones { now_ms: ms(now_ms) };
            let row = self.sql.sweep_tombstones.query_one(&c, &due).await?;
            let n: i64 = row.try_get(0)?;
            Ok(n.max(0) as usize)
        })
        .boxed()
    }

    fn list_tenant<'a>(
        &'a self,
        tenant: &'a str,
        status: TaskStatus,
        after: Option<&'a OwnerCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<TaskRecord>, StoreError>> {
        self.run("list_tenant", async move {
            self.list_tenant_now(tenant, status, after, limit).await
        })
        .boxed()
    }

    fn tenant_counts(&self) -> BoxFuture<'_, Result<Vec<TenantCount>, StoreError>> {
        self.run("tenant_counts", self.tenant_counts_now()).boxed()
    }

    fn live_tasks<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.run("live_tasks", async move {
            let c = self.pool.get().await?;
            let live = LiveTasks { tenant };
            let n: i64 = self.sql.live_tasks.query_one(&c, &live).await?.try_get(0)?;
            Ok(n.max(0) as u64)
        })
        .boxed()
    }

    fn upstream_identity<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamInfo>, StoreError>> {
        self.run("upstream_identity", async move {
            let c = self.pool.get().await?;
            let get = GetUpstreamIdentity { name };
            match self.sql.upstream_identity.query_opt(&c, &get).await? {
                None => Ok(None),
                Some(row) => {
                    let bytes: Vec<u8> = row.try_get(0)?;
                    decode::<StoredIdentity<UpstreamInfo>>(
                        &format!("upstream_identities/{name}"),
                        &bytes,
                    )
                    .map(|stored| Some(stored.info))
                }
            }
        })
        .boxed()
    }

    fn put_upstream_identity<'a>(
        &'a self,
        name: &'a str,
        identity: &'a UpstreamInfo,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.run("put_upstream_identity", async move {
            let record = encode("upstream identity", &StoredIdentity::current(identity))?;
            let c = self.pool.get().await?;
            // Compared as bytes: an identical record is not rewritten.
            let put = PutUpstreamIdentity {
                name,
                record: &record,
            };
            Ok(self.sql.put_upstream_identity.execute(&c, &put).await? > 0)
        })
        .boxed()
    }

    fn upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ToolHeaders>, StoreError>> {
        self.run("upstream_tool_headers", async move {
            let c = self.pool.get().await?;
            let get = statements::GetUpstreamToolHeaders { name };
            match self.sql.upstream_tool_headers.query_opt(&c, &get).await? {
                None => Ok(None),
                Some(row) => {
                    let bytes: Vec<u8> = row.try_get(0)?;
                    decode::<super::StoredToolHeaders>(
                        &format!("upstream_tool_headers/{name}"),
                        &bytes,
                    )
                    .map(|stored| Some(stored.tools))
                }
            }
        })
        .boxed()
    }

    fn put_upstream_tool_headers<'a>(
        &'a self,
        name: &'a str,
        headers: &'a ToolHeaders,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.run("put_upstream_tool_headers", async move {
            let stored = super::StoredToolHeaders::current(headers);
            let record = encode("upstream tool headers", &stored)?;
            let c = self.pool.get().await?;
            let put = statements::PutUpstreamToolHeaders {
                name,
                record: &record,
            };
            Ok(self.sql.put_upstream_tool_headers.execute(&c, &put).await? > 0)
        })
        .boxed()
    }

    fn secret<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<[u8; 32], StoreError>> {
        self.run("secret", async move { self.secret_now(name).await })
            .boxed()
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    // 2025-era client sessions (`sessions.rs`).

    fn create_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        cap: usize,
    ) -> BoxFuture<'a, Result<SessionCreated, StoreError>> {
        self.run("create_session", async move {
            self.create_session_now(session, cap).await
        })
        .boxed()
    }

    fn session_owned<'a>(
        &'a self,
        session_id: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<OwnedSession, StoreError>> {
        self.run("session_owned", async move {
            self.session_owned_now(session_id, tenant, subject).await
        })
        .boxed()
    }

    fn update_session<'a>(
        &'a self,
        session_id: &'a str,
        f: SessionUpdate<'a>,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, StoreError>> {
        self.run("update_session", async move {
            self.update_session_now(session_id, f).await
        })
        .boxed()
    }

    fn delete_session<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.run("delete_session", async move {
            self.delete_session_now(session_id).await
        })
        .boxed()
    }

    fn expire_session<'a>(
        &'a self,
        session_id: &'a str,
        last_seen_before_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.run("expire_session", async move {
            self.expire_session_now(session_id, last_seen_before_ms)
                .await
        })
        .boxed()
    }

    fn idle_sessions(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        self.run("idle_sessions", async move {
            self.idle_sessions_now(before_ms, limit).await
        })
        .boxed()
    }

    fn count_sessions(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.run(
            "count_sessions",
            async move { self.count_sessions_now().await },
        )
        .boxed()
    }

    fn purge_tenant<'a>(
        &'a self,
        tenant: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Purged, StoreError>> {
        self.run("purge_tenant", async move {
            self.purge_tenant_now(tenant, limit).await
        })
        .boxed()
    }
}

// Only with feature `external-tests`: every user needs the cluster (Cargo.toml).
#[cfg(all(test, feature = "external-tests"))]
pub(crate) mod testing {
    //! A fresh schema per test on the cluster `scripts/pg.sh` starts.

    use std::sync::atomic::AtomicU32;

    use super::*;

    /// The variable `scripts/pg.sh` exports.
    pub(crate) const URL_VAR: &str = "TASKGATE_TEST_PG_URL";

    /// The test cluster's URL. Never skips: a PostgreSQL test without a database fails
    /// and says how to get one.
    pub(crate) fn url() -> String {
        match std::env::var(URL_VAR) {
            Ok(u) if !u.is_empty() => u,
            _ => panic!(
                "{URL_VAR} is not set: PostgreSQL tests need the cluster scripts/pg.sh starts. \
                 Run them under it, e.g. `bash scripts/pg.sh run cargo nextest run --release --features external-tests --lib -E 'test(/postgres/)'` \
                 (scripts/test.sh does this for the whole suite)"
            ),
        }
    }

    /// A schema name no other test (in this or another process) uses.
    pub(crate) fn unique_schema(prefix: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let mut r = [0u8; 4];
        rand::rng().fill_bytes(&mut r);
        format!(
            "{prefix}_{}_{n}_{:08x}",
            std::process::id(),
            u32::from_le_bytes(r)
        )
    }

    pub(crate) fn settings(schema: &str) -> PgSettings {
        PgSettings {
            url: url(),
            pool_size: 8,
            schema: schema.to_string(),
            lease_ms: 10_000,
            pooler: Default::default(),
        }
    }

    /// Migrate `schema` from a thread of its own (callers are inside a
    /// current-thread runtime and cannot block on it).
    pub(crate) fn migrate_blocking(s: &PgSettings) -> Migrated {
        let s = s.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(migrate(&s)).expect("migrate")
        })
        .join()
        .expect("migration thread")
    }
}

/// Tests on the test cluster (feature `external-tests`; the cluster-free ones are in
/// `tests` below).
#[cfg(all(test, feature = "external-tests"))]
mod database_tests {
    use super::testing::*;
    use super::*;
    use crate::store::test_records;
    use migrate::MIGRATIONS;

    #[tokio::test]
    async fn postgres_migrations_are_idempotent_and_recorded() {
        let s = settings(&unique_schema("mig"));
        let first = migrate(&s).await.expect("first");
        assert_eq!(
            first,
            Migrated {
                applied: MIGRATIONS.len(),
                version: LATEST_MIGRATION,
                tls: first.tls,
                floor: migrate::PREVIOUS_RELEASE,
            }
        );
        let again = migrate(&s).await.expect("again");
        assert_eq!(
            again,
            Migrated {
                applied: 0,
                version: LATEST_MIGRATION,
                tls: first.tls,
                floor: migrate::PREVIOUS_RELEASE,
            }
        );
        let store = PgStore::open(&s).await.expect("open");
        let c = store.pool.get().await.expect("conn");
        let rows = c
            .query(
                "SELECT version, name FROM schema_migrations ORDER BY version",
                &[],
            )
            .await
            .expect("query");
        assert_eq!(rows.len(), MIGRATIONS.len());
        let sync: String = c
            .query_one("SHOW synchronous_commit", &[])
            .await
            .expect("show")
            .get(0);
        assert_eq!(sync, "on");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_replicas_starting_together_migrate_once() {
        let s = settings(&unique_schema("race"));
        let runs: Vec<_> = (0..6)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { migrate(&s).await })
            })
            .collect();
        let mut applied = 0;
        for r in runs {
            applied += r.await.expect("join").expect("migrate").applied;
        }
        assert_eq!(
            applied,
            MIGRATIONS.len(),
            "each migration applied exactly once"
        );
    }

    /// docs/design.md §27 "Mixed versions": a schema the next release migrated is
    /// served; one migrated two releases ahead is refused with the versions named, and
    /// refusing changes nothing.
    #[tokio::test]
    async fn postgres_a_gateway_serves_the_next_release_and_refuses_a_later_one() {
        let schema = unique_schema("floor");
        let s = settings(&schema);
        migrate(&s).await.expect("migrate");
        let c = connect_url(&s.url).await.expect("connect");
        let future = |version: i32, min_known: i32| {
            format!(
                "INSERT INTO {schema}.schema_migrations (version, name, min_known)
                 VALUES ({version}, 'future_{version}', {min_known})"
            )
        };
        // The next release: expand-only, serves beside this one.
        let next = LATEST_MIGRATION + 1;
        c.batch_execute(&future(next, LATEST_MIGRATION))
            .await
            .expect("next release");
        let m = migrate(&s)
            .await
            .expect("the next release's schema is served");
        assert_eq!((m.applied, m.version, m.floor), (0, next, LATEST_MIGRATION));
        assert!(m.newer_release());
        PgStore::open(&s)
            .await
            .expect("open beside the next release");

        // The release after that needs gateways that know `next`: this one is too old.
        c.batch_execute(&future(next + 1, next))
            .await
            .expect("release after");
        let err = PgStore::open(&s).await.expect_err("too old");
        match &err {
            StoreError::Setup(SetupError::TooOld {
                version,
                floor,
                known,
                ..
            }) => assert_eq!(
                (*version, *floor, *known),
                (next + 1, next, LATEST_MIGRATION)
            ),
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains(&format!("version {}", next + 1))
                && text.contains("more than one release older")
                && text.contains(&schema),
            "{text}"
        );
        let rows: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM {schema}.schema_migrations"),
                &[],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(
            rows,
            i64::from(LATEST_MIGRATION) + 2,
            "nothing was recorded"
        );
    }

    #[tokio::test]
    async fn postgres_records_are_byte_exact() {
        let s = settings(&unique_schema("bytes"));
        let store = PgStore::open(&s).await.expect("open");
        let text = r#"{"b":1,"a":1e999,"z":-0,"n":12345678901234567890123}"#;
        let result: serde_json::Value = serde_json::from_str(text).expect("json");
        let now = super::super::now_ms();
        let rec = TaskRecord {
            status: TaskStatus::Completed,
            result: Some(result),
            ..test_records::task("tsk_bytes", "acme", now + 1000)
        };
        let route = test_records::route("rt_bytes", Some("tsk_bytes"));
        // What serde writes is what the table holds, byte for byte, and what comes back.
        let written = serde_json::to_vec(&rec).expect("encode");
        let before = serde_json::to_string(&rec.result).expect("text");
        store.create(&rec, &route, None).await.expect("create");
        let c = store.pool.get().await.expect("conn");
        let raw: Vec<u8> = c
            .query_one(
                "SELECT record FROM task_routes WHERE task_id = 'tsk_bytes'",
                &[],
            )
            .await
            .expect("raw")
            .get(0);
        assert_eq!(raw, written);
        let got = store.get("tsk_bytes").await.expect("get").expect("some");
        let out = serde_json::to_string(&got.result).expect("text");
        assert_eq!(
            out, before,
            "key order and number text survive the round trip"
        );
        assert!(out.starts_with(r#"{"b":1,"a":1e"#) && out.contains("12345678901234567890123"));
    }

    /// Migration 4 on a schema that holds tasks: the owner columns are filled from the
    /// records (a record that is not JSON is left out, not fatal), and a gateway of
    /// version 3, inserting without them, still gets its tasks listed.
    #[tokio::test]
    async fn postgres_owner_index_is_backfilled_and_filled_for_older_gateways() {
        let schema = unique_schema("owner");
        let s = settings(&schema);
        let c = connect_url(&s.url).await.expect("connect");
        c.batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema};
             CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());"
        ))
        .await
        .expect("schema");
        for m in MIGRATIONS.iter().filter(|m| m.version <= 3) {
            c.batch_execute(m.sql).await.expect("older migration");
            c.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                &[&m.version, &m.name],
            )
            .await
            .expect("record");
        }
        // The insert of a version-3 gateway: no owner columns.
        let insert_v3 = |rec: &TaskRecord| {
            let record = serde_json::to_vec(rec).expect("encode");
            let (id, tenant, subject) =
                (rec.task_id.clone(), rec.tenant.clone(), rec.subject.clone());
            let expires = ms(rec.expires_at_ms);
            let c = &c;
            async move {
                c.execute(
                    "INSERT INTO task_routes (task_id, tenant, subject, status, expires_at_ms,
                         idem_key, version, record)
                     VALUES ($1, $2, $3, 'working', $4, NULL, 1, $5)",
                    &[&id, &tenant, &subject, &expires, &record],
                )
                .await
                .expect("v3 insert");
            }
        };
        let later = super::super::now_ms() + 3_600_000;
        let at = |id: &str, created: u64| TaskRecord {
            created_at_ms: created,
            ..test_records::task(id, "acme", later)
        };
        insert_v3(&at("tsk_old2", 20)).await;
        insert_v3(&at("tsk_old1", 10)).await;
        insert_v3(&TaskRecord {
            upstream: "other".into(),
            ..at("tsk_elsewhere", 5)
        })
        .await;
        c.execute(
            "INSERT INTO task_routes (task_id, tenant, subject, status, expires_at_ms, idem_key,
                 version, record)
             VALUES ('tsk_junk', 'acme', 'alice', 'working', $1, NULL, 1, '\\xff00'::bytea)",
            &[&ms(later)],
        )
        .await
        .expect("junk row");

        let m = migrate(&s).await.expect("migrate to the latest");
        assert_eq!(m.applied, MIGRATIONS.len() - 3, "{m:?}");
        let store = PgStore::open(&s).await.expect("open");
        let ids = |recs: Vec<TaskRecord>| recs.into_iter().map(|r| r.task_id).collect::<Vec<_>>();
        let listed = store
            .list_owned("acme", "alice", "demo", None, 10)
            .await
            .expect("list");
        assert_eq!(ids(listed), ["tsk_old1", "tsk_old2"]);
        let junk: Option<String> = c
            .query_one(
                "SELECT upstream FROM task_routes WHERE task_id = 'tsk_junk'",
                &[],
            )
            .await
            .expect("junk")
            .get(0);
        assert_eq!(junk, None);
        // A version-3 replica still running after the migration: the trigger fills in.
        insert_v3(&at("tsk_old3", 30)).await;
        let listed = store
            .list_owned("acme", "alice", "demo", None, 10)
            .await
            .expect("list");
        assert_eq!(ids(listed), ["tsk_old1", "tsk_old2", "tsk_old3"]);
        let elsewhere = store
            .list_owned("acme", "alice", "other", None, 10)
            .await
            .expect("list");
        assert_eq!(ids(elsewhere), ["tsk_elsewhere"]);
    }

    /// The page query is served by the owner index, not a scan of the tasks.
    #[tokio::test]
    async fn postgres_owner_pages_use_the_index() {
        let s = settings(&unique_schema("ownerplan"));
        let store = PgStore::open(&s).await.expect("open");
        let c = store.pool.get().await.expect("conn");
        c.batch_execute("SET enable_seqscan = off")
            .await
            .expect("set");
        for (after_ms, after_id) in [(-1i64, ""), (5, "tsk_x")] {
            let plan: Vec<String> = c
                .query(
                    &format!("EXPLAIN {}", store.sql.list_owned.sql()),
                    &[&"acme", &"alice", &"demo", &after_ms, &after_id, &10i64],
                )
                .await
                .expect("explain")
                .iter()
                .map(|r| r.get(0))
                .collect();
            let plan = plan.join("\n");
            assert!(plan.contains("task_routes_owner"), "{plan}");
            assert!(!plan.contains("Sort"), "ordered by the index: {plan}");
        }
    }

    /// The operator API's page query is served by the tenant index.
    #[tokio::test]
    async fn postgres_tenant_pages_use_the_index() {
        let s = settings(&unique_schema("tenantplan"));
        let store = PgStore::open(&s).await.expect("open");
        let c = store.pool.get().await.expect("conn");
        // A table of some size, so the planner weighs the indexes as it would in
        // production (on an empty one any index will do).
        c.batch_execute(
            "INSERT INTO task_routes (task_id, tenant, subject, status, expires_at_ms,
                 version, record, upstream, created_at_ms)
             SELECT 'tsk_' || i, 't' || (i % 2), 's', (ARRAY['working', 'completed',
                 'failed', 'cancelled', 'input_required'])[1 + i % 5], 1, 1, '\\x7b7d',
                 'demo', i
             FROM generate_series(1, 20000) AS i;
             ANALYZE task_routes;
             SET enable_seqscan = off;",
        )
        .await
        .expect("fill");
        for (after_ms, after_id) in [(-1i64, ""), (5, "tsk_x")] {
            let plan: Vec<String> = c
                .query(
                    &format!("EXPLAIN {}", store.sql.list_tenant.sql()),
                    &[&"t1", &"completed", &after_ms, &after_id, &10i64],
                )
                .await
                .expect("explain")
                .iter()
                .map(|r| r.get(0))
                .collect();
            let plan = plan.join("\n");
            assert!(plan.contains("task_routes_tenant_status"), "{plan}");
            assert!(!plan.contains("Sort"), "ordered by the index: {plan}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn postgres_unreachable_is_unhealthy_and_errors() {
        // Nothing listens on port 1.
        let s = PgSettings {
            url: "postgres://postgres@127.0.0.1:1/postgres".into(),
            pool_size: 2,
            schema: "taskgate".into(),
            lease_ms: 10_000,
            pooler: Default::default(),
        };
        let store = PgStore::connect_lazy(&s).expect("pool");
        let err = store.get("tsk_x").await.expect_err("no database");
        assert!(
            matches!(err, StoreError::Io(IoError::Pool { op: "get", .. })),
            "{err:?}"
        );
        // The pool's error stays reachable as the source (in its `Arc`).
        let pool = std::error::Error::source(&err)
            .and_then(std::error::Error::source)
            .and_then(|e| e.downcast_ref::<Arc<deadpool_postgres::PoolError>>());
        assert!(
            matches!(
                pool.map(|p| &**p),
                Some(deadpool_postgres::PoolError::Backend(_))
            ),
            "{err:?}"
        );
        assert!(!store.healthy());
        assert!(PgStore::open(&s).await.is_err());
    }
}
