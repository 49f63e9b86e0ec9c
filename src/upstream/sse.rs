//! Incremental Server-Sent Events parser for legacy upstream streams (MCP 2025-11-25
//! "Transports", "Streamable HTTP").
//!
//! Bytes go in as they arrive from the network, in chunks of any size; whole events
//! come out. The parser follows the WHATWG "interpreting an event stream" rules:
//!
//! - lines end with CRLF, LF or CR (a CR at the end of one chunk followed by an LF at
//!   the start of the next is one line end, not two);
//! - a leading UTF-8 BOM is skipped; lines starting with `:` are comments;
//! - `field: value` strips exactly one space after the colon; a line without a colon
//!   is a field with an empty value;
//! - `data` lines are joined with `\n`; `retry` is honoured only when it is all ASCII
//!   digits; an `id` containing NUL is ignored;
//! - a blank line dispatches the event; an incomplete event at end of stream is
//!   discarded.
//!
//! One deliberate difference: an event block with no data but with an `id`, `retry`
//! or `event` field is still returned, with `data` empty. MCP 2025-11-25 servers send
//! such *priming events* (SEP-1699) to hand out a resumption id before closing the
//! connection, and the upstream client needs to see them. Blocks made only of comments
//! produce nothing.
//!
//! Memory is bounded: an event (data plus the line being read) larger than
//! `max_event_bytes` is an error, so a misbehaving upstream cannot grow the buffer
//! without limit. The check is made on every line as a whole, so whether a stream is
//! refused never depends on how the network chunked it.

use std::fmt;

/// One dispatched SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `id` field of this event, if it carried one.
    pub id: Option<String>,
    /// The `event` field (event type), if any. `None` means the default `message`.
    pub event: Option<String>,
    /// The data lines joined with `\n`; empty for a priming event.
    pub data: String,
    /// A valid `retry` field (milliseconds) seen in this event, if any.
    pub retry: Option<u64>,
}

impl SseEvent {
    /// An event with no data: only ids, retry hints or a type (2025-11-25 priming).
    pub fn is_priming(&self) -> bool {
        self.data.is_empty()
    }
}

/// Why the parser refused the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event (or one line) grew beyond the configured maximum.
    #[error("SSE event exceeds {limit} bytes")]
    EventTooLarge { limit: usize },
}

/// Incremental SSE parser. Feed it bytes with [`SseParser::feed`].
pub struct SseParser {
    max_event_bytes: usize,
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended with CR, so a leading LF of the next chunk is part of
    /// the same line end.
    after_cr: bool,
    /// Still at the very start of the stream (a BOM may follow).
    at_start: bool,
    /// Whether any field other than comments was seen in the current block.
    has_fields: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    /// Latest id dispatched (WHATWG "last event ID"), persists across events.
    last_event_id: Option<String>,
    /// Latest valid retry value seen anywhere in the stream.
    reconnect_ms: Option<u64>,
    failed: bool,
}

