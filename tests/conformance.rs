//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, installed
//! by `scripts/install-peers.sh`) against the gateway in front of the legacy fixture
//! upstream `tests/fixtures/conformance_upstream.py` (Python `mcp==1.30.0`).
//! Expected failures live in `tests/conformance/baseline.yml`, each with its reason.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn peers() -> PathBuf {
    repo_root().join(".peers")
}

fn require_peers() {
    let needed = [
        peers().join("node22/node_modules/.bin/node"),
        peers().join("npm/node_modules/.bin/conformance"),
        peers().join("venv-mcp130/bin/python"),
    ];
    for p in needed {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
            p.display()
        );
    }
}

/// Start the fixture over HTTP and a gateway in front of it.
async fn fixture_and_gateway() -> (Proc, Gateway) {
    let port = free_port();
    let mut cmd = Command::new(peers().join("venv-mcp130/bin/python"));
    cmd.arg(repo_root().join("tests/fixtures/conformance_upstream.py"))
        .arg("--http")
        .arg(port.to_string());
    let fixture = Proc::spawn(cmd);
    // The gateway retries the upstream until it is up, so no wait is needed here; but
    // the suite's first scenario should not race the fixture's start-up.
    let url = format!("http://127.0.0.1:{port}/mcp");
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_root().join("tests/conformance/taskgate.toml"))
        .unwrap()
        .replace("@STORE@", &dir.path().join("data").display().to_string())
        .replace("@UPSTREAM_URL@", &url);
    let config_path = dir.path().join("taskgate.toml");
    write(&config_path, &text);
    let gw = Gateway::launch(dir, config_path).await;
    gw.wait_ready().await;
    (fixture, gw)
}

fn run_suite(gw: &Gateway, args: &[&str]) -> (bool, String) {
    let node_bin = peers().join("node22/node_modules/.bin");
    let path = format!(
        "{}:{}",
        node_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_dir = repo_root().join("target/conformance");
    let output = Command::new(peers().join("npm/node_modules/.bin/conformance"))
        .current_dir(peers().join("npm"))
        .env("PATH", path)
        .arg("server")
        .arg("--url")
        .arg(gw.url("/mcp"))
        .args(args)
        .arg("--expected-failures")
        .arg(repo_root().join("tests/conformance/baseline.yml"))
        .arg("-o")
        .arg(&out_dir)
        .output()
        .expect("run the conformance suite");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_2026_07_28_scored_scenarios() {
    require_peers();
    let (_fixture, gw) = fixture_and_gateway().await;
    let (ok, text) = run_suite(&gw, &["--requirements", "2026-07-28", "--timeout", "30000"]);
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("Total:")
                || l.contains('✗')
                || l.contains("Stale")
                || l.contains("Unexpected")
        })
        .collect();
    println!("{}", summary.join("\n"));
    assert!(
        ok,
        "conformance run failed against the baseline:\n{text}\n--- gateway log ---\n{}",
        gw.proc.log_text()
    );
}
