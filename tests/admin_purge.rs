//! A tenant purge (docs/design.md §27 "Tenant purge") through `taskgate admin purge`,
//! against the real binary, on sled and on PostgreSQL. Two tenants are seeded with a
//! task in every status, a keyed task and its idempotency claim, an expired task's
//! tombstone and claim, a read mark and a 2025-era session; then each starts a
//! promoted call and an inline call. After the purge of one: its ids answer exactly
//! as ids never issued, its calls were cancelled upstream, the other tenant has
//! everything, the audit log has its two lines, and a raw scan of every sled tree or
//! PostgreSQL table (the gateway stopped) finds no byte of the purged tenant.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};
use taskgate::store::{SessionRecord, TaskStatus, TaskStore, Tombstone, idempotency, now_ms};
use taskgate::tasks::ids::{new_session_id, new_task_id};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const DOOMED: &str = "doomed-tenant";
const KEPT: &str = "kept-tenant";
const HOUR: u64 = 3_600_000;
/// The `sleep` durations that tell the four live calls apart in the upstream's log.
const DOOMED_TASK_MS: u64 = 60_000;
const KEPT_TASK_MS: u64 = 60_002;
const DOOMED_INLINE_MS: u64 = 60_001;
const KEPT_INLINE_MS: u64 = 2_500;

async fn open_store(b: StoreBackend, dir: &Path) -> Arc<dyn TaskStore> {
    match b {
        StoreBackend::Sled => {
            let cfg = taskgate::config::StoreConfig {
                path: dir.join("data"),
                ..Default::default()
            };
            taskgate::store::sled::SledStore::open(&cfg).unwrap()
        }
        StoreBackend::Postgres => {
            let settings = taskgate::store::postgres::PgSettings {
                url: pg_url(),
                pool_size: 2,
                schema: schema_for_dir(dir),
                lease_ms: 10_000,
                pooler: Default::default(),
            };
            taskgate::store::postgres::PgStore::open(&settings)
                .await
                .unwrap()
        }
    }
}

/// What [`seed`] stored for one tenant: its task ids by name, and its session id.
struct Seeded {
    tasks: BTreeMap<&'static str, String>,
    session: String,
}

impl Seeded {
    fn id(&self, name: &str) -> &str {
        &self.tasks[name]
    }

    /// Every id of the tenant's, sessions too.
    fn all(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tasks.values().cloned().collect();
        v.push(self.session.clone());
        v
    }
}

/// The seeded tasks of tenant `t`: one per status, a keyed one, an expired one (only
/// its tombstone and claim remain), a read mark; and a 2025-era session.
async fn seed(s: &Arc<dyn TaskStore>, t: &str) -> Seeded {
    let mut ids = BTreeMap::new();
    let statuses = [
        ("working", TaskStatus::Working),
        ("input", TaskStatus::InputRequired),
        ("completed", TaskStatus::Completed),
        ("failed", TaskStatus::Failed),
        ("cancelled", TaskStatus::Cancelled),
    ];
    for (name, status) in statuses {
        let id = new_task_id();
        let mut rec = fixtures::task(&id, t, "alice", HOUR);
        rec.status = status;
        if status == TaskStatus::Completed {
            rec.result =
                Some(json!({"content": [{"type": "text", "text": format!("SECRET-{t}")}]}));
        }
        if status == TaskStatus::InputRequired {
            rec.input_requests.insert(
                "k1".into(),
                json!({"method": "elicitation/create", "params": {"message": "?"}}),
            );
        }
        let route = fixtures::route(&format!("rt_{t}_{name}"), &id, t, "alice");
        s.create(&rec, &route, None).await.unwrap();
        // No call is behind a seeded task: its route goes, or start-up recovery
        // would fail the working one before the test sees it.
        s.remove_route(&route.route_id).await.unwrap();
        ids.insert(name, id);
    }
    s.mark_seen(&[ids["completed"].clone()]).await.unwrap();
    let key = |k: &str| idempotency::index_key(t, "alice", "demo", "echo", k);
    let keyed = fixtures::task(&new_task_id(), t, "alice", HOUR);
    let route = fixtures::route(&format!("rt_{t}_keyed"), &keyed.task_id, t, "alice");
    s.create(&keyed, &route, Some(&key("k1"))).await.unwrap();
    s.remove_route(&route.route_id).await.unwrap();
    ids.insert("keyed", keyed.task_id.clone());
    let mut old = fixtures::task(&new_task_id(), t, "alice", HOUR);
    old.expires_at_ms = now_ms() - 1000;
    let route = fixtures::route(&format!("rt_{t}_expired"), &old.task_id, t, "alice");
    s.create(&old, &route, Some(&key("k2"))).await.unwrap();
    s.remove_route(&route.route_id).await.unwrap();
    let now = now_ms();
    assert!(
        s.expire(&old.task_id, now, now + HOUR)
            .await
            .unwrap()
            .is_some()
    );
    let tomb: Option<Tombstone> = s.tombstone(&old.task_id).await.unwrap();
    assert!(tomb.is_some(), "the expired task left its tombstone");
    ids.insert("expired", old.task_id);
    let session = SessionRecord {
        v: taskgate::store::SCHEMA_VERSION,
        session_id: new_session_id(),
        tenant: t.into(),
        subject: "alice".into(),
        upstream: "demo".into(),
        protocol_version: "2025-06-18".into(),
        client_info: json!({"name": "seeded", "version": "1"}),
        client_capabilities: serde_json::Map::new(),
        created_at_ms: now,
        last_seen_at_ms: now,
        initialized: true,
        log_level: None,
        subscriptions: Vec::new(),
    };
    s.create_session(&session, 10).await.unwrap();
    s.flush().await.unwrap();
    Seeded {
        tasks: ids,
        session: session.session_id,
    }
}

