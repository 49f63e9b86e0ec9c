//! The command line outside the repository: with no `--config` and no
//! `./config/taskgate.toml`, `taskgate` runs the shipped default compiled into the
//! binary, and `taskgate token` needs only an `[auth]` table.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;

/// Run `taskgate ARGS` in `dir` to completion: (success, stdout, stderr).
fn run_in(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn looks_like_jwt(s: &str) -> bool {
    let s = s.trim();
    s.split('.').count() == 3 && !s.contains(char::is_whitespace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_token_outside_the_repository_use_the_built_in_default() {
    let dir = tempfile::tempdir().unwrap();
    // `token` prints only the token on stdout.
    let (ok, stdout, stderr) = run_in(dir.path(), &["token", "--sub", "alice", "--tenant", "acme"]);
    assert!(ok, "token failed: {stderr}");
    assert!(looks_like_jwt(&stdout), "stdout: {stdout:?}");
    let token = stdout.trim().to_string();

    let mut cmd = Command::new(bin());
    cmd.args(["--listen", "127.0.0.1:0"])
        .current_dir(dir.path());
    let proc = Proc::spawn(cmd);
    let line = proc
        .wait_log("taskgate listening on http://", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("gateway did not start:\n{}", proc.log_text()));
    assert!(
        proc.log_text().contains("built-in default"),
        "the log does not say which config runs:\n{}",
        proc.log_text()
    );
    let addr: SocketAddr = line
        .rsplit("http://")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.trim_end_matches('"').parse().ok())
        .unwrap();
    let url = format!("http://{addr}/mcp");
    // The shipped default fronts the bundled demo server and accepts the dev token.
    let c = Client2026 {
        url,
        token: Some(token),
        caps: json!({}),
    };
    let r = c.call_tool("echo", json!({"text": "hello"})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(first_text(&r.json()["result"]), "hello");
    // Its store is ./data of the working directory.
    assert!(dir.path().join("data").is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_needs_only_the_auth_table() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("auth-only.toml");
    write(&cfg, &jwt_auth());
    let cfg_arg = cfg.display().to_string();
    let (ok, stdout, stderr) = run_in(
        dir.path(),
        &[
            "token", "--config", &cfg_arg, "--sub", "bob", "--tenant", "beta",
        ],
    );
    assert!(ok, "token failed: {stderr}");
    assert!(looks_like_jwt(&stdout), "stdout: {stdout:?}");
    // The token is accepted by a gateway that shares the secret.
    let gw = Gateway::start(&format!("{}{}", jwt_auth(), demo_stdio_upstream(""))).await;
    let c = Client2026::new(&gw, "/mcp", Some(stdout.trim().to_string()));
    let r = c.request("server/discover", json!({})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // A config without [auth] secrets still fails clearly.
    write(&cfg, "[auth]\nmode = \"jwt\"\nalgorithms = [\"HS256\"]\n");
    let (ok, _, stderr) = run_in(
        dir.path(),
        &[
            "token", "--config", &cfg_arg, "--sub", "bob", "--tenant", "beta",
        ],
    );
    assert!(!ok);
    assert!(stderr.to_lowercase().contains("secret"), "{stderr}");
}
