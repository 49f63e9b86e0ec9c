//! The gateway on the PostgreSQL store (README "Store backends"), against the test
//! cluster `scripts/pg.sh` starts (`TASKGATE_TEST_PG_URL`; these tests fail, never
//! skip, without it): two gateways on one schema read each other's tasks, a database
//! outage hands out no task id and heals by itself, and a `kill -9` in the middle of
//! creations leaves every returned handle resolvable.

mod common;
mod tasks_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use serde_json::json;
use tasks_support::*;
use tokio::net::{TcpListener, TcpStream};

/// A gateway config on PostgreSQL `schema`, at `url`.
fn pg_config(dir: &std::path::Path, url: &str, schema: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join("taskgate.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n[store]\npath = \"{}\"\nbackend = \"postgres\"\nurl = \"{url}\"\nschema = \"{schema}\"\npool_size = 4\n{body}",
        dir.join("data").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn start_pg(url: &str, schema: &str, body: &str) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let path = pg_config(dir.path(), url, schema, body);
    let gw = Gateway::launch(dir, path).await;
    gw.wait_ready().await;
    gw
}

fn sleep_tools() -> String {
    stdio_body("", "[upstream.tools.sleep]\npromote_after_ms = 0\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_second_gateway_reads_the_first_ones_tasks() {
    let url = pg_url();
    let schema = unique_schema();
    let a = start_pg(&url, &schema, &sleep_tools()).await;
    let ca = tasks_client(&a, "alice", "acme");
    let id = task_id(&create_task(&ca, "sleep", json!({"ms": 20})).await);
    let done = poll_terminal(&ca, &id).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Another gateway on the same schema, while the first still runs.
    let b = start_pg(&url, &schema, &sleep_tools()).await;
    let cb = tasks_client(&b, "alice", "acme");
    let seen = ok_result(&tasks_get(&cb, &id).await);
    assert_eq!(seen["status"], "completed", "{seen}");
    assert_eq!(seen["result"], done["result"], "{seen}");
    // Ownership holds across gateways too.
    let bob = tasks_client(&b, "bob", "other");
    let v = msg(&tasks_get(&bob, &id).await);
    assert_eq!(v["error"]["code"], -32602, "{v}");
}

/// A TCP relay in front of PostgreSQL that can be cut: while down it drops every
/// relayed connection and closes new ones at once (what a restarting server does).
struct Relay {
    port: u16,
    up: Arc<AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
}

impl Relay {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(tokio::sync::Notify::new());
        let (up2, cut2) = (up.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let cut = cut2.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.notified() => {}
                    }
                });
            }
        });
        Self { port, up, cut }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

