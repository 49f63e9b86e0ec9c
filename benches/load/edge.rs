//! `taskgate edge` in front of three replicas on one PostgreSQL schema (README "Running
//! several replicas behind the edge"), in one run: what the extra hop costs. Every
//! point is sent twice, through the edge and straight to the replicas, with the same
//! spread: a task's polls go to the replica the edge sends them to, inline calls
//! round-robin over the three. Then the delay the edge adds to an SSE notification:
//! one listen through the edge and one straight on the replica holding it, on the
//! same task.
//!
//! Needs `TASKGATE_TEST_PG_URL` and a binary built with `--features edge`
//! (`benches/run.sh` does both); without either the section says so instead of
//! running.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};

use super::bare_pingora::{UPSTREAM_HEADER, start_bare_pingora};
use super::fixtures::free_port;
use super::harness::{Check, check_echo, check_result, median_run, run_load};
use super::processes::{Gateway, Proc, taskgate_bin};
use super::replicas::{bearer, create, start_replicas, status};
use super::report::{Report, err_note, ms};
use super::requests::{echo_body_2026, gw_req};
use super::{HttpClient, META_TASKS, MakeReq, Opts, pg_url};

/// Completed tasks the `tasks/get` points poll (spread over the ring by their ids).
const TASKS: usize = 128;
const SSE_ROUNDS: usize = 15;

/// Where a load point sends its requests.
#[derive(Clone, Copy)]
enum Via {
    /// Straight to the replica.
    Direct,
    /// Through the bare pingora proxy in front of that replica.
    Bare,
    /// Through `taskgate edge`.
    Edge,
}

/// Sends a request meant for replica `holder` on its way (address, and the bare
/// proxy's header).
type Readdress =
    std::sync::Arc<dyn Fn(usize, Request<Full<Bytes>>) -> Request<Full<Bytes>> + Send + Sync>;

/// The edge process and the address it listens on.
struct Edge {
    proc: Proc,
    addr: SocketAddr,
}

/// Starts `taskgate edge` in front of `replicas` and waits until its `/healthz` sees
/// all of them healthy; `Err(why)` if it cannot (e.g. a binary built without the
/// `edge` feature exits at once and says so).
fn start_edge(
    rt: &tokio::runtime::Runtime,
    c: &HttpClient,
    dir: &Path,
    replicas: &[SocketAddr],
) -> Result<Edge, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .map_err(|e| format!("{e}"))?;
    let list: Vec<String> = replicas.iter().map(|a| format!("\"http://{a}\"")).collect();
    let config = format!(
        "[edge]\nlisten = \"{addr}\"\nreplicas = [{}]\nhealth_interval_ms = 1000\n\
         grace_period_s = 1\npid_file = \"{}\"\nupgrade_sock = \"{}\"\n",
        list.join(", "),
        dir.join("edge.pid").display(),
        dir.join("edge.sock").display(),
    );
    let cfg = dir.join("edge.toml");
    std::fs::write(&cfg, config).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(taskgate_bin());
    cmd.arg("edge")
        .arg("--config")
        .arg(&cfg)
        .current_dir(dir)
        .env("TASKGATE_LOG", "warn");
    let mut proc = Proc::spawn(cmd);
    let want = format!("\"healthy\":{}", replicas.len());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(st)) = proc.child.try_wait() {
            return Err(format!(
                "`taskgate edge` exited ({st}): {}",
                proc.log_text()
            ));
        }
        let healthz = rt.block_on(async {
            let req = Request::get(format!("http://{addr}/healthz"))
                .body(Full::new(Bytes::new()))
                .ok()?;
            let resp = c.request(req).await.ok()?;
            let b = resp.into_body().collect().await.ok()?.to_bytes();
            Some(String::from_utf8_lossy(&b).into_owned())
        });
        if healthz.is_some_and(|h| h.replace(' ', "").contains(&want)) {
            return Ok(Edge { proc, addr });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "`taskgate edge` did not see {} healthy replicas within 30 s: {}",
        replicas.len(),
        proc.log_text()
    ))
}

/// The replica (index into `gws`) that answers a `tasks/get` of `id` through the edge.
async fn replica_behind(
    c: &HttpClient,
    edge: SocketAddr,
    gws: &[Gateway],
    id: &str,
) -> Option<usize> {
    let body = get_body(0, id);
    let resp = c
        .request(gw_req(edge, &bearer(), "tasks/get", id, body))
        .await
        .ok()?;
    let name = resp.headers().get("taskgate-replica")?.to_str().ok()?;
    let index: usize = name.strip_prefix('r')?.parse().ok()?;
    (index < gws.len()).then_some(index)
}

fn get_body(seq: u64, id: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{seq},"method":"tasks/get","params":{{"taskId":"{id}",{META_TASKS}}}}}"#
    )
}

