//! Moving a sled store into a PostgreSQL schema (`taskgate store migrate`,
//! docs/design.md §27 "Moving a sled store to PostgreSQL").
//!
//! Kind by kind ([`Kind::ALL`]), each sled tree is streamed ([`SledStore`]'s
//! `export_*` readers) and written in batches ([`PgImport`]): one multi-row
//! `INSERT … ON CONFLICT DO NOTHING` per batch, so a run killed at any point leaves
//! whole batches behind, and the next run writes only what is missing. Memory is one
//! batch (and the list of tasks found in flight).
//!
//! - A task record is copied as the bytes sled holds, with the columns the schema
//!   keeps beside it. A task that is not terminal had its call in flight when the
//!   store was last closed; no call survives the move, so it is written `failed`, the
//!   way start-up recovery fails one (`fail_in_flight`, `tasks::sweeper::fail_moved`),
//!   and listed. To stay idempotent, a rerun that finds it already written fails it
//!   again at the time the written record names, which gives the same bytes.
//! - Read marks go with their tasks; a task that turned terminal before the store
//!   tracked reads counts as read there, so it gets a mark here.
//! - Request routes are not copied: no call is in flight after the move.
//! - A row the destination holds with other content stops the move for the kinds
//!   that must not change (tasks, tombstones, idempotency claims, secrets), and is
//!   kept for those rewritten on every change (identities, tool header maps,
//!   sessions): see `store::postgres::import`.

mod progress;
mod report;

use std::path::PathBuf;
use std::sync::Arc;

pub use progress::{Progress, StderrProgress};
pub use report::{InFlight, Kind, Report, Tally};

use crate::config::StoreConfig;
use crate::store::postgres::{Batch, PgImport, SessionRow, TaskRow, TombstoneRow};
use crate::store::sled::{ExportedClaim, ExportedRecord, ExportedTask, SledStore, TaskColumns};
use crate::store::{Corruption, SCHEMA_VERSION, StoreError, TaskRecord, now_ms};

/// Why a move stopped.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("the sled store at {0} is in use by a running gateway; stop it first")]
    InUse(PathBuf),
    #[error("there is no sled store at {0}")]
    NoStore(PathBuf),
    #[error(
        "the PostgreSQL schema {schema} already holds {n} {} that differ from the sled \
         store's (the first: {first}); nothing of that batch was written. Move into a \
         new schema, or into the one an earlier run of this command wrote while no \
         gateway has run on it since",
        kind.name()
    )]
    Conflict {
        schema: String,
        kind: Kind,
        n: usize,
        first: String,
    },
    #[error(
        "a gateway serves the PostgreSQL schema {schema} (replica {replica} holds a live \
         lease); stop it first (the lease of one that was killed runs out within \
         [store] lease_ms)"
    )]
    Serving { schema: String, replica: String },
    #[error("reading the sled store: {0}")]
    Source(#[source] StoreError),
    #[error("writing to PostgreSQL: {0}")]
    Destination(#[source] StoreError),
}

/// Open the sled store at `cfg.path` to read it out; refuses a directory that holds
/// no sled store (opening would create an empty one) and a store a gateway holds.
pub fn open_source(cfg: &StoreConfig) -> Result<Arc<SledStore>, TransferError> {
    // sled keeps its pages in the file `db` of the store directory.
    if !cfg.path.join("db").is_file() {
        return Err(TransferError::NoStore(cfg.path.clone()));
    }
    SledStore::open(cfg).map_err(|e| match e {
        StoreError::Locked(p) => TransferError::InUse(p),
        e => TransferError::Source(e),
    })
}

/// How a move runs.
pub struct Options<'a> {
    /// Entries per batch (one statement each).
    pub batch: usize,
    /// Turns the record of a task found in flight into its failed record at the given
    /// time (ms since the epoch); the same time must give the same record.
    pub fail_in_flight: &'a (dyn Fn(&mut TaskRecord, u64) + Sync),
}

/// Copy everything `source` holds into `dest` (see the module docs); the report says
/// what each kind counted. A count that does not match is not an error here: the
/// caller reads [`Report::matches`].
pub async fn transfer(
    source: &SledStore,
    dest: &PgImport,
    opts: &Options<'_>,
    progress: &mut dyn Progress,
) -> Result<Report, TransferError> {
    if let Some(replica) = dest
        .serving_replica()
        .await
        .map_err(TransferError::Destination)?
    {
        return Err(TransferError::Serving {
            schema: dest.schema().to_string(),
            replica,
        });
    }
    let mut run = Run {
        source,
        dest,
        opts,
        progress,
        batch: opts.batch.max(1),
        report: Report::default(),
    };
    run.secrets().await?;
    run.by_upstream(Kind::Identities, source.export_identities())
        .await?;
    run.by_upstream(Kind::ToolHeaders, source.export_tool_headers())
        .await?;
    run.tasks().await?;
    run.tombstones().await?;
    run.claims().await?;
    run.sessions().await?;
    run.report.routes = source.count_routes().map_err(TransferError::Source)?;
    run.report.tables = dest
        .table_rows()
        .await
        .map_err(TransferError::Destination)?;
    Ok(run.report)
}