async fn readyz_status(gw: &Gateway) -> u16 {
    raw(&gw.url("/readyz"), "GET", &[], bytes::Bytes::new())
        .await
        .map(|r| r.status)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_issues_no_task_id_and_heals_by_itself() {
    let url = pg_url();
    let host_port = url
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("host:port in the test URL")
        .to_string();
    let (user, rest) = url
        .trim_start_matches("postgres://")
        .split_once('@')
        .expect("user@ in the test URL");
    // The database and the query string (sslmode, sslrootcert) stay: the relay carries
    // the TLS session, and the test cluster's certificate names 127.0.0.1.
    let db_and_query = rest.split_once('/').map(|(_, d)| d).unwrap_or("postgres");
    let relay = Relay::start(host_port).await;
    let relayed = format!("postgres://{user}@127.0.0.1:{}/{db_and_query}", relay.port);
    let gw = start_pg(&relayed, &unique_schema(), &sleep_tools()).await;
    let c = tasks_client(&gw, "alice", "acme");
    let before = task_id(&create_task(&c, "sleep", json!({"ms": 10})).await);

    relay.down();
    let r = c.call_tool("sleep", json!({"ms": 10})).await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert!(
        v.get("result").is_none(),
        "no task id while the store is down: {v}"
    );
    let mut unready = false;
    for _ in 0..100 {
        if readyz_status(&gw).await == 503 {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(unready, "/readyz turns 503 while the store is unreachable");
    // A poll is retry-safe: a store that does not answer is 503 + Retry-After, not the
    // request's outcome.
    let r = c
        .request("tasks/get", json!({"taskId": before.as_str()}))
        .await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    assert_eq!(r.json()["error"]["code"], -32603);

    relay.up();
    let mut ready = false;
    for _ in 0..150 {
        if readyz_status(&gw).await == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready,
        "/readyz back to 200 by itself:\n{}",
        gw.proc.log_text()
    );
    let after = task_id(&create_task(&c, "sleep", json!({"ms": 10})).await);
    for id in [before, after] {
        let t = poll_terminal(&c, &id).await;
        assert_eq!(t["status"], "completed", "{t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill9_mid_create_leaves_every_returned_handle_resolvable() {
    let url = pg_url();
    let schema = unique_schema();
    let dir = tempfile::tempdir().unwrap();
    let path = pg_config(dir.path(), &url, &schema, &sleep_tools());
    let gw = Gateway::launch(dir, path).await;
    gw.wait_ready().await;

    // Creations keep going until the gateway dies under them.
    let returned = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut loops = Vec::new();
    for _ in 0..8 {
        let c = tasks_client(&gw, "alice", "acme");
        let returned = returned.clone();
        loops.push(tokio::spawn(async move {
            loop {
                let h = c.headers("tools/call", &json!({"name": "sleep"}));
                let body = c.body(
                    json!(1),
                    "tools/call",
                    &json!({"name": "sleep", "arguments": {"ms": 5000}}),
                );
                let Ok(r) = raw(&c.url, "POST", &h, bytes::Bytes::from(body.to_string())).await
                else {
                    return;
                };
                if let Some(id) = r.json()["result"]["taskId"].as_str() {
                    returned.lock().unwrap().push(id.to_string());
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let Gateway {
        mut proc,
        dir,
        config_path,
        ..
    } = gw;
    proc.kill9();
    drop(proc);
    for l in loops {
        let _ = l.await;
    }
    let ids = returned.lock().unwrap().clone();
    assert!(ids.len() >= 4, "creations before the kill: {}", ids.len());

    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let c = tasks_client(&gw, "alice", "acme");
    let mut restarted = 0;
    for id in &ids {
        // Every handle resolves: failed by the restart, or (calls beyond the
        // upstream's queue) failed before it.
        let t = poll_terminal(&c, id).await;
        assert_eq!(t["status"], "failed", "{id}: {t}");
        let m = t["error"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("gateway restarted") || m.contains("queue is full"),
            "{id}: {t}"
        );
        restarted += usize::from(m.contains("gateway restarted"));
    }
    assert!(restarted > 0, "some calls were in flight at the kill");
}

/// `psql` on the test cluster: the output of `sql`, unaligned and without headers.
fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(url)
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql (Debian package postgresql-client)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// docs/design.md §27 "Mixed versions": a gateway more than one release behind the
/// release that migrated its schema refuses to start, naming the versions and what to
/// do; the schema is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_gateway_two_releases_behind_refuses_to_start() {
    let url = pg_url();
    let schema = unique_schema();
    drop(start_pg(&url, &schema, &sleep_tools()).await);
    let migrations = format!("{schema}.schema_migrations");
    let latest: i32 = psql(&url, &format!("SELECT max(version) FROM {migrations}"))
        .parse()
        .unwrap();
    // The next release (served beside this one) and the one after it, which needs
    // gateways that know the next release's version.
    let (next, after) = (latest + 1, latest + 2);
    psql(
        &url,
        &format!(
            "INSERT INTO {migrations} (version, name, min_known)
             VALUES ({next}, 'next', {latest}), ({after}, 'after_next', {next})"
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = pg_config(dir.path(), &url, &schema, &sleep_tools());
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--config").arg(&path).current_dir(dir.path());
    let mut p = Proc::spawn(cmd);
    let status = p.wait_exit(Duration::from_secs(30)).await;
    // The stderr reader may still be collecting the last lines.
    let want = format!(
        "is at version {after}, which needs a taskgate that knows schema version {next} or later; this one knows {latest}"
    );
    let line = p.wait_log(&want, Duration::from_secs(5)).await;
    assert!(!status.success(), "{}", p.log_text());
    assert!(
        line.is_some_and(|l| l.contains("more than one release older") && l.contains("Upgrading")),
        "{}",
        p.log_text()
    );
    assert_eq!(
        psql(&url, &format!("SELECT count(*) FROM {migrations}")),
        after.to_string(),
        "the refusal changed the schema's record"
    );
}
