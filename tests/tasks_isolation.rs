//! Who may see a task, and for how long (docs/design.md §7 "Ownership", §9
//! "Idempotency", §11 "Expiry", §15 "Notifications"; MCP Tasks extension, "Task
//! Polling" to "Task Status Notifications", "Security Considerations"): tenant/subject
//! isolation with replies indistinguishable from "not found", owner listen streams,
//! idempotency keys, and expiry with owner-only tombstones.

mod common;
mod tasks_support;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};
use tasks_support::*;

// ---------------------------------------------------------------------------------
// Ownership
// ---------------------------------------------------------------------------------

/// `(status, raw body)` of `method` on `task_id` for client `c` (JSON-RPC id 1).
async fn probe(c: &Client2026, method: &str, task_id: &str) -> (u16, Bytes, Value) {
    let params = match method {
        "tasks/update" => json!({
            "taskId": task_id,
            "inputResponses": {"elicitation-1": {"action": "accept", "content": {"answer": "pwned"}}}
        }),
        _ => json!({"taskId": task_id}),
    };
    let r = send_retrying(c, method, params).await;
    let v = msg(&r);
    (r.status, r.body.clone(), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_ids_are_indistinguishable_from_unknown_ids() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let alice = tasks_client(&gw, "alice", "acme");
    let id = task_id(&create_task(&alice, "sleep", json!({"ms": 2000})).await);
    let unknown = never_issued_id();

    let strangers = [
        ("bob", "other"),
        ("alice", "other"), // same subject, other tenant
        ("bob", "acme"),    // same tenant, other subject
    ];
    for (sub, tenant) in strangers {
        let s = tasks_client(&gw, sub, tenant);
        for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
            let (st_f, body_f, v_f) = probe(&s, method, &id).await;
            let (st_u, body_u, v_u) = probe(&s, method, &unknown).await;
            assert_eq!(
                v_f["error"]["code"], -32602,
                "{sub}@{tenant} {method}: {v_f}"
            );
            assert!(
                v_f.get("result").is_none(),
                "{sub}@{tenant} {method}: {v_f}"
            );
            assert_eq!(st_f, st_u, "{sub}@{tenant} {method}: status differs");
            assert_eq!(
                v_f["error"], v_u["error"],
                "{sub}@{tenant} {method}: error objects differ"
            );
            assert_eq!(
                body_f, body_u,
                "{sub}@{tenant} {method}: bodies are not byte-identical"
            );
        }
    }

    // Malformed ids: "malformed task id", for every method.
    for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
        let (_, _, v) = probe(&alice, method, "gate-test").await;
        assert_eq!(v["error"]["code"], -32602, "{method}: {v}");
        assert_eq!(v["error"]["message"], "malformed task id", "{method}: {v}");
    }

    // A stranger's listen silently drops the foreign id.
    let bob = tasks_client(&gw, "bob", "other");
    let mut l = SseStream::listen(
        &bob,
        json!("bob-listen"),
        json!({"taskIds": [id.clone(), unknown.clone()]}),
    )
    .await;
    assert_eq!(l.status, 200);
    let ack = l.next(Duration::from_secs(10)).await.expect("listen ack");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([]),
        "{ack}"
    );
    assert_eq!(ack["params"]["_meta"][SUB_ID], "bob-listen", "{ack}");
    drop(l);

    // The owner's task is untouched by all of the above.
    let now = ok_result(&tasks_get(&alice, &id).await);
    assert!(
        now["status"] == "working" || now["status"] == "completed",
        "foreign cancel/update changed the task: {now}"
    );
    let done = poll_terminal(&alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(first_text(&done["result"]), "slept 2000 ms");
}

