//! Stdio line framing (`upstream::stdio::framing::LineReader`).
//!
//! Properties:
//! - the messages read equal a plain split of the whole stream on `\n` (a line longer
//!   than the cap is one `TooLong`, an unterminated last line is a message, then `Eof`
//!   for ever), however the stream is chunked by the pipe;
//! - the same holds when `next()` is dropped while waiting for more bytes and called
//!   again (cancel safety: a partial line survives);
//! - every read makes progress (no busy loop).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncBufRead, AsyncRead, ReadBuf};

use super::Bytes;
use crate::upstream::stdio::framing::{LineReader, Next};

/// One framing input: the stream, the line cap, how the pipe chunks it, and which
/// waits drop the pending `next()`.
#[derive(Debug, Clone)]
pub struct Case {
    pub stream: Vec<u8>,
    pub max: usize,
    /// Chunk sizes (each at least 1), used in turn and cycled.
    pub chunks: Vec<usize>,
    /// Per wait, cycled: drop the pending `next()` and start a new one.
    pub drops: Vec<bool>,
}

pub fn fuzz(data: &[u8]) {
    let mut b = Bytes::new(data);
    let max = usize::from(b.u8());
    let chunks = b.short().iter().map(|c| usize::from(*c) + 1).collect();
    let mask = b.u8();
    let drops = (0..8).map(|i| mask & (1 << i) != 0).collect();
    check(&Case {
        stream: b.rest().to_vec(),
        max,
        chunks,
        drops,
    });
}

/// The messages a correct reader yields for the whole stream, ending with one `Eof`.
pub(crate) fn expected(stream: &[u8], max: usize) -> Vec<Next> {
    let mut lines: Vec<&[u8]> = stream.split(|b| *b == b'\n').collect();
    // `split` always yields a last piece: what follows the last newline.
    let last = lines.pop().unwrap_or_default();
    if !last.is_empty() {
        lines.push(last);
    }
    let mut out: Vec<Next> = lines
        .into_iter()
        .map(|l| {
            if l.len() > max {
                Next::TooLong
            } else {
                Next::Line(l.to_vec())
            }
        })
        .collect();
    out.push(Next::Eof);
    out
}

pub fn check(case: &Case) {
    let want = expected(&case.stream, case.max);
    let got = read_all(case);
    assert_eq!(got, want, "framing of {:?} (max {})", case.stream, case.max);
}

/// Read until `Eof`, then once more (it must stay at `Eof`).
fn read_all(case: &Case) -> Vec<Next> {
    let pipe = Pipe::new(&case.stream, &case.chunks);
    let mut reader = LineReader::new(pipe, case.max);
    let mut drops = case.drops.iter().copied().cycle();
    let mut out = Vec::new();
    // Every message consumes at least one byte or one wait, so this bounds a busy loop.
    let mut budget = 4 * case.stream.len() + 64;
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let got = loop {
            let mut fut = pin!(reader.next());
            let polled = loop {
                budget = budget.checked_sub(1).expect("LineReader made no progress");
                match fut.as_mut().poll(&mut cx) {
                    Poll::Ready(r) => break Some(r),
                    Poll::Pending if drops.next().unwrap_or(false) => break None,
                    Poll::Pending => {}
                }
            };
            if let Some(r) = polled {
                break r.expect("an in-memory pipe never fails");
            }
        };
        let eof = got == Next::Eof;
        out.push(got);
        if eof {
            break;
        }
    }
    let again = super::complete(reader.next(), 4).expect("an in-memory pipe never fails");
    assert_eq!(again, Next::Eof, "a second read after Eof");
    out
}

/// An in-memory pipe that hands out the stream in the given chunk sizes and says
/// "not yet" once before each new chunk, like a real pipe between writes.
struct Pipe {
    rest: VecDeque<u8>,
    chunks: Vec<usize>,
    next_chunk: usize,
    /// Bytes of the current chunk (a prefix of `rest`) not yet consumed.
    ready: usize,
    waited: bool,
    current: Vec<u8>,
}

impl Pipe {
    fn new(stream: &[u8], chunks: &[usize]) -> Self {
        Self {
            rest: stream.iter().copied().collect(),
            chunks: if chunks.is_empty() {
                vec![usize::MAX]
            } else {
                chunks.iter().map(|c| (*c).max(1)).collect()
            },
            next_chunk: 0,
            ready: 0,
            waited: false,
            current: Vec::new(),
        }
    }
}

impl AsyncRead for Pipe {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let avail = match Pin::new(&mut *this).poll_fill_buf(cx) {
            Poll::Ready(Ok(a)) => a,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let n = avail.len().min(buf.remaining());
        buf.put_slice(&avail[..n]);
        Pin::new(this).consume(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncBufRead for Pipe {
    fn poll_fill_buf(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.ready == 0 && !this.rest.is_empty() {
            if !this.waited {
                this.waited = true;
                return Poll::Pending;
            }
            this.waited = false;
            let size = this.chunks[this.next_chunk % this.chunks.len()];
            this.next_chunk += 1;
            this.ready = size.min(this.rest.len());
            this.current = this.rest.iter().take(this.ready).copied().collect();
        }
        let start = this.current.len() - this.ready;
        Poll::Ready(Ok(&this.current[start..]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        let amt = amt.min(this.ready);
        this.ready -= amt;
        this.rest.drain(..amt);
    }
}
