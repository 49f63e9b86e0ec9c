//! A tenant purge on PostgreSQL (docs/design.md §27 "Tenant purge";
//! [`TaskStore::purge_tenant`](crate::store::TaskStore::purge_tenant)): one
//! transaction per batch. Tasks, tombstones and sessions are found by their `tenant`
//! column, claims by their key prefix (`store::idempotency`). `request_routes` and
//! `pending_relays` have no tenant column: the rows of the tenant's tasks go with the
//! tasks (by `task_id`), and the others (a leftover route, an MRTR retry relayed with
//! the caller's tenant in it) are found by the tenant's bytes in the record and
//! decoded before they are deleted.

use serde::Deserialize;
use serde_json::Value;

use super::statements::{
    DeleteRelays, PurgeClaims, PurgeSessions, PurgeTasks, PurgeTombstones, RelayCandidates,
    RemoveRoutes, RouteCandidates,
};
use super::{PgError, PgStore};
use crate::protocol::loose::{Loose, Object};
use crate::store::idempotency;
use crate::store::{Purged, PurgedTask, TaskStatus};

fn count(row: &tokio_postgres::Row, i: usize) -> Result<u64, PgError> {
    Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `"tenant":` and the tenant as serde writes it: what every record naming the tenant
/// holds.
fn needle(tenant: &str) -> Vec<u8> {
    let mut n = b"\"tenant\":".to_vec();
    // Writing a `&str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut n, tenant);
    n
}

/// What [`names_tenant`] reads of a stored route or relay. A member of another type
/// names no tenant.
#[derive(Deserialize)]
struct TenantOf {
    #[serde(default)]
    tenant: Loose<String>,
    #[serde(default)]
    request: Loose<Object<RequestTenant>>,
}

#[derive(Deserialize)]
struct RequestTenant {
    #[serde(default)]
    tenant: Loose<String>,
}

/// Whether a stored route or relay names `tenant`: a route's own `tenant`, or the
/// caller's tenant of a relayed MRTR retry (`request.tenant`).
fn names_tenant(bytes: &[u8], tenant: &str) -> bool {
    // Through a `Value` first, as the records were always read: a repeated member
    // counts once (the last), where a struct read from the bytes would refuse it.
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return false;
    };
    let Ok(Object(record)) = Object::<TenantOf>::deserialize(&v) else {
        return false;
    };
    let request_tenant = record.request.0.and_then(|Object(r)| r.tenant.0);
    record.tenant.0.as_deref() == Some(tenant) || request_tenant.as_deref() == Some(tenant)
}

/// The ids (column 0) of at most `left` candidate rows whose record (column 1) names
/// `tenant`.
fn of_tenant<T>(rows: &[tokio_postgres::Row], tenant: &str, left: usize) -> Vec<T>
where
    T: for<'r> tokio_postgres::types::FromSql<'r>,
{
    rows.iter()
        .filter(|r| {
            r.try_get::<_, Vec<u8>>(1)
                .is_ok_and(|b| names_tenant(&b, tenant))
        })
        .filter_map(|r| r.try_get(0).ok())
        .take(left)
        .collect()
}

impl PgStore {
    pub(super) async fn purge_tenant_now(
        &self,
        tenant: &str,
        batch: usize,
    ) -> Result<Purged, PgError> {
        let mut out = Purged::default();
        let mut left = batch.max(1);
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;

        let rows = self
            .sql
            .purge_tasks
            .query(
                &tx,
                &PurgeTasks {
                    tenant,
                    limit: limit(left),
                },
            )
            .await?;
        for row in &rows {
            let status: String = row.try_get(1)?;
            let created: Option<i64> = row.try_get(2)?;
            out.tasks.push(PurgedTask {
                task_id: row.try_get(0)?,
                status: TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed),
                created_at_ms: created.and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
            });
        }
        if let Some(row) = rows.first() {
            let c = &mut out.counts;
            c.routes += count(row, 3)?;
            c.relays += count(row, 4)?;
            c.idempotency_claims += count(row, 5)?;
            c.read_marks += count(row, 6)?;
        }
        out.counts.tasks = out.tasks.len() as u64;
        left = left.saturating_sub(rows.len());

