//! `taskgate edge` in front of three replicas on PostgreSQL (docs/design.md §21,
//! README "Running several replicas behind the edge"): real binaries, a client that
//! talks only to the edge. Every poll of one task reaches one replica; other calls
//! spread; a replica killed with SIGKILL leaves the ring within a bound over the
//! health interval, its tasks keep resolving elsewhere and the others' do not move.
//! A 2025-era session's requests all reach one replica, and after that replica is
//! killed the session goes on elsewhere with its subscriptions (§22).
#![cfg(feature = "edge")]

mod common;
mod legacy_support;
mod replicas_support;
mod tasks_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use legacy_support::*;
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
    config_path: std::path::PathBuf,
    dir: tempfile::TempDir,
    /// `edge.tls_cert` is set: [`Edge::url`] is `https://localhost:PORT`.
    https: bool,
}

impl Edge {
    async fn start(rs: &Replicas) -> Self {
        Self::start_with(rs, HEALTH_MS, 0).await
    }

    /// With `/livez` probed every `health_ms` and a grace period of `grace_s`.
    async fn start_with(rs: &Replicas, health_ms: u64, grace_s: u64) -> Self {
        Self::start_configured(rs, health_ms, grace_s, "").await
    }

    /// As [`Edge::start_with`], with `extra` lines appended to the `[edge]` table.
    async fn start_configured(rs: &Replicas, health_ms: u64, grace_s: u64, extra: &str) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), rs, health_ms, grace_s, extra).await
    }

    /// In `dir`, with `https://` replicas when theirs are TLS listeners and a TLS
    /// listener when `extra` sets `tls_cert`.
    async fn start_in(
        dir: tempfile::TempDir,
        rs: &Replicas,
        health_ms: u64,
        grace_s: u64,
        extra: &str,
    ) -> Self {
        let port = free_port();
        let replicas: Vec<String> = rs
            .gws
            .iter()
            .map(|g| format!("\"{}\"", g.url("")))
            .collect();
        let text = format!(
            "[edge]\nlisten = \"127.0.0.1:{port}\"\nreplicas = [{}]\nhealth_interval_ms = {health_ms}\n\
             grace_period_s = {grace_s}\npid_file = {}\nupgrade_sock = {}\n{extra}",
            replicas.join(", "),
            toml_string(&dir.path().join("edge.pid").display().to_string()),
            toml_string(&dir.path().join("edge.sock").display().to_string()),
        );
        let config_path = dir.path().join("edge.toml");
        std::fs::write(&config_path, text).unwrap();
        let proc = Proc::spawn(edge_command(&config_path, dir.path(), false));
        let edge = Self {
            proc,
            port,
            config_path,
            dir,
            https: extra.contains("tls_cert"),
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(r) = raw(&edge.url("/healthz"), "GET", &[], Bytes::new()).await
                && r.status == 200
            {
                edge.wait_listening_log().await;
                return edge;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("edge did not start:\n{}", edge.proc.log_text());
    }

    /// The edge answers, so its "listening" line (written once the listener accepts)
    /// must follow within a generous bound.
    async fn wait_listening_log(&self) {
        let scheme = if self.https { "https" } else { "http" };
        let want = format!(
            "taskgate edge listening on {scheme}://127.0.0.1:{}",
            self.port
        );
        let start = Instant::now();
        while !self.proc.log_text().contains(&want) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no {want:?} line:\n{}",
                self.proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        if self.https {
            format!("https://localhost:{}{path}", self.port)
        } else {
            format!("http://127.0.0.1:{}{path}", self.port)
        }
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

fn edge_command(config: &std::path::Path, dir: &std::path::Path, upgrade: bool) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("edge");
    if upgrade {
        cmd.arg("--upgrade");
    }
    cmd.arg("--config")
        .arg(config)
        .current_dir(dir)
        .env("TASKGATE_LOG", "info");
    cmd
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
    let completed = l
        .task_reached(&id, "completed", Duration::from_secs(30))
        .await
        .is_some();
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

/// Of `n` polls of `id` sent back to back, how many were answered (the others got
/// 429 from the poll limiter).
async fn polls_answered(clients: &[Client2026], id: &str, n: usize) -> usize {
    let mut answered = 0;
    for i in 0..n {
        let r = clients[i % clients.len()]
            .request("tasks/get", json!({"taskId": id}))
            .await;
        match r.status {
            200 => answered += 1,
            429 => {}
            s => panic!("poll {i}: {s} {}", String::from_utf8_lossy(&r.body)),
        }
    }
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_poller_through_the_edge_is_throttled_as_on_one_replica() {
    // A strict poll limiter: a burst of 3, then one poll per 2 s.
    let rs = Replicas::start_edited(3, "", |text| {
        text.replace("poll_interval_ms = 50", "poll_interval_ms = 2000")
            .replace("poll_burst = 100000", "poll_burst = 3")
    })
    .await;
    let edge = Edge::start(&rs).await;
    let c = edge.client();
    const POLLS: usize = 12;

    let id = task_id(&create_task(&c, "sleep", json!({"ms": 60_000})).await);
    let through_edge = polls_answered(std::slice::from_ref(&c), &id, POLLS).await;
    let direct_client = rs.client(0);
    let id = task_id(&create_task(&direct_client, "sleep", json!({"ms": 60_000})).await);
    let direct = polls_answered(std::slice::from_ref(&direct_client), &id, POLLS).await;
    // Round-robin over the replicas without the edge: each replica's own budget.
    let all: Vec<Client2026> = (0..3).map(|i| rs.client(i)).collect();
    let id = task_id(&create_task(&all[0], "sleep", json!({"ms": 60_000})).await);
    let spread = polls_answered(&all, &id, POLLS).await;
    eprintln!(
        "polls answered of {POLLS}: edge {through_edge}, one replica {direct}, round-robin {spread}"
    );
    // The burst, plus at most one refill on a slow machine.
    assert!((3..=4).contains(&direct), "direct: {direct}");
    assert!(
        through_edge.abs_diff(direct) <= 1 && through_edge <= 4,
        "through the edge {through_edge}, direct {direct}"
    );
    assert!(spread >= 7, "round-robin without the edge: {spread}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnecting_at_the_edge_cancels_the_inline_call() {
    use tokio::io::AsyncWriteExt;

    let rs = Replicas::start(3, "").await;
    let edge = Edge::start(&rs).await;
    let c = edge.client();
    let before = task_demo_stats(&c).await["cancelled"].as_u64().unwrap_or(0);

    // A client without the tasks extension: the call is held inline.
    let plain = Client2026 {
        url: edge.url("/mcp"),
        token: Some(token("alice", "acme")),
        caps: json!({}),
    };
    let params = json!({"name": "sleep", "arguments": {"ms": 10_000}});
    let body = plain.body(json!(1), "tools/call", &params).to_string();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-length: {}\r\n",
        edge.port,
        body.len()
    );
    for (k, v) in plain.headers("tools/call", &params) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", edge.port))
        .await
        .unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(conn);

    let start = Instant::now();
    loop {
        let stats = task_demo_stats(&c).await;
        if stats["cancelled"].as_u64().unwrap_or(0) > before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(9),
            "the upstream never saw the cancel (stats {stats}):\n{}",
            edge.proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "upstream cancelled {:?} after the disconnect",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_listener_over_without_refusing_requests() {
    let rs = Replicas::start(2, "").await;
    // The old process keeps serving what it accepted for the grace period.
    let mut old = Edge::start_with(&rs, HEALTH_MS, 2).await;
    let c = old.client();
    // The new process waits on `upgrade_sock` for the old one's listener.
    let new = Proc::spawn(edge_command(&old.config_path, old.dir.path(), true));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(old.proc.child.id() as i32, libc::SIGQUIT);
    }
    let start = Instant::now();
    let mut served = 0;
    // Requests whose connection closed before any answer. pingora's old process,
    // when its listener stops, drops the connections still waiting for a request
    // (README "Running several replicas behind the edge"): a connection it accepted
    // in that instant, before the request arrived, is closed unanswered and nothing
    // was forwarded. This client has one request open at a time, so at most one.
    let mut dropped = Vec::new();
    let mut old_exited = None;
    let (params, body) = (json!({}), c.body(json!(1), "tools/list", &json!({})));
    let headers = c.headers("tools/list", &params);
    while start.elapsed() < Duration::from_secs(30) {
        let r = match raw(&c.url, "POST", &headers, Bytes::from(body.to_string())).await {
            Ok(r) => r,
            Err(e) => {
                dropped.push(format!("request {served}: {e}"));
                continue;
            }
        };
        assert_eq!(
            r.status,
            200,
            "request {served} during the upgrade: {}\nold:\n{}\nnew:\n{}",
            String::from_utf8_lossy(&r.body),
            old.proc.log_text(),
            new.log_text()
        );
        served += 1;
        if old_exited.is_none() && old.proc.child.try_wait().unwrap().is_some() {
            old_exited = Some(Instant::now());
        }
        // Keep going a while after the old process is gone: the new one serves.
        if old_exited.is_some_and(|t| t.elapsed() > Duration::from_secs(1)) {
            break;
        }
    }
    assert!(
        old_exited.is_some(),
        "the old edge never exited:\nold:\n{}\nnew:\n{}",
        old.proc.log_text(),
        new.log_text()
    );
    assert!(
        dropped.len() <= 1,
        "connections closed unanswered across the upgrade: {dropped:?}\nold:\n{}\nnew:\n{}",
        old.proc.log_text(),
        new.log_text()
    );
    let h = old.healthz().await;
    assert_eq!(h["status"], "ok", "{h}");
    eprintln!(
        "{served} requests served across the upgrade, {} closed unanswered",
        dropped.len()
    );
    // Stop the new edge with the old one's `Proc` so it is killed on drop.
    old.proc = new;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_failure_is_retried_elsewhere_and_ejects_the_replica() {
    let mut rs = Replicas::start(3, "").await;
    // Probes far apart: only the passive ejection can notice the dead replica.
    let edge = Edge::start_with(&rs, 600_000, 0).await;
    let c = edge.client();
    rs.gws[1].proc.kill9();
    for i in 0..9 {
        let r = c.request("tools/list", json!({})).await;
        assert_eq!(
            r.status,
            200,
            "request {i}: {}\n{}",
            String::from_utf8_lossy(&r.body),
            edge.proc.log_text()
        );
        assert_ne!(replica_of(&r), "r1", "request {i}");
    }
    let m = raw(&edge.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&m.body);
    let victim = format!("http://{}", rs.gws[1].addr);
    assert!(
        text.contains(&format!(
            "taskgate_edge_retries_total{{replica=\"{victim}\"}}"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "taskgate_edge_ejections_total{{replica=\"{victim}\"}}"
        )),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_writes_json_lines_with_log_format_json() {
    let rs = Replicas::start(1, "").await;
    let edge = Edge::start_configured(&rs, HEALTH_MS, 0, "log_format = \"json\"\n").await;
    let r = edge.client().request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The request line is written after the response: poll for it.
    let start = Instant::now();
    let line = loop {
        let text = edge.proc.log_text();
        if let Some(v) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["fields"]["message"] == "request" && v["fields"]["path"] == "/mcp")
        {
            break v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no JSON request line:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(line["target"], "taskgate::edge", "{line}");
    assert_eq!(line["fields"]["method"], "tools/list", "{line}");
    assert_eq!(line["fields"]["route"], "other", "{line}");
    // The edge names a replica by its `edge.replicas` entry.
    let replica = format!("http://{}", rs.gws[0].addr);
    assert_eq!(line["fields"]["replica"], replica.as_str(), "{line}");
    assert_eq!(line["fields"]["status"], 200, "{line}");
    // Every line is JSON, pingora's own included.
    let text = edge.proc.log_text();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        assert!(serde_json::from_str::<Value>(l).is_ok(), "not JSON: {l}");
    }
}

// ---------------------------------------------------------------------------------
// 2025-era sessions through the edge (docs/design.md §22 "Clients of the 2025 era").

/// The replica that answered `r`, which must be 200.
fn served_by(r: &Resp, what: &str) -> String {
    assert_eq!(r.status, 200, "{what}: {}", text(r));
    replica_of(r)
}

/// The replica index of a `Taskgate-Replica` value (`r1` → 1).
fn replica_index(name: &str) -> usize {
    name.trim_start_matches('r').parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_legacy_session_reaches_one_replica() {
    let rs = Replicas::start(3, "").await;
    let edge = Edge::start(&rs).await;
    let mut holders = BTreeSet::new();
    for s in 0..9 {
        let mut c = Legacy::at(edge.url("/mcp"), Some(token("alice", "acme")));
        c.initialize(json!({})).await;
        // Its GET stream, held open while its POSTs go through.
        let get = c.get_stream().await;
        assert_eq!(get.status, 200, "session {s}");
        let mut seen = BTreeSet::new();
        seen.insert(get.header("taskgate-replica").unwrap_or_default());
        for i in 0..3 {
            let ping = c.request(json!(i), "ping", json!({})).await;
            seen.insert(served_by(&ping, "ping"));
            let list = c.request(json!(i), "tools/list", json!({})).await;
            seen.insert(served_by(&list, "tools/list"));
            let echo = c
                .request(
                    json!(i),
                    "tools/call",
                    json!({"name": "echo", "arguments": {"text": "x"}}),
                )
                .await;
            seen.insert(served_by(&echo, "tools/call"));
        }
        assert_eq!(seen.len(), 1, "session {s} reached {seen:?}");
        holders.extend(seen);
    }
    // Different sessions spread over the ring (9 sessions all on one of 3 replicas
    // would happen by chance once in ~2 000 runs).
    assert!(holders.len() >= 2, "9 sessions all held by {holders:?}");
    assert!(holders.iter().all(|r| r.starts_with('r')), "{holders:?}");
    let m = raw(&edge.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&m.body);
    assert!(
        metrics.contains("taskgate_edge_requests_total{route=\"session\",status=\"200\"}"),
        "{metrics}"
    );
}

/// The first message on `get` within `limit` that is `method`, skipping others.
async fn next_method(get: &mut Events, method: &str, limit: Duration) -> Option<Value> {
    let deadline = Instant::now() + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match get.next(left).await {
            Some(m) if m["method"] == method => return Some(m),
            Some(_) => {}
            None if get.ended() => return None,
            None => {}
        }
    }
    None
}

/// The final answer on a held call's stream, skipping notifications and keep-alives.
async fn final_answer(ev: &mut Events, limit: Duration) -> Option<Value> {
    let deadline = Instant::now() + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match ev.next(left).await {
            Some(m) if m.get("id").is_some() && m.get("method").is_none() => return Some(m),
            Some(_) => {}
            None if ev.ended() => return None,
            None => {}
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_session_survives_the_loss_of_its_replica() {
    let mut rs = Replicas::start(2, "").await;
    let edge = Edge::start(&rs).await;
    let mut c = Legacy::at(edge.url("/mcp"), Some(token("alice", "acme")));
    c.initialize(json!({})).await;
    let sub = c
        .request(
            json!(1),
            "resources/subscribe",
            json!({"uri": "demo://counter"}),
        )
        .await;
    let holder = served_by(&sub, "resources/subscribe");
    assert_eq!(sub.json()["result"], json!({}), "{}", text(&sub));
    let mut get = c.get_stream().await;
    assert_eq!(get.status, 200);
    assert_eq!(get.header("taskgate-replica"), Some(holder.clone()));
    let updated = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
        "params": {"uri": "demo://counter"}});

    // Before the loss: an update reaches the stream on the holder.
    let r = c
        .request(
            json!(2),
            "tools/call",
            json!({"name": "counter", "arguments": {}}),
        )
        .await;
    assert_eq!(served_by(&r, "counter"), holder);
    let n = next_method(
        &mut get,
        "notifications/resources/updated",
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(n, Some(updated.clone()), "{}", rs.gws[0].proc.log_text());

    // A call in flight on the holder when it dies.
    let slow = json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 6000}}});
    let mut inflight = c.open("POST", slow.clone()).await;
    assert_eq!(inflight.status, 200);
    assert_eq!(inflight.header("taskgate-replica"), Some(holder.clone()));
    // Let the call reach the upstream.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let victim = replica_index(&holder);
    rs.gws[victim].proc.kill9();
    let killed = Instant::now();

    // Both streams end; the call was never answered.
    let (ended, seen) = inflight.drain(Duration::from_secs(30)).await;
    assert!(ended, "the in-flight call's stream did not end");
    assert!(
        seen.iter().all(|m| m.get("result").is_none()),
        "an answer from a killed replica: {seen:?}"
    );
    let (ended, _) = get.drain(Duration::from_secs(30)).await;
    assert!(ended, "the GET stream did not end");
    eprintln!("streams ended {:?} after the kill", killed.elapsed());

    // The client reconnects at once, as a client does (not waiting for the edge's
    // probes to eject the dead replica): its GET stream is now on the survivor, which
    // re-subscribes what the session record lists.
    let mut get = c.get_stream().await;
    assert_eq!(get.status, 200, "{}", edge.proc.log_text());
    let survivor = get.header("taskgate-replica").unwrap_or_default();
    assert_ne!(survivor, holder);
    // And it retries the call that was lost: the survivor holds it.
    let mut retry = c.open("POST", slow).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.header("taskgate-replica"), Some(survivor.clone()));

    // An update after the loss reaches the new stream.
    let r = c
        .request(
            json!(3),
            "tools/call",
            json!({"name": "counter", "arguments": {}}),
        )
        .await;
    assert_eq!(served_by(&r, "counter"), survivor);
    let n = next_method(
        &mut get,
        "notifications/resources/updated",
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(
        n,
        Some(updated),
        "no update on the new stream:\n{}",
        rs.gws[replica_index(&survivor)].proc.log_text()
    );
    eprintln!(
        "update on the new stream {:?} after the kill",
        killed.elapsed()
    );
    let answer = final_answer(&mut retry, Duration::from_secs(30)).await;
    let answer =
        answer.unwrap_or_else(|| panic!("no answer to the retry:\n{}", edge.proc.log_text()));
    assert_eq!(answer["id"], "slow", "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "slept 6000 ms",
        "{answer}"
    );

    // And the dead replica has left the ring.
    let out = eventually_async(EJECT_BOUND, || async {
        edge.healthz().await["replicas"]["healthy"] == 1
    })
    .await;
    assert!(out, "{}\n{}", edge.healthz().await, edge.proc.log_text());
}

// ---------------------------------------------------------------------------------
// TLS: the edge terminates it and speaks it to its replicas (README "TLS", "The edge").

/// `tls_cert`/`tls_key` lines for `files`.
fn tls_keys(files: &common::tls::CertFiles) -> String {
    format!(
        "tls_cert = {}\ntls_key = {}\n",
        toml_string(&files.cert.display().to_string()),
        toml_string(&files.key.display().to_string())
    )
}

/// `GET url` trusting only `ca`, offering `alpn`: the status, the HTTP version, or
/// the error chain.
async fn tls_get(
    ca: &std::path::Path,
    alpn: &[&[u8]],
    url: &str,
) -> Result<(Resp, http::Version), String> {
    let config = common::tls::client_config(ca, None, alpn);
    common::tls::request(config, url, "GET", &[], Bytes::new()).await
}

/// curl, as an operator would check the edge: `--cacert` and nothing else.
fn curl(ca: &std::path::Path, url: &str, http2: bool) -> std::process::Output {
    Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "10", "--cacert"])
        .arg(ca)
        .arg(if http2 { "--http2" } else { "--http1.1" })
        .args(["-o", "/dev/null", "-w", "%{http_version}"])
        .arg(url)
        .output()
        .expect("curl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_terminates_tls_and_verifies_its_https_replicas() {
    use common::tls::TestCa;
    let dir = tempfile::tempdir().unwrap();
    let replicas_ca = TestCa::new(dir.path(), "replicas");
    let replica_cert = replicas_ca.server("replica");
    let front_ca = TestCa::new(dir.path(), "front");
    let stranger = TestCa::new(dir.path(), "stranger");
    // This test's own requests trust both CAs (the replicas directly, the edge).
    let both = dir.path().join("both.pem");
    std::fs::write(
        &both,
        [
            std::fs::read(&replicas_ca.ca_file).unwrap(),
            std::fs::read(&front_ca.ca_file).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    common::tls::trust(common::tls::client_config(&both, None, &[]));
    let keys = tls_keys(&replica_cert);
    let rs = Replicas::start_edited(2, "", move |text| {
        text.replacen("[server]\n", &format!("[server]\n{keys}"), 1)
    })
    .await;
    assert!(rs.gws.iter().all(|g| g.https), "the replicas listen on TLS");

    // The live certificate files, swapped below the way a deploy does.
    let live = common::tls::CertFiles {
        cert: dir.path().join("edge.pem"),
        key: dir.path().join("edge-key.pem"),
    };
    let first = front_ca.server("edge1");
    std::fs::copy(&first.cert, &live.cert).unwrap();
    std::fs::copy(&first.key, &live.key).unwrap();
    let extra = format!(
        "{}replica_ca_file = {}\n",
        tls_keys(&live),
        toml_string(&replicas_ca.ca_file.display().to_string())
    );
    let edge = Edge::start_in(tempfile::tempdir().unwrap(), &rs, HEALTH_MS, 0, &extra).await;

    // The /livez probes pass over TLS: both replicas are in the ring.
    let ring = eventually_async(EJECT_BOUND, || async {
        edge.healthz().await["replicas"]["healthy"] == 2
    })
    .await;
    assert!(ring, "{}\n{}", edge.healthz().await, edge.proc.log_text());
    // h2 and HTTP/1.1 by ALPN, with curl too.
    for (alpn, want) in [
        (&[b"h2".as_slice(), b"http/1.1"][..], http::Version::HTTP_2),
        (&[b"http/1.1".as_slice()][..], http::Version::HTTP_11),
    ] {
        let (r, v) = tls_get(&front_ca.ca_file, alpn, &edge.url("/healthz"))
            .await
            .unwrap();
        assert_eq!((r.status, v), (200, want));
    }
    for (http2, want) in [(true, "2"), (false, "1.1")] {
        let out = curl(&front_ca.ca_file, &edge.url("/healthz"), http2);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said == want,
            "curl: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let err = tls_get(&stranger.ca_file, &[], &edge.url("/healthz"))
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // A task through the TLS edge to the TLS replicas: created, polled, its result.
    let c = edge.client();
    let id = task_id(&create_task(&c, "sleep", json!({"ms": 1200})).await);
    let done = poll_until(&c, &id, Duration::from_secs(30), |r| {
        r["status"] == "completed"
    })
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    // A new certificate on disk reaches new connections, counted as a reload.
    let next_ca = TestCa::new(dir.path(), "next");
    let second = next_ca.server("edge2");
    for (from, to) in [(&second.key, &live.key), (&second.cert, &live.cert)] {
        let tmp = to.with_extension("tmp");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, to).unwrap();
    }
    let swapped = eventually_async(Duration::from_secs(15), || async {
        tls_get(&next_ca.ca_file, &[], &edge.url("/healthz"))
            .await
            .is_ok()
    })
    .await;
    assert!(
        swapped,
        "the new certificate was never served:\n{}",
        edge.proc.log_text()
    );
    let m = tls_get(&next_ca.ca_file, &[], &edge.url("/metrics"))
        .await
        .unwrap()
        .0;
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains(
            "taskgate_tls_certificate_reloads_total{listener=\"edge\",outcome=\"loaded\"}"
        ),
        "{text}"
    );

    // An edge that does not trust the replicas' CA keeps them out of its ring.
    drop(edge);
    let distrust = format!(
        "replica_ca_file = {}\n",
        toml_string(&stranger.ca_file.display().to_string())
    );
    let blind = Edge::start_in(tempfile::tempdir().unwrap(), &rs, HEALTH_MS, 0, &distrust).await;
    let out = eventually_async(EJECT_BOUND, || async {
        blind.healthz().await["replicas"]["healthy"] == 0
    })
    .await;
    assert!(out, "{}\n{}", blind.healthz().await, blind.proc.log_text());
    let r = blind.client().request("tools/list", json!({})).await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
}

/// A replica drained for a deploy refuses new calls unprocessed (503 +
/// `taskgate-not-sent`); the edge sends each to the other replica, so under load
/// no client sees a refusal, and nothing is served twice (docs/design.md §24).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_replica_hands_new_calls_to_another_during_load() {
    let ports = [free_port(), free_port()];
    let rs = Replicas::start_edited(2, "", |text| {
        let mut text = text;
        for (i, port) in ports.iter().enumerate() {
            text = text.replace(
                &format!("replica_id = \"r{i}\"\n"),
                &format!("replica_id = \"r{i}\"\nmetrics_listen = \"127.0.0.1:{port}\"\n"),
            );
        }
        text
    })
    .await;
    // Probes far apart: the drained replica stays in the ring, so every request
    // routed to it must be handed on by the edge itself.
    let edge = Edge::start_with(&rs, 600_000, 0).await;
    let admin_token = token_with(json!({
        "sub": "ops-jane", "tenant": "ops", "iss": ISSUER.issuer, "aud": ISSUER.audience,
        "exp": now_s() + 3600, "scope": "taskgate:admin",
    }));
    let auth = [("authorization", format!("Bearer {admin_token}"))];
    let load = |n: usize| {
        let c = edge.client();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..n {
                let text = format!("call {i}");
                let r = c.call_tool("echo", json!({"text": text})).await;
                let echoed = first_text(&r.json()["result"]);
                out.push((r.status, echoed == text, replica_of(&r)));
            }
            out
        })
    };
    let runs: Vec<_> = (0..4).map(|_| load(25)).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let drain = format!("http://127.0.0.1:{}/admin/drain", ports[0]);
    let r = raw(&drain, "POST", &auth, Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let mut served = Vec::new();
    for run in runs {
        served.extend(run.await.unwrap());
    }
    for (status, echoed, replica) in &served {
        assert_eq!(*status, 200, "{served:?}\n{}", edge.proc.log_text());
        assert!(*echoed, "each answer is its own call's ({replica})");
    }
    // After the drain, r0 serves nothing new.
    let c = edge.client();
    for i in 0..6 {
        let r = c.call_tool("echo", json!({"text": "after"})).await;
        assert_eq!(r.status, 200, "after the drain, request {i}");
        assert_eq!(replica_of(&r), "r1", "request {i}");
    }
    let m = raw(&edge.url("/metrics"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&m.body);
    let drained = format!("http://{}", rs.gws[0].addr);
    assert!(
        text.contains(&format!(
            "taskgate_edge_retries_total{{replica=\"{drained}\"}}"
        )),
        "{text}"
    );
    // Undrained, it serves again.
    let undrain = format!("http://127.0.0.1:{}/admin/undrain", ports[0]);
    let r = raw(&undrain, "POST", &auth, Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200);
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let r = c.call_tool("echo", json!({"text": "again"})).await;
        assert_eq!(r.status, 200);
        seen.insert(replica_of(&r));
    }
    assert!(seen.contains("r0"), "{seen:?}");
}

// ---------------------------------------------------------------------------------
// Two releases on one schema (docs/design.md §27 "Mixed versions").

/// Poll `id` on `c` until it is terminal and has `status`; its result.
async fn settled_as(c: &Client2026, id: &str, status: &str) -> Value {
    let done = poll_terminal(c, id).await;
    assert_eq!(done["status"], status, "{id}: {done}");
    done
}

/// The previous release (`TASKGATE_PREV_BIN`, scripts/prev-release.sh) as r0 and this
/// one as r1 serve one PostgreSQL schema behind the edge during a rolling deploy: each
/// reads, cancels and settles the tasks the other created, and the previous release
/// restarts on the schema this one migrated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_release_and_this_one_serve_one_schema() {
    let prev = prev_release_bin();
    let schema = unique_schema();
    let demo = DemoHttp::start().await;
    // N−1 first, creating the schema at its own version as a deployment of it did;
    // then this release, which migrates the schema while N−1 serves it.
    let old = Replicas::start_one_bin(&prev, &schema, demo.port, 0, "", &|t| t).await;
    let new = Replicas::start_one(&schema, demo.port, 1, "", &|t| t).await;
    assert!(
        new.proc
            .wait_log("postgres store ready", Duration::from_secs(5))
            .await
            .is_some_and(|l| !l.contains("applied=0")),
        "this release migrated nothing:\n{}",
        new.proc.log_text()
    );
    let mut rs = Replicas {
        demo,
        gws: vec![old, new],
    };
    let edge = Edge::start(&rs).await;
    let via_edge = edge.client();
    let direct = [rs.client(0), rs.client(1)];

    // Each release creates a long task and a short one.
    let mut long = Vec::new();
    let mut short = Vec::new();
    for c in &direct {
        long.push(task_id(
            &create_task(c, "sleep", json!({"ms": 120_000})).await,
        ));
        short.push(task_id(
            &create_task(c, "sleep", json!({"ms": 1_500})).await,
        ));
    }
    for i in 0..2 {
        let other = &direct[1 - i];
        // Read by the other release, directly and through the edge.
        let seen = ok_result(&tasks_get(other, &long[i]).await);
        assert_eq!(
            seen["status"],
            "working",
            "r{i}'s task read on r{}: {seen}",
            1 - i
        );
        let seen = ok_result(&tasks_get(&via_edge, &long[i]).await);
        assert_eq!(seen["status"], "working", "{seen}");
        // Completed on its creator, the result read by the other, the same bytes.
        let by_other = settled_as(other, &short[i], "completed").await;
        let by_creator = settled_as(&direct[i], &short[i], "completed").await;
        assert_eq!(by_other["result"], by_creator["result"]);
        assert!(!by_other["result"].is_null(), "{by_other}");
    }
    // Cancelled through the other release: relayed to the holder, which cancels.
    for i in 0..2 {
        let ack = ok_result(&tasks_cancel(&direct[1 - i], &long[i]).await);
        assert_eq!(ack["resultType"], "complete", "{ack}");
    }
    for id in &long {
        settled_as(&via_edge, id, "cancelled").await;
    }

    // Settled by the other release: this one takes over N−1's call when N−1 dies.
    let orphan = task_id(&create_task(&direct[0], "sleep", json!({"ms": 120_000})).await);
    rs.gws[0].proc.kill9();
    let failed = settled_as(&direct[1], &orphan, "failed").await;
    assert!(
        failed.to_string().contains("replica lost"),
        "{failed}\n{}",
        rs.gws[1].proc.log_text()
    );

    // N−1 starts again on the schema this release migrated, and serves it: it takes
    // this release's call over when this release dies.
    let Gateway {
        dir, config_path, ..
    } = rs.gws.remove(0);
    let old = launch_replica_bin(&prev, dir, config_path).await;
    assert!(
        old.proc
            .log_text()
            .contains("newer than this taskgate knows"),
        "N−1 did not see a newer schema:\n{}",
        old.proc.log_text()
    );
    let old_client = tasks_client(&old, "alice", "acme");
    let seen = ok_result(&tasks_get(&old_client, &orphan).await);
    assert_eq!(seen["status"], "failed", "{seen}");
    let orphan = task_id(&create_task(&direct[1], "sleep", json!({"ms": 120_000})).await);
    rs.gws[0].proc.kill9();
    let failed = settled_as(&old_client, &orphan, "failed").await;
    assert!(failed.to_string().contains("replica lost"), "{failed}");
    drop(edge);
}

/// A plain client's `taskgate_task_status` through the edge (docs/design.md §28): the
/// `Mcp-Param-Task-Id` it carries keys it on the task ring, so every status call of
/// one handle reaches the replica `tasks/get` of that task reaches; the handle also
/// resolves on every other replica, as `tasks/get` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_tool_call_reaches_the_tasks_replica_through_the_edge() {
    let rs = Replicas::start_edited(3, "", |text| {
        text + "[upstream.tools.sleep]\nplain_clients = \"handle\"\n"
    })
    .await;
    let edge = Edge::start(&rs).await;
    let plain = edge.client().with_caps(json!({}));

    // A slow call from a client without the extension: a handle, as a tool result.
    let r = plain.call_tool("sleep", json!({"ms": 60_000})).await;
    let handle = ok_result(&r);
    assert_eq!(handle["isError"], false, "{handle}");
    let id = handle["structuredContent"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no handle: {handle}"))
        .to_string();

    let status = |c: &Client2026| {
        let params = json!({"name": "taskgate_task_status", "arguments": {"taskId": id}});
        let body = c.body(json!(9), "tools/call", &params);
        let mut h = c.headers("tools/call", &params);
        h.push(("mcp-param-task-id", id.clone()));
        let url = c.url.clone();
        async move {
            raw(&url, "POST", &h, Bytes::from(body.to_string()))
                .await
                .unwrap_or_else(|e| panic!("status: {e}"))
        }
    };
    // Every status call through the edge reaches one replica, the task's.
    let mut seen = BTreeSet::new();
    for _ in 0..8 {
        let r = status(&plain).await;
        let v = ok_result(&r);
        assert_eq!(v["structuredContent"]["status"], "working", "{v}");
        seen.insert(replica_of(&r));
    }
    assert_eq!(seen.len(), 1, "status calls of one task reached {seen:?}");
    let polled = poll_replica(&edge.client(), &id).await;
    assert_eq!(
        seen.into_iter().next().unwrap_or_default(),
        polled,
        "the status tool and tasks/get of one task reach different replicas"
    );

    // Any replica answers it directly.
    for i in 0..3 {
        let direct = rs.client(i).with_caps(json!({}));
        let v = ok_result(&status(&direct).await);
        assert_eq!(
            v["structuredContent"]["taskId"],
            id.as_str(),
            "replica {i}: {v}"
        );
    }
}
