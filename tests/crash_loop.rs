//! Crash loop (README "Durability", "Stdio children and pid records"): rounds of mixed
//! task load — creations (slow `sleep` calls promoted to tasks at the deadline,
//! `elicit` tasks, keyed calls), polls, input answers and cancels from three owners —
//! each ended by a SIGKILL of the gateway at a random moment and a restart on the same
//! store. Over the whole run:
//!
//! * every handle ever returned resolves for its owner (never "not found");
//! * after a restart no task from before the kill is still `working` or
//!   `input_required` (recovery runs before the listener serves);
//! * a terminal state, once seen, never changes (status, result, error);
//! * an acknowledged cancel leaves the task terminal for good;
//! * a keyed call repeated after a restart returns its original task;
//! * no stdio child outlives the gateway that spawned it (each child's pid, with its
//!   start time, is gone within a generous polled bound after the SIGKILL, before the
//!   next gateway could clean up leftovers);
//! * after the last restart, new tasks still complete within their bound;
//! * a task following an upstream's own 2025-11-25 task over HTTP (docs/design.md §25)
//!   is re-attached by every restart, never failed: each one handed out completes with
//!   its own result (`upstream_tasks_survive_the_crash_loop`).
//!
//! Knobs: `TASKGATE_CHAOS_ROUNDS` (default 10) for long runs, `TASKGATE_CHAOS_SEED` to
//! replay a run's choices (the seed is printed first and in every failure; the kill
//! moments are replayed, the machine's scheduling is not). Runs once per store backend
//! (`per_backend!` in tests/common).

#[macro_use]
#[allow(unused_macros)]
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

per_backend!(
    crash_loop,
    terminal_state_seen_right_before_a_kill_survives_it,
    upstream_tasks_survive_the_crash_loop
);

const TASKS: &str = "io.modelcontextprotocol/tasks";
const OWNERS: [(&str, &str); 3] = [("alice", "acme"), ("bob", "acme"), ("carol", "globex")];
/// Concurrent load workers per round.
const WORKERS: u64 = 4;
/// `promote_after_ms` of `sleep`: shorter sleeps answer inline, longer ones become
/// tasks at the deadline.
const PROMOTE_AFTER_MS: u64 = 150;

