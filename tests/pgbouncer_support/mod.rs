//! A real PgBouncer in front of the test PostgreSQL cluster (docs/design.md §27
//! "Connection poolers"), started per test on a free port: Debian's `pgbouncer`
//! (package `pgbouncer`; `scripts/test.sh` installs it). It reaches the cluster over
//! the cluster's unix socket (`local … trust` in the cluster's pg_hba.conf), and
//! clients reach it in plaintext on 127.0.0.1 (`sslmode=disable`): the pooler's own
//! TLS is not what is under test. Killed on drop.
// Included by several test crates; `pub` is how they reach the helpers.
#![allow(unreachable_pub)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::common::*;

/// Where Debian puts it.
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

pub struct PgBouncer {
    pub port: u16,
    proc: Proc,
    _dir: tempfile::TempDir,
}

/// The test cluster's socket directory and port, from what `scripts/pg.sh` exports.
fn cluster() -> (PathBuf, u16) {
    let url = pg_url();
    let dir = std::env::var("TASKGATE_TEST_PG_DIR")
        .unwrap_or_else(|_| panic!("TASKGATE_TEST_PG_DIR is not set: run under scripts/pg.sh"));
    let port = url
        .split_once("@localhost:")
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"));
    (PathBuf::from(dir), port)
}

/// The uid and gid of the cluster's owner when we are root: PgBouncer refuses to run
/// as root, and the cluster's socket directory is its owner's.
fn run_as(socket_dir: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let m = std::fs::metadata(socket_dir).expect("the cluster's directory");
    Some((m.uid(), m.gid()))
}

impl PgBouncer {
    /// A PgBouncer with `pool_mode` (`transaction`, `session`) and `server_pool`
    /// server connections per database and user, shared by every client; `extra` is
    /// more of its `[pgbouncer]` settings, one per line.
    pub async fn start(pool_mode: &str, server_pool: u32, extra: &str) -> Self {
        assert!(
            Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} is missing: install PgBouncer (`apt-get install pgbouncer`; scripts/test.sh does)"
        );
        let (socket_dir, pg_port) = cluster();
        let owner = run_as(&socket_dir);
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let users = dir.path().join("users.txt");
            std::fs::write(&users, "\"postgres\" \"\"\n").unwrap();
            let ini = dir.path().join("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n* = host={} port={pg_port}\n\
                     [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                     unix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                     pool_mode = {pool_mode}\ndefault_pool_size = {server_pool}\n\
                     max_client_conn = 500\nlog_connections = 0\nlog_disconnections = 0\n{extra}\n",
                    socket_dir.display(),
                    users.display()
                ),
            )
            .unwrap();
            let mut cmd = Command::new(PGBOUNCER);
            cmd.arg(&ini);
            if let Some((uid, gid)) = owner {
                use std::os::unix::process::CommandExt;
                for p in [dir.path(), &users, &ini] {
                    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
                }
                cmd.uid(uid).gid(gid);
            }
            let proc = Proc::spawn(cmd);
            let up = eventually_async(Duration::from_secs(10), || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            })
            .await;
            if up {
                return Self {
                    port,
                    proc,
                    _dir: dir,
                };
            }
            // The port was taken between the check and the bind: another one.
            eprintln!("pgbouncer did not listen on {port}:\n{}", proc.log_text());
        }
        panic!("pgbouncer did not start");
    }

    /// The URL of the test database through this PgBouncer.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }
}
