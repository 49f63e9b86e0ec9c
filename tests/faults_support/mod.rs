//! Fault injection for `tests/faults.rs`: a TCP proxy that can pass,
//! black-hole, delay or reset what goes through it, switched at run time; and a
//! throwaway PostgreSQL cluster of the test's own that it may stop and crash.
// Included by test crates; `pub` is how they reach the helpers.
#![allow(unreachable_pub)]
#![allow(dead_code)]

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything at once.
    Pass,
    /// A partition: connections are accepted and kept, nothing is forwarded and
    /// nothing is reset (bytes wait in the socket buffers, as in a network whose
    /// packets are retransmitted until it heals).
    BlackHole,
    /// Forward, each chunk from the target back to the client held this long first:
    /// one round trip costs this much more.
    Delay(u64),
    /// Refuse: new connections are reset at once (existing ones were reset when the
    /// mode was entered).
    Reset,
}

#[derive(Clone, Copy, Debug)]
struct State {
    mode: Mode,
    /// Bumped by every switch to [`Mode::Reset`]: a connection older than the latest
    /// reset is reset, however quickly the mode switched back.
    resets: u64,
}

/// A fault-injecting TCP proxy on 127.0.0.1 in front of `target`. Dropping it stops
/// the accept loop; connections end when their peers close them.
pub struct FaultProxy {
    pub addr: SocketAddr,
    state: watch::Sender<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (state, rx) = watch::channel(State {
            mode: Mode::Pass,
            resets: 0,
        });
        let accept = tokio::spawn(accept_loop(listener, target, rx));
        Self {
            addr,
            state,
            accept,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.state.send_modify(|s| {
            if mode == Mode::Reset {
                s.resets += 1;
            }
            s.mode = mode;
        });
    }

    pub fn mode(&self) -> Mode {
        self.state.borrow().mode
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Close `s` with a TCP reset (SO_LINGER 0) rather than an orderly FIN.
fn reset(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket this process owns, with a valid `linger`.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, state: watch::Receiver<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        tokio::spawn(connection(client, target, state.clone()));
    }
}

/// Why a pump stopped.
enum End {
    Closed,
    Reset,
}

/// Wait while the proxy black-holes; `Err` when a reset newer than `born` came.
async fn wait_open(state: &mut watch::Receiver<State>, born: u64) -> Result<Mode, ()> {
    loop {
        let s = *state.borrow_and_update();
        if s.resets > born || s.mode == Mode::Reset {
            return Err(());
        }
        if s.mode != Mode::BlackHole {
            return Ok(s.mode);
        }
        if state.changed().await.is_err() {
            return Err(());
        }
    }
}

async fn connection(client: TcpStream, target: SocketAddr, mut state: watch::Receiver<State>) {
    let born = state.borrow().resets;
    // A partition holds the connection open without reaching the target.
    if wait_open(&mut state, born).await.is_err() {
        reset(&client);
        return;
    }
    let upstream = match TcpStream::connect(target).await {
        Ok(u) => u,
        Err(_) => {
            reset(&client);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let up = tokio::spawn(pump(cr, uw, state.clone(), born, false));
    let down = tokio::spawn(pump(ur, cw, state, born, true));
    // Either side's reset resets both; an orderly close of one lets the other finish.
    let (a, b) = tokio::join!(up, down);
    let mut halves = Vec::new();
    let mut any_reset = false;
    for (end, rd, wr) in [a, b].into_iter().flatten() {
        any_reset |= matches!(end, End::Reset);
        halves.push((rd, wr));
    }
    if any_reset {
        for (rd, _) in &halves {
            reset(rd.as_ref());
        }
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    born: u64,
    delayed: bool,
) -> (End, OwnedReadHalf, OwnedWriteHalf) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if wait_open(&mut state, born).await.is_err() {
            return (End::Reset, from, to);
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return (End::Closed, from, to);
                }
                Ok(n) => n,
            },
            // A mode change while waiting for bytes: look at it first.
            c = state.changed() => {
                if c.is_err() {
                    return (End::Reset, from, to);
                }
                continue;
            }
        };
        let mode = match wait_open(&mut state, born).await {
            Ok(m) => m,
            Err(()) => return (End::Reset, from, to),
        };
        if let (Mode::Delay(ms), true) = (mode, delayed) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        // Bytes read before a partition wait for it to heal.
        if wait_open(&mut state, born).await.is_err() {
            return (End::Reset, from, to);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return (End::Closed, from, to);
        }
    }
}