// ---------------------------------------------------------------------------------
// subscriptions/listen
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_listen_streams_snapshots_and_drop_cancels_nothing() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let gw = start_ready(&stdio_body("", tools)).await;
    let alice = tasks_client(&gw, "alice", "acme");
    let unknown = never_issued_id();

    // T1: listened to briefly, then the stream is dropped.
    let t1 = task_id(&create_task(&alice, "sleep", json!({"ms": 3000, "steps": 3})).await);
    let mut l1 = SseStream::listen(&alice, json!("l1"), json!({"taskIds": [t1.clone()]})).await;
    let ack = l1.next(Duration::from_secs(10)).await.expect("l1 ack");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([t1.clone()])
    );
    drop(l1);

    // T2: listened to until it completes.
    let t2 = task_id(&create_task(&alice, "sleep", json!({"ms": 3000, "steps": 3})).await);
    let mut l2 = SseStream::listen(
        &alice,
        json!(77),
        json!({"taskIds": [t2.clone(), unknown.clone()]}),
    )
    .await;
    assert_eq!(l2.status, 200);
    assert!(
        l2.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{:?}",
        l2.headers
    );
    let ack = l2.next(Duration::from_secs(10)).await.expect("l2 ack");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert!(ack.get("id").is_none(), "{ack}");
    assert_eq!(ack["params"]["_meta"][SUB_ID], 77, "{ack}");
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([t2.clone()]),
        "only the caller's own known ids are acknowledged: {ack}"
    );

    let mut snapshots: Vec<Value> = Vec::new();
    loop {
        let Some(n) = l2.next(Duration::from_secs(60)).await else {
            panic!("listen stream ended or stalled; got {snapshots:?}");
        };
        assert_eq!(n["method"], "notifications/tasks", "{n}");
        let p = &n["params"];
        assert_eq!(p["_meta"][SUB_ID], 77, "every notification is tagged: {n}");
        assert_eq!(p["taskId"], t2.as_str(), "only the subscribed task: {n}");
        assert!(p.get("resultType").is_none(), "{n}");
        for k in ["status", "createdAt", "lastUpdatedAt", "ttlMs"] {
            assert!(p.get(k).is_some(), "snapshot misses {k}: {n}");
        }
        snapshots.push(p.clone());
        if is_terminal(p["status"].as_str().unwrap_or_default()) {
            break;
        }
    }
    let last = snapshots.last().unwrap();
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(
        last["result"]["content"],
        json!([{"type": "text", "text": "slept 3000 ms"}]),
        "{last}"
    );
    // The snapshot equals what tasks/get returns (minus resultType and _meta).
    let got = ok_result(&tasks_get(&alice, &t2).await);
    for k in [
        "taskId",
        "status",
        "result",
        "createdAt",
        "lastUpdatedAt",
        "ttlMs",
    ] {
        assert_eq!(got[k], last[k], "{k}: get {got} vs notification {last}");
    }
    drop(l2);

    // Dropping l1 cancelled nothing.
    let d1 = poll_terminal(&alice, &t1).await;
    assert_eq!(d1["status"], "completed", "{d1}");
    assert_eq!(first_text(&d1["result"]), "slept 3000 ms");
}

// ---------------------------------------------------------------------------------
// Idempotency
// ---------------------------------------------------------------------------------

