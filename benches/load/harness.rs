//! The load loop: response checks, per-point stats, bounded runs, the HTTP client.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;

use super::processes::Proc;
use super::{HttpClient, MAX_REQUESTS, MakeReq};

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Outcome {
    Ok,
    Refused,
    Error,
}

pub(super) type Check = fn(StatusCode, &[u8]) -> Outcome;

pub(super) fn contains(h: &[u8], n: &[u8]) -> bool {
    h.windows(n.len()).any(|w| w == n)
}

pub(super) fn check_result(st: StatusCode, body: &[u8]) -> Outcome {
    if st == StatusCode::TOO_MANY_REQUESTS || st == StatusCode::SERVICE_UNAVAILABLE {
        Outcome::Refused
    } else if st == StatusCode::OK && contains(body, b"\"result\"") {
        Outcome::Ok
    } else {
        Outcome::Error
    }
}

/// A `tools/call echo` answer that carries the echoed text.
pub(super) fn check_echo(st: StatusCode, body: &[u8]) -> Outcome {
    match check_result(st, body) {
        Outcome::Ok if !contains(body, b"hello") => Outcome::Error,
        o => o,
    }
}

/// A `tasks/get` answer for one of the seeded (completed) tasks.
pub(super) fn check_completed(st: StatusCode, body: &[u8]) -> Outcome {
    match check_result(st, body) {
        Outcome::Ok if !contains(body, b"\"status\":\"completed\"") => Outcome::Error,
        o => o,
    }
}

pub(super) fn check_hello(st: StatusCode, _: &[u8]) -> Outcome {
    if st == StatusCode::OK {
        Outcome::Ok
    } else {
        Outcome::Error
    }
}

pub(super) fn check_task_created(st: StatusCode, body: &[u8]) -> Outcome {
    match check_result(st, body) {
        Outcome::Ok if contains(body, b"\"resultType\":\"task\"") => Outcome::Ok,
        Outcome::Ok => Outcome::Error,
        o if contains(body, b"\"error\"") && st.is_client_error() => {
            let _ = o;
            Outcome::Refused
        }
        o => o,
    }
}

#[derive(Default, Clone)]
pub(super) struct Stats {
    pub(super) ok: u64,
    pub(super) refused: u64,
    pub(super) errors: u64,
    pub(super) secs: f64,
    pub(super) lat_us: Vec<u32>,
    pub(super) first_error: Option<String>,
    /// Every request sent, the warm-up's included (what a process's CPU or statement
    /// count over the whole load covers).
    pub(super) sent: u64,
}

impl Stats {
    pub(super) fn rps(&self) -> f64 {
        self.ok as f64 / self.secs.max(1e-9)
    }
    pub(super) fn pct(&self, p: f64) -> f64 {
        if self.lat_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.lat_us.len() as f64 - 1.0) * p).round() as usize;
        self.lat_us[i] as f64
    }
    pub(super) fn p50(&self) -> f64 {
        self.pct(0.50)
    }
    pub(super) fn p99(&self) -> f64 {
        self.pct(0.99)
    }
}

/// CPU µs per answered request: the process's user+sys CPU since `cpu0` over the
/// requests of `s` (any outcome).
pub(super) fn cpu_us_per(proc: &Proc, cpu0: f64, s: &Stats) -> f64 {
    (proc.cpu_secs() - cpu0) * 1e6 / (s.ok + s.errors + s.refused).max(1) as f64
}

/// Runs of each contested point (tasks/get, creation): the machine is shared and
/// noisy, so a row is the median run (by requests/s) of this many.
pub(super) const RUNS: usize = 3;

/// The median run, by requests/s, of `RUNS` runs of `point` (which returns the run's
/// stats and whatever else its row reports, e.g. CPU per request).
pub(super) fn median_run<X>(mut point: impl FnMut() -> (Stats, X)) -> (Stats, X) {
    let mut runs: Vec<(Stats, X)> = (0..RUNS).map(|_| point()).collect();
    runs.sort_by(|a, b| a.0.rps().total_cmp(&b.0.rps()));
    runs.swap_remove(RUNS / 2)
}

pub(super) async fn run_load<C>(
    client: &Client<C, Full<Bytes>>,
    conc: usize,
    warmup: Duration,
    dur: Duration,
    make: MakeReq,
    check: Check,
) -> Stats
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let seq = Arc::new(AtomicU64::new(1));
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + dur;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conc {
        let client = client.clone();
        let make = make.clone();
        let seq = seq.clone();
        set.spawn(async move {
            let mut s = Stats::default();
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let n = seq.fetch_add(1, Ordering::Relaxed);
                if n > MAX_REQUESTS {
                    break;
                }
                let req = make(n);
                let t0 = Instant::now();
                let res = match client.request(req).await {
                    Ok(resp) => {
                        let st = resp.status();
                        match resp.into_body().collect().await {
                            Ok(b) => {
                                let b = b.to_bytes();
                                let o = check(st, &b);
                                if o != Outcome::Ok && s.first_error.is_none() {
                                    s.first_error = Some(format!(
                                        "{st}: {}",
                                        String::from_utf8_lossy(&b[..b.len().min(300)])
                                    ));
                                }
                                o
                            }
                            Err(e) => {
                                s.first_error.get_or_insert(e.to_string());
                                Outcome::Error
                            }
                        }
                    }
                    Err(e) => {
                        s.first_error.get_or_insert(e.to_string());
                        Outcome::Error
                    }
                };
                let el = t0.elapsed();
                if t0 < measure_from {
                    continue;
                }
                match res {
                    Outcome::Ok => {
                        s.ok += 1;
                        s.lat_us.push(el.as_micros().min(u32::MAX as u128) as u32);
                    }
                    Outcome::Refused => s.refused += 1,
                    Outcome::Error => s.errors += 1,
                }
            }
            s
        });
    }
    let mut all = Stats::default();
    while let Some(r) = set.join_next().await {
        let s = r.unwrap();
        all.ok += s.ok;
        all.refused += s.refused;
        all.errors += s.errors;
        all.lat_us.extend(s.lat_us);
        if all.first_error.is_none() {
            all.first_error = s.first_error;
        }
    }
    // Each request drew one number (from 1); a draw past the cap sent nothing.
    all.sent = (seq.load(Ordering::Relaxed) - 1).min(MAX_REQUESTS);
    all.secs = (Instant::now().min(end) - measure_from)
        .as_secs_f64()
        .max(1e-9);
    // Workers stop at `end`, but the last requests may finish after it.
    all.secs = all.secs.max(dur.as_secs_f64());
    all.lat_us.sort_unstable();
    all
}

pub(super) fn client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}
