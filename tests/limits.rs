//! Flow control through the real binary (docs/design.md §8 "Flow control"): the poll
//! limiter, the tenant quota, per-upstream queueing with 503 when full, and fairness
//! across tenants. Conditions are polled for; nothing asserts timing.

#[macro_use]
#[allow(unused_macros)]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";

fn tasks_caps() -> Value {
    json!({"extensions": {TASKS: {}}})
}

fn text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// A `sleep` task (the config promotes `sleep` at once); returns its id.
async fn sleep_task(c: &Client2026, ms: u64) -> String {
    let r = c.call_tool("sleep", json!({"ms": ms})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    v["result"]["taskId"].as_str().unwrap().to_string()
}

async fn get_with_id(c: &Client2026, task: &str, id: Value) -> Resp {
    let params = json!({"taskId": task});
    let body = c.body(id, "tasks/get", &params);
    c.send("tasks/get", &params, &body).await
}

/// A 429/503 throttle with `-32005`, `Retry-After` ≥ 1 s and `data.{retryAfterMs, reason}`.
fn assert_throttle(r: &Resp, status: u16, reason: &str, id: &Value) {
    assert_eq!(r.status, status, "{}", text(r));
    let ra: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(ra >= 1, "Retry-After {ra}");
    let v = r.json();
    assert_eq!(v["id"], *id, "{v}");
    assert_eq!(v["error"]["code"], -32005, "{v}");
    assert_eq!(v["error"]["data"]["reason"], reason, "{v}");
    assert!(
        v["error"]["data"]["retryAfterMs"].as_u64().unwrap() >= 1,
        "{v}"
    );
}

async fn setup(sections: &str, upstream_extra: &str) -> DemoSetup {
    let s = DemoSetup::start_full(Transport::Http, "", sections, upstream_extra).await;
    s.gw.wait_ready().await;
    s
}

#[tokio::test]
async fn fast_poller_is_throttled_and_a_polite_one_never_is() {
    let s = setup(
        "[tasks]\npoll_interval_ms = 1000\n[limits]\npoll_burst = 2\n",
        "[upstream.tools.sleep]\npromote_after_ms = 0\n",
    )
    .await;
    let alice = s.client().with_caps(tasks_caps());
    let bob = Client2026::new(&s.gw, "/mcp", Some(token("bob", "acme"))).with_caps(tasks_caps());
    let t_alice = sleep_task(&alice, 60_000).await;
    let t_bob = sleep_task(&bob, 60_000).await;

    // Bob polls his own task at the advertised pace the whole time.
    let polite = tokio::spawn(async move {
        let mut polls = 0;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(4) {
            let r = get_with_id(&bob, &t_bob, json!(polls)).await;
            assert_eq!(r.status, 200, "polite poll {polls} throttled: {}", text(&r));
            let wait = r.json()["result"]["pollIntervalMs"].as_u64().unwrap();
            polls += 1;
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        polls
    });

    let first = get_with_id(&alice, &t_alice, json!("first")).await;
    assert_eq!(first.status, 200, "{}", text(&first));
    let last_updated = first.json()["result"]["lastUpdatedAt"].clone();
    let before = demo_stats(&alice).await["calls"].as_u64().unwrap();

    let mut throttled = 0;
    let mut max_retry_ms = 0;
    for i in 0..20 {
        let id = json!(format!("poll-{i}"));
        let r = get_with_id(&alice, &t_alice, id.clone()).await;
        if r.status == 429 {
            assert_throttle(&r, 429, "poll_interval", &id);
            assert_eq!(
                r.json()["error"]["message"],
                "polling faster than pollIntervalMs"
            );
            max_retry_ms =
                max_retry_ms.max(r.json()["error"]["data"]["retryAfterMs"].as_u64().unwrap());
            throttled += 1;
        } else {
            assert_eq!(r.status, 200, "{}", text(&r));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        throttled >= 10,
        "only {throttled} of 20 fast polls throttled"
    );

    // The upstream saw nothing but the stats calls themselves.
    let after = demo_stats(&alice).await["calls"].as_u64().unwrap();
    assert_eq!(after, before + 1, "throttled polls reached the upstream");

    // After the interval the poll succeeds, and the task never changed.
    tokio::time::sleep(Duration::from_millis(max_retry_ms + 50)).await;
    let ok = get_with_id(&alice, &t_alice, json!("late")).await;
    assert_eq!(ok.status, 200, "{}", text(&ok));
    let v = ok.json();
    assert_eq!(v["id"], "late");
    assert_eq!(v["result"]["status"], "working");
    assert_eq!(v["result"]["lastUpdatedAt"], last_updated);

    let polls = polite.await.unwrap();
    assert!(polls >= 2, "{polls}");
}

#[tokio::test]
async fn malformed_id_is_rejected_before_the_limiter() {
    let s = setup("[limits]\npoll_burst = 1\n", "").await;
    let c = s.client().with_caps(tasks_caps());
    for i in 0..5 {
        let id = json!(i);
        let r = get_with_id(&c, "not-a-task", id.clone()).await;
        assert_eq!(r.status, 200, "{}", text(&r));
        assert_eq!(r.json()["error"]["code"], -32602);
        assert_eq!(r.json()["error"]["message"], "malformed task id");
    }
}

#[tokio::test]
async fn request_rate_limit() {
    let s = setup("[limits]\nrequests_per_second = 2\n", "").await;
    let c = s.client();
    let other = Client2026::new(&s.gw, "/mcp", Some(token("carol", "globex")));
    let mut throttled = None;
    for i in 0..10 {
        let id = json!(i);
        let body = c.body(id.clone(), "tools/list", &json!({}));
        let r = c.send("tools/list", &json!({}), &body).await;
        if r.status == 429 {
            throttled = Some((r, id));
            break;
        }
    }
    let (r, id) = throttled.expect("a burst of 10 requests at 2/s was never throttled");
    assert_throttle(&r, 429, "request_rate", &id);
    // Another principal is unaffected.
    let r = other.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
}

#[tokio::test]
async fn tenant_quota_refuses_before_the_upstream_call() {
    let s = setup(
        "[tasks]\npoll_interval_ms = 100\n[limits]\npoll_burst = 1000\nmax_live_tasks_per_tenant = 2\n",
        "[upstream.tools.sleep]\npromote_after_ms = 0\n[upstream.tools.counter]\npromote_after_ms = 0\n",
    )
    .await;
    let acme = s.client().with_caps(tasks_caps());
    let globex =
        Client2026::new(&s.gw, "/mcp", Some(token("carol", "globex"))).with_caps(tasks_caps());
    let t1 = sleep_task(&acme, 60_000).await;
    // The second one carries an Idempotency-Key.
    let keyed = || async {
        let params = json!({"name": "sleep", "arguments": {"ms": 60_000}});
        let body = acme.body(json!("k"), "tools/call", &params);
        let mut h = acme.headers("tools/call", &params);
        h.push(("idempotency-key", "k2".to_string()));
        raw(&acme.url, "POST", &h, bytes::Bytes::from(body.to_string()))
            .await
            .unwrap()
    };
    let r = keyed().await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let t2 = r.json()["result"]["taskId"].as_str().unwrap().to_string();
    // At the quota, a duplicate of a keyed call still gets its existing task.
    let r = keyed().await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["result"]["taskId"], t2.as_str());

    // At the quota: refused, and the counter tool never ran.
    let params = json!({"name": "counter", "arguments": {"key": "quota"}});
    let body = acme.body(json!("q"), "tools/call", &params);
    let r = acme.send("tools/call", &params, &body).await;
    assert_throttle(&r, 429, "tenant_quota", &json!("q"));
    let plain = s.client();
    let stats = demo_stats(&plain).await;
    assert!(stats["counter"].get("quota").is_none(), "{stats}");

    // Another tenant is not slowed down.
    let _g = sleep_task(&globex, 60_000).await;

    // A client without the extension gets a synchronous call: no task, no quota.
    let r = plain.call_tool("echo", json!({"text": "hi"})).await;
    assert_eq!(r.status, 200, "{}", text(&r));

    // Freeing a slot (cancel) lets the tenant create again.
    let r = acme.request("tasks/cancel", json!({"taskId": t1})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let _t3 = sleep_task(&acme, 60_000).await;
}

#[tokio::test]
async fn queue_is_fair_and_bounded() {
    let s = setup(
        "[tasks]\npoll_interval_ms = 100\n[limits]\npoll_burst = 1000\nqueue_size = 4\n",
        "max_concurrency = 1\n[upstream.tools.sleep]\npromote_after_ms = 0\n",
    )
    .await;
    let a = s.client().with_caps(tasks_caps());
    let b = Client2026::new(&s.gw, "/mcp", Some(token("bob", "globex"))).with_caps(tasks_caps());

    // A floods: one runs, two queue (half the queue is A's share), the rest is 503.
    let a1 = sleep_task(&a, 1_500).await;
    let a2 = sleep_task(&a, 1_500).await;
    let a3 = sleep_task(&a, 1_500).await;
    let params = json!({"name": "sleep", "arguments": {"ms": 10}});
    let body = a.body(json!("full"), "tools/call", &params);
    let r = a.send("tools/call", &params, &body).await;
    assert_throttle(&r, 503, "queue_full", &json!("full"));

    // A queued task says so.
    let start = std::time::Instant::now();
    loop {
        let (st, msg) = task_status(&a, &a3).await;
        assert_eq!(st, "working");
        if msg.starts_with("queued (position ") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a queued task never reported its position: {msg:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // B is not shut out by A's flood, and is served before A's later calls.
    let b1 = sleep_task(&b, 10).await;
    wait_completed(&b, &b1).await;
    assert_eq!(
        task_status(&a, &a3).await.0,
        "working",
        "A's last call overtook B's"
    );
    for t in [&a1, &a2, &a3] {
        wait_completed(&a, t).await;
    }
    // An inline call of B while A floods proceeds.
    let plain_b = Client2026::new(&s.gw, "/mcp", Some(token("bob", "globex")));
    let r = plain_b.call_tool("echo", json!({"text": "hi"})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
}

async fn task_status(c: &Client2026, t: &str) -> (String, String) {
    let v = c.request("tasks/get", json!({"taskId": t})).await.json();
    let r = &v["result"];
    let field = |k: &str| r[k].as_str().unwrap_or_default().to_string();
    (field("status"), field("statusMessage"))
}

async fn wait_completed(c: &Client2026, t: &str) {
    let start = std::time::Instant::now();
    loop {
        if task_status(c, t).await.0 == "completed" {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{t} never completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Six concurrent slow task calls against `max_concurrency = 2`: the four that wait
/// say "queued (position N)" in their CreateTaskResult and first `tasks/get`, and the
/// position moves as calls ahead finish.
async fn queued_tasks_say_so_from_the_start(upstream_extra: &str) {
    let s = setup(
        "[tasks]\npoll_interval_ms = 100\n[limits]\npoll_burst = 1000\n",
        &format!("max_concurrency = 2\n{upstream_extra}"),
    )
    .await;
    let c = s.client().with_caps(tasks_caps());
    // Two calls take the slots first, so the queue order is known.
    let mut created = Vec::new();
    for _ in 0..2 {
        let r = c.call_tool("sleep", json!({"ms": 4_000})).await;
        created.push(r.json()["result"].clone());
    }
    let rest =
        futures_util::future::join_all((0..4).map(|_| c.call_tool("sleep", json!({"ms": 1_500}))))
            .await;
    created.extend(rest.iter().map(|r| r.json()["result"].clone()));
    let queued: Vec<&Value> = created
        .iter()
        .filter(|r| {
            r["statusMessage"]
                .as_str()
                .is_some_and(|m| m.starts_with("queued (position "))
        })
        .collect();
    assert_eq!(queued.len(), 4, "CreateTaskResults: {created:#?}");
    for r in &created {
        assert_eq!(r["resultType"], "task", "{r}");
    }
    let last = queued
        .iter()
        .max_by_key(|r| r["statusMessage"].as_str().map(str::to_string))
        .unwrap()["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, first_msg) = task_status(&c, &last).await;
    assert_eq!(st, "working");
    assert!(first_msg.starts_with("queued (position "), "{first_msg}");
    // The position moves as calls ahead finish, then the call runs and completes.
    let start = std::time::Instant::now();
    let mut seen = vec![first_msg.clone()];
    loop {
        let (st, msg) = task_status(&c, &last).await;
        if seen.last() != Some(&msg) {
            seen.push(msg.clone());
        }
        if st == "completed" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never completed: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.len() >= 3,
        "status never moved through the queue: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_task_reports_position_from_creation_after_the_deadline() {
    // The default path: each call races promote_after_ms, then becomes a task.
    queued_tasks_say_so_from_the_start("promote_after_ms = 300\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_task_reports_position_from_creation_when_created_first() {
    // promote_after_ms = 0: the task is created before its call enters the queue.
    queued_tasks_say_so_from_the_start("[upstream.tools.sleep]\npromote_after_ms = 0\n").await;
}

/// A flood of concurrent polls on one task: the poll limiter answers (well-formed
/// 429s, nothing else), the flood never reaches the upstream, the task record is
/// untouched, and the task still completes with its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_flood_on_one_task_is_answered_by_the_limiter_and_touches_nothing() {
    let s = setup(
        "[tasks]\npoll_interval_ms = 1000\n[limits]\npoll_burst = 3\n",
        "[upstream.tools.sleep]\npromote_after_ms = 0\n",
    )
    .await;
    let c = s.client().with_caps(tasks_caps());
    // Long enough that the flood ends first even in a debug build on loaded cores
    // (4 s was not: a plain `cargo test` saw the task complete mid-flood).
    let t = sleep_task(&c, 12_000).await;
    let first = get_with_id(&c, &t, json!("first")).await;
    assert_eq!(first.status, 200, "{}", text(&first));
    let before = first.json()["result"].clone();
    // The task id goes out before its call reaches the upstream: wait until the demo
    // has counted it. Each `stats` call counts itself too, so the k-th one reads k + 1
    // once the sleep call has arrived.
    let mut calls_before = 0;
    for k in 1..=200u64 {
        calls_before = demo_stats(&c).await["calls"].as_u64().unwrap();
        if calls_before == k + 1 {
            break;
        }
        assert!(
            calls_before <= k,
            "unexpected upstream calls: {calls_before}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut ok = 0;
    let mut throttled = 0;
    for wave in 0..4 {
        let replies = futures_util::future::join_all((0..100).map(|i| {
            let id = json!(format!("flood-{wave}-{i}"));
            let c = &c;
            let t = &t;
            async move { (get_with_id(c, t, id.clone()).await, id) }
        }))
        .await;
        for (r, id) in replies {
            if r.status == 429 {
                assert_throttle(&r, 429, "poll_interval", &id);
                throttled += 1;
            } else {
                assert_eq!(r.status, 200, "{}", text(&r));
                let v = r.json();
                assert_eq!(v["id"], id, "{v}");
                assert_eq!(v["result"]["status"], "working", "{v}");
                assert_eq!(v["result"]["lastUpdatedAt"], before["lastUpdatedAt"], "{v}");
                ok += 1;
            }
        }
    }
    assert!(
        throttled >= 300,
        "only {throttled} of 400 flooding polls throttled"
    );
    // The flood reached neither the upstream nor the task.
    let calls_after = demo_stats(&c).await["calls"].as_u64().unwrap();
    assert_eq!(calls_after, calls_before + 1, "polls reached the upstream");
    let wait = Duration::from_millis(1_100);
    tokio::time::sleep(wait).await;
    let now = get_with_id(&c, &t, json!("after")).await;
    assert_eq!(now.status, 200, "{}", text(&now));
    let now = now.json()["result"].clone();
    for k in [
        "taskId",
        "status",
        "statusMessage",
        "createdAt",
        "lastUpdatedAt",
    ] {
        assert_eq!(now[k], before[k], "{k} changed under the flood");
    }
    // Polling at the advertised pace, the task completes with its result.
    let start = std::time::Instant::now();
    loop {
        let r = get_with_id(&c, &t, json!("done")).await;
        if r.status == 200 && r.json()["result"]["status"] == "completed" {
            assert_eq!(first_text(&r.json()["result"]["result"]), "slept 12000 ms");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "{}", text(&r));
        tokio::time::sleep(wait).await;
    }
    eprintln!("poll flood: {ok} answered, {throttled} throttled");
}
