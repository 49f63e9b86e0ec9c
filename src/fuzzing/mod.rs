//! Property checks over untrusted input, shared by the proptests (`props.rs`, run by
//! `cargo test` on stable) and the cargo-fuzz targets in `fuzz/` (README "Fuzzing").
//!
//! Each submodule has a `Case` (one structured input), a `check(&Case)` that runs the
//! code under test on it and panics when a property fails, and a `fuzz(&[u8])` that
//! decodes raw fuzzer bytes into a `Case` and checks it. The proptests build `Case`s
//! with strategies; the fuzz targets call `fuzz`. So both run the same checks, and a
//! crash input from the fuzzer replays as `fuzz(bytes)` in a unit test.
//!
//! Compiled only for tests and with the `fuzzing` feature: the panics here are the
//! harness reporting a broken property, never reachable from the gateway.

pub mod auth;
pub mod config;
pub mod framing;
pub mod sse;
pub mod wire;

#[cfg(test)]
mod props;
#[cfg(test)]
mod regressions;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Reads structured choices off the front of fuzzer bytes; past the end every read
/// yields zeros or empty slices, so any input decodes to some case.
pub(crate) struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// One of `n` choices (`n > 0`).
    pub(crate) fn choose(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }

    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A slice preceded by its one-byte length.
    pub(crate) fn short(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.take(n)
    }

    /// `short()` as text (invalid UTF-8 replaced).
    pub(crate) fn text(&mut self) -> String {
        String::from_utf8_lossy(self.short()).into_owned()
    }

    pub(crate) fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// Run a future that must complete without waiting for anything (in-memory readers,
/// static keys): polled with a no-op waker until it is ready, at most `polls` times.
pub(crate) fn complete<F: Future>(fut: F, polls: usize) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..polls.max(1) {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("future still pending after {polls} polls");
}
