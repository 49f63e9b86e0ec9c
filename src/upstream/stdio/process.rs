//! Process-group plumbing for stdio children: spawning with a parent-death signal,
//! signalling whole groups, and the pid records that let a restarted gateway kill the
//! leftovers of a run that was `kill -9`'d.
//!
//! Why process groups: servers started through `npx`, `uvx` or shell wrappers are trees
//! of processes. Signalling only the direct child leaves the real server running, so
//! every child is made the leader of its own group and every signal goes to the group.
//!
//! Why pid records: `PR_SET_PDEATHSIG` only reaches the direct child (it is cleared on
//! fork), so grandchildren survive a gateway crash. Each child's group is recorded on
//! disk with enough identity (`starttime`, session) to tell it apart from an unrelated
//! process that later reused the number.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Value, json};

/// Pids of children spawned by *this* process that are still alive. `kill_leftovers`
/// never touches them, even if it is (wrongly) called after pools have started.
static LIVE_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

pub(super) fn mark_live(pid: u32) {
    if let Ok(mut s) = LIVE_PIDS.lock() {
        s.insert(pid);
    }
}

pub(super) fn unmark_live(pid: u32) {
    if let Ok(mut s) = LIVE_PIDS.lock() {
        s.remove(&pid);
    }
}

fn is_live(pid: u32) -> bool {
    LIVE_PIDS.lock().map(|s| s.contains(&pid)).unwrap_or(false)
}

/// Send `sig` to the whole process group led by `pgid`. Refuses the special values
/// (0 = our own group, 1 / negative = "every process") so a bogus pid can never turn
/// into a broadcast signal.
pub(super) fn kill_group(pgid: u32, sig: i32) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; the argument is a
    // negative group id > 1, so it addresses exactly that group.
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// Configure `cmd` so the child leads its own process group and gets SIGKILL when the
/// gateway dies (even by `kill -9`, which runs no cleanup code of ours).
pub(super) fn configure(cmd: &mut tokio::process::Command) {
    cmd.process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls the
    // async-signal-safe functions prctl(2), getppid(2) and _exit(2).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The gateway may have died between fork and prctl; the death signal
            // would then never fire, so give up now instead of becoming an orphan.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The fields of `/proc/<pid>/stat` that identify a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcStat {
    pub state: char,
    pub pgrp: i64,
    pub session: i64,
    pub starttime: u64,
}

pub(super) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parse `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may
/// itself contain spaces and parentheses, so split after the *last* `)`.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state); field n is at index n - 3.
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        starttime: fields.get(19)?.parse().ok()?,
    })
}

/// What is recorded for one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PidRecord {
    pub pid: u32,
    pub starttime: u64,
    pub session: i64,
}

/// Record a freshly spawned child (the leader of its own group) under `pid_dir`.
/// Failure only costs leftover cleanup after a crash, so it is logged, not fatal.
pub(super) fn record(pid_dir: &Path, upstream: &str, program: &str, pid: u32) -> Option<PathBuf> {
    let stat = proc_stat(pid);
    let body = json!({
        "pid": pid,
        "starttime": stat.map(|s| s.starttime),
        "session": stat.map(|s| s.session),
        "upstream": upstream,
        "program": program,
    });
    let path = pid_dir.join(format!("{pid}.json"));
    let res = std::fs::create_dir_all(pid_dir)
        .and_then(|()| std::fs::write(&path, body.to_string().as_bytes()));
    match res {
        Ok(()) => Some(path),
        Err(e) => {
            tracing::warn!(upstream = %upstream, pid, error = %e, dir = %pid_dir.display(),
                "cannot record child pid; a gateway crash could leave it running");
            None
        }
    }
}

fn read_record(path: &Path) -> Option<PidRecord> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some(PidRecord {
        pid: u32::try_from(v.get("pid")?.as_u64()?).ok()?,
        starttime: v.get("starttime")?.as_u64()?,
        session: v.get("session")?.as_i64()?,
    })
}

/// Whether the group recorded in `rec` still has members that provably belong to it.
///
/// * Leader alive: it must still lead the group and have the recorded start time
///   (otherwise the number was reused by an unrelated process: leave it alone).
/// * Leader gone (the usual case: the death signal killed it, grandchildren survived):
///   a group id stays allocated while any member lives, so members with that group id,
///   the recorded session and a start time not before the leader's are the leftovers.
fn group_is_ours(rec: &PidRecord) -> bool {
    if rec.pid <= 1 {
        return false;
    }
    if let Some(leader) = proc_stat(rec.pid) {
        return leader.pgrp == i64::from(rec.pid)
            && leader.starttime == rec.starttime
            && leader.state != 'Z';
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            .and_then(proc_stat)
            .is_some_and(|s| {
                s.pgrp == i64::from(rec.pid)
                    && s.session == rec.session
                    && s.starttime >= rec.starttime
                    && s.state != 'Z'
            })
    })
}

/// Kill process groups recorded in `pid_dir` by a previous run, after verifying each
/// still belongs to the recorded group (never kills unrelated processes nor children of
/// this process). Removes the records. Returns how many groups were killed. Call once
/// at gateway start, before any stdio pool starts.
pub fn kill_leftovers(pid_dir: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(pid_dir) else {
        return 0;
    };
    let mut killed = 0;
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        match read_record(&path) {
            Some(rec) if is_live(rec.pid) => continue,
            Some(rec) => {
                if group_is_ours(&rec) && kill_group(rec.pid, libc::SIGKILL) {
                    tracing::warn!(pid = rec.pid, record = %path.display(),
                        "killed leftover stdio upstream process group from a previous run");
                    killed += 1;
                }
            }
            None => {
                tracing::warn!(record = %path.display(), "ignoring unreadable pid record");
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_handles_odd_names() {
        let line =
            "1234 (we ird) (x)) S 1 1234 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.pgrp, 1234);
        assert_eq!(s.session, 77);
        assert_eq!(s.starttime, 98765);
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn special_group_ids_are_refused() {
        assert!(!kill_group(0, 0));
        assert!(!kill_group(1, 0));
        assert!(!kill_group(u32::MAX, 0));
    }
}