async fn call_keyed(c: &Client2026, key: &str, rpc_id: Value, args: Value) -> Resp {
    let params = json!({"name": "counter", "arguments": args});
    let mut h = c.headers("tools/call", &params);
    h.push(("idempotency-key", key.to_string()));
    let body = c.body(rpc_id, "tools/call", &params);
    raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_same_task_and_runs_once() {
    // HTTP upstream: one demo process, so its counters see every execution.
    let (_up, url) = start_demo_http().await;
    let gw = start_ready(&http_body(&url, "", "")).await;
    let alice = tasks_client(&gw, "alice", "acme");
    let plain = plain_client(&gw, "alice", "acme", json!({}));

    // Sequential duplicates → the same task; a keyed call is always a task.
    let r1 = ok_result(&call_keyed(&alice, "k1", json!(1), json!({"key": "idem"})).await);
    assert_eq!(
        r1["resultType"], "task",
        "a keyed call is always a task: {r1}"
    );
    let id1 = task_id(&r1);
    let r2 = ok_result(&call_keyed(&alice, "k1", json!(2), json!({"key": "idem"})).await);
    assert_eq!(r2["resultType"], "task", "{r2}");
    assert_eq!(
        task_id(&r2),
        id1,
        "duplicate key must return the existing task"
    );
    let done = poll_terminal(&alice, &id1).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(first_text(&done["result"]), "count=1", "{done}");
    // A duplicate after completion still returns the same task.
    let r3 = ok_result(&call_keyed(&alice, "k1", json!(3), json!({"key": "idem"})).await);
    assert_eq!(task_id(&r3), id1);

    // 8 concurrent duplicates of a fresh key → one task.
    let mut joins = Vec::new();
    for i in 0..8 {
        let c = tasks_client(&gw, "alice", "acme");
        joins.push(tokio::spawn(async move {
            let r = call_keyed(&c, "k2", json!(100 + i), json!({"key": "idem2"})).await;
            let res = ok_result(&r);
            assert_eq!(res["resultType"], "task", "#{i}: {res}");
            task_id(&res)
        }));
    }
    let mut ids = HashSet::new();
    for j in joins {
        ids.insert(j.await.expect("keyed call panicked"));
    }
    assert_eq!(
        ids.len(),
        1,
        "concurrent duplicates created several tasks: {ids:?}"
    );
    let id2 = ids.into_iter().next().unwrap();
    let done = poll_terminal(&alice, &id2).await;
    assert_eq!(first_text(&done["result"]), "count=1", "{done}");

    // The upstream ran each keyed call exactly once.
    let c = plain.call_tool("counter", json!({"key": "idem"})).await;
    assert_eq!(first_text(&ok_result(&c)), "count=2");
    let c = plain.call_tool("counter", json!({"key": "idem2"})).await;
    assert_eq!(first_text(&ok_result(&c)), "count=2");

    // Same key, different arguments → -32602.
    let v = msg(&call_keyed(&alice, "k1", json!(9), json!({"key": "different"})).await);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["id"], 9);

    // Keys are scoped to the principal: bob's "k1" is his own task.
    let bob = tasks_client(&gw, "bob", "other");
    let rb = ok_result(&call_keyed(&bob, "k1", json!(10), json!({"key": "idem"})).await);
    assert_eq!(rb["resultType"], "task", "{rb}");
    assert_ne!(task_id(&rb), id1, "a key must not cross principals");
    poll_terminal(&bob, &task_id(&rb)).await;

    // A key from a client without the extension → 400 -32021.
    let r = call_keyed(&plain, "k3", json!(11), json!({"key": "idem3"})).await;
    let v = msg(&r);
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["error"]["code"], -32021, "{v}");
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXT],
        json!({}),
        "{v}"
    );
    // …and nothing ran upstream.
    let c = plain.call_tool("counter", json!({"key": "idem3"})).await;
    assert_eq!(first_text(&ok_result(&c)), "count=1");
}

// ---------------------------------------------------------------------------------
// Expiry
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_task_owner_sees_expired_stranger_sees_not_found() {
    let tools = "[upstream.tools.sleep]\npromote_after_ms = 0\n";
    let body = stdio_body("ttl_ms = 1500\nresult_retention_ms = 1", tools);
    let gw = start_with_store("sweep_interval_ms = 200", &body).await;
    let alice = tasks_client(&gw, "alice", "acme");
    let bob = tasks_client(&gw, "bob", "other");

    let created = create_task(&alice, "sleep", json!({"ms": 50})).await;
    let id = task_id(&created);
    assert_eq!(created["ttlMs"], 1500, "{created}");
    // Never expired early: readable right after creation.
    let first = ok_result(&tasks_get(&alice, &id).await);
    assert_eq!(first["taskId"], id.as_str());

    // Poll until it is gone; it must complete first, and every successful read
    // advertises at least the configured ttl.
    let mut completed = false;
    let err = loop {
        let v = msg(&tasks_get(&alice, &id).await);
        if let Some(e) = v.get("error") {
            break e.clone();
        }
        let r = &v["result"];
        assert!(r["ttlMs"].as_u64().is_some_and(|t| t >= 1500), "{r}");
        if r["status"] == "completed" {
            assert_eq!(first_text(&r["result"]), "slept 50 ms");
            completed = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        completed,
        "the task expired before it was ever seen completed"
    );
    assert_eq!(err["code"], -32602, "{err}");
    assert_eq!(err["message"], "task expired", "{err}");

    // A stranger sees exactly "not found".
    let (_, body_f, v_f) = probe(&bob, "tasks/get", &id).await;
    let (_, body_u, _) = probe(&bob, "tasks/get", &never_issued_id()).await;
    assert_eq!(v_f["error"]["message"], "task not found", "{v_f}");
    assert_eq!(body_f, body_u);

    // After the sweeper removed the record, the owner's tombstone still says expired.
    assert!(
        gw.proc
            .wait_log("expired tasks swept", Duration::from_secs(30))
            .await
            .is_some(),
        "sweeper never ran:\n{}",
        gw.proc.log_text()
    );
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let (_, _, v) = probe(&alice, method, &id).await;
        assert_eq!(v["error"]["code"], -32602, "{method}: {v}");
        assert_eq!(v["error"]["message"], "task expired", "{method}: {v}");
        let (_, body_f, v_f) = probe(&bob, method, &id).await;
        let (_, body_u, _) = probe(&bob, method, &never_issued_id()).await;
        assert_eq!(v_f["error"]["message"], "task not found", "{method}: {v_f}");
        assert_eq!(body_f, body_u, "{method}");
    }
    // A listen by the owner does not acknowledge an expired task.
    let mut l = SseStream::listen(&alice, json!("exp"), json!({"taskIds": [id.clone()]})).await;
    let ack = l.next(Duration::from_secs(10)).await.expect("ack");
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([]),
        "{ack}"
    );
}

