//! Test harness: runs the real `taskgate` binary (the build under test) against real
//! upstream processes, and speaks HTTP to it.
#![allow(dead_code)]
// Each test crate includes this module; `pub` is how its files reach the helpers, so
// the crate-wide `unreachable_pub` lint does not apply here.
#![allow(unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

pub mod tls;

// The builders the benches share (stored records: `fixtures::task`, `fixtures::route`).
#[path = "../../benches/support/fixtures.rs"]
pub mod fixtures;
pub(crate) use fixtures::{Hs256Issuer, free_port};

pub const SECRET: &str = "integration-test-secret-0123456789abcdef0123";

/// The issuer of the tests' tokens, trusted by [`jwt_auth`].
pub const ISSUER: Hs256Issuer = Hs256Issuer {
    secret: SECRET,
    issuer: "https://issuer.test",
    audience: "taskgate-test",
};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_taskgate"))
}

/// The previous release's binary (docs/design.md §27 "Mixed versions"), which
/// `scripts/prev-release.sh` builds and prints and `scripts/test.sh` exports as
/// `TASKGATE_PREV_BIN`. A mixed-version test never skips: without it, it fails and
/// says how to get it.
pub fn prev_release_bin() -> PathBuf {
    match std::env::var("TASKGATE_PREV_BIN") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "TASKGATE_PREV_BIN is not set: the mixed-version tests need the previous \
             release's binary; run `export TASKGATE_PREV_BIN=$(bash scripts/prev-release.sh)` first"
        ),
    }
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The third-party peers installed by `scripts/install-peers.sh`.
pub fn peers() -> PathBuf {
    repo_root().join(".peers")
}

/// Node 22 from the peers.
pub fn node() -> PathBuf {
    peers().join("node22/node_modules/.bin/node")
}

/// The npm peers' `node_modules`.
pub fn node_modules() -> PathBuf {
    peers().join("npm/node_modules")
}

/// `@modelcontextprotocol/server-everything`'s entry point.
pub fn everything_js() -> PathBuf {
    node_modules().join("@modelcontextprotocol/server-everything/dist/index.js")
}

/// server-everything serving legacy Streamable HTTP on a free port: the process and
/// its port (`http://127.0.0.1:PORT/mcp`).
pub async fn start_everything_http() -> (Proc, u16) {
    let port = free_port();
    let mut cmd = Command::new(node());
    cmd.arg(everything_js())
        .arg("streamableHttp")
        .env("PORT", port.to_string());
    let p = Proc::spawn(cmd);
    p.wait_log("listening on port", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("server-everything (HTTP) did not start:\n{}", p.log_text()));
    (p, port)
}

/// Poll `cond` until it is true or `limit` passes.
pub async fn eventually<F: FnMut() -> bool>(limit: Duration, mut cond: F) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

/// Poll the async `cond` until it is true or `limit` passes.
pub async fn eventually_async<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond().await
}

/// A running process whose stderr is captured; killed on drop.
pub struct Proc {
    pub child: Child,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn process");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("TASKGATE_TEST_LOGS").is_some() {
                    eprintln!("[proc] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, logs }
    }

    pub fn log_text(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Wait for a log line containing `needle`; returns that line.
    pub async fn wait_log(&self, needle: &str, limit: Duration) -> Option<String> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(l) = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return Some(l.clone());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }

    /// Wait for the process to exit by itself, at most `limit`; panics with its log
    /// if it is still running then.
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "the process did not exit within {limit:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(&self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Config for the demo upstream over stdio.
pub fn demo_stdio_upstream(extra: &str) -> String {
    format!(
        "[[upstream]]\nname = \"demo\"\npath = \"/mcp\"\ncommand = [\"{}\", \"demo-upstream\"]\nmax_concurrency = 4\n{extra}\n",
        bin().display()
    )
}

pub fn http_upstream(name: &str, path: &str, url: &str, extra: &str) -> String {
    format!("[[upstream]]\nname = \"{name}\"\npath = \"{path}\"\nurl = \"{url}\"\n{extra}\n")
}

pub fn jwt_auth() -> String {
    ISSUER.auth_section()
}

pub fn no_auth() -> String {
    "[auth]\nmode = \"none\"\n".to_string()
}

pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An HS256 token of [`ISSUER`], valid for an hour.
pub fn token(sub: &str, tenant: &str) -> String {
    ISSUER.token(sub, tenant, 3600)
}

pub fn token_with(claims: Value) -> String {
    ISSUER.sign(&claims)
}

/// The variable `scripts/pg.sh` exports: the test PostgreSQL cluster.
pub const PG_URL_VAR: &str = "TASKGATE_TEST_PG_URL";

/// Whether the gateway tests run on PostgreSQL: `TASKGATE_TEST_STORE=postgres`
/// (`scripts/test.sh` runs a selection of them that way; README "Tests").
pub fn store_is_postgres() -> bool {
    std::env::var("TASKGATE_TEST_STORE").is_ok_and(|v| v == "postgres")
}

/// The test cluster's URL. A PostgreSQL test never skips: without a cluster it fails
/// and says how to get one.
pub fn pg_url() -> String {
    match std::env::var(PG_URL_VAR) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{PG_URL_VAR} is not set: PostgreSQL tests need the cluster scripts/pg.sh starts; \
             run them under it, e.g. `bash scripts/pg.sh run cargo nextest run --release --features external-tests --test store_postgres`"
        ),
    }
}