struct Run<'r, 'o> {
    source: &'r SledStore,
    dest: &'r PgImport,
    opts: &'r Options<'o>,
    progress: &'r mut dyn Progress,
    batch: usize,
    report: Report,
}

/// Hand `items` to `each` in batches of `size`.
async fn in_batches<T>(
    items: impl Iterator<Item = Result<T, StoreError>>,
    size: usize,
    mut each: impl AsyncFnMut(Vec<T>) -> Result<(), TransferError>,
) -> Result<(), TransferError> {
    let mut buf = Vec::with_capacity(size);
    for item in items {
        buf.push(item.map_err(TransferError::Source)?);
        if buf.len() >= size {
            each(std::mem::replace(&mut buf, Vec::with_capacity(size))).await?;
        }
    }
    if !buf.is_empty() {
        each(buf).await?;
    }
    Ok(())
}

impl Run<'_, '_> {
    /// Count one written batch of `n` entries of `kind`; a conflict of a strict kind
    /// stops the move.
    fn count(
        &mut self,
        kind: Kind,
        n: usize,
        written: Result<Batch, StoreError>,
    ) -> Result<(), TransferError> {
        let b = written.map_err(TransferError::Destination)?;
        if kind.strict()
            && let Some(first) = b.differing.first()
        {
            return Err(TransferError::Conflict {
                schema: self.dest.schema().to_string(),
                kind,
                n: b.differing.len(),
                first: first.clone(),
            });
        }
        let t = self.report.tally_mut(kind);
        t.source += n as u64;
        t.copied += b.inserted;
        t.already += b.same;
        t.kept += b.differing.len() as u64;
        let t = *t;
        self.progress.batch(kind, &t);
        Ok(())
    }

    fn done(&mut self, kind: Kind) {
        let t = *self.report.tally(kind);
        self.progress.done(kind, &t);
    }

    async fn secrets(&mut self) -> Result<(), TransferError> {
        let (source, size) = (self.source, self.batch);
        in_batches(source.export_secrets(), size, async |b| {
            let rows: Vec<(&str, &[u8])> = b.iter().map(|(n, s)| (n.as_str(), &s[..])).collect();
            let written = self.dest.secrets(&rows).await;
            self.count(Kind::Secrets, rows.len(), written)
        })
        .await?;
        self.done(Kind::Secrets);
        Ok(())
    }

    /// Upstream identities or tool header maps: records kept by upstream name.
    async fn by_upstream<R>(
        &mut self,
        kind: Kind,
        items: impl Iterator<Item = Result<(String, ExportedRecord<R>), StoreError>>,
    ) -> Result<(), TransferError> {
        in_batches(items, self.batch, async |b| {
            let rows: Vec<(&str, &[u8])> =
                b.iter().map(|(n, r)| (n.as_str(), &r.bytes[..])).collect();
            let written = match kind {
                Kind::Identities => self.dest.identities(&rows).await,
                _ => self.dest.tool_headers(&rows).await,
            };
            self.count(kind, rows.len(), written)
        })
        .await?;
        self.done(kind);
        Ok(())
    }

    /// Tasks and their read marks; a task in flight goes to its own batch.
    async fn tasks(&mut self) -> Result<(), TransferError> {
        let (source, size) = (self.source, self.batch);
        let mut in_flight = Vec::new();
        in_batches(source.export_tasks(), size, async |b| {
            let (live, done): (Vec<_>, Vec<_>) =
                b.into_iter().partition(|t| !t.columns.status.is_terminal());
            in_flight.extend(live);
            if in_flight.len() >= size {
                self.in_flight(std::mem::take(&mut in_flight)).await?;
            }
            self.settled(&done).await
        })
        .await?;
        if !in_flight.is_empty() {
            self.in_flight(in_flight).await?;
        }
        self.done(Kind::Tasks);
        self.done(Kind::SeenMarks);
        Ok(())
    }

