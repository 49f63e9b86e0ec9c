//! Against a small real legacy Streamable HTTP server (hyper, 127.0.0.1:0).

use std::time::{Duration, Instant};

use super::consts::{ACCEPT_SSE, LAST_EVENT_ID, SESSION_HEADER, VERIFY_TIMEOUT, VERSION_HEADER};
use super::*;
use crate::upstream::{Delivery, InputAnswer, LegacyTransport};
use serde_json::json;
use serde_json::{Map, Value};
use tokio::net::TcpListener;

use super::mock_server::*;
use super::request::resolve_location;

fn opts(url: String) -> HttpOptions {
    HttpOptions {
        name: "mock".into(),
        url,
        headers: vec![("X-Api-Key".into(), "k".into())],
        max_message_bytes: 64 * 1024,
        identity: None,
        tls: crate::tls::client::plaintext_only().unwrap(),
    }
}

fn spec(tool: &str, want_progress: bool) -> CallSpec {
    let mut params = Map::new();
    params.insert("name".into(), json!(tool));
    params.insert("arguments".into(), json!({"x": 1}));
    CallSpec {
        method: "tools/call".into(),
        tool: Some(tool.into()),
        params,
        want_progress,
        tenant: None,
        session: None,
    }
}

/// Poll `cond` every 20 ms for up to 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

fn ok_result(r: Result<CallOutcome, UpstreamError>) -> Value {
    match r {
        Ok(CallOutcome::Result(v)) => v,
        other => panic!("expected a result, got {other:?}"),
    }
}

#[tokio::test]
async fn initialize_with_session_and_json_answer() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let info = up.ensure_ready().await.unwrap();
    assert_eq!(info.protocol_version, "2025-11-25");
    assert_eq!(up.state(), TransportState::Ready);
    assert_eq!(up.info().unwrap().server_info["name"], "mock");

    let (tx, _rx) = mpsc::channel(8);
    let v = ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(v["content"][0]["text"], "hi");
    assert_eq!(v["args"], json!({"x": 1}));

    let recs = st.records();
    assert_eq!(st.count("initialize"), 1);
    let init = recs
        .iter()
        .find(|r| r.rpc_method() == Some("initialize"))
        .unwrap();
    assert_eq!(init.header("accept"), Some(ACCEPT_POST));
    assert_eq!(init.header("content-type"), Some("application/json"));
    assert_eq!(init.header(SESSION_HEADER), None);
    assert_eq!(init.header("x-api-key"), Some("k"));
    let initialized = recs
        .iter()
        .find(|r| r.rpc_method() == Some("notifications/initialized"))
        .unwrap();
    assert_eq!(initialized.header(SESSION_HEADER), Some("s-1"));
    let call = recs
        .iter()
        .find(|r| r.rpc_method() == Some("tools/call"))
        .unwrap();
    assert_eq!(call.header(SESSION_HEADER), Some("s-1"));
    assert_eq!(call.header(VERSION_HEADER), Some("2025-11-25"));
    assert_eq!(call.header("x-api-key"), Some("k"));
    let body = call.body.as_ref().unwrap();
    assert!(body["id"].is_u64(), "gateway-minted numeric id");
    assert!(
        body["params"].get("_meta").is_none(),
        "no progress token unless asked"
    );
    up.shutdown().await;
    eventually("DELETE", || {
        st.records().iter().any(|r| r.method == "DELETE")
    })
    .await;
    let del = st
        .records()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .unwrap();
    assert_eq!(del.header(SESSION_HEADER), Some("s-1"));
    let (tx, _rx) = mpsc::channel(8);
    assert!(matches!(
        up.call(spec("json", false), tx).await,
        Err(UpstreamError::ShuttingDown)
    ));
}

