//! Rows another store brings in (`taskgate store migrate`, docs/design.md §27 "Moving
//! a sled store to PostgreSQL"): one statement per batch of a kind, each an
//! `INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING` over array parameters, so
//! a batch is one round trip and a rerun inserts nothing twice. Each statement also
//! says, from the same snapshot, how many of the batch's keys the table already held
//! with the same content and which it held with other content.
//!
//! Two rules for other content. Task records, tombstones, idempotency claims and
//! secrets are facts that must not change in a move: a batch that meets one that
//! differs inserts nothing and names it (the caller refuses to go on). Upstream
//! identities, tool header maps and 2025-era sessions are rewritten whenever they
//! change: the table's row is newer than anything the source could bring, and it is
//! kept.

use super::sql::statements;
use super::{PgError, PgSettings, db_message, migrate, tls};
use crate::store::{IoError, StoreError};

/// The closing select of every copy statement: rows inserted, keys already held with
/// the same content (`existing.same`), and the keys held with other content.
macro_rules! tally {
    () => {
        "
SELECT (SELECT count(*) FROM ins),
       (SELECT count(*) FROM existing WHERE same),
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM existing WHERE NOT same)"
    };
}

statements! {
    /// The statements of an import (on a connection of its own).
    pub(super) struct ImportSql;

    /// Task records with the columns beside them. A batch holding a task the table
    /// has with other bytes inserts nothing.
    tasks: CopyTasks<'a> {
        task_ids: &'a [&'a str],
        tenants: &'a [&'a str],
        subjects: &'a [&'a str],
        statuses: &'a [&'a str],
        expires_at_ms: &'a [i64],
        idem_keys: &'a [Option<&'a [u8]>],
        records: &'a [&'a [u8]],
        upstreams: &'a [&'a str],
        created_at_ms: &'a [i64],
    } = concat!("
WITH input AS (
    SELECT * FROM unnest($task_ids::text[], $tenants::text[], $subjects::text[],
        $statuses::text[], $expires_at_ms::bigint[], $idem_keys::bytea[], $records::bytea[],
        $upstreams::text[], $created_at_ms::bigint[])
        AS i(task_id, tenant, subject, status, expires_at_ms, idem_key, record, upstream,
             created_at_ms)
), existing AS (
    SELECT i.task_id AS id, t.record = i.record AS same
    FROM input i JOIN task_routes t ON t.task_id = i.task_id
), ins AS (
    INSERT INTO task_routes (task_id, tenant, subject, status, expires_at_ms, idem_key,
        version, record, upstream, created_at_ms)
    SELECT task_id, tenant, subject, status, expires_at_ms, idem_key, 1, record, upstream,
        created_at_ms
    FROM input WHERE NOT EXISTS (SELECT 1 FROM existing WHERE NOT same)
    ON CONFLICT (task_id) DO NOTHING
    RETURNING 1
)", tally!());

    /// The records the table holds for some task ids.
    task_records: TaskRecords<'a> { task_ids: &'a [&'a str] }
        = "SELECT task_id, record FROM task_routes WHERE task_id = ANY($task_ids)";

    /// Read marks, for the tasks of the batch the table holds.
    seen: CopySeen<'a> { task_ids: &'a [&'a str] } = concat!("
WITH existing AS (
    SELECT task_id AS id, true AS same FROM seen_marks WHERE task_id = ANY($task_ids)
), ins AS (
    INSERT INTO seen_marks (task_id)
    SELECT task_id FROM task_routes WHERE task_id = ANY($task_ids)
    ON CONFLICT (task_id) DO NOTHING
    RETURNING 1
)", tally!());

    tombstones: CopyTombstones<'a> {
        task_ids: &'a [&'a str],
        tenants: &'a [&'a str],
        subjects: &'a [&'a str],
        idem_keys: &'a [Option<&'a [u8]>],
        expires_at_ms: &'a [i64],
    } = concat!("
WITH input AS (
    SELECT * FROM unnest($task_ids::text[], $tenants::text[], $subjects::text[],
        $idem_keys::bytea[], $expires_at_ms::bigint[])
        AS i(task_id, tenant, subject, idem_key, expires_at_ms)
), existing AS (
    SELECT i.task_id AS id,
        (t.tenant, t.subject, t.idem_key, t.expires_at_ms)
            IS NOT DISTINCT FROM (i.tenant, i.subject, i.idem_key, i.expires_at_ms) AS same
    FROM input i JOIN tombstones t ON t.task_id = i.task_id
), ins AS (
    INSERT INTO tombstones (task_id, tenant, subject, idem_key, expires_at_ms)
    SELECT task_id, tenant, subject, idem_key, expires_at_ms
    FROM input WHERE NOT EXISTS (SELECT 1 FROM existing WHERE NOT same)
    ON CONFLICT (task_id) DO NOTHING
    RETURNING 1
)", tally!());

    /// Idempotency claims; a key is named by its hex in the tally.
    claims: CopyClaims<'a> {
        keys: &'a [&'a [u8]],
        task_ids: &'a [&'a str],
        fingerprints: &'a [&'a str],
    } = concat!("
WITH input AS (
    SELECT * FROM unnest($keys::bytea[], $task_ids::text[], $fingerprints::text[])
        AS i(key, task_id, args_fingerprint)
), existing AS (
    SELECT encode(i.key, 'hex') AS id,
        t.task_id = i.task_id AND t.args_fingerprint = i.args_fingerprint AS same
    FROM input i JOIN idempotency t ON t.key = i.key
), ins AS (
    INSERT INTO idempotency (key, task_id, args_fingerprint)
    SELECT key, task_id, args_fingerprint
    FROM input WHERE NOT EXISTS (SELECT 1 FROM existing WHERE NOT same)
    ON CONFLICT (key) DO NOTHING
    RETURNING 1
)", tally!());

    secrets: CopySecrets<'a> { names: &'a [&'a str], secrets: &'a [&'a [u8]] } = concat!("
WITH input AS (
    SELECT * FROM unnest($names::text[], $secrets::bytea[]) AS i(name, secret)
), existing AS (
    SELECT i.name AS id, t.secret = i.secret AS same
    FROM input i JOIN store_secrets t ON t.name = i.name
), ins AS (
    INSERT INTO store_secrets (name, secret)
    SELECT name, secret
    FROM input WHERE NOT EXISTS (SELECT 1 FROM existing WHERE NOT same)
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)", tally!());

    /// Upstream identities; the table's own record, if any, is kept.
    identities: CopyIdentities<'a> { names: &'a [&'a str], records: &'a [&'a [u8]] }
        = concat!("
WITH input AS (
    SELECT * FROM unnest($names::text[], $records::bytea[]) AS i(name, record)
), existing AS (
    SELECT i.name AS id, t.record = i.record AS same
    FROM input i JOIN upstream_identities t ON t.name = i.name
), ins AS (
    INSERT INTO upstream_identities (name, record) SELECT name, record FROM input
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)", tally!());

    /// Tool header maps; the table's own record, if any, is kept.
    tool_headers: CopyToolHeaders<'a> { names: &'a [&'a str], records: &'a [&'a [u8]] }
        = concat!("
WITH input AS (
    SELECT * FROM unnest($names::text[], $records::bytea[]) AS i(name, record)
), existing AS (
    SELECT i.name AS id, t.record = i.record AS same
    FROM input i JOIN upstream_tool_headers t ON t.name = i.name
), ins AS (
    INSERT INTO upstream_tool_headers (name, record) SELECT name, record FROM input
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)", tally!());

    /// 2025-era sessions; the table's own record, if any, is kept.
    sessions: CopySessions<'a> {
        session_ids: &'a [&'a str],
        tenants: &'a [&'a str],
        subjects: &'a [&'a str],
        last_seen_ms: &'a [i64],
        records: &'a [&'a [u8]],
    } = concat!("
WITH input AS (
    SELECT * FROM unnest($session_ids::text[], $tenants::text[], $subjects::text[],
        $last_seen_ms::bigint[], $records::bytea[])
        AS i(session_id, tenant, subject, last_seen_ms, record)
), existing AS (
    SELECT i.session_id AS id, t.record = i.record AS same
    FROM input i JOIN legacy_sessions t ON t.session_id = i.session_id
), ins AS (
    INSERT INTO legacy_sessions (session_id, tenant, subject, last_seen_ms, version, record)
    SELECT session_id, tenant, subject, last_seen_ms, 1, record FROM input
    ON CONFLICT (session_id) DO NOTHING
    RETURNING 1
)", tally!());

    /// A replica whose lease is live: a gateway serves this schema.
    serving: Serving {}
        = "SELECT replica_id FROM replicas WHERE lease_until > now()
           ORDER BY replica_id LIMIT 1";

    /// How many rows each table an import writes holds.
    table_rows: CountRows {} = "
SELECT (SELECT count(*) FROM store_secrets), (SELECT count(*) FROM upstream_identities),
       (SELECT count(*) FROM upstream_tool_headers), (SELECT count(*) FROM task_routes),
       (SELECT count(*) FROM seen_marks), (SELECT count(*) FROM tombstones),
       (SELECT count(*) FROM idempotency), (SELECT count(*) FROM legacy_sessions)";
}

/// What one batch found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Rows written by this batch.
    pub inserted: u64,
    /// Keys the table already held with the same content.
    pub same: u64,
    /// Keys the table already held with other content (in key order; an idempotency
    /// key as hex).
    pub differing: Vec<String>,
}

/// A task record and the columns beside it.
#[derive(Debug, Clone, Copy)]
pub struct TaskRow<'a> {
    pub task_id: &'a str,
    pub tenant: &'a str,
    pub subject: &'a str,
    pub status: &'a str,
    pub expires_at_ms: u64,
    pub idem_key: Option<&'a [u8]>,
    pub record: &'a [u8],
    pub upstream: &'a str,
    pub created_at_ms: u64,
}

/// A tombstone's columns.
#[derive(Debug, Clone, Copy)]
pub struct TombstoneRow<'a> {
    pub task_id: &'a str,
    pub tenant: &'a str,
    pub subject: &'a str,
    pub idem_key: Option<&'a [u8]>,
    pub expires_at_ms: u64,
}

/// A 2025-era session's record and the columns beside it.
#[derive(Debug, Clone, Copy)]
pub struct SessionRow<'a> {
    pub session_id: &'a str,
    pub tenant: &'a str,
    pub subject: &'a str,
    pub last_seen_ms: u64,
    pub record: &'a [u8],
}

