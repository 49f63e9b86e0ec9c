//! Legacy (2025-11-25 style) Streamable HTTP transport of the demo server.
//!
//! * `POST /mcp`: `initialize` creates a session (`Mcp-Session-Id`);
//!   `tools/call` is answered as `text/event-stream`, every other request as
//!   `application/json`; notifications and responses get 202.
//! * `GET /mcp`: the standalone SSE stream (list-changed notifications), or,
//!   with `Last-Event-ID: <stream>-<n>`, the replay/continuation of any stream
//!   of the session.
//! * `DELETE /mcp`: ends the session.
//!
//! Every SSE stream is buffered per session so that it can be resumed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, oneshot};

use super::server::{
    MessageKind, NullSink, Outbound, SUPPORTED_VERSIONS, Session, SessionConfig, Sink, Stats,
    Transport, classify,
};

const MAX_BODY: usize = 16 * 1024 * 1024;
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// Response body: either a complete buffer or a channel of SSE frames.
pub enum DemoBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Result<Frame<Bytes>, io::Error>>),
}

impl hyper::body::Body for DemoBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            DemoBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            DemoBody::Stream(rx) => rx.poll_recv(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, DemoBody::Full(None))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            DemoBody::Full(b) => {
                hyper::body::SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
            DemoBody::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

#[derive(Clone)]
enum Event {
    Msg(String),
    Priming { retry_ms: u64 },
}

#[derive(Default)]
struct StreamState {
    /// Event `i` has the SSE id `<stream>-<i+1>`.
    events: Vec<Event>,
    closed: bool,
    aborted: bool,
    /// Number of events written to some connection (for the GET stream).
    delivered: usize,
}

/// A buffered SSE stream of one session.
struct StreamBuf {
    id: u64,
    state: Mutex<StreamState>,
    notify: Notify,
}

impl StreamBuf {
    fn new(id: u64) -> Self {
        StreamBuf {
            id,
            state: Mutex::new(StreamState::default()),
            notify: Notify::new(),
        }
    }

    fn push(&self, ev: Event) {
        let mut st = self.state.lock();
        if st.closed {
            return;
        }
        st.events.push(ev);
        drop(st);
        self.notify.notify_waiters();
    }

    fn close(&self, aborted: bool) {
        let mut st = self.state.lock();
        if !st.closed {
            st.closed = true;
            st.aborted = aborted;
        }
        drop(st);
        self.notify.notify_waiters();
    }
}

/// Sink writing into a [`StreamBuf`]; the stream ends when the sink is dropped.
struct StreamSink(Arc<StreamBuf>);

impl Sink for StreamSink {
    fn send(&self, out: Outbound) {
        match out {
            Outbound::Message(v) => self.0.push(Event::Msg(v.to_string())),
            Outbound::PollDisconnect { retry_ms } => self.0.push(Event::Priming { retry_ms }),
            Outbound::Abort => self.0.close(true),
        }
    }
}

impl Drop for StreamSink {
    fn drop(&mut self) {
        self.0.close(false);
    }
}

/// Sink capturing the first message (the response of a non-streaming request).
struct OnceSink(Mutex<Option<oneshot::Sender<Value>>>);

impl Sink for OnceSink {
    fn send(&self, out: Outbound) {
        if let Outbound::Message(v) = out
            && let Some(tx) = self.0.lock().take()
        {
            let _ = tx.send(v);
        }
    }
}

struct HttpSession {
    core: Session,
    streams: Mutex<HashMap<u64, Arc<StreamBuf>>>,
    next_stream: AtomicU64,
    last_used: Mutex<Instant>,
}

impl HttpSession {
    fn new_stream(&self) -> Arc<StreamBuf> {
        let id = self.next_stream.fetch_add(1, Ordering::SeqCst);
        let buf = Arc::new(StreamBuf::new(id));
        let mut streams = self.streams.lock();
        // Keep memory bounded: drop finished streams beyond the newest 256.
        if streams.len() > 256 {
            let mut done: Vec<u64> = streams
                .iter()
                .filter(|(k, b)| **k != 0 && b.state.lock().closed)
                .map(|(k, _)| *k)
                .collect();
            done.sort_unstable();
            let excess = streams.len() - 256;
            for k in done.into_iter().take(excess) {
                streams.remove(&k);
            }
        }
        streams.insert(id, buf.clone());
        buf
    }