#[tokio::test]
async fn sse_answer_with_progress_log_and_elicitation() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, mut rx) = mpsc::channel(8);
    let gateway = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                CallEvent::Progress(p) => seen.push(json!({"progress": p})),
                CallEvent::Log(l) => seen.push(json!({"log": l})),
                CallEvent::Queue(_) => {}
                CallEvent::Input(req) => {
                    seen.push(json!({"input": req.method, "params": req.params}));
                    let _ = req.respond.send(InputAnswer::Result(
                        json!({"action":"accept","content":{"ok":true}}),
                    ));
                }
            }
        }
        seen
    });
    let v = ok_result(up.call(spec("sse", true), tx).await);
    assert_eq!(
        v["elicited"],
        json!({"action":"accept","content":{"ok":true}})
    );
    let seen = gateway.await.unwrap();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(
        seen[0],
        json!({"progress":{"progress":1,"total":2,"message":"half"}})
    );
    assert_eq!(seen[1]["log"]["data"], "working");
    assert_eq!(seen[2]["input"], "elicitation/create");
    assert_eq!(seen[2]["params"]["message"], "sure?");

    let recs = st.records();
    let call = recs
        .iter()
        .find(|r| r.rpc_method() == Some("tools/call"))
        .unwrap();
    let token = &call.body.as_ref().unwrap()["params"]["_meta"]["progressToken"];
    assert!(!token.is_null(), "gateway-minted progress token");
    let answer = recs
        .iter()
        .find(|r| r.body.as_ref().is_some_and(|b| b["id"] == "elic-1"))
        .unwrap();
    assert_eq!(answer.header(SESSION_HEADER), Some("s-1"));
    assert_eq!(answer.header(VERSION_HEADER), Some("2025-11-25"));
}

#[tokio::test]
async fn dropped_event_receiver_answers_input_with_error() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, rx) = mpsc::channel(8);
    drop(rx);
    let v = ok_result(up.call(spec("sse", false), tx).await);
    assert!(v["elicited"].is_null());
    let recs = st.records();
    let answer = recs
        .iter()
        .find(|r| r.body.as_ref().is_some_and(|b| b["id"] == "elic-1"))
        .unwrap();
    assert!(answer.body.as_ref().unwrap().get("error").is_some());
}

#[tokio::test]
async fn priming_close_after_retry_and_get_resumption() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    let v = ok_result(up.call(spec("poll", false), tx).await);
    assert_eq!(v["content"][0]["text"], "polled");
    let recs = st.records();
    let resume = recs
        .iter()
        .find(|r| r.method == "GET" && r.header(LAST_EVENT_ID).is_some())
        .unwrap();
    assert_eq!(resume.header(LAST_EVENT_ID), Some("prime-1"));
    assert_eq!(resume.header(SESSION_HEADER), Some("s-1"));
    assert_eq!(resume.header("accept"), Some(ACCEPT_SSE));
}

#[tokio::test]
async fn expired_session_reinitializes_and_retries_once() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    st.valid.lock().clear();
    // Concurrent callers share one re-initialisation.
    let (tx, _rx) = mpsc::channel(8);
    let (a, b) = tokio::join!(
        up.call(spec("json", false), tx.clone()),
        up.call(spec("json", false), tx)
    );
    ok_result(a);
    ok_result(b);
    assert_eq!(st.count("initialize"), 2);
    let calls: Vec<_> = st
        .records()
        .into_iter()
        .filter(|r| r.rpc_method() == Some("tools/call"))
        .collect();
    assert_eq!(calls.len(), 4, "each call sent once per session");
    assert!(
        calls[2..]
            .iter()
            .all(|c| c.header(SESSION_HEADER) == Some("s-2"))
    );
    let reinit = st
        .records()
        .into_iter()
        .filter(|r| r.rpc_method() == Some("initialize"))
        .nth(1)
        .unwrap();
    assert_eq!(reinit.header(SESSION_HEADER), None);
}

#[tokio::test]
async fn unknown_session_400_is_treated_as_expiry() {
    let (addr, st) = mock(MockState {
        unknown_session_400: true,
        ..MockState::default()
    })
    .await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    st.valid.lock().clear();
    let (tx, _rx) = mpsc::channel(8);
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(st.count("initialize"), 2);
}

#[tokio::test]
async fn stream_ending_without_response_or_id_is_broken() {
    let (addr, _st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, mut rx) = mpsc::channel(8);
    let err = up.call(spec("broken", false), tx).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Broken { .. }), "{err:?}");
    assert!(matches!(rx.recv().await, Some(CallEvent::Log(_))));
}

#[tokio::test]
async fn gateway_error_status_after_the_request_was_written_is_sent_then_failed() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    for tool in ["busy", "busy_resume"] {
        let err = up.call(spec(tool, false), tx.clone()).await.unwrap_err();
        assert!(
            matches!(err, UpstreamError::Broken { .. }),
            "{tool}: {err:?}"
        );
        assert_eq!(err.delivery(), Delivery::SentThenFailed, "{tool}");
        assert!(err.to_string().contains("503"), "{tool}: {err}");
    }
    assert_eq!(st.count("tools/call"), 2);
    // The session was kept: the next call goes through without a new handshake.
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(st.count("initialize"), 1);
}

