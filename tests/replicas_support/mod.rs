//! Several replicas on one PostgreSQL schema, sharing one HTTP demo upstream: the
//! start-up shared by `replicas.rs` and `edge.rs` (docs/design.md §18–21).
// Included by several test crates; `pub` is how they reach the helpers.
#![allow(unreachable_pub)]
#![allow(dead_code)]

use super::common::*;
use super::tasks_support::*;

/// Short leases so takeovers happen within a test; the bounds below stay generous.
pub const LEASE_MS: u64 = 2_000;
pub const RENEW_MS: u64 = 400;
pub const SWEEP_MS: u64 = 400;

pub struct Replicas {
    /// Keeps the shared upstream alive as long as the replicas.
    pub demo: DemoHttp,
    pub gws: Vec<Gateway>,
}

pub fn replica_config(
    dir: &std::path::Path,
    id: &str,
    schema: &str,
    demo_port: u16,
    tasks_extra: &str,
) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nkeepalive_ms = 1000\nreplica_id = \"{id}\"\n\
         [store]\npath = {}\n{}lease_ms = {LEASE_MS}\nlease_renew_ms = {RENEW_MS}\nsweep_interval_ms = {SWEEP_MS}\n\
         {}{}{}",
        toml_string(&dir.join("data").display().to_string()),
        pg_store_keys(schema),
        jwt_auth(),
        tasks_section(tasks_extra),
        demo_http_upstream(demo_port, ""),
    )
}

pub async fn launch_replica(dir: tempfile::TempDir, config_path: std::path::PathBuf) -> Gateway {
    launch_replica_bin(&bin(), dir, config_path).await
}

/// As [`launch_replica`], running the binary at `bin`.
pub async fn launch_replica_bin(
    bin: &std::path::Path,
    dir: tempfile::TempDir,
    config_path: std::path::PathBuf,
) -> Gateway {
    let gw = Gateway::launch_bin(bin, dir, config_path).await;
    gw.wait_ready().await;
    gw
}

impl Replicas {
    pub async fn start(n: usize, tasks_extra: &str) -> Self {
        Self::start_edited(n, tasks_extra, |text| text).await
    }

    /// Like [`Replicas::start`], with each replica's config text passed through `edit`.
    pub async fn start_edited(
        n: usize,
        tasks_extra: &str,
        edit: impl Fn(String) -> String,
    ) -> Self {
        let schema = unique_schema();
        let demo = DemoHttp::start().await;
        let mut gws = Vec::new();
        for i in 0..n {
            gws.push(Self::start_one(&schema, demo.port, i, tasks_extra, &edit).await);
        }
        Self { demo, gws }
    }

    pub async fn start_one(
        schema: &str,
        demo_port: u16,
        i: usize,
        tasks_extra: &str,
        edit: &dyn Fn(String) -> String,
    ) -> Gateway {
        Self::start_one_bin(&bin(), schema, demo_port, i, tasks_extra, edit).await
    }

    /// As [`Replicas::start_one`], running the binary at `bin` (another release's).
    pub async fn start_one_bin(
        bin: &std::path::Path,
        schema: &str,
        demo_port: u16,
        i: usize,
        tasks_extra: &str,
        edit: &dyn Fn(String) -> String,
    ) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("taskgate.toml");
        let text = replica_config(dir.path(), &format!("r{i}"), schema, demo_port, tasks_extra);
        std::fs::write(&config_path, edit(text)).unwrap();
        launch_replica_bin(bin, dir, config_path).await
    }

    pub fn client(&self, i: usize) -> Client2026 {
        tasks_client(&self.gws[i], "alice", "acme")
    }
}

/// The demo upstream's count of calls it saw cancelled, as `c`'s replica reports it.
pub async fn upstream_cancels(c: &Client2026) -> u64 {
    task_demo_stats(c).await["cancelled"].as_u64().unwrap_or(0)
}

/// Whether the upstream saw one more cancel than `before` within `limit`.
pub async fn upstream_saw_cancel(c: &Client2026, before: u64, limit: std::time::Duration) -> bool {
    eventually_async(limit, || async { upstream_cancels(c).await > before }).await
}

pub fn replica_of(r: &Resp) -> String {
    r.header("taskgate-replica").unwrap_or_default()
}
