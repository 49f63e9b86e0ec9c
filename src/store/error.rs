//! What a store operation fails with.
//!
//! The top-level variants are what the engine decides on (retry, 503, fence, fail
//! closed: docs/design.md §16 "Durability, store failures and upgrades"); the typed
//! cause of a failure — the driver's, the pool's, sled's, the file system's or the
//! decoder's error — is kept as its `source`. The
//! texts include the cause, as replies and logs show it, so a chain printer repeats it.
//! The sources sit in `Arc`s (downcast a source to `Arc<E>`): one group-commit flush
//! answers every waiter with the same error, so [`StoreError`] is `Clone`.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::postgres::{SqlError, UrlError, db_message};

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer: its database, connection pool or files failed, or an
    /// operation ran out of time. Retried by the engine where that is safe, else a 503.
    #[error("store I/O error: {0}")]
    Io(#[source] IoError),
    /// The store cannot be opened as configured: found when opening it, before any
    /// request. Worded like `Io`, as these errors were before they had a variant of
    /// their own, so start-up messages read as they did.
    #[error("store I/O error: {0}")]
    Setup(#[source] SetupError),
    #[error("stored record is corrupt: {0}")]
    Corrupt(Corruption),
    #[error("store is closed")]
    Closed,
    /// Another live process holds the store's lock (for sled: its `flock` on `db`).
    #[error(
        "the store at {0} is in use by another running taskgate (one gateway per store); \
         stop it, or give this one another store.path"
    )]
    Locked(PathBuf),
    /// A write from an in-flight call whose replica no longer holds it (its lease ran
    /// out, or another replica took the call over): nothing was written.
    #[error("this replica no longer holds the call (lease lost or taken over)")]
    Fenced,
}

/// What is wrong with a stored record ([`StoreError::Corrupt`]): which record and what
/// was found. When a decoder or the database found it, its error is the source (and
/// its text already part of `what`, as the store has always worded it); a check of the
/// store's own has none (`From<String>`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}")]
pub struct Corruption {
    pub what: String,
    /// Downcast to `Arc<dyn Error + Send + Sync>`, then to the decoder's type.
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Corruption {
    /// This corruption as found by `e`.
    pub fn caused_by(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(e));
        self
    }
}

impl From<String> for Corruption {
    fn from(what: String) -> Self {
        Self { what, source: None }
    }
}

impl From<&str> for Corruption {
    fn from(what: &str) -> Self {
        what.to_string().into()
    }
}

impl From<Corruption> for StoreError {
    fn from(e: Corruption) -> Self {
        Self::Corrupt(e)
    }
}

/// Why the store did not answer ([`StoreError::Io`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum IoError {
    /// PostgreSQL answered operation `op` with an error, or the connection failed.
    #[error("postgres {op}: {}", db_message(source))]
    Postgres {
        op: &'static str,
        #[source]
        source: Arc<tokio_postgres::Error>,
    },
    /// No pooled connection for `op`: connecting failed, or none was free in time.
    #[error("postgres {op}: {}", pool_message(source))]
    Pool {
        op: &'static str,
        #[source]
        source: Arc<deadpool_postgres::PoolError>,
    },
    /// `op` got no answer within the operation limit.
    #[error("postgres {op}: no answer within {} s", after.as_secs())]
    TimedOut { op: &'static str, after: Duration },
    /// `op` was not tried: an earlier operation found the database unreachable, and
    /// nothing has reached it since (the probe runs every `probe_every`).
    #[error(
        "postgres {op}: the database is unreachable (probed every {} s)",
        probe_every.as_secs()
    )]
    Unreachable {
        op: &'static str,
        probe_every: Duration,
    },
    /// A connection of its own (`postgres::connect_url`, for tools and tests) failed.
    #[error("postgres: {}", db_message(.0))]
    Connect(#[source] Arc<tokio_postgres::Error>),
    /// sled failed to read or write (`what`) the store at `path`.
    #[error("store at {}: {what}: {source}", path.display())]
    Sled {
        path: PathBuf,
        what: Cow<'static, str>,
        #[source]
        source: Arc<sled::Error>,
    },
    /// A group-commit round's sled flush failed.
    #[error("flush of store at {} failed: {source}", path.display())]
    Flush {
        path: PathBuf,
        #[source]
        source: Arc<sled::Error>,
    },
    /// A group-commit round's fsync (`store.strict_fsync`) failed.
    #[error("fsync of store at {} failed: {source}", path.display())]
    Fsync {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The blocking task running a flush round died.
    #[error("store flush task failed: {0}")]
    FlushTask(#[source] Arc<tokio::task::JoinError>),
}

/// Why the store cannot be opened as configured ([`StoreError::Setup`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum SetupError {
    /// A `[store]` setting is missing or invalid (`url`, `url_env`).
    #[error("{0}")]
    Config(#[source] Arc<crate::config::ConfigError>),
    /// `store.url` cannot be used (its syntax, `sslmode`, `sslrootcert`).
    #[error("store.url: {0}")]
    Url(#[source] Arc<UrlError>),
    /// `store.schema` is not a name that can be used unquoted.
    #[error("store.schema {0:?} is not a plain lower-case identifier")]
    Schema(String),
    /// The PostgreSQL connection pool could not be built.
    #[error("postgres pool: {0}")]
    Pool(#[source] Arc<deadpool_postgres::BuildError>),
    /// The session settings sent in the start-up packet were refused or dropped on the
    /// way, as a transaction-mode connection pooler does (docs/design.md §27
    /// "Connection poolers").
    #[error(
        "postgres: {0}: a connection pooler in transaction mode (PgBouncer) between taskgate and PostgreSQL? Set `[store] pooler = \"transaction\"` (README \"Behind a connection pooler\")"
    )]
    Pooler(String),
    /// A statement's text does not fit its parameters: a bug the unit tests catch.
    #[error("postgres {0}")]
    Statement(#[source] SqlError),
    /// The schema was migrated by a release more than one ahead of this gateway
    /// (docs/design.md §27 "Mixed versions"): serving it could misread what it holds.
    #[error(
        "PostgreSQL schema {schema} is at version {version}, which needs a taskgate that knows \
         schema version {floor} or later; this one knows {known}, so it is more than one \
         release older than the newest replica that migrated it. Start the newer release \
         instead (README \"Upgrading\")"
    )]
    TooOld {
        schema: String,
        version: i32,
        floor: i32,
        known: i32,
    },
    /// The sled store was opened outside a tokio runtime (it starts its flusher there).
    #[error("store at {}: SledStore::open needs a tokio runtime: {source}", path.display())]
    NoRuntime {
        path: PathBuf,
        #[source]
        source: Arc<tokio::runtime::TryCurrentError>,
    },
}

impl From<IoError> for StoreError {
    fn from(e: IoError) -> Self {
        Self::Io(e)
    }
}

impl From<SetupError> for StoreError {
    fn from(e: SetupError) -> Self {
        Self::Setup(e)
    }
}

/// A pool error as the database put it (a failed connect says why, not just "Backend").
fn pool_message(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(db) => format!("connecting: {}", db_message(db)),
        other => other.to_string(),
    }
}
