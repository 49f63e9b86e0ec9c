//! Where the upstream HTTP client runs its background work: each connection's I/O
//! (reading the upstream's answers, writing the requests) and the pool's idle
//! watchers are futures hyper's client hands to an executor.
//!
//! This executor spawns them on the runtime inside [`ConnectionTask`], a future of
//! our own whose `poll` is never inlined. The hot-path guard (`benches/hotpath/run.sh`)
//! counts an inline call's upstream work by that symbol: hyper's own connection future
//! was inlined into the runtime's task in some builds and not in others (with the
//! `edge` feature it was), so the guard had counted the upstream's answers in one
//! build and missed them in the build CI checks (benches/RESULTS.md, "The hot-path
//! guard's blind spot").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// One background future of the upstream HTTP client.
    pub(super) struct ConnectionTask<F> {
        #[pin]
        inner: F,
    }
}

impl<F: Future> Future for ConnectionTask<F> {
    type Output = F::Output;

    // Never inlined, so the symbol exists in every build for callgrind to toggle on.
    #[inline(never)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

/// The executor given to the upstream's `hyper_util` client.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ConnectionExecutor;

impl<F> hyper::rt::Executor<F> for ConnectionExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(ConnectionTask { inner: fut });
    }
}