    fn stream(&self, id: u64) -> Option<Arc<StreamBuf>> {
        self.streams.lock().get(&id).cloned()
    }

    fn close_all(&self) {
        for buf in self.streams.lock().values() {
            buf.close(false);
        }
    }
}

struct HttpState {
    sessions: Mutex<HashMap<String, Arc<HttpSession>>>,
    stats: Arc<Stats>,
    ttl: Option<Duration>,
}

/// Binds `addr`, prints `listening on http(s)://ADDR/mcp` to stderr and serves
/// until the process is killed; with `tls`, over TLS (h2 or HTTP/1.1 by ALPN), as a
/// hosted legacy server would be reached.
pub async fn run_http(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!("listening on {scheme}://{}/mcp", listener.local_addr()?);
    serve(listener, tls).await
}

/// Serves the demo's legacy Streamable HTTP endpoint on an already bound
/// listener. Env `DEMO_SESSION_TTL_MS` expires idle sessions.
pub async fn serve_http(listener: TcpListener) -> anyhow::Result<()> {
    serve(listener, None).await
}

async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let ttl = std::env::var("DEMO_SESSION_TTL_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    let state = Arc::new(HttpState {
        sessions: Mutex::new(HashMap::new()),
        stats: Arc::new(Stats::default()),
        ttl,
    });
    if let Some(ttl) = ttl {
        // Reap idle sessions nobody asks about any more.
        let weak = Arc::downgrade(&state);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl.max(Duration::from_millis(100))).await;
                let Some(state) = weak.upgrade() else { return };
                let expired: Vec<Arc<HttpSession>> = {
                    let mut sessions = state.sessions.lock();
                    let dead: Vec<String> = sessions
                        .iter()
                        .filter(|(_, s)| s.core.is_expired() || s.last_used.lock().elapsed() > ttl)
                        .map(|(k, _)| k.clone())
                        .collect();
                    dead.iter().filter_map(|k| sessions.remove(k)).collect()
                };
                for s in expired {
                    s.close_all();
                }
            }
        });
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("demo: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // SSE answers go out in several writes: without TCP_NODELAY, Nagle plus the
        // peer's delayed ACK stalls each tools/call by ~40 ms.
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(state.route(req).await) }
            });
            let Some(acceptor) = acceptor else {
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    tracing::debug!("demo: connection ended: {e}");
                }
                return;
            };
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(e) => {
                    // Tests read this line: the refusal of a client without a certificate.
                    eprintln!("demo: TLS handshake failed: {e}");
                    return;
                }
            };
            let alpn = tls
                .get_ref()
                .1
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .unwrap_or_else(|| "none".into());
            // Tests read this line to see which protocol ALPN chose.
            eprintln!("demo: TLS connection, ALPN {alpn}");
            if let Err(e) =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await
            {
                tracing::debug!("demo: connection ended: {e}");
            }
        });
    }
}

fn full(status: StatusCode, content_type: Option<&'static str>, body: Bytes) -> Response<DemoBody> {
    let mut resp = Response::new(DemoBody::Full(if body.is_empty() {
        None
    } else {
        Some(body)
    }));
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    resp
}

fn json_response(status: StatusCode, v: &Value) -> Response<DemoBody> {
    full(status, Some("application/json"), Bytes::from(v.to_string()))
}

fn error_response(status: StatusCode, code: i64, message: &str) -> Response<DemoBody> {
    json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}}),
    )
}

fn empty(status: StatusCode) -> Response<DemoBody> {
    full(status, None, Bytes::new())
}

