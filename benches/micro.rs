//! Micro-benchmarks (divan): wire validation, JWT verification, durable store creation,
//! the `tasks/get` snapshot and the poll-limiter decision.
//!
//! `cargo bench --bench micro` (all), `cargo bench --bench micro -- jwt` (a filter).
//! Side-by-side rows matter more than absolute times: the machine is shared.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use divan::Bencher;
use divan::counter::ItemsCount;
use futures_util::FutureExt;
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use taskgate::auth::Authenticator;
use taskgate::config::{AuthConfig, StoreConfig};
use taskgate::front::wire::{self, Incoming};
use taskgate::store::sled::SledStore;
use taskgate::store::{TaskRecord, TaskStatus, TaskStore};
use taskgate::tasks::snapshot;

#[path = "support/fixtures.rs"]
mod fixtures;

fn main() {
    divan::main();
}

// ---------------------------------------------------------------------------------------
// Wire validation + `_meta` parsing.

const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{},"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#;

fn headers(method: &str, name: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "mcp-protocol-version",
        HeaderValue::from_static("2026-07-28"),
    );
    h.insert("mcp-method", HeaderValue::from_str(method).unwrap());
    if let Some(n) = name {
        h.insert("mcp-name", HeaderValue::from_str(n).unwrap());
    }
    h
}

fn check_valid(body: &[u8], h: &HeaderMap) {
    match wire::validate(body, h) {
        Ok(Incoming::Request(_)) => {}
        other => panic!("bench request does not validate: {other:?}"),
    }
}

mod validate {
    use super::*;

    #[divan::bench]
    fn tools_call_echo(b: Bencher) {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello world"}},{META}}}}}"#
        );
        let h = headers("tools/call", Some("echo"));
        check_valid(body.as_bytes(), &h);
        b.bench(|| wire::validate(divan::black_box(body.as_bytes()), &h).is_ok());
    }

    #[divan::bench]
    fn tasks_get(b: Bencher) {
        let id = "tsk_01JABCDEFGHJKMNPQRSTVWXYZ0";
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":"r-1","method":"tasks/get","params":{{"taskId":"{id}",{META}}}}}"#
        );
        let h = headers("tasks/get", Some(id));
        check_valid(body.as_bytes(), &h);
        b.bench(|| wire::validate(divan::black_box(body.as_bytes()), &h).is_ok());
    }

    /// A 16 KiB argument payload: the JSON parse dominates.
    #[divan::bench]
    fn tools_call_16k_args(b: Bencher) {
        let text = "x".repeat(16 * 1024);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}},{META}}}}}"#
        );
        let h = headers("tools/call", Some("echo"));
        check_valid(body.as_bytes(), &h);
        b.counter(divan::counter::BytesCount::new(body.len()))
            .bench(|| wire::validate(divan::black_box(body.as_bytes()), &h).is_ok());
    }
}

// ---------------------------------------------------------------------------------------
// JWT verification (cache bypassed: every iteration runs the signature check).

mod jwt {
    use super::*;

    /// The signer the authenticator trusts: its secret for HS256, its issuer and
    /// audience for every algorithm.
    const JWT: fixtures::Hs256Issuer = fixtures::Hs256Issuer {
        secret: "bench-secret-0123456789abcdef0123456789abcdef",
        issuer: "https://issuer.bench",
        audience: "taskgate-bench",
    };
    const RSA_KEY: &str = include_str!("../src/auth/testdata/rsa1.key.pem");
    const RSA_PUB: &str = include_str!("../src/auth/testdata/rsa1.pub.pem");
    const EC_KEY: &str = include_str!("../src/auth/testdata/ec1.key.pem");
    const EC_PUB: &str = include_str!("../src/auth/testdata/ec1.pub.pem");

    fn claims() -> Value {
        JWT.claims("alice", "acme", 3600)
    }

