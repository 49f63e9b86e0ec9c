//! The PostgreSQL schema's migrations (ARCHITECTURE.md "PostgreSQL schema"): the
//! versioned files under `migrations/postgres/`, applied at start-up in one
//! transaction under an advisory lock, so replicas starting together neither race nor
//! apply a migration twice.

use super::sql::{Pooling, statements};
use super::{OP_TIMEOUT, PgError, PgSettings};
use crate::config::StorePooler;
use crate::store::{SetupError, StoreError};

statements! {
    /// The migrations' statements (on a connection of their own).
    pub(super) struct MigrationSql;

    /// Whether this connection's session is encrypted, as the server sees it.
    connection_tls: ConnectionTls {}
        = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

    /// The transaction-scoped lock that serialises replicas migrating one schema.
    lock: MigrationLock<'a> { key: &'a str }
        = "SELECT pg_advisory_xact_lock(hashtextextended($key, 0))";

    current_version: CurrentVersion {}
        = "SELECT coalesce(max(version), 0) FROM schema_migrations";

    record: RecordMigration<'a> { version: i32, name: &'a str, min_known: Option<i32> }
        = "INSERT INTO schema_migrations (version, name, min_known)
           VALUES ($version, $name, $min_known)";

    /// Before version 6 the table has no `min_known` column.
    record_before_floor: RecordOlderMigration<'a> { version: i32, name: &'a str }
        = "INSERT INTO schema_migrations (version, name) VALUES ($version, $name)";

    /// The oldest schema version a gateway must know to serve this schema (0 when no
    /// migration asks for one).
    floor: ServingFloor {}
        = "SELECT coalesce(max(min_known), 0) FROM schema_migrations";
}

/// One versioned migration file.
pub(super) struct Migration {
    pub(super) version: i32,
    pub(super) name: &'static str,
    pub(super) sql: &'static str,
    /// The oldest schema version a gateway must know to serve a schema that includes
    /// this migration (docs/design.md §27 "Mixed versions"): the newest version the
    /// release before this one knew, so that release and this one serve the schema
    /// together and anything older refuses to start. `None` before version
    /// [`FLOOR_VERSION`], which added the column that records it.
    pub(super) min_known: Option<i32>,
}

/// The migration that added `schema_migrations.min_known`.
const FLOOR_VERSION: i32 = 6;

/// The newest schema version of the release before this one (the last release's
/// [`LATEST_MIGRATION`]): the `min_known` of every migration this release adds.
pub(super) const PREVIOUS_RELEASE: i32 = 5;

macro_rules! migration {
    ($version:literal, $name:literal, $file:literal, $min_known:expr) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../migrations/postgres/", $file)),
            min_known: $min_known,
        }
    };
}

/// The migrations, in order. A version is never edited once released; a change is a
/// new file, expand-only: it may add tables, columns and indexes the previous release
/// ignores, never remove or repurpose what that release still reads.
pub(super) const MIGRATIONS: &[Migration] = &[
    migration!(1, "init", "0001_init.sql", None),
    migration!(
        2,
        "upstream_tool_headers",
        "0002_upstream_tool_headers.sql",
        None
    ),
    migration!(3, "legacy_sessions", "0003_legacy_sessions.sql", None),
    migration!(4, "owner_index", "0004_owner_index.sql", None),
    migration!(5, "tenant_index", "0005_tenant_index.sql", None),
    migration!(
        6,
        "release_floor",
        "0006_release_floor.sql",
        Some(PREVIOUS_RELEASE)
    ),
];

/// The newest schema version this gateway knows.
pub const LATEST_MIGRATION: i32 = 6;

/// What [`migrate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// Versions applied by this call (0 when the schema was up to date).
    pub applied: usize,
    /// The schema's version afterwards (may be newer than [`LATEST_MIGRATION`] when a
    /// newer gateway migrated it).
    pub version: i32,
    /// Whether the migrations' connection is TLS (`pg_stat_ssl`): what `sslmode=prefer`
    /// settled on, for the start-up log.
    pub tls: bool,
    /// The oldest schema version a gateway must know to serve the schema
    /// (the highest `min_known` of the migrations applied).
    pub floor: i32,
}

impl Migrated {
    /// Whether a newer release migrated the schema: this gateway serves it as the
    /// release before that one (docs/design.md §27 "Mixed versions").
    pub fn newer_release(&self) -> bool {
        self.version > LATEST_MIGRATION
    }
}