/// A schema name no other test uses (each test gets its own, so they run in parallel).
pub fn unique_schema() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "gw_{}_{}_{nanos:08x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `[store]` keys on PostgreSQL: the test cluster and a fresh schema.
pub fn pg_store_keys(schema: &str) -> String {
    format!(
        "backend = \"postgres\"\nurl = \"{}\"\nschema = \"{schema}\"\n",
        pg_url()
    )
}

/// The `[store]` keys of a gateway in `dir`: sled under `dir/data`, or (see
/// [`store_is_postgres`]) a fresh PostgreSQL schema, with `dir/data` still holding the
/// runtime directory.
pub fn store_keys(dir: &Path) -> String {
    let mut keys = format!("path = \"{}\"\n", dir.join("data").display());
    if store_is_postgres() {
        keys.push_str(&pg_store_keys(&unique_schema()));
    }
    keys
}

/// A running gateway.
pub struct Gateway {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    /// The listener speaks TLS (`server.tls_cert`): [`Gateway::url`] is `https://`, and
    /// requests need `tls::trust` first.
    pub https: bool,
}

impl Gateway {
    /// Start the gateway with `body` (config without `[server]`/`[store]`) in a fresh dir.
    pub async fn start(body: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, body).await
    }

    pub async fn start_in(dir: tempfile::TempDir, body: &str) -> Self {
        let config_path = dir.path().join("taskgate.toml");
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\n[store]\n{}{body}",
            store_keys(dir.path())
        );
        std::fs::write(&config_path, text).unwrap();
        Self::launch(dir, config_path).await
    }

    pub async fn launch(dir: tempfile::TempDir, config_path: PathBuf) -> Self {
        Self::launch_bin(&bin(), dir, config_path).await
    }

    /// As [`Gateway::launch`], running the binary at `bin` (another release's, for
    /// the mixed-version tests).
    pub async fn launch_bin(bin: &Path, dir: tempfile::TempDir, config_path: PathBuf) -> Self {
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&config_path)
            .current_dir(dir.path());
        cmd.env("TASKGATE_LOG", "info,taskgate=debug");
        let proc = Proc::spawn(cmd);
        // `http://` or, with `server.tls_cert`, `https://` (tests/tls.rs).
        let line = proc
            .wait_log("taskgate listening on ", Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("gateway did not start:\n{}", proc.log_text()));
        let addr: SocketAddr = line
            .rsplit("://")
            .next()
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.trim_end_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("no address in {line}"));
        Self {
            proc,
            addr,
            dir,
            config_path,
            https: line.contains("listening on https://"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, path)
    }

    /// SIGKILL the gateway and start it again on the same store and config, ready.
    pub async fn kill9_and_relaunch(self) -> Self {
        let Gateway {
            mut proc,
            dir,
            config_path,
            ..
        } = self;
        proc.kill9();
        drop(proc);
        let gw = Gateway::launch(dir, config_path).await;
        gw.wait_ready().await;
        gw
    }

    /// Wait until `/readyz` says ready.
    pub async fn wait_ready(&self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(r) = raw(&self.url("/readyz"), "GET", &[], Bytes::new()).await
                && r.status == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("gateway not ready:\n{}", self.proc.log_text());
    }
}

