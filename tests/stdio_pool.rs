//! The stdio pool through the real binary (README "Stdio pools"): one tenant whose
//! calls keep killing children cannot starve another on the shared pool; a fast call
//! after start-up and after child crashes is answered inline (no cold start, no
//! backoff escalation); `stdio_processes = 1` keeps exactly one child; spares stay
//! inside their isolation scope.
//!
//! Every wait polls with a generous bound; nothing else asserts timings.

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// Longest a well-behaved call may take while a neighbour crash-loops. Generous:
/// before the pool rules it took 12-29 s; a healthy pool answers in milliseconds.
const CALL_BOUND: Duration = Duration::from_secs(10);

fn tasks_caps() -> Value {
    json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
}

/// Live direct children of `pid` (the gateway's stdio children).
fn children_of(pid: u32) -> BTreeSet<u32> {
    child_processes(pid).into_iter().map(|(p, _)| p).collect()
}

async fn echo(c: &Client2026, text: &str) -> Resp {
    c.call_tool("echo", json!({"text": text})).await
}

/// An echo answered inline with its text, within [`CALL_BOUND`].
async fn echo_inline(c: &Client2026, text: &str) {
    let r = tokio::time::timeout(CALL_BOUND, echo(c, text))
        .await
        .unwrap_or_else(|_| panic!("echo {text:?} took longer than {CALL_BOUND:?}"));
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    assert_ne!(
        v["result"]["resultType"], "task",
        "a fast call was promoted to a task (it waited for a child): {v}"
    );
    assert_eq!(first_text(&v["result"]), text, "{v}");
}

fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_tenant_does_not_starve_a_well_behaved_one() {
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_auth(),
        stdio_upstream_bare("max_concurrency = 8\n")
    ))
    .await;
    gw.wait_ready().await;
    let crashes = Arc::new(AtomicU64::new(0));
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let c = Client2026::new(&gw, "/mcp", Some(token("bob", "noisy")));
            let crashes = crashes.clone();
            tokio::spawn(async move {
                loop {
                    let r = c.call_tool("crash", json!({})).await;
                    assert_eq!(r.status, 200, "{:?}", r.json());
                    crashes.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    let a = Client2026::new(&gw, "/mcp", Some(token("alice", "quiet")));
    let start = Instant::now();
    let mut served = 0;
    while start.elapsed() < Duration::from_secs(8) {
        echo_inline(&a, &format!("a-{served}")).await;
        served += 1;
    }
    // Throttled crash calls wait seconds each; dropping them is a client disconnect.
    for l in &loops {
        assert!(!l.is_finished(), "a crash loop failed");
        l.abort();
    }
    assert!(
        crashes.load(Ordering::SeqCst) >= 4,
        "the noisy tenant never crashed a child"
    );
    let r = raw(&gw.url("/metrics"), "GET", &[], bytes::Bytes::new())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&r.body);
    assert!(
        metric(
            &text,
            "taskgate_stdio_throttled_calls_total",
            "tool=\"crash\""
        ) > 0.0,
        "the crash loop was never throttled:\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            "taskgate_stdio_throttled_calls_total",
            "tool=\"echo\""
        ),
        0.0
    );
    eprintln!("quiet tenant: {served} calls served while the noisy one crash-looped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_call_after_start_up_and_after_crashes_is_answered_inline() {
    // promote_after_ms is well above the 750 ms settle window: a call is promoted only
    // if it waited for a child to start (or for a restart backoff).
    let gw = Gateway::start(&format!(
        "{}[tasks]\npromote_after_ms = 3000\n{}",
        jwt_auth(),
        stdio_upstream_bare("max_concurrency = 4\n")
    ))
    .await;
    gw.wait_ready().await;
    let a = Client2026::new(&gw, "/mcp", Some(token("alice", "acme"))).with_caps(tasks_caps());
    echo_inline(&a, "first").await;
    // Seven crashes in a row: with a backoff that doubled per crash (100 ms … 5 s) the
    // later calls would wait seconds for the restarted child. Each crash comes from
    // another tenant so that no throttle is involved.
    for i in 0..7 {
        let b = Client2026::new(&gw, "/mcp", Some(token("bob", &format!("crasher-{i}"))));
        let r = b.call_tool("crash", json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.json());
        assert!(
            r.json()["error"].is_object(),
            "crash answered {:?}",
            r.json()
        );
        echo_inline(&a, &format!("after crash {i}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_process_pool_keeps_exactly_one_child() {
    // stdio_spares = 1 is accepted and forced to 0: the one child is the pool.
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_auth(),
        stdio_upstream_bare("max_concurrency = 4\nstdio_processes = 1\nstdio_spares = 1\n")
    ))
    .await;
    gw.wait_ready().await;
    let a = Client2026::new(&gw, "/mcp", Some(token("alice", "acme")));
    let mut most = 0;
    let mut sample = || {
        let n = children_of(gw.pid()).len();
        most = most.max(n);
    };
    for i in 0..5 {
        let r = echo(&a, &format!("{i}")).await;
        assert_eq!(r.status, 200);
        sample();
    }
    let r = a.call_tool("crash", json!({})).await;
    assert_eq!(r.status, 200);
    for i in 0..20 {
        let r = echo(&a, &format!("again {i}")).await;
        assert_eq!(first_text(&r.json()["result"]), format!("again {i}"));
        sample();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(most, 1, "a one-process pool ran {most} children at once");
    assert_eq!(children_of(gw.pid()).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spares_stay_inside_their_isolation_scope() {
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_auth(),
        stdio_upstream_bare("max_concurrency = 4\nisolation = \"tenant\"\n")
    ))
    .await;
    gw.wait_ready().await;
    let mut served: Vec<BTreeSet<u64>> = Vec::new();
    for tenant in ["x", "y", "x:y"] {
        let c = Client2026::new(&gw, "/mcp", Some(token("same-subject", tenant)));
        let mut pids = BTreeSet::new();
        for _ in 0..3 {
            // Concurrent calls spread over the scope's children, spares included.
            let calls: Vec<_> = (0..3)
                .map(|_| {
                    let c = Client2026::new(&gw, "/mcp", c.token.clone());
                    tokio::spawn(async move { demo_stats(&c).await["pid"].as_u64() })
                })
                .collect();
            for h in calls {
                pids.insert(h.await.unwrap().expect("stats carry the child's pid"));
            }
        }
        served.push(pids);
    }
    let boot: BTreeSet<u32> = children_of(gw.pid());
    for (i, a) in served.iter().enumerate() {
        for b in &served[i + 1..] {
            assert!(
                a.is_disjoint(b),
                "two tenant scopes shared a child: {a:?} / {b:?}"
            );
        }
        for p in a {
            assert!(
                boot.contains(&(*p as u32)),
                "pid {p} is not a gateway child"
            );
        }
    }
}
