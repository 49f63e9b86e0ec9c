//! The move's progress on stderr: one line rewritten in place on a terminal, plain
//! lines now and then otherwise (a log file, a pipe), and a line per kind when it is
//! done.

use std::io::Write;
use std::time::{Duration, Instant};

use super::report::{Kind, Tally};

/// What a move reports while it runs.
pub trait Progress {
    /// One batch of `kind` is written; `tally` is the kind's count so far.
    fn batch(&mut self, kind: Kind, tally: &Tally);
    /// Every entry of `kind` is written.
    fn done(&mut self, kind: Kind, tally: &Tally);
}

/// How often the line is redrawn on a terminal.
const REDRAW: Duration = Duration::from_millis(200);
/// How often a plain line is written otherwise.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// [`Progress`] on the process's stderr.
#[derive(Debug)]
pub struct StderrProgress {
    terminal: bool,
    /// When the current kind started, and when a line was last written.
    kind_started: Option<(Kind, Instant)>,
    last: Instant,
}

impl StderrProgress {
    pub fn new() -> Self {
        Self {
            terminal: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            kind_started: None,
            last: Instant::now(),
        }
    }

    fn started(&mut self, kind: Kind) -> Instant {
        match self.kind_started {
            Some((k, at)) if k == kind => at,
            _ => {
                let now = Instant::now();
                self.kind_started = Some((kind, now));
                now
            }
        }
    }
}

impl Default for StderrProgress {
    fn default() -> Self {
        Self::new()
    }
}

/// `n` per second over `since`.
fn rate(n: u64, since: Instant) -> u64 {
    let secs = since.elapsed().as_secs_f64();
    if secs < 0.001 {
        return 0;
    }
    (n as f64 / secs) as u64
}

impl Progress for StderrProgress {
    fn batch(&mut self, kind: Kind, tally: &Tally) {
        let started = self.started(kind);
        let every = if self.terminal { REDRAW } else { PLAIN_EVERY };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let done = tally.in_destination();
        let line = format!(
            "{}: {done} ({} copied, {} already there), {}/s",
            kind.name(),
            tally.copied,
            tally.already,
            rate(done, started)
        );
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr does not stop the move.
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    fn done(&mut self, kind: Kind, tally: &Tally) {
        let started = self.started(kind);
        let secs = started.elapsed().as_secs_f64();
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K");
        }
        let _ = writeln!(
            err,
            "{}: {} copied, {} already there ({} in the source) in {secs:.1} s",
            kind.name(),
            tally.copied,
            tally.already + tally.kept,
            tally.source
        );
        self.kind_started = None;
    }
}
