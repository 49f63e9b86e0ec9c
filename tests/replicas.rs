//! Several replicas on one PostgreSQL database (docs/design.md §18–20; README
//! "Several replicas"): real gateway binaries sharing a schema and one HTTP demo
//! upstream. Any replica answers any task; cancels, input answers and MRTR retries
//! reach the replica holding the call; listens see changes made anywhere; a replica
//! killed mid-task loses its calls to the others, and a replica that lost its lease
//! cannot write.

mod common;
mod legacy_support;
mod replicas_support;
mod tasks_support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use legacy_support::*;
use replicas_support::*;
use serde_json::{Value, json};
use tasks_support::*;

/// A relay (cancel, input answer, MRTR retry) reaches its holder within this.
const RELAY_BOUND: Duration = Duration::from_secs(5);
/// A dead replica's calls are failed within this.
const TAKEOVER_BOUND: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_answers_with_identical_snapshots() {
    let rs = Replicas::start(3, "").await;
    let (a, b, c) = (rs.client(0), rs.client(1), rs.client(2));
    let r = a.call_tool("sleep", json!({"ms": 1500})).await;
    assert_eq!(replica_of(&r), "r0");
    let id = task_id(&ok_result(&r));

    // Read-your-writes across replicas: B and C know the task at once.
    let rb = tasks_get(&b, &id).await;
    assert_eq!(replica_of(&rb), "r1");
    let sb = ok_result(&rb);
    assert!(
        matches!(sb["status"].as_str(), Some("working" | "completed")),
        "{sb}"
    );
    let rc = tasks_get(&c, &id).await;
    assert_eq!(replica_of(&rc), "r2");
    ok_result(&rc);

    let done = poll_until(&b, &id, Duration::from_secs(30), |r| {
        r["status"] == "completed"
    })
    .await;
    assert_eq!(first_text(&done["result"]), "slept 1500 ms");
    // The terminal snapshot is the same on every replica.
    let mut snaps = Vec::new();
    for cl in [&a, &b, &c] {
        snaps.push(ok_result(&tasks_get(cl, &id).await));
    }
    let strip = |mut v: Value| {
        // Adaptive poll intervals are per replica (README "Several replicas").
        v.as_object_mut().map(|m| m.remove("pollIntervalMs"));
        v
    };
    assert_eq!(strip(snaps[0].clone()), strip(snaps[1].clone()));
    assert_eq!(strip(snaps[1].clone()), strip(snaps[2].clone()));
    // Every reply names its replica, operational endpoints too.
    let live = raw(&rs.gws[2].url("/livez"), "GET", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(live.status, 200, "{}", String::from_utf8_lossy(&live.body));
    assert_eq!(replica_of(&live), "r2");
    assert_eq!(live.json()["lease"], "held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_on_another_replica_reaches_the_upstream() {
    let rs = Replicas::start(3, "").await;
    let (a, b) = (rs.client(0), rs.client(1));
    let before = upstream_cancels(&a).await;
    let id = task_id(&create_task(&a, "sleep", json!({"ms": 60_000})).await);
    poll_until(&b, &id, Duration::from_secs(10), |r| {
        r["status"] == "working"
    })
    .await;

    let ack = ok_result(&tasks_cancel(&b, &id).await);
    assert_eq!(ack["resultType"], "complete", "{ack}");
    // The upstream call on A gets `notifications/cancelled`.
    assert!(
        upstream_saw_cancel(&b, before, RELAY_BOUND).await,
        "the upstream never saw the cancel:\n{}",
        rs.gws[0].proc.log_text()
    );
    for i in 0..3 {
        let s = ok_result(&tasks_get(&rs.client(i), &id).await);
        assert_eq!(s["status"], "cancelled", "replica r{i}: {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_answer_on_another_replica_reaches_the_held_call() {
    let rs = Replicas::start(3, "").await;
    let (a, b, c) = (rs.client(0), rs.client(1), rs.client(2));
    let id = task_id(&create_task(&a, "elicit", json!({"message": "your name?"})).await);
    let waiting = poll_until(&b, &id, Duration::from_secs(30), |r| {
        r["status"] == "input_required"
    })
    .await;
    let key = waiting["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an input request");
    let ack = ok_result(
        &tasks_update(
            &c,
            &id,
            json!({&key: {"action": "accept", "content": {"answer": "from-c"}}}),
        )
        .await,
    );
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let done = poll_until(&b, &id, RELAY_BOUND + Duration::from_secs(10), |r| {
        is_terminal(r["status"].as_str().unwrap_or_default())
    })
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(all_text(&done["result"]).contains("from-c"), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_retry_on_another_replica_completes_the_held_call() {
    let rs = Replicas::start(2, "").await;
    let caps = json!({"elicitation": {}});
    let a = plain_client(&rs.gws[0], "alice", "acme", caps.clone());
    let b = plain_client(&rs.gws[1], "alice", "acme", caps);
    let params = json!({"name": "elicit", "arguments": {"message": "your name?"}});
    let v = msg(&a
        .send(
            "tools/call",
            &params,
            &a.body(json!("first"), "tools/call", &params),
        )
        .await);
    let res = v["result"].clone();
    assert_eq!(res["resultType"], "input_required", "{v}");
    let key = res["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an input request");
    let mut p = params.clone();
    p["inputResponses"] = json!({key: {"action": "accept", "content": {"answer": "relayed-mrtr"}}});
    p["requestState"] = res["requestState"].clone();
    let sent = Instant::now();
    let r = b
        .send("tools/call", &p, &b.body(json!("retry"), "tools/call", &p))
        .await;
    assert_eq!(replica_of(&r), "r1");
    let v = msg(&r);
    assert!(
        sent.elapsed() < RELAY_BOUND + Duration::from_secs(10),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(v["id"], "retry", "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(first_text(&v["result"]).contains("relayed-mrtr"), "{v}");
    // A state nobody holds any more is refused like a tampered one.
    let v = msg(&b
        .send("tools/call", &p, &b.body(json!(3), "tools/call", &p))
        .await);
    assert_eq!(v["error"]["code"], -32602, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_on_one_replica_sees_changes_made_on_another() {
    let rs = Replicas::start(2, "").await;
    let (a, b) = (rs.client(0), rs.client(1));
    let id = task_id(&create_task(&a, "sleep", json!({"ms": 1500})).await);
    let mut l = SseStream::listen(&b, json!("sub"), json!({"taskIds": [id.clone()]})).await;
    assert_eq!(
        l.headers
            .get("taskgate-replica")
            .and_then(|v| v.to_str().ok()),
        Some("r1")
    );
    let ack = l.next(Duration::from_secs(10)).await.expect("ack");
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id.clone()]),
        "{ack}"
    );
    let completed = l
        .task_reached(&id, "completed", Duration::from_secs(30))
        .await
        .is_some();
    assert!(completed, "B's listen never saw A's completion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_duplicates_on_different_replicas_make_one_task() {
    let rs = Replicas::start(3, "").await;
    let before = task_demo_stats(&rs.client(0)).await["calls"]
        .as_u64()
        .unwrap_or(0);
    let params = json!({"name": "sleep", "arguments": {"ms": 800}});
    let sends = (0..3).map(|i| {
        let c = rs.client(i);
        let params = params.clone();
        async move {
            let body = c.body(json!(i), "tools/call", &params);
            let mut h = c.headers("tools/call", &params);
            h.push(("idempotency-key", "same-key-across-replicas".to_string()));
            let r = raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
                .await
                .unwrap();
            task_id(&ok_result(&r))
        }
    });
    let ids = futures_util::future::join_all(sends).await;
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    let done = poll_terminal(&rs.client(1), &ids[0]).await;
    assert_eq!(done["status"], "completed", "{done}");
    // `stats` is one more call; the duplicates ran the tool once.
    let after = task_demo_stats(&rs.client(2)).await["calls"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(after - before, 2, "one sleep run plus this stats call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_ids_match_never_issued_ones_on_every_replica() {
    let rs = Replicas::start(3, "").await;
    let id = task_id(&create_task(&rs.client(0), "sleep", json!({"ms": 30_000})).await);
    let unknown = never_issued_id();
    for i in 0..3 {
        let bob = tasks_client(&rs.gws[i], "bob", "other");
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let probe = |tid: &str| {
                let mut p = json!({"taskId": tid});
                if method == "tasks/update" {
                    p["inputResponses"] = json!({});
                }
                p
            };
            let pf = probe(&id);
            let pu = probe(&unknown);
            let rf = bob
                .send(method, &pf, &bob.body(json!(7), method, &pf))
                .await;
            let ru = bob
                .send(method, &pu, &bob.body(json!(7), method, &pu))
                .await;
            assert_eq!(rf.status, ru.status, "r{i} {method}");
            assert_eq!(rf.body, ru.body, "r{i} {method}");
        }
    }
    let s = ok_result(&tasks_get(&rs.client(2), &id).await);
    assert_eq!(
        s["status"], "working",
        "foreign probes changed the task: {s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replica_loses_its_calls_to_the_others() {
    let mut rs = Replicas::start(3, "").await;
    let a = rs.client(0);
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(task_id(
                &create_task(&a, "sleep", json!({"ms": 120_000})).await,
            ));
        }
        v
    };
    let (b, c) = (rs.client(1), rs.client(2));
    for id in &ids {
        poll_until(&b, id, Duration::from_secs(10), |r| {
            r["status"] == "working"
        })
        .await;
    }
    rs.gws[0].proc.kill9();
    let killed = Instant::now();
    // B and C answer throughout; every task ends `failed` with the reason.
    for id in &ids {
        let done = poll_until(&c, id, TAKEOVER_BOUND, |r| r["status"] != "working").await;
        assert_eq!(done["status"], "failed", "{done}");
        assert_eq!(
            done["statusMessage"], "replica lost while the call was in flight",
            "{done}"
        );
        let on_b = ok_result(&tasks_get(&b, id).await);
        assert_eq!(on_b["status"], "failed", "{on_b}");
    }
    eprintln!("takeover after kill -9: {:?}", killed.elapsed());

    // A restarts under its id with a new epoch.
    let old = rs.gws.remove(0);
    let (dir, config_path) = (old.dir, old.config_path);
    drop(old.proc);
    let a2 = launch_replica(dir, config_path).await;
    let line = a2
        .proc
        .wait_log("replica registered", Duration::from_secs(10))
        .await
        .unwrap_or_default();
    assert!(
        line.contains("epoch=2") || line.contains("\"epoch\":2"),
        "{line}"
    );
    let s = ok_result(&tasks_get(&tasks_client(&a2, "alice", "acme"), &ids[0]).await);
    assert_eq!(s["status"], "failed", "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_write_of_a_replica_that_lost_its_lease_changes_nothing() {
    let rs = Replicas::start(2, "").await;
    let (a, b) = (rs.client(0), rs.client(1));
    // Short enough that the upstream usually answers while A is frozen, so that the
    // late result is waiting when A wakes.
    let id = task_id(&create_task(&a, "sleep", json!({"ms": 2_500})).await);
    poll_until(&b, &id, Duration::from_secs(10), |r| {
        r["status"] == "working"
    })
    .await;
    let pid = rs.gws[0].proc.child.id() as i32;
    // Freeze A: its lease runs out and B takes the call over.
    unsafe {
        libc::kill(pid, libc::SIGSTOP);
    }
    let failed = poll_until(&b, &id, TAKEOVER_BOUND, |r| r["status"] != "working").await;
    unsafe {
        libc::kill(pid, libc::SIGCONT);
    }
    assert_eq!(failed["status"], "failed", "{failed}");
    // A wakes: either its call's late result is fenced, or it notices the lost lease
    // first and stops the call. Which comes first is up to the scheduler; the store
    // test `postgres_lease_fences_writes_and_takeover_fails_once` covers the fence
    // deterministically.
    let noticed = eventually(Duration::from_secs(30), || {
        let log = rs.gws[0].proc.log_text();
        log.contains("this replica no longer holds the call") || log.contains("replica lease lost")
    })
    .await;
    assert!(
        noticed,
        "A never noticed it lost the call:\n{}",
        rs.gws[0].proc.log_text()
    );
    // Past the end of the upstream sleep: whatever A tried to write has been tried.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = ok_result(&tasks_get(&b, &id).await);
    assert_eq!(
        after["status"], "failed",
        "a late write changed the task: {after}"
    );
    assert_eq!(after, ok_result(&tasks_get(&a, &id).await));
    // A registered again with a new epoch and serves.
    assert!(
        rs.gws[0]
            .proc
            .wait_log("registered again with a new epoch", Duration::from_secs(30))
            .await
            .is_some(),
        "{}",
        rs.gws[0].proc.log_text()
    );
    let r = a.call_tool("echo", json!({"text": "back"})).await;
    assert_eq!(ok_result(&r)["resultType"], "complete");
}

/// `taskgate_tasks{status="…"}` as replica `i` exports it.
async fn task_gauge(rs: &Replicas, i: usize, status: &str) -> f64 {
    let url = format!("http://{}/metrics", rs.gws[i].addr);
    let r = raw(&url, "GET", &[], Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200);
    let series = format!("taskgate_tasks{{status=\"{status}\"}} ");
    String::from_utf8_lossy(&r.body)
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_counts_the_tasks_another_one_finished() {
    let rs = Replicas::start(2, "").await;
    let a = rs.client(0);
    // Past promote_after_ms (200), so it becomes a task.
    let id = task_id(&create_task(&a, "sleep", json!({"ms": 800})).await);
    poll_until(&a, &id, Duration::from_secs(30), |r| {
        r["status"] == "completed"
    })
    .await;
    // r1 made no transition of this task: its gauge learns of it only by recounting
    // the shared store (every ten sweep intervals).
    let bound = Duration::from_millis(SWEEP_MS * 10) + Duration::from_secs(20);
    let start = Instant::now();
    for i in [0, 1] {
        while task_gauge(&rs, i, "completed").await != 1.0 {
            assert!(
                start.elapsed() < bound,
                "replica r{i} never counted the completed task"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(task_gauge(&rs, i, "working").await, 0.0, "replica r{i}");
    }
}

/// A 2025-era session opened on one replica is served by another directly: its record
/// is in the shared store (docs/design.md §22 "Clients of the 2025 era"), still bound
/// to its principal, and a DELETE anywhere ends it everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_session_opened_on_one_replica_is_served_by_another() {
    let rs = Replicas::start(2, "").await;
    let alice = Some(token("alice", "acme"));
    let mut on_a = Legacy::at(rs.gws[0].url("/mcp"), alice.clone());
    let init = on_a.initialize(json!({})).await;
    assert_eq!(replica_of(&init), "r0");

    let on_b = on_a.presenting(rs.gws[1].url("/mcp"), alice.clone());
    let ping = on_b.request(json!("p"), "ping", json!({})).await;
    assert_eq!(
        ping.status,
        200,
        "{}\n{}",
        text(&ping),
        rs.gws[1].proc.log_text()
    );
    assert_eq!(replica_of(&ping), "r1");
    assert_eq!(
        ping.json(),
        json!({"jsonrpc": "2.0", "id": "p", "result": {}})
    );
    let echo = on_b
        .request(
            json!(2),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "on b"}}),
        )
        .await;
    assert_eq!(echo.status, 200, "{}", text(&echo));
    assert_eq!(replica_of(&echo), "r1");
    assert_eq!(
        echo.json()["result"]["content"][0]["text"],
        "on b",
        "{}",
        text(&echo)
    );
    let get = on_b.get_stream().await;
    assert_eq!(get.status, 200);
    assert_eq!(get.header("taskgate-replica").as_deref(), Some("r1"));
    drop(get);

    // Another principal presenting it on B reads it as never issued: 404, the same
    // body as an unknown session.
    let bob = Some(token("bob", "acme"));
    let foreign = on_a
        .presenting(rs.gws[1].url("/mcp"), bob.clone())
        .request(json!(3), "ping", json!({}))
        .await;
    assert_eq!(foreign.status, 404, "{}", text(&foreign));
    let mut unknown = Legacy::at(rs.gws[1].url("/mcp"), bob);
    unknown.session = Some("mcs_never-issued-0000000000000000000000000000".into());
    unknown.version = on_a.version.clone();
    let never = unknown.request(json!(3), "ping", json!({})).await;
    assert_eq!(foreign.body, never.body);

    // A DELETE on B ends it on A too (A reads it from the store).
    let del = raw(&on_b.url, "DELETE", &on_b.headers(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(del.status, 204, "{}", text(&del));
    let gone = on_a.request(json!(4), "ping", json!({})).await;
    assert_eq!(gone.status, 404, "{}", text(&gone));
}

/// A replica killed while it follows an upstream's own task (docs/design.md §25): the
/// replica taking its calls over re-attaches to the upstream task through the
/// recorded HTTP session instead of failing it, and the task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_reattaches_to_an_upstream_task() {
    let (_py, port) = start_task_server_http().await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut rs = Replicas::start_edited(2, "", |text| {
        format!("{text}\n{}", http_upstream("py", "/py", &url, ""))
    })
    .await;
    let client = |gw: &Gateway| {
        Client2026::new(gw, "/py", Some(token("alice", "acme"))).with_caps(
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}, "elicitation": {}}),
        )
    };
    let r = client(&rs.gws[0])
        .call_tool("task_work", json!({"ms": 6000, "steps": 12}))
        .await;
    assert_eq!(replica_of(&r), "r0");
    let id = task_id(&ok_result(&r));
    let b = client(&rs.gws[1]);
    poll_until(&b, &id, Duration::from_secs(20), |t| {
        t["statusMessage"]
            .as_str()
            .is_some_and(|m| m.starts_with("step "))
    })
    .await;
    rs.gws[0].proc.kill9();
    let done = poll_until(&b, &id, Duration::from_secs(60), |t| {
        matches!(
            t["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
    })
    .await;
    assert_eq!(
        done["status"],
        "completed",
        "{done}\n{}",
        rs.gws[1].proc.log_text()
    );
    assert_eq!(
        first_text(&done["result"]),
        "task_work done: 6000 ms, 12 steps",
        "{done}"
    );
    assert!(
        rs.gws[1]
            .proc
            .log_text()
            .contains("re-attached to the upstream task"),
        "{}",
        rs.gws[1].proc.log_text()
    );
}

/// A terminal snapshot another replica has answered from memory (docs/design.md §7
/// "Terminal snapshots") is gone there once a purge on one replica removed its task:
/// the purge reports each removed task through the fan-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_one_replica_clears_the_snapshots_another_holds() {
    let schema = unique_schema();
    let demo = DemoHttp::start().await;
    let port = free_port();
    let with_admin = move |text: String| {
        text.replacen(
            "[server]\n",
            &format!("[server]\nmetrics_listen = \"127.0.0.1:{port}\"\n"),
            1,
        )
    };
    let r0 = Replicas::start_one(&schema, demo.port, 0, "", &with_admin).await;
    let r1 = Replicas::start_one(&schema, demo.port, 1, "", &|t| t).await;
    let rs = Replicas {
        demo,
        gws: vec![r0, r1],
    };
    let (a, b) = (rs.client(0), rs.client(1));
    let id = task_id(&ok_result(&a.call_tool("sleep", json!({"ms": 300})).await));
    poll_until(&b, &id, Duration::from_secs(30), |r| {
        r["status"] == "completed"
    })
    .await;
    // Read again on B: served from its snapshot now.
    for _ in 0..3 {
        assert_eq!(ok_result(&tasks_get(&b, &id).await)["status"], "completed");
    }

    let out = std::process::Command::new(bin())
        .args(["admin", "--url", &format!("http://127.0.0.1:{port}")])
        .args(["purge", "--tenant", "acme"])
        .env("TASKGATE_ADMIN_TOKEN", admin_token("taskgate:admin"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // B answers as for an id never issued, within the fan-out's delay.
    let never = tasks_get(&b, &taskgate::tasks::ids::new_task_id())
        .await
        .json();
    assert_eq!(never["error"]["message"], "task not found", "{never}");
    let gone = eventually_async(RELAY_BOUND, || async {
        tasks_get(&b, &id).await.json()["error"]["message"] == "task not found"
    })
    .await;
    assert!(
        gone,
        "B still answers the purged task: {}",
        tasks_get(&b, &id).await.json()
    );
}
