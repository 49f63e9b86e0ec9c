//! The whole store read out, tree by tree, for `taskgate store migrate`
//! (docs/design.md §27 "Moving a sled store to PostgreSQL"). Each reader streams one
//! tree with sled's own iterator, so memory stays what one entry takes, and hands out
//! each entry in the form another backend keeps it: a record's bytes exactly as they
//! are stored when they are of the current schema version (an older record is
//! upgraded as a read upgrades it, then encoded again), with the fields the other
//! backend keeps beside the record.

use super::SledStore;
use super::codec::{
    StoredIdempotency, decode, encode, encode_task, upgrade_none, upgrade_task, upgrade_tombstone,
};
use super::schema::{META_IDEM_OF, META_SECRET, key_str, meta_key};
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use crate::store::{
    Corruption, IdempotencyEntry, SCHEMA_VERSION, SessionRecord, StoreError, StoredIdentity,
    StoredToolHeaders, TaskRecord, TaskStatus, Tombstone,
};

/// One stored task, as another backend takes it.
#[derive(Debug, Clone)]
pub struct ExportedTask {
    /// The record's fields the other backend keeps beside it.
    pub columns: TaskColumns,
    /// The record's bytes: as stored, for a record of the current version.
    pub bytes: Vec<u8>,
    /// The raw idempotency index key the task claimed (`meta/idem_of`), if any.
    pub idem_key: Option<Vec<u8>>,
    /// Its owner received the terminal snapshot: a `seen` mark, or the task turned
    /// terminal before this store tracked reads (what [`TaskStore::expire`] reports).
    ///
    /// [`TaskStore::expire`]: crate::store::TaskStore::expire
    pub seen: bool,
}

/// The fields of a task record kept beside it, read without building the rest (a
/// result can be large): the move decodes a whole record only to fail it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TaskColumns {
    #[serde(default)]
    v: Option<u32>,
    pub task_id: String,
    pub tenant: String,
    pub subject: String,
    pub upstream: String,
    pub tool: String,
    pub status: TaskStatus,
    pub created_at_ms: u64,
    pub last_updated_at_ms: u64,
    pub expires_at_ms: u64,
}

impl From<&TaskRecord> for TaskColumns {
    fn from(r: &TaskRecord) -> Self {
        Self {
            v: Some(r.v),
            task_id: r.task_id.clone(),
            tenant: r.tenant.clone(),
            subject: r.subject.clone(),
            upstream: r.upstream.clone(),
            tool: r.tool.clone(),
            status: r.status,
            created_at_ms: r.created_at_ms,
            last_updated_at_ms: r.last_updated_at_ms,
            expires_at_ms: r.expires_at_ms,
        }
    }
}

/// One idempotency claim.
#[derive(Debug, Clone)]
pub enum ExportedClaim {
    /// A claim naming a stored task or tombstone.
    Live {
        key: Vec<u8>,
        entry: IdempotencyEntry,
    },
    /// A claim whose task and tombstone are both gone: only a crash leaves one, and
    /// this store already reads it as absent ([`TaskStore::idempotency_get`]).
    ///
    /// [`TaskStore::idempotency_get`]: crate::store::TaskStore::idempotency_get
    Stale,
}

/// One record keyed by name (an upstream's identity or tool header map, a session).
#[derive(Debug, Clone)]
pub struct ExportedRecord<T> {
    pub record: T,
    /// The record's bytes: as stored, for a record of the current version.
    pub bytes: Vec<u8>,
}

impl SledStore {
    fn scan_failed(&self, tree: &str, e: sled::Error) -> StoreError {
        self.read_failed(&format!("scan {tree}"), e)
    }

