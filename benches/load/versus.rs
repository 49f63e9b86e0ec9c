//! `--only versus`: this build beside another one, in one run.
//!
//! `TASKGATE_BENCH_BASELINE_BIN=/path/to/other/taskgate cargo bench --bench load --
//! --only versus`. Absolute figures on this shared machine move by half between hours
//! (benches/RESULTS.md), so a comparison of two builds only counts when both are
//! measured in the same run, alternately: every round measures each point on one
//! build and then on the other (which goes first alternates too), and a figure is the
//! median over the rounds. Both gateways read stores seeded the same way and call the
//! same demo upstream; the other build must read this build's seeded store (every
//! build since the first schema does).
//!
//! Points: `tasks/get` at c=32 and c=64 (10,000 tasks × 1,000 principals), durable
//! creation at c=64 (`sleep {ms:100}`, promoted at once), an inline `tools/call` echo
//! at c=1 and c=32 (answered inline by the demo upstream), then the largest `--scale`
//! store: RSS after random `tasks/get` at c=32 (as the `scale` scenario measures it).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use super::harness::{
    Stats, check_completed, check_echo, check_task_created, cpu_us_per, run_load,
};
use super::processes::{
    Gateway, gateway_config, start_gateway_bin, taskgate_bin, user_sys_secs_of,
};
use super::report::{Report, ms};
use super::requests::{echo_body_2026, gw_req, seed, token};
use super::scenarios::get_maker;
use super::{HttpClient, META_TASKS, MakeReq, Opts};

/// Rounds of every point; a figure is the median over them
/// (`TASKGATE_BENCH_ROUNDS` for more, on a noisy machine).
const ROUNDS: usize = 5;

fn rounds() -> usize {
    std::env::var("TASKGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(ROUNDS)
}
const GET_TASKS: u64 = 10_000;
const PRINCIPALS: u64 = 1_000;

/// One load point's figures on one build.
#[derive(Clone, Copy)]
struct Sample {
    rps: f64,
    cpu_us: f64,
    p99_us: f64,
    /// Voluntary and involuntary context switches of all the gateway's threads.
    switches: [f64; 2],
    /// The kernel's share of the gateway's CPU time: user-space work against
    /// syscalls, wake-ups and the network stack.
    sys_share: f64,
}

/// Voluntary and involuntary context switches so far, summed over `pid`'s threads.
fn switches(pid: u32) -> [u64; 2] {
    let mut sum = [0, 0];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return sum;
    };
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            let n = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            };
            if line.starts_with("voluntary_ctxt_switches") {
                sum[0] += n(line).unwrap_or(0);
            } else if line.starts_with("nonvoluntary_ctxt_switches") {
                sum[1] += n(line).unwrap_or(0);
            }
        }
    }
    sum
}

