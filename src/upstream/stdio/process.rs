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
//!
//! Why the recorder: several gateways can share one record directory (a second
//! instance started by mistake, or replicas sharing `store.runtime_dir` and a replica
//! id). A group is a leftover only if the gateway that recorded it is dead, so each
//! record also names its recorder by pid *and* start time (a reused pid is not the
//! recorder). Records of a live recorder are never killed nor deleted (README
//! "Stdio children and pid records").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::protocol::loose::{Loose, Object};

/// Pids of children spawned by *this* process that are still alive. `kill_leftovers`
/// never touches them, even if it is (wrongly) called after pools have started.
static LIVE_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

pub(super) fn mark_live(pid: u32) {
    {
        let mut s = LIVE_PIDS.lock();
        s.insert(pid);
    }
}

pub(super) fn unmark_live(pid: u32) {
    {
        let mut s = LIVE_PIDS.lock();
        s.remove(&pid);
    }
}

fn is_live(pid: u32) -> bool {
    LIVE_PIDS.lock().contains(&pid)
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

/// The gateway process that wrote a pid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recorder {
    pub pid: u32,
    /// `starttime` of `/proc/<pid>/stat`; `None` if it could not be read when recording.
    pub starttime: Option<u64>,
}

impl Recorder {
    /// This process.
    pub(super) fn current() -> Self {
        static START: OnceLock<Option<u64>> = OnceLock::new();
        let pid = std::process::id();
        let starttime = *START.get_or_init(|| proc_stat(pid).map(|s| s.starttime));
        Self { pid, starttime }
    }

    /// Whether the recorder may still run. Only a provably dead recorder counts as dead:
    /// its pid is gone, a zombie, or now names a process with another start time.
    /// Without a recorded start time, any process with the pid keeps it "alive".
    fn may_be_alive(&self) -> bool {
        match proc_stat(self.pid) {
            None => false,
            Some(s) if matches!(s.state, 'Z' | 'X') => false,
            Some(s) => self.starttime.is_none_or(|t| t == s.starttime),
        }
    }
}

/// What is recorded for one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PidRecord {
    pub pid: u32,
    pub starttime: u64,
    pub session: i64,
    /// Absent in records written before recorders were recorded (the legacy directory).
    pub recorder: Option<Recorder>,
}

/// Record a freshly spawned child (the leader of its own group) under `pid_dir`, as
/// recorded by this process. Failure only costs leftover cleanup after a crash, so it
/// is logged, not fatal.
pub(super) fn record(pid_dir: &Path, upstream: &str, program: &str, pid: u32) -> Option<PathBuf> {
    record_as(pid_dir, Recorder::current(), upstream, program, pid)
}