async fn admin_get(port: u16, path: &str) -> Value {
    let headers = vec![(
        "authorization",
        format!("Bearer {}", admin_token("taskgate:admin")),
    )];
    let url = format!("http://127.0.0.1:{port}/admin{path}");
    let r = raw(&url, "GET", &headers, Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    serde_json::from_slice(&r.body).unwrap()
}

/// The upstream ids of the traced `tools/call`s of `sleep` for `ms`.
fn call_ids(log: &Path, ms: u64) -> Vec<Value> {
    traced_messages(log)
        .into_iter()
        .filter(|m| {
            m["method"] == "tools/call"
                && m["params"]["name"] == "sleep"
                && m["params"]["arguments"]["ms"] == ms
        })
        .map(|m| m["id"].clone())
        .collect()
}

fn cancelled_upstream(log: &Path, ms: u64) -> bool {
    let ids = call_ids(log, ms);
    traced_messages(log).iter().any(|m| {
        m["method"] == "notifications/cancelled" && ids.contains(&m["params"]["requestId"])
    })
}

/// The JSON-RPC answer of a held inline call (JSON, or the last SSE event).
fn final_message(r: &Resp) -> Value {
    if r.is_sse() {
        r.sse_messages().pop().unwrap_or(Value::Null)
    } else {
        r.json()
    }
}

/// What `method` on `task_id` answers `who`, without the request id.
async fn task_answer(who: &Client2026, method: &str, task_id: &str) -> (u16, Value) {
    let r = who.request(method, json!({"taskId": task_id})).await;
    let mut v = r.json();
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
    }
    (r.status, v)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every key and value of every tree of the sled store in `dir`: (tree, bytes).
fn sled_dump(dir: &Path) -> Vec<(String, Vec<u8>)> {
    // The killed gateway's lock goes with its process; sled's threads may hold the
    // file a moment longer.
    let db = (0..200)
        .find_map(|_| {
            ::sled::Config::new()
                .path(dir.join("data"))
                .open()
                .map_err(|_| std::thread::sleep(Duration::from_millis(50)))
                .ok()
        })
        .expect("open the stopped gateway's sled store");
    let mut out = Vec::new();
    for name in db.tree_names() {
        let tree = db.open_tree(&name).unwrap();
        let tree_name = String::from_utf8_lossy(&name).into_owned();
        for kv in tree.iter() {
            let (k, v) = kv.unwrap();
            out.push((tree_name.clone(), k.to_vec()));
            out.push((tree_name.clone(), v.to_vec()));
        }
    }
    out
}

/// The text form of every row of every table in the gateway's schema, with each
/// `bytea` as hex: (table, text).
async fn pg_dump(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let schema = schema_for_dir(dir);
    let c = taskgate::store::postgres::connect_url(&pg_url())
        .await
        .unwrap();
    let tables = c
        .query(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = $1 AND table_type = 'BASE TABLE'",
            &[&schema],
        )
        .await
        .unwrap();
    assert!(
        tables.len() >= 10,
        "every table of the schema: {}",
        tables.len()
    );
    let mut out = Vec::new();
    for t in tables {
        let table: String = t.get(0);
        let rows = c
            .query(
                &format!("SELECT t::text FROM \"{schema}\".\"{table}\" t"),
                &[],
            )
            .await
            .unwrap();
        for row in rows {
            let text: String = row.get(0);
            out.push((table.clone(), text.into_bytes()));
        }
    }
    out
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Which stored items hold one of `needles` (as bytes, or as hex on PostgreSQL).
fn holding(dump: &[(String, Vec<u8>)], needles: &[String]) -> Vec<String> {
    let mut hits = Vec::new();
    for (table, bytes) in dump {
        for n in needles {
            if contains(bytes, n.as_bytes()) || contains(bytes, hex(n).as_bytes()) {
                hits.push(format!("{table}: {n}"));
            }
        }
    }
    hits
}

async fn a_purge_leaves_nothing_of_the_tenant(b: StoreBackend) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(b, dir.path()).await;
    let doomed_seed = seed(&store, DOOMED).await;
    let kept_seed = seed(&store, KEPT).await;
    drop(store);

    let port = free_port();
    let log = dir.path().join("stdin.log");
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\nmetrics_listen = \"127.0.0.1:{port}\"\n\
         {}{}\n{}",
        b.store_section(dir.path(), ""),
        jwt_auth(),
        traced_stdio_upstream(
            &log,
            "max_concurrency = 8\n[upstream.tools.sleep]\npromote_after_ms = 0"
        ),
    );
    let config_path = dir.path().join("taskgate.toml");
    write(&config_path, &config);
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;

    let owner = |t: &str| {
        Client2026::new(&gw, "/mcp", Some(token("alice", t)))
            .with_caps(json!({"extensions": {TASKS: {}}}))
    };
    let (doomed, kept) = (owner(DOOMED), owner(KEPT));
    // Before: the seeded records are served, and an expired id says so.
    let (_, v) = task_answer(&doomed, "tasks/get", doomed_seed.id("completed")).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    let (_, v) = task_answer(&doomed, "tasks/get", doomed_seed.id("expired")).await;
    assert_eq!(v["error"]["message"], "task expired", "{v}");

    // Live calls of both tenants: a promoted task and an inline call each.
    let promoted = |t: &str, ms: u64| {
        let c = owner(t);
        async move {
            let r = c.call_tool("sleep", json!({"ms": ms})).await;
            r.json()["result"]["taskId"]
                .as_str()
                .unwrap_or_else(|| panic!("a task: {:?}", r.json()))
                .to_string()
        }
    };
    let doomed_task = promoted(DOOMED, DOOMED_TASK_MS).await;
    let kept_task = promoted(KEPT, KEPT_TASK_MS).await;
    let mut doomed_ids: Vec<String> = doomed_seed.tasks.values().cloned().collect();
    doomed_ids.push(doomed_task.clone());
    let inline = |t: &str, ms: u64| {
        let c = Client2026::new(&gw, "/mcp", Some(token("alice", t)));
        tokio::spawn(async move { final_message(&c.call_tool("sleep", json!({"ms": ms})).await) })
    };
    let doomed_inline = inline(DOOMED, DOOMED_INLINE_MS);
    let kept_inline = inline(KEPT, KEPT_INLINE_MS);
    let all_started = eventually(Duration::from_secs(20), || {
        [
            DOOMED_TASK_MS,
            KEPT_TASK_MS,
            DOOMED_INLINE_MS,
            KEPT_INLINE_MS,
        ]
        .iter()
        .all(|ms| !call_ids(&log, *ms).is_empty())
    })
    .await;
    assert!(all_started, "four calls upstream:\n{}", gw.proc.log_text());

    // The purge, through the CLI.
    let out = std::process::Command::new(bin())
        .args(["admin", "--url", &format!("http://127.0.0.1:{port}")])
        .args(["purge", "--tenant", DOOMED])
        .env("TASKGATE_ADMIN_TOKEN", admin_token("taskgate:admin"))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    assert!(
        printed.contains(&format!("tenant {DOOMED} purged")),
        "{printed}"
    );
    let line = |what: &str| {
        printed
            .lines()
            .find(|l| l.starts_with(what))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {what} in {printed}"))
    };
    // The seeded working, input-required and keyed (working) tasks and the promoted
    // call.
    assert_eq!(line("cancelled tasks"), 4, "{printed}");
    assert_eq!(line("tasks"), 7, "{printed}");
    assert_eq!(line("tombstones"), 1, "{printed}");
    assert_eq!(line("sessions"), 1, "{printed}");
    assert_eq!(line("idempotency claims"), 2, "{printed}");

    // The inline call was cancelled; both calls were cancelled upstream.
    let answer = tokio::time::timeout(Duration::from_secs(30), doomed_inline)
        .await
        .expect("the inline call ended")
        .unwrap();
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("purging"), "{answer}");
    let both = eventually(Duration::from_secs(20), || {
        cancelled_upstream(&log, DOOMED_TASK_MS) && cancelled_upstream(&log, DOOMED_INLINE_MS)
    })
    .await;
    assert!(
        both,
        "notifications/cancelled for both calls:\n{}",
        gw.proc.log_text()
    );
    assert!(
        !cancelled_upstream(&log, KEPT_TASK_MS),
        "the other tenant's call runs on"
    );

    // (a) Every id of the purged tenant answers as an id never issued.
    for method in ["tasks/get", "tasks/cancel"] {
        let never = task_answer(&doomed, method, &new_task_id()).await;
        assert_eq!(never.1["error"]["message"], "task not found", "{never:?}");
        for id in &doomed_ids {
            assert_eq!(
                task_answer(&doomed, method, id).await,
                never,
                "{method} {id}"
            );
        }
    }
    let tenants = admin_get(port, "/tenants").await;
    assert!(!tenants.to_string().contains(DOOMED), "{tenants}");
    let listed = admin_get(port, &format!("/tasks?tenant={DOOMED}")).await;
    assert_eq!(listed["tasks"], json!([]), "{listed}");

    // (b) The other tenant has everything: its records, its tombstone, its calls.
    let (_, v) = task_answer(&kept, "tasks/get", kept_seed.id("completed")).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    let (_, v) = task_answer(&kept, "tasks/get", kept_seed.id("expired")).await;
    assert_eq!(v["error"]["message"], "task expired", "{v}");
    let (_, v) = task_answer(&kept, "tasks/get", &kept_task).await;
    assert_eq!(v["result"]["status"], "working", "{v}");
    let kept_answer = tokio::time::timeout(Duration::from_secs(30), kept_inline)
        .await
        .expect("the other tenant's inline call ended")
        .unwrap();
    assert!(kept_answer["result"].is_object(), "{kept_answer}");
    let kept_tenant = &tenants["tenants"][0];
    assert_eq!(kept_tenant["tenant"], KEPT, "{tenants}");

    // (d) The audit lines: who, which tenant, counts; never a task's contents.
    let logs = gw.proc.log_text();
    let audit: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("tenant purge"))
        .collect();
    assert!(
        audit.iter().any(|l| l.contains("tenant purge started")
            && l.contains("ops/ops-jane")
            && l.contains(DOOMED)),
        "{audit:?}"
    );
    assert!(
        audit.iter().any(|l| l.contains("tenant purge finished")
            && l.contains("ops/ops-jane")
            && l.contains(DOOMED)
            && l.contains("tombstones=1")),
        "{audit:?}"
    );
    assert!(!audit.iter().any(|l| l.contains("SECRET")), "{audit:?}");

    // (c) A raw scan of the stopped gateway's store: nothing of the tenant.
    let Gateway { mut proc, dir, .. } = gw;
    proc.kill9();
    drop(proc);
    let dump = match b {
        StoreBackend::Sled => sled_dump(dir.path()),
        StoreBackend::Postgres => pg_dump(dir.path()).await,
    };
    let mut needles = vec![DOOMED.to_string()];
    needles.extend(doomed_seed.all());
    needles.push(doomed_task);
    let found = holding(&dump, &needles);
    assert!(found.is_empty(), "left of the purged tenant: {found:?}");
    // The scan reads what it should: the other tenant is all there.
    let mut theirs = vec![KEPT.to_string(), kept_task];
    theirs.extend(kept_seed.all());
    for n in &theirs {
        assert!(
            !holding(&dump, std::slice::from_ref(n)).is_empty(),
            "{n} not found"
        );
    }
}

per_backend!(a_purge_leaves_nothing_of_the_tenant);
