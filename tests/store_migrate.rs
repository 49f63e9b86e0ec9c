//! `taskgate store migrate` (README "Moving to PostgreSQL", docs/design.md §27 "Moving
//! a sled store to PostgreSQL") against the real binary and the test cluster
//! `scripts/pg.sh` starts (`TASKGATE_TEST_PG_URL`; these tests fail, never skip,
//! without it): a sled store a real gateway wrote — every kind of task, two caught in
//! flight by a SIGKILL, an expired one, idempotent calls, a 2025-era session — moved
//! and served by a gateway on PostgreSQL; the refusals (a store a gateway holds, a
//! schema a gateway serves, a destination holding other bytes); a run killed half-way
//! resumed, and a rerun that copies nothing.

mod common;
mod legacy_support;
mod tasks_support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use legacy_support::Legacy;
use serde_json::{Value, json};
use tasks_support::*;

/// The tools of the gateways here: each becomes a task at once.
const TOOLS: &str = "[upstream.tools.sleep]\npromote_after_ms = 0\n\
    [upstream.tools.rpc_error]\npromote_after_ms = 0\n\
    [upstream.tools.elicit]\npromote_after_ms = 0\n";

/// What one run of the command printed, and how it ended.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok: {}\n--- stdout\n{}\n--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

impl Run {
    /// The columns after the kind of the report's row for `kind`.
    fn row(&self, kind: &str) -> Vec<String> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(kind).filter(|rest| rest.starts_with("  ")))
            .unwrap_or_else(|| panic!("no row {kind}:\n{self}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// `(copied, already there)` of the row for `kind`, after checking that the
    /// destination holds what the source does.
    fn copied(&self, kind: &str) -> (u64, u64) {
        let row = self.row(kind);
        let n = |i: usize| row[i].parse::<u64>().unwrap_or_else(|_| panic!("{row:?}"));
        assert_eq!(n(0), n(1), "{kind}: source and destination differ:\n{self}");
        (n(2), n(3))
    }
}

/// `taskgate store migrate` of the sled store at `from` into `schema`, with `extra`
/// arguments, run in `cwd`.
fn migrate_command(
    from: &Path,
    schema: &str,
    cwd: &Path,
    extra: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(["store", "migrate", "--from"])
        .arg(from)
        .args(["--to", &pg_url(), "--schema", schema])
        .args(extra)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn migrate(from: &Path, schema: &str, cwd: &Path, extra: &[&str]) -> Run {
    let out = migrate_command(from, schema, cwd, extra)
        .output()
        .await
        .expect("run taskgate store migrate");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A gateway config in `dir` on the sled store `dir/data` (or, with `pg`, on
/// PostgreSQL schema `pg`), with `tasks_extra` keys.
fn write_config(dir: &Path, name: &str, pg: Option<&str>, tasks_extra: &str) -> PathBuf {
    let store = match pg {
        None => String::new(),
        Some(schema) => format!(
            "{}lease_ms = 1000\nlease_renew_ms = 250\n",
            pg_store_keys(schema)
        ),
    };
    let path = dir.join(name);
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n[store]\npath = {}\n\
         sweep_interval_ms = 200\n{store}{}",
        toml_string(&dir.join("data").display().to_string()),
        stdio_body(tasks_extra, TOOLS)
    );
    write(&path, &text);
    path
}

/// Stop a gateway with SIGTERM (its store is flushed and closed) and wait for it.
async fn stop(gw: Gateway) -> tempfile::TempDir {
    let Gateway { mut proc, dir, .. } = gw;
    proc.sigterm();
    proc.wait_exit(Duration::from_secs(30)).await;
    dir
}

/// A `tools/call` with an `Idempotency-Key`.
async fn call_keyed(c: &Client2026, key: &str, args: Value) -> Value {
    let params = json!({"name": "counter", "arguments": args});
    let mut h = c.headers("tools/call", &params);
    h.push(("idempotency-key", key.to_string()));
    let body = c.body(json!(1), "tools/call", &params);
    let r = raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .unwrap();
    ok_result(&r)
}

/// The fields of a `tasks/get` result that come from the stored record.
fn stored_view(r: &Value) -> Value {
    let mut v = json!({});
    for k in [
        "taskId",
        "status",
        "statusMessage",
        "createdAt",
        "lastUpdatedAt",
        "ttlMs",
        "result",
        "error",
    ] {
        v[k] = r.get(k).cloned().unwrap_or(Value::Null);
    }
    v
}

/// One row of a query on the test cluster.
async fn pg_query(sql: &str) -> Vec<tokio_postgres::Row> {
    let c = taskgate::store::postgres::connect_url(&pg_url())
        .await
        .expect("connect to the test database");
    c.query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateways_sled_store_moves_to_postgres_and_serves_the_same_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let schema = unique_schema();

    // A task that expires into a tombstone (its idempotency claim stays with it): a
    // first gateway with a short ttl.
    let short = write_config(
        dir.path(),
        "short.toml",
        None,
        "ttl_ms = 300\nresult_retention_ms = 1",
    );
    let gw = Gateway::launch(dir, short).await;
    gw.wait_ready().await;
    let alice = tasks_client(&gw, "alice", "acme");
    let expired = task_id(&call_keyed(&alice, "gone", json!({"key": "gone"})).await);
    assert!(
        gw.proc
            .wait_log("expired tasks swept", Duration::from_secs(30))
            .await
            .is_some(),
        "{}",
        gw.proc.log_text()
    );
    let v = msg(&tasks_get(&alice, &expired).await);
    assert_eq!(v["error"]["message"], "task expired", "{v}");
    let dir = stop(gw).await;

    // Every other kind, on the same store.
    let sled_config = write_config(dir.path(), "sled.toml", None, "");
    let gw = Gateway::launch(dir, sled_config.clone()).await;
    gw.wait_ready().await;
    let alice = tasks_client(&gw, "alice", "acme");
    let bob = tasks_client(&gw, "bob", "other");
    let completed = task_id(&create_task(&alice, "sleep", json!({"ms": 10})).await);
    let failed = task_id(&create_task(&alice, "rpc_error", json!({"message": "no"})).await);
    let cancelled = task_id(&create_task(&alice, "sleep", json!({"ms": 600000})).await);
    ok_result(&tasks_cancel(&alice, &cancelled).await);
    let keyed = task_id(&call_keyed(&alice, "k1", json!({"key": "moved"})).await);
    let bobs = task_id(&create_task(&bob, "sleep", json!({"ms": 10})).await);
    let mut before = Vec::new();
    for (owner, id, status) in [
        ("alice", &completed, "completed"),
        ("alice", &failed, "failed"),
        ("alice", &cancelled, "cancelled"),
        ("alice", &keyed, "completed"),
        ("bob", &bobs, "completed"),
    ] {
        let c = if owner == "alice" { &alice } else { &bob };
        let done = poll_terminal(c, id).await;
        assert_eq!(done["status"], status, "{done}");
        before.push((owner, id.clone(), stored_view(&done)));
    }
    // Two calls in flight when the gateway dies: one working, one waiting for input.
    let working = task_id(&create_task(&alice, "sleep", json!({"ms": 600000})).await);
    let waiting = task_id(&create_task(&alice, "elicit", json!({"message": "?"})).await);
    poll_until(&alice, &waiting, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
    })
    .await;
    let mut legacy = Legacy::new(&gw, Some(token("carol", "acme")));
    legacy.initialize(json!({})).await;

    // The store is the running gateway's: refused, and nothing is written.
    let cwd = tempfile::tempdir().unwrap();
    let cfg_arg = sled_config.display().to_string();
    let held = migrate(&data, &schema, cwd.path(), &["--config", &cfg_arg]).await;
    assert!(!held.ok, "{held}");
    assert!(
        held.stderr.contains(&format!(
            "the sled store at {} is in use by a running gateway; stop it first",
            data.display()
        )),
        "{held}"
    );

    let Gateway { mut proc, dir, .. } = gw;
    proc.kill9();
    drop(proc);

    let moved = migrate(&data, &schema, cwd.path(), &["--config", &cfg_arg]).await;
    assert!(moved.ok, "{moved}");
    for id in [&working, &waiting] {
        let line = moved.stdout.lines().find(|l| l.starts_with(id.as_str()));
        assert!(
            line.is_some_and(|l| l.contains("acme") && l.contains("failed now")),
            "{id} is listed in flight:\n{moved}"
        );
    }
    assert!(moved.stdout.contains("counts: match; copied"), "{moved}");
    assert_eq!(moved.copied("tasks"), (7, 0), "{moved}");
    assert_eq!(moved.copied("tombstones"), (1, 0), "{moved}");
    assert!(
        moved.stderr.contains("tasks: 7 copied"),
        "progress: {moved}"
    );

    // The gateway on PostgreSQL, otherwise configured the same.
    let pg_config = write_config(dir.path(), "pg.toml", Some(&schema), "");
    let gw = Gateway::launch(dir, pg_config).await;
    gw.wait_ready().await;
    let alice = tasks_client(&gw, "alice", "acme");
    let bob = tasks_client(&gw, "bob", "other");
    for (owner, id, was) in &before {
        let c = if *owner == "alice" { &alice } else { &bob };
        let now = ok_result(&tasks_get(c, id).await);
        assert_eq!(&stored_view(&now), was, "{id} reads the same for its owner");
    }
    // Owners stay owners: another principal's task reads like one never issued.
    let v = msg(&tasks_get(&bob, &completed).await);
    assert_eq!(v["error"]["message"], "task not found", "{v}");
    // The calls in flight are failed with the reason, not lost.
    for id in [&working, &waiting] {
        let t = ok_result(&tasks_get(&alice, id).await);
        assert_eq!(t["status"], "failed", "{t}");
        assert_eq!(t["error"]["code"], -32603, "{t}");
        assert_eq!(
            t["error"]["message"],
            taskgate::tasks::sweeper::MOVED,
            "{t}"
        );
        assert_eq!(t["statusMessage"], taskgate::tasks::sweeper::MOVED, "{t}");
    }
    // The idempotency key still names its task; the expired task is still expired for
    // its owner only.
    let again = call_keyed(&alice, "k1", json!({"key": "moved"})).await;
    assert_eq!(task_id(&again), keyed, "{again}");
    let v = msg(&tasks_get(&alice, &expired).await);
    assert_eq!(v["error"]["message"], "task expired", "{v}");
    let v = msg(&tasks_get(&bob, &expired).await);
    assert_eq!(v["error"]["message"], "task not found", "{v}");
    // The 2025-era session goes on.
    let r = legacy
        .presenting(gw.url("/mcp"), Some(token("carol", "acme")))
        .request(json!(2), "tools/list", json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", legacy_support::text(&r));
    assert!(
        r.json()["result"]["tools"].is_array(),
        "{}",
        legacy_support::text(&r)
    );
    // The MRTR key is the sled store's, so requestStates it signed stay valid.
    let moved_key = pg_query(&format!(
        "SELECT secret FROM {schema}.store_secrets WHERE name = 'mrtr-request-state'"
    ))
    .await;
    let moved_key: Vec<u8> = moved_key.first().expect("the MRTR key was moved").get(0);

    // A gateway serves the schema: a rerun is refused.
    let cwd2 = cwd.path();
    let served = migrate(&data, &schema, cwd2, &["--config", &cfg_arg]).await;
    assert!(!served.ok, "{served}");
    assert!(
        served
            .stderr
            .contains(&format!("a gateway serves the PostgreSQL schema {schema}")),
        "{served}"
    );
    let dir = stop(gw).await;
    {
        use taskgate::store::TaskStore;
        let cfg = taskgate::config::StoreConfig {
            path: data.clone(),
            ..Default::default()
        };
        let sled = taskgate::store::sled::SledStore::open(&cfg).unwrap();
        let key = sled.secret("mrtr-request-state").await.unwrap();
        assert_eq!(moved_key, key.to_vec());
    }

    // Once its lease ran out, a rerun copies nothing and finds everything in place.
    let mut rerun = migrate(&data, &schema, cwd2, &["--config", &cfg_arg]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rerun.ok && rerun.stderr.contains("a gateway serves") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        rerun = migrate(&data, &schema, cwd2, &["--config", &cfg_arg]).await;
    }
    assert!(rerun.ok, "{rerun}");
    assert!(
        rerun
            .stdout
            .contains("copied 0 new rows (everything was already there)"),
        "{rerun}"
    );
    assert_eq!(rerun.copied("tasks"), (0, 7), "{rerun}");
    for id in [&working, &waiting] {
        let line = rerun.stdout.lines().find(|l| l.starts_with(id.as_str()));
        assert!(
            line.is_some_and(|l| l.contains("failed by an earlier run")),
            "{rerun}"
        );
    }
    drop(dir);
}

/// `n` completed tasks written with the store API into the sled store at `data`:
/// every third with an idempotency claim, every second read by its owner.
async fn seed(data: &Path, n: usize) {
    use taskgate::store::{TaskRecord, TaskStatus, TaskStore};
    let cfg = taskgate::config::StoreConfig {
        path: data.to_path_buf(),
        ..Default::default()
    };
    let store = taskgate::store::sled::SledStore::open(&cfg).unwrap();
    let mut read = Vec::new();
    for i in 0..n {
        let id = format!("tsk_seeded_{i:06}");
        let rec = TaskRecord {
            status: TaskStatus::Completed,
            result: Some(json!({"content": [{"type": "text", "text": format!("#{i}")}]})),
            ..fixtures::task(&id, "acme", "alice", 3_600_000)
        };
        let route_id = format!("rt_{i}");
        let route = fixtures::route(&route_id, &id, "acme", "alice");
        let key = format!("key-{i}");
        let key = (i % 3 == 0).then_some(key.as_bytes());
        store.create(&rec, &route, key).await.unwrap();
        store.remove_route(&route_id).await.unwrap();
        if i % 2 == 0 {
            read.push(id);
        }
    }
    store.mark_seen(&read).await.unwrap();
    store.flush().await.unwrap();
}

async fn count_tasks(schema: &str) -> u64 {
    let Ok(c) = taskgate::store::postgres::connect_url(&pg_url()).await else {
        return 0;
    };
    // The schema does not exist until the run has migrated it.
    match c
        .query_one(&format!("SELECT count(*) FROM {schema}.task_routes"), &[])
        .await
    {
        Ok(row) => u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_resumes_and_a_rerun_copies_nothing() {
    const N: u64 = 1500;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let schema = unique_schema();
    // Outside the repository: no config/taskgate.toml to pick up.
    let cwd = dir.path();

    let none = migrate(&dir.path().join("nothing"), &schema, cwd, &[]).await;
    assert!(!none.ok, "{none}");
    assert!(none.stderr.contains("there is no sled store at"), "{none}");

    seed(&data, N as usize).await;

    // Five tasks a batch: many statements, so the kill lands half-way.
    let mut child = migrate_command(&data, &schema, cwd, &["--batch-size", "5"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count_tasks(&schema).await == 0 {
        assert!(Instant::now() < deadline, "the run wrote nothing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let at_kill = count_tasks(&schema).await;
    assert!(
        (1..N).contains(&at_kill),
        "killed half-way: {at_kill} of {N} tasks written"
    );

    let resumed = migrate(&data, &schema, cwd, &[]).await;
    assert!(resumed.ok, "{resumed}");
    let (copied, already) = resumed.copied("tasks");
    assert_eq!(copied + already, N, "{resumed}");
    assert!(copied > 0 && already >= at_kill, "{resumed}");
    let (claims, claims_before) = resumed.copied("idempotency claims");
    let rows = pg_query(&format!(
        "SELECT (SELECT count(*) FROM {schema}.task_routes),
                (SELECT count(DISTINCT record) FROM {schema}.task_routes),
                (SELECT count(*) FROM {schema}.seen_marks),
                (SELECT count(*) FROM {schema}.idempotency)"
    ))
    .await;
    let n = |i: usize| u64::try_from(rows[0].get::<_, i64>(i)).unwrap();
    assert_eq!((n(0), n(1)), (N, N), "every task once");
    assert_eq!(n(2), N / 2, "read marks");
    assert_eq!(n(3), N / 3, "idempotency claims");
    assert_eq!(claims + claims_before, N / 3, "{resumed}");

    let again = migrate(&data, &schema, cwd, &[]).await;
    assert!(again.ok, "{again}");
    assert!(
        again
            .stdout
            .contains("copied 0 new rows (everything was already there)"),
        "{again}"
    );
    assert_eq!(again.copied("tasks"), (0, N), "{again}");

    // A destination that holds other bytes for a task is refused.
    pg_query(&format!(
        "UPDATE {schema}.task_routes SET record = record || ' '::bytea
         WHERE task_id = 'tsk_seeded_000042' RETURNING 1"
    ))
    .await;
    let refused = migrate(&data, &schema, cwd, &[]).await;
    assert!(!refused.ok, "{refused}");
    assert!(
        refused
            .stderr
            .contains("tasks that differ from the sled store's (the first: tsk_seeded_000042)"),
        "{refused}"
    );
}