pub(super) fn record_as(
    pid_dir: &Path,
    recorder: Recorder,
    upstream: &str,
    program: &str,
    pid: u32,
) -> Option<PathBuf> {
    let stat = proc_stat(pid);
    let body = json!({
        "pid": pid,
        "starttime": stat.map(|s| s.starttime),
        "session": stat.map(|s| s.session),
        "upstream": upstream,
        "program": program,
        "recorder": {"pid": recorder.pid, "starttime": recorder.starttime},
    });
    let path = pid_dir.join(format!("{pid}.json"));
    // Written aside and renamed into place: another gateway sharing the directory may
    // scan it at any moment and must never see (and delete) a half-written record.
    let tmp = pid_dir.join(format!(".{pid}.json.tmp"));
    let res = std::fs::create_dir_all(pid_dir)
        .and_then(|()| std::fs::write(&tmp, body.to_string().as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    match res {
        Ok(()) => Some(path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(upstream = %upstream, pid, error = %e, dir = %pid_dir.display(),
                "cannot record child pid; a gateway crash could leave it running");
            None
        }
    }
}

/// A pid record as [`record_as`] writes it; `upstream` and `program` are there for
/// whoever reads the directory, not read back. A record missing a member the check
/// needs, or holding one of another type (a `null` start time the child's stat could
/// not give), is no record: its group is left alone.
#[derive(Deserialize)]
struct RecordFile {
    pid: u32,
    starttime: u64,
    session: i64,
    /// Missing or `null` before recorders were recorded; anything else must be one.
    #[serde(default)]
    recorder: Option<Object<RecorderFile>>,
}

#[derive(Deserialize)]
struct RecorderFile {
    pid: u32,
    /// `null` when the recorder's stat could not be read; of any other type, as good
    /// as that.
    #[serde(default)]
    starttime: Loose<u64>,
}

fn parse_record(bytes: &[u8]) -> Option<PidRecord> {
    // Through a `Value` first, as the records were always read: a repeated member
    // counts once (the last), where a struct read from the bytes would refuse it.
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let Object(file) = Object::<RecordFile>::deserialize(&v).ok()?;
    Some(PidRecord {
        pid: file.pid,
        starttime: file.starttime,
        session: file.session,
        recorder: file.recorder.map(|Object(r)| Recorder {
            pid: r.pid,
            starttime: r.starttime.into_inner(),
        }),
    })
}

/// Whether the group recorded in `rec` still has members that provably belong to it.
///
/// * Leader alive: it must still lead the group and have the recorded start time
///   (otherwise the number was reused by an unrelated process: leave it alone).
/// * Leader gone (the usual case: the death signal killed it, grandchildren survived):
///   a group id stays allocated while any member lives, so members with that group id,
///   the recorded session and a start time not before the leader's are the leftovers.
///   A zombie leader counts as gone: once the gateway died it was reparented to init,
///   and an init that reaps late or never (a container's pid 1 often does) leaves it a
///   zombie while its grandchildren run on — a restart right after a crash sees that.
fn group_is_ours(rec: &PidRecord) -> bool {
    if rec.pid <= 1 {
        return false;
    }
    if let Some(leader) = proc_stat(rec.pid)
        && !matches!(leader.state, 'Z' | 'X')
    {
        return leader.pgrp == i64::from(rec.pid) && leader.starttime == rec.starttime;
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

/// What a start-up scan of a pid record directory did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leftovers {
    /// Groups of dead recorders that were still running and were killed.
    pub killed: usize,
    /// Records left in place because their recorder may still run.
    pub kept: usize,
}

/// How records without a recorder are treated (see [`kill_leftovers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unattributed {
    /// Cannot prove the recorder dead: keep.
    Keep,
    /// Written by an older gateway that held the store lock we now hold: its recorder
    /// is dead.
    RecorderDead,
}

/// Kill the process groups recorded in `pid_dir` (this replica's directory under
/// `store.runtime_dir`) whose recording gateway is provably dead, after verifying each
/// still belongs to the recorded group (never kills unrelated processes nor children
/// of this process), and remove those records. Records of a recorder that may be alive
/// — another gateway sharing the directory — are neither killed nor removed. Call once
/// at gateway start, before any stdio pool starts.
pub fn kill_leftovers(pid_dir: &Path) -> Leftovers {
    scan(pid_dir, Unattributed::Keep)
}

/// [`kill_leftovers`] for the directory older gateways recorded children in
/// (`<store.path>/children`, one flat directory per store). Their records name no
/// recorder, but an older gateway recorded children only while holding the store's
/// lock, so once this process holds it, whoever wrote them is dead. The directory is
/// removed when it ends up empty, so this runs once after an upgrade.
///
/// Call only while holding the lock of the store whose legacy directory this is.
pub fn kill_legacy_leftovers(legacy_dir: &Path) -> Leftovers {
    let found = scan(legacy_dir, Unattributed::RecorderDead);
    // Fails (and is left for a later start) while anything is still in it.
    let _ = std::fs::remove_dir(legacy_dir);
    found
}

fn scan(pid_dir: &Path, unattributed: Unattributed) -> Leftovers {
    let mut found = Leftovers::default();
    let Ok(dir) = std::fs::read_dir(pid_dir) else {
        return found;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        // Only complete records: in-progress ones are dot-files ending in `.tmp`.
        if path.extension().and_then(|e| e.to_str()) != Some("json")
            || entry.file_name().to_string_lossy().starts_with('.')
        {
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // Its recorder removed it meanwhile (the child exited).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(record = %path.display(), error = %e, "cannot read pid record");
                continue;
            }
        };
        let Some(rec) = parse_record(&bytes) else {
            // Records are renamed into place whole, so this one can never be acted on
            // by anyone; keeping it would only repeat this warning on every start.
            tracing::warn!(record = %path.display(), "removing unreadable pid record");
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if is_live(rec.pid) {
            continue;
        }
        let recorder_dead = match (rec.recorder, unattributed) {
            (Some(r), _) => !r.may_be_alive(),
            (None, Unattributed::RecorderDead) => true,
            (None, Unattributed::Keep) => false,
        };
        if !recorder_dead {
            tracing::debug!(pid = rec.pid, recorder = ?rec.recorder, record = %path.display(),
                "pid record of a gateway that may still run; left alone");
            found.kept += 1;
            continue;
        }
        if group_is_ours(&rec) && kill_group(rec.pid, libc::SIGKILL) {
            tracing::warn!(pid = rec.pid, record = %path.display(),
                "killed leftover stdio upstream process group from a previous run");
            found.killed += 1;
        }
        let _ = std::fs::remove_file(&path);
    }
    found
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

    /// The record as it was read before the typed one, by lookups.
    fn by_lookup(bytes: &[u8]) -> Option<PidRecord> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        let recorder = match v.get("recorder") {
            None | Some(Value::Null) => None,
            Some(r) => Some(Recorder {
                pid: u32::try_from(r.get("pid")?.as_u64()?).ok()?,
                starttime: r.get("starttime").and_then(Value::as_u64),
            }),
        };
        Some(PidRecord {
            pid: u32::try_from(v.get("pid")?.as_u64()?).ok()?,
            starttime: v.get("starttime")?.as_u64()?,
            session: v.get("session")?.as_i64()?,
            recorder,
        })
    }

    #[test]
    fn records_read_as_the_lookups_did() {
        let written = r#"{"pid":41,"starttime":9,"session":-3,"upstream":"u","program":"p","recorder":{"pid":7,"starttime":11}}"#;
        assert_eq!(
            parse_record(written.as_bytes()),
            Some(PidRecord {
                pid: 41,
                starttime: 9,
                session: -3,
                recorder: Some(Recorder {
                    pid: 7,
                    starttime: Some(11)
                }),
            })
        );
        let numbers = [
            "",
            "0",
            "41",
            "-0",
            "-1",
            "1.0",
            "1e2",
            "4294967296",
            "18446744073709551616",
            "9223372036854775808",
            "null",
            r#""41""#,
            "[41]",
            "{}",
        ];
        let recorders = [
            "",
            "null",
            r#"{"pid":7}"#,
            r#"{"pid":7,"starttime":null}"#,
            r#"{"pid":7,"starttime":"11"}"#,
            r#"{"pid":7,"starttime":-0}"#,
            r#"{"pid":7,"starttime":1e3}"#,
            r#"{"pid":-7,"starttime":11}"#,
            r#"{"starttime":11}"#,
            "[7, 11]",
            "7",
            r#""r""#,
        ];
        let mut texts = vec![
            "[41, 9, -3]".to_string(),
            "41".into(),
            "not json".into(),
            r#"{"pid":1,"pid":2,"starttime":3,"session":4}"#.into(),
        ];
        for n in numbers {
            for (i, r) in recorders.iter().enumerate() {
                let member = |name: &str, v: &str| {
                    if v.is_empty() {
                        String::new()
                    } else {
                        format!(r#","{name}":{v}"#)
                    }
                };
                // Each member in turn takes the odd number; the others stay valid.
                let (pid, start, session) = match i % 3 {
                    0 => (n, "9", "-3"),
                    1 => ("41", n, "-3"),
                    _ => ("41", "9", n),
                };
                texts.push(format!(
                    r#"{{"upstream":"u"{}{}{}{}}}"#,
                    member("pid", pid),
                    member("starttime", start),
                    member("session", session),
                    member("recorder", r)
                ));
            }
        }
        for text in texts {
            assert_eq!(
                parse_record(text.as_bytes()),
                by_lookup(text.as_bytes()),
                "{text}"
            );
        }
    }

    #[test]
    fn special_group_ids_are_refused() {
        assert!(!kill_group(0, 0));
        assert!(!kill_group(1, 0));
        assert!(!kill_group(u32::MAX, 0));
    }
}
