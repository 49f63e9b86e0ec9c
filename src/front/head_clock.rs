//! When a request head must be complete: `header_timeout_ms` after its first byte
//! (README "Configuration", Connections).
//!
//! hyper times a head from the moment an HTTP/1 connection starts waiting for one, so
//! on a kept-alive connection its timer also ran through the quiet gap between two
//! requests: an idle connection was closed after `header_timeout_ms` (10 s by default)
//! instead of `idle_timeout_ms` (60 s), and a client or the edge that reused it after
//! that met a closed socket. Here hyper's timer is ours: its sleep starts counting with
//! the first byte read after hyper began waiting, which [`HeadClockIo`] records. The
//! quiet gap belongs to `idle_timeout_ms` (src/front/conn.rs); a head that trickles in
//! byte by byte is still cut `header_timeout_ms` after it began.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Sleep, Timer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
// tokio's clock, which tests can pause; hyper hands its deadlines in std's.
use tokio::time::Instant;

/// One connection's head clock. Everything here happens on the connection's own task
/// (hyper polls its socket and its timer there), so the fields need no joint update.
pub(super) struct HeadClock {
    epoch: Instant,
    /// How many times hyper has begun waiting for a head.
    waits: AtomicU64,
    /// The wait during which the first byte of a head was read (`NO_WAIT`: none)...
    first_byte_wait: AtomicU64,
    /// ...and when, in ms since `epoch`.
    first_byte_ms: AtomicU64,
}

const NO_WAIT: u64 = u64::MAX;

impl HeadClock {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            waits: AtomicU64::new(0),
            first_byte_wait: AtomicU64::new(NO_WAIT),
            first_byte_ms: AtomicU64::new(0),
        })
    }

    /// hyper begins waiting for a head; returns which wait this is.
    fn arm(&self) -> u64 {
        let wait = self.waits.fetch_add(1, Ordering::Relaxed) + 1;
        // The first head's opening bytes were read before hyper began waiting for it,
        // by the protocol sniff (up to 24 bytes, all of a short head), and hyper parses
        // them from there: that head began with them.
        if wait == 1 && self.first_byte_wait.load(Ordering::Relaxed) == 0 {
            self.first_byte_wait.store(wait, Ordering::Relaxed);
        }
        wait
    }

    /// Bytes were read: the first since hyper began waiting starts the head's time.
    /// (Counted in waits, not milliseconds: a fast request's bytes and the wait for
    /// the next often fall in the same millisecond.)
    fn bytes_read(&self) {
        let wait = self.waits.load(Ordering::Relaxed);
        if self.first_byte_wait.load(Ordering::Relaxed) != wait {
            let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.first_byte_ms.store(now, Ordering::Relaxed);
            self.first_byte_wait.store(wait, Ordering::Relaxed);
        }
    }

    /// When the head of `wait` had its first byte, if it has.
    fn head_began(&self, wait: u64) -> Option<Instant> {
        (self.first_byte_wait.load(Ordering::Relaxed) == wait)
            .then(|| self.epoch + Duration::from_millis(self.first_byte_ms.load(Ordering::Relaxed)))
    }

    /// The timer to give hyper's HTTP/1 side (its only use there is the head timeout).
    pub(super) fn timer(self: &Arc<Self>) -> HeadTimer {
        HeadTimer(self.clone())
    }
}

/// hyper's timer for one connection: each sleep is a head deadline.
#[derive(Clone)]
pub(super) struct HeadTimer(Arc<HeadClock>);

impl Timer for HeadTimer {
    fn sleep(&self, limit: Duration) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadSleep {
            armed: self.0.arm(),
            clock: self.0.clone(),
            limit,
            started: false,
            sleep: None,
        })
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn Sleep>> {
        self.sleep(deadline.saturating_duration_since(std::time::Instant::now()))
    }

    /// hyper re-arms one sleep per head: in place, as tokio's timer does, rather than
    /// with a new one (two allocations per request).
    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, deadline: std::time::Instant) {
        let limit = deadline.saturating_duration_since(std::time::Instant::now());
        match sleep.as_mut().downcast_mut_pin::<HeadSleep>() {
            Some(s) => {
                let s = s.get_mut();
                s.armed = self.0.arm();
                s.limit = limit;
                s.started = false;
            }
            None => *sleep = self.sleep(limit),
        }
    }
}

/// Resolves `limit` after the first byte of the head it was armed for.
struct HeadSleep {
    clock: Arc<HeadClock>,
    /// The wait it was armed for ([`HeadClock::arm`]).
    armed: u64,
    limit: Duration,
    /// `sleep` is set to this head's deadline.
    started: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Sleep for HeadSleep {}

impl Future for HeadSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if !this.started {
            // No byte yet: nothing to time. hyper polls this only after a read of the
            // connection came back pending, and that read wakes the connection when
            // bytes arrive; this is polled again then.
            let Some(began) = this.clock.head_began(this.armed) else {
                return Poll::Pending;
            };
            let deadline = began + this.limit;
            match this.sleep.as_mut() {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => this.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            this.started = true;
        }
        match this.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection's socket that tells its [`HeadClock`] when bytes arrive.
    pub(super) struct HeadClockIo<I> {
        #[pin]
        io: I,
        clock: Arc<HeadClock>,
    }
}

impl<I> HeadClockIo<I> {
    pub(super) fn new(io: I, clock: Arc<HeadClock>) -> Self {
        Self { io, clock }
    }
}

impl<I: AsyncRead> AsyncRead for HeadClockIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.io.poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.clock.bytes_read();
        }
        r
    }
}

impl<I: AsyncWrite> AsyncWrite for HeadClockIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_head_is_timed_from_its_first_byte_not_from_the_wait() {
        let clock = HeadClock::new();
        let timer = clock.timer();
        let limit = Duration::from_millis(500);
        let mut sleep = timer.sleep(limit);
        // A quiet connection: ten limits pass and the deadline never comes.
        for _ in 0..10 {
            tokio::time::sleep(limit).await;
            assert!(futures_util::poll!(sleep.as_mut()).is_pending());
        }
        // The head's first byte starts its time.
        clock.bytes_read();
        assert!(futures_util::poll!(sleep.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(400)).await;
        // More bytes do not move it.
        clock.bytes_read();
        assert!(futures_util::poll!(sleep.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(futures_util::poll!(sleep.as_mut()).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_read_before_the_first_wait_start_the_first_head() {
        let clock = HeadClock::new();
        let timer = clock.timer();
        // The protocol sniff read a short head whole; nothing more comes.
        clock.bytes_read();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut sleep = timer.sleep(Duration::from_millis(500));
        assert!(futures_util::poll!(sleep.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(501)).await;
        assert!(futures_util::poll!(sleep.as_mut()).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn the_bytes_of_one_head_do_not_start_the_next() {
        let clock = HeadClock::new();
        let timer = clock.timer();
        let limit = Duration::from_millis(100);
        let mut second = timer.sleep(limit);
        clock.bytes_read();
        assert!(futures_util::poll!(second.as_mut()).is_pending());
        // The first head is done; hyper re-arms its sleep for the next (in place), in
        // the same millisecond as the bytes came.
        let deadline = std::time::Instant::now() + limit;
        timer.reset(&mut second, deadline);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(futures_util::poll!(second.as_mut()).is_pending());
        clock.bytes_read();
        assert!(futures_util::poll!(second.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(101)).await;
        assert!(futures_util::poll!(second.as_mut()).is_ready());
    }
}