fn rounds() -> usize {
    std::env::var("TASKGATE_CHAOS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

fn seed() -> u64 {
    std::env::var("TASKGATE_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

#[derive(Clone, Debug)]
enum Kind {
    Sleep,
    Elicit,
    /// A call with an `Idempotency-Key`: repeating it returns the same task.
    Keyed {
        key: String,
        ms: u64,
    },
}

#[derive(Debug)]
struct Handle {
    owner: usize,
    kind: Kind,
    round: usize,
    /// `(status, result, error)` of the first terminal snapshot seen, and when it was
    /// recorded. A read sent before that may still say `working` (workers record their
    /// answers in the order they get the ledger, not the order the gateway served them).
    terminal: Option<(Value, Instant)>,
    last_status: String,
    /// When the cancel's acknowledgement arrived. A read sent before it may still
    /// say `working`; only reads sent after it must not.
    cancel_acked: Option<Instant>,
}

#[derive(Default)]
struct Counts {
    inline: u64,
    polls: u64,
    updates: u64,
    cancels: u64,
    keyed_repeats: u64,
    /// Handles a 2025-11-25 client created (docs/design.md §25).
    legacy_tasks: u64,
    transport_errors: u64,
    children_checked: u64,
    lost: u64,
}

#[derive(Default)]
struct Ledger {
    handles: BTreeMap<String, Handle>,
    violations: Vec<String>,
    n: Counts,
}

impl Ledger {
    fn violation(&mut self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.push(what);
    }

    /// Check one `tasks/get` answer by the owner of `id`, sent at `sent`, against
    /// everything seen.
    fn observe(&mut self, id: &str, round: usize, sent: Instant, v: &Value) {
        let Some(h) = self.handles.get_mut(id) else {
            return;
        };
        let Some(r) = v.get("result") else {
            let what = format!("round {round}: the owner's read of {id} failed: {v}");
            self.n.lost += 1;
            self.violation(what);
            return;
        };
        let status = r["status"].as_str().unwrap_or_default().to_string();
        let view = json!({"status": status, "result": r.get("result"), "error": r.get("error")});
        let mut bad = None;
        match &h.terminal {
            Some((t, _)) if *t == view => {}
            Some((_, at)) if !is_terminal(&status) && sent < *at => return,
            Some((t, _)) => {
                bad = Some(format!(
                    "round {round}: {id} changed after it was terminal: first {t}, now {view}"
                ));
            }
            None if is_terminal(&status) => h.terminal = Some((view, Instant::now())),
            None if h.cancel_acked.is_some_and(|acked| sent > acked) => {
                bad = Some(format!(
                    "round {round}: {id} is {status} after its cancel was acknowledged"
                ));
            }
            None => {}
        }
        h.last_status = status;
        if let Some(b) = bad {
            self.violation(b);
        }
    }
}

fn is_terminal(s: &str) -> bool {
    matches!(s, "completed" | "failed" | "cancelled")
}

fn client(addr: std::net::SocketAddr, owner: usize) -> Client2026 {
    let (sub, tenant) = OWNERS[owner];
    Client2026 {
        url: format!("http://{addr}/mcp"),
        token: Some(token(sub, tenant)),
        caps: json!({"extensions": {TASKS: {}}, "elicitation": {}}),
    }
}

/// One request; `None` when the connection failed (the gateway was killed).
async fn rpc(
    c: &Client2026,
    method: &str,
    params: Value,
    extra: Option<(&'static str, String)>,
) -> Option<Value> {
    let body = c.body(json!(1), method, &params);
    let mut h = c.headers(method, &params);
    h.extend(extra);
    let r = raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .ok()?;
    let v = r.json();
    (!v.is_null()).then_some(v)
}

/// A task-augmented `tools/call` in a fresh 2025-11-25 session, its
/// `CreateTaskResult` given back in the 2026 shape `created` reads; `None` when the
/// gateway was not there to answer.
async fn legacy_task(addr: std::net::SocketAddr, owner: usize, ms: u64) -> Option<Value> {
    let (sub, tenant) = OWNERS[owner];
    let url = format!("http://{addr}/mcp");
    let mut h = vec![
        ("content-type", "application/json".to_string()),
        ("accept", "application/json, text/event-stream".to_string()),
        ("authorization", format!("Bearer {}", token(sub, tenant))),
    ];
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "crash-loop", "version": "1"}}});
    let r = raw(&url, "POST", &h, Bytes::from(init.to_string()))
        .await
        .ok()?;
    let sid = r.header("mcp-session-id")?;
    h.push(("mcp-session-id", sid));
    h.push(("mcp-protocol-version", "2025-11-25".to_string()));
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": ms}, "task": {}}});
    let r = raw(&url, "POST", &h, Bytes::from(call.to_string()))
        .await
        .ok()?;
    let v = r.json();
    if v.is_null() {
        return None;
    }
    let t = &v["result"]["task"];
    Some(match t["taskId"].as_str() {
        Some(id) => json!({"result": {"resultType": "task", "taskId": id, "status": t["status"]}}),
        None => v,
    })
}

struct Shared {
    ledger: Mutex<Ledger>,
    stop: AtomicBool,
    addr: Mutex<std::net::SocketAddr>,
}

impl Shared {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap()
    }
}

/// A random handle, preferring this round's; with `pred` on the handle.
fn pick(
    rng: &mut StdRng,
    l: &Ledger,
    round: usize,
    pred: impl Fn(&Handle) -> bool,
) -> Option<(String, usize)> {
    let fresh = rng.random_bool(0.7);
    let ids: Vec<(&String, &Handle)> = l
        .handles
        .iter()
        .filter(|(_, h)| pred(h) && (!fresh || h.round == round))
        .collect();
    if ids.is_empty() {
        return None;
    }
    let (id, h) = ids[rng.random_range(0..ids.len())];
    Some((id.clone(), h.owner))
}

