//! Versioned JSON records: decoding with upgrades of older versions, encoding, and
//! the small probes that read only a few fields.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::schema::key_str;
use crate::protocol::UpstreamInfo;
use crate::store::{
    Corruption, IdempotencyEntry, RequestRoute, SCHEMA_VERSION, SessionRecord, StoreError,
    StoredIdentity, StoredToolHeaders, TaskRecord, Tombstone,
};

/// Only `v` of a record, to pick the fast path.
#[derive(serde::Deserialize)]
pub(super) struct VersionProbe {
    #[serde(default)]
    pub(super) v: Option<Value>,
}

/// The stored form of an idempotency entry (the trait type has no `v`).
#[derive(Serialize, serde::Deserialize)]
pub(super) struct StoredIdempotency {
    pub(super) v: u32,
    pub(super) task_id: String,
    pub(super) args_fingerprint: String,
}

/// The stored form of a read mark (`seen` tree). Only its presence is read.
#[derive(Serialize)]
pub(super) struct StoredSeen {
    pub(super) v: u32,
    pub(super) at_ms: u64,
}

/// A stored record type: it carries its schema version in `v`.
pub(super) trait Record: DeserializeOwned {
    fn version(&self) -> u32;
}

macro_rules! records {
    ($($t:ty),*) => {
        $(impl Record for $t {
            fn version(&self) -> u32 {
                self.v
            }
        })*
    };
}
records!(
    TaskRecord,
    RequestRoute,
    Tombstone,
    StoredIdempotency,
    StoredIdentity<UpstreamInfo>,
    SessionRecord,
    StoredToolHeaders
);

/// Decode a versioned JSON record of `tree` at `key`. A current-version record is
/// parsed once (every `tasks/get` reads one); older ones are upgraded via `upgrade`
/// (fills defaults); newer ones are `Corrupt`.
pub(super) fn decode<T: Record>(
    tree: &str,
    key: &[u8],
    bytes: &[u8],
    upgrade: fn(&mut Map<String, Value>),
) -> Result<T, StoreError> {
    crate::store::probe::decode();
    if let Ok(rec) = serde_json::from_slice::<T>(bytes)
        && rec.version() == SCHEMA_VERSION
    {
        return Ok(rec);
    }
    let corrupt = |why: String| Corruption::from(format!("{tree}/{}: {why}", key_str(key)));
    let probe: VersionProbe = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(format!("not a JSON record: {e}")).caused_by(e))?;
    let version = match probe.v {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| corrupt(format!("schema version {v} is not an integer")))?,
    };
    if version > u64::from(SCHEMA_VERSION) {
        return Err(corrupt(format!(
            "schema version {version} is newer than this gateway's {SCHEMA_VERSION}"
        ))
        .into());
    }
    if version == u64::from(SCHEMA_VERSION) {
        return serde_json::from_slice(bytes)
            .map_err(|e| corrupt(e.to_string()).caused_by(e).into());
    }
    let mut value: Value = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(format!("not a JSON record: {e}")).caused_by(e))?;
    let map = value
        .as_object_mut()
        .ok_or_else(|| corrupt("not a JSON object".into()))?;
    upgrade(map);
    map.insert("v".into(), Value::from(SCHEMA_VERSION));
    serde_json::from_value(value).map_err(|e| {
        corrupt(format!("version {version}: {e}"))
            .caused_by(e)
            .into()
    })
}

/// A field name and the default an older record gets when it lacks the field.
pub(super) type FieldDefault = (&'static str, fn() -> Value);

pub(super) fn fill(map: &mut Map<String, Value>, defaults: &[FieldDefault]) {
    for (k, d) in defaults {
        if !map.contains_key(*k) {
            map.insert((*k).to_string(), d());
        }
    }
}

pub(super) fn upgrade_task(map: &mut Map<String, Value>) {
    fill(
        map,
        &[
            ("idempotency_key", || Value::Null),
            ("status_message", || Value::Null),
            ("result", || Value::Null),
            ("error", || Value::Null),
            ("input_requests", || Value::Object(Map::new())),
            ("issued_keys", || Value::Array(Vec::new())),
            ("cancel_requested", || Value::Bool(false)),
        ],
    );
}

pub(super) fn upgrade_route(map: &mut Map<String, Value>) {
    fill(map, &[("task_id", || Value::Null)]);
}

pub(super) fn upgrade_tombstone(map: &mut Map<String, Value>) {
    fill(map, &[("idempotency_index_key", || Value::Null)]);
}

pub(super) fn upgrade_none(_: &mut Map<String, Value>) {}

pub(super) fn encode<T: Serialize>(
    tree: &str,
    key: &str,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| {
        StoreError::Corrupt(
            Corruption::from(format!("{tree}/{key}: cannot encode: {e}")).caused_by(e),
        )
    })
}

/// Encode a task with `v` forced to the current schema version.
pub(super) fn encode_task(task: &TaskRecord) -> Result<Vec<u8>, StoreError> {
    if task.v == SCHEMA_VERSION {
        encode("tasks", &task.task_id, task)
    } else {
        let mut t = task.clone();
        t.v = SCHEMA_VERSION;
        encode("tasks", &task.task_id, &t)
    }
}

pub(super) fn encode_route(route: &RequestRoute) -> Result<Vec<u8>, StoreError> {
    if route.v == SCHEMA_VERSION {
        encode("routes", &route.route_id, route)
    } else {
        let mut r = route.clone();
        r.v = SCHEMA_VERSION;
        encode("routes", &route.route_id, &r)
    }
}

pub(super) fn decode_idempotency(key: &[u8], bytes: &[u8]) -> Result<IdempotencyEntry, StoreError> {
    let s: StoredIdempotency = decode("idempotency", key, bytes, upgrade_none)?;
    Ok(IdempotencyEntry {
        task_id: s.task_id,
        args_fingerprint: s.args_fingerprint,
    })
}