// ---------------------------------------------------------------------------------
// Isolation fuzz: colliding principals, every method on every foreign id, header
// tricks
// ---------------------------------------------------------------------------------

/// `(tenant, subject)` pairs whose names collide once joined by a separator (`:`,
/// `/`, NUL), differ only in case, a trailing NUL or a combining accent.
const COLLIDING: [(&str, &str); 10] = [
    ("a", "b:c"),
    ("a:b", "c"),
    ("a", "b\u{0}c"),
    ("a\u{0}b", "c"),
    ("a/b", "c"),
    ("a", "b/c"),
    ("acme", "alice"),
    ("acme", "Alice"),
    ("acme\u{0}", "alice"),
    ("acme", "alic\u{0065}\u{0301}"),
];

fn fuzz_client(gw: &Gateway, (tenant, sub): (&str, &str)) -> Client2026 {
    tasks_client(gw, sub, tenant)
}

/// `=?base64?…?=`: how a header carries a value that is not plain visible ASCII.
fn b64_header(v: &str) -> String {
    use base64::Engine as _;
    format!(
        "=?base64?{}?=",
        base64::engine::general_purpose::STANDARD.encode(v)
    )
}

/// One probe: a method, the params' `taskId` (or none), the `Mcp-Name` header
/// values (none, one or several), and whether the body is written by hand with the
/// id's `_` as the JSON escape `\u005f`.
struct Probe {
    what: &'static str,
    method: &'static str,
    body_id: Option<String>,
    names: Vec<String>,
    escaped: bool,
}

/// Every probe of a stranger on `target`, whose own task is `own`. Building the same
/// list for a never-issued id gives the reply every one of them must equal.
fn probes(target: &str, own: &str) -> Vec<Probe> {
    let p = |what, method, body_id: Option<&str>, names: Vec<String>| Probe {
        what,
        method,
        body_id: body_id.map(str::to_string),
        names,
        escaped: false,
    };
    let t = target.to_string();
    let mut v = Vec::new();
    for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
        v.push(p("plain", method, Some(target), vec![t.clone()]));
        // Header names the caller's own task, body the foreign one, and back.
        v.push(p(
            "header own, body foreign",
            method,
            Some(target),
            vec![own.into()],
        ));
        v.push(p(
            "header foreign, body own",
            method,
            Some(own),
            vec![t.clone()],
        ));
        v.push(p(
            "header foreign, no body id",
            method,
            None,
            vec![t.clone()],
        ));
        v.push(p(
            "base64 header",
            method,
            Some(target),
            vec![b64_header(target)],
        ));
        v.push(p(
            "repeated header",
            method,
            Some(target),
            vec![t.clone(), t.clone()],
        ));
        v.push(p(
            "repeated header, own first",
            method,
            Some(target),
            vec![own.into(), t.clone()],
        ));
        let nul = format!("{target}\u{0}");
        v.push(p(
            "trailing NUL",
            method,
            Some(&nul),
            vec![b64_header(&nul)],
        ));
        v.push(Probe {
            what: "escaped body id",
            method,
            body_id: Some(t.clone()),
            names: vec![t.clone()],
            escaped: true,
        });
    }
    v
}