#[tokio::test]
async fn connection_refused_before_writing_is_never_sent() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    // Point the session at a port nobody listens on: the connect fails before any
    // byte of the request is written.
    let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = probe.local_addr().unwrap();
    drop(probe);
    up.inner().url = format!("http://{dead}/mcp");
    let (tx, _rx) = mpsc::channel(8);
    let err = up.call(spec("json", false), tx).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable { .. }), "{err:?}");
    assert_eq!(err.delivery(), Delivery::NeverSent);
    assert_eq!(st.count("tools/call"), 0);
}

#[tokio::test]
async fn session_refused_twice_is_never_sent() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    // Every session is unknown to the server by the time the call arrives.
    st.forget_sessions.store(true, Ordering::SeqCst);
    let (tx, _rx) = mpsc::channel(8);
    let err = up.call(spec("json", false), tx).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable { .. }), "{err:?}");
    assert_eq!(err.delivery(), Delivery::NeverSent);
}

#[tokio::test]
async fn shutdown_fails_in_flight_calls() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    let caller = up.clone();
    let call = tokio::spawn(async move { caller.call(spec("hang", false), tx).await });
    eventually("tools/call", || st.count("tools/call") == 1).await;
    up.shutdown().await;
    let r = call.await.unwrap();
    assert!(matches!(r, Err(UpstreamError::ShuttingDown)), "{r:?}");
    assert!(matches!(up.state(), TransportState::Down(_)));
    assert_eq!(
        st.count("notifications/cancelled"),
        0,
        "no cancel after DELETE"
    );
    assert!(st.records().iter().any(|r| r.method == "DELETE"));
}

#[tokio::test]
async fn follows_307_to_slash_url_and_remembers_it() {
    let (addr, st) = mock(MockState {
        redirect: true,
        ..MockState::default()
    })
    .await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    ok_result(up.call(spec("json", false), tx.clone()).await);
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(up.url(), format!("http://{addr}/mcp/"));
    let recs = st.records();
    assert_eq!(recs.iter().filter(|r| r.path == "/mcp").count(), 1);
    assert_eq!(st.count("tools/call"), 2);
}

#[tokio::test]
async fn unavailable_at_start_then_recovers() {
    let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let err = up.ensure_ready().await.unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable { .. }), "{err:?}");
    let (tx, _rx) = mpsc::channel(8);
    let err = up.call(spec("json", false), tx.clone()).await.unwrap_err();
    assert_eq!(err.delivery(), Delivery::NeverSent, "{err:?}");
    assert!(matches!(up.state(), TransportState::Down(_)));

    // The upstream comes up on the same port; the supervisor reconnects.
    let listener = TcpListener::bind(addr).await.unwrap();
    let st = Arc::new(MockState::default());
    serve(listener, st.clone()).await;
    eventually("Ready", || up.state() == TransportState::Ready).await;
    ok_result(up.call(spec("json", false), tx).await);
}

#[tokio::test]
async fn dropping_the_call_sends_cancelled() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    let call = up.call(spec("hang", false), tx);
    // Drop the future once the upstream has the request.
    tokio::select! {
        r = call => panic!("the hanging call must not resolve: {r:?}"),
        _ = eventually("tools/call", || st.count("tools/call") == 1) => {}
    }
    eventually("notifications/cancelled", || {
        st.count("notifications/cancelled") == 1
    })
    .await;
    let recs = st.records();
    let sent = recs
        .iter()
        .find(|r| r.rpc_method() == Some("tools/call"))
        .unwrap();
    let cancel = recs
        .iter()
        .find(|r| r.rpc_method() == Some("notifications/cancelled"))
        .unwrap();
    let cb = cancel.body.as_ref().unwrap();
    assert_eq!(cb["params"]["requestId"], sent.body.as_ref().unwrap()["id"]);
    assert_eq!(cancel.header(SESSION_HEADER), Some("s-1"));
}

#[tokio::test]
async fn standalone_get_stream_relays_and_answers_ping() {
    let (addr, st) = mock(MockState {
        get_stream: true,
        ..MockState::default()
    })
    .await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let mut notes = up.notifications();
    up.ensure_ready().await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.method, "notifications/tools/list_changed");
    eventually("ping answer", || {
        st.records().iter().any(|r| {
            r.body
                .as_ref()
                .is_some_and(|b| b["id"] == "gp-1" && b["result"] == json!({}))
        })
    })
    .await;
}

