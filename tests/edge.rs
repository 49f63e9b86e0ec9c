//! `taskgate edge` in front of three replicas on PostgreSQL (docs/design.md §21,
//! README "Running several replicas behind the edge"): real binaries, a client that
//! talks only to the edge. Every poll of one task reaches one replica; other calls
//! spread; a replica killed with SIGKILL leaves the ring within a bound over the
//! health interval, its tasks keep resolving elsewhere and the others' do not move.
#![cfg(feature = "edge")]

mod common;
mod replicas_support;
mod tasks_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use replicas_support::*;
use serde_json::{Value, json};
use tasks_support::*;

/// The edge's `/livez` probe interval in these tests.
const HEALTH_MS: u64 = 200;
/// A dead replica is out of the ring within this (many health intervals: the
/// machine is shared and slow).
const EJECT_BOUND: Duration = Duration::from_secs(10);

struct Edge {
    proc: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Edge {
    async fn start(rs: &Replicas) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let replicas: Vec<String> = rs
            .gws
            .iter()
            .map(|g| format!("\"http://{}\"", g.addr))
            .collect();
        let text = format!(
            "[edge]\nlisten = \"127.0.0.1:{port}\"\nreplicas = [{}]\nhealth_interval_ms = {HEALTH_MS}\n\
             grace_period_s = 0\npid_file = {}\nupgrade_sock = {}\n",
            replicas.join(", "),
            toml_string(&dir.path().join("edge.pid").display().to_string()),
            toml_string(&dir.path().join("edge.sock").display().to_string()),
        );
        let config_path = dir.path().join("edge.toml");
        std::fs::write(&config_path, text).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("edge")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .env("TASKGATE_LOG", "info");
        let proc = Proc::spawn(cmd);
        let edge = Self {
            proc,
            port,
            _dir: dir,
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(r) = raw(&edge.url("/healthz"), "GET", &[], Bytes::new()).await
                && r.status == 200
            {
                return edge;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("edge did not start:\n{}", edge.proc.log_text());
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn client(&self) -> Client2026 {
        Client2026 {
            url: self.url("/mcp"),
            token: Some(token("alice", "acme")),
            caps: tasks_caps(),
        }
    }

    async fn healthz(&self) -> Value {
        raw(&self.url("/healthz"), "GET", &[], Bytes::new())
            .await
            .unwrap()
            .json()
    }
}

/// The replica answering one `tasks/get` of `id` through the edge.
async fn poll_replica(c: &Client2026, id: &str) -> String {
    let r = tasks_get(c, id).await;
    ok_result(&r);
    replica_of(&r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_poll_of_a_task_reaches_one_replica() {
    let rs = Replicas::start(3, "").await;
    let edge = Edge::start(&rs).await;
    let c = edge.client();

    // Create through the edge, poll 20 times: one replica answers every poll.
    let id = task_id(&create_task(&c, "sleep", json!({"ms": 60_000})).await);
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        seen.insert(poll_replica(&c, &id).await);
    }
    assert_eq!(seen.len(), 1, "polls of one task reached {seen:?}");
    assert!(seen.iter().all(|r| r.starts_with('r')), "{seen:?}");

    // Everything else spreads over the replicas (round-robin).
    let mut spread = BTreeSet::new();
    for _ in 0..6 {
        let r = c.request("tools/list", json!({})).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        spread.insert(replica_of(&r));
    }
    assert_eq!(spread.len(), 3, "tools/list reached {spread:?}");

    // Cancel through the edge: the task ends cancelled, whoever holds the call.
    let ack = ok_result(&tasks_cancel(&c, &id).await);
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let done = poll_until(&c, &id, Duration::from_secs(10), |r| {
        r["status"] == "cancelled"
    })
    .await;
    assert_eq!(done["status"], "cancelled", "{done}");

    // A listen through the edge sees a task created through the edge complete.
    let id = task_id(&create_task(&c, "sleep", json!({"ms": 1500})).await);
    let mut l = SseStream::listen(&c, json!("sub"), json!({"taskIds": [id.clone()]})).await;
    assert_eq!(l.status, 200);
    let start = Instant::now();
    let mut completed = false;
    while start.elapsed() < Duration::from_secs(30) {
        let Some(n) = l.next(Duration::from_secs(30)).await else {
            break;
        };
        if n["method"] == "notifications/tasks"
            && n["params"]["taskId"] == id.as_str()
            && n["params"]["status"] == "completed"
        {
            completed = true;
            break;
        }
    }
    assert!(
        completed,
        "the listen through the edge never saw the completion:\n{}",
        edge.proc.log_text()
    );

    // The edge's own endpoints.
    let h = edge.healthz().await;
    assert_eq!(h["replicas"]["healthy"], 3, "{h}");
    let m = raw(&edge.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains("taskgate_edge_requests_total{route=\"task\",status=\"200\"}"),
        "{text}"
    );
    assert!(text.contains("taskgate_edge_replica_healthy"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replica_leaves_the_ring_and_only_its_tasks_move() {
    let mut rs = Replicas::start(3, "").await;
    let edge = Edge::start(&rs).await;
    let c = edge.client();

    // Enough tasks that every replica answers the polls of some.
    let mut by_task: BTreeMap<String, String> = BTreeMap::new();
    for _ in 0..12 {
        let id = task_id(&create_task(&c, "sleep", json!({"ms": 120_000})).await);
        let replica = poll_replica(&c, &id).await;
        by_task.insert(id, replica);
    }
    let owners: BTreeSet<&String> = by_task.values().collect();
    assert!(owners.len() >= 2, "12 tasks hashed to {owners:?}");
    let victim = by_task.values().next().unwrap().clone();
    let index: usize = victim.trim_start_matches('r').parse().unwrap();
    rs.gws[index].proc.kill9();
    let killed = Instant::now();

    // Out of the ring within the bound.
    let mut healthy = Value::Null;
    while killed.elapsed() < EJECT_BOUND {
        healthy = edge.healthz().await;
        if healthy["replicas"]["healthy"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        healthy["replicas"]["healthy"],
        2,
        "after {:?}: {healthy}\n{}",
        killed.elapsed(),
        edge.proc.log_text()
    );
    eprintln!("replica out of the ring after {:?}", killed.elapsed());

    // Nothing goes to it any more, and no request fails.
    for _ in 0..9 {
        let r = c.request("tools/list", json!({})).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_ne!(replica_of(&r), victim);
    }
    for (id, before) in &by_task {
        let now = poll_replica(&c, id).await;
        if *before == victim {
            // Its tasks keep resolving, on a live replica.
            assert_ne!(now, victim, "{id}");
        } else {
            // Only the dead replica's keys moved.
            assert_eq!(&now, before, "{id} moved from {before} to {now}");
        }
    }
}