/// `(status, content-type, body)` of one probe.
async fn send_probe(c: &Client2026, p: &Probe) -> (u16, Option<String>, String) {
    let mut params = json!({});
    if let Some(id) = &p.body_id {
        params["taskId"] = json!(id);
    }
    if p.method == "tasks/update" {
        params["inputResponses"] =
            json!({"elicitation-1": {"action": "accept", "content": {"answer": "pwned"}}});
    }
    let mut h: Vec<(&str, String)> = c
        .headers(p.method, &json!({}))
        .into_iter()
        .filter(|(k, _)| *k != "mcp-name")
        .collect();
    for n in &p.names {
        h.push(("mcp-name", n.clone()));
    }
    let mut body = c.body(json!(1), p.method, &params).to_string();
    if p.escaped
        && let Some(id) = &p.body_id
    {
        body = body.replace(id.as_str(), &id.replacen('_', "\\u005f", 1));
    }
    let r = raw(&c.url, "POST", &h, Bytes::from(body))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", p.what));
    (
        r.status,
        r.header("content-type"),
        String::from_utf8_lossy(&r.body).into_owned(),
    )
}

/// The first event of a `subscriptions/listen` for `ids`, as JSON text.
async fn listen_ack(c: &Client2026, ids: &[&str]) -> String {
    let mut l = SseStream::listen(c, json!("fuzz"), json!({"taskIds": ids})).await;
    assert_eq!(l.status, 200);
    l.next(Duration::from_secs(10))
        .await
        .expect("listen ack")
        .to_string()
}

