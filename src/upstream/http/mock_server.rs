//! A small real legacy Streamable HTTP server (hyper, 127.0.0.1:0) for the tests.

use super::consts::{LAST_EVENT_ID, SESSION_HEADER};
use super::*;
use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{CONTENT_TYPE, LOCATION};
use http::{Request, Response};
use http_body_util::StreamBody;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Response bodies may fail, which makes hyper cut a chunked body short.
pub(super) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

#[derive(Debug, Clone)]
pub(super) struct Recorded {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) headers: HashMap<String, String>,
    pub(super) body: Option<Value>,
}

impl Recorded {
    pub(super) fn rpc_method(&self) -> Option<&str> {
        self.body.as_ref()?.get("method")?.as_str()
    }
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

#[derive(Default)]
pub(super) struct MockState {
    pub(super) log: Mutex<Vec<Recorded>>,
    pub(super) issued: AtomicU64,
    pub(super) valid: Mutex<HashSet<String>>,
    /// Server→client request id → waiter for the client's response.
    pub(super) pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// Responses held back for `GET` + `Last-Event-ID` (polling).
    pub(super) parked: Mutex<HashMap<String, Value>>,
    /// Serve at `/mcp/` and redirect `/mcp` there with 307.
    pub(super) redirect: bool,
    /// Offer a standalone GET stream (otherwise 405).
    pub(super) get_stream: bool,
    /// Answer an unknown session id with 400 (python-sdk ≤ 1.9) instead of 404.
    pub(super) unknown_session_400: bool,
    /// The open standalone GET stream, for tools that talk on it.
    pub(super) get_tx: Mutex<Option<mpsc::Sender<Bytes>>>,
    /// Lets the `get_progress` tool answer.
    pub(super) release: Notify,
    /// Answer every `tools/call` with 404, as if its session had just expired.
    pub(super) forget_sessions: AtomicBool,
    /// What `notifications/cancelled` does to its session (python-sdk 1.9: breaks it).
    pub(super) on_cancel: OnCancel,
    /// Sessions broken that way: POSTs get SSE headers and a truncated body, GETs get
    /// headers and then nothing.
    pub(super) broken: Mutex<HashSet<String>>,
    /// Sessions that stopped answering: every request gets headers, then nothing.
    pub(super) stalled: Mutex<HashSet<String>>,
    /// Standalone GET streams the client has closed.
    pub(super) get_closed: AtomicU64,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnCancel {
    #[default]
    Nothing,
    Break,
    Stall,
}

impl MockState {
    pub(super) fn records(&self) -> Vec<Recorded> {
        self.log.lock().clone()
    }
    pub(super) fn count(&self, rpc_method: &str) -> usize {
        self.records()
            .iter()
            .filter(|r| r.rpc_method() == Some(rpc_method))
            .count()
    }
}

pub(super) fn sse_headers(b: http::response::Builder) -> http::response::Builder {
    b.header(CONTENT_TYPE, "text/event-stream")
        .header("cache-control", "no-cache")
}

pub(super) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(super) fn json_body(v: &Value) -> Body {
    full(v.to_string())
}

pub(super) fn empty() -> Body {
    full(Bytes::new())
}

/// SSE headers, then `first` (if any), then the body fails: hyper closes the
/// connection without the terminating chunk.
pub(super) fn truncated(first: Option<Bytes>) -> Response<Body> {
    let items: Vec<Result<Frame<Bytes>, std::io::Error>> = first
        .into_iter()
        .map(|b| Ok(Frame::data(b)))
        .chain([Err(std::io::Error::other("cut short"))])
        .collect();
    // Paced, so hyper flushes headers and data before the failure (as a server
    // whose session died mid-answer does), rather than never answering at all.
    let paced = futures_util::stream::iter(items).then(|item| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        item
    });
    let body = StreamBody::new(paced.boxed());
    sse_headers(Response::builder())
        .body(body.boxed_unsync())
        .unwrap()
}

/// SSE headers, then nothing, never.
pub(super) fn stalled() -> Response<Body> {
    let (tx, body) = channel_body();
    tokio::spawn(async move { tx.closed().await });
    sse_headers(Response::builder()).body(body).unwrap()
}

/// A streaming body fed through a channel; dropping the sender ends the stream.
pub(super) fn channel_body() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::io::Error>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream.boxed()).boxed_unsync())
}