/// A response as the tests see it.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        if self.is_sse() {
            // The final JSON-RPC message of an SSE response.
            return self
                .sse_messages()
                .into_iter()
                .rev()
                .find(|m| m.get("result").is_some() || m.get("error").is_some())
                .unwrap_or(Value::Null);
        }
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn is_sse(&self) -> bool {
        self.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// All JSON messages carried by `data:` lines of an SSE body.
    pub fn sse_messages(&self) -> Vec<Value> {
        sse_messages(&self.body)
    }
}

pub fn sse_messages(body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let data: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .collect();
        if !data.is_empty()
            && let Ok(v) = serde_json::from_str(&data.join("\n"))
        {
            out.push(v);
        }
    }
    out
}

pub async fn raw(
    url: &str,
    method: &str,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<Resp, String> {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    let req = b.body(Full::new(body)).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(60), send(req))
        .await
        .map_err(|_| "timeout".to_string())??;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect())
        .await
        .map_err(|_| "body timeout".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// Send one request: `http://` in plain text, `https://` trusting what
/// [`tls::trust`] was given (tests/tls.rs). The error carries the whole chain.
pub async fn send(
    req: http::Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    if req.uri().scheme_str() == Some("https") {
        tls::https_client()
            .request(req)
            .await
            .map_err(|e| tls::chain(&e))
    } else {
        Client::builder(TokioExecutor::new())
            .build_http::<Full<Bytes>>()
            .request(req)
            .await
            .map_err(|e| e.to_string())
    }
}

/// `_meta` for a 2026 request with the given client capabilities.
pub fn meta(caps: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "taskgate-tests", "version": "0"}
    })
}

/// A well-formed client for one gateway path and token.
#[derive(Clone)]
pub struct Client2026 {
    pub url: String,
    pub token: Option<String>,
    pub caps: Value,
}

impl Client2026 {
    pub fn new(gw: &Gateway, path: &str, token: Option<String>) -> Self {
        Self {
            url: gw.url(path),
            token,
            caps: json!({}),
        }
    }

    pub fn with_caps(mut self, caps: Value) -> Self {
        self.caps = caps;
        self
    }

    /// Standard headers for `method` with `params` (the `Mcp-Name` is derived).
    pub fn headers(&self, method: &str, params: &Value) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("content-type", "application/json".to_string()),
            ("accept", "application/json, text/event-stream".to_string()),
            ("mcp-protocol-version", "2026-07-28".to_string()),
            ("mcp-method", method.to_string()),
        ];
        let name = match method {
            "tools/call" | "prompts/get" => params.get("name"),
            "resources/read" => params.get("uri"),
            "tasks/get" | "tasks/update" | "tasks/cancel" => params.get("taskId"),
            _ => None,
        };
        if let Some(Value::String(n)) = name {
            h.push(("mcp-name", n.clone()));
        }
        if let Some(t) = &self.token {
            h.push(("authorization", format!("Bearer {t}")));
        }
        h
    }

    pub fn body(&self, id: Value, method: &str, params: &Value) -> Value {
        let mut p = params.clone();
        if !p.is_object() {
            p = json!({});
        }
        p["_meta"] = meta(self.caps.clone());
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": p})
    }

    pub async fn request(&self, method: &str, params: Value) -> Resp {
        let body = self.body(json!(1), method, &params);
        self.send(method, &params, &body).await
    }

    pub async fn send(&self, method: &str, params: &Value, body: &Value) -> Resp {
        let h = self.headers(method, params);
        raw(&self.url, "POST", &h, Bytes::from(body.to_string()))
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    pub async fn call_tool(&self, name: &str, args: Value) -> Resp {
        self.request("tools/call", json!({"name": name, "arguments": args}))
            .await
    }
}

pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Text of the first content block of a tools/call result.
pub fn first_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// ---------------------------------------------------------------------------------
// Helpers added for methods.rs / auth.rs / upstream_faults.rs / http_front.rs.

/// Which transport the gateway reaches the demo legacy server through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http,
}

impl Gateway {
    /// Like [`Gateway::start`], with extra `key = value` lines in `[server]`
    /// (e.g. `"header_timeout_ms = 500\n"`). The test default `keepalive_ms = 1000`
    /// applies unless `server_extra` sets `keepalive_ms` itself (TOML refuses a key
    /// twice).
    pub async fn start_with_server(server_extra: &str, body: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("taskgate.toml");
        let store = dir.path().join("data");
        let keepalive = if server_extra.contains("keepalive_ms") {
            ""
        } else {
            "keepalive_ms = 1000\n"
        };
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n{keepalive}{server_extra}\n[store]\npath = \"{}\"\n{body}",
            store.display()
        );
        std::fs::write(&config_path, text).unwrap();
        Self::launch(dir, config_path).await
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }
}