/// The few fields the index checks need, without decoding a whole record.
#[derive(serde::Deserialize)]
pub(super) struct IndexProbe {
    pub(super) tenant: String,
    pub(super) status: crate::store::TaskStatus,
    pub(super) expires_at_ms: u64,
    pub(super) created_at_ms: u64,
}

pub(super) fn probe(key: &[u8], bytes: &[u8]) -> Result<IndexProbe, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Corrupt(Corruption::from(format!("tasks/{}: {e}", key_str(key))).caused_by(e))
    })
}

/// The bytes serde writes at the start of a current-version task or tombstone of one
/// owner: both structs begin with `v`, `task_id`, `tenant`, `subject`, and serde_json
/// writes a string one way only. So a stored record's owner is told by a comparison,
/// not a decode, and another principal's record costs what an absent one costs
/// (docs/design.md §7 "Ownership"). `tests::owner_prefix_matches_what_serde_writes`
/// fails if a field moves.
pub(super) struct OwnerPrefix {
    owner: Vec<u8>,
    version: Vec<u8>,
}

impl OwnerPrefix {
    pub(super) fn new(task_id: &str, tenant: &str, subject: &str) -> Self {
        Self::keyed("task_id", task_id, tenant, subject)
    }

    /// The same for a [`SessionRecord`], which begins with `v`, `session_id`,
    /// `tenant`, `subject`.
    pub(super) fn session(session_id: &str, tenant: &str, subject: &str) -> Self {
        Self::keyed("session_id", session_id, tenant, subject)
    }

    fn keyed(id_field: &str, id: &str, tenant: &str, subject: &str) -> Self {
        let version = format!("{{\"v\":{SCHEMA_VERSION},").into_bytes();
        let mut owner = version.clone();
        // Writing a `&str` into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut owner, id_field);
        owner.push(b':');
        let _ = serde_json::to_writer(&mut owner, id);
        owner.extend_from_slice(b",\"tenant\":");
        let _ = serde_json::to_writer(&mut owner, tenant);
        owner.extend_from_slice(b",\"subject\":");
        let _ = serde_json::to_writer(&mut owner, subject);
        owner.push(b',');
        Self { owner, version }
    }

    /// `Some(owned)` for a current-version record; `None` for another version, which
    /// only a decode can tell.
    pub(super) fn owns(&self, bytes: &[u8]) -> Option<bool> {
        if bytes.starts_with(&self.owner) {
            Some(true)
        } else {
            bytes.starts_with(&self.version).then_some(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_records::task;

    #[test]
    fn a_record_serde_cannot_read_keeps_serdes_error() {
        let r = decode::<TaskRecord>("tasks", b"tsk_1", b"{not json", upgrade_task);
        let Err(StoreError::Corrupt(c)) = r else {
            panic!("expected Corrupt, got {r:?}");
        };
        assert!(
            c.what.starts_with("tasks/tsk_1: not a JSON record: "),
            "{c}"
        );
        let serde = std::error::Error::source(&c)
            .and_then(|s| s.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>())
            .and_then(|s| s.downcast_ref::<serde_json::Error>());
        assert!(serde.is_some_and(serde_json::Error::is_syntax), "{c:?}");
    }

    #[test]
    fn owner_prefix_matches_what_serde_writes() {
        let owners = [
            ("acme", "alice"),
            ("a\"b", "c\\d"),
            ("ten\u{0}ant", "sübject ✓"),
            ("", ""),
            ("line\nbreak", "tab\t"),
        ];
        for (tenant, subject) in owners {
            let mut rec = task("tsk_owner", tenant, 1);
            rec.subject = subject.into();
            let tomb = Tombstone {
                v: SCHEMA_VERSION,
                task_id: "tsk_owner".into(),
                tenant: tenant.into(),
                subject: subject.into(),
                idempotency_index_key: None,
                expires_at_ms: 1,
            };
            let stored = [
                encode_task(&rec).expect("encode"),
                encode("tombstones", "tsk_owner", &tomb).expect("encode"),
            ];
            for bytes in &stored {
                let mine = OwnerPrefix::new("tsk_owner", tenant, subject);
                assert_eq!(mine.owns(bytes), Some(true), "{tenant:?}/{subject:?}");
                for other in [
                    OwnerPrefix::new("tsk_owner", tenant, "someone else"),
                    OwnerPrefix::new("tsk_owner", "other", subject),
                    OwnerPrefix::new("tsk_other", tenant, subject),
                ] {
                    assert_eq!(other.owns(bytes), Some(false), "{tenant:?}/{subject:?}");
                }
            }
        }
        // A session's record begins the same way with its own id field.
        for (tenant, subject) in owners {
            let rec = crate::store::test_records::session("mcs_owner", tenant, subject, 1);
            let bytes = encode("sessions", "mcs_owner", &rec).expect("encode");
            let mine = OwnerPrefix::session("mcs_owner", tenant, subject);
            assert_eq!(mine.owns(&bytes), Some(true), "{tenant:?}/{subject:?}");
            for other in [
                OwnerPrefix::session("mcs_owner", tenant, "someone else"),
                OwnerPrefix::session("mcs_other", tenant, subject),
                OwnerPrefix::new("mcs_owner", tenant, subject),
            ] {
                assert_eq!(other.owns(&bytes), Some(false), "{tenant:?}/{subject:?}");
            }
        }
        // Another version is for a decode to tell.
        let old = br#"{"task_id":"tsk_owner","tenant":"acme","subject":"alice"}"#;
        assert_eq!(
            OwnerPrefix::new("tsk_owner", "acme", "alice").owns(old),
            None
        );
    }
}