/// When the listen `resp` delivers the `completed` notification of `id` (`None` if the
/// stream ends or nothing comes within 30 s).
async fn completed_at(resp: http::Response<hyper::body::Incoming>, id: &str) -> Option<Instant> {
    let mut body = resp.into_body();
    let mut buf = String::new();
    let needle = format!("\"taskId\":\"{id}\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let frame = tokio::time::timeout(left, body.frame()).await.ok()??.ok()?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buf.push_str(&String::from_utf8_lossy(data));
        // One event per blank line; the notification is one `data:` line of JSON.
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let compact = event.replace(' ', "");
            if compact.contains("\"method\":\"notifications/tasks\"")
                && compact.contains(&needle)
                && compact.contains("\"status\":\"completed\"")
            {
                return Some(Instant::now());
            }
        }
    }
}

async fn listen(
    c: &HttpClient,
    addr: SocketAddr,
    seq: u64,
    id: &str,
) -> Option<http::Response<hyper::body::Incoming>> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{seq},"method":"subscriptions/listen","params":{{"notifications":{{"taskIds":["{id}"]}},{META_TASKS}}}}}"#
    );
    let resp = c
        .request(gw_req(addr, &bearer(), "subscriptions/listen", "", body))
        .await
        .ok()?;
    (resp.status() == 200).then_some(resp)
}

/// Signed µs by which the edge's listen saw the completion after the direct one, per
/// round; `Err` names the first round that failed.
async fn sse_deltas(c: &HttpClient, edge: SocketAddr, gws: &[Gateway]) -> Result<Vec<i64>, String> {
    let mut deltas = Vec::new();
    for round in 0..SSE_ROUNDS as u64 {
        let id = create(c, edge, 800).await;
        let via_edge = listen(c, edge, round, &id)
            .await
            .ok_or(format!("round {round}: listen through the edge failed"))?;
        let holder = via_edge
            .headers()
            .get("taskgate-replica")
            .and_then(|v| v.to_str().ok()?.strip_prefix('r')?.parse::<usize>().ok())
            .filter(|i| *i < gws.len())
            .ok_or(format!("round {round}: no Taskgate-Replica on the listen"))?;
        let direct = listen(c, gws[holder].addr, round, &id)
            .await
            .ok_or(format!("round {round}: direct listen failed"))?;
        let (e, d) = tokio::join!(completed_at(via_edge, &id), completed_at(direct, &id));
        let (Some(e), Some(d)) = (e, d) else {
            return Err(format!("round {round}: a listen missed the completion"));
        };
        deltas.push(if e >= d {
            e.duration_since(d).as_micros() as i64
        } else {
            -(d.duration_since(e).as_micros() as i64)
        });
    }
    deltas.sort_unstable();
    Ok(deltas)
}