    /// Terminal tasks, as they are, then the read marks of those their owner read.
    async fn settled(&mut self, tasks: &[ExportedTask]) -> Result<(), TransferError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let rows: Vec<TaskRow<'_>> = tasks.iter().map(task_row).collect();
        let written = self.dest.tasks(&rows).await;
        self.count(Kind::Tasks, rows.len(), written)?;
        let seen: Vec<&str> = tasks
            .iter()
            .filter(|t| t.seen)
            .map(|t| t.columns.task_id.as_str())
            .collect();
        if !seen.is_empty() {
            let written = self.dest.seen_marks(&seen).await;
            self.count(Kind::SeenMarks, seen.len(), written)?;
        }
        Ok(())
    }

    /// Tasks found in flight, failed with a reason. One the destination already
    /// holds (an earlier run wrote it) is failed at the time its record names, so
    /// that run's bytes come out again unless it was changed since.
    async fn in_flight(&mut self, tasks: Vec<ExportedTask>) -> Result<(), TransferError> {
        let ids: Vec<&str> = tasks.iter().map(|t| t.columns.task_id.as_str()).collect();
        let held = self
            .dest
            .task_records(&ids)
            .await
            .map_err(TransferError::Destination)?;
        let written_at = |id: &str| {
            held.iter()
                .find(|(h, _)| h == id)
                .and_then(|(_, bytes)| serde_json::from_slice::<TaskRecord>(bytes).ok())
                .map(|rec| rec.last_updated_at_ms)
        };
        let corrupt = |id: &str, e: serde_json::Error| {
            TransferError::Source(StoreError::Corrupt(
                Corruption::from(format!("tasks/{id}: {e}")).caused_by(e),
            ))
        };
        let now = now_ms();
        let mut failed = Vec::with_capacity(tasks.len());
        for t in &tasks {
            let c = &t.columns;
            let before = written_at(&c.task_id);
            // The bytes are of the current version (the export upgrades older ones).
            let mut rec: TaskRecord =
                serde_json::from_slice(&t.bytes).map_err(|e| corrupt(&c.task_id, e))?;
            (self.opts.fail_in_flight)(&mut rec, before.unwrap_or(now));
            rec.v = SCHEMA_VERSION;
            let bytes = serde_json::to_vec(&rec).map_err(|e| corrupt(&c.task_id, e))?;
            self.report.in_flight.push(InFlight {
                task_id: c.task_id.clone(),
                tenant: c.tenant.clone(),
                tool: c.tool.clone(),
                since_ms: c.created_at_ms,
                failed_before: before.is_some(),
            });
            failed.push(ExportedTask {
                columns: TaskColumns::from(&rec),
                bytes,
                idem_key: t.idem_key.clone(),
                seen: false,
            });
        }
        let rows: Vec<TaskRow<'_>> = failed.iter().map(task_row).collect();
        let written = self.dest.tasks(&rows).await;
        self.count(Kind::Tasks, rows.len(), written)
    }

    async fn tombstones(&mut self) -> Result<(), TransferError> {
        let (source, size) = (self.source, self.batch);
        in_batches(source.export_tombstones(), size, async |b| {
            let rows: Vec<TombstoneRow<'_>> = b
                .iter()
                .map(|t| TombstoneRow {
                    task_id: &t.task_id,
                    tenant: &t.tenant,
                    subject: &t.subject,
                    idem_key: t.idempotency_index_key.as_deref(),
                    expires_at_ms: t.expires_at_ms,
                })
                .collect();
            let written = self.dest.tombstones(&rows).await;
            self.count(Kind::Tombstones, rows.len(), written)
        })
        .await?;
        self.done(Kind::Tombstones);
        Ok(())
    }

    async fn claims(&mut self) -> Result<(), TransferError> {
        let (source, size) = (self.source, self.batch);
        in_batches(source.export_claims(), size, async |b| {
            let mut rows: Vec<(&[u8], &str, &str)> = Vec::with_capacity(b.len());
            for c in &b {
                match c {
                    ExportedClaim::Live { key, entry } => {
                        rows.push((key, &entry.task_id, &entry.args_fingerprint));
                    }
                    ExportedClaim::Stale => self.report.tally_mut(Kind::Claims).skipped += 1,
                }
            }
            if rows.is_empty() {
                return Ok(());
            }
            let written = self.dest.claims(&rows).await;
            self.count(Kind::Claims, rows.len(), written)
        })
        .await?;
        self.done(Kind::Claims);
        Ok(())
    }

    async fn sessions(&mut self) -> Result<(), TransferError> {
        let (source, size) = (self.source, self.batch);
        in_batches(source.export_sessions(), size, async |b| {
            let rows: Vec<SessionRow<'_>> = b
                .iter()
                .map(|s| SessionRow {
                    session_id: &s.record.session_id,
                    tenant: &s.record.tenant,
                    subject: &s.record.subject,
                    last_seen_ms: s.record.last_seen_at_ms,
                    record: &s.bytes,
                })
                .collect();
            let written = self.dest.sessions(&rows).await;
            self.count(Kind::Sessions, rows.len(), written)
        })
        .await?;
        self.done(Kind::Sessions);
        Ok(())
    }
}

/// The row of task `t`.
fn task_row(t: &ExportedTask) -> TaskRow<'_> {
    let r = &t.columns;
    TaskRow {
        task_id: &r.task_id,
        tenant: &r.tenant,
        subject: &r.subject,
        status: r.status.as_str(),
        expires_at_ms: r.expires_at_ms,
        idem_key: t.idem_key.as_deref(),
        record: &t.bytes,
        upstream: &r.upstream,
        created_at_ms: r.created_at_ms,
    }
}