/// Every owner's view of each of its tasks, byte for byte.
async fn owner_views(gw: &Gateway, owned: &[(usize, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (who, id) in owned {
        let c = fuzz_client(gw, COLLIDING[*who]);
        let r = tasks_get(&c, id).await;
        assert_eq!(r.status, 200);
        out.push(String::from_utf8_lossy(&r.body).into_owned());
    }
    out
}

/// Several tenants × subjects with colliding names: each owns a working, an
/// input-required and a terminal task plus a keyed one (the same Idempotency-Key and
/// arguments for everyone). Every stranger sends every task method (with header/body
/// tricks) and `subscriptions/listen` on every foreign id; each reply must be
/// byte-identical to the reply for a never-issued id (the id substituted where a reply
/// embeds it), and no owner's view may change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_fuzz_colliding_principals_and_header_tricks() {
    let (_up, url) = start_demo_http().await;
    // A fixed pollIntervalMs (floor = ceiling), so views differ only if state does.
    let body = format!(
        "{}[tasks]\npoll_interval_ms = 5000\nmax_poll_interval_ms = 5000\n\
         [limits]\npoll_burst = 100000\n{}",
        jwt_auth(),
        http_upstream(
            "demo",
            "/mcp",
            &url,
            "max_concurrency = 64\n[upstream.tools.sleep]\npromote_after_ms = 0\n\
             [upstream.tools.elicit]\npromote_after_ms = 0\n"
        )
    );
    let gw = start_ready(&body).await;

    let mut owned: Vec<(usize, String)> = Vec::new();
    let mut terminal: Vec<String> = Vec::new();
    let mut elicits: Vec<String> = Vec::new();
    for (i, who) in COLLIDING.iter().enumerate() {
        let c = fuzz_client(&gw, *who);
        let working = task_id(&create_task(&c, "sleep", json!({"ms": 120_000})).await);
        let elicit = task_id(&create_task(&c, "elicit", json!({})).await);
        let done = task_id(&create_task(&c, "sleep", json!({"ms": 120_000})).await);
        if i % 2 == 0 {
            ok_result(&tasks_cancel(&c, &done).await);
        } else {
            let quick = task_id(&create_task(&c, "sleep", json!({"ms": 10})).await);
            terminal.push(quick.clone());
            owned.push((i, quick));
            ok_result(&tasks_cancel(&c, &done).await);
        }
        // The same key and arguments for every principal: each gets its own task.
        let params = json!({"name": "sleep", "arguments": {"ms": 120_000}});
        let mut h = c.headers("tools/call", &params);
        h.push(("idempotency-key", "same-key-for-all".into()));
        let r = raw(
            &c.url,
            "POST",
            &h,
            Bytes::from(c.body(json!(1), "tools/call", &params).to_string()),
        )
        .await
        .unwrap();
        let v = msg(&r);
        assert_eq!(
            v["result"]["resultType"], "task",
            "{who:?}: a keyed call collided with another principal's key: {v}"
        );
        let keyed = task_id(&v["result"]);
        assert!(
            !owned.iter().any(|(_, t)| *t == keyed),
            "{who:?} was handed another principal's task {keyed}"
        );
        terminal.push(done.clone());
        elicits.push(elicit.clone());
        owned.extend([(i, working), (i, elicit), (i, done), (i, keyed)]);
    }
    // Settle: the elicitations are waiting for input, the terminal tasks terminal.
    for (who, id) in &owned {
        let c = fuzz_client(&gw, COLLIDING[*who]);
        if elicits.contains(id) {
            poll_until(&c, id, Duration::from_secs(30), |r| {
                r["status"] == "input_required"
            })
            .await;
        } else if terminal.contains(id) {
            poll_terminal(&c, id).await;
        }
    }
    let before = owner_views(&gw, &owned).await;

    // Every stranger probes every foreign id, concurrently per stranger.
    let counts = futures_util::future::join_all((0..COLLIDING.len()).map(|s| {
        let gw = &gw;
        let owned = &owned;
        async move {
            let c = fuzz_client(gw, COLLIDING[s]);
            let own = owned.iter().find(|(w, _)| *w == s).unwrap().1.clone();
            let unknown = never_issued_id();
            let mut expected = Vec::new();
            for p in probes(&unknown, &own) {
                expected.push(send_probe(&c, &p).await);
            }
            let listen_expected = listen_ack(&c, &[&unknown]).await;
            let listen_own_expected = listen_ack(&c, &[&own, &unknown]).await;
            let mut n = 0;
            for (w, target) in owned.iter().filter(|(w, _)| *w != s) {
                let ctx = format!("{:?} on {:?}'s {target}", COLLIDING[s], COLLIDING[*w]);
                for (p, (st, ct, body)) in probes(target, &own).iter().zip(&expected) {
                    let (st_f, ct_f, body_f) = send_probe(&c, p).await;
                    let want = body.replace(&unknown, target);
                    assert_eq!(
                        (st_f, &ct_f, &body_f),
                        (*st, ct, &want),
                        "{ctx}: {} {}: the reply differs from a never-issued id's",
                        p.method,
                        p.what
                    );
                    assert!(!body_f.contains("\"result\""), "{ctx}: {body_f}");
                    n += 1;
                }
                assert_eq!(listen_ack(&c, &[target]).await, listen_expected, "{ctx}");
                assert_eq!(
                    listen_ack(&c, &[&own, target]).await,
                    listen_own_expected,
                    "{ctx}"
                );
                n += 2;
            }
            n
        }
    }))
    .await;

    let after = owner_views(&gw, &owned).await;
    for (((who, id), b), a) in owned.iter().zip(&before).zip(&after) {
        assert_eq!(b, a, "{:?}'s view of {id} changed", COLLIDING[*who]);
    }
    let probes: usize = counts.iter().sum();
    eprintln!(
        "isolation fuzz: {} principals, {} tasks, {probes} foreign probes, 0 leaks",
        COLLIDING.len(),
        owned.len()
    );
}

/// `isolation = "principal"` gives each `(tenant, subject)` its own upstream child,
/// however their names would join: the demo's `counter` is per process, so a shared
/// child would count on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_isolation_keeps_colliding_principals_apart() {
    let body = format!(
        "{}{}{}",
        jwt_auth(),
        tasks_section(""),
        stdio_upstream_bare("isolation = \"principal\"\nmax_concurrency = 1\n")
    );
    let gw = start_ready(&body).await;
    let count = |who: (&'static str, &'static str)| {
        let c = plain_client(&gw, who.1, who.0, json!({}));
        async move {
            let r = c.call_tool("counter", json!({"key": "scope"})).await;
            first_text(&ok_result(&r))
        }
    };
    // Control: the same principal twice shares its child.
    assert_eq!(count(("acme", "alice")).await, "count=1");
    assert_eq!(count(("acme", "alice")).await, "count=2");
    for pair in COLLIDING[..6].chunks(2) {
        for who in pair {
            assert_eq!(
                count(*who).await,
                "count=1",
                "{who:?} shares an upstream child with another principal"
            );
        }
    }
}
