//! Line framing of a stdio child's output: newline-delimited messages with a per-line
//! cap. Kept apart from the pool so it can be exercised on its own (property tests and
//! the fuzz targets in `fuzz/` feed it arbitrary byte streams in arbitrary chunks).

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What [`LineReader::next`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    Line(Vec<u8>),
    /// The line exceeded the limit; its remainder has been skipped.
    TooLong,
    Eof,
}

/// Newline-delimited reader with a per-line cap, so a child cannot make the gateway
/// buffer an unbounded line. Cancel-safe: partial lines survive a dropped `next()`.
pub(crate) struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            max,
            skipping: false,
        }
    }

    pub(crate) async fn next(&mut self) -> std::io::Result<Next> {
        loop {
            let avail = self.inner.fill_buf().await?;
            if avail.is_empty() {
                // An unterminated last line still counts as a message.
                return Ok(if self.buf.is_empty() || self.skipping {
                    self.skipping = false;
                    self.buf.clear();
                    Next::Eof
                } else {
                    Next::Line(std::mem::take(&mut self.buf))
                });
            }
            let newline = avail.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(avail.len());
            if self.skipping {
                self.inner.consume(take + usize::from(newline.is_some()));
                if newline.is_some() {
                    self.skipping = false;
                }
                continue;
            }
            if self.buf.len() + take > self.max {
                self.buf.clear();
                self.skipping = newline.is_none();
                self.inner.consume(take + usize::from(newline.is_some()));
                return Ok(Next::TooLong);
            }
            self.buf.extend_from_slice(&avail[..take]);
            self.inner.consume(take + usize::from(newline.is_some()));
            if newline.is_some() {
                return Ok(Next::Line(std::mem::take(&mut self.buf)));
            }
        }
    }
}
