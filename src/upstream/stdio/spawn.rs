//! Starting one child: spawning it with the `initialize` handshake, its stdin writer
//! and stderr logger, and reading its stdout until it ends.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::child::{Child, WriterCmd};
use super::framing::{LineReader, Next};
use super::inbound::dispatch_line;
use super::throttle::Verdict;
use crate::upstream::{UpstreamError, UpstreamInfo, legacy_messages};

/// Bound on the `initialize` round trip (covers slow `npx`/`uvx` cold starts).
const INIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Quiet period between `initialized` and a child's first call (see `spawn_child`).
const SETTLE_AFTER_INIT: Duration = Duration::from_millis(750);
/// After the child exits, how long to keep reading output it already wrote (its final
/// answer may still sit in the pipe) in case a grandchild holds stdout open.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);
/// After stdout EOF, how long the child gets to exit before it is killed.
const EXIT_AFTER_EOF: Duration = Duration::from_millis(500);
/// stderr lines are only logged, so they are capped well below stdout messages.
const MAX_STDERR_LINE: usize = 16 * 1024;

/// Spawn one child and run the `initialize` handshake (MCP 2025-11-25 "Lifecycle").
pub(super) async fn spawn_child(shared: &Arc<Shared>) -> Result<Arc<Child>, String> {
    let opts = &shared.opts;
    let mut cmd = tokio::process::Command::new(&opts.program);
    cmd.args(&opts.args)
        .envs(&opts.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    super::process::configure(&mut cmd);
    let mut proc = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", opts.program))?;
    let Some(pid) = proc.id() else {
        return Err(format!("{} exited immediately", opts.program));
    };
    super::process::mark_live(pid);
    let pid_file = super::process::record(&opts.pid_dir, &opts.name, &opts.program, pid);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (proc.stdin.take(), proc.stdout.take(), proc.stderr.take())
    else {
        super::process::kill_group(pid, libc::SIGKILL);
        let _ = proc.wait().await;
        super::process::unmark_live(pid);
        if let Some(p) = &pid_file {
            let _ = std::fs::remove_file(p);
        }
        return Err("child stdio pipes are missing".into());
    };

    let (writer, writer_rx) = mpsc::unbounded_channel();
    let child = Arc::new(Child {
        serial: shared.next_serial.fetch_add(1, Ordering::Relaxed),
        pid,
        writer,
        active: Mutex::new(None),
        gone: CancellationToken::new(),
        doomed: AtomicBool::new(false),
        info: Mutex::new(None),
        pid_file,
        died_serving: AtomicBool::new(false),
    });
    {
        let mut live = shared.live.lock();
        live.insert(child.serial, child.clone());
    }
    tokio::spawn(write_loop(stdin, writer_rx));
    tokio::spawn(log_stderr(shared.opts.name.clone(), pid, stderr));
    let (init_tx, init_rx) = oneshot::channel();
    let init_id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(run_child(
        shared.clone(),
        child.clone(),
        proc,
        stdout,
        Some((init_id, init_tx)),
    ));
    // Shutdown may have snapshotted `live` before this child was inserted.
    if shared.shutdown.is_cancelled() {
        child.kill();
        return Err("gateway is shutting down".into());
    }
    child.send(&legacy_messages::initialize_request(init_id));

    let outcome = tokio::select! {
        r = init_rx => r.unwrap_or_else(|_| Err("child went away during initialize".into())),
        () = tokio::time::sleep(INIT_TIMEOUT) => Err(format!(
            "no initialize answer within {}s", INIT_TIMEOUT.as_secs()
        )),
        () = shared.shutdown.cancelled() => Err("gateway is shutting down".into()),
    };
    match outcome {
        Ok(info) => {
            if let Some(id) = &shared.opts.identity {
                id.learned(&info);
            }
            {
                let mut i = child.info.lock();
                *i = Some(Arc::new(info));
            }
            // Attribution is a security boundary (docs/design.md §14 "Upstream sessions"): servers send unsolicited
            // requests right after `initialized` (server-everything asks `roots/list`
            // ~350 ms later). A child gets its first call only after this settle
            // window, so such a request is answered as unowned instead of being
            // blamed on — or shown to — whichever client's call happens to run.
            tokio::select! {
                () = tokio::time::sleep(SETTLE_AFTER_INIT) => {}
                () = shared.shutdown.cancelled() => {
                    child.kill();
                    return Err("gateway is shutting down".into());
                }
            }
            tracing::info!(upstream = %shared.name(), pid, "stdio child ready");
            Ok(child)
        }
        Err(reason) => {
            child.kill();
            Err(reason)
        }
    }
}

pub(super) async fn write_loop(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<WriterCmd>,
) {
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriterCmd::Line(mut bytes) => {
                bytes.push(b'\n');
                // A write error means the child is gone; the reader reports that.
                if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                    return;
                }
            }
            WriterCmd::Close => return,
        }
    }
}