/// Runs one point on `gw` and samples it.
fn sample(gw: &Gateway, drain: Duration, point: impl FnOnce() -> Stats) -> Sample {
    let pid = gw.proc.child.id();
    let (cpu0, sw0, us0) = (
        gw.proc.cpu_secs(),
        switches(pid),
        user_sys_secs_of(&pid.to_string()),
    );
    let s = point();
    // The background calls of a creation point finish; their cost belongs to it.
    std::thread::sleep(drain);
    let sw1 = switches(pid);
    let us1 = user_sys_secs_of(&pid.to_string());
    let (user, sys) = (us1[0] - us0[0], us1[1] - us0[1]);
    let n = (s.ok + s.errors + s.refused).max(1) as f64;
    Sample {
        rps: s.rps(),
        cpu_us: cpu_us_per(&gw.proc, cpu0, &s),
        p99_us: s.p99(),
        switches: [(sw1[0] - sw0[0]) as f64 / n, (sw1[1] - sw0[1]) as f64 / n],
        sys_share: sys / (user + sys).max(f64::MIN_POSITIVE),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) fn versus(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
) {
    let Some(other) = std::env::var_os("TASKGATE_BENCH_BASELINE_BIN").map(PathBuf::from) else {
        rep.note("versus not run: set TASKGATE_BENCH_BASELINE_BIN to another build's taskgate.");
        return;
    };
    let this = taskgate_bin();
    let builds = [("this build", this), ("baseline", other)];
    let gateways: Vec<Gateway> = builds
        .iter()
        .enumerate()
        .map(|(i, (_, bin))| {
            let dir = work.join(format!("versus-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            seed(&dir, GET_TASKS, PRINCIPALS, 1000);
            start_gateway_bin(bin, &dir, &gateway_config(&dir.join("data"), up))
        })
        .collect();
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("carol", "acme"))).unwrap();
    let create_maker = |addr: SocketAddr| -> MakeReq {
        let b = bearer.clone();
        Arc::new(move |n| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":100}},{META_TASKS}}}}}"#
            );
            gw_req(addr, &b, "tools/call", "sleep", body)
        })
    };
    let echo_maker = |addr: SocketAddr| -> MakeReq {
        let b = bearer.clone();
        Arc::new(move |n| gw_req(addr, &b, "tools/call", "echo", echo_body_2026(n)))
    };
    // samples[point][build]
    let points = [
        "tasks/get c=32",
        "tasks/get c=64",
        "creation c=64",
        "inline echo c=1",
        "inline echo c=32",
    ];
    let mut samples: Vec<[Vec<Sample>; 2]> = points.iter().map(|_| [vec![], vec![]]).collect();
    let rounds = rounds();
    for round in 0..rounds {
        for k in 0..2 {
            let b = (round + k) % 2;
            let gw = &gateways[b];
            for (p, conc) in [(0, 32usize), (1, 64)] {
                let s = sample(gw, Duration::ZERO, || {
                    rt.block_on(run_load(
                        c,
                        conc,
                        o.warmup,
                        o.duration,
                        get_maker(gw.addr, GET_TASKS, PRINCIPALS),
                        check_completed,
                    ))
                });
                samples[p][b].push(s);
            }
            let s = sample(gw, Duration::from_millis(1500), || {
                rt.block_on(run_load(
                    c,
                    64,
                    o.warmup,
                    o.duration,
                    create_maker(gw.addr),
                    check_task_created,
                ))
            });
            samples[2][b].push(s);
            for (p, conc) in [(3, 1usize), (4, 32)] {
                let s = sample(gw, Duration::ZERO, || {
                    rt.block_on(run_load(
                        c,
                        conc,
                        o.warmup,
                        o.duration,
                        echo_maker(gw.addr),
                        check_echo,
                    ))
                });
                samples[p][b].push(s);
            }
        }
    }
    rep.section(
        &format!(
            "This build beside {} (alternating, median of {rounds} rounds)",
            builds[1].1.display()
        ),
        &[
            "point",
            "build",
            "req/s",
            "p99",
            "gateway CPU µs/req",
            "CPU vs baseline",
            "context switches/req (vol., invol.)",
            "kernel share of CPU",
            "CPU per round",
        ],
    );
    for (p, name) in points.iter().enumerate() {
        let base_cpu = median(samples[p][1].iter().map(|s| s.cpu_us).collect());
        for (b, (label, _)) in builds.iter().enumerate() {
            let v = &samples[p][b];
            let cpu = median(v.iter().map(|s| s.cpu_us).collect());
            rep.row(&[
                name.to_string(),
                label.to_string(),
                format!("{:.0}", median(v.iter().map(|s| s.rps).collect())),
                ms(median(v.iter().map(|s| s.p99_us).collect())),
                format!("{cpu:.0}"),
                format!("{:.2}×", cpu / base_cpu),
                format!(
                    "{:.3}, {:.3}",
                    median(v.iter().map(|s| s.switches[0]).collect()),
                    median(v.iter().map(|s| s.switches[1]).collect())
                ),
                format!(
                    "{:.0} %",
                    100.0 * median(v.iter().map(|s| s.sys_share).collect())
                ),
                v.iter()
                    .map(|s| format!("{:.0}", s.cpu_us))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
        }
    }
    let rss: Vec<u64> = gateways.iter().map(|g| g.proc.rss()).collect();
    rep.note(&format!(
        "Gateway RSS after the rounds: this build {:.0} MB, baseline {:.0} MB.",
        rss[0] as f64 / 1e6,
        rss[1] as f64 / 1e6
    ));
    drop(gateways);
    if let Some(&n) = o.scale.iter().max() {
        versus_scale(rt, o, rep, c, up, work, &builds, n);
    }
}

/// RSS of each build on a store of `n` seeded tasks after random `tasks/get` at c=32.
#[allow(clippy::too_many_arguments)]
fn versus_scale(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
    builds: &[(&str, PathBuf); 2],
    n: u64,
) {
    let dir = work.join("versus-scale");
    std::fs::create_dir_all(&dir).unwrap();
    seed(&dir, n, PRINCIPALS, 10_000);
    let mut rows = Vec::new();
    for (label, bin) in builds {
        let mut gw = start_gateway_bin(bin, &dir, &gateway_config(&dir.join("data"), up));
        let _ = gw
            .proc
            .wait_log("task gauge counted", Duration::from_secs(120));
        let s = rt.block_on(run_load(
            c,
            32,
            o.warmup,
            o.duration,
            get_maker(gw.addr, n, PRINCIPALS),
            check_completed,
        ));
        rows.push(format!(
            "{label} {:.0} MB ({:.0} req/s, {} errors)",
            gw.proc.rss() as f64 / 1e6,
            s.rps(),
            s.errors + s.refused
        ));
        drop(gw);
    }
    let _ = std::fs::remove_dir_all(&dir);
    rep.note(&format!(
        "{n} stored tasks, RSS after {} ms of random tasks/get at c=32, one build after the other on the same store: {}.",
        (o.warmup + o.duration).as_millis(),
        rows.join("; ")
    ));
}
