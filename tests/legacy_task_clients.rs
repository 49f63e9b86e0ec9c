//! Real 2025-11-25 task clients through the gateway (docs/design.md §25): the Python
//! `mcp` 1.30 client's `session.experimental.*` and the TypeScript SDK 1.32.2's
//! experimental tasks, against the demo server's synchronous tools — create, poll,
//! `tasks/result`, input answered on the result stream, cancel, and `tasks/list`
//! showing only the caller's tasks across two sessions while another principal gets
//! nothing. Drivers: `tests/peers/mcp130_task_client.py`,
//! `tests/peers/ts_task_client.mjs`.

mod common;

use std::process::Command;

use serde_json::{Value, json};

use common::*;

#[derive(Clone, Copy, Debug)]
enum Driver {
    Ts,
    Py,
}

fn require_peers() {
    for p in [
        node(),
        node_modules().join("@modelcontextprotocol/sdk/package.json"),
        peers().join("venv-mcp130/bin/python"),
    ] {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/install-peers.sh` first (the README's test command does)",
            p.display()
        );
    }
}

async fn gateway() -> Gateway {
    require_peers();
    let gw = Gateway::start(&format!("{}\n{}", jwt_auth(), demo_stdio_upstream(""))).await;
    gw.wait_ready().await;
    gw
}

/// Run `driver` in `mode` as `(sub, tenant)`; its summary line.
async fn run(gw: &Gateway, driver: Driver, who: (&str, &str), mode: &[&str]) -> Value {
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    let program = match driver {
        Driver::Ts => {
            args.push(repo_root().join("tests/peers/ts_task_client.mjs").into());
            args.push(node_modules().into());
            node()
        }
        Driver::Py => {
            args.push(repo_root().join("tests/peers/mcp130_task_client.py").into());
            peers().join("venv-mcp130/bin/python")
        }
    };
    args.push(gw.url("/mcp").into());
    args.push(token(who.0, who.1).into());
    for m in mode {
        args.push(m.into());
    }
    let out = tokio::task::spawn_blocking(move || {
        Command::new(program)
            .args(args)
            .env("CANCEL_AFTER_MS", "300")
            .output()
            .expect("run the driver")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!("{driver:?} {mode:?}: no JSON report\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    assert_eq!(v["ok"], true, "{driver:?} {mode:?}: {v}\nstderr:\n{stderr}");
    v
}

fn statuses(v: &Value) -> Vec<String> {
    v["statuses"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

async fn every_flow(driver: Driver) {
    let gw = gateway().await;
    let alice = ("alice", "acme");

    // Create, poll to the end, read the result.
    let v = run(
        &gw,
        driver,
        alice,
        &["create-poll-result", "sleep", r#"{"ms":1500}"#],
    )
    .await;
    assert_eq!(
        v["serverCapabilities"]["tasks"]["requests"]["tools"]["call"],
        json!({}),
        "{v}"
    );
    assert_eq!(v["tools"]["sleep"], "optional", "{v}");
    assert_eq!(
        statuses(&v).last().map(String::as_str),
        Some("completed"),
        "{v}"
    );
    assert_eq!(v["errors"], json!([]), "{v}");
    let created = v["taskId"].as_str().unwrap_or_default().to_string();
    assert!(created.starts_with("tsk_"), "{v}");

    // Input: input_required, the elicitation on the result stream, answered.
    let v = run(
        &gw,
        driver,
        alice,
        &["elicit", "elicit", r#"{"message":"name?"}"#],
    )
    .await;
    let s = statuses(&v);
    assert!(s.iter().any(|s| s == "input_required"), "{v}");
    assert_eq!(s.last().map(String::as_str), Some("completed"), "{v}");
    assert_eq!(v["elicitations"][0]["message"], "name?", "{v}");
    assert_eq!(v["elicitations"][0]["duringResult"], true, "{v}");
    assert!(v["elicitations"][0]["relatedTask"].is_string(), "{v}");

    // tasks/result right after creation blocks until the end.
    let v = run(
        &gw,
        driver,
        alice,
        &["create-result", "sleep", r#"{"ms":1000}"#],
    )
    .await;
    assert_eq!(
        statuses(&v).last().map(String::as_str),
        Some("completed"),
        "{v}"
    );

    // Cancel: cancelled; a second cancel is -32602; the result is an error.
    let v = run(&gw, driver, alice, &["cancel", "sleep", r#"{"ms":30000}"#]).await;
    assert_eq!(
        statuses(&v).last().map(String::as_str),
        Some("cancelled"),
        "{v}"
    );
    let errors = v["errors"].to_string();
    assert!(errors.contains("-32603"), "{v}");
    assert_eq!(v["cancelAgainError"]["code"], -32602, "{v}");

    // The list, from another session of the same principal, holds the first task;
    // another principal's list is empty and the id reads as unknown to it.
    let v = run(&gw, driver, alice, &["list"]).await;
    assert!(v["listed"].to_string().contains(&created), "{v}");
    let v = run(&gw, driver, ("mallory", "evil"), &["list"]).await;
    assert_eq!(v["listed"], json!([]), "{v}");
    let v = run(&gw, driver, ("mallory", "evil"), &["get", &created]).await;
    assert!(v["errors"].to_string().contains("-32602"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_experimental_tasks() {
    every_flow(Driver::Py).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_experimental_tasks() {
    every_flow(Driver::Ts).await;
}