/// Record the handle of a `tools/call` answer (or count an inline completion).
fn created(s: &Shared, v: &Value, owner: usize, kind: Kind, round: usize) {
    let mut l = s.ledger();
    let r = &v["result"];
    match (r["resultType"].as_str(), r["taskId"].as_str()) {
        (Some("task"), Some(id)) => {
            let status = r["status"].as_str().unwrap_or_default().to_string();
            l.handles.insert(
                id.to_string(),
                Handle {
                    owner,
                    kind,
                    round,
                    terminal: None,
                    last_status: status,
                    cancel_acked: None,
                },
            );
        }
        (Some("complete"), _) => l.n.inline += 1,
        _ => {
            // A refused call (e.g. 503 while the upstream restarts) hands out nothing.
            if v.get("error").is_none() {
                l.violation(format!("round {round}: unexpected tools/call answer: {v}"));
            }
        }
    }
}

async fn worker(s: Arc<Shared>, mut rng: StdRng, round: usize, w: u64) {
    let mut n = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        n += 1;
        let addr = *s.addr.lock().unwrap();
        let op = rng.random_range(0..100);
        let ok = match op {
            // A 2025-11-25 client's task (docs/design.md §25): a task at once, the
            // same record the owner's 2026 reads below check.
            0..=1 => {
                let owner = rng.random_range(0..OWNERS.len());
                let ms = rng.random_range(100..1500);
                match legacy_task(addr, owner, ms).await {
                    Some(v) => {
                        if v["result"]["taskId"].is_string() {
                            s.ledger().n.legacy_tasks += 1;
                        }
                        created(&s, &v, owner, Kind::Sleep, round);
                        true
                    }
                    None => false,
                }
            }
            // Slow calls: inline below the deadline, a task above it.
            2..=5 => {
                let owner = rng.random_range(0..OWNERS.len());
                let ms = if rng.random_bool(0.2) {
                    rng.random_range(10..PROMOTE_AFTER_MS / 2)
                } else {
                    rng.random_range(PROMOTE_AFTER_MS * 2..1500)
                };
                let steps = rng.random_range(1..5);
                let c = client(addr, owner);
                let args = json!({"name": "sleep", "arguments": {"ms": ms, "steps": steps}});
                match rpc(&c, "tools/call", args, None).await {
                    Some(v) => {
                        created(&s, &v, owner, Kind::Sleep, round);
                        true
                    }
                    None => false,
                }
            }
            6..=11 => {
                let owner = rng.random_range(0..OWNERS.len());
                let c = client(addr, owner);
                let args = json!({"name": "elicit", "arguments": {"message": format!("r{round}")}});
                match rpc(&c, "tools/call", args, None).await {
                    Some(v) => {
                        created(&s, &v, owner, Kind::Elicit, round);
                        true
                    }
                    None => false,
                }
            }
            12..=13 => {
                let owner = rng.random_range(0..OWNERS.len());
                let c = client(addr, owner);
                let key = format!("k-{round}-{w}-{n}");
                let ms = rng.random_range(100..3000);
                let args = json!({"name": "sleep", "arguments": {"ms": ms}});
                match rpc(
                    &c,
                    "tools/call",
                    args,
                    Some(("idempotency-key", key.clone())),
                )
                .await
                {
                    Some(v) => {
                        created(&s, &v, owner, Kind::Keyed { key, ms }, round);
                        true
                    }
                    None => false,
                }
            }
            14..=69 => {
                let picked = pick(&mut rng, &s.ledger(), round, |_| true);
                match picked {
                    None => true,
                    Some((id, owner)) => {
                        let c = client(addr, owner);
                        let sent = Instant::now();
                        match rpc(&c, "tasks/get", json!({"taskId": id}), None).await {
                            Some(v) => {
                                let mut l = s.ledger();
                                l.n.polls += 1;
                                l.observe(&id, round, sent, &v);
                                true
                            }
                            None => false,
                        }
                    }
                }
            }
            70..=89 => {
                // Answer an elicitation once its question is out.
                // One known to be waiting first, else any elicitation still running.
                let waiting = pick(&mut rng, &s.ledger(), round, |h| {
                    h.last_status == "input_required"
                });
                let picked = waiting.or_else(|| {
                    pick(&mut rng, &s.ledger(), round, |h| {
                        matches!(h.kind, Kind::Elicit) && !is_terminal(&h.last_status)
                    })
                });
                match picked {
                    None => true,
                    Some((id, owner)) => {
                        let c = client(addr, owner);
                        let sent = Instant::now();
                        match rpc(&c, "tasks/get", json!({"taskId": id}), None).await {
                            None => false,
                            Some(v) => {
                                let asked = v["result"]["status"] == "input_required";
                                {
                                    let mut l = s.ledger();
                                    l.n.polls += 1;
                                    l.observe(&id, round, sent, &v);
                                }
                                if asked {
                                    answer(&s, &c, &id, round).await
                                } else {
                                    true
                                }
                            }
                        }
                    }
                }
            }
            _ => {
                let picked = pick(&mut rng, &s.ledger(), round, |h| {
                    !is_terminal(&h.last_status)
                });
                match picked {
                    None => true,
                    Some((id, owner)) => {
                        let c = client(addr, owner);
                        match rpc(&c, "tasks/cancel", json!({"taskId": id}), None).await {
                            Some(v) => {
                                {
                                    let mut l = s.ledger();
                                    l.n.cancels += 1;
                                    if v.get("result").is_some() {
                                        if let Some(h) = l.handles.get_mut(&id) {
                                            h.cancel_acked = Some(Instant::now());
                                        }
                                    } else {
                                        l.n.lost += 1;
                                        l.violation(format!("round {round}: cancel of {id}: {v}"));
                                    }
                                }
                                // Read it back at once: the acknowledged cancel is what
                                // every later read (and every restart) must keep.
                                let sent = Instant::now();
                                if let Some(v) =
                                    rpc(&c, "tasks/get", json!({"taskId": id}), None).await
                                {
                                    s.ledger().observe(&id, round, sent, &v);
                                }
                                true
                            }
                            None => false,
                        }
                    }
                }
            }
        };
        if !ok {
            s.ledger().n.transport_errors += 1;
            // The gateway is gone (or going): wait for the round to end.
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else {
            // A client's think time: keeps the load inside 2 shared cores.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
        }
    }
}

