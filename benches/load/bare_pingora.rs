//! pingora's own floor: this binary re-executed with `--bare-pingora LISTEN
//! UPSTREAM[,UPSTREAM…] DIR` runs a pingora proxy that sends each request to the
//! upstream its `bare-upstream` header names by index (the first without one) and does
//! nothing else (no routing by task, no retry buffer, no metrics, no log line), on the
//! server configuration `taskgate edge` uses (one worker thread per core). The edge
//! section's bare rows name the replica the direct row sends each request to, so they
//! do the direct rows' work plus one bare hop: the reference the edge's own hop is
//! measured against.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::fixtures::free_port;
use super::processes::Proc;

#[cfg(feature = "edge")]
pub(super) fn bare_pingora_server(listen: &str, upstream: &str, dir: &str) {
    use async_trait::async_trait;
    use pingora_core::server::Server;
    use pingora_core::server::configuration::{Opt, ServerConf};
    use pingora_core::upstreams::peer::HttpPeer;
    use pingora_proxy::{ProxyHttp, Session};

    struct Bare(Vec<SocketAddr>);

    #[async_trait]
    impl ProxyHttp for Bare {
        type CTX = ();
        fn new_ctx(&self) {}
        async fn upstream_peer(
            &self,
            session: &mut Session,
            _ctx: &mut (),
        ) -> pingora_core::Result<Box<HttpPeer>> {
            let i = session
                .req_header()
                .headers
                .get(UPSTREAM_HEADER)
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            let addr = self.0.get(i).unwrap_or(&self.0[0]);
            Ok(Box::new(HttpPeer::new(*addr, false, String::new())))
        }
    }

    let upstreams = upstream.split(',').map(|u| u.parse().unwrap()).collect();
    let dir = Path::new(dir);
    let conf = ServerConf {
        pid_file: dir.join("bare.pid").display().to_string(),
        upgrade_sock: dir.join("bare.sock").display().to_string(),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = pingora_proxy::http_proxy_service(&server.configuration, Bare(upstreams));
    service.add_tcp(listen);
    server.add_service(service);
    server.run_forever();
}

#[cfg(not(feature = "edge"))]
pub(super) fn bare_pingora_server(_listen: &str, _upstream: &str, _dir: &str) {
    eprintln!("bare pingora needs a build with `--features edge`");
    std::process::exit(2);
}

/// The request header naming the upstream (an index into the list) a request goes to.
pub(super) const UPSTREAM_HEADER: &str = "bare-upstream";

/// A bare pingora proxy in front of `upstreams`, once it accepts connections.
pub(super) fn start_bare_pingora(
    dir: &Path,
    upstreams: &[SocketAddr],
) -> Result<(Proc, SocketAddr), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .map_err(|e| format!("{e}"))?;
    let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    cmd.arg("--bare-pingora")
        .arg(addr.to_string())
        .arg(
            upstreams
                .iter()
                .map(|u| u.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
        .arg(dir)
        .env("RUST_LOG", "error");
    let mut proc = Proc::spawn(cmd);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(st)) = proc.child.try_wait() {
            return Err(format!("bare pingora exited ({st}): {}", proc.log_text()));
        }
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok((proc, addr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "bare pingora did not listen within 20 s: {}",
        proc.log_text()
    ))
}
