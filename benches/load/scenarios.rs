//! The scenarios: inline calls, `tasks/get`, durable creation and store scale.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::Full;

use super::harness::{
    RUNS, check_completed, check_echo, check_hello, check_task_created, cpu_us_per, median_run,
    run_load,
};
use super::processes::{
    Gateway, Proc, cpu_secs_of, gateway_config, start_gateway_with, start_hello, start_mcp_proxy,
};
use super::report::{Report, err_note, ms};
use super::requests::{
    dir_size, echo_body_2026, gw_req, legacy_req, legacy_session, owner, post, seed, seeded_id,
    token,
};
use super::{HttpClient, META_TASKS, MakeReq, Opts};

#[allow(clippy::too_many_arguments)]
pub(super) fn inline(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    gw: &Gateway,
    work: &Path,
) {
    let proxy = start_mcp_proxy(&o.mcp_proxy, work, up);
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("alice", "acme"))).unwrap();
    let direct_url = format!("http://{up}/mcp");
    let direct_sid = rt
        .block_on(legacy_session(c, &direct_url, None))
        .expect("demo session");
    // A 2025-era client of the gateway: the same JWT, its own session.
    let gw_url = format!("http://{}/mcp", gw.addr);
    let gw_sid = rt
        .block_on(legacy_session(c, &gw_url, Some(&bearer)))
        .expect("gateway legacy session");
    let proxy_sid = match &proxy {
        Ok((_, addr)) => rt
            .block_on(legacy_session(c, &format!("http://{addr}/"), None))
            .map_err(|e| format!("session failed: {e}")),
        Err(e) => Err(e.clone()),
    };
    rep.section(
        "Inline overhead: tools/call echo (demo upstream over HTTP)",
        &[
            "path",
            "c",
            "req/s",
            "p50",
            "p99",
            "added p50",
            "added p99",
            "throughput vs direct",
            "errors",
        ],
    );
    for conc in [1usize, 32] {
        let url = direct_url.clone();
        let sid = direct_sid.clone();
        let direct: MakeReq = Arc::new(move |n| {
            legacy_req(
                &url,
                &sid,
                None,
                format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}}}}}}"#
                ),
            )
        });
        let d = rt.block_on(run_load(c, conc, o.warmup, o.duration, direct, check_echo));
        let mut rows = vec![(
            "direct (legacy, session)".to_string(),
            Some(d.clone()),
            None,
        )];
        let addr = gw.addr;
        let b = bearer.clone();
        let via: MakeReq =
            Arc::new(move |n| gw_req(addr, &b, "tools/call", "echo", echo_body_2026(n)));
        let t = rt.block_on(run_load(c, conc, o.warmup, o.duration, via, check_echo));
        rows.push(("taskgate (2026-07-28 + JWT)".into(), Some(t), None));
        let (url, sid, b) = (gw_url.clone(), gw_sid.clone(), bearer.clone());
        let legacy: MakeReq = Arc::new(move |n| {
            legacy_req(
                &url,
                &sid,
                Some(&b),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}}}}}}"#
                ),
            )
        });
        let l = rt.block_on(run_load(c, conc, o.warmup, o.duration, legacy, check_echo));
        rows.push(("taskgate (2025-era session + JWT)".into(), Some(l), None));
        match (&proxy, &proxy_sid) {
            (Ok((_, paddr)), Ok(psid)) => {
                let url = format!("http://{paddr}/");
                let sid = psid.clone();
                let mk: MakeReq = Arc::new(move |n| {
                    legacy_req(
                        &url,
                        &sid,
                        None,
                        format!(
                            r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"ev/echo","arguments":{{"text":"hello"}}}}}}"#
                        ),
                    )
                });
                let p = rt.block_on(run_load(c, conc, o.warmup, o.duration, mk, check_echo));
                rows.push(("mcp-proxy 0.6.0 (legacy, session)".into(), Some(p), None));
            }
            (Err(e), _) | (_, Err(e)) => {
                rows.push(("mcp-proxy 0.6.0".into(), None, Some(e.clone())));
            }
        }
        for (name, s, why) in rows {
            match s {
                Some(s) => {
                    let is_direct = name.starts_with("direct");
                    let (ap50, ap99, ratio) = if is_direct {
                        ("–".into(), "–".into(), "1.00×".into())
                    } else {
                        (
                            ms(s.p50() - d.p50()),
                            ms(s.p99() - d.p99()),
                            format!("{:.2}×", s.rps() / d.rps()),
                        )
                    };
                    rep.row(&[
                        name,
                        conc.to_string(),
                        format!("{:.0}", s.rps()),
                        ms(s.p50()),
                        ms(s.p99()),
                        ap50,
                        ap99,
                        ratio,
                        format!("{}{}", s.errors + s.refused, err_note(&s)),
                    ]);
                }
                None => rep.row(&[
                    name,
                    conc.to_string(),
                    why.unwrap_or_default()
                        .replace('\n', " ")
                        .chars()
                        .take(200)
                        .collect(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                ]),
            }
        }
    }
}