pub(super) fn event(id: Option<&str>, msg: &Value) -> Bytes {
    let mut s = String::new();
    if let Some(id) = id {
        s.push_str(&format!("id: {id}\n"));
    }
    s.push_str(&format!("data: {msg}\n\n"));
    Bytes::from(s)
}

pub(super) fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"result":result})
}

/// Aborts the connection a request came on (with RST: linger 0).
pub(super) type Abort = Arc<Mutex<Option<oneshot::Sender<()>>>>;

pub(super) async fn handle(
    st: Arc<MockState>,
    abort: Abort,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    if st.redirect && path == "/mcp" {
        st.log.lock().push(Recorded {
            method: req.method().to_string(),
            path: path.clone(),
            headers: HashMap::new(),
            body: None,
        });
        return Ok(Response::builder()
            .status(307)
            .header(LOCATION, "/mcp/")
            .body(empty())
            .unwrap());
    }
    let method = req.method().clone();
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let body: Option<Value> = serde_json::from_slice(&bytes).ok();
    let rec = Recorded {
        method: method.to_string(),
        path,
        headers: headers.clone(),
        body: body.clone(),
    };
    st.log.lock().push(rec);
    let session_ok = headers
        .get(SESSION_HEADER)
        .is_some_and(|s| st.valid.lock().contains(s));
    let reply = |status: u16| Ok(Response::builder().status(status).body(empty()).unwrap());

    if method == Method::DELETE {
        return reply(200);
    }
    let sid = headers.get(SESSION_HEADER).cloned().unwrap_or_default();
    let dead = st.broken.lock().contains(&sid) || st.stalled.lock().contains(&sid);
    if method == Method::GET {
        if !session_ok {
            return reply(404);
        }
        if dead {
            return Ok(stalled());
        }
        if let Some(last) = headers.get(LAST_EVENT_ID) {
            if last == "busy-1" {
                return reply(503);
            }
            let Some(resp) = st.parked.lock().remove(last) else {
                return reply(404);
            };
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                let _ = tx.send(event(Some("after-resume"), &resp)).await;
            });
            return Ok(sse_headers(Response::builder()).body(body).unwrap());
        }
        if !st.get_stream {
            return reply(405);
        }
        let (tx, body) = channel_body();
        *st.get_tx.lock() = Some(tx.clone());
        let st = st.clone();
        tokio::spawn(async move {
            let _ = tx
                .send(event(
                    None,
                    &json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
                ))
                .await;
            let _ = tx
                .send(event(
                    None,
                    &json!({"jsonrpc":"2.0","id":"gp-1","method":"ping"}),
                ))
                .await;
            tx.closed().await;
            st.get_closed.fetch_add(1, Ordering::SeqCst);
        });
        return Ok(sse_headers(Response::builder()).body(body).unwrap());
    }

    let Some(body) = body else { return reply(400) };
    let rpc_method = body
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string);
    let id = body.get("id").cloned();
    if rpc_method.as_deref() == Some("initialize") {
        let n = st.issued.fetch_add(1, Ordering::SeqCst) + 1;
        let sid = format!("s-{n}");
        st.valid.lock().insert(sid.clone());
        let res = result(
            &id.unwrap_or(Value::Null),
            json!({"protocolVersion":"2025-11-25","capabilities":{"tools":{}},
                   "serverInfo":{"name":"mock","version":"1"}}),
        );
        return Ok(Response::builder()
            .header(CONTENT_TYPE, "application/json")
            .header("MCP-Session-Id", sid)
            .body(json_body(&res))
            .unwrap());
    }
    if !session_ok {
        if st.unknown_session_400 {
            return Ok(Response::builder()
                .status(400)
                .body(full("Bad Request: No valid session ID provided"))
                .unwrap());
        }
        return reply(404);
    }
    if st.forget_sessions.load(Ordering::SeqCst) && rpc_method.as_deref() == Some("tools/call") {
        return reply(404);
    }
    if st.stalled.lock().contains(&sid) {
        return Ok(stalled());
    }
    if st.broken.lock().contains(&sid) {
        return Ok(truncated(None));
    }
    match rpc_method.as_deref() {
        Some("notifications/cancelled") => {
            match st.on_cancel {
                OnCancel::Nothing => {}
                OnCancel::Break => {
                    st.broken.lock().insert(sid);
                }
                OnCancel::Stall => {
                    st.stalled.lock().insert(sid);
                }
            }
            return reply(202);
        }
        Some("ping") => {
            let res = result(&id.unwrap_or(Value::Null), json!({}));
            return Ok(Response::builder()
                .header(CONTENT_TYPE, "application/json")
                .body(json_body(&res))
                .unwrap());
        }
        _ => {}
    }
    if rpc_method.is_none() {
        // A response to one of our server→client requests.
        if let Some(id) = id.as_ref().and_then(Value::as_str)
            && let Some(tx) = st.pending.lock().remove(id)
        {
            let _ = tx.send(body.clone());
        }
        return reply(202);
    }
    let Some(id) = id else { return reply(202) };
    let tool = body["params"]["name"].as_str().unwrap_or("").to_string();
    match tool.as_str() {
        "json" => {
            let res = result(
                &id,
                json!({"content":[{"type":"text","text":"hi"}],"args":body["params"]["arguments"]}),
            );
            Ok(Response::builder()
                .header(CONTENT_TYPE, "application/json")
                .body(json_body(&res))
                .unwrap())
        }
        "sse" => {
            let token = body["params"]["_meta"]["progressToken"].clone();
            let (tx, out) = channel_body();
            let (answer_tx, answer_rx) = oneshot::channel();
            st.pending.lock().insert("elic-1".into(), answer_tx);
            tokio::spawn(async move {
                let progress = json!({"jsonrpc":"2.0","method":"notifications/progress",
                    "params":{"progressToken":token,"progress":1,"total":2,"message":"half"}});
                let other = json!({"jsonrpc":"2.0","method":"notifications/progress",
                    "params":{"progressToken":"someone-else","progress":9}});
                let log = json!({"jsonrpc":"2.0","method":"notifications/message",
                    "params":{"level":"info","data":"working"}});
                let elicit = json!({"jsonrpc":"2.0","id":"elic-1","method":"elicitation/create",
                    "params":{"message":"sure?","requestedSchema":{"type":"object"}}});
                for m in [progress, other, log, elicit] {
                    let _ = tx.send(event(None, &m)).await;
                }
                let Ok(answer) = answer_rx.await else { return };
                let _ = tx
                    .send(event(
                        None,
                        &result(&id, json!({"content":[],"elicited":answer["result"]})),
                    ))
                    .await;
            });
            Ok(sse_headers(Response::builder()).body(out).unwrap())
        }
        "poll" => {
            st.parked.lock().insert(
                "prime-1".into(),
                result(&id, json!({"content":[{"type":"text","text":"polled"}]})),
            );
            // Priming event, then a retry hint, then the connection closes.
            let chunk = Bytes::from("id: prime-1\ndata:\n\nretry: 50\n\n");
            Ok(sse_headers(Response::builder()).body(full(chunk)).unwrap())
        }
        "broken" => {
            // A notification, then the stream ends: no id, no response.
            let note = json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"bye"}});
            Ok(sse_headers(Response::builder())
                .body(full(event(None, &note)))
                .unwrap())
        }
        "get_progress" => {
            // python-sdk 1.9: the call's progress goes out on the GET stream (after
            // a report for a token nobody holds); the answer waits for `release`.
            let token = body["params"]["_meta"]["progressToken"].clone();
            let get = st.get_tx.lock().clone().unwrap();
            for t in [json!("someone-else"), json!(987_654), token] {
                let p = json!({"jsonrpc":"2.0","method":"notifications/progress",
                    "params":{"progressToken":t,"progress":1,"message":"on GET"}});
                let _ = get.send(event(None, &p)).await;
            }
            let (tx, out) = channel_body();
            tokio::spawn(async move {
                st.release.notified().await;
                let res = result(&id, json!({"content":[{"type":"text","text":"released"}]}));
                let _ = tx.send(event(None, &res)).await;
            });
            Ok(sse_headers(Response::builder()).body(out).unwrap())
        }
        // A proxy (or the server) that is overloaded, after reading the request.
        "busy" => Ok(Response::builder()
            .status(503)
            .body(full("overloaded"))
            .unwrap()),
        // The stream closes after priming; the resumption GET is answered 503.
        "busy_resume" => {
            let chunk = Bytes::from("id: busy-1\ndata:\n\nretry: 50\n\n");
            Ok(sse_headers(Response::builder()).body(full(chunk)).unwrap())
        }
        // An SSE comment, then the chunked body is cut short.
        "truncated" => Ok(truncated(Some(Bytes::from(": working\n\n")))),
        // The connection is reset before any answer.
        "reset" => {
            if let Some(tx) = abort.lock().take() {
                let _ = tx.send(());
            }
            std::future::pending::<()>().await;
            reply(500)
        }
        // Something in front of the server answered, but not in JSON-RPC.
        "garbage" => Ok(Response::builder()
            .header(CONTENT_TYPE, "application/json")
            .body(full("<html>bad gateway</html>"))
            .unwrap()),
        // Answers once `release` is notified.
        "held" => {
            let (tx, out) = channel_body();
            tokio::spawn(async move {
                st.release.notified().await;
                let res = result(&id, json!({"content":[{"type":"text","text":"held"}]}));
                let _ = tx.send(event(None, &res)).await;
            });
            Ok(sse_headers(Response::builder()).body(out).unwrap())
        }
        "hang" => {
            let (tx, out) = channel_body();
            tokio::spawn(async move {
                let _ = tx.send(Bytes::from("id: h-1\ndata:\n\n")).await;
                tx.closed().await;
            });
            Ok(sse_headers(Response::builder()).body(out).unwrap())
        }
        _ => Ok(Response::builder()
            .status(500)
            .body(json_body(&json!({"error":"unknown tool"})))
            .unwrap()),
    }
}

pub(super) async fn serve(listener: TcpListener, st: Arc<MockState>) {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let st = st.clone();
            tokio::spawn(async move {
                // A second handle on the socket, to turn an abort into a reset.
                let Ok(std_stream) = stream.into_std() else {
                    return;
                };
                let Ok(dup) = std_stream.try_clone() else {
                    return;
                };
                let Ok(stream) = tokio::net::TcpStream::from_std(std_stream) else {
                    return;
                };
                let (abort_tx, mut abort_rx) = oneshot::channel();
                let abort: Abort = Arc::new(Mutex::new(Some(abort_tx)));
                let svc = service_fn(move |req| handle(st.clone(), abort.clone(), req));
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = &mut conn => {}
                    Ok(()) = &mut abort_rx => {
                        // Linger 0: closing sends RST instead of FIN. The connection
                        // (the last handle) closes when this task ends.
                        if let Ok(d) = tokio::net::TcpStream::from_std(dup) {
                            let _ = d.set_zero_linger();
                        }
                    }
                }
            });
        }
    });
}

pub(super) async fn mock(st: MockState) -> (SocketAddr, Arc<MockState>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let st = Arc::new(st);
    serve(listener, st.clone()).await;
    (addr, st)
}
