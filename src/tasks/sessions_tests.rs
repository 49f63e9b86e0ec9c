//! The session part against the in-memory store: the cap (oldest idle evicted first,
//! active sessions passed over, refusal when all are active), ownership, coarse
//! touches and idle expiry.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, json};

use super::ids::{is_well_formed_session, new_session_id};
use super::sessions::{REFUSED_RETRY_AFTER, SessionError, SessionRepo};
use crate::auth::Principal;
use crate::config::{Config, LegacyConfig};
use crate::limits::Limits;
use crate::store::faulty::FaultyStore;
use crate::store::memory::MemoryStore;
use crate::store::test_records::session;
use crate::store::{OwnedSession, SessionCreated, TaskStore, now_ms};

const IDLE: Duration = Duration::from_secs(60);

fn alice() -> Principal {
    Principal {
        tenant: "acme".into(),
        subject: "alice".into(),
    }
}

fn bob() -> Principal {
    Principal {
        tenant: "acme".into(),
        subject: "bob".into(),
    }
}

struct Rig {
    repo: SessionRepo,
    store: Arc<dyn TaskStore>,
    faulty: Arc<FaultyStore>,
}

fn rig(cap: usize) -> Rig {
    let faulty = FaultyStore::new(MemoryStore::new());
    let store: Arc<dyn TaskStore> = faulty.clone();
    let cfg = LegacyConfig {
        max_sessions_per_principal: cap,
        session_idle: IDLE,
    };
    Rig {
        repo: SessionRepo::new(store.clone(), &cfg),
        store,
        faulty,
    }
}

impl Rig {
    /// A session of alice's stored directly, last seen `ago` before now.
    async fn stored(&self, ago: Duration) -> String {
        let id = new_session_id();
        let at = now_ms() - u64::try_from(ago.as_millis()).unwrap();
        let created = self
            .store
            .create_session(&session(&id, "acme", "alice", at), usize::MAX)
            .await
            .unwrap();
        assert_eq!(created, SessionCreated::New);
        id
    }

    async fn open(&self, who: &Principal) -> Result<String, SessionError> {
        let info = json!({"name": "client", "version": "1.0"});
        let mut caps = Map::new();
        caps.insert("roots".into(), json!({}));
        let rec = self
            .repo
            .open(who, "demo", "2025-06-18", info, caps)
            .await?;
        Ok(rec.session_id)
    }

    async fn exists(&self, id: &str) -> bool {
        matches!(
            self.store.session_owned(id, "acme", "alice").await.unwrap(),
            OwnedSession::Record(_)
        )
    }

    fn calls(&self, op: &str) -> usize {
        self.faulty.calls().get(op).copied().unwrap_or(0)
    }
}

#[tokio::test]
async fn open_resolve_and_close_are_the_owners_alone() {
    let r = rig(10);
    let id = r.open(&alice()).await.unwrap();
    assert!(is_well_formed_session(&id), "{id}");
    let rec = r.repo.resolve(&alice(), &id).await.unwrap().unwrap();
    assert_eq!(
        (rec.upstream.as_str(), rec.protocol_version.as_str()),
        ("demo", "2025-06-18")
    );
    assert_eq!(rec.client_info, json!({"name": "client", "version": "1.0"}));
    assert!(!rec.initialized && rec.subscriptions.is_empty());
    // Another principal's session, an id never issued and a malformed one: alike.
    let never = new_session_id();
    for (who, id) in [(bob(), id.as_str()), (alice(), &never), (alice(), "mcs_x")] {
        assert_eq!(r.repo.resolve(&who, id).await.unwrap(), None, "{id}");
        assert!(!r.repo.close(&who, id).await.unwrap(), "{id}");
    }
    assert!(r.exists(&id).await, "a foreign close left it alone");
    // A malformed id costs no store read.
    let reads = r.calls("session_owned");
    r.repo.resolve(&alice(), "mcs_x").await.unwrap();
    assert_eq!(r.calls("session_owned"), reads);
    let mut ended = r.repo.ended();
    assert!(r.repo.close(&alice(), &id).await.unwrap());
    assert_eq!(ended.try_recv().unwrap(), id);
    assert_eq!(r.repo.resolve(&alice(), &id).await.unwrap(), None);
    assert!(!r.repo.close(&alice(), &id).await.unwrap());
}

#[tokio::test]
async fn at_the_cap_the_oldest_idle_session_is_evicted_first() {
    let r = rig(3);
    let middle = r.stored(Duration::from_secs(20)).await;
    let oldest = r.stored(Duration::from_secs(30)).await;
    let newest = r.stored(Duration::from_secs(10)).await;
    let mut ended = r.repo.ended();
    let first = r.open(&alice()).await.unwrap();
    assert!(
        !r.exists(&oldest).await,
        "the least recently seen went first"
    );
    assert_eq!(ended.try_recv().unwrap(), oldest);
    assert!(r.exists(&middle).await && r.exists(&newest).await);
    r.open(&alice()).await.unwrap();
    assert!(!r.exists(&middle).await);
    assert!(r.exists(&newest).await && r.exists(&first).await);
    // Another principal's sessions are not touched by alice's cap.
    r.open(&bob()).await.unwrap();
    assert!(r.exists(&newest).await);
    assert_eq!(r.store.count_sessions().await.unwrap(), 4);
}

