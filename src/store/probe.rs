//! Counts of the reads and record decodes a backend makes, for the tests that prove an
//! ownership lookup costs the same whatever exists (docs/design.md §7 "Ownership").
//! Backends call [`read`] and [`decode`] where they read or decode; outside tests both
//! compile to nothing. The counts are per thread: a test reads them on the thread
//! (a current-thread runtime) that made the calls.

#[cfg(test)]
thread_local! {
    static COUNTS: std::cell::Cell<Counts> = const { std::cell::Cell::new(Counts { reads: 0, decodes: 0 }) };
}

/// What this thread's store calls did so far.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Reads of the store (a tree lookup, a statement).
    pub(crate) reads: u64,
    /// Records decoded from their stored bytes.
    pub(crate) decodes: u64,
}

/// One read of the store (a tree lookup, a statement).
#[inline]
pub(crate) fn read() {
    #[cfg(test)]
    COUNTS.with(|c| {
        let mut n = c.get();
        n.reads += 1;
        c.set(n);
    });
}

/// One record decoded from its stored bytes.
#[inline]
pub(crate) fn decode() {
    #[cfg(test)]
    COUNTS.with(|c| {
        let mut n = c.get();
        n.decodes += 1;
        c.set(n);
    });
}

#[cfg(test)]
pub(crate) fn counts() -> Counts {
    COUNTS.with(std::cell::Cell::get)
}
