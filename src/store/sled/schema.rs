//! The keys of the schema (module docs, "Schema"): `meta` entries and the composite
//! keys of the `expiry`, `live`, `session_owner` and `owner` trees.

pub(super) const META_SCHEMA: &[u8] = b"schema";
pub(super) const META_SECRET: &str = "secret/";
/// Counters of stores written before the live index (dropped when it is built).
pub(super) const META_LIVE: &str = "live/";
/// Present once the `live` tree has been built for this store.
pub(super) const META_LIVE_INDEX: &[u8] = b"layout/live_index";
pub(super) const META_IDEM_OF: &str = "idem_of/";
/// Since when this store tracks reads (8-byte big-endian ms; module docs, "Schema").
pub(super) const META_SEEN_SINCE: &[u8] = b"layout/seen_since";
/// Present once the `owner` tree has been built for this store.
pub(super) const META_OWNER_INDEX: &[u8] = b"layout/owner_index";
/// Present once the `tenant_status` tree has been built for this store.
pub(super) const META_TENANT_INDEX: &[u8] = b"layout/tenant_index";

pub(super) fn key_str(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

pub(super) fn expiry_key(expires_at_ms: u64, task_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + task_id.len());
    k.extend_from_slice(&expires_at_ms.to_be_bytes());
    k.extend_from_slice(task_id.as_bytes());
    k
}

pub(super) fn meta_key(prefix: &str, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + rest.len());
    k.extend_from_slice(prefix.as_bytes());
    k.extend_from_slice(rest);
    k
}

