//! Where log lines go: a memory buffer that one background thread writes to stderr.
//!
//! Every request logs one line (README "Limits and metrics", "Logs"). Written straight
//! to stderr that is one `write(2)` under stderr's lock per request, which measured
//! ~20% of the gateway's CPU under a `tasks/get` load (benches/RESULTS.md). Here a
//! request only appends its line to a buffer; the writer thread drains it every
//! `TICK` (or sooner when it fills up), so a burst of lines costs one write. Lines
//! stay whole and in order.
//!
//! Bounded: when stderr cannot keep up and `MAX_BUFFERED` bytes are waiting, further
//! lines are dropped and counted, and a line saying how many were dropped is written
//! once the writer catches up — a blocked log reader never stalls requests, and a
//! loss is never silent. [`flush`] writes what is buffered at once; `main` calls it
//! before the process exits, and a panic flushes before its message.

use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tracing_subscriber::fmt::MakeWriter;

/// How often the writer thread drains the buffer.
const TICK: Duration = Duration::from_millis(20);
/// Wake the writer early once this much is waiting.
const EARLY_WAKE: usize = 64 * 1024;
/// Drop lines beyond this much waiting.
const MAX_BUFFERED: usize = 16 * 1024 * 1024;

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    dropped_lines: u64,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// Serialises drains (the writer thread vs `flush`), so lines keep their order.
    draining: Mutex<()>,
}

impl Shared {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    fn new() -> Self {
        Self {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            draining: Mutex::new(()),
        }
    }

    /// Buffer one formatted line, or count it as dropped when the buffer is full.
    fn append(&self, line: &[u8]) {
        let mut p = self.lock();
        if p.bytes.len() + line.len() > MAX_BUFFERED {
            p.dropped_lines += 1;
        } else {
            p.bytes.extend_from_slice(line);
            if p.bytes.len() >= EARLY_WAKE {
                self.wake.notify_one();
            }
        }
    }

    /// Everything buffered so far and the count of dropped lines, leaving both empty.
    fn take(&self) -> (Vec<u8>, u64) {
        let mut p = self.lock();
        (
            std::mem::take(&mut p.bytes),
            std::mem::take(&mut p.dropped_lines),
        )
    }

    /// Write out everything buffered so far.
    fn drain(&self) {
        let _order = self.draining.lock();
        let (bytes, dropped) = self.take();
        let mut err = std::io::stderr().lock();
        // Nowhere to report a failing stderr: the lines are lost either way.
        let _ = err.write_all(&bytes);
        if dropped > 0 {
            let _ = writeln!(
                err,
                "taskgate: {dropped} log lines dropped (stderr did not keep up)"
            );
        }
        let _ = err.flush();
    }
}

static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();

fn shared() -> &'static Arc<Shared> {
    SHARED.get_or_init(|| {
        let s = Arc::new(Shared::new());
        let bg = s.clone();
        let spawned = std::thread::Builder::new()
            .name("taskgate-log".into())
            .spawn(move || {
                loop {
                    {
                        let mut p = bg.lock();
                        let _ =
                            bg.wake
                                .wait_while_for(&mut p, |p| p.bytes.len() < EARLY_WAKE, TICK);
                    }
                    bg.drain();
                }
            });
        if let Err(e) = spawned {
            // Without the thread lines would pile up: say so (they still go out on
            // every `flush`).
            let _ = writeln!(std::io::stderr(), "taskgate: log writer thread: {e}");
        }
        s
    })
}

/// The `tracing_subscriber` writer for the buffered stderr sink.
#[derive(Clone, Copy, Default)]
pub struct Sink;

/// One event's writer: `tracing_subscriber` formats a whole line and hands it over in
/// one `write_all`.
pub struct LineWriter;

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        shared().append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter
    }
}

/// Write out everything buffered now (before exit; from the panic hook).
pub fn flush() {
    if let Some(s) = SHARED.get() {
        s.drain();
    }
}

/// Make a panic flush buffered lines before its own message.
pub fn flush_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush();
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_their_order_and_overflow_is_counted_not_buffered() {
        let s = Shared::new();
        s.append(b"one\n");
        s.append(b"two\n");
        let big = vec![b'x'; MAX_BUFFERED];
        s.append(&big);
        s.append(b"three\n");
        let (bytes, dropped) = s.take();
        assert_eq!(
            bytes, b"one\ntwo\nthree\n",
            "a line that fits still goes in"
        );
        assert_eq!(dropped, 1, "the line that did not fit");
        assert_eq!(s.take(), (Vec::new(), 0));
    }
}
