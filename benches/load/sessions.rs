//! 2025-era sessions held at their cap (docs/design.md §22 "Clients of the 2025 era"):
//! how much gateway memory a session costs, and what opening one more at the cap
//! (which evicts the least recently seen idle session) takes.

use std::time::Instant;

use http::HeaderValue;

use super::processes::Gateway;
use super::report::{Report, ms};
use super::requests::{legacy_session, token};
use super::{HttpClient, Opts};

/// Principals, each filled to the default cap of 100 sessions.
const PRINCIPALS: usize = 100;
const CAP: usize = 100;

pub(super) fn sessions(
    rt: &tokio::runtime::Runtime,
    _o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
) {
    let url = format!("http://{}/mcp", gw.addr);
    let bearers: Vec<HeaderValue> = (0..PRINCIPALS)
        .map(|p| {
            HeaderValue::from_str(&format!("Bearer {}", token(&format!("s{p}"), "sessions")))
                .unwrap()
        })
        .collect();
    let rss0 = gw.proc.rss();
    let t0 = Instant::now();
    let mut opened = 0usize;
    let mut failed = 0usize;
    rt.block_on(async {
        for b in &bearers {
            for _ in 0..CAP {
                match legacy_session(c, &url, Some(b)).await {
                    Ok(_) => opened += 1,
                    Err(_) => failed += 1,
                }
            }
        }
    });
    let fill = t0.elapsed();
    let rss1 = gw.proc.rss();
    // At the cap: each further initialize closes the least recently seen session.
    let mut at_cap = Vec::new();
    rt.block_on(async {
        for _ in 0..50 {
            let t = Instant::now();
            if legacy_session(c, &url, Some(&bearers[0])).await.is_ok() {
                at_cap.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    });
    at_cap.sort_by(f64::total_cmp);
    let p50 = at_cap.get(at_cap.len() / 2).copied().unwrap_or(f64::NAN);
    rep.section(
        "2025-era sessions at the cap (initialize + notifications/initialized, c=1)",
        &[
            "sessions",
            "open time per session",
            "gateway RSS added",
            "per session",
            "initialize at the cap (evicts), p50",
            "failed",
        ],
    );
    let added = rss1.saturating_sub(rss0) as f64;
    rep.row(&[
        format!("{opened} ({PRINCIPALS} principals × {CAP})"),
        ms(fill.as_secs_f64() * 1e6 / opened.max(1) as f64),
        format!("{:.1} MB", added / 1e6),
        format!("{:.1} KB", added / 1e3 / opened.max(1) as f64),
        ms(p50),
        failed.to_string(),
    ]);
}
