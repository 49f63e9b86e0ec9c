//! `Mcp-Param-*` headers (docs/design.md §12 "HTTP front"), against the real binary
//! in front of the demo upstream, whose tool `route` annotates `region` (a string) and
//! `zone` (an integer) with `x-mcp-header`: a matching header passes, a mismatch or a
//! missing header for an argument with a value is 400 `-32020` with the id, nothing is
//! checked before the upstream's tool list is known, and the header map a run learned
//! survives a restart.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};

fn body() -> String {
    format!("{}{}", jwt_auth(), demo_stdio_upstream(""))
}

fn client(gw: &Gateway) -> Client2026 {
    Client2026::new(gw, "/mcp", Some(token("alice", "acme")))
}

/// A `tools/call` of `tool` with `args`, the standard headers plus `extra`.
async fn call(
    c: &Client2026,
    id: Value,
    tool: &str,
    args: Value,
    extra: &[(&'static str, &str)],
) -> Resp {
    let params = json!({"name": tool, "arguments": args});
    let mut h = c.headers("tools/call", &params);
    h.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let body = c.body(id, "tools/call", &params);
    raw(&c.url, "POST", &h, Bytes::from(body.to_string()))
        .await
        .unwrap()
}

fn text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The call went through to the demo, which echoes its arguments as JSON text.
fn assert_served(r: &Resp, args: &Value) {
    assert_eq!(r.status, 200, "{}", text(r));
    let v = r.json();
    assert!(v.get("error").is_none(), "{v}");
    let echoed: Value = serde_json::from_str(&first_text(&v["result"])).expect("echoed JSON");
    assert_eq!(&echoed, args, "{v}");
}

fn assert_mismatch(r: &Resp, id: Value, message: &str) {
    assert_eq!(r.status, 400, "{}", text(r));
    let v = r.json();
    assert_eq!(v["error"]["code"], -32020, "{v}");
    assert_eq!(v["id"], id, "{v}");
    assert_eq!(v["error"]["message"], message, "{v}");
}

async fn stop(gw: Gateway) -> (tempfile::TempDir, PathBuf) {
    let Gateway {
        mut proc,
        dir,
        config_path,
        ..
    } = gw;
    proc.sigterm();
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = proc.child.try_wait() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gateway did not stop:\n{}",
            proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (dir, config_path)
}

#[tokio::test]
async fn param_headers_are_checked_once_the_tool_list_is_known() {
    let gw = Gateway::start(&body()).await;
    gw.wait_ready().await;
    let c = client(&gw);
    let args = json!({"region": "eu-west"});

    // No tools/list seen yet, none stored: not checked (and said once).
    let r = call(
        &c,
        json!(1),
        "route",
        args.clone(),
        &[("mcp-param-region", "us-east")],
    )
    .await;
    assert_served(&r, &args);
    assert!(
        gw.proc
            .wait_log(
                "Mcp-Param-* headers are not checked",
                Duration::from_secs(5)
            )
            .await
            .is_some(),
        "{}",
        gw.proc.log_text()
    );
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", text(&r));

    // Matching headers pass, plain or encoded, and whitespace around them is not part
    // of the value.
    let r = call(
        &c,
        json!(2),
        "route",
        args.clone(),
        &[("mcp-param-region", "eu-west")],
    )
    .await;
    assert_served(&r, &args);
    let r = call(
        &c,
        json!(3),
        "route",
        args.clone(),
        &[("Mcp-Param-Region", "  eu-west ")],
    )
    .await;
    assert_served(&r, &args);
    let accented = json!({"region": "Zürich"});
    let r = call(
        &c,
        json!(4),
        "route",
        accented.clone(),
        &[("mcp-param-region", "=?base64?WsO8cmljaA==?=")],
    )
    .await;
    assert_served(&r, &accented);
    let with_zone = json!({"region": "eu-west", "zone": 7, "note": "n"});
    let r = call(
        &c,
        json!(5),
        "route",
        with_zone.clone(),
        &[("mcp-param-region", "eu-west"), ("mcp-param-zone", "7")],
    )
    .await;
    assert_served(&r, &with_zone);
    // A null argument expects no header; one sent anyway is not refused.
    let null_zone = json!({"region": "eu-west", "zone": null});
    let r = call(
        &c,
        json!(6),
        "route",
        null_zone.clone(),
        &[("mcp-param-region", "eu-west")],
    )
    .await;
    assert_served(&r, &null_zone);
    let r = call(
        &c,
        json!(7),
        "route",
        args.clone(),
        &[("mcp-param-region", "eu-west"), ("mcp-param-zone", "9")],
    )
    .await;
    assert_served(&r, &args);

    // A mismatch, a missing header for an argument with a value, a wrong number.
    let r = call(
        &c,
        json!("m-1"),
        "route",
        args.clone(),
        &[("mcp-param-region", "us-east")],
    )
    .await;
    assert_mismatch(
        &r,
        json!("m-1"),
        "Mcp-Param-Region header does not match arguments.region",
    );
    let r = call(&c, json!(8), "route", args.clone(), &[]).await;
    assert_mismatch(&r, json!(8), "missing Mcp-Param-Region header");
    let r = call(
        &c,
        json!(9),
        "route",
        with_zone.clone(),
        &[("mcp-param-region", "eu-west"), ("mcp-param-zone", "8")],
    )
    .await;
    assert_mismatch(
        &r,
        json!(9),
        "Mcp-Param-Zone header does not match arguments.zone",
    );
    // Values are case-sensitive; names are not.
    let r = call(
        &c,
        json!(10),
        "route",
        args.clone(),
        &[("MCP-PARAM-REGION", "EU-WEST")],
    )
    .await;
    assert_mismatch(
        &r,
        json!(10),
        "Mcp-Param-Region header does not match arguments.region",
    );
    // Header checks come before `_meta`: a call without `_meta` still gets -32020.
    let params = json!({"name": "route", "arguments": args});
    let h = c.headers("tools/call", &params);
    let no_meta = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": params});
    let r = raw(&c.url, "POST", &h, Bytes::from(no_meta.to_string()))
        .await
        .unwrap();
    assert_mismatch(&r, json!(11), "missing Mcp-Param-Region header");

    // A tool without annotations ignores such headers.
    let r = call(
        &c,
        json!(12),
        "echo",
        json!({"text": "hi"}),
        &[("mcp-param-region", "x")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(first_text(&r.json()["result"]), "hi");
}

/// The header map learned from a `tools/list` is stored, so a restarted gateway
/// checks the very first call, before the upstream lists its tools again.
#[tokio::test]
async fn the_header_map_survives_a_restart() {
    let gw = Gateway::start(&body()).await;
    gw.wait_ready().await;
    let c = client(&gw);
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(
        gw.proc
            .wait_log("tool header map stored", Duration::from_secs(10))
            .await
            .is_some(),
        "{}",
        gw.proc.log_text()
    );
    let (dir, config_path) = stop(gw).await;

    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    let c = client(&gw);
    let args = json!({"region": "eu-west"});
    let r = call(
        &c,
        json!("r-1"),
        "route",
        args.clone(),
        &[("mcp-param-region", "us-east")],
    )
    .await;
    assert_mismatch(
        &r,
        json!("r-1"),
        "Mcp-Param-Region header does not match arguments.region",
    );
    let r = call(
        &c,
        json!(2),
        "route",
        args.clone(),
        &[("mcp-param-region", "eu-west")],
    )
    .await;
    assert_served(&r, &args);
    assert!(
        !gw.proc
            .log_text()
            .contains("Mcp-Param-* headers are not checked"),
        "the stored map was not used:\n{}",
        gw.proc.log_text()
    );
}