fn header_str<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn origin_allowed(origin: &str) -> bool {
    let host = origin
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(origin);
    let host = host.split('/').next().unwrap_or(host);
    let host = if host.starts_with('[') {
        host.split(']').next().map(|h| &h[1..]).unwrap_or(host)
    } else {
        host.split(':').next().unwrap_or(host)
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1") || origin == "null"
}

/// Starts writing `buf` from event index `start` as an SSE response.
fn sse_response(buf: Arc<StreamBuf>, start: usize, allow_disconnect: bool) -> Response<DemoBody> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(pump(buf, start, tx, allow_disconnect));
    let mut resp = Response::new(DemoBody::Stream(rx));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

async fn pump(
    buf: Arc<StreamBuf>,
    mut pos: usize,
    tx: mpsc::Sender<Result<Frame<Bytes>, io::Error>>,
    allow_disconnect: bool,
) {
    loop {
        let notified = buf.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (batch, closed, aborted) = {
            let st = buf.state.lock();
            let batch: Vec<Event> = st
                .events
                .get(pos..)
                .map(<[Event]>::to_vec)
                .unwrap_or_default();
            (batch, st.closed, st.aborted)
        };
        for ev in batch {
            pos += 1;
            let id = format!("{}-{}", buf.id, pos);
            let (text, stop) = match ev {
                Event::Msg(data) => (format!("id: {id}\ndata: {data}\n\n"), false),
                Event::Priming { retry_ms } if allow_disconnect => {
                    (format!("id: {id}\nretry: {retry_ms}\ndata: \n\n"), true)
                }
                // Resumed connections skip the priming event.
                Event::Priming { .. } => continue,
            };
            if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
                return;
            }
            {
                let mut st = buf.state.lock();
                st.delivered = st.delivered.max(pos);
            }
            if stop {
                // Close the connection without ending the stream.
                return;
            }
        }
        if aborted {
            let _ = tx.send(Err(io::Error::other("demo crash"))).await;
            return;
        }
        if closed {
            return;
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tx.closed() => return,
        }
    }
}

impl HttpState {
    async fn route(self: Arc<Self>, req: Request<Incoming>) -> Response<DemoBody> {
        if req.uri().path() != "/mcp" {
            return full(
                StatusCode::NOT_FOUND,
                Some("text/plain"),
                Bytes::from("not found"),
            );
        }
        if let Some(origin) = header_str(&req, "origin")
            && !origin_allowed(origin)
        {
            return error_response(StatusCode::FORBIDDEN, -32000, "Forbidden: bad Origin");
        }
        match *req.method() {
            Method::POST => self.post(req).await,
            Method::GET => self.get(&req),
            Method::DELETE => self.delete(&req),
            _ => {
                let mut r = empty(StatusCode::METHOD_NOT_ALLOWED);
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                r
            }
        }
    }

    #[allow(clippy::result_large_err)]
    fn lookup(&self, req: &Request<Incoming>) -> Result<Arc<HttpSession>, Response<DemoBody>> {
        let Some(id) = header_str(req, SESSION_HEADER) else {
            return Err(error_response(
                StatusCode::BAD_REQUEST,
                -32000,
                "Bad Request: missing Mcp-Session-Id",
            ));
        };
        let not_found = || error_response(StatusCode::NOT_FOUND, -32001, "Session not found");
        let mut sessions = self.sessions.lock();
        let Some(sess) = sessions.get(id).cloned() else {
            return Err(not_found());
        };
        let idle_expired = self
            .ttl
            .is_some_and(|ttl| sess.last_used.lock().elapsed() > ttl);
        if sess.core.is_expired() || idle_expired {
            sessions.remove(id);
            drop(sessions);
            sess.close_all();
            return Err(not_found());
        }
        *sess.last_used.lock() = Instant::now();
        Ok(sess)
    }

    fn create_session(&self) -> (String, Arc<HttpSession>) {
        let bytes: [u8; 16] = rand::random();
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let standalone = Arc::new(StreamBuf::new(0));
        let core = Session::new(
            SessionConfig {
                transport: Transport::Http,
                send_roots_on_init: false,
            },
            self.stats.clone(),
            Arc::new(StreamSink(standalone.clone())),
        );
        let sess = Arc::new(HttpSession {
            core,
            streams: Mutex::new(HashMap::from([(0, standalone)])),
            next_stream: AtomicU64::new(1),
            last_used: Mutex::new(Instant::now()),
        });
        self.sessions.lock().insert(id.clone(), sess.clone());
        (id, sess)
    }