#[tokio::test]
async fn active_sessions_are_passed_over_and_all_active_is_refused() {
    let r = rig(2);
    let oldest = r.stored(Duration::from_secs(30)).await;
    let newer = r.stored(Duration::from_secs(10)).await;
    let held = r.repo.activity(&oldest);
    assert!(r.repo.is_active(&oldest));
    let third = r.open(&alice()).await.unwrap();
    assert!(r.exists(&oldest).await, "active here: passed over");
    assert!(!r.exists(&newer).await, "the idle one went instead");
    // Every session active: refused, nothing closed.
    let also = r.repo.activity(&third);
    let twice = r.repo.activity(&third);
    match r.open(&alice()).await {
        Err(SessionError::Refused { retry_after }) => {
            assert_eq!(retry_after, REFUSED_RETRY_AFTER);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(r.exists(&oldest).await && r.exists(&third).await);
    // Activity ends with the last guard of a session.
    drop(also);
    assert!(r.repo.is_active(&third));
    drop(twice);
    assert!(!r.repo.is_active(&third));
    r.open(&alice()).await.unwrap();
    assert!(!r.exists(&third).await);
    drop(held);
    assert!(!r.repo.is_active(&oldest));
}

#[tokio::test]
async fn a_closed_session_ends_its_guards() {
    let r = rig(1);
    let id = r.open(&alice()).await.unwrap();
    let guard = r.repo.activity(&id);
    assert_eq!(guard.session_id(), id);
    assert!(!guard.is_ended());
    let waiting = tokio::spawn(guard.ended());
    assert!(r.repo.close(&alice(), &id).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the guard saw the close")
        .unwrap();
    assert!(guard.is_ended());
}

#[tokio::test]
async fn touches_are_coarse() {
    let r = rig(10);
    let fresh = r.open(&alice()).await.unwrap();
    for _ in 0..3 {
        r.repo.resolve(&alice(), &fresh).await.unwrap().unwrap();
    }
    assert_eq!(
        r.calls("update_session"),
        0,
        "a fresh session is not rewritten"
    );
    let stale = r.stored(Duration::from_secs(20)).await;
    let before = now_ms();
    let rec = r.repo.resolve(&alice(), &stale).await.unwrap().unwrap();
    assert!(rec.last_seen_at_ms >= before, "touched on use");
    assert_eq!(r.calls("update_session"), 1);
    r.repo.resolve(&alice(), &stale).await.unwrap().unwrap();
    assert_eq!(r.calls("update_session"), 1, "once per touch interval");
}

#[tokio::test]
async fn idle_sessions_expire_unless_active_here() {
    let r = rig(10);
    let idle = r.stored(IDLE + Duration::from_secs(5)).await;
    let held = r.stored(IDLE + Duration::from_secs(5)).await;
    let busy = r.stored(Duration::from_secs(5)).await;
    let read = r.stored(IDLE + Duration::from_secs(1)).await;
    // A use of an idle session finds it expired (and closes it).
    assert_eq!(r.repo.resolve(&alice(), &read).await.unwrap(), None);
    assert!(!r.exists(&read).await);
    let guard = r.repo.activity(&held);
    let mut ended = r.repo.ended();
    assert_eq!(r.repo.expire_idle().await.unwrap(), 1);
    assert!(!r.exists(&idle).await);
    assert_eq!(ended.try_recv().unwrap(), idle);
    assert!(r.exists(&busy).await);
    // The one active here is refreshed instead, so it does not look idle elsewhere.
    let rec = r.repo.resolve(&alice(), &held).await.unwrap().unwrap();
    assert!(rec.last_seen_at_ms + 1_000 >= now_ms());
    assert!(!guard.is_ended());
    drop(guard);
    assert_eq!(r.repo.expire_idle().await.unwrap(), 0);
}

#[tokio::test]
async fn store_failures_are_errors_not_refusals() {
    let r = rig(10);
    r.faulty.fail(
        "create_session",
        crate::store::StoreError::Corrupt("broken".into()),
    );
    assert!(matches!(
        r.open(&alice()).await,
        Err(SessionError::Store(_))
    ));
}

#[tokio::test]
async fn the_engine_holds_the_part() {
    let cfg = Config::parse(
        "[auth]\nmode = \"none\"\n[legacy]\nmax_sessions_per_principal = 1\n\
         [[upstream]]\nname = \"demo\"\ncommand = [\"unused\"]\n",
    )
    .unwrap();
    let limits = Limits::from_config(&cfg);
    let holds = super::Holds::new([7; 32], cfg.tasks.input_timeout, None);
    let engine = super::Engine::new(MemoryStore::new(), Arc::new(cfg), limits, holds);
    let s = engine.sessions();
    let a = s
        .open(&alice(), "demo", "2025-11-25", json!({}), Map::new())
        .await
        .unwrap();
    let b = s
        .open(&alice(), "demo", "2025-11-25", json!({}), Map::new())
        .await
        .unwrap();
    assert_eq!(s.resolve(&alice(), &a.session_id).await.unwrap(), None);
    let updated = s
        .update(&b.session_id, |r| {
            r.initialized = true;
            true
        })
        .await
        .unwrap()
        .unwrap();
    assert!(updated.initialized);
}