/// How many rows each table an import writes holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableRows {
    pub secrets: u64,
    pub identities: u64,
    pub tool_headers: u64,
    pub tasks: u64,
    pub seen_marks: u64,
    pub tombstones: u64,
    pub claims: u64,
    pub sessions: u64,
}

/// A connection that writes what another store brings in, after the schema
/// migrations ran (see the module docs).
pub struct PgImport {
    client: tokio_postgres::Client,
    sql: ImportSql,
    schema: String,
    /// The schema's version after the migrations, and whether the connection is TLS.
    pub migrated: super::Migrated,
}

impl std::fmt::Debug for PgImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgImport")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

fn ms(v: u64) -> i64 {
    super::ms(v)
}

impl PgImport {
    /// Run the schema migrations (as a gateway starting on `settings` does), then open
    /// one connection with the same settings: `search_path`, `synchronous_commit = on`
    /// and the TLS of the URL's `sslmode`.
    pub async fn open(settings: &PgSettings) -> Result<Self, StoreError> {
        let url = settings.parsed_url()?;
        if let Some(w) = tls::prefer_warning(&url) {
            tracing::warn!("{w}");
        }
        let migrated = migrate::migrate(settings).await?;
        if let Some(w) = tls::plaintext_warning(&url, migrated.tls) {
            tracing::warn!("{w}");
        }
        let (cfg, tls) = settings.pg_config()?;
        let sql =
            ImportSql::new(&settings.pooling(&[])).map_err(crate::store::SetupError::Statement)?;
        let (client, conn) = cfg
            .connect(tls)
            .await
            .map_err(|e| IoError::Connect(std::sync::Arc::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::error!(error = %db_message(&e), "the import's PostgreSQL connection failed");
            }
        });
        Ok(Self {
            client,
            sql,
            schema: settings.schema.clone(),
            migrated,
        })
    }

    /// The schema written to.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    pub async fn tasks(&self, rows: &[TaskRow<'_>]) -> Result<Batch, StoreError> {
        let p = CopyTasks {
            task_ids: &column(rows, |r| r.task_id),
            tenants: &column(rows, |r| r.tenant),
            subjects: &column(rows, |r| r.subject),
            statuses: &column(rows, |r| r.status),
            expires_at_ms: &column(rows, |r| ms(r.expires_at_ms)),
            idem_keys: &column(rows, |r| r.idem_key),
            records: &column(rows, |r| r.record),
            upstreams: &column(rows, |r| r.upstream),
            created_at_ms: &column(rows, |r| ms(r.created_at_ms)),
        };
        tally(
            "copy tasks",
            self.sql.tasks.query_one(&self.client, &p).await,
        )
    }

    /// The records the table holds for `task_ids`, as `(task id, record bytes)`.
    pub async fn task_records(
        &self,
        task_ids: &[&str],
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let p = TaskRecords { task_ids };
        let rows = self
            .sql
            .task_records
            .query(&self.client, &p)
            .await
            .map_err(|e| PgError::from(e).into_store("read tasks"))?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| PgError::from(e).into_store("read tasks"))
    }

    pub async fn seen_marks(&self, task_ids: &[&str]) -> Result<Batch, StoreError> {
        let p = CopySeen { task_ids };
        tally(
            "copy seen marks",
            self.sql.seen.query_one(&self.client, &p).await,
        )
    }

    pub async fn tombstones(&self, rows: &[TombstoneRow<'_>]) -> Result<Batch, StoreError> {
        let p = CopyTombstones {
            task_ids: &column(rows, |r| r.task_id),
            tenants: &column(rows, |r| r.tenant),
            subjects: &column(rows, |r| r.subject),
            idem_keys: &column(rows, |r| r.idem_key),
            expires_at_ms: &column(rows, |r| ms(r.expires_at_ms)),
        };
        tally(
            "copy tombstones",
            self.sql.tombstones.query_one(&self.client, &p).await,
        )
    }

    /// Claims as `(key, task id, argument fingerprint)`.
    pub async fn claims(&self, rows: &[(&[u8], &str, &str)]) -> Result<Batch, StoreError> {
        let p = CopyClaims {
            keys: &column(rows, |r| r.0),
            task_ids: &column(rows, |r| r.1),
            fingerprints: &column(rows, |r| r.2),
        };
        tally(
            "copy idempotency claims",
            self.sql.claims.query_one(&self.client, &p).await,
        )
    }

    pub async fn secrets(&self, rows: &[(&str, &[u8])]) -> Result<Batch, StoreError> {
        let p = CopySecrets {
            names: &column(rows, |r| r.0),
            secrets: &column(rows, |r| r.1),
        };
        tally(
            "copy store secrets",
            self.sql.secrets.query_one(&self.client, &p).await,
        )
    }

    /// Identities as `(upstream name, record bytes)`.
    pub async fn identities(&self, rows: &[(&str, &[u8])]) -> Result<Batch, StoreError> {
        let p = CopyIdentities {
            names: &column(rows, |r| r.0),
            records: &column(rows, |r| r.1),
        };
        tally(
            "copy upstream identities",
            self.sql.identities.query_one(&self.client, &p).await,
        )
    }

    /// Tool header maps as `(upstream name, record bytes)`.
    pub async fn tool_headers(&self, rows: &[(&str, &[u8])]) -> Result<Batch, StoreError> {
        let p = CopyToolHeaders {
            names: &column(rows, |r| r.0),
            records: &column(rows, |r| r.1),
        };
        tally(
            "copy upstream tool headers",
            self.sql.tool_headers.query_one(&self.client, &p).await,
        )
    }

    pub async fn sessions(&self, rows: &[SessionRow<'_>]) -> Result<Batch, StoreError> {
        let p = CopySessions {
            session_ids: &column(rows, |r| r.session_id),
            tenants: &column(rows, |r| r.tenant),
            subjects: &column(rows, |r| r.subject),
            last_seen_ms: &column(rows, |r| ms(r.last_seen_ms)),
            records: &column(rows, |r| r.record),
        };
        tally(
            "copy legacy sessions",
            self.sql.sessions.query_one(&self.client, &p).await,
        )
    }

    /// A replica that holds a live lease on this schema (a gateway serving it), if
    /// any: the move would race its writes, and would bring back what it expired.
    pub async fn serving_replica(&self) -> Result<Option<String>, StoreError> {
        let row = self
            .sql
            .serving
            .query_opt(&self.client, &Serving {})
            .await
            .and_then(|r| r.map(|r| r.try_get(0)).transpose())
            .map_err(|e| PgError::from(e).into_store("read replicas"))?;
        Ok(row)
    }

    pub async fn table_rows(&self) -> Result<TableRows, StoreError> {
        let count = async {
            let r = self
                .sql
                .table_rows
                .query_one(&self.client, &CountRows {})
                .await?;
            let n = |i: usize| -> Result<u64, tokio_postgres::Error> {
                Ok(u64::try_from(r.try_get::<_, i64>(i)?).unwrap_or(0))
            };
            Ok::<_, tokio_postgres::Error>(TableRows {
                secrets: n(0)?,
                identities: n(1)?,
                tool_headers: n(2)?,
                tasks: n(3)?,
                seen_marks: n(4)?,
                tombstones: n(5)?,
                claims: n(6)?,
                sessions: n(7)?,
            })
        };
        count
            .await
            .map_err(|e| PgError::from(e).into_store("count rows"))
    }
}

fn column<'r, R, T>(rows: &'r [R], f: impl Fn(&'r R) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

fn tally(
    op: &'static str,
    row: Result<tokio_postgres::Row, tokio_postgres::Error>,
) -> Result<Batch, StoreError> {
    let read = |row: tokio_postgres::Row| -> Result<Batch, tokio_postgres::Error> {
        let inserted: i64 = row.try_get(0)?;
        let same: i64 = row.try_get(1)?;
        Ok(Batch {
            inserted: u64::try_from(inserted).unwrap_or(0),
            same: u64::try_from(same).unwrap_or(0),
            differing: row.try_get(2)?,
        })
    };
    row.and_then(read)
        .map_err(|e| PgError::from(e).into_store(op))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_import_statements_fit_their_parameters() {
        super::ImportSql::new(&super::super::sql::Pooling::Direct).expect("import statements");
    }
}