/// `[[upstream]]` for the demo over stdio, with no defaults besides name/path/command
/// (so `extra` may set `max_concurrency`, `stdio_processes`, `env`, …).
pub fn stdio_upstream_bare(extra: &str) -> String {
    format!(
        "[[upstream]]\nname = \"demo\"\npath = \"/mcp\"\ncommand = [\"{}\", \"demo-upstream\"]\n{extra}\n",
        bin().display()
    )
}

/// The demo legacy server over Streamable HTTP (`taskgate demo-upstream --http`).
pub struct DemoHttp {
    pub proc: Proc,
    pub port: u16,
}

impl DemoHttp {
    /// On a fresh free port.
    pub async fn start() -> Self {
        for _ in 0..5 {
            if let Some(d) = Self::try_start_on(free_port(), &[]).await {
                return d;
            }
        }
        panic!("demo HTTP upstream did not start");
    }

    /// On `port` (retrying a few times while the port is still busy).
    pub async fn start_on(port: u16) -> Self {
        for _ in 0..40 {
            if let Some(d) = Self::try_start_on(port, &[]).await {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("demo HTTP upstream did not start on port {port}");
    }

    pub async fn try_start_on(port: u16, env: &[(&str, &str)]) -> Option<Self> {
        let mut cmd = Command::new(bin());
        cmd.arg("demo-upstream")
            .arg("--http")
            .arg(format!("127.0.0.1:{port}"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = Proc::spawn(cmd);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if proc.log_text().contains("listening on") {
                return Some(Self { proc, port });
            }
            if let Ok(Some(_)) = proc.child.try_wait() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        proc.kill9();
        None
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

/// `[[upstream]]` named `demo` at `/mcp` for a demo HTTP server on `port`.
pub fn demo_http_upstream(port: u16, extra: &str) -> String {
    http_upstream(
        "demo",
        "/mcp",
        &format!("http://127.0.0.1:{port}/mcp"),
        extra,
    )
}

/// The demo upstream over stdio as `sh -c 'tee -a LOG | exec taskgate demo-upstream'`:
/// every line the gateway writes to its children's stdin is appended to `log` (all
/// children share it), so a test sees what was sent upstream (`traced_messages`).
pub fn traced_stdio_upstream(log: &Path, upstream_extra: &str) -> String {
    let script = format!(
        "tee -a '{}' | exec '{}' demo-upstream",
        log.display(),
        bin().display()
    );
    format!(
        "[[upstream]]\nname = \"demo\"\npath = \"/mcp\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n{upstream_extra}\n",
        toml_string(&script)
    )
}

/// A token of the operator `ops-jane` (tenant `ops`) with `scope`: the `[admin] scope`
/// (default `taskgate:admin`) opens the operator API.
pub fn admin_token(scope: &str) -> String {
    token_with(json!({
        "sub": "ops-jane",
        "tenant": "ops",
        "iss": ISSUER.issuer,
        "aud": ISSUER.audience,
        "exp": now_s() + 3600,
        "scope": scope,
    }))
}

/// A gateway fronting the demo upstream over one transport. `demo` holds the HTTP
/// demo server (if any) so it lives as long as the test.
pub struct DemoSetup {
    pub gw: Gateway,
    pub demo: Option<DemoHttp>,
    /// stdio only, with [`DemoSetup::start_traced`]: every line the gateway wrote to
    /// its children's stdin (all children append to this one file).
    pub stdin_log: Option<PathBuf>,
    _trace_dir: Option<tempfile::TempDir>,
}

impl DemoSetup {
    /// JWT auth (test secret), `[server]` extras, upstream extras (for stdio these may
    /// set `max_concurrency`/`stdio_processes`; for HTTP they are appended verbatim).
    pub async fn start(t: Transport, server_extra: &str, upstream_extra: &str) -> Self {
        Self::start_full(t, server_extra, "", upstream_extra).await
    }

    /// Like [`DemoSetup::start_full`], but a stdio child is `sh -c 'tee -a LOG | exec
    /// taskgate demo-upstream'`, so the test can see what the gateway sent upstream
    /// (e.g. `notifications/cancelled`). HTTP: same as `start_full`.
    pub async fn start_traced(
        t: Transport,
        server_extra: &str,
        sections: &str,
        upstream_extra: &str,
    ) -> Self {
        if t == Transport::Http {
            return Self::start_full(t, server_extra, sections, upstream_extra).await;
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stdin.log");
        let upstream = traced_stdio_upstream(&log, upstream_extra);
        let gw = Gateway::start_with_server(
            server_extra,
            &format!("{}{sections}\n{upstream}", jwt_auth()),
        )
        .await;
        Self {
            gw,
            demo: None,
            stdin_log: Some(log),
            _trace_dir: Some(dir),
        }
    }

    /// As [`DemoSetup::start`]; `sections` (e.g. `"[tasks]\nsync_timeout_ms = 1500\n"`)
    /// goes between `[auth]` and `[[upstream]]`.
    pub async fn start_full(
        t: Transport,
        server_extra: &str,
        sections: &str,
        upstream_extra: &str,
    ) -> Self {
        let (demo, upstream) = match t {
            Transport::Stdio => (None, stdio_upstream_bare(upstream_extra)),
            Transport::Http => {
                let d = DemoHttp::start().await;
                let u = demo_http_upstream(d.port, upstream_extra);
                (Some(d), u)
            }
        };
        let gw = Gateway::start_with_server(
            server_extra,
            &format!("{}{sections}\n{upstream}", jwt_auth()),
        )
        .await;
        Self {
            gw,
            demo,
            stdin_log: None,
            _trace_dir: None,
        }
    }

    /// A client for `/mcp` as alice@acme.
    pub fn client(&self) -> Client2026 {
        Client2026::new(&self.gw, "/mcp", Some(token("alice", "acme")))
    }
}

/// Parse the demo's `stats` tool output (`{"calls":…,"cancelled":…,"counter":{…}}`).
pub async fn demo_stats(c: &Client2026) -> Value {
    let r = c.call_tool("stats", json!({})).await;
    assert_eq!(r.status, 200, "stats: {}", String::from_utf8_lossy(&r.body));
    let text = first_text(&r.json()["result"]);
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("stats text: {text:?} in {:?}", r.json()))
}

/// Bytes of an HTTP/1.1 request to `addr` (for raw TCP tests).
pub fn http1_request(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("POST {path} HTTP/1.1\r\nhost: {addr}\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Generate `stdio::NAME` and `http::NAME` tests from `async fn NAME(t: Transport)`.
#[allow(unused_macros)]
macro_rules! per_transport {
    ($($f:ident),* $(,)?) => {
        mod stdio {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $f() {
                    super::$f(crate::common::Transport::Stdio).await
                }
            )*
        }
        mod http {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $f() {
                    super::$f(crate::common::Transport::Http).await
                }
            )*
        }
    };
}

/// A TOML basic string literal for `s`.
pub fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// JSON-RPC messages (one per line) in a stdin trace written by `start_traced`.
pub fn traced_messages(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Did the gateway send `notifications/cancelled` for an upstream `tools/call` of
/// `tool`? (Matches the cancelled `requestId` to that call's upstream id.)
pub fn traced_cancel_of(path: &Path, tool: &str) -> bool {
    let msgs = traced_messages(path);
    let ids: Vec<&Value> = msgs
        .iter()
        .filter(|m| m["method"] == "tools/call" && m["params"]["name"] == tool)
        .map(|m| &m["id"])
        .collect();
    msgs.iter().any(|m| {
        m["method"] == "notifications/cancelled"
            && ids.iter().any(|id| **id == m["params"]["requestId"])
    })
}

// ---------------------------------------------------------------------------------
// Store backends (README "Durability"): tests that must hold for every backend take a
// `StoreBackend` and are generated per backend by `per_backend!`.

/// A durable store backend the gateway can run on. Adding one: a variant here, its
/// `[store]` table in `store_section`, and one `name => Variant` line in
/// `per_backend!`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreBackend {
    Sled,
    Postgres,
}

impl StoreBackend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sled => "sled",
            Self::Postgres => "postgres",
        }
    }

    /// The `[store]` table of a store kept under `dir` (a restart on the same `dir`
    /// reopens the same store), with `extra` keys appended.
    pub fn store_section(self, dir: &Path, extra: &str) -> String {
        match self {
            Self::Sled => format!(
                "[store]\npath = {}\n{extra}\n",
                toml_string(&dir.join("data").display().to_string())
            ),
            // The schema is named after `dir`, so a restart in it finds its tasks.
            Self::Postgres => format!(
                "[store]\npath = {}\n{}{extra}\n",
                toml_string(&dir.join("data").display().to_string()),
                pg_store_keys(&schema_for_dir(dir))
            ),
        }
    }
}

/// A schema name that is the same for every gateway started in `dir`.
pub fn schema_for_dir(dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    format!("dir_{:016x}", h.finish())
}

/// Generate `<backend>::NAME` tests from `async fn NAME(b: StoreBackend)`, one module
/// per backend listed in the `@backends` arm (with its attributes: PostgreSQL's needs
/// the test cluster, so feature `external-tests`, Cargo.toml).
#[allow(unused_macros)]
macro_rules! per_backend {
    ($($f:ident),* $(,)?) => {
        per_backend!(@backends [
            sled => Sled,
            #[cfg(feature = "external-tests")] postgres => Postgres
        ] [$($f),*]);
    };
    (@backends [$($(#[$a:meta])* $m:ident => $v:ident),*] $fns:tt) => {
        $( per_backend!(@one [$(#[$a])*] $m $v $fns); )*
    };
    (@one [$(#[$a:meta])*] $m:ident $v:ident [$($f:ident),*]) => {
        $(#[$a])*
        mod $m {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $f() {
                    super::$f(crate::common::StoreBackend::$v).await
                }
            )*
        }
    };
}

/// Pids (with their `/proc/PID/stat` start time) of the live children of `parent`.
pub fn child_processes(parent: u32) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((state, ppid, start)) = proc_stat(pid)
            && ppid == parent
            && state != 'Z'
        {
            out.push((pid, start));
        }
    }
    out
}

/// Whether `pid` still names the process that started at `starttime` and has not
/// exited (a zombie counts as exited: it runs nothing and holds nothing).
pub fn process_alive(pid: u32, starttime: u64) -> bool {
    proc_stat(pid).is_some_and(|(state, _, start)| start == starttime && state != 'Z')
}

/// `(state, ppid, starttime)` from `/proc/PID/stat` (fields 3, 4 and 22).
fn proc_stat(pid: u32) -> Option<(char, u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the
    // last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, ppid, start))
}

/// Poll `tasks/get` (honouring `pollIntervalMs` and 429s) until `status` is terminal
/// or equals `until`.
pub async fn poll_task(
    c: &Client2026,
    task_id: &str,
    until: &str,
    logs: &dyn Fn() -> String,
) -> Value {
    let start = Instant::now();
    let mut wait = 100u64;
    loop {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let r = c.request("tasks/get", json!({"taskId": task_id})).await;
        let v = r.json();
        if r.status == 429 {
            wait = v["error"]["data"]["retryAfterMs"]
                .as_u64()
                .unwrap_or(500)
                .max(50);
            continue;
        }
        assert_eq!(r.status, 200, "tasks/get: {v}\n{}", logs());
        let t = v["result"].clone();
        let status = t["status"].as_str().unwrap_or_default().to_string();
        if status == until || matches!(status.as_str(), "completed" | "failed" | "cancelled") {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "task {task_id} stuck in {status}: {t}\n{}",
            logs()
        );
        wait = t["pollIntervalMs"].as_u64().unwrap_or(200).clamp(50, 2000) + 20;
    }
}

/// The Python `mcp` 1.30 venv's interpreter.
pub fn task_python() -> std::path::PathBuf {
    peers().join("venv-mcp130/bin/python")
}

/// The Python 2025-11-25 task upstream (`tests/peers/mcp130_task_server.py`).
pub fn task_server_py() -> std::path::PathBuf {
    repo_root().join("tests/peers/mcp130_task_server.py")
}

/// That upstream serving Streamable HTTP on a free port: the process and its port.
pub async fn start_task_server_http() -> (Proc, u16) {
    let port = free_port();
    let mut cmd = Command::new(task_python());
    cmd.arg(task_server_py()).arg("http").arg(port.to_string());
    let p = Proc::spawn(cmd);
    p.wait_log("listening on port", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the Python task server did not start:\n{}", p.log_text()));
    (p, port)
}

/// A gateway (JWT auth) in front of server-everything's Streamable HTTP on `port` at
/// `/mcp`, with `[tasks]` keys `tasks` (which may open further sections).
pub async fn everything_gateway(port: u16, tasks: &str) -> Gateway {
    let url = format!("http://127.0.0.1:{port}/mcp");
    let body = format!(
        "{}[tasks]\n{tasks}{}",
        jwt_auth(),
        http_upstream("everything", "/mcp", &url, "")
    );
    let gw = Gateway::start(&body).await;
    gw.wait_ready().await;
    gw
}