#[tokio::test]
async fn progress_on_get_stream_reaches_the_call_by_token() {
    let (addr, st) = mock(MockState {
        get_stream: true,
        ..MockState::default()
    })
    .await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    eventually("GET stream", || st.get_tx.lock().is_some()).await;
    let (tx, mut rx) = mpsc::channel(8);
    let caller = up.clone();
    let call = tokio::spawn(async move { caller.call(spec("get_progress", true), tx).await });
    let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("progress from the GET stream");
    // Reports for tokens no call holds were dropped, not delivered in its place.
    match ev {
        Some(CallEvent::Progress(p)) => {
            assert_eq!(
                p,
                json!({"progress":1,"message":"on GET"})
                    .as_object()
                    .cloned()
                    .unwrap()
            );
        }
        other => panic!("expected progress, got {other:?}"),
    }
    st.release.notify_one();
    let v = ok_result(call.await.unwrap());
    assert_eq!(v["content"][0]["text"], "released");
    // The route held no sender: the channel closes with the call, nothing else came.
    let rest = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    assert!(matches!(rest, Ok(None)), "{rest:?}");
    assert!(
        up.progress_routes().is_empty(),
        "route removed with the call"
    );
}

#[tokio::test]
async fn oversized_json_is_a_protocol_error() {
    let (addr, _st) = mock(MockState::default()).await;
    let mut o = opts(format!("http://{addr}/mcp"));
    o.max_message_bytes = 1024;
    let up = HttpUpstream::start(o);
    let mut s = spec("json", false);
    s.params
        .insert("arguments".into(), json!({"big": "x".repeat(4096)}));
    let (tx, _rx) = mpsc::channel(8);
    let err = up.call(s, tx).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Protocol { .. }), "{err:?}");
}

#[tokio::test]
async fn http_error_carries_status_and_snippet() {
    let (addr, _st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    let err = up.call(spec("nope", false), tx).await.unwrap_err();
    let UpstreamError::Broken { reason, .. } = err else {
        panic!("expected Broken, got {err:?}")
    };
    assert!(
        reason.contains("500") && reason.contains("unknown tool"),
        "{reason}"
    );
}

// ----- a broken session is never reused (module docs) -----------------------------

fn sent_in<'a>(recs: &'a [Recorded], rpc_method: &str) -> Vec<&'a Recorded> {
    recs.iter()
        .filter(|r| r.rpc_method() == Some(rpc_method))
        .collect()
}

fn deleted(st: &MockState, sid: &str) -> bool {
    st.records()
        .iter()
        .any(|r| r.method == "DELETE" && r.header(SESSION_HEADER) == Some(sid))
}

/// `tool` fails the call it answers; the next call runs `initialize` again and goes
/// to a new session, and the old one is ended with DELETE.
async fn next_call_after(tool: &str) -> UpstreamError {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    ok_result(up.call(spec("json", false), tx.clone()).await);
    let err = up.call(spec(tool, false), tx.clone()).await.unwrap_err();
    assert_eq!(err.delivery(), Delivery::SentThenFailed, "{tool}: {err:?}");
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(st.count("initialize"), 2, "{tool}: a fresh session");
    let recs = st.records();
    let calls = sent_in(&recs, "tools/call");
    assert_eq!(calls.len(), 3, "{tool}: the failed call is not re-sent");
    assert_eq!(calls[1].header(SESSION_HEADER), Some("s-1"), "{tool}");
    assert_eq!(calls[2].header(SESSION_HEADER), Some("s-2"), "{tool}");
    eventually("DELETE of the suspect session", || deleted(&st, "s-1")).await;
    assert_eq!(up.state(), TransportState::Ready);
    err
}

#[tokio::test]
async fn truncated_chunked_body_makes_the_session_suspect() {
    let err = next_call_after("truncated").await;
    assert!(matches!(err, UpstreamError::Broken { .. }), "{err:?}");
    assert!(err.to_string().contains("the stream broke"), "{err}");
}

#[tokio::test]
async fn connection_reset_makes_the_session_suspect() {
    let err = next_call_after("reset").await;
    assert!(matches!(err, UpstreamError::Broken { .. }), "{err:?}");
}