/// `tasks/update` with the answer to `elicitation-1`, then a read of the task.
async fn answer(s: &Shared, c: &Client2026, id: &str, round: usize) -> bool {
    let answer = json!({"taskId": id, "inputResponses": {"elicitation-1":
        {"action": "accept", "content": {"answer": format!("a{round}")}}}});
    let Some(v) = rpc(c, "tasks/update", answer, None).await else {
        return false;
    };
    {
        let mut l = s.ledger();
        l.n.updates += 1;
        if v.get("result").is_none() {
            l.n.lost += 1;
            l.violation(format!("round {round}: update of {id}: {v}"));
        }
    }
    let sent = Instant::now();
    if let Some(v) = rpc(c, "tasks/get", json!({"taskId": id}), None).await {
        s.ledger().observe(id, round, sent, &v);
    }
    true
}

fn config(b: StoreBackend, dir: &std::path::Path) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n{}{}\
         [tasks]\npromote_after_ms = {PROMOTE_AFTER_MS}\npoll_interval_ms = 50\n\
         [limits]\npoll_burst = 100000\n\
         {}[upstream.tools.elicit]\npromote_after_ms = 0\n",
        b.store_section(dir, ""),
        jwt_auth(),
        stdio_upstream_bare("max_concurrency = 6\n"),
    )
}

/// Read every handle as its owner; after a restart all of them must be terminal.
async fn verify_all(s: &Shared, round: usize, after_restart: bool) {
    let addr = *s.addr.lock().unwrap();
    let all: Vec<(String, usize)> = s
        .ledger()
        .handles
        .iter()
        .map(|(id, h)| (id.clone(), h.owner))
        .collect();
    for (id, owner) in all {
        let c = client(addr, owner);
        let sent = Instant::now();
        let Some(v) = rpc(&c, "tasks/get", json!({"taskId": id}), None).await else {
            panic!("round {round}: the restarted gateway did not answer");
        };
        let mut l = s.ledger();
        l.n.polls += 1;
        l.observe(&id, round, sent, &v);
        let st = l.handles[&id].last_status.clone();
        if after_restart && v.get("result").is_some() && !is_terminal(&st) {
            l.violation(format!(
                "round {round}: {id} is still {st} after the restart: {v}"
            ));
        }
    }
}