        if left > 0 {
            let row = self
                .sql
                .purge_tombstones
                .query_one(
                    &tx,
                    &PurgeTombstones {
                        tenant,
                        limit: limit(left),
                    },
                )
                .await?;
            let tombs = count(&row, 0)?;
            out.counts.tombstones += tombs;
            out.counts.idempotency_claims += count(&row, 1)?;
            out.counts.relays += count(&row, 2)?;
            left = left.saturating_sub(usize::try_from(tombs).unwrap_or(usize::MAX));
        }

        if left > 0 {
            let low = idempotency::tenant_prefix(tenant);
            let mut high = low.clone();
            // The prefix ends in the NUL after the tenant: NUL + 1 bounds the range.
            if let Some(last) = high.last_mut() {
                *last = 1;
            }
            let claims = self
                .sql
                .purge_claims
                .execute(
                    &tx,
                    &PurgeClaims {
                        low: &low,
                        high: &high,
                        prefix_len: i32::try_from(low.len()).unwrap_or(i32::MAX),
                        limit: limit(left),
                    },
                )
                .await?;
            out.counts.idempotency_claims += claims;
            left = left.saturating_sub(usize::try_from(claims).unwrap_or(usize::MAX));
        }

        if left > 0 {
            let needle = needle(tenant);
            let candidates = self
                .sql
                .route_candidates
                .query(&tx, &RouteCandidates { needle: &needle })
                .await?;
            let routes: Vec<String> = of_tenant(&candidates, tenant, left);
            if !routes.is_empty() {
                let n = self
                    .sql
                    .remove_routes
                    .execute(&tx, &RemoveRoutes { route_ids: &routes })
                    .await?;
                out.counts.routes += n;
                left = left.saturating_sub(routes.len());
            }
            let candidates = self
                .sql
                .relay_candidates
                .query(&tx, &RelayCandidates { needle: &needle })
                .await?;
            let relays: Vec<i64> = of_tenant(&candidates, tenant, left);
            if !relays.is_empty() {
                let n = self
                    .sql
                    .delete_relays
                    .execute(&tx, &DeleteRelays { relay_ids: &relays })
                    .await?;
                out.counts.relays += n;
                left = left.saturating_sub(relays.len());
            }
        }

        if left > 0 {
            let rows = self
                .sql
                .purge_sessions
                .query(
                    &tx,
                    &PurgeSessions {
                        tenant,
                        limit: limit(left),
                    },
                )
                .await?;
            for row in &rows {
                out.sessions.push(row.try_get(0)?);
            }
            out.counts.sessions += rows.len() as u64;
            left = left.saturating_sub(rows.len());
        }
        tx.commit().await?;
        out.more = left == 0;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_records_that_name_the_tenant_match() {
        assert!(names_tenant(br#"{"v":1,"tenant":"a"}"#, "a"));
        assert!(names_tenant(
            br#"{"corr":"c","request":{"tenant":"a"}}"#,
            "a"
        ));
        assert!(!names_tenant(br#"{"tenant":"ab"}"#, "a"));
        assert!(!names_tenant(br#"{"args":{"tenant":"a"}}"#, "a"));
        assert!(!names_tenant(b"not json", "a"));
        assert_eq!(needle("a\"b"), br#""tenant":"a\"b""#.to_vec());
    }

    #[test]
    fn odd_records_match_as_the_lookups_did() {
        fn by_lookup(bytes: &[u8], tenant: &str) -> bool {
            let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
                return false;
            };
            v.get("tenant").and_then(Value::as_str) == Some(tenant)
                || v.pointer("/request/tenant").and_then(Value::as_str) == Some(tenant)
        }
        let records = [
            r#"{"tenant":"a","request":{"tenant":"b"}}"#,
            r#"{"tenant":"b","request":{"tenant":"a"}}"#,
            r#"{"tenant":5,"request":{"tenant":"a"}}"#,
            r#"{"tenant":"a","request":5}"#,
            r#"{"tenant":"a","request":["a"]}"#,
            r#"{"tenant":null,"request":[{"tenant":"a"}]}"#,
            r#"{"request":{"tenant":["a"]}}"#,
            r#"{"request":null}"#,
            r#"{"tenant":"b","tenant":"a"}"#,
            r#"["a"]"#,
            r#""a""#,
            "null",
        ];
        for r in records {
            assert_eq!(
                names_tenant(r.as_bytes(), "a"),
                by_lookup(r.as_bytes(), "a"),
                "{r}"
            );
        }
    }
}
