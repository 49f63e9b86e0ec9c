//! One page of a principal's tasks on one upstream, for `tasks/list` of the
//! 2025-11-25 dialect (docs/design.md §25): from the store's owner index, oldest first,
//! with an opaque cursor for the next page.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::failure::Failure;
use super::ids;
use super::methods::unavailable;
use super::repo::TaskRepo;
use crate::auth::Principal;
use crate::limits::Limits;
use crate::protocol::RpcError;
use crate::store::{OwnerCursor, TaskRecord, now_ms};

/// How many store reads one page may take while expired records (not swept yet) keep
/// it short: past that the page goes out short, with a cursor, so one request stays
/// bounded whatever the sweeper's lag.
const MAX_READS: usize = 4;

/// The cursor as a client holds it: base64url (no padding) of
/// `<created_at_ms>.<task id>`. Opaque to clients; it names a position, not a right
/// (the caller's own tasks are listed from it, whoever issued it).
fn encode_cursor(c: &OwnerCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", c.created_at_ms, c.task_id))
}

/// The position a cursor names; `None` for anything [`encode_cursor`] does not write.
fn decode_cursor(text: &str) -> Option<OwnerCursor> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let (ms, task_id) = text.split_once('.')?;
    let created_at_ms: u64 = ms.parse().ok()?;
    // Only the canonical digits (no sign, no leading zeros) and a task id's shape.
    if created_at_ms.to_string() != ms || !ids::is_well_formed(task_id) {
        return None;
    }
    Some(OwnerCursor {
        created_at_ms,
        task_id: task_id.to_string(),
    })
}

fn invalid_cursor() -> Failure {
    Failure::outcome(RpcError::invalid_params("invalid cursor"))
}