/// Requests for `tasks/get` spread over `n` seeded tasks and their owners.
pub(super) fn get_maker(addr: SocketAddr, n: u64, principals: u64) -> MakeReq {
    let bearers: Arc<Vec<HeaderValue>> = Arc::new(
        (0..principals)
            .map(|p| {
                let (t, s) = owner(p, principals);
                HeaderValue::from_str(&format!("Bearer {}", token(&s, &t))).unwrap()
            })
            .collect(),
    );
    Arc::new(move |seq| {
        // A cheap scramble so consecutive requests hit unrelated tasks.
        let i = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % n;
        let id = seeded_id(i);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{seq},"method":"tasks/get","params":{{"taskId":"{id}",{META_TASKS}}}}}"#
        );
        gw_req(
            addr,
            &bearers[(i % principals) as usize],
            "tasks/get",
            &id,
            body,
        )
    })
}

pub(super) fn tasks_get(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
    n: u64,
    principals: u64,
) -> f64 {
    let (hello_p, haddr) = start_hello();
    rep.section(
        &format!(
            "tasks/get throughput ({n} tasks × {principals} principals, JWT HS256) vs bare hyper ceiling"
        ),
        &[
            "target",
            "c",
            "req/s",
            "p50",
            "p99",
            "vs hello",
            "server CPU µs/req",
            "errors",
        ],
    );
    let mut p99_c32 = f64::NAN;
    for conc in [32usize, 64] {
        let url = format!("http://{haddr}/");
        let hello: MakeReq = Arc::new(move |_| {
            post(&url)
                .body(Full::new(Bytes::from_static(
                    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}",
                )))
                .unwrap()
        });
        let (h, hcpu) = median_run(|| {
            let cpu0 = hello_p.cpu_secs();
            let h = rt.block_on(run_load(
                c,
                conc,
                o.warmup,
                o.duration,
                hello.clone(),
                check_hello,
            ));
            let cpu = cpu_us_per(&hello_p, cpu0, &h);
            (h, cpu)
        });
        let (g, gcpu) = median_run(|| {
            let cpu0 = gw.proc.cpu_secs();
            let g = rt.block_on(run_load(
                c,
                conc,
                o.warmup,
                o.duration,
                get_maker(gw.addr, n, principals),
                check_completed,
            ));
            let cpu = cpu_us_per(&gw.proc, cpu0, &g);
            (g, cpu)
        });
        if conc == 32 {
            p99_c32 = g.p99();
        }
        rep.row(&[
            "bare hyper hello".into(),
            conc.to_string(),
            format!("{:.0}", h.rps()),
            ms(h.p50()),
            ms(h.p99()),
            "1.00×".into(),
            format!("{hcpu:.0}"),
            format!("{}{}", h.errors, err_note(&h)),
        ]);
        rep.row(&[
            "taskgate tasks/get".into(),
            conc.to_string(),
            format!("{:.0}", g.rps()),
            ms(g.p50()),
            ms(g.p99()),
            format!("{:.2}×", g.rps() / h.rps()),
            format!("{gcpu:.0}"),
            format!("{}{}", g.errors + g.refused, err_note(&g)),
        ]);
    }
    rep.note("Server CPU µs/req: user+sys CPU of the server process over the whole point (warm-up included) / measured requests, so it reads slightly high.");
    rep.note(&format!(
        "Each row is the median run (by req/s) of {RUNS} runs of that point; per concurrency, the hello runs come first, then the tasks/get runs."
    ));
    p99_c32
}