    async fn post(&self, req: Request<Incoming>) -> Response<DemoBody> {
        let version_ok =
            header_str(&req, VERSION_HEADER).is_none_or(|v| SUPPORTED_VERSIONS.contains(&v.trim()));
        let session = if version_ok {
            Some(self.lookup(&req))
        } else {
            None
        };
        let header_trace = header_str(&req, "traceparent").map(str::to_string);
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => {
                return error_response(StatusCode::PAYLOAD_TOO_LARGE, -32600, "Body too large");
            }
        };
        let msg: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => return error_response(StatusCode::BAD_REQUEST, -32700, "Parse error"),
        };
        // What a traced gateway propagates (README "Operations" shows these lines).
        let meta_trace = msg
            .pointer("/params/_meta/traceparent")
            .and_then(serde_json::Value::as_str);
        if header_trace.is_some() || meta_trace.is_some() {
            tracing::info!(
                method = msg
                    .get("method")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("-"),
                header_traceparent = header_trace.as_deref().unwrap_or("-"),
                meta_traceparent = meta_trace.unwrap_or("-"),
                "demo: trace context received"
            );
        }
        if msg.is_array() {
            return error_response(
                StatusCode::BAD_REQUEST,
                -32600,
                "JSON-RPC batches are not supported",
            );
        }
        let kind = classify(&msg);
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        if kind == MessageKind::Request && method == "initialize" {
            let (id, sess) = self.create_session();
            let Some(reply) = respond_once(&sess.core, msg).await else {
                return error_response(StatusCode::INTERNAL_SERVER_ERROR, -32603, "no response");
            };
            let mut resp = json_response(StatusCode::OK, &reply);
            if let Ok(v) = HeaderValue::from_str(&id) {
                resp.headers_mut().insert(SESSION_HEADER, v);
            }
            return resp;
        }
        let sess = match session {
            None => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    -32000,
                    "Bad Request: unsupported MCP-Protocol-Version",
                );
            }
            Some(Err(resp)) => return resp,
            Some(Ok(s)) => s,
        };
        match kind {
            MessageKind::Notification | MessageKind::Response => {
                sess.core.handle(msg, Arc::new(NullSink));
                empty(StatusCode::ACCEPTED)
            }
            MessageKind::Invalid => {
                error_response(StatusCode::BAD_REQUEST, -32600, "Invalid Request")
            }
            MessageKind::Request if method == "tools/call" => {
                let buf = sess.new_stream();
                sess.core.handle(msg, Arc::new(StreamSink(buf.clone())));
                sse_response(buf, 0, true)
            }
            MessageKind::Request => match respond_once(&sess.core, msg).await {
                Some(reply) => json_response(StatusCode::OK, &reply),
                None => error_response(StatusCode::INTERNAL_SERVER_ERROR, -32603, "no response"),
            },
        }
    }

    fn get(&self, req: &Request<Incoming>) -> Response<DemoBody> {
        let sess = match self.lookup(req) {
            Ok(s) => s,
            Err(r) => return r,
        };
        if let Some(accept) = header_str(req, "accept")
            && !accept.contains("text/event-stream")
            && !accept.contains("*/*")
        {
            return empty(StatusCode::NOT_ACCEPTABLE);
        }
        if let Some(last) = header_str(req, "last-event-id") {
            let parsed = last
                .trim()
                .split_once('-')
                .and_then(|(s, n)| Some((s.parse::<u64>().ok()?, n.parse::<usize>().ok()?)));
            let Some((stream, n)) = parsed else {
                return error_response(StatusCode::BAD_REQUEST, -32000, "Bad Last-Event-ID");
            };
            let Some(buf) = sess.stream(stream) else {
                return error_response(StatusCode::BAD_REQUEST, -32000, "Unknown stream");
            };
            return sse_response(buf, n, false);
        }
        let Some(buf) = sess.stream(0) else {
            return empty(StatusCode::METHOD_NOT_ALLOWED);
        };
        let start = buf.state.lock().delivered;
        sse_response(buf, start, false)
    }

    fn delete(&self, req: &Request<Incoming>) -> Response<DemoBody> {
        let sess = match self.lookup(req) {
            Ok(s) => s,
            Err(r) => return r,
        };
        self.sessions.lock().retain(|_, s| !Arc::ptr_eq(s, &sess));
        sess.close_all();
        empty(StatusCode::OK)
    }
}

