//! Tests against a real child: a small Python legacy server
//! (`tests/fixtures/stdio_test_server.py`).
//! Every wait polls for a condition with a generous bound; nothing asserts timings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::upstream::InputAnswer;

const SERVER: &str = include_str!("../../../tests/fixtures/stdio_test_server.py");
const BOUND: Duration = Duration::from_secs(30);

struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "taskgate-stdio-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("server.py"), SERVER).unwrap();
        Self { dir }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn pid_dir(&self) -> PathBuf {
        self.dir.join("pids")
    }

    fn pid_files(&self) -> usize {
        std::fs::read_dir(self.pid_dir())
            .map(|d| d.count())
            .unwrap_or(0)
    }

    fn opts(&self, processes: usize) -> StdioOptions {
        let mut env = BTreeMap::new();
        env.insert("TG_LOG".to_string(), self.log_path().display().to_string());
        StdioOptions {
            name: "py".into(),
            program: "python3".into(),
            args: vec![self.dir.join("server.py").display().to_string()],
            env,
            processes,
            spares: 1,
            cancel_grace: Duration::from_millis(10_000),
            idle_reap: Duration::from_millis(600_000),
            max_message_bytes: 1 << 20,
            pid_dir: self.pid_dir(),
            identity: None,
        }
    }

    fn gate(&self) -> String {
        self.dir.join("gate").display().to_string()
    }

    fn open_gate(&self) {
        std::fs::write(self.gate(), b"").unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tool(name: &str, args: Value) -> CallSpec {
    let mut params = Map::new();
    params.insert("name".into(), Value::String(name.into()));
    params.insert("arguments".into(), args);
    CallSpec {
        method: "tools/call".into(),
        tool: Some(name.into()),
        params,
        want_progress: false,
        tenant: None,
        session: None,
    }
}

/// Events as seen by a test: (kind, payload).
type Seen = Vec<(String, Value)>;

/// Run a call while draining its events; input requests get `answer` (or, if `None`,
/// their responder is dropped).
async fn call(
    pool: &StdioPool,
    spec: CallSpec,
    answer: Option<InputAnswer>,
) -> (Result<CallOutcome, UpstreamError>, Seen) {
    let (tx, mut rx) = mpsc::channel(16);
    let mut fut = pin!(pool.call(spec, tx));
    let mut seen = Seen::new();
    let handle = |ev: CallEvent, seen: &mut Seen| match ev {
        CallEvent::Progress(p) => seen.push(("progress".into(), Value::Object(p))),
        CallEvent::Log(p) => seen.push(("log".into(), Value::Object(p))),
        CallEvent::Queue(_) => {}
        CallEvent::Input(req) => {
            seen.push((
                req.method.clone(),
                req.params.clone().unwrap_or(Value::Null),
            ));
            if let Some(a) = answer.clone() {
                let _ = req.respond.send(a);
            }
        }
    };
    let res = tokio::time::timeout(BOUND, async {
        loop {
            tokio::select! {
                r = &mut fut => break r,
                Some(ev) = rx.recv() => handle(ev, &mut seen),
            }
        }
    })
    .await
    .expect("call timed out");
    while let Ok(ev) = rx.try_recv() {
        handle(ev, &mut seen);
    }
    (res, seen)
}

fn result_of(r: &Result<CallOutcome, UpstreamError>) -> Value {
    match r {
        Ok(CallOutcome::Result(v)) => v.clone(),
        other => panic!("expected a result, got {other:?}"),
    }
}

fn pid_of(r: &Result<CallOutcome, UpstreamError>) -> u64 {
    result_of(r)["pid"].as_u64().unwrap()
}

/// Dead = no such process, or a zombie nobody reaped (PID 1 here may not reap).
fn is_dead(pid: u64) -> bool {
    process::proc_stat(pid as u32).is_none_or(|s| s.state == 'Z')
}

#[tokio::test]
async fn handshake_routing_batches_and_unowned_requests() {
    let fx = Fixture::new();
    let pool = StdioPool::start(fx.opts(1));
    let mut notes = pool.notifications();
    let info = pool.ensure_ready().await.unwrap();
    assert_eq!(info.protocol_version, "2025-06-18");
    assert_eq!(info.server_info["name"], "pyfixture");
    assert_eq!(pool.state(), TransportState::Ready);
    assert!(pool.info().is_some());
    assert_eq!(fx.pid_files(), 1);

    // The server offered nothing newer than what we asked for, and the roots/list it
    // sends right after `initialized` (no call in flight) is answered by the gateway.
    wait_for("unowned roots/list answer", || {
        fx.log().contains(r#"roots answer {"roots": []}"#)
    })
    .await;
    assert!(fx.log().contains("initialize 2025-11-25"));

    let (r, seen) = call(
        &pool,
        tool("echo", json!({"text": "hi", "n": [1, 2]})),
        None,
    )
    .await;
    assert_eq!(result_of(&r)["args"], json!({"text": "hi", "n": [1, 2]}));
    assert!(seen.is_empty());

    // Progress: only our token is routed, with progressToken stripped; logs routed too.
    let mut spec = tool("progress", json!({}));
    spec.want_progress = true;
    let (r, seen) = call(&pool, spec, None).await;
    let token = result_of(&r)["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("taskgate-"), "{token}");
    assert_eq!(
        seen,
        vec![
            (
                "progress".into(),
                json!({"progress": 1, "total": 2, "message": "half"})
            ),
            ("log".into(), json!({"level": "info", "data": "working"})),
        ]
    );

    // Without want_progress there is no token, so nothing is routed as progress.
    let (_, seen) = call(&pool, tool("progress", json!({})), None).await;
    assert!(seen.iter().all(|(k, _)| k != "progress"));

    // 2025-03-26 batch on one line: notification + response.
    let mut spec = tool("batch", json!({}));
    spec.want_progress = true;
    let (r, seen) = call(&pool, spec, None).await;
    assert_eq!(result_of(&r)["batched"], true);
    assert_eq!(seen, vec![("progress".into(), json!({"progress": 1}))]);

    // Non-JSON stdout is ignored.
    let (r, _) = call(&pool, tool("garbage", json!({})), None).await;
    assert_eq!(result_of(&r)["content"][0]["text"], "after garbage");

    // Upstream errors pass through as CallOutcome::Error.
    let (r, _) = call(&pool, tool("nope", json!({})), None).await;
    assert!(
        matches!(r, Ok(CallOutcome::Error(ref e)) if e.code == -32602),
        "{r:?}"
    );

    // List-changed notifications go to the session channel.
    let (r, _) = call(&pool, tool("notify", json!({})), None).await;
    assert!(r.is_ok());
    let n = tokio::time::timeout(BOUND, notes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.method, "notifications/tools/list_changed");

    pool.shutdown().await;
    assert_eq!(fx.pid_files(), 0);
}

#[tokio::test]
async fn elicitation_is_routed_and_answered() {
    let fx = Fixture::new();
    let pool = StdioPool::start(fx.opts(1));
    // The fixture sends roots/list right after the handshake; a call in flight by then
    // would (correctly) own it, so let the gateway answer it as unowned first.
    wait_for("unowned roots/list answer", || {
        fx.log().contains("roots answer")
    })
    .await;
    let answer = json!({"action": "accept", "content": {"name": "Ada"}});
    let (r, seen) = call(
        &pool,
        tool("elicit", json!({})),
        Some(InputAnswer::Result(answer.clone())),
    )
    .await;
    assert_eq!(result_of(&r)["answer"], answer);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "elicitation/create");
    assert_eq!(seen[0].1["message"], "name?");

    // A dropped responder becomes a JSON-RPC error for the child.
    let (r, seen) = call(&pool, tool("elicit", json!({})), None).await;
    assert_eq!(seen.len(), 1);
    let v = result_of(&r);
    assert!(v["answer"].is_null());
    assert_eq!(v["error"]["code"], crate::protocol::error::INTERNAL_ERROR);

    // A closed events receiver also yields an error answer, not a hang.
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    let r = tokio::time::timeout(BOUND, pool.call(tool("elicit", json!({})), tx))
        .await
        .unwrap();
    assert!(!result_of(&r)["error"].is_null());
    pool.shutdown().await;
}

#[tokio::test]
async fn concurrent_calls_get_distinct_children_and_wait_fifo() {
    let fx = Fixture::new();
    let pool = StdioPool::start(fx.opts(2));
    let gate = fx.gate();
    let calls = (0..3).map(|_| call(&pool, tool("gate", json!({"path": gate})), None));
    let all = futures_util::future::join_all(calls);
    let opener = async {
        // Two children hold a call each; the third call must be waiting for one.
        wait_for("two gated calls", || {
            fx.log().matches("call gate").count() == 2
        })
        .await;
        assert_eq!(fx.pid_files(), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            fx.log().matches("call gate").count(),
            2,
            "a child got 2 calls"
        );
        fx.open_gate();
    };
    let (results, ()) = tokio::join!(all, opener);
    let pids: BTreeSet<u64> = results.iter().map(|(r, _)| pid_of(r)).collect();
    assert_eq!(pids.len(), 2);
    pool.shutdown().await;
}

#[tokio::test]
async fn cancelled_call_keeps_child_reserved_until_it_answers() {
    let fx = Fixture::new();
    let pool = StdioPool::start(fx.opts(1));
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    let first = pid_of(&r);
    {
        let (tx, _rx) = mpsc::channel(4);
        let fut = pool.call(
            tool("sleep", json!({"secs": 60, "on_cancel": "answer"})),
            tx,
        );
        let mut fut = pin!(fut);
        tokio::select! {
            r = &mut fut => panic!("sleep answered early: {r:?}"),
            () = wait_for("sleep started", || fx.log().contains("call sleep")) => {}
        }
    } // dropped: cancelled
    wait_for("cancel notification", || fx.log().contains("cancelled")).await;
    // The child answered the cancelled request (discarded) and is reused, not killed.
    let (r, _) = call(&pool, tool("echo", json!({"text": "again"})), None).await;
    assert_eq!(result_of(&r)["args"]["text"], "again");
    assert_eq!(pid_of(&r), first);
    pool.shutdown().await;
}

#[tokio::test]
async fn cancelled_call_that_never_answers_kills_the_child() {
    let fx = Fixture::new();
    let mut opts = fx.opts(1);
    opts.cancel_grace = Duration::from_millis(300);
    let pool = StdioPool::start(opts);
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    let first = pid_of(&r);
    {
        let (tx, _rx) = mpsc::channel(4);
        let mut fut = pin!(pool.call(tool("sleep", json!({"secs": 60})), tx));
        tokio::select! {
            r = &mut fut => panic!("sleep answered early: {r:?}"),
            () = wait_for("sleep started", || fx.log().contains("call sleep")) => {}
        }
    }
    // With one child, this call can only run after the reserved child was replaced.
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    assert_ne!(pid_of(&r), first);
    assert!(fx.log().contains(&format!("{first} cancelled")));
    wait_for("old child dead", || is_dead(first)).await;
    pool.shutdown().await;
}

#[tokio::test]
async fn crash_fails_the_call_and_the_pool_recovers() {
    let fx = Fixture::new();
    let pool = StdioPool::start(fx.opts(1));
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    let first = pid_of(&r);
    let (r, _) = call(&pool, tool("crash", json!({})), None).await;
    match r {
        Err(UpstreamError::Broken { upstream, reason }) => {
            assert_eq!(upstream, "py");
            assert!(reason.contains("signal 9"), "{reason}");
            assert!(reason.contains("in flight"), "{reason}");
        }
        other => panic!("expected Broken, got {other:?}"),
    }
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    assert_ne!(pid_of(&r), first);
    assert_eq!(pool.state(), TransportState::Ready);
    wait_for("one pid record", || fx.pid_files() == 1).await;
    pool.shutdown().await;
}

#[tokio::test]
async fn oversized_line_is_a_protocol_error() {
    let fx = Fixture::new();
    let mut opts = fx.opts(1);
    opts.max_message_bytes = 4096;
    let pool = StdioPool::start(opts);
    let (r, _) = call(&pool, tool("big", json!({"n": 100_000})), None).await;
    assert!(matches!(r, Err(UpstreamError::Protocol { .. })), "{r:?}");
    let (r, _) = call(&pool, tool("echo", json!({"text": "ok"})), None).await;
    assert_eq!(result_of(&r)["args"]["text"], "ok");
    pool.shutdown().await;
}

#[tokio::test]
async fn shutdown_kills_a_stubborn_process_group() {
    let fx = Fixture::new();
    let mut opts = fx.opts(1);
    opts.args.push("--stubborn".into());
    let pool = StdioPool::start(opts);
    let (r, _) = call(&pool, tool("grandchild", json!({})), None).await;
    let leader = pid_of(&r);
    let grandchild = result_of(&r)["grandchild"].as_u64().unwrap();
    assert!(!is_dead(grandchild));

    let gate = fx.gate();
    let in_flight = call(&pool, tool("gate", json!({"path": gate})), None);
    let stop = async {
        wait_for("gated call", || fx.log().contains("call gate")).await;
        pool.shutdown().await;
    };
    let ((r, _), ()) = tokio::join!(in_flight, stop);
    assert!(matches!(r, Err(UpstreamError::ShuttingDown)), "{r:?}");
    assert!(fx.log().contains("stdin eof"), "stdin was not closed first");
    wait_for("leader dead", || is_dead(leader)).await;
    wait_for("grandchild dead", || is_dead(grandchild)).await;
    assert_eq!(fx.pid_files(), 0);
    assert!(matches!(pool.state(), TransportState::Down(_)));
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    assert!(matches!(r, Err(UpstreamError::ShuttingDown)), "{r:?}");
}

#[tokio::test]
async fn missing_program_is_unavailable_with_reason() {
    let fx = Fixture::new();
    let mut opts = fx.opts(2);
    opts.program = fx.dir.join("no-such-program").display().to_string();
    let pool = StdioPool::start(opts);
    let (a, b) = tokio::join!(pool.ensure_ready(), pool.ensure_ready());
    for r in [a, b] {
        match r {
            Err(UpstreamError::Unavailable { reason, .. }) => {
                assert!(reason.contains("no-such-program"), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    assert!(matches!(pool.state(), TransportState::Down(_)));
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    assert!(matches!(r, Err(UpstreamError::Unavailable { .. })), "{r:?}");
    pool.shutdown().await;
}

#[tokio::test]
async fn idle_extra_children_are_reaped() {
    let fx = Fixture::new();
    let mut opts = fx.opts(2);
    opts.idle_reap = Duration::from_millis(300);
    let pool = StdioPool::start(opts);
    let gate = fx.gate();
    let calls = futures_util::future::join(
        call(&pool, tool("gate", json!({"path": gate})), None),
        call(&pool, tool("gate", json!({"path": gate})), None),
    );
    let opener = async {
        wait_for("two children", || {
            fx.log().matches("call gate").count() == 2
        })
        .await;
        fx.open_gate();
    };
    let (((a, _), (b, _)), ()) = tokio::join!(calls, opener);
    assert_ne!(pid_of(&a), pid_of(&b));
    wait_for("extra child reaped", || {
        fx.pid_files() == 1 && pool.child_pids().len() == 1
    })
    .await;
    // The pool still serves, and grows again on demand.
    let (r, _) = call(&pool, tool("echo", json!({})), None).await;
    assert!(r.is_ok());
    pool.shutdown().await;
}

fn spawn_group(cmd: &str, args: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(cmd)
        .args(args)
        .process_group(0)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_killed(child: &mut std::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    let start = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert_eq!(s.signal(), Some(libc::SIGKILL));
            return;
        }
        assert!(start.elapsed() < BOUND, "leftover not killed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A recorder that is provably dead: this process's pid with another start time, as
/// if the pid had been reused since the recorder died.
fn dead_recorder() -> process::Recorder {
    process::Recorder {
        pid: std::process::id(),
        starttime: Some(1),
    }
}

/// Write a record the way gateways before recorders did (no `recorder` field).
fn write_legacy_record(dir: &Path, pid: u32) {
    let stat = process::proc_stat(pid).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(format!("{pid}.json")),
        json!({"pid": pid, "starttime": stat.starttime, "session": stat.session,
               "upstream": "t", "program": "sleep"})
        .to_string(),
    )
    .unwrap();
}

#[test]
fn kill_leftovers_kills_recorded_groups_only() {
    let fx = Fixture::new();
    let dir = fx.pid_dir();

    // A recorded group whose leader still runs.
    let mut leader = spawn_group("sleep", &["1000"]);
    process::record_as(&dir, dead_recorder(), "t", "sleep", leader.id()).unwrap();

    // A recorded group whose leader is gone but whose member survived (the usual
    // aftermath of PR_SET_PDEATHSIG killing only the direct child).
    let mut sh = spawn_group("sh", &["-c", "sleep 1000 & echo $!; read x"]);
    let sh_pid = sh.id();
    process::record_as(&dir, dead_recorder(), "t", "sh", sh_pid).unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let orphan: u64 = line.trim().parse().unwrap();
    drop(sh.stdin.take()); // `read` hits EOF, the shell exits, the sleep lives on
    sh.wait().unwrap();
    assert!(!is_dead(orphan));

    // A record whose pid now belongs to someone else (start time differs).
    let mut stranger = spawn_group("sleep", &["1000"]);
    let path = dir.join(format!("{}.json", stranger.id()));
    std::fs::write(
        &path,
        json!({"pid": stranger.id(), "starttime": 1, "session": 1,
               "recorder": {"pid": std::process::id(), "starttime": 1}})
        .to_string(),
    )
    .unwrap();

    assert_eq!(kill_leftovers(&dir), Leftovers { killed: 2, kept: 0 });
    wait_killed(&mut leader);
    let start = std::time::Instant::now();
    while !is_dead(orphan) {
        assert!(start.elapsed() < BOUND, "orphaned group member not killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "unrelated process killed"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert_eq!(
        kill_leftovers(Path::new("/nonexistent-taskgate-dir")),
        Leftovers::default()
    );
}

#[test]
fn records_of_a_live_recorder_are_left_alone() {
    let fx = Fixture::new();
    let dir = fx.pid_dir();
    // Recorded by this (live) process, as another gateway sharing the directory would.
    let mut ours = spawn_group("sleep", &["1000"]);
    let ours_record = process::record(&dir, "t", "sleep", ours.id()).unwrap();
    // Recorded by nobody we can name: cannot be proven to be a leftover either.
    let mut anonymous = spawn_group("sleep", &["1000"]);
    write_legacy_record(&dir, anonymous.id());
    // Being written by another gateway right now (not yet renamed into place).
    std::fs::write(dir.join(".1234.json.tmp"), b"{\"pid\":").unwrap();

    assert_eq!(kill_leftovers(&dir), Leftovers { killed: 0, kept: 2 });
    assert!(
        ours.try_wait().unwrap().is_none(),
        "live recorder's child killed"
    );
    assert!(
        anonymous.try_wait().unwrap().is_none(),
        "unattributed group killed"
    );
    assert!(ours_record.exists(), "live recorder's record deleted");
    assert!(dir.join(format!("{}.json", anonymous.id())).exists());
    assert!(dir.join(".1234.json.tmp").exists());
    for c in [&mut ours, &mut anonymous] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn legacy_records_are_cleaned_up_once() {
    let fx = Fixture::new();
    let legacy = fx.dir.join("children");
    let mut leftover = spawn_group("sleep", &["1000"]);
    write_legacy_record(&legacy, leftover.id());
    assert_eq!(
        kill_legacy_leftovers(&legacy),
        Leftovers { killed: 1, kept: 0 }
    );
    wait_killed(&mut leftover);
    assert!(!legacy.exists(), "legacy directory not removed");
    assert_eq!(kill_legacy_leftovers(&legacy), Leftovers::default());
}

#[test]
fn recorder_liveness_detects_pid_reuse() {
    assert!(process::Recorder::current().starttime.is_some());
    let me = process::Recorder::current();
    assert_eq!(me.pid, std::process::id());
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let dir = Fixture::new();
    // Through the public scan: only the live recorder's record survives.
    let pid_dir = dir.pid_dir();
    for (i, recorder) in [
        me,
        dead_recorder(),
        process::Recorder {
            pid: gone_pid,
            starttime: None,
        },
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::create_dir_all(&pid_dir).unwrap();
        // Pid 0 never names a group, so nothing is signalled; only the records matter.
        std::fs::write(
            pid_dir.join(format!("{i}.json")),
            json!({"pid": 0, "starttime": 0, "session": 0,
                   "recorder": {"pid": recorder.pid, "starttime": recorder.starttime}})
            .to_string(),
        )
        .unwrap();
    }
    assert_eq!(kill_leftovers(&pid_dir), Leftovers { killed: 0, kept: 1 });
    assert!(pid_dir.join("0.json").exists());
    assert!(!pid_dir.join("1.json").exists());
    assert!(!pid_dir.join("2.json").exists());
}

#[test]
fn a_zombie_leader_does_not_hide_its_group() {
    let fx = Fixture::new();
    let dir = fx.pid_dir();
    // The leader exits but nobody reaps it (as under an init that never reaps), while
    // the member it forked lives on.
    let mut sh = spawn_group("sh", &["-c", "sleep 1000 & echo $!; read x"]);
    process::record_as(&dir, dead_recorder(), "t", "sh", sh.id()).unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let orphan: u64 = line.trim().parse().unwrap();
    drop(sh.stdin.take());
    let start = std::time::Instant::now();
    while process::proc_stat(sh.id()).is_none_or(|s| s.state != 'Z') {
        assert!(start.elapsed() < BOUND, "leader did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }

    assert_eq!(kill_leftovers(&dir).killed, 1);
    let start = std::time::Instant::now();
    while !is_dead(orphan) {
        assert!(
            start.elapsed() < BOUND,
            "member of a zombie leader not killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    sh.wait().unwrap();
}
