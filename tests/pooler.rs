//! PostgreSQL behind a transaction-mode connection pooler (docs/design.md §27
//! "Connection poolers"; README "Behind a connection pooler"): real gateway binaries
//! sharing one schema through a real PgBouncer in `pool_mode = transaction`, whose
//! few server connections every client shares. Nothing of a task is lost; change
//! fan-out, whose `LISTEN` cannot deliver there, polls instead and says so.

mod common;
mod pgbouncer_support;
mod replicas_support;
mod tasks_support;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use pgbouncer_support::*;
use replicas_support::*;
use serde_json::json;
use tasks_support::*;

/// The replicas' `tasks.poll_interval_ms`: the interval change fan-out polls at.
const POLL_MS: u64 = 500;
/// What a replica logs when its `LISTEN` does not deliver.
const FALLBACK: &str = "postgres LISTEN did not deliver this replica's probe notification";
/// Bounds, generous: they catch a hang, not a slow machine.
const BOUND: Duration = Duration::from_secs(30);

/// `n` replicas on one fresh schema through `bouncer`, with `pooler = "transaction"`.
async fn replicas_behind(bouncer: &PgBouncer, n: usize) -> Replicas {
    let direct = pg_url();
    let through = bouncer.url();
    Replicas::start_edited(n, "", |text| {
        text.replace(
            &format!("url = \"{direct}\"\n"),
            &format!("url = \"{through}\"\npooler = \"transaction\"\n"),
        )
        .replace(
            "poll_interval_ms = 50\n",
            &format!("poll_interval_ms = {POLL_MS}\n"),
        )
    })
    .await
}

/// The value of the unlabelled gauge `name` on replica `i`'s `/metrics`.
async fn gauge(rs: &Replicas, i: usize, name: &str) -> Option<f64> {
    let r = raw(&rs.gws[i].url("/metrics"), "GET", &[], Bytes::new())
        .await
        .ok()?;
    String::from_utf8_lossy(&r.body)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
}

/// Milliseconds since the epoch of a snapshot's `lastUpdatedAt`: the fixed-width ISO
/// 8601 text sorts as its instant does, so a binary search over the gateway's own
/// formatting finds it.
fn instant_of(iso: &str) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 45);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if taskgate::tasks::clock::iso8601(mid).as_str() < iso {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_behind_pgbouncer_lose_nothing_and_notify_by_polling() {
    // Four server connections for two replicas' pools, publishers and listeners: a
    // client's next transaction often runs on another server connection.
    let bouncer = PgBouncer::start("transaction", 4, "").await;
    let rs = replicas_behind(&bouncer, 2).await;
    let (a, b) = (rs.client(0), rs.client(1));

    // Each replica's start-up probe finds that LISTEN does not deliver, says so, and
    // shows it in /metrics.
    for i in 0..2 {
        let line = rs.gws[i].proc.wait_log(FALLBACK, BOUND).await;
        assert!(
            line.is_some(),
            "r{i} did not fall back:\n{}",
            rs.gws[i].proc.log_text()
        );
        assert_eq!(
            gauge(&rs, i, "taskgate_store_fanout_polling").await,
            Some(1.0),
            "r{i}"
        );
    }

    // A listen on B hears of a task that A runs, within the poll interval.
    let id = task_id(&create_task(&a, "sleep", json!({"ms": 1500})).await);
    let mut l = SseStream::listen(&b, json!("sub"), json!({"taskIds": [id.clone()]})).await;
    assert_eq!(l.status, 200);
    l.next(BOUND).await.expect("ack");
    let done = l
        .task_reached(&id, "completed", BOUND)
        .await
        .unwrap_or_else(|| {
            panic!(
                "B's listen never saw A's completion:\n{}",
                rs.gws[1].proc.log_text()
            )
        });
    let heard = now_ms();
    let changed = done["lastUpdatedAt"]
        .as_str()
        .map(instant_of)
        .unwrap_or(heard);
    eprintln!(
        "B heard of A's completion {} ms after it was written (poll interval {POLL_MS} ms)",
        heard.saturating_sub(changed)
    );

    // Tasks created on either replica, read and settled through the other.
    let mut ids = Vec::new();
    for i in 0..12u64 {
        let (on, ms) = if i % 2 == 0 {
            (&a, 400 + 50 * i)
        } else {
            (&b, 400 + 50 * i)
        };
        ids.push((
            task_id(&create_task(on, "sleep", json!({"ms": ms})).await),
            ms,
            i % 2,
        ));
    }
    for (id, ms, on) in &ids {
        let other = if *on == 0 { &b } else { &a };
        let r = poll_terminal(other, id).await;
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(first_text(&r["result"]), format!("slept {ms} ms"), "{r}");
    }

    // A cancel on B of a call A holds is relayed to A, and the upstream sees it.
    let before = upstream_cancels(&a).await;
    let id = task_id(&create_task(&a, "sleep", json!({"ms": 60_000})).await);
    poll_until(&b, &id, BOUND, |r| r["status"] == "working").await;
    let ack = ok_result(&tasks_cancel(&b, &id).await);
    assert_eq!(ack["resultType"], "complete", "{ack}");
    assert!(
        upstream_saw_cancel(&b, before, BOUND).await,
        "the upstream never saw the cancel:\n{}",
        rs.gws[0].proc.log_text()
    );
    for c in [&a, &b] {
        assert_eq!(ok_result(&tasks_get(c, &id).await)["status"], "cancelled");
    }

    // Nothing went wrong on the way: no statement failed for the pooler's sake.
    for i in 0..2 {
        let log = rs.gws[i].proc.log_text();
        assert!(
            !log.contains("prepared statement") && !log.contains("does not exist"),
            "r{i}:\n{log}"
        );
    }
}

/// Run a gateway with the default `pooler` through `bouncer` until it exits; its
/// stderr.
async fn start_refused(bouncer: &PgBouncer) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("taskgate.toml");
    let text = replica_config(dir.path(), "r0", &unique_schema(), 1, "").replace(
        &format!("url = \"{}\"\n", pg_url()),
        &format!("url = \"{}\"\n", bouncer.url()),
    );
    std::fs::write(&config_path, text).unwrap();
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--config")
        .arg(&config_path)
        .current_dir(dir.path());
    let mut proc = Proc::spawn(cmd);
    let status = proc.wait_exit(BOUND).await;
    let stderr = proc.log_text();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("pooler = \"transaction\""), "{stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_settings_behind_pgbouncer_refuse_to_start_and_say_why() {
    // PgBouncer refuses the start-up options…
    let refusing = PgBouncer::start("transaction", 2, "").await;
    let err = start_refused(&refusing).await;
    assert!(err.contains("unsupported startup parameter"), "{err}");
    // …or, told to ignore them, drops them: the migrations would write elsewhere.
    let dropping = PgBouncer::start("transaction", 2, "ignore_startup_parameters = options").await;
    let err = start_refused(&dropping).await;
    assert!(err.contains("start-up options did not arrive"), "{err}");
}