pub(super) fn edge(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
) {
    rep.section(
        "The edge in front of three replicas (same run)",
        &[
            "measure",
            "path",
            "req/s",
            "p50",
            "p99",
            "p50 added by the hop",
            "proxy CPU µs/req",
            "replicas CPU µs/req",
            "errors",
        ],
    );
    let Some(url) = pg_url(rep, "Edge rows") else {
        return;
    };
    let schema = format!("bench_edge_{}", std::process::id());
    let gws = start_replicas(work, up, &url, &schema, 3);
    let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.addr).collect();
    let edge = match start_edge(rt, c, &work.join("edge"), &addrs) {
        Ok(e) => e,
        Err(why) => {
            rep.note(&format!(
                "Edge rows not run (build with `--features edge`): {}",
                why.replace('\n', " ")
            ));
            return;
        }
    };

    // Completed tasks, and for each the replica the edge sends its polls to.
    let placed = rt.block_on(async {
        let mut placed = Vec::new();
        for _ in 0..TASKS {
            let id = create(c, edge.addr, 1).await;
            let start = Instant::now();
            while status(c, edge.addr, &id).await != "completed"
                && start.elapsed() < Duration::from_secs(30)
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let holder = replica_behind(c, edge.addr, &gws, &id).await;
            placed.push((id, holder));
        }
        placed
    });
    let Some(placed) = placed
        .into_iter()
        .map(|(id, h)| Some((id, h?)))
        .collect::<Option<Vec<(String, usize)>>>()
    else {
        rep.note("Edge rows not run: a task's poll through the edge carried no Taskgate-Replica.");
        return;
    };
    let spread: Vec<usize> = (0..gws.len())
        .map(|r| placed.iter().filter(|(_, h)| *h == r).count())
        .collect();

    let b: HeaderValue = bearer();
    // pingora's floor: a bare pingora proxy in front of the replicas
    // (`bare_pingora.rs`); its rows name the replica the direct row sends each request
    // to.
    let bare = match start_bare_pingora(&work.join("bare"), &addrs) {
        Ok(b) => Some(b),
        Err(why) => {
            rep.note(&format!(
                "Bare pingora rows not run: {}",
                why.replace('\n', " ")
            ));
            None
        }
    };
    // `to(holder)`: where a request for the replica `holder` goes on this path, and the
    // header naming it to the bare proxy.
    let to = |via: Via| -> Readdress {
        let (addrs, edge) = (addrs.clone(), edge.addr);
        let bare = bare.as_ref().map(|(_, a)| *a);
        std::sync::Arc::new(move |holder, mut req| {
            let addr = match (via, bare) {
                (Via::Direct, _) | (Via::Bare, None) => addrs[holder],
                (Via::Bare, Some(bare)) => {
                    req.headers_mut()
                        .insert(UPSTREAM_HEADER, HeaderValue::from(holder));
                    bare
                }
                (Via::Edge, _) => edge,
            };
            let uri = format!("http://{addr}{}", req.uri().path());
            *req.uri_mut() = uri.parse().unwrap();
            req
        })
    };
    let get = |path: Via| -> MakeReq {
        let (b, placed, to, addrs0) = (b.clone(), placed.clone(), to(path), addrs[0]);
        std::sync::Arc::new(move |i| {
            let (id, holder) = &placed[i as usize % placed.len()];
            to(
                *holder,
                gw_req(addrs0, &b, "tasks/get", id, get_body(i, id)),
            )
        })
    };
    let inline = |path: Via| -> MakeReq {
        let (b, to, n, addrs0) = (b.clone(), to(path), addrs.len(), addrs[0]);
        std::sync::Arc::new(move |i| {
            let holder = i as usize % n;
            to(
                holder,
                gw_req(addrs0, &b, "tools/call", "echo", echo_body_2026(i)),
            )
        })
    };
    // One load point: its median run, with the proxy's (the edge's, or the bare
    // proxy's) and the replicas' CPU per request.
    let point = |conc: usize, mk: MakeReq, check: Check, proxies: &[&Proc]| {
        median_run(|| {
            let proxy0: f64 = proxies.iter().map(|p| p.cpu_secs()).sum();
            let reps0: f64 = gws.iter().map(|g| g.proc.cpu_secs()).sum();
            let s = rt.block_on(run_load(c, conc, o.warmup, o.duration, mk.clone(), check));
            let n = (s.ok + s.errors + s.refused).max(1) as f64;
            let proxy: f64 = proxies.iter().map(|p| p.cpu_secs()).sum();
            let reps: f64 = gws.iter().map(|g| g.proc.cpu_secs()).sum();
            (s, ((proxy - proxy0) * 1e6 / n, (reps - reps0) * 1e6 / n))
        })
    };
    let points = [
        (
            "tasks/get (completed task)",
            &get as &dyn Fn(Via) -> MakeReq,
            check_result as Check,
        ),
        ("inline tools/call echo", &inline, check_echo),
    ];
    for (what, make, check) in points {
        for conc in [1, 16] {
            let (direct, (_, d_reps)) = point(conc, make(Via::Direct), check, &[]);
            let bare_row = bare
                .as_ref()
                .map(|(p, _)| point(conc, make(Via::Bare), check, &[p]));
            let (via, (e_cpu, e_reps)) = point(conc, make(Via::Edge), check, &[&edge.proc]);
            let mut rows = vec![("direct", &direct, "–".to_string(), "–".to_string(), d_reps)];
            if let Some((bare, (b_cpu, b_reps))) = &bare_row {
                rows.push((
                    "bare pingora",
                    bare,
                    ms(bare.p50() - direct.p50()),
                    format!("{b_cpu:.0}"),
                    *b_reps,
                ));
            }
            rows.push((
                "edge",
                &via,
                ms(via.p50() - direct.p50()),
                format!("{e_cpu:.0}"),
                e_reps,
            ));
            for (path, s, added, edge_cpu, reps) in rows {
                rep.row(&[
                    format!("{what}, c={conc}"),
                    path.into(),
                    format!("{:.0}", s.rps()),
                    ms(s.p50()),
                    ms(s.p99()),
                    added,
                    edge_cpu,
                    format!("{reps:.0}"),
                    format!("{}{}", s.errors + s.refused, err_note(s)),
                ]);
            }
        }
    }

    match rt.block_on(sse_deltas(c, edge.addr, &gws)) {
        Ok(d) => rep.row(&[
            "SSE `notifications/tasks` completion: edge listen later than direct".into(),
            "edge − direct".into(),
            format!("{SSE_ROUNDS} rounds"),
            ms(d[d.len() / 2] as f64),
            format!("{} (max)", ms(d[d.len() - 1] as f64)),
            ms(d[d.len() / 2] as f64),
            "–".into(),
            "–".into(),
            "0".into(),
        ]),
        Err(why) => rep.note(&format!("SSE row failed: {why}")),
    }
    rep.note(&format!(
        "Edge rows: three replicas on one PostgreSQL schema, `health_interval_ms = 1000`; each load row is the median of 3 runs. `tasks/get` polls {TASKS} completed tasks in turn, each sent to the replica the edge routes it to (spread over r0/r1/r2: {spread:?}), so direct, bare pingora and edge rows do the same work; inline calls round-robin over the replicas directly, through the bare proxies and through the edge. Bare pingora: one pingora proxy that forwards each request to the replica a header names and does nothing else (`benches/load/bare_pingora.rs`), pingora's own floor. CPU is per request: the proxy process, and summed over the replicas. Client, edge, replicas, the HTTP demo upstream and PostgreSQL share 2 cores."
    ));
}
