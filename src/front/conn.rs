//! Client connections: how long a connection may stay silent or idle, and what happens
//! at the connection cap (README "Configuration", Connections).
//!
//! - A connection must send its first byte within `header_timeout_ms`: hyper-util's
//!   protocol sniff (HTTP/1 or h2c) waits for bytes forever, so without this a socket
//!   that never speaks holds a connection slot for good.
//! - An HTTP/1 request head must be complete `header_timeout_ms` after its first byte
//!   (src/front/head_clock.rs: hyper's own timer would also time the idle gap before
//!   it).
//! - A connection with no request in flight is closed after `idle_timeout_ms`. A
//!   response counts as in flight until its body is done, so an SSE stream is never
//!   idle.
//! - At `max_connections`, the connection idle the longest is closed so the new client
//!   is served; only when every connection is busy does the new one wait.
//!
//! - With TLS (README "TLS"), the handshake must also finish within
//!   `header_timeout_ms`; it happens on the connection's own task, so a slow client
//!   never holds up the accept loop. ALPN picks h2 or HTTP/1.1.
//!
//! The same rules serve the main listener and `metrics_listen`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceBuilder};

use super::head_clock::{HeadClock, HeadClockIo};
use super::reply::Body;
use crate::config::ServerConfig;

/// The connection rules of one listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnPolicy {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub drain_grace: Duration,
}

impl ConnPolicy {
    pub fn from_config(s: &ServerConfig) -> Self {
        Self {
            header_timeout: s.header_timeout,
            idle_timeout: s.idle_timeout,
            max_connections: s.max_connections,
            drain_grace: s.drain_grace,
        }
    }
}

/// What the listener knows about one open connection.
struct ConnState {
    /// Responses not yet fully sent (an SSE stream counts until it ends).
    in_flight: AtomicUsize,
    /// When a request last started or a response last finished, in ms since
    /// [`Registry::epoch`].
    last_active_ms: AtomicU64,
    /// Asks the connection to close once its in-flight responses are done.
    close: CancellationToken,
}

/// TLS on a listener: the acceptor (its certificate reloads underneath, see
/// `tls::server`) and the listener's name for logs and metrics.
#[derive(Clone)]
pub struct ListenerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    name: &'static str,
}

impl ListenerTls {
    pub fn new(config: Arc<rustls::ServerConfig>, name: &'static str) -> Self {
        Self {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            name,
        }
    }
}

/// The open connections of one listener.
struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
}

impl Registry {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn add(&self) -> (u64, Arc<ConnState>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(self.now_ms()),
            close: CancellationToken::new(),
        });
        self.conns.lock().insert(id, state.clone());
        (id, state)
    }

    fn remove(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// Ask the connection idle the longest (nothing in flight, not already closing) to
    /// close. `false` when every connection is busy.
    fn close_most_idle(&self) -> bool {
        let conns = self.conns.lock();
        let victim = conns
            .values()
            .filter(|c| c.in_flight.load(Ordering::Acquire) == 0 && !c.close.is_cancelled())
            .min_by_key(|c| c.last_active_ms.load(Ordering::Relaxed));
        match victim {
            Some(c) => {
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    /// How long `c` has had nothing in flight (`None` while it has).
    fn idle_for(&self, c: &ConnState) -> Option<Duration> {
        if c.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = c.last_active_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(self.now_ms().saturating_sub(since)))
    }

    /// Resolves once `c` has been idle for `limit`.
    async fn idle_expired(&self, c: &ConnState, limit: Duration) {
        loop {
            let wait = match self.idle_for(c) {
                Some(idle) if idle >= limit => return,
                Some(idle) => limit - idle,
                None => limit,
            };
            tokio::time::sleep(wait).await;
        }
    }

    fn begin(self: &Arc<Self>, c: &Arc<ConnState>) -> InFlight {
        c.in_flight.fetch_add(1, Ordering::AcqRel);
        c.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
        InFlight {
            registry: self.clone(),
            conn: c.clone(),
        }
    }
}

/// One response being sent; dropping it (the body is done, or the connection went
/// away) makes the connection's idle clock start again.
struct InFlight {
    registry: Arc<Registry>,
    conn: Arc<ConnState>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .last_active_ms
            .store(self.registry.now_ms(), Ordering::Relaxed);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The outermost layer of a connection's service: a request is in flight from the
/// moment it is called until its response body is done.
#[derive(Clone)]
struct Track<S> {
    registry: Arc<Registry>,
    state: Arc<ConnState>,
    inner: S,
}

impl<S: Handler> Service<Request<Incoming>> for Track<S> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let in_flight = self.registry.begin(&self.state);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|inner| {
                Tracked {
                    inner,
                    _in_flight: in_flight,
                }
                .boxed()
            }))
        })
    }
}

/// A response body that holds its connection's [`InFlight`] until it is done.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a listener serves: a tower service answering every request (its errors are
/// answers too, so it never fails).
pub trait Handler:
    Service<Request<Incoming>, Response = Response<Body>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> Handler for S where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// Accept connections on `listener` and serve each request with `handle`, under