pub(super) fn durable_create(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    gw: &Gateway,
    demo: &Proc,
) {
    rep.section(
        "Durable task creation: tools/call sleep {ms:100}, promote_after_ms = 0",
        &[
            "c",
            "promotions/s",
            "p50",
            "p99",
            "refused",
            "other errors",
            "gateway CPU µs/task",
            "upstream CPU µs/task",
            "load client CPU µs/task",
            "gateway RSS after",
        ],
    );
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token("carol", "acme"))).unwrap();
    for conc in [1usize, 16, 64] {
        let addr = gw.addr;
        let b = bearer.clone();
        let mk: MakeReq = Arc::new(move |n| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":100}},{META_TASKS}}}}}"#
            );
            gw_req(addr, &b, "tools/call", "sleep", body)
        });
        let (s, (gcpu, dcpu, ccpu)) = median_run(|| {
            let (g0, d0, c0) = (gw.proc.cpu_secs(), demo.cpu_secs(), cpu_secs_of("self"));
            let s = rt.block_on(run_load(
                c,
                conc,
                o.warmup,
                o.duration,
                mk.clone(),
                check_task_created,
            ));
            // The background calls (100 ms each) finish; their cost belongs to the point.
            std::thread::sleep(Duration::from_millis(1500));
            let client =
                (cpu_secs_of("self") - c0) * 1e6 / (s.ok + s.errors + s.refused).max(1) as f64;
            let cpu = (
                format!("{:.0}", cpu_us_per(&gw.proc, g0, &s)),
                format!("{:.0}", cpu_us_per(demo, d0, &s)),
                format!("{client:.0}"),
            );
            (s, cpu)
        });
        rep.row(&[
            conc.to_string(),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            s.refused.to_string(),
            format!("{}{}", s.errors, err_note(&s)),
            gcpu,
            dcpu,
            ccpu,
            format!("{:.0} MB", gw.proc.rss() as f64 / 1e6),
        ]);
    }
    rep.note(&format!(
        "Each row is the median run (by promotions/s) of {RUNS} runs; CPU columns: process user+sys CPU over the run plus the 1.5 s drain of its background calls, per task."
    ));
}