/// One page of the principal's tasks on `upstream` (docs/design.md §25): records
/// unexpired, terminal ones only once durable (like
/// [`owner_snapshot`](super::methods::owner_snapshot)), with the adaptive poll
/// interval, and the opaque cursor for the next page — `Some` only when more may
/// follow. A `cursor` this gateway did not write is `-32602` "invalid cursor"; a store
/// that does not answer is the retry-later class of the other `tasks/*` methods.
pub(super) async fn list_owned(
    tasks: &TaskRepo,
    limits: &Limits,
    principal: &Principal,
    upstream: &str,
    cursor: Option<&str>,
    limit: usize,
) -> Result<(Vec<TaskRecord>, Option<String>), Failure> {
    let limit = limit.max(1);
    let mut after = match cursor {
        None => None,
        Some(c) => Some(decode_cursor(c).ok_or_else(invalid_cursor)?),
    };
    let mut page: Vec<TaskRecord> = Vec::new();
    let mut next = None;
    for read in 1..=MAX_READS {
        // One more than the page still needs, to learn whether more may follow.
        let want = limit - page.len();
        let batch = tasks
            .list_owned(
                &principal.tenant,
                &principal.subject,
                upstream,
                after.as_ref(),
                want + 1,
            )
            .await
            .map_err(unavailable)?;
        let more = batch.len() > want;
        let now = now_ms();
        for rec in batch.into_iter().take(want) {
            after = Some(OwnerCursor {
                created_at_ms: rec.created_at_ms,
                task_id: rec.task_id.clone(),
            });
            // Never served past the ttl, swept or not (docs/design.md §11).
            if rec.expires_at_ms > now {
                page.push(rec);
            }
        }
        if !more {
            break;
        }
        if page.len() == limit || read == MAX_READS {
            // The next page resumes after the last record read: those between it
            // and the page's last are expired.
            next = after.take();
            break;
        }
    }
    tasks.durable_all(&page).await.map_err(unavailable)?;
    for rec in &mut page {
        // As a `tasks/get` shows it, and remembered as advertised (§8).
        limits.adapt(principal, rec);
    }
    Ok((page, next.as_ref().map(encode_cursor)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::limits::Limits;
    use crate::store::faulty::FaultyStore;
    use crate::store::memory::MemoryStore;
    use crate::store::test_records::{route, task};
    use crate::store::{StoreError, TaskStatus, TaskStore};
    use crate::tasks::Engine;
    use crate::tasks::failure::ErrorClass;

    #[test]
    fn cursors_round_trip() {
        for created_at_ms in [0, 1, 1_767_225_600_000, u64::MAX] {
            let c = OwnerCursor {
                created_at_ms,
                task_id: ids::new_task_id(),
            };
            let text = encode_cursor(&c);
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{text}"
            );
            assert_eq!(decode_cursor(&text), Some(c));
        }
    }

    #[test]
    fn anything_else_is_no_cursor() {
        let id = ids::new_task_id();
        let b64 = |s: &str| URL_SAFE_NO_PAD.encode(s);
        let bad = [
            String::new(),
            "not base64!".into(),
            base64::engine::general_purpose::STANDARD.encode(format!("12.{id}")) + "/+",
            b64(&id),
            b64(&format!(".{id}")),
            b64(&format!("+12.{id}")),
            b64(&format!("012.{id}")),
            b64(&format!("-1.{id}")),
            b64(&format!("18446744073709551616.{id}")),
            b64("12.tsk_short"),
            b64(&format!("12.{id}x")),
            b64("12."),
            URL_SAFE_NO_PAD.encode([0xff, 0xfe, b'.']),
        ];
        for text in bad {
            assert_eq!(decode_cursor(&text), None, "{text:?}");
        }
    }

    const CONFIG: &str =
        "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"demo\"\ncommand = [\"unused\"]\n";

    fn engine(store: Arc<dyn TaskStore>) -> Arc<Engine> {
        let cfg = Config::parse(CONFIG).expect("config");
        let limits = Limits::from_config(&cfg);
        let holds = crate::tasks::Holds::new([7; 32], cfg.tasks.input_timeout, None);
        Engine::new(store, Arc::new(cfg), limits, holds)
    }

    fn alice() -> Principal {
        Principal {
            tenant: "acme".into(),
            subject: "alice".into(),
        }
    }

    /// A task of alice on `upstream`, created at `created_at_ms`, expiring at `until`.
    async fn put(store: &dyn TaskStore, upstream: &str, created_at_ms: u64, until: u64) -> String {
        let id = ids::new_task_id();
        let rec = TaskRecord {
            upstream: upstream.into(),
            created_at_ms,
            ..task(&id, "acme", until)
        };
        store
            .create(&rec, &route(&ids::new_route_id(), None), None)
            .await
            .expect("create");
        id
    }

    /// Every page from the first, with the size of each.
    async fn walk(engine: &Engine, limit: usize) -> (Vec<String>, Vec<usize>) {
        let (mut ids, mut sizes, mut cursor) = (Vec::new(), Vec::new(), None::<String>);
        loop {
            let (page, next) = engine
                .list_owned(&alice(), "demo", cursor.as_deref(), limit)
                .await
                .expect("page");
            sizes.push(page.len());
            ids.extend(page.into_iter().map(|r| r.task_id));
            match next {
                Some(n) => cursor = Some(n),
                None => return (ids, sizes),
            }
        }
    }

    #[tokio::test]
    async fn pages_skip_expired_records_and_end_without_a_cursor() {
        let store = MemoryStore::new();
        let later = now_ms() + 3_600_000;
        let past = now_ms() - 1;
        let mut live = Vec::new();
        // Created in this order: live, 3 expired (not swept), live ×4; and neighbours.
        live.push(put(&*store, "demo", 10, later).await);
        for at in 11..14 {
            put(&*store, "demo", at, past).await;
        }
        for at in 20..24 {
            live.push(put(&*store, "demo", at, later).await);
        }
        put(&*store, "other", 15, later).await;
        let bob = TaskRecord {
            subject: "bob".into(),
            ..task(&ids::new_task_id(), "acme", later)
        };
        store
            .create(&bob, &route("rt_bob", None), None)
            .await
            .expect("create");
        let engine = engine(store.clone());
        let (ids, sizes) = walk(&engine, 2).await;
        assert_eq!(ids, live);
        // Full pages although three expired records lie in the way; the last page
        // ends the list.
        assert_eq!(sizes, [2, 2, 1]);
        let (all, next) = engine
            .list_owned(&alice(), "demo", None, 100)
            .await
            .expect("page");
        assert_eq!(all.len(), 5);
        assert_eq!(next, None);
        // Exactly a page: no cursor, since nothing follows.
        let (page, next) = engine
            .list_owned(&alice(), "demo", None, 5)
            .await
            .expect("page");
        assert_eq!((page.len(), next), (5, None));
        // A long run of expired records is read in bounded steps: a short page with a
        // cursor, and the list goes on from there.
        for at in 30..40 {
            put(&*store, "demo", at, past).await;
        }
        let last = put(&*store, "demo", 50, later).await;
        let after_live = encode_cursor(&OwnerCursor {
            created_at_ms: 23,
            task_id: live[4].clone(),
        });
        let (page, next) = engine
            .list_owned(&alice(), "demo", Some(&after_live), 1)
            .await
            .expect("page");
        assert!(page.is_empty() && next.is_some(), "{page:?} {next:?}");
        let mut rest = Vec::new();
        let mut cursor = next;
        while let Some(c) = cursor {
            let (page, next) = engine
                .list_owned(&alice(), "demo", Some(&c), 1)
                .await
                .expect("page");
            rest.extend(page.into_iter().map(|r| r.task_id));
            cursor = next;
        }
        assert_eq!(rest, [last]);
    }

    #[tokio::test]
    async fn a_bad_cursor_and_a_silent_store_fail_as_the_other_methods_do() {
        let faulty = FaultyStore::new(MemoryStore::new());
        let engine = engine(faulty.clone());
        let e = engine
            .list_owned(&alice(), "demo", Some("garbage"), 10)
            .await
            .expect_err("bad cursor");
        assert_eq!(e.class, ErrorClass::Outcome);
        assert_eq!(
            (e.error.code, e.error.message.as_str()),
            (-32602, "invalid cursor")
        );
        assert!(!faulty.calls().contains_key("list_owned"), "no store read");
        faulty.fail("list_owned", StoreError::Closed);
        let e = engine
            .list_owned(&alice(), "demo", None, 10)
            .await
            .expect_err("store down");
        assert!(matches!(e.class, ErrorClass::RetryLater(_)), "{e:?}");
        faulty.heal("list_owned");
        let (page, next) = engine
            .list_owned(&alice(), "demo", None, 10)
            .await
            .expect("empty");
        assert!(page.is_empty() && next.is_none());
    }

    #[tokio::test]
    async fn live_records_get_the_adaptive_interval_and_terminal_ones_keep_theirs() {
        let store = MemoryStore::new();
        let later = now_ms() + 3_600_000;
        let working = put(&*store, "demo", 1, later).await;
        let done = put(&*store, "demo", 2, later).await;
        for id in [&working, &done] {
            store
                .update(id, &mut |r| {
                    r.poll_interval_ms = 987_654;
                    if r.task_id == done {
                        r.status = TaskStatus::Completed;
                    }
                    true
                })
                .await
                .expect("update");
        }
        let engine = engine(store);
        let (page, _) = engine
            .list_owned(&alice(), "demo", None, 10)
            .await
            .expect("page");
        assert_eq!(page.len(), 2);
        assert_ne!(page[0].poll_interval_ms, 987_654, "adapted");
        assert_eq!(page[1].poll_interval_ms, 987_654, "terminal: as stored");
    }
}