    fn setup(alg: Algorithm) -> (Authenticator, String) {
        let (cfg_alg, key, pem) = match alg {
            Algorithm::HS256 => (
                "HS256",
                EncodingKey::from_secret(JWT.secret.as_bytes()).unwrap(),
                None,
            ),
            Algorithm::RS256 => (
                "RS256",
                EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).unwrap(),
                Some(RSA_PUB),
            ),
            Algorithm::ES256 => (
                "ES256",
                EncodingKey::from_ec_pem(EC_KEY.as_bytes()).unwrap(),
                Some(EC_PUB),
            ),
            _ => unreachable!(),
        };
        let cfg = AuthConfig {
            algorithms: vec![cfg_alg.into()],
            hs256_secret: Some(JWT.secret.into()),
            public_key_pem: pem.map(str::to_owned),
            issuer: Some(JWT.issuer.into()),
            audience: Some(JWT.audience.into()),
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&cfg, "http://127.0.0.1:8080").unwrap();
        let token = jsonwebtoken::encode(&Header::new(alg), &claims(), &key).unwrap();
        (auth, token)
    }

    fn verify(b: Bencher, alg: Algorithm) {
        let (auth, token) = setup(alg);
        let p = auth
            .verify_uncached(&token)
            .now_or_never()
            .unwrap()
            .unwrap();
        assert_eq!(p.subject, "alice");
        b.bench(|| {
            auth.verify_uncached(divan::black_box(&token))
                .now_or_never()
                .unwrap()
                .is_ok()
        });
    }

    #[divan::bench]
    fn hs256(b: Bencher) {
        verify(b, Algorithm::HS256);
    }

    #[divan::bench]
    fn rs256(b: Bencher) {
        verify(b, Algorithm::RS256);
    }

    #[divan::bench]
    fn es256(b: Bencher) {
        verify(b, Algorithm::ES256);
    }

    /// The full `authenticate` path for a token already in the verified-token cache
    /// (what a polling client costs after its first request).
    #[divan::bench]
    fn hs256_cached_authenticate(b: Bencher) {
        let (auth, token) = setup(Algorithm::HS256);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        auth.authenticate(&h, None).now_or_never().unwrap().unwrap();
        b.bench(|| {
            auth.authenticate(divan::black_box(&h), None)
                .now_or_never()
                .unwrap()
                .is_ok()
        });
    }
}

// ---------------------------------------------------------------------------------------
// Store: create + durable flush, sequential vs concurrent (group commit).

fn record(task_id: &str, tenant: &str, subject: &str, status: TaskStatus) -> TaskRecord {
    TaskRecord {
        status,
        ..fixtures::task(task_id, tenant, subject, 3_600_000)
    }
}

mod store {
    use super::*;

    struct Fixture {
        rt: tokio::runtime::Runtime,
        store: Arc<SledStore>,
        _dir: tempfile::TempDir,
        next: AtomicU64,
    }

    fn fixture() -> Fixture {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            path: dir.path().join("data"),
            ..StoreConfig::default()
        };
        let store = rt.block_on(async { SledStore::open(&cfg) }).unwrap();
        Fixture {
            rt,
            store,
            _dir: dir,
            next: AtomicU64::new(0),
        }
    }

    async fn create_one(store: &SledStore, n: u64) {
        let id = format!("tsk_bench_{n:012}");
        let rec = record(&id, "acme", "alice", TaskStatus::Working);
        store
            .create(
                &rec,
                &fixtures::route(&format!("rt_{n:012}"), &id, "acme", "alice"),
                None,
            )
            .await
            .unwrap();
        store.flush().await.unwrap();
    }

    /// One writer: create, then await its flush, one at a time.
    #[divan::bench(sample_count = 30, sample_size = 20)]
    fn create_flush_sequential(b: Bencher) {
        let f = fixture();
        b.counter(ItemsCount::new(1usize)).bench(|| {
            let n = f.next.fetch_add(1, Ordering::Relaxed);
            f.rt.block_on(create_one(&f.store, n));
        });
    }

    /// `N` concurrent writers each create and await a flush; group commit shares
    /// flush rounds between them. Counter: tasks.
    #[divan::bench(args = [16, 64], sample_count = 30, sample_size = 2)]
    fn create_flush_concurrent(b: Bencher, writers: usize) {
        let f = fixture();
        b.counter(ItemsCount::new(writers)).bench(|| {
            f.rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for _ in 0..writers {
                    let store = f.store.clone();
                    let n = f.next.fetch_add(1, Ordering::Relaxed);
                    set.spawn(async move { create_one(&store, n).await });
                }
                while set.join_next().await.is_some() {}
            })
        });
    }
}