/// Handles a non-streaming request and returns its response.
async fn respond_once(session: &Session, msg: Value) -> Option<Value> {
    let (tx, rx) = oneshot::channel();
    session.handle(msg, Arc::new(OnceSink(Mutex::new(Some(tx)))));
    rx.await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::HeaderMap;

    struct Reply {
        status: StatusCode,
        headers: HeaderMap,
        body: String,
    }

    async fn send(
        addr: SocketAddr,
        method: Method,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Reply {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut b = Request::builder()
            .method(method)
            .uri("/mcp")
            .header("host", "127.0.0.1")
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let body = body.map(|v| v.to_string()).unwrap_or_default();
        let req = b.body(Full::new(Bytes::from(body))).expect("request");
        let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
            .await
            .expect("timeout")
            .expect("send");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .expect("body timeout")
            .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
            .unwrap_or_else(|e| format!("<body error: {e}>"));
        Reply {
            status,
            headers,
            body,
        }
    }

    /// Parses SSE text into (id, data) pairs.
    fn sse_events(text: &str) -> Vec<(String, String)> {
        text.split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let mut id = String::new();
                let mut data = String::new();
                for line in e.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                (id, data)
            })
            .collect()
    }

    async fn start() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve_http(listener));
        addr
    }

    async fn initialize(addr: SocketAddr) -> String {
        let r = send(
            addr,
            Method::POST,
            &[],
            Some(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}})),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["result"]["protocolVersion"], "2025-11-25");
        let sid = r
            .headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .expect("session id")
            .to_string();
        let r = send(
            addr,
            Method::POST,
            &[(SESSION_HEADER, &sid), (VERSION_HEADER, "2025-11-25")],
            Some(json!({"jsonrpc":"2.0","method":"notifications/initialized"})),
        )
        .await;
        assert_eq!(r.status, StatusCode::ACCEPTED);
        sid
    }

    #[tokio::test]
    async fn http_session_echo_progress_and_errors() {
        let addr = start().await;
        let sid = initialize(addr).await;
        let h = [
            (SESSION_HEADER, sid.as_str()),
            (VERSION_HEADER, "2025-11-25"),
        ];

        // JSON for plain requests.
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":2,"method":"ping"})),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/json")
        );

        // tools/call echo over SSE.
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}})),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        let events = sse_events(&r.body);
        assert_eq!(events.len(), 1, "{}", r.body);
        let v: Value = serde_json::from_str(&events[0].1).expect("json");
        assert_eq!(v["id"], 3);
        assert_eq!(v["result"]["content"][0]["text"], "hello");

        // SSE progress.
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":60,"steps":3},"_meta":{"progressToken":7}}})),
        )
        .await;
        let events = sse_events(&r.body);
        let msgs: Vec<Value> = events
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("json"))
            .collect();
        let progress: Vec<&Value> = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        assert_eq!(progress.len(), 3, "{}", r.body);
        assert_eq!(progress[2]["params"]["progressToken"], 7);
        assert_eq!(progress[2]["params"]["progress"], 3);
        let last = msgs.last().expect("response");
        assert_eq!(last["id"], 4);
        assert_eq!(last["result"]["content"][0]["text"], "slept 60 ms");
        // Event ids are `<stream>-<n>` and increasing.
        let ids: Vec<&str> = events.iter().map(|(i, _)| i.as_str()).collect();
        let stream = ids[0].split('-').next().unwrap_or("");
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(*id, format!("{stream}-{}", n + 1));
        }

        // Missing session → 400, unknown → 404, bad version → 400.
        let ping = json!({"jsonrpc":"2.0","id":5,"method":"ping"});
        let r = send(addr, Method::POST, &[], Some(ping.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let r = send(
            addr,
            Method::POST,
            &[(SESSION_HEADER, "deadbeef")],
            Some(ping.clone()),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        let r = send(
            addr,
            Method::POST,
            &[(SESSION_HEADER, &sid), (VERSION_HEADER, "1999-01-01")],
            Some(ping.clone()),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);

        // expire_session answers, then the session is gone.
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"expire_session"}})),
        )
        .await;
        assert!(r.body.contains("session expired"), "{}", r.body);
        let r = send(addr, Method::POST, &h, Some(ping.clone())).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn http_elicitation_list_changed_poll_resume_crash_delete() {
        let addr = start().await;
        let sid = initialize(addr).await;
        let h = [
            (SESSION_HEADER, sid.as_str()),
            (VERSION_HEADER, "2025-11-25"),
        ];

        // Server→client request on the POST stream, answered by a POST.
        let call = tokio::spawn({
            let sid = sid.clone();
            async move {
                send(
                    addr,
                    Method::POST,
                    &[(SESSION_HEADER, &sid)],
                    Some(json!({"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"elicit","arguments":{"message":"q?"}}})),
                )
                .await
            }
        });
        // Wait until the elicitation is outstanding, then answer srv-1.
        let mut answered = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let r = send(
                addr,
                Method::POST,
                &h,
                Some(json!({"jsonrpc":"2.0","id":"srv-1","result":{"action":"accept","content":{"answer":"a"}}})),
            )
            .await;
            assert_eq!(r.status, StatusCode::ACCEPTED);
            if call.is_finished() {
                answered = true;
                break;
            }
        }
        assert!(answered);
        let r = call.await.expect("join");
        let events = sse_events(&r.body);
        assert_eq!(events.len(), 2, "{}", r.body);
        assert!(events[0].1.contains("elicitation/create"));
        assert!(events[1].1.contains("elicited: accept"));

        // Standalone GET stream receives list_changed.
        let get = tokio::spawn({
            let sid = sid.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .expect("handshake");
                tokio::spawn(conn);
                let req = Request::builder()
                    .method(Method::GET)
                    .uri("/mcp")
                    .header("host", "127.0.0.1")
                    .header("accept", "text/event-stream")
                    .header(SESSION_HEADER, sid)
                    .body(Full::new(Bytes::new()))
                    .expect("req");
                let resp = sender.send_request(req).await.expect("send");
                let mut body = resp.into_body();
                let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
                    .await
                    .expect("timeout")
                    .expect("frame")
                    .expect("ok");
                String::from_utf8_lossy(frame.data_ref().expect("data")).into_owned()
            }
        });
        send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"touch_tools"}})),
        )
        .await;
        let first = get.await.expect("join");
        assert!(
            first.contains("notifications/tools/list_changed"),
            "{first}"
        );
        assert!(first.starts_with("id: 0-1"), "{first}");

        // 2025-11-25 polling: priming event + retry, then resume via GET.
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":300,"steps":2,"poll_disconnect":true},"_meta":{"progressToken":"p"}}})),
        )
        .await;
        assert!(r.body.contains("retry: 200"), "{}", r.body);
        let events = sse_events(&r.body);
        assert_eq!(events.len(), 1, "{}", r.body);
        assert!(events[0].1.is_empty());
        let last_id = events[0].0.clone();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = send(
            addr,
            Method::GET,
            &[(SESSION_HEADER, &sid), ("last-event-id", &last_id)],
            None,
        )
        .await;
        let events = sse_events(&r.body);
        let msgs: Vec<Value> = events
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("json"))
            .collect();
        assert_eq!(msgs[0]["params"]["data"], "sleep started");
        assert_eq!(
            msgs.iter()
                .filter(|m| m["method"] == "notifications/progress")
                .count(),
            2
        );
        let last = msgs.last().expect("resp");
        assert_eq!(last["id"], 12);
        assert_eq!(last["result"]["content"][0]["text"], "slept 300 ms");

        // crash drops the connection without an answer.
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"crash"}})),
        )
        .await;
        assert!(r.body.starts_with("<body error"), "{}", r.body);

        // Cancellation: POSTed notification → 202, stats shows it.
        let slow = tokio::spawn({
            let sid = sid.clone();
            async move {
                send(
                    addr,
                    Method::POST,
                    &[(SESSION_HEADER, &sid)],
                    Some(json!({"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":60000}}})),
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":14}})),
        )
        .await;
        assert_eq!(r.status, StatusCode::ACCEPTED);
        let r = slow.await.expect("join");
        assert!(!r.body.contains("\"id\":14"), "{}", r.body);
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"stats"}})),
        )
        .await;
        assert!(r.body.contains(r#"\"cancelled\":1"#), "{}", r.body);

        // DELETE ends the session.
        let r = send(addr, Method::DELETE, &h, None).await;
        assert_eq!(r.status, StatusCode::OK);
        let r = send(
            addr,
            Method::POST,
            &h,
            Some(json!({"jsonrpc":"2.0","id":16,"method":"ping"})),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
    }
}
