//! The PostgreSQL schema's migrations (ARCHITECTURE.md "PostgreSQL schema"): the
//! versioned files under `migrations/postgres/`, applied at start-up in one
//! transaction under an advisory lock, so replicas starting together neither race nor
//! apply a migration twice.

use super::sql::statements;
use super::{OP_TIMEOUT, PgError, PgSettings};
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

    record: RecordMigration<'a> { version: i32, name: &'a str }
        = "INSERT INTO schema_migrations (version, name) VALUES ($version, $name)";
}

/// The migrations, in order. A version is never edited once released; a change is a
/// new file.
pub(super) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "upstream_tool_headers",
        include_str!("../../../migrations/postgres/0002_upstream_tool_headers.sql"),
    ),
    (
        3,
        "legacy_sessions",
        include_str!("../../../migrations/postgres/0003_legacy_sessions.sql"),
    ),
    (
        4,
        "owner_index",
        include_str!("../../../migrations/postgres/0004_owner_index.sql"),
    ),
    (
        5,
        "tenant_index",
        include_str!("../../../migrations/postgres/0005_tenant_index.sql"),
    ),
];

/// The newest schema version this gateway knows.
pub const LATEST_MIGRATION: i32 = 5;

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
}

/// Bring the schema up to date: create it if needed and apply every migration it
/// lacks, all in one transaction under a transaction-scoped advisory lock keyed by
/// the schema name (replicas starting at once queue on it; the lock goes with the
/// transaction, even if the connection dies). Uses its own connection.
pub async fn migrate(settings: &PgSettings) -> Result<Migrated, StoreError> {
    let (cfg, tls) = settings.pg_config()?;
    let sql = MigrationSql::new().map_err(SetupError::Statement)?;
    let run = async {
        let (mut client, conn) = cfg.connect(tls).await?;
        let conn = tokio::spawn(conn);
        let out = match connection_is_tls(&sql, &client).await {
            Ok(tls) => migrate_on(&sql, &mut client, &settings.schema, tls).await,
            Err(e) => Err(e),
        };
        drop(client);
        let _ = conn.await;
        out
    };
    match tokio::time::timeout(OP_TIMEOUT * 3, run).await {
        Ok(r) => r.map_err(|e| e.into_store("migrations")),
        Err(_) => Err(PgError::Timeout.into_store("migrations")),
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
    client: &mut tokio_postgres::Client,
    schema: &str,
    tls: bool,
) -> Result<Migrated, PgError> {
    let tx = client.transaction().await?;
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
    for (version, name, migration) in MIGRATIONS {
        if *version <= current {
            continue;
        }
        tx.batch_execute(migration).await?;
        let record = RecordMigration {
            version: *version,
            name,
        };
        sql.record.execute(&tx, &record).await?;
        applied += 1;
    }
    tx.commit().await?;
    Ok(Migrated {
        applied,
        version: current.max(LATEST_MIGRATION),
        tls,
    })
}