/// `policy`, until `shutdown` fires; then let open connections finish for
/// `drain_grace`.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Option<ListenerTls>,
    policy: ConnPolicy,
    shutdown: CancellationToken,
    handle: H,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(policy.max_connections));
    let registry = Registry::new();
    let tracker = TaskTracker::new();
    // Each connection adds its own head timer (`Connection::serve_io`).
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().header_read_timeout(policy.header_timeout);
    let builder = Arc::new(builder);
    loop {
        let (stream, peer): (TcpStream, SocketAddr) = tokio::select! {
            () = shutdown.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(permit) = admit(&permits, &registry, &shutdown).await else {
            break;
        };
        let _ = stream.set_nodelay(true);
        let (id, state) = registry.add();
        let conn = Connection {
            registry: registry.clone(),
            state,
            policy,
            shutdown: shutdown.clone(),
        };
        let builder = builder.clone();
        let handle = handle.clone();
        let tls = tls.clone();
        tracker.spawn(async move {
            conn.run(stream, peer, tls.as_ref(), &builder, handle).await;
            conn.registry.remove(id);
            drop(permit);
        });
    }
    tracker.close();
    if tokio::time::timeout(policy.drain_grace, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("drain grace period elapsed with connections still open");
    }
}

/// A connection slot for a client that was just accepted: at once while there is one;
/// at the cap, by closing the connection idle the longest (retried while every
/// connection is busy). `None` when shutting down.
async fn admit(
    permits: &Arc<tokio::sync::Semaphore>,
    registry: &Registry,
    shutdown: &CancellationToken,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(p) = permits.clone().try_acquire_owned() {
        return Some(p);
    }
    loop {
        registry.close_most_idle();
        tokio::select! {
            () = shutdown.cancelled() => return None,
            p = permits.clone().acquire_owned() => return p.ok(),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// One accepted connection and what it needs to be served.
struct Connection {
    registry: Arc<Registry>,
    state: Arc<ConnState>,
    policy: ConnPolicy,
    shutdown: CancellationToken,
}

impl Connection {
    async fn run<H: Handler>(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        tls: Option<&ListenerTls>,
        builder: &auto::Builder<TokioExecutor>,
        handle: H,
    ) {
        if !self.first_byte(&stream).await {
            return;
        }
        match tls {
            None => self.serve_io(stream, peer, builder, handle).await,
            Some(tls) => {
                if let Some(stream) = self.handshake(stream, peer, tls).await {
                    self.serve_io(stream, peer, builder, handle).await;
                }
            }
        }
    }

    /// The server side of the TLS handshake, within the header timeout. A failure is
    /// logged at debug (scanners fail handshakes all day) and counted.
    async fn handshake(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        tls: &ListenerTls,
    ) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
        let accept = tokio::time::timeout(self.policy.header_timeout, tls.acceptor.accept(stream));
        let result = tokio::select! {
            r = accept => r,
            () = self.state.close.cancelled() => return None,
            () = self.shutdown.cancelled() => return None,
        };
        match result {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                let reason = crate::tls::failure_reason(&e).unwrap_or("handshake");
                crate::metrics::tls_handshake_failed("inbound", tls.name, reason);
                tracing::debug!(%peer, listener = tls.name, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                crate::metrics::tls_handshake_failed("inbound", tls.name, "timeout");
                tracing::debug!(%peer, listener = tls.name, "TLS handshake timed out");
                None
            }
        }
    }

    async fn serve_io<I, H>(
        &self,
        io: I,
        peer: SocketAddr,
        builder: &auto::Builder<TokioExecutor>,
        handle: H,
    ) where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        H: Handler,
    {
        let svc = ServiceBuilder::new()
            .layer_fn(|inner| Track {
                registry: self.registry.clone(),
                state: self.state.clone(),
                inner,
            })
            .service(handle);
        let clock = HeadClock::new();
        let mut builder = builder.clone();
        builder.http1().timer(clock.timer());
        let io = TokioIo::new(HeadClockIo::new(io, clock));
        let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(svc));
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = self.state.close.cancelled(), if !closing => closing = true,
                () = self.shutdown.cancelled(), if !closing => closing = true,
                () = self.registry.idle_expired(&self.state, self.policy.idle_timeout), if !closing => {
                    closing = true;
                }
            }
            // HTTP/1 closes once the response in progress is sent; h2 sends GOAWAY and
            // lets open streams finish.
            conn.as_mut().graceful_shutdown();
        }
    }

    /// Whether the client sent a byte within the header timeout (and before it was
    /// asked to close).
    async fn first_byte(&self, stream: &TcpStream) -> bool {
        let mut probe = [0u8; 1];
        tokio::select! {
            r = tokio::time::timeout(self.policy.header_timeout, stream.peek(&mut probe)) => {
                matches!(r, Ok(Ok(n)) if n > 0)
            }
            () = self.state.close.cancelled() => false,
            () = self.shutdown.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_connection_is_closed_first_and_busy_ones_never() {
        let r = Registry::new();
        let (_, busy) = r.add();
        let _flight = r.begin(&busy);
        assert!(!r.close_most_idle(), "a busy connection was chosen");
        let (_, old) = r.add();
        old.last_active_ms.store(0, Ordering::Relaxed);
        let (_, new) = r.add();
        new.last_active_ms.store(10, Ordering::Relaxed);
        assert!(r.close_most_idle());
        assert!(old.close.is_cancelled());
        assert!(!new.close.is_cancelled() && !busy.close.is_cancelled());
        assert!(r.close_most_idle());
        assert!(new.close.is_cancelled());
        assert!(!r.close_most_idle());
    }

    #[test]
    fn a_response_in_flight_is_never_idle() {
        let r = Registry::new();
        let (_, c) = r.add();
        let flight = r.begin(&c);
        assert_eq!(r.idle_for(&c), None);
        drop(flight);
        assert!(r.idle_for(&c).is_some());
    }
}
