//! The upstream SSE parser (`upstream::sse::SseParser`).
//!
//! Properties:
//! - chunking never matters: fed whole, byte by byte or in any chunks, a stream gives
//!   the same events, the same `last_event_id` and `reconnect_ms`, and fails (event too
//!   large) on all of them or none; events handed out before a failure are a prefix of
//!   those the byte-by-byte run handed out; a failed parser stays failed;
//! - no event's data exceeds the limit, and no id contains NUL;
//! - events written out in the SSE syntax — any mix of LF, CRLF and CR line ends,
//!   comments, unknown fields, with or without the optional space and BOM — parse back
//!   to exactly those events.

use super::Bytes;
use crate::upstream::sse::{SseError, SseEvent, SseParser};

/// Event syntax one stream is written in.
#[derive(Debug, Clone)]
pub enum Case {
    /// Arbitrary bytes, split into chunks (sizes cycled, each at least 1).
    Raw {
        stream: Vec<u8>,
        max_event_bytes: usize,
        chunks: Vec<usize>,
    },
    /// Well-formed events, serialised with the given choices.
    Events {
        events: Vec<Ev>,
        bom: bool,
        style: Vec<u8>,
    },
}

/// One well-formed event. `data` holds the data lines (none: a field-only event).
#[derive(Debug, Clone)]
pub struct Ev {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Vec<String>,
    pub retry: Option<u64>,
    /// Comment lines written first.
    pub comments: Vec<String>,
}

pub fn fuzz(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.bool() {
        let max_event_bytes = usize::from(b.u16()) + 1;
        let chunks = b.short().iter().map(|c| usize::from(*c) + 1).collect();
        check(&Case::Raw {
            stream: b.rest().to_vec(),
            max_event_bytes,
            chunks,
        });
    } else {
        let bom = b.bool();
        let style = b.short().to_vec();
        let mut events = Vec::new();
        for _ in 0..b.choose(8) {
            let field = |b: &mut Bytes<'_>| b.bool().then(|| clean(&b.text()));
            let id = field(&mut b).map(|s| s.replace('\0', ""));
            let event = field(&mut b);
            let data = (0..b.choose(4)).map(|_| clean(&b.text())).collect();
            let retry = b.bool().then(|| u64::from(b.u16()));
            let comments = (0..b.choose(3)).map(|_| clean(&b.text())).collect();
            events.push(Ev {
                id,
                event,
                data,
                retry,
                comments,
            });
        }
        check(&Case::Events { events, bom, style });
    }
}

/// A field value as the syntax can carry it: no line ends.
pub fn clean(s: &str) -> String {
    s.replace(['\r', '\n'], "")
}

pub fn check(case: &Case) {
    match case {
        Case::Raw {
            stream,
            max_event_bytes,
            chunks,
        } => check_chunking(stream, *max_event_bytes, chunks),
        Case::Events { events, bom, style } => check_round_trip(events, *bom, style),
    }
}

struct Run {
    events: Vec<SseEvent>,
    failed: Option<SseError>,
    last_event_id: Option<String>,
    reconnect_ms: Option<u64>,
}

fn run<'a>(max: usize, pieces: impl IntoIterator<Item = &'a [u8]>) -> Run {
    let mut p = SseParser::new(max);
    let mut events = Vec::new();
    let mut failed = None;
    for piece in pieces {
        match p.feed(piece) {
            Ok(evs) => events.extend(evs),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if let Some(e) = &failed {
        assert_eq!(
            p.feed(b"data: x\n\n").as_ref(),
            Err(e),
            "a failed parser stays failed"
        );
    }
    Run {
        events,
        failed,
        last_event_id: p.last_event_id().map(str::to_owned),
        reconnect_ms: p.reconnect_ms(),
    }
}

fn chunked<'a>(stream: &'a [u8], chunks: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = stream;
    let mut sizes = chunks.iter().map(|c| (*c).max(1)).cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(usize::MAX).min(rest.len());
        let (head, tail) = rest.split_at(n);
        out.push(head);
        rest = tail;
    }
    out
}

