//! What traces cost (README "Operations"): three gateways on the same demo upstream,
//! side by side in one run — traces off, on with `sample_ratio = 0` (spans are built
//! only to be dropped by the sampler: the cost of the instrumentation), and on with
//! `sample_ratio = 1` (every span exported). The collector is a sink in this process
//! that answers every OTLP post 200 and counts the bytes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::{BodyExt, Full};

use super::harness::{
    Check, Stats, check_echo, check_task_created, cpu_us_per, median_run, run_load,
};
use super::processes::{Gateway, gateway_config, start_gateway_with};
use super::report::{Report, err_note, ms};
use super::requests::{echo_body_2026, gw_req, token};
use super::{HttpClient, META_TASKS, MakeReq, Opts};

/// Bytes and posts the sink received.
#[derive(Default)]
struct Sink {
    posts: AtomicU64,
    bytes: AtomicU64,
}

/// An OTLP/HTTP endpoint that takes everything.
fn start_sink(rt: &tokio::runtime::Runtime) -> (SocketAddr, Arc<Sink>) {
    let sink = Arc::new(Sink::default());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let s = sink.clone();
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let s = s.clone();
                        async move {
                            let n = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes().len())
                                .unwrap_or(0);
                            s.posts.fetch_add(1, Ordering::Relaxed);
                            s.bytes.fetch_add(n as u64, Ordering::Relaxed);
                            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, sink)
}

pub(super) fn traces(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
) {
    let (sink_addr, sink) = start_sink(rt);
    let modes = [
        ("off", None),
        ("ratio 0", Some(0.0)),
        ("ratio 1", Some(1.0)),
    ];
    let gws: Vec<(&str, Gateway)> = modes
        .iter()
        .map(|(name, ratio)| {
            let dir = work.join(format!("traces-{}", name.replace(' ', "-")));
            std::fs::create_dir_all(&dir).unwrap();
            let mut config = gateway_config(&dir.join("data"), up);
            if let Some(r) = ratio {
                config.push_str(&format!(
                    "[telemetry]\notlp_endpoint = \"http://{sink_addr}\"\nsample_ratio = {r:.1}\n"
                ));
            }
            (*name, start_gateway_with(&dir, &config))
        })
        .collect();

    rep.section(
        "Traces: off vs on with sample_ratio 0 vs 1 (same run, same upstream, c = 16)",
        &[
            "request",
            "traces",
            "req/s",
            "p50",
            "p99",
            "gateway CPU µs/req",
            "CPU vs off",
            "errors",
        ],
    );
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("alice", "acme"))).unwrap();
    let echo = |addr: SocketAddr| -> MakeReq {
        let b = bearer.clone();
        Arc::new(move |n| gw_req(addr, &b, "tools/call", "echo", echo_body_2026(n)))
    };
    let create = |addr: SocketAddr| -> MakeReq {
        let b = bearer.clone();
        Arc::new(move |n| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":50}},{META_TASKS}}}}}"#
            );
            gw_req(addr, &b, "tools/call", "sleep", body)
        })
    };
    type Maker<'a> = &'a dyn Fn(SocketAddr) -> MakeReq;
    let kinds: [(&str, Maker<'_>, Check, Duration); 2] = [
        ("inline tools/call echo", &echo, check_echo, Duration::ZERO),
        // The background calls finish before the next point.
        (
            "task creation (sleep 50 ms)",
            &create,
            check_task_created,
            Duration::from_millis(800),
        ),
    ];
    for (what, make, check, drain) in kinds {
        let mut off_cpu = f64::NAN;
        for (mode, gw) in &gws {
            let mk = make(gw.addr);
            let (s, cpu): (Stats, f64) = median_run(|| {
                let cpu0 = gw.proc.cpu_secs();
                let s = rt.block_on(run_load(c, 16, o.warmup, o.duration, mk.clone(), check));
                std::thread::sleep(drain);
                let cpu = cpu_us_per(&gw.proc, cpu0, &s);
                (s, cpu)
            });
            if *mode == "off" {
                off_cpu = cpu;
            }
            rep.row(&[
                what.to_string(),
                mode.to_string(),
                format!("{:.0}", s.rps()),
                ms(s.p50()),
                ms(s.p99()),
                format!("{cpu:.0}"),
                format!("{:.2}×", cpu / off_cpu),
                format!("{}{}", s.errors + s.refused, err_note(&s)),
            ]);
        }
    }
    // The last batches go out within the export interval.
    std::thread::sleep(Duration::from_millis(1500));
    rep.note(&format!(
        "Each row is the median of three runs; the three gateways are measured one after \
         another in the same run. The sink received {} OTLP posts, {:.1} MB of spans.",
        sink.posts.load(Ordering::Relaxed),
        sink.bytes.load(Ordering::Relaxed) as f64 / 1e6
    ));
}
