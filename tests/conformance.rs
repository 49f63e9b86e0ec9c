//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, installed
//! by `scripts/install-peers.sh`) against the gateway in front of the legacy fixture
//! upstream `tests/fixtures/conformance_upstream.py` (Python `mcp==1.30.0`).
//! Expected failures live in `tests/conformance/baseline.yml`, each with its reason.

mod common;

use std::process::Command;

use common::*;

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

enum Transport {
    Http,
    Stdio,
}

/// Start the fixture (over HTTP, or as the gateway's stdio child) and a gateway in
/// front of it.
async fn fixture_and_gateway(transport: Transport) -> (Option<Proc>, Gateway) {
    let python = peers().join("venv-mcp130/bin/python");
    let script = repo_root().join("tests/fixtures/conformance_upstream.py");
    let (fixture, upstream) = match transport {
        Transport::Http => {
            let port = free_port();
            let mut cmd = Command::new(&python);
            cmd.arg(&script).arg("--http").arg(port.to_string());
            // The gateway retries an unreachable upstream, and wait_ready below
            // holds the suite until the fixture answered `initialize`.
            (
                Some(Proc::spawn(cmd)),
                format!("url = \"http://127.0.0.1:{port}/mcp\""),
            )
        }
        Transport::Stdio => (
            None,
            format!(
                "command = [\"{}\", \"{}\"]",
                python.display(),
                script.display()
            ),
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_root().join("tests/conformance/taskgate.toml"))
        .unwrap()
        .replace("@STORE@", &dir.path().join("data").display().to_string())
        .replace("@UPSTREAM@", &upstream);
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
    let (_fixture, gw) = fixture_and_gateway(Transport::Http).await;
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

/// The tasks-extension scenarios are not scored by `--requirements`, so each runs on
/// its own against the baseline; the fixture is the gateway's stdio child here, so
/// both transports face the suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_tasks_scenarios() {
    require_peers();
    let (_fixture, gw) = fixture_and_gateway(Transport::Stdio).await;
    let scenarios = [
        "tasks-lifecycle",
        "tasks-capability-negotiation",
        "tasks-wire-fields",
        "tasks-request-state-removal",
        "tasks-mrtr-input",
        "tasks-request-headers",
        "tasks-dispatch-and-envelope",
        "tasks-required-task-error",
        "tasks-mrtr-composition",
    ];
    let failed = run_each(&gw, &scenarios);
    assert!(
        failed.is_empty(),
        "tasks scenarios failed:\n{}\n--- gateway log ---\n{}",
        failed.join("\n"),
        gw.proc.log_text()
    );
}

/// Run each scenario on its own against the baseline; the failures, with their output.
fn run_each(gw: &Gateway, scenarios: &[&str]) -> Vec<String> {
    let mut failed = Vec::new();
    for s in scenarios {
        let (ok, text) = run_suite(gw, &["--scenario", s, "--timeout", "30000"]);
        let line = text
            .lines()
            .find(|l| l.contains("Passed:"))
            .unwrap_or("no summary")
            .to_string();
        println!("{s}: {line}");
        assert!(
            !line.contains("Passed: 0/0"),
            "{s} ran no check (skipped?):\n{text}"
        );
        if !ok {
            failed.push(format!("{s}: {line}\n{text}"));
        }
    }
    failed
}

/// The suite keeps these header scenarios in its "pending" set, which `--requirements`
/// runs without scoring; each runs on its own here, scored against the baseline.
/// `http-custom-header-server-validation` uses the fixture's one tool with an
/// `x-mcp-header` parameter (`test_custom_header`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_header_scenarios() {
    require_peers();
    let (_fixture, gw) = fixture_and_gateway(Transport::Http).await;
    let scenarios = [
        "http-header-validation",
        "http-custom-header-server-validation",
    ];
    let failed = run_each(&gw, &scenarios);
    assert!(
        failed.is_empty(),
        "header scenarios failed:\n{}\n--- gateway log ---\n{}",
        failed.join("\n"),
        gw.proc.log_text()
    );
}