fn check_chunking(stream: &[u8], max: usize, chunks: &[usize]) {
    let bytes = run(max, stream.chunks(1));
    let whole = run(max, [stream]);
    let split = run(max, chunked(stream, chunks));
    for ev in &bytes.events {
        assert!(ev.data.len() <= max, "event data over the limit: {ev:?}");
        assert!(ev.id.as_deref().is_none_or(|i| !i.contains('\0')), "{ev:?}");
    }
    for (name, other) in [("whole", &whole), ("chunked", &split)] {
        assert_eq!(
            other.failed, bytes.failed,
            "{name} vs byte-by-byte: failure differs on {stream:?} (max {max})"
        );
        if bytes.failed.is_none() {
            assert_eq!(
                other.events, bytes.events,
                "{name}: events differ on {stream:?}"
            );
            assert_eq!(other.last_event_id, bytes.last_event_id, "{name}: last id");
            assert_eq!(other.reconnect_ms, bytes.reconnect_ms, "{name}: retry");
        } else {
            assert!(
                bytes.events.starts_with(&other.events),
                "{name}: events before the failure are not a prefix on {stream:?}"
            );
        }
    }
}

/// Serialise `events`, with `style` bytes (cycled) choosing line ends and spellings.
pub fn serialise(events: &[Ev], bom: bool, style: &[u8]) -> Vec<u8> {
    let mut choices = style.iter().copied().chain(std::iter::repeat(0)).cycle();
    let mut pick = move || choices.next().unwrap_or(0);
    let mut out = Vec::new();
    if bom {
        out.extend_from_slice(b"\xEF\xBB\xBF");
    }
    // A CR line end followed by an empty line ended by LF would read as one CRLF.
    let mut after_cr = false;
    let mut line = |out: &mut Vec<u8>, text: &str, c: u8| {
        out.extend_from_slice(text.as_bytes());
        let end: &[u8] = match c % 3 {
            0 => b"\n",
            1 => b"\r\n",
            _ => b"\r",
        };
        let end = if after_cr && text.is_empty() && end == b"\n" {
            b"\r\n"
        } else {
            end
        };
        out.extend_from_slice(end);
        after_cr = end == b"\r";
    };
    let field = |name: &str, value: &str, c: u8| {
        // `name:value` is allowed only when the value does not start with a space
        // (exactly one leading space is stripped).
        if c & 4 != 0 && !value.starts_with(' ') {
            format!("{name}:{value}")
        } else {
            format!("{name}: {value}")
        }
    };
    for ev in events {
        for c in &ev.comments {
            line(&mut out, &format!(":{c}"), pick());
        }
        let c = pick();
        if c & 8 != 0 {
            line(&mut out, "x-unknown: ignored", pick());
        }
        if let Some(id) = &ev.id {
            line(&mut out, &field("id", id, c), pick());
        }
        if let Some(event) = &ev.event {
            line(&mut out, &field("event", event, c), pick());
        }
        for d in &ev.data {
            // A colon-less `data` line is a data line with an empty value.
            if d.is_empty() && c & 16 != 0 {
                line(&mut out, "data", pick());
            } else {
                line(&mut out, &field("data", d, c), pick());
            }
        }
        if let Some(r) = ev.retry {
            line(&mut out, &field("retry", &r.to_string(), c), pick());
        }
        line(&mut out, "", pick());
    }
    out
}

fn check_round_trip(events: &[Ev], bom: bool, style: &[u8]) {
    let stream = serialise(events, bom, style);
    let mut want = Vec::new();
    let mut last_id: Option<String> = None;
    let mut reconnect = None;
    for ev in events {
        if let Some(id) = &ev.id {
            last_id = Some(id.clone()).filter(|i| !i.is_empty());
        }
        if ev.retry.is_some() {
            reconnect = ev.retry;
        }
        if ev.id.is_none() && ev.event.is_none() && ev.data.is_empty() && ev.retry.is_none() {
            continue; // comments only: nothing is dispatched
        }
        want.push(SseEvent {
            id: ev.id.clone(),
            event: ev.event.clone(),
            data: ev.data.join("\n"),
            retry: ev.retry,
        });
    }
    let got = run(usize::MAX, [stream.as_slice()]);
    assert_eq!(got.failed, None);
    assert_eq!(
        got.events,
        want,
        "round trip of {:?}",
        String::from_utf8_lossy(&stream)
    );
    assert_eq!(got.last_event_id, last_id);
    assert_eq!(got.reconnect_ms, reconnect);
    // And chunking still does not matter for well-formed streams.
    check_chunking(&stream, usize::MAX / 2, &[1, 2, 3, 5, 7]);
}