/// Repeat every keyed call of `round`: the answer names the original task.
async fn repeat_keyed(s: &Shared, round: usize) {
    let addr = *s.addr.lock().unwrap();
    let keyed: Vec<(String, usize, String, u64)> = s
        .ledger()
        .handles
        .iter()
        .filter(|(_, h)| h.round == round)
        .filter_map(|(id, h)| match &h.kind {
            Kind::Keyed { key, ms } => Some((id.clone(), h.owner, key.clone(), *ms)),
            _ => None,
        })
        .collect();
    for (id, owner, key, ms) in keyed {
        let c = client(addr, owner);
        let args = json!({"name": "sleep", "arguments": {"ms": ms}});
        let Some(v) = rpc(&c, "tools/call", args, Some(("idempotency-key", key))).await else {
            panic!("round {round}: the restarted gateway did not answer");
        };
        let mut l = s.ledger();
        l.n.keyed_repeats += 1;
        if v["result"]["taskId"].as_str() != Some(id.as_str()) {
            l.violation(format!(
                "round {round}: a repeated keyed call did not return {id}: {v}"
            ));
        }
    }
}

async fn crash_loop(b: StoreBackend) {
    let seed = seed();
    let rounds = rounds();
    eprintln!(
        "crash_loop[{}]: seed {seed} (TASKGATE_CHAOS_SEED={seed} replays it), {rounds} rounds",
        b.name()
    );
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("taskgate.toml");
    write(&config_path, &config(b, dir.path()));
    let mut gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let shared = Arc::new(Shared {
        ledger: Mutex::new(Ledger::default()),
        stop: AtomicBool::new(false),
        addr: Mutex::new(gw.addr),
    });
    let ctx = |what: &str| format!("crash_loop[{}] seed {seed}: {what}", b.name());

    for round in 1..=rounds {
        // Load, then a SIGKILL at a random moment.
        shared.stop.store(false, Ordering::Relaxed);
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let r = StdRng::seed_from_u64(seed ^ ((round as u64) << 20) ^ w);
                tokio::spawn(worker(shared.clone(), r, round, w))
            })
            .collect();
        let kill_after = Duration::from_millis(rng.random_range(300..3000));
        tokio::time::sleep(kill_after).await;
        let children = child_processes(gw.pid());
        assert!(
            !children.is_empty(),
            "{}",
            ctx(&format!("round {round}: the gateway had no stdio child"))
        );
        let Gateway {
            mut proc,
            dir,
            config_path,
            ..
        } = gw;
        proc.kill9();
        shared.stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await.expect("worker panicked");
        }

        // No child outlives its gateway: checked before a new gateway could kill the
        // leftovers itself.
        let gone = eventually(Duration::from_secs(20), || {
            children.iter().all(|(p, st)| !process_alive(*p, *st))
        })
        .await;
        let leaked: Vec<_> = children
            .iter()
            .filter(|(p, st)| process_alive(*p, *st))
            .collect();
        assert!(
            gone,
            "{}",
            ctx(&format!(
                "round {round}: stdio children {leaked:?} outlived their gateway"
            ))
        );
        shared.ledger().n.children_checked += children.len() as u64;
        drop(proc);

        // Restart on the same store.
        gw = Gateway::launch(dir, config_path).await;
        gw.wait_ready().await;
        *shared.addr.lock().unwrap() = gw.addr;
        verify_all(&shared, round, true).await;
        repeat_keyed(&shared, round).await;
        let l = shared.ledger();
        eprintln!(
            "round {round}: killed after {kill_after:?} with {} children; {} handles so far",
            children.len(),
            l.handles.len()
        );
        assert!(l.violations.is_empty(), "{}", ctx(&l.violations.join("\n")));
    }

    // After the last restart, new work still finishes within its bound.
    let c = client(gw.addr, 0);
    let mut fresh = Vec::new();
    for ms in [300u64, 600, 900] {
        let v = rpc(
            &c,
            "tools/call",
            json!({"name": "sleep", "arguments": {"ms": ms}}),
            None,
        )
        .await
        .expect("tools/call");
        assert_eq!(v["result"]["resultType"], "task", "{}", ctx(&v.to_string()));
        fresh.push((v["result"]["taskId"].as_str().unwrap().to_string(), ms));
    }
    let v = rpc(
        &c,
        "tools/call",
        json!({"name": "elicit", "arguments": {}}),
        None,
    )
    .await
    .expect("tools/call");
    let elicit = v["result"]["taskId"].as_str().unwrap().to_string();
    // The answer is taken once the question is out (before that it is ignored).
    let asked = eventually_async(Duration::from_secs(30), || async {
        let v = rpc(&c, "tasks/get", json!({"taskId": elicit}), None).await;
        v.is_some_and(|v| v["result"]["status"] == "input_required")
    })
    .await;
    assert!(asked, "{}", ctx(&format!("{elicit} never asked for input")));
    let answer = json!({"taskId": elicit, "inputResponses": {"elicitation-1":
        {"action": "accept", "content": {"answer": "last"}}}});
    let u = rpc(&c, "tasks/update", answer, None).await.expect("update");
    assert!(u.get("result").is_some(), "{}", ctx(&u.to_string()));
    fresh.push((elicit, 0));
    for (id, ms) in &fresh {
        let bound = Duration::from_millis(*ms) + Duration::from_secs(30);
        let start = Instant::now();
        loop {
            let v = rpc(&c, "tasks/get", json!({"taskId": id}), None)
                .await
                .expect("tasks/get");
            let st = v["result"]["status"].as_str().unwrap_or_default();
            if st == "completed" {
                break;
            }
            assert!(
                !is_terminal(st) && start.elapsed() < bound,
                "{}",
                ctx(&format!("{id} did not complete within {bound:?}: {v}"))
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let l = shared.ledger();
    let by_kind = |f: fn(&Kind) -> bool| l.handles.values().filter(|h| f(&h.kind)).count();
    let terminal = |s: &str| {
        l.handles
            .values()
            .filter(|h| h.terminal.as_ref().is_some_and(|(t, _)| t["status"] == s))
            .count()
    };
    eprintln!(
        "crash_loop[{}]: seed {seed}: {rounds} rounds in {:.1} s; handles {} (sleep {}, elicit {}, \
         keyed {}; of them by 2025-11-25 clients {}), inline completions {}; terminal: completed {}, failed {}, cancelled {}; \
         polls {}, updates {}, cancels {}, keyed repeats {}, transport errors {}; \
         stdio children checked {}, leaked 0; lost {}",
        b.name(),
        started.elapsed().as_secs_f64(),
        l.handles.len(),
        by_kind(|k| matches!(k, Kind::Sleep)),
        by_kind(|k| matches!(k, Kind::Elicit)),
        by_kind(|k| matches!(k, Kind::Keyed { .. })),
        l.n.legacy_tasks,
        l.n.inline,
        terminal("completed"),
        terminal("failed"),
        terminal("cancelled"),
        l.n.polls,
        l.n.updates,
        l.n.cancels,
        l.n.keyed_repeats,
        l.n.transport_errors,
        l.n.children_checked,
        l.n.lost,
    );
    assert!(l.violations.is_empty(), "{}", ctx(&l.violations.join("\n")));
    assert!(
        l.handles.len() >= rounds,
        "{}",
        ctx("the load created almost no tasks: the run proves nothing")
    );
    assert!(
        l.n.legacy_tasks > 0,
        "{}",
        ctx("no 2025-11-25 client created a task: that dialect went untested")
    );
}

/// The narrowest spot of the loop above, made likely: many tasks finish together while
/// each is polled in a tight loop, and the poller that first reads a terminal state
/// SIGKILLs the gateway at once. After the restart that task (and every other one read
/// terminal before the kill) must still say what was read; a terminal state handed out
/// before it was durable comes back as "gateway restarted while the call was in
/// flight".
async fn terminal_state_seen_right_before_a_kill_survives_it(b: StoreBackend) {
    const TASKS_PER_ATTEMPT: usize = 24;
    const ATTEMPTS: usize = 4;
    let demo = DemoHttp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("taskgate.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{}{}\
         [tasks]\npoll_interval_ms = 50\n[limits]\npoll_burst = 100000\n{}",
        b.store_section(dir.path(), ""),
        jwt_auth(),
        demo_http_upstream(
            demo.port,
            "max_concurrency = 64\n[upstream.tools.sleep]\npromote_after_ms = 0\n"
        ),
    );
    write(&config_path, &text);
    let mut gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let mut seen_total = 0;
    for attempt in 1..=ATTEMPTS {
        let c = client(gw.addr, 0);
        let mut ids = Vec::new();
        for _ in 0..TASKS_PER_ATTEMPT {
            let v = rpc(
                &c,
                "tools/call",
                json!({"name": "sleep", "arguments": {"ms": 1500}}),
                None,
            )
            .await
            .expect("tools/call");
            assert_eq!(v["result"]["resultType"], "task", "{v}");
            ids.push(v["result"]["taskId"].as_str().unwrap().to_string());
        }
        let seen: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let pid = gw.pid() as i32;
        let pollers: Vec<_> = ids
            .iter()
            .map(|id| {
                let (c, id, seen) = (client(gw.addr, 0), id.clone(), seen.clone());
                tokio::spawn(async move {
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_secs(60) {
                        let Some(v) = rpc(&c, "tasks/get", json!({"taskId": id}), None).await
                        else {
                            return; // killed
                        };
                        let r = &v["result"];
                        if is_terminal(r["status"].as_str().unwrap_or_default()) {
                            // SAFETY: kill(2) on the gateway this test started.
                            unsafe { libc::kill(pid, libc::SIGKILL) };
                            let view = json!({"status": r["status"], "result": r.get("result"),
                                "error": r.get("error")});
                            seen.lock().unwrap().push((id, view));
                            return;
                        }
                    }
                })
            })
            .collect();
        for p in pollers {
            p.await.unwrap();
        }
        let Gateway {
            mut proc,
            dir,
            config_path,
            ..
        } = gw;
        proc.kill9();
        drop(proc);
        gw = Gateway::launch(dir, config_path).await;
        gw.wait_ready().await;
        let seen = seen.lock().unwrap().clone();
        assert!(
            !seen.is_empty(),
            "attempt {attempt}: no poller read a terminal state"
        );
        seen_total += seen.len();
        let c = client(gw.addr, 0);
        for (id, view) in &seen {
            let v = rpc(&c, "tasks/get", json!({"taskId": id}), None)
                .await
                .expect("tasks/get");
            let r = &v["result"];
            let now = json!({"status": r["status"], "result": r.get("result"),
                "error": r.get("error")});
            assert_eq!(
                &now, view,
                "attempt {attempt}: {id} was read terminal right before the kill and \
                 changed after the restart"
            );
        }
    }
    eprintln!(
        "terminal before kill[{}]: {ATTEMPTS} kills, {seen_total} terminal reads checked",
        b.name()
    );
}

/// Upstream task ids handed out: id → (owner, `ms`, `steps`) of its `task_work` call.
type Handed = BTreeMap<String, (usize, u64, u64)>;

/// The upstream tasks handed out so far, copied out of the lock.
fn snapshot(handed: &Mutex<Handed>) -> Vec<(String, (usize, u64, u64))> {
    let h = handed.lock().unwrap();
    h.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

/// Upstream tasks (docs/design.md §25) under the same SIGKILL rounds: creators keep
/// starting `task_work` tasks on the Python task server (HTTP, which outlives every
/// gateway) while owners poll; each round ends with a SIGKILL at a random moment. Every
/// task id handed out must complete with its own result — re-attached by each restart,
/// never failed, never lost.
async fn upstream_tasks_survive_the_crash_loop(b: StoreBackend) {
    let seed = seed();
    let rounds = rounds().min(6);
    eprintln!(
        "upstream_tasks_survive_the_crash_loop[{}]: seed {seed}, {rounds} rounds",
        b.name()
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let (_py, port) = start_task_server_http().await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("taskgate.toml");
    write(
        &config_path,
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n{}{}\
             [tasks]\npoll_interval_ms = 50\n[limits]\npoll_burst = 100000\n{}",
            b.store_section(dir.path(), ""),
            jwt_auth(),
            http_upstream("py", "/py", &format!("http://127.0.0.1:{port}/mcp"), ""),
        ),
    );
    let mut gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let client = |addr: std::net::SocketAddr, owner: usize| {
        let mut c = client(addr, owner);
        c.url = format!("http://{addr}/py");
        c
    };
    let handed: Arc<Mutex<Handed>> = Default::default();
    let addr = Arc::new(Mutex::new(gw.addr));
    let ctx = |what: &str| format!("upstream crash loop[{}] seed {seed}: {what}", b.name());
    for round in 1..=rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let creators: Vec<_> = (0..2u64)
            .map(|w| {
                let (stop, handed, addr) = (stop.clone(), handed.clone(), addr.clone());
                let mut rng = StdRng::seed_from_u64(seed ^ ((round as u64) << 20) ^ w);
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let owner = rng.random_range(0..OWNERS.len());
                        let (ms, steps) = (rng.random_range(500..3000), rng.random_range(1..4));
                        let a = *addr.lock().unwrap();
                        let args =
                            json!({"name": "task_work", "arguments": {"ms": ms, "steps": steps}});
                        if let Some(v) = rpc(&client(a, owner), "tools/call", args, None).await
                            && let Some(id) = v["result"]["taskId"].as_str()
                        {
                            handed
                                .lock()
                                .unwrap()
                                .insert(id.to_string(), (owner, ms, steps));
                        }
                        tokio::time::sleep(Duration::from_millis(rng.random_range(50..300))).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..2500))).await;
        gw = gw.kill9_and_relaunch().await;
        stop.store(true, Ordering::Relaxed);
        for c in creators {
            c.await.expect("creator panicked");
        }
        *addr.lock().unwrap() = gw.addr;
        // Nothing handed out was failed by the restart.
        let all = snapshot(&handed);
        for (id, (owner, _, _)) in &all {
            let v = rpc(
                &client(gw.addr, *owner),
                "tasks/get",
                json!({"taskId": id}),
                None,
            )
            .await
            .unwrap_or_else(|| panic!("{}", ctx("the restarted gateway did not answer")));
            let st = v["result"]["status"].as_str().unwrap_or_default();
            assert!(
                matches!(st, "working" | "completed"),
                "{}",
                ctx(&format!(
                    "round {round}: {id} is {st} after the restart: {v}\n{}",
                    gw.proc.log_text()
                ))
            );
        }
    }
    // Every task handed out completes with its own result.
    let all = snapshot(&handed);
    assert!(
        all.len() >= rounds,
        "{}",
        ctx("almost no upstream tasks were created")
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    for (id, (owner, ms, steps)) in &all {
        loop {
            let v = rpc(
                &client(gw.addr, *owner),
                "tasks/get",
                json!({"taskId": id}),
                None,
            )
            .await
            .unwrap_or_else(|| panic!("{}", ctx("the gateway did not answer")));
            let t = &v["result"];
            if t["status"] == "completed" {
                assert_eq!(
                    first_text(&t["result"]),
                    format!("task_work done: {ms} ms, {steps} steps"),
                    "{}",
                    ctx(&format!("{id}: {v}"))
                );
                break;
            }
            assert_eq!(
                t["status"],
                "working",
                "{}",
                ctx(&format!("{id}: {v}\n{}", gw.proc.log_text()))
            );
            assert!(
                Instant::now() < deadline,
                "{}",
                ctx(&format!("{id} never completed: {v}"))
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "upstream_tasks_survive_the_crash_loop[{}]: {} upstream tasks across {rounds} SIGKILLs, all completed",
        b.name(),
        all.len()
    );
}