/// A free port below the kernel's ephemeral range (as scripts/pg.sh picks one): a
/// replica restarted on it finds it still free, because no `listen = "…:0"` of another
/// test and no outgoing connection is handed a port there.
pub fn fixed_port() -> u16 {
    use rand::Rng;
    let lo: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    for _ in 0..200 {
        let port = rand::rng().random_range(10_000..lo);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {lo}");
}

// ---------------------------------------------------------------------------------
// A PostgreSQL cluster of the test's own (the approach of scripts/pg.sh).

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn as_owner(program: &str) -> Command {
    let path = format!("{PG_BIN}/{program}");
    // initdb refuses to run as root: the `postgres` OS user owns the cluster.
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &path]);
        c
    } else {
        Command::new(path)
    }
}

/// A throwaway PostgreSQL 15 cluster: `initdb --no-sync` into a temp directory, on a
/// free port with its unix socket there, removed on drop. The tests that stop or crash
/// the database use this one, never the shared cluster other tests run on. It has no
/// TLS: the tests of `sslmode=prefer` against a plaintext server use that too.
pub struct PgCluster {
    pub dir: PathBuf,
    pub port: u16,
    /// The address it listens on (127.0.0.1 unless [`PgCluster::start_on`]).
    pub ip: std::net::IpAddr,
}

impl PgCluster {
    pub fn start() -> Self {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// A cluster listening on `ip` only, accepting any client address (trust) over
    /// TCP: for a server that is not on the loopback.
    pub fn start_on(ip: std::net::IpAddr) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("taskgate-faults-pg.")
            .tempdir_in("/tmp")
            .unwrap()
            .keep();
        if unsafe { libc::geteuid() } == 0 {
            let ok = Command::new("chown")
                .arg("postgres:")
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown of {}", dir.display());
        }
        let out = as_owner("initdb")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["--no-sync", "-A", "trust", "-U", "postgres", "-E", "UTF8"])
            .arg("--locale=C")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !ip.is_loopback() {
            let hba = dir.join("data").join("pg_hba.conf");
            let mut text = std::fs::read_to_string(&hba).unwrap();
            text.push_str("\nhost all all 0.0.0.0/0 trust\n");
            std::fs::write(&hba, text).unwrap();
        }
        let mut c = Self { dir, port: 0, ip };
        for _ in 0..5 {
            c.port = fixed_port();
            if c.try_start() {
                return c;
            }
        }
        panic!("the test's PostgreSQL did not start:\n{}", c.server_log());
    }

    fn try_start(&self) -> bool {
        as_owner("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-t", "60", "-l"])
            .arg(self.dir.join("server.log"))
            .arg("-o")
            .arg(format!(
                "-c listen_addresses={} -p {} -k {} -c max_connections=200",
                self.ip,
                self.port,
                self.dir.display()
            ))
            .arg("start")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Start it again on the same port (after [`PgCluster::stop`]).
    pub fn restart(&self) {
        for _ in 0..20 {
            if self.try_start() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("PostgreSQL did not start again:\n{}", self.server_log());
    }

    /// `pg_ctl stop -m fast` (a clean shutdown) or `-m immediate` (a crash: no
    /// checkpoint, crash recovery at the next start).
    pub fn stop(&self, mode: &str) {
        let ok = as_owner("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-t", "60", "-m", mode, "stop"])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pg_ctl stop -m {mode}:\n{}", self.server_log());
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = as_owner("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The IPv4 address and port of a `postgres://user@host:port/db?…` URL (the host
/// resolved: scripts/pg.sh's URL says `localhost`, the cluster listens on 127.0.0.1).
pub fn url_addr(url: &str) -> SocketAddr {
    use std::net::ToSocketAddrs;
    let rest = url.split('@').nth(1).unwrap_or(url);
    let hostport = rest.split(['/', '?']).next().unwrap();
    hostport
        .to_socket_addrs()
        .unwrap()
        .find(SocketAddr::is_ipv4)
        .unwrap_or_else(|| panic!("no IPv4 address for {hostport}"))
}

/// `url` with its host and port replaced by `addr` (a proxy in front of it); the
/// database and the query string (`sslmode`, `sslrootcert`) are kept. The test
/// cluster's certificate names 127.0.0.1, so `verify-full` holds through the proxy.
pub fn url_via(url: &str, addr: SocketAddr) -> String {
    let (head, rest) = url.split_once('@').unwrap();
    let db = rest.split_once('/').map(|(_, d)| d).unwrap_or("postgres");
    format!("{head}@{addr}/{db}")
}