pub(super) async fn log_stderr(name: String, pid: u32, stderr: ChildStderr) {
    let mut reader = LineReader::new(BufReader::new(stderr), MAX_STDERR_LINE);
    loop {
        match reader.next().await {
            Ok(Next::Line(bytes)) => {
                tracing::info!(upstream = %name, pid, "stderr: {}", String::from_utf8_lossy(&bytes));
            }
            Ok(Next::TooLong) => {
                tracing::info!(upstream = %name, pid, "stderr: <line longer than {MAX_STDERR_LINE} bytes skipped>");
            }
            Ok(Next::Eof) | Err(_) => return,
        }
    }
}

pub(super) enum EndCause {
    Eof,
    TooLong,
    ReadError(std::io::Error),
    Exited,
}

/// Read the child's stdout until it ends, dispatch every message, then clean up: reap
/// the process, kill its group's stragglers, fail the in-flight call, drop the pid
/// record, and mark the child gone (which makes the supervisor restart the slot).
pub(super) async fn run_child(
    shared: Arc<Shared>,
    child: Arc<Child>,
    mut proc: tokio::process::Child,
    stdout: ChildStdout,
    mut init: Option<(u64, oneshot::Sender<Result<UpstreamInfo, String>>)>,
) {
    let max = shared.opts.max_message_bytes;
    let mut reader = LineReader::new(BufReader::new(stdout), max);
    let mut status: Option<std::io::Result<ExitStatus>> = None;
    let cause = loop {
        tokio::select! {
            r = reader.next() => match r {
                Ok(Next::Line(bytes)) => dispatch_line(&shared, &child, &bytes, &mut init).await,
                Ok(Next::TooLong) => break EndCause::TooLong,
                Ok(Next::Eof) => break EndCause::Eof,
                Err(e) => break EndCause::ReadError(e),
            },
            s = proc.wait(), if status.is_none() => {
                status = Some(s);
                break EndCause::Exited;
            }
        }
    };
    // Doomed already = the pool killed it (reaped, cancel not settled, shutdown).
    let killed_by_pool = child.doomed.swap(true, Ordering::SeqCst);
    match &cause {
        EndCause::Exited => {
            // The final answer may still be in the pipe: read what is left, bounded
            // in time because a grandchild may keep stdout open.
            let drain = async {
                while let Ok(Next::Line(bytes)) = reader.next().await {
                    dispatch_line(&shared, &child, &bytes, &mut init).await;
                }
            };
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await;
        }
        EndCause::TooLong => {
            super::process::kill_group(child.pid, libc::SIGKILL);
        }
        EndCause::Eof | EndCause::ReadError(_) => {}
    }
    let status = match status {
        Some(s) => s,
        None => match tokio::time::timeout(EXIT_AFTER_EOF, proc.wait()).await {
            Ok(s) => s,
            Err(_) => {
                super::process::kill_group(child.pid, libc::SIGKILL);
                proc.wait().await
            }
        },
    };
    // Grandchildren of a dead leader would otherwise live on with our stdio pipes.
    super::process::kill_group(child.pid, libc::SIGKILL);
    super::process::unmark_live(child.pid);

    let exit = match &status {
        Ok(s) => describe_status(*s),
        Err(e) => format!("exited (status unknown: {e})"),
    };
    let desc = match &cause {
        EndCause::Exited => format!("child {exit}"),
        EndCause::Eof => format!("child closed stdout and {exit}"),
        EndCause::TooLong => format!("child sent a message longer than {max} bytes"),
        EndCause::ReadError(e) => format!("reading child stdout failed ({e}); child {exit}"),
    };
    if let Some(active) = child.take_active() {
        active.token.cancel();
        child.died_serving.store(true, Ordering::SeqCst);
        if !killed_by_pool
            && !shared.shutdown.is_cancelled()
            && let Some(caller) = &active.caller
            && let Verdict::Throttled(penalty) = shared.throttle.crashed(caller, Instant::now())
        {
            tracing::warn!(upstream = %shared.name(), tenant = %caller.tenant,
                tool = %caller.tool, penalty_ms = penalty.as_millis() as u64,
                "calls keep killing stdio children; throttling this tenant and tool \
                 (one call at a time, each after the penalty)");
        }
        let err = if shared.shutdown.is_cancelled() {
            UpstreamError::ShuttingDown
        } else if matches!(cause, EndCause::TooLong) {
            UpstreamError::Protocol {
                upstream: shared.opts.name.clone(),
                reason: desc.clone(),
            }
        } else {
            UpstreamError::Broken {
                upstream: shared.opts.name.clone(),
                reason: format!("{desc} while the call was in flight"),
            }
        };
        let _ = active.reply.send(Err(err));
    }
    if let Some((_, tx)) = init.take() {
        let _ = tx.send(Err(desc.clone()));
    }
    if shared.shutdown.is_cancelled() {
        tracing::info!(upstream = %shared.name(), pid = child.pid, "{desc}");
    } else {
        tracing::warn!(upstream = %shared.name(), pid = child.pid, "{desc}");
    }
    if let Some(p) = &child.pid_file {
        let _ = std::fs::remove_file(p);
    }
    {
        let mut live = shared.live.lock();
        live.remove(&child.serial);
    }
    let _ = child.writer.send(WriterCmd::Close);
    child.gone.cancel();
}

pub(super) fn describe_status(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("exited with signal {sig}"),
        _ => format!("exited ({s})"),
    }
}