/// Bring the schema up to date: create it if needed and apply every migration it
/// lacks, all in one transaction under a transaction-scoped advisory lock keyed by
/// the schema name (replicas starting at once queue on it; the lock goes with the
/// transaction, even if the connection dies). Uses its own connection.
pub async fn migrate(settings: &PgSettings) -> Result<Migrated, StoreError> {
    let (cfg, tls) = settings.pg_config()?;
    let pooling = settings.pooling(&[]);
    let sql = MigrationSql::new(&pooling).map_err(SetupError::Statement)?;
    let run = async {
        let (mut client, conn) = cfg.connect(tls).await.map_err(options_refused)?;
        let conn = tokio::spawn(conn);
        let out = match session_kept(settings, &client).await {
            Ok(()) => match connection_is_tls(&sql, &client).await {
                Ok(tls) => migrate_on(&sql, &pooling, &mut client, &settings.schema, tls).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        drop(client);
        let _ = conn.await;
        out
    };
    let m = match tokio::time::timeout(OP_TIMEOUT * 3, run).await {
        Ok(r) => r.map_err(|e| e.into_store("migrations"))?,
        Err(_) => return Err(PgError::Timeout.into_store("migrations")),
    };
    // Checked after the transaction: a gateway this old has no migration the schema
    // lacks, so it changed nothing.
    if m.floor > LATEST_MIGRATION {
        return Err(StoreError::Setup(SetupError::TooOld {
            schema: settings.schema.clone(),
            version: m.version,
            floor: m.floor,
            known: LATEST_MIGRATION,
        }));
    }
    Ok(m)
}

/// A connection refused for its start-up options: a transaction-mode pooler
/// (PgBouncer says "unsupported startup parameter: options").
fn options_refused(e: tokio_postgres::Error) -> PgError {
    match e.as_db_error() {
        Some(db) if db.message().starts_with("unsupported startup parameter") => {
            PgError::Setup(SetupError::Pooler(format!(
                "the server refused the connection's start-up options ({})",
                db.message()
            )))
        }
        _ => PgError::Db(e),
    }
}

/// Before anything is written: with `pooler = "none"`, the session settings of the
/// start-up packet must have arrived. A pooler that drops them (PgBouncer's
/// `ignore_startup_parameters = options`) would otherwise have the migrations create
/// tables in whatever schema the server's `search_path` names.
async fn session_kept(
    settings: &PgSettings,
    client: &tokio_postgres::Client,
) -> Result<(), PgError> {
    if settings.pooler != StorePooler::None {
        return Ok(());
    }
    let rows = client.simple_query("SHOW search_path").await?;
    let found = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    });
    match found {
        Some(p) if p == settings.schema => Ok(()),
        other => Err(PgError::Setup(SetupError::Pooler(format!(
            "the connection's start-up options did not arrive (search_path is {:?}, not {:?})",
            other.unwrap_or_default(),
            settings.schema
        )))),
    }
}

/// Whether this connection's session is encrypted, as the server sees it.
async fn connection_is_tls(
    sql: &MigrationSql,
    client: &tokio_postgres::Client,
) -> Result<bool, PgError> {
    let row = sql
        .connection_tls
        .query_opt(client, &ConnectionTls {})
        .await?;
    Ok(match row {
        Some(r) => r.try_get(0)?,
        None => false,
    })
}

async fn migrate_on(
    sql: &MigrationSql,
    pooling: &Pooling,
    client: &mut tokio_postgres::Client,
    schema: &str,
    tls: bool,
) -> Result<Migrated, PgError> {
    let tx = client.transaction().await?;
    pooling.enter(&tx).await?;
    let key = format!("taskgate migrations {schema}");
    sql.lock.execute(&tx, &MigrationLock { key: &key }).await?;
    // The name was checked to be a plain identifier (`is_pg_schema_name`).
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await?;
    let current: i32 = sql
        .current_version
        .query_one(&tx, &CurrentVersion {})
        .await?
        .try_get(0)?;
    let mut applied = 0;
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.batch_execute(m.sql).await?;
        if m.version < FLOOR_VERSION {
            let record = RecordOlderMigration {
                version: m.version,
                name: m.name,
            };
            sql.record_before_floor.execute(&tx, &record).await?;
        } else {
            let record = RecordMigration {
                version: m.version,
                name: m.name,
                min_known: m.min_known,
            };
            sql.record.execute(&tx, &record).await?;
        }
        applied += 1;
    }
    let floor: i32 = sql
        .floor
        .query_one(&tx, &ServingFloor {})
        .await?
        .try_get(0)?;
    tx.commit().await?;
    Ok(Migrated {
        applied,
        version: current.max(LATEST_MIGRATION),
        tls,
        floor,
    })
}