impl fmt::Debug for SseParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseParser")
            .field("max_event_bytes", &self.max_event_bytes)
            .field("buffered", &(self.line.len() + self.data.len()))
            .field("last_event_id", &self.last_event_id)
            .finish()
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    /// A parser refusing events larger than `max_event_bytes` (at least 1).
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes: max_event_bytes.max(1),
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            has_fields: false,
            data: String::new(),
            has_data: false,
            event: None,
            id: None,
            retry: None,
            last_event_id: None,
            reconnect_ms: None,
            failed: false,
        }
    }

    /// The id of the most recently dispatched event that carried one (what a client
    /// sends as `Last-Event-ID` when it reconnects).
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The latest valid `retry` value seen, including in an event not yet dispatched
    /// (a server may send `retry:` and close the connection at once).
    pub fn reconnect_ms(&self) -> Option<u64> {
        self.reconnect_ms
    }

    /// Feed a chunk of bytes; returns the events completed by it, in order. After an
    /// error the parser stays failed and returns the same error.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        if self.failed {
            return Err(self.too_large());
        }
        let mut out = Vec::new();
        if self.after_cr && !chunk.is_empty() {
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
            self.after_cr = false;
        }
        while !chunk.is_empty() {
            match chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(pos) => {
                    self.line.extend_from_slice(&chunk[..pos]);
                    let ended_with_cr = chunk[pos] == b'\r';
                    chunk = &chunk[pos + 1..];
                    if ended_with_cr {
                        if chunk.is_empty() {
                            self.after_cr = true;
                        } else if chunk[0] == b'\n' {
                            chunk = &chunk[1..];
                        }
                    }
                    // The whole line counts against the limit, however it was
                    // chunked (a line that arrived in one chunk is never checked
                    // below while it is being read).
                    if self.line.len() + self.data.len() > self.max_event_bytes {
                        self.failed = true;
                        return Err(self.too_large());
                    }
                    let line = std::mem::take(&mut self.line);
                    self.process_line(&line, &mut out)?;
                }
                None => {
                    self.line.extend_from_slice(chunk);
                    chunk = &[];
                }
            }
            if self.line.len() + self.data.len() > self.max_event_bytes {
                self.failed = true;
                return Err(self.too_large());
            }
        }
        Ok(out)
    }

    fn too_large(&self) -> SseError {
        SseError::EventTooLarge {
            limit: self.max_event_bytes,
        }
    }

    fn process_line(&mut self, mut line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.at_start {
            self.at_start = false;
            if let Some(rest) = line.strip_prefix(BOM) {
                line = rest;
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        // Lines never split a multi-byte UTF-8 sequence (CR and LF are ASCII), so
        // decoding per line equals decoding the stream (invalid bytes become U+FFFD).
        let value = String::from_utf8_lossy(value);
        match name {
            b"event" => {
                self.has_fields = true;
                self.event = Some(value.into_owned());
            }
            b"data" => {
                self.has_fields = true;
                if self.has_data {
                    self.data.push('\n');
                }
                self.has_data = true;
                self.data.push_str(&value);
                if self.data.len() > self.max_event_bytes {
                    self.failed = true;
                    return Err(self.too_large());
                }
            }
            // An id containing NUL is ignored entirely (WHATWG).
            b"id" if !value.contains('\0') => {
                self.has_fields = true;
                self.id = Some(value.into_owned());
            }
            b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // All digits but too large for u64: saturate rather than ignore.
                let ms = value.parse::<u64>().unwrap_or(u64::MAX);
                self.has_fields = true;
                self.retry = Some(ms);
                self.reconnect_ms = Some(ms);
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if let Some(id) = &self.id {
            // WHATWG: an empty id resets the last event id.
            self.last_event_id = if id.is_empty() {
                None
            } else {
                Some(id.clone())
            };
        }
        if self.has_fields {
            out.push(SseEvent {
                id: self.id.take(),
                event: self.event.take(),
                data: std::mem::take(&mut self.data),
                retry: self.retry.take(),
            });
        }
        self.has_fields = false;
        self.has_data = false;
        self.data.clear();
        self.event = None;
        self.id = None;
        self.retry = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Vec<SseEvent> {
        SseParser::new(1 << 20).feed(input).unwrap()
    }

    fn data(events: &[SseEvent]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn line_endings_lf_crlf_cr() {
        let lf = all(b"data: a\n\ndata: b\n\n");
        let crlf = all(b"data: a\r\n\r\ndata: b\r\n\r\n");
        let cr = all(b"data: a\r\rdata: b\r\r");
        assert_eq!(data(&lf), ["a", "b"]);
        assert_eq!(lf, crlf);
        assert_eq!(lf, cr);
    }

    #[test]
    fn multi_line_data_and_fields() {
        let ev = all(b"event: message\nid: 7\ndata: {\"a\":\ndata:1}\nretry: 250\n\n");
        assert_eq!(
            ev,
            [SseEvent {
                id: Some("7".into()),
                event: Some("message".into()),
                data: "{\"a\":\n1}".into(),
                retry: Some(250),
            }]
        );
    }

    #[test]
    fn comments_and_unknown_fields_ignored() {
        let ev = all(b": keep-alive\n\n:another\nfoo: bar\ndata: x\n\n");
        assert_eq!(data(&ev), ["x"]);
    }

    #[test]
    fn only_one_space_stripped_and_colonless_field() {
        let ev = all(b"data:  two\ndata\n\n");
        assert_eq!(data(&ev), [" two\n"]);
    }

    #[test]
    fn retry_digits_only() {
        let ev = all(b"retry: 12a\ndata: x\n\nretry: -5\ndata: y\n\nretry:\ndata: z\n\n");
        assert!(ev.iter().all(|e| e.retry.is_none()));
        let mut p = SseParser::new(1024);
        p.feed(b"retry: 3000\n").unwrap();
        assert_eq!(p.reconnect_ms(), Some(3000));
    }

    #[test]
    fn priming_event_with_empty_data() {
        let mut p = SseParser::new(1024);
        let ev = p.feed(b"id: prime-1\nretry: 100\ndata:\n\n").unwrap();
        assert_eq!(ev.len(), 1);
        assert!(ev[0].is_priming());
        assert_eq!(ev[0].id.as_deref(), Some("prime-1"));
        assert_eq!(ev[0].retry, Some(100));
        assert_eq!(p.last_event_id(), Some("prime-1"));
        // id-only block without any data line is also a priming event.
        let ev = p.feed(b"id: prime-2\n\n").unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(p.last_event_id(), Some("prime-2"));
    }

    #[test]
    fn chunk_boundaries_anywhere() {
        let input = b"id: 1\r\ndata: hello\r\ndata: world\r\n\r\n: c\r\ndata: 2\r\r";
        let whole = all(input);
        for split in 0..input.len() {
            let mut p = SseParser::new(1024);
            let mut got = p.feed(&input[..split]).unwrap();
            got.extend(p.feed(&input[split..]).unwrap());
            assert_eq!(got, whole, "split at {split}");
        }
        // Byte by byte, too (CR at chunk end followed by LF).
        let mut p = SseParser::new(1024);
        let mut got = Vec::new();
        for b in input {
            got.extend(p.feed(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(got, whole);
        assert_eq!(data(&whole), ["hello\nworld", "2"]);
    }

    #[test]
    fn bom_skipped_and_incomplete_event_not_dispatched() {
        let ev = all(b"\xEF\xBB\xBFdata: a\n\ndata: partial\n");
        assert_eq!(data(&ev), ["a"]);
    }

    #[test]
    fn null_in_id_ignored() {
        let ev = all(b"id: a\0b\ndata: x\n\n");
        assert_eq!(ev[0].id, None);
    }

    #[test]
    fn max_event_size() {
        let mut p = SseParser::new(16);
        assert!(p.feed(b"data: 0123456789\n\n").is_ok());
        let err = p
            .feed(b"data: 0123456789\ndata: 0123456789\n\n")
            .unwrap_err();
        assert_eq!(err, SseError::EventTooLarge { limit: 16 });
        assert!(p.feed(b"data: x\n\n").is_err(), "stays failed");
        // An endless line without terminator is caught too.
        let mut p = SseParser::new(16);
        assert!(p.feed(&[b'a'; 64]).is_err());
    }

    #[test]
    fn limit_does_not_depend_on_chunking() {
        // A 28-byte `event` line against a 16-byte limit: refused whether it arrives
        // in one chunk or in two (before, only the split line was refused).
        let input = b"event: 0123456789abcdefghij\n\ndata: x\n\n";
        let mut whole = SseParser::new(16);
        assert_eq!(
            whole.feed(input),
            Err(SseError::EventTooLarge { limit: 16 })
        );
        let mut split = SseParser::new(16);
        assert!(split.feed(&input[..20]).is_err());
        // Data lines count with their field name, as they do while being read.
        let input = b"data: 01234567\ndata: 0123456\n\n";
        let mut whole = SseParser::new(16);
        assert!(whole.feed(input).is_err());
        let mut bytes = SseParser::new(16);
        assert!(
            input
                .iter()
                .any(|b| bytes.feed(std::slice::from_ref(b)).is_err())
        );
    }
}
