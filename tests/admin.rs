//! The operator API on `metrics_listen` (docs/design.md §24): who may call it, lists
//! by tenant and status with pages and filters, show, an operator's cancel that
//! reaches the upstream, per-tenant counts, and drain/undrain.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";

async fn admin(url: &str, method: &str, token: Option<&str>) -> (u16, Value) {
    let headers: Vec<(&str, String)> = token
        .map(|t| vec![("authorization", format!("Bearer {t}"))])
        .unwrap_or_default();
    let r = raw(url, method, &headers, Bytes::new()).await.unwrap();
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

/// Start a promoted `sleep` for `sub@tenant`; its task id.
async fn slow_task(gw: &Gateway, sub: &str, tenant: &str) -> String {
    let c = Client2026::new(gw, "/mcp", Some(token(sub, tenant)))
        .with_caps(json!({"extensions": {TASKS: {}}}));
    let r = c.call_tool("sleep", json!({"ms": 60000})).await;
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {:?}", r.json()))
        .to_string()
}

fn ids(v: &Value) -> Vec<String> {
    v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_api_lists_shows_cancels_and_drains() {
    let port = free_port();
    let s = DemoSetup::start_full(
        Transport::Http,
        &format!("metrics_listen = \"127.0.0.1:{port}\""),
        "",
        "max_concurrency = 16\n[upstream.tools.sleep]\npromote_after_ms = 0\n",
    )
    .await;
    s.gw.wait_ready().await;
    let ops = |p: &str| format!("http://127.0.0.1:{port}/admin{p}");
    let root = admin_token("taskgate:admin");

    // Who may call: an admin token on the operations listener, nobody else.
    assert_eq!(admin(&ops("/tenants"), "GET", None).await.0, 401);
    let alice = token("alice", "acme");
    assert_eq!(admin(&ops("/tenants"), "GET", Some(&alice)).await.0, 403);
    let other_scope = admin_token("taskgate:read");
    assert_eq!(
        admin(&ops("/tenants"), "GET", Some(&other_scope)).await.0,
        403
    );
    let (st, _) = admin(&s.gw.url("/admin/tenants"), "GET", Some(&root)).await;
    assert_ne!(st, 200, "never on the client listener");
    assert_eq!(admin(&ops("/tenants"), "GET", Some(&root)).await.0, 200);

    let mine: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(slow_task(&s.gw, "alice", "acme").await);
            // Distinct creation times keep the expected order simple.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        v
    };
    let theirs = slow_task(&s.gw, "bob", "globex").await;

    // A tenant's list, paged: every task once, in creation order.
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => ops(&format!("/tasks?tenant=acme&limit=2&cursor={c}")),
            None => ops("/tasks?tenant=acme&limit=2"),
        };
        let (st, page) = admin(&url, "GET", Some(&root)).await;
        assert_eq!(st, 200, "{page}");
        walked.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(walked, mine);
    // Metadata only: never the arguments or a result.
    let (_, page) = admin(&ops("/tasks?tenant=acme&limit=1"), "GET", Some(&root)).await;
    let first = &page["tasks"][0];
    assert_eq!(first["tool"], "sleep");
    assert_eq!(first["subject"], "alice");
    assert_eq!(first["status"], "working");
    for never in ["arguments", "result", "error", "input_requests"] {
        assert!(first.get(never).is_none(), "{first}");
    }
    // Filters: status by the index; tool and age within the page, said so.
    let (_, p) = admin(
        &ops("/tasks?tenant=acme&status=completed"),
        "GET",
        Some(&root),
    )
    .await;
    assert!(ids(&p).is_empty(), "{p}");
    let (_, p) = admin(&ops("/tasks?tenant=acme&tool=echo"), "GET", Some(&root)).await;
    assert!(ids(&p).is_empty(), "{p}");
    assert_eq!(p["filtered_within_page"], json!(["tool"]));
    let (_, p) = admin(
        &ops("/tasks?tenant=acme&min_age_ms=3600000"),
        "GET",
        Some(&root),
    )
    .await;
    assert!(ids(&p).is_empty(), "{p}");
    let (_, p) = admin(&ops("/tasks?tenant=globex"), "GET", Some(&root)).await;
    assert_eq!(ids(&p), std::slice::from_ref(&theirs));
    // Bad requests say what is wrong.
    for bad in [
        "/tasks",
        "/tasks?tenant=acme&status=stuck",
        "/tasks?tenant=acme&limit=0",
        "/tasks?tenant=acme&cursor=%%%",
        "/tasks?tenant=acme&colour=red",
    ] {
        let (st, v) = admin(&ops(bad), "GET", Some(&root)).await;
        assert_eq!(st, 400, "{bad}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }

    // Show, and an operator's cancel that reaches the upstream.
    let (st, shown) = admin(&ops(&format!("/tasks/{theirs}")), "GET", Some(&root)).await;
    assert_eq!(st, 200);
    assert_eq!(shown["task"]["tenant"], "globex");
    assert_eq!(
        admin(&ops("/tasks/tsk_nope"), "GET", Some(&root)).await.0,
        404
    );
    let bob = Client2026::new(&s.gw, "/mcp", Some(token("bob", "globex")));
    let before = demo_stats(&bob).await["cancelled"].as_u64().unwrap_or(0);
    let (st, cancelled) = admin(
        &ops(&format!("/tasks/{theirs}/cancel")),
        "POST",
        Some(&root),
    )
    .await;
    assert_eq!(st, 200, "{cancelled}");
    assert_eq!(cancelled["task"]["status"], "cancelled");
    assert_eq!(
        cancelled["task"]["status_message"],
        "cancelled by operator ops/ops-jane"
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            s.gw.proc.log_text().contains("operator cancelled a task")
        })
        .await,
        "audited"
    );
    let mut reached = false;
    for _ in 0..100 {
        if demo_stats(&bob).await["cancelled"].as_u64().unwrap_or(0) > before {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reached, "the upstream saw the cancel");
    // The owner sees the operator's cancel.
    let owner = bob.with_caps(json!({"extensions": {TASKS: {}}}));
    let got = owner.request("tasks/get", json!({"taskId": theirs})).await;
    assert_eq!(got.json()["result"]["status"], "cancelled", "{got:?}");

    // Per-tenant counts.
    let (_, t) = admin(&ops("/tenants"), "GET", Some(&root)).await;
    let tenants = t["tenants"].as_array().unwrap();
    let of = |name: &str| tenants.iter().find(|x| x["tenant"] == name).cloned();
    assert_eq!(of("acme").unwrap()["tasks"]["working"], 5, "{t}");
    assert_eq!(of("globex").unwrap()["tasks"]["cancelled"], 1, "{t}");

    // The CLI: the same API, as a table or JSON; a refusal is a failed command.
    let cli = |args: &[&str], token: Option<&str>| {
        let mut cmd = std::process::Command::new(bin());
        cmd.arg("admin")
            .arg("--url")
            .arg(format!("http://127.0.0.1:{port}"));
        cmd.env_remove("TASKGATE_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("TASKGATE_ADMIN_TOKEN", t);
        }
        cmd.args(args).output().unwrap()
    };
    let out = cli(
        &["tasks", "list", "--tenant", "acme", "--limit", "3"],
        Some(&root),
    );
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STATUS"),
        "{table}"
    );
    for (line, id) in lines[1..4].iter().zip(&mine) {
        assert!(
            line.starts_with(id.as_str()) && line.contains("working"),
            "{table}"
        );
    }
    assert!(lines[4].starts_with("next page: --cursor "), "{table}");
    let out = cli(&["--json", "tenants"], Some(&root));
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["tenants"].is_array(), "{v}");
    let out = cli(&["tasks", "show", &theirs], Some(&root));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("cancelled"),
        "{out:?}"
    );
    let out = cli(&["tenants"], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );

    // Drain: no new calls (503, marked as never processed), the task plane still
    // served, the probes say not ready; undrain restores.
    let (st, d) = admin(&ops("/drain"), "POST", Some(&root)).await;
    assert_eq!((st, d["drained"].clone()), (200, json!(true)));
    let c = s.client();
    let r = c.call_tool("echo", json!({"text": "x"})).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("taskgate-not-sent").as_deref(), Some("draining"));
    let poll = c
        .with_caps(json!({"extensions": {TASKS: {}}}))
        .request("tasks/get", json!({"taskId": mine[0]}))
        .await;
    assert_eq!(poll.status, 200, "{poll:?}");
    assert_eq!(admin(&s.gw.url("/livez"), "GET", None).await.0, 503);
    assert_eq!(admin(&s.gw.url("/readyz"), "GET", None).await.0, 503);
    let (st, d) = admin(&ops("/undrain"), "POST", Some(&root)).await;
    assert_eq!((st, d["drained"].clone()), (200, json!(false)));
    let r = s.client().call_tool("echo", json!({"text": "x"})).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(admin(&s.gw.url("/livez"), "GET", None).await.0, 200);
    // Drain needs the admin token too.
    assert_eq!(admin(&ops("/drain"), "POST", Some(&alice)).await.0, 403);
}

/// Without authentication the API answers only on a loopback operations listener.
#[tokio::test]
async fn without_auth_only_a_loopback_listener_serves_it() {
    let port = free_port();
    let gw = Gateway::start_with_server(
        &format!("metrics_listen = \"127.0.0.1:{port}\""),
        &format!("{}{}", no_auth(), demo_stdio_upstream("")),
    )
    .await;
    let url = format!("http://127.0.0.1:{port}/admin/tenants");
    let (st, v) = admin(&url, "GET", None).await;
    assert_eq!(st, 200, "{v}");
    drop(gw);
    let port = free_port();
    let gw = Gateway::start_with_server(
        &format!("metrics_listen = \"0.0.0.0:{port}\""),
        &format!("{}{}", no_auth(), demo_stdio_upstream("")),
    )
    .await;
    let url = format!("http://127.0.0.1:{port}/admin/tenants");
    let (st, v) = admin(&url, "GET", None).await;
    assert_eq!(st, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("loopback"), "{v}");
    drop(gw);
}
