//! Tokens, deterministic task ids and seeded stores, and the requests the scenarios send.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use taskgate::config::StoreConfig;
use taskgate::store::sled::SledStore;
use taskgate::store::{TaskRecord, TaskStatus, TaskStore};

use super::fixtures::{route, task};
use super::{HttpClient, JWT, LEGACY_VERSION, META};

/// A token of [`JWT`], valid for two hours (longer than any run).
pub(super) fn token(sub: &str, tenant: &str) -> String {
    JWT.token(sub, tenant, 7200)
}

/// Task `i` of a seeded store: a well-formed id (`tsk_` + base64url of 16 bytes).
pub(super) fn seeded_id(i: u64) -> String {
    let bytes = (0xB00C_u128 << 64 | i as u128).to_be_bytes();
    format!(
        "tsk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Owner of seeded task `i`: principal `i % principals` = (tenant, subject).
pub(super) fn owner(i: u64, principals: u64) -> (String, String) {
    let p = i % principals;
    (format!("tenant-{}", p % 10), format!("user-{p}"))
}

/// Seeds `n` completed tasks (create + route removal, flush every `flush_every`) into
/// `dir/data` through the store API, then closes the store. Returns the elapsed time.
pub(super) fn seed(dir: &Path, n: u64, principals: u64, flush_every: u64) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t0 = Instant::now();
    rt.block_on(async {
        let cfg = StoreConfig {
            path: dir.join("data"),
            ..StoreConfig::default()
        };
        let store = SledStore::open(&cfg).unwrap();
        seed_store(store.as_ref(), n, principals, flush_every).await;
        drop(store);
    });
    drop(rt);
    t0.elapsed()
}

/// Seeds the `n` completed tasks [`get_maker`] reads into `store`.
pub(super) async fn seed_store(store: &dyn TaskStore, n: u64, principals: u64, flush_every: u64) {
    let result = json!({"content": [{"type": "text", "text": "hello from the seeded store"}],
                        "isError": false});
    for i in 0..n {
        let id = seeded_id(i);
        let (tenant, subject) = owner(i, principals);
        let rec = TaskRecord {
            status: TaskStatus::Completed,
            result: Some(result.clone()),
            ..task(&id, &tenant, &subject, 86_400_000)
        };
        let route_id = format!("rt_seed_{i}");
        let route = route(&route_id, &id, &tenant, &subject);
        store.create(&rec, &route, None).await.unwrap();
        store.remove_route(&route_id).await.unwrap();
        if (i + 1) % flush_every == 0 {
            store.flush().await.unwrap();
        }
    }
    store.flush().await.unwrap();
}

pub(super) fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                total += dir_size(&e.path());
            } else {
                // Allocated blocks, not the apparent (possibly sparse) length.
                use std::os::unix::fs::MetadataExt;
                total += md.blocks() * 512;
            }
        }
    }
    total
}

// ---------------------------------------------------------------------------------------
// Requests.

pub(super) fn post(url: &str) -> http::request::Builder {
    Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
}

pub(super) fn gw_req(
    addr: SocketAddr,
    bearer: &HeaderValue,
    method: &str,
    name: &str,
    body: String,
) -> Request<Full<Bytes>> {
    post(&format!("http://{addr}/mcp"))
        .header("authorization", bearer.clone())
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

pub(super) fn echo_body_2026(seq: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{seq},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}},{META}}}}}"#
    )
}

/// A 2025-era request on `session`, with a bearer token when the server wants one
/// (taskgate's legacy era does; the demo upstream and mcp-proxy do not).
pub(super) fn legacy_req(
    url: &str,
    session: &str,
    bearer: Option<&HeaderValue>,
    body: String,
) -> Request<Full<Bytes>> {
    let mut b = post(url);
    if let Some(t) = bearer {
        b = b.header("authorization", t.clone());
    }
    b.header("mcp-session-id", session)
        .header("mcp-protocol-version", LEGACY_VERSION)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Legacy `initialize` + `notifications/initialized`; returns the session id.
pub(super) async fn legacy_session(
    client: &HttpClient,
    url: &str,
    bearer: Option<&HeaderValue>,
) -> Result<String, String> {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": LEGACY_VERSION, "capabilities": {},
        "clientInfo": {"name": "taskgate-bench", "version": "0.1"}}});
    let mut req = post(url);
    if let Some(t) = bearer {
        req = req.header("authorization", t.clone());
    }
    let req = req.body(Full::new(Bytes::from(init.to_string()))).unwrap();
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let sid = sid.ok_or_else(|| {
        format!(
            "initialize: {status}, no session id: {}",
            String::from_utf8_lossy(&body)
        )
    })?;
    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string();
    let resp = client
        .request(legacy_req(url, &sid, bearer, note))
        .await
        .map_err(|e| e.to_string())?;
    let _ = resp.into_body().collect().await;
    Ok(sid)
}