    /// Every task, in task id order.
    pub fn export_tasks(&self) -> impl Iterator<Item = Result<ExportedTask, StoreError>> + '_ {
        self.tasks.iter().map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("tasks", e))?;
            let (columns, bytes) = match serde_json::from_slice::<TaskColumns>(&v) {
                Ok(c) if c.v == Some(SCHEMA_VERSION) => (c, v.to_vec()),
                _ => {
                    let rec: TaskRecord = decode("tasks", &k, &v, upgrade_task)?;
                    let bytes = encode_task(&rec)?;
                    (TaskColumns::from(&rec), bytes)
                }
            };
            let idem_key = self
                .meta
                .get(meta_key(META_IDEM_OF, &k))
                .map_err(|e| self.read_failed("get idem_of", e))?
                .map(|i| i.to_vec());
            let marked = self
                .seen
                .contains_key(&k)
                .map_err(|e| self.read_failed("get seen mark", e))?;
            let before_tracking =
                columns.status.is_terminal() && columns.last_updated_at_ms < self.seen_since_ms;
            Ok(ExportedTask {
                seen: marked || before_tracking,
                columns,
                bytes,
                idem_key,
            })
        })
    }

    /// Every tombstone, in task id order.
    pub fn export_tombstones(&self) -> impl Iterator<Item = Result<Tombstone, StoreError>> + '_ {
        self.tombstones.iter().map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("tombstones", e))?;
            decode("tombstones", &k, &v, upgrade_tombstone)
        })
    }

    /// Every idempotency claim, in key order.
    pub fn export_claims(&self) -> impl Iterator<Item = Result<ExportedClaim, StoreError>> + '_ {
        self.idempotency.iter().map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("idempotency", e))?;
            let s: StoredIdempotency = decode("idempotency", &k, &v, upgrade_none)?;
            if self.names_nothing(&s.task_id)? {
                return Ok(ExportedClaim::Stale);
            }
            Ok(ExportedClaim::Live {
                key: k.to_vec(),
                entry: IdempotencyEntry {
                    task_id: s.task_id,
                    args_fingerprint: s.args_fingerprint,
                },
            })
        })
    }

    /// Every upstream's identity, by name.
    pub fn export_identities(
        &self,
    ) -> impl Iterator<Item = Result<(String, ExportedRecord<UpstreamInfo>), StoreError>> + '_ {
        self.upstream_identity.iter().map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("upstream_identity", e))?;
            let stored: StoredIdentity<UpstreamInfo> =
                decode("upstream_identity", &k, &v, upgrade_none)?;
            let name = utf8_key("upstream_identity", &k)?;
            let bytes = if stored.v == SCHEMA_VERSION {
                v.to_vec()
            } else {
                encode(
                    "upstream_identity",
                    &name,
                    &StoredIdentity::current(&stored.info),
                )?
            };
            let record = stored.info;
            Ok((name, ExportedRecord { record, bytes }))
        })
    }

    /// Every upstream's tool header map, by name.
    pub fn export_tool_headers(
        &self,
    ) -> impl Iterator<Item = Result<(String, ExportedRecord<ToolHeaders>), StoreError>> + '_ {
        self.upstream_tool_headers.iter().map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("upstream_tool_headers", e))?;
            let stored: StoredToolHeaders = decode("upstream_tool_headers", &k, &v, upgrade_none)?;
            let name = utf8_key("upstream_tool_headers", &k)?;
            let bytes = if stored.v == SCHEMA_VERSION {
                v.to_vec()
            } else {
                encode(
                    "upstream_tool_headers",
                    &name,
                    &StoredToolHeaders::current(&stored.tools),
                )?
            };
            let record = stored.tools;
            Ok((name, ExportedRecord { record, bytes }))
        })
    }

    /// Every 2025-era client session, by id.
    pub fn export_sessions(
        &self,
    ) -> impl Iterator<Item = Result<ExportedRecord<SessionRecord>, StoreError>> + '_ {
        self.sessions.iter().map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("sessions", e))?;
            let mut record: SessionRecord = decode("sessions", &k, &v, upgrade_none)?;
            let bytes = if record.v == SCHEMA_VERSION {
                v.to_vec()
            } else {
                record.v = SCHEMA_VERSION;
                encode("sessions", &record.session_id, &record)?
            };
            Ok(ExportedRecord { record, bytes })
        })
    }

    /// Every stored secret (`meta/secret/<name>`), by name.
    pub fn export_secrets(
        &self,
    ) -> impl Iterator<Item = Result<(String, [u8; 32]), StoreError>> + '_ {
        self.meta.scan_prefix(META_SECRET).map(move |kv| {
            let (k, v) = kv.map_err(|e| self.scan_failed("meta", e))?;
            let name = utf8_key("meta", &k[META_SECRET.len()..])?;
            let secret = <[u8; 32]>::try_from(v.as_ref()).map_err(|_| {
                StoreError::Corrupt(format!("meta/secret/{name}: not 32 bytes").into())
            })?;
            Ok((name, secret))
        })
    }

    /// How many request routes the store holds (calls in flight when it closed).
    pub fn count_routes(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for k in self.routes.iter().keys() {
            k.map_err(|e| self.scan_failed("routes", e))?;
            n += 1;
        }
        Ok(n)
    }
}

fn utf8_key(tree: &str, k: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(k.to_vec()).map_err(|_| {
        StoreError::Corrupt(Corruption::from(format!(
            "{tree}/{}: the key is not UTF-8",
            key_str(k)
        )))
    })
}