#[tokio::test]
async fn non_jsonrpc_answer_makes_the_session_suspect() {
    let err = next_call_after("garbage").await;
    assert!(matches!(err, UpstreamError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains("invalid JSON"), "{err}");
}

#[tokio::test]
async fn calls_in_flight_on_a_suspect_session_finish_there() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    let (tx, _rx) = mpsc::channel(8);
    let caller = up.clone();
    let held_tx = tx.clone();
    let held = tokio::spawn(async move { caller.call(spec("held", false), held_tx).await });
    eventually("the held call", || st.count("tools/call") == 1).await;
    up.call(spec("truncated", false), tx.clone())
        .await
        .unwrap_err();
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(st.count("initialize"), 2);
    assert!(!deleted(&st, "s-1"), "s-1 still serves a call");
    st.release.notify_one();
    let v = ok_result(held.await.unwrap());
    assert_eq!(v["content"][0]["text"], "held");
    eventually("DELETE once its last call ended", || deleted(&st, "s-1")).await;
}

/// Drop a `hang` call once the upstream has it, and wait until its cancel arrived.
async fn cancel_a_running_call(up: &HttpUpstream, st: &MockState) {
    let (tx, _rx) = mpsc::channel(8);
    let before = st.count("tools/call");
    tokio::select! {
        r = up.call(spec("hang", false), tx) => panic!("the hanging call resolved: {r:?}"),
        _ = eventually("tools/call", || st.count("tools/call") == before + 1) => {}
    }
    eventually("notifications/cancelled", || {
        st.count("notifications/cancelled") == 1
    })
    .await;
}

#[tokio::test]
async fn a_cancel_that_breaks_the_session_is_caught_before_the_next_call() {
    // python-sdk 1.9: a cancel breaks the session; later POSTs get a truncated
    // body, and its GET stream stays open without a byte.
    let (addr, st) = mock(MockState {
        on_cancel: OnCancel::Break,
        get_stream: true,
        ..MockState::default()
    })
    .await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    eventually("GET stream", || st.get_tx.lock().is_some()).await;
    cancel_a_running_call(&up, &st).await;
    let (tx, _rx) = mpsc::channel(8);
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(st.count("ping"), 1, "the cancel was verified");
    assert_eq!(st.count("initialize"), 2);
    let recs = st.records();
    let calls = sent_in(&recs, "tools/call");
    assert_eq!(calls.last().unwrap().header(SESSION_HEADER), Some("s-2"));
    eventually("the dead session's GET stream let go", || {
        st.get_closed.load(Ordering::SeqCst) >= 1
    })
    .await;
    eventually("DELETE of the dead session", || deleted(&st, "s-1")).await;
}

#[tokio::test]
async fn a_cancel_on_a_healthy_session_keeps_it() {
    let (addr, st) = mock(MockState::default()).await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    cancel_a_running_call(&up, &st).await;
    let (tx, _rx) = mpsc::channel(8);
    ok_result(up.call(spec("json", false), tx).await);
    assert_eq!(st.count("ping"), 1, "the cancel was verified");
    assert_eq!(st.count("initialize"), 1, "and the session kept");
    assert!(!deleted(&st, "s-1"));
}

#[tokio::test]
async fn a_session_that_stops_answering_after_a_cancel_is_replaced() {
    let (addr, st) = mock(MockState {
        on_cancel: OnCancel::Stall,
        ..MockState::default()
    })
    .await;
    let up = HttpUpstream::start(opts(format!("http://{addr}/mcp")));
    up.ensure_ready().await.unwrap();
    cancel_a_running_call(&up, &st).await;
    let (tx, _rx) = mpsc::channel(8);
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(20), up.call(spec("json", false), tx))
        .await
        .expect("a call after the cancel hung on the stalled session");
    ok_result(r);
    assert!(
        started.elapsed() < VERIFY_TIMEOUT + Duration::from_secs(5),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(st.count("initialize"), 2);
}

#[test]
fn location_resolution() {
    let base = "http://h:1/a/mcp";
    assert_eq!(
        resolve_location(base, "/mcp/").as_deref(),
        Some("http://h:1/mcp/")
    );
    assert_eq!(
        resolve_location(base, "mcp/").as_deref(),
        Some("http://h:1/a/mcp/")
    );
    assert_eq!(
        resolve_location(base, "http://o:2/x").as_deref(),
        Some("http://o:2/x")
    );
    // Never to another scheme: no downgrade, and no TLS endpoint nobody configured.
    assert_eq!(resolve_location(base, "https://o/x"), None);
    let tls = "https://h:1/a/b";
    assert_eq!(resolve_location(tls, "http://o/x"), None);
    assert_eq!(
        resolve_location(tls, "/mcp").as_deref(),
        Some("https://h:1/mcp")
    );
    assert_eq!(
        resolve_location(tls, "//o:3/m").as_deref(),
        Some("https://o:3/m")
    );
}