// ---------------------------------------------------------------------------------------
// `tasks/get` result serialisation (the owner's snapshot → bytes, no `Value` between).

mod snapshot_get {
    use super::*;

    fn server_info() -> Value {
        json!({"name": "demo-upstream", "version": "0.1.0"})
    }

    fn run(b: Bencher, rec: TaskRecord) {
        let si = server_info();
        let rec = std::sync::Arc::new(rec);
        b.bench(|| {
            let view = snapshot::GetResult {
                rec: divan::black_box(&rec).clone(),
                server_info: &si,
            };
            serde_json::to_vec(&view).unwrap().len()
        });
    }

    #[divan::bench]
    fn working(b: Bencher) {
        let mut rec = record(
            "tsk_01JABCDEFGHJKMNPQRSTVWXYZ0",
            "acme",
            "alice",
            TaskStatus::Working,
        );
        rec.status_message = Some("2/5: step 2/5".into());
        run(b, rec);
    }

    #[divan::bench]
    fn completed_small_result(b: Bencher) {
        let mut rec = record(
            "tsk_01JABCDEFGHJKMNPQRSTVWXYZ0",
            "acme",
            "alice",
            TaskStatus::Completed,
        );
        rec.result =
            Some(json!({"content": [{"type": "text", "text": "hello world"}], "isError": false}));
        run(b, rec);
    }

    #[divan::bench]
    fn completed_64k_result(b: Bencher) {
        let mut rec = record(
            "tsk_01JABCDEFGHJKMNPQRSTVWXYZ0",
            "acme",
            "alice",
            TaskStatus::Completed,
        );
        rec.result = Some(json!({"content": [{"type": "text", "text": "y".repeat(64 * 1024)}]}));
        run(b, rec);
    }

    #[divan::bench]
    fn input_required(b: Bencher) {
        let mut rec = record(
            "tsk_01JABCDEFGHJKMNPQRSTVWXYZ0",
            "acme",
            "alice",
            TaskStatus::InputRequired,
        );
        rec.input_requests.insert(
            "elicitation-1".into(),
            json!({"method": "elicitation/create", "params": {"message": "What is the answer?",
                "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}}}),
        );
        rec.issued_keys.push("elicitation-1".into());
        run(b, rec);
    }
}

// ---------------------------------------------------------------------------------------
// Poll-limiter decision (`tasks/get`, before the store read).

#[divan::bench_group]
mod poll_limiter {
    use super::*;
    use taskgate::auth::Principal;
    use taskgate::config::{LimitsConfig, TasksConfig};
    use taskgate::limits::Limits;

    fn limits() -> (Limits, Principal) {
        let l = Limits::new(&LimitsConfig::default(), &TasksConfig::default(), &[]);
        let p = Principal {
            tenant: "acme".into(),
            subject: "alice".into(),
        };
        (l, p)
    }

    /// The same task polled again at once: refused (after the burst).
    #[divan::bench]
    fn same_task_throttled(b: Bencher) {
        let (l, p) = limits();
        b.bench_local(|| l.check_poll(&p, "tsk_AAAAAAAAAAAAAAAAAAAAAA").is_err());
    }

    /// A new task id on every poll: allowed, and the bounded state keeps evicting
    /// (1M distinct ids against a 100k-entry cap).
    #[divan::bench]
    fn new_task_each_poll(b: Bencher) {
        let (l, p) = limits();
        let ids: Vec<String> = (0..1_000_000u64).map(|i| format!("tsk_{i:022}")).collect();
        // Fill the state past its cap first, so every measured poll meets a full map.
        for id in &ids[..200_000] {
            let _ = l.check_poll(&p, id);
        }
        let n = AtomicU64::new(200_000);
        b.bench_local(|| {
            let i = n.fetch_add(1, Ordering::Relaxed) as usize % ids.len();
            l.check_poll(&p, &ids[i]).is_ok()
        });
    }
}