#[allow(clippy::too_many_arguments)]
pub(super) fn scale(
    rt: &tokio::runtime::Runtime,
    o: &Opts,
    rep: &mut Report,
    c: &HttpClient,
    up: SocketAddr,
    work: &Path,
    baseline_p99: f64,
) {
    rep.section(
        "Scale: seeded stores (completed tasks, 1000 principals), tasks/get c=32 with JWT",
        &[
            "stored tasks",
            "seed time",
            "on disk",
            "start-up",
            "RSS after start",
            "background count",
            "RSS after count",
            "tasks/get req/s",
            "p50",
            "p99",
            "p99 vs 10k store",
            "RSS after load",
            "errors",
        ],
    );
    let mut admin_rows = Vec::new();
    for &n in &o.scale {
        let dir = work.join(format!("scale-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let seed_t = seed(&dir, n, 1000, 10_000);
        let disk = dir_size(&dir.join("data"));
        // With the operations listener, for the operator API's list below.
        let ops = super::fixtures::free_port();
        let config = gateway_config(&dir.join("data"), up).replacen(
            "[server]\n",
            &format!("[server]\nmetrics_listen = \"127.0.0.1:{ops}\"\n"),
            1,
        );
        let mut gw = start_gateway_with(&dir, &config);
        std::thread::sleep(Duration::from_millis(300));
        let rss0 = gw.proc.rss();
        // The `taskgate_tasks` gauge is counted from the store in the background after
        // start-up (one pass over every record); measure tasks/get once that is done.
        let counted = match gw
            .proc
            .wait_log("task gauge counted", Duration::from_secs(120))
        {
            Some(_) => format!("{:.2} s", gw.spawned.elapsed().as_secs_f64()),
            None => "not seen in 120 s".into(),
        };
        let rss_counted = gw.proc.rss();
        let s = rt.block_on(run_load(
            c,
            32,
            o.warmup,
            o.duration,
            get_maker(gw.addr, n, 1000),
            check_completed,
        ));
        let rss1 = gw.proc.rss();
        admin_rows.push((n, rt.block_on(admin_list(c, ops))));
        rep.row(&[
            n.to_string(),
            format!("{:.1} s", seed_t.as_secs_f64()),
            format!("{:.0} MB", disk as f64 / 1e6),
            format!("{:.2} s", gw.startup.as_secs_f64()),
            format!("{:.0} MB", rss0 as f64 / 1e6),
            counted,
            format!("{:.0} MB", rss_counted as f64 / 1e6),
            format!("{:.0}", s.rps()),
            ms(s.p50()),
            ms(s.p99()),
            format!("{:.2}×", s.p99() / baseline_p99),
            format!("{:.0} MB", rss1 as f64 / 1e6),
            format!("{}{}", s.errors + s.refused, err_note(&s)),
        ]);
        drop(gw);
        let _ = std::fs::remove_dir_all(&dir);
    }
    rep.section(
        "Operator API: GET /admin/tasks?tenant=…&limit=50 on the seeded stores (sequential)",
        &[
            "stored tasks",
            "filter",
            "requests",
            "p50",
            "p99",
            "tasks per page",
        ],
    );
    for (n, rows) in admin_rows {
        for (filter, lat, page) in rows {
            rep.row(&[
                n.to_string(),
                filter.to_string(),
                lat.len().to_string(),
                ms(pct(&lat, 0.5)),
                ms(pct(&lat, 0.99)),
                page.to_string(),
            ]);
        }
    }
    rep.note(
        "Each tenant holds a tenth of the store; a page walks the (tenant, status, created) \
         index, so its cost does not grow with the store.",
    );
}

fn pct(sorted_us: &[f64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    sorted_us[((sorted_us.len() - 1) as f64 * p).round() as usize]
}

/// Latencies (µs, sorted) of 200 sequential admin list requests per filter, and the
/// page size of the last answer.
async fn admin_list(c: &HttpClient, ops: u16) -> Vec<(&'static str, Vec<f64>, usize)> {
    use http_body_util::BodyExt;
    let mut claims = super::JWT.claims("ops", "ops", 7200);
    claims["scope"] = serde_json::json!("taskgate:admin");
    let bearer = format!("Bearer {}", super::JWT.sign(&claims));
    let mut out = Vec::new();
    for (filter, query) in [
        ("tenant", "tenant=tenant-3&limit=50"),
        (
            "tenant + status",
            "tenant=tenant-3&status=completed&limit=50",
        ),
    ] {
        let mut lat = Vec::new();
        let mut page = 0;
        for _ in 0..200 {
            let req = http::Request::get(format!("http://127.0.0.1:{ops}/admin/tasks?{query}"))
                .header("authorization", &bearer)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let t = Instant::now();
            let Ok(resp) = c.request(req).await else {
                continue;
            };
            let ok = resp.status().is_success();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            if ok && let Ok(b) = body {
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
                page = v["tasks"].as_array().map_or(0, Vec::len);
            }
        }
        lat.sort_by(f64::total_cmp);
        out.push((filter, lat, page));
    }
    out
}