/// Key of a live-index entry: 4-byte big-endian tenant length ++ tenant ++ task id (the
/// length prefix keeps any tenant string unambiguous).
pub(super) fn live_key(tenant: &str, task_id: &str) -> Vec<u8> {
    let t = tenant.as_bytes();
    // A tenant claim of 4 GiB cannot pass the request size limit.
    let len = u32::try_from(t.len()).unwrap_or(u32::MAX);
    let mut k = Vec::with_capacity(4 + t.len() + task_id.len());
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(t);
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// Split a live-index key into (tenant, task id).
pub(super) fn split_live_key(k: &[u8]) -> Option<(&str, &str)> {
    let len = usize::try_from(u32::from_be_bytes(k.get(..4)?.try_into().ok()?)).ok()?;
    let tenant = std::str::from_utf8(k.get(4..4usize.checked_add(len)?)?).ok()?;
    let task = std::str::from_utf8(k.get(4 + len..)?).ok()?;
    Some((tenant, task))
}

/// Key of a `session_owner` entry: 4-byte big-endian tenant length ++ tenant ++ 4-byte
/// big-endian subject length ++ subject ++ session id (the lengths keep any principal
/// unambiguous, and a principal's entries share [`session_owner_prefix`]).
pub(super) fn session_owner_key(tenant: &str, subject: &str, session_id: &str) -> Vec<u8> {
    let mut k = session_owner_prefix(tenant, subject);
    k.extend_from_slice(session_id.as_bytes());
    k
}

/// The prefix of every `session_owner` key of one principal.
pub(super) fn session_owner_prefix(tenant: &str, subject: &str) -> Vec<u8> {
    let (t, s) = (tenant.as_bytes(), subject.as_bytes());
    let mut k = Vec::with_capacity(8 + t.len() + s.len() + 48);
    for part in [t, s] {
        // A claim of 4 GiB cannot pass the request size limit.
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        k.extend_from_slice(&len.to_be_bytes());
        k.extend_from_slice(part);
    }
    k
}

/// The session id of a `session_owner` key.
pub(super) fn split_session_owner_key(k: &[u8]) -> Option<&str> {
    let mut at = 0usize;
    for _ in 0..2 {
        let len = u32::from_be_bytes(k.get(at..at.checked_add(4)?)?.try_into().ok()?);
        at = at.checked_add(4)?.checked_add(usize::try_from(len).ok()?)?;
    }
    std::str::from_utf8(k.get(at..)?).ok()
}

/// Append each part with its 4-byte big-endian length (the lengths keep any strings
/// unambiguous, and every key of one tuple of parts shares the result as its prefix).
fn length_prefixed(parts: &[&str], extra: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| 4 + p.len()).sum::<usize>() + extra);
    for part in parts {
        // A claim of 4 GiB cannot pass the request size limit.
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        k.extend_from_slice(&len.to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k
}

/// What every `live`, `owner`, `tenant_status` and `session_owner` key of `tenant`
/// starts with: the tenant with its 4-byte big-endian length (the length keeps a
/// longer tenant name from sharing it).
pub(super) fn tenant_part(tenant: &str) -> Vec<u8> {
    length_prefixed(&[tenant], 48)
}

/// The task id that ends a `live` key, and the id that ends an `owner` or
/// `tenant_status` key (after `parts` length-prefixed parts and the 8-byte time).
pub(super) fn indexed_task_id(k: &[u8], parts: usize) -> Option<&str> {
    match parts {
        1 => split_live_key(k).map(|(_, id)| id),
        2 => split_tenant_status_key(k).map(|(_, _, _, id)| id),
        _ => split_owner_key(k).map(|(_, id)| id),
    }
}

/// Key of an `owner` entry: tenant, subject and upstream each with its 4-byte
/// big-endian length, then the 8-byte big-endian `created_at_ms`, then the task id. So
/// one principal's tasks on one upstream share [`owner_prefix`] and sort in
/// (created_at_ms, task id bytes) order: a range scan pages them.
pub(super) fn owner_key(
    tenant: &str,
    subject: &str,
    upstream: &str,
    created_at_ms: u64,
    task_id: &str,
) -> Vec<u8> {
    let mut k = length_prefixed(&[tenant, subject, upstream], 8 + task_id.len());
    k.extend_from_slice(&created_at_ms.to_be_bytes());
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// The prefix of every `owner` key of one principal on one upstream.
pub(super) fn owner_prefix(tenant: &str, subject: &str, upstream: &str) -> Vec<u8> {
    length_prefixed(&[tenant, subject, upstream], 8 + 48)
}

/// The prefix of every `owner` key of one principal, on any upstream.
pub(super) fn owner_principal_prefix(tenant: &str, subject: &str) -> Vec<u8> {
    length_prefixed(&[tenant, subject], 0)
}

/// `(created_at_ms, task id)` of an `owner` key, read after its three length-prefixed
/// parts.
pub(super) fn split_owner_key(k: &[u8]) -> Option<(u64, &str)> {
    let (_, at) = split_parts::<3>(k)?;
    split_created_id(k, at)
}

/// Key of a `tenant_status` entry: tenant and status each with its 4-byte big-endian
/// length, then the 8-byte big-endian `created_at_ms`, then the task id. So one
/// tenant's tasks in one status share [`tenant_status_prefix`] and sort in
/// (created_at_ms, task id bytes) order (the operator API's list).
pub(super) fn tenant_status_key(
    tenant: &str,
    status: &str,
    created_at_ms: u64,
    task_id: &str,
) -> Vec<u8> {
    let mut k = length_prefixed(&[tenant, status], 8 + task_id.len());
    k.extend_from_slice(&created_at_ms.to_be_bytes());
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// The prefix of every `tenant_status` key of one tenant in one status.
pub(super) fn tenant_status_prefix(tenant: &str, status: &str) -> Vec<u8> {
    length_prefixed(&[tenant, status], 8 + 48)
}

/// `(tenant, status, created_at_ms, task id)` of a `tenant_status` key.
pub(super) fn split_tenant_status_key(k: &[u8]) -> Option<(&str, &str, u64, &str)> {
    let (parts, at) = split_parts::<2>(k)?;
    let (created, id) = split_created_id(k, at)?;
    Some((parts[0], parts[1], created, id))
}

/// The first `N` length-prefixed parts of a key, and where the rest begins.
fn split_parts<const N: usize>(k: &[u8]) -> Option<([&str; N], usize)> {
    let mut parts = [""; N];
    let mut at = 0usize;
    for part in &mut parts {
        let len = u32::from_be_bytes(k.get(at..at.checked_add(4)?)?.try_into().ok()?);
        let start = at.checked_add(4)?;
        at = start.checked_add(usize::try_from(len).ok()?)?;
        *part = std::str::from_utf8(k.get(start..at)?).ok()?;
    }
    Some((parts, at))
}

/// The 8-byte big-endian time and the task id that end an index key at `at`.
fn split_created_id(k: &[u8], at: usize) -> Option<(u64, &str)> {
    let created = u64::from_be_bytes(k.get(at..at.checked_add(8)?)?.try_into().ok()?);
    let id = std::str::from_utf8(k.get(at + 8..)?).ok()?;
    Some((created, id))
}
