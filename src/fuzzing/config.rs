//! Configuration parsing and validation (`config::Config::parse`).
//!
//! Properties:
//! - any text is parsed or refused without a panic, and a refusal is a parse error or
//!   names a key (the `[auth]`-only reader used by `taskgate token` too);
//! - a valid configuration built from parts is accepted with exactly those values;
//! - each single fault put into it is refused naming exactly the key at fault (an
//!   unknown key is a parse error that names it).

use super::Bytes;
use crate::config::{AuthOnly, Config, ConfigError, UpstreamTransport};

#[derive(Debug, Clone)]
pub enum Case {
    Raw(String),
    Built { cfg: Built, fault: usize },
}

/// A valid configuration, from parts.
#[derive(Debug, Clone)]
pub struct Built {
    pub port: u16,
    pub auth_none: bool,
    /// Extra secret characters past the 32 required.
    pub secret_extra: u8,
    pub max_body_bytes: u32,
    pub poll_interval_ms: u32,
    /// Added to `poll_interval_ms` for `max_poll_interval_ms`.
    pub poll_spread: u32,
    pub upstreams: Vec<BuiltUpstream>,
}

#[derive(Debug, Clone)]
pub struct BuiltUpstream {
    pub stdio: bool,
    pub max_concurrency: u16,
    /// Added to the 1024 minimum.
    pub max_message_extra: u32,
    pub tool: Option<String>,
}

/// The faults [`Built`] can carry, with the key each must be refused with.
pub const FAULTS: [(&str, &str); 24] = [
    ("", ""),
    ("server.max_body_bytes", "max_body_bytes = 0"),
    ("server.keepalive_ms", "keepalive_ms = 0"),
    ("server.max_connections", "max_connections = 0"),
    ("server.header_timeout_ms", "header_timeout_ms = 0"),
    ("server.idle_timeout_ms", "idle_timeout_ms = 0"),
    ("server.log_format", "log_format = \"xml\""),
    ("server.replica_id", "replica_id = \"../up\""),
    ("server.metrics_listen", "metrics_listen = \"nowhere\""),
    ("store.runtime_dir", "runtime_dir = \"\""),
    ("auth.algorithms", "algorithms = []"),
    ("auth.algorithms", "algorithms = [\"HS512\"]"),
    ("auth.hs256_secret", "hs256_secret = \"short\""),
    ("auth.tenant_claim", "tenant_claim = \"\""),
    ("tasks.ttl_ms", "ttl_ms = 0"),
    ("tasks.poll_interval_ms", "poll_interval_ms = 0"),
    ("tasks.sync_timeout_ms", "sync_timeout_ms = 0"),
    ("upstream", ""),
    ("upstream[L].name", "name = \"u0\""),
    ("upstream[L].path", "path = \"/.well-known/x\""),
    ("upstream[L].max_concurrency", "max_concurrency = 0"),
    ("upstream[L].max_message_bytes", "max_message_bytes = 1023"),
    (
        "upstream[L].headers.bad name",
        "headers = { \"bad name\" = \"v\" }",
    ),
    ("unknown", "surprise = 1"),
];

pub fn fuzz(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.bool() {
        check(&Case::Raw(String::from_utf8_lossy(b.rest()).into_owned()));
        return;
    }
    let fault = b.choose(FAULTS.len());
    let upstreams = (0..=b.choose(3))
        .map(|_| BuiltUpstream {
            stdio: b.bool(),
            max_concurrency: b.u16().max(1),
            max_message_extra: u32::from(b.u16()),
            tool: b.bool().then(|| format!("t{}", b.u8())),
        })
        .collect();
    let cfg = Built {
        port: b.u16(),
        auth_none: b.bool(),
        secret_extra: b.u8(),
        max_body_bytes: u32::from(b.u16()).max(1),
        poll_interval_ms: u32::from(b.u16()).max(1),
        poll_spread: u32::from(b.u16()),
        upstreams,
    };
    check(&Case::Built { cfg, fault });
}

pub fn check(case: &Case) {
    match case {
        Case::Raw(text) => check_raw(text),
        Case::Built { cfg, fault } => check_built(cfg, *fault % FAULTS.len()),
    }
}

fn check_raw(text: &str) {
    match Config::parse(text) {
        Ok(cfg) => {
            // Accepted means valid: it has an upstream and a listen address.
            assert!(!cfg.upstreams.is_empty());
            assert!(cfg.listen_addr().is_ok());
            assert!(cfg.revalidate().is_ok());
        }
        Err(ConfigError::Invalid { key, .. }) => assert!(!key.is_empty()),
        Err(ConfigError::Parse { .. }) => {}
        Err(e @ ConfigError::Read { .. }) => panic!("parsing text read a file: {e}"),
    }
    let _ = toml::from_str::<AuthOnly>(text);
}

/// The text of `cfg`, with the fault at `fault` (an index into [`FAULTS`]) put in.
pub fn render(cfg: &Built, fault: usize) -> String {
    let (key, line) = FAULTS[fault];
    let last = cfg.upstreams.len().saturating_sub(1);
    // A duplicate name needs an upstream before the last; alone, an empty name.
    let line = if key == "upstream[L].name" && last == 0 {
        "name = \"\""
    } else {
        line
    };
    let mut server = vec![
        format!("listen = \"127.0.0.1:{}\"", cfg.port),
        format!("max_body_bytes = {}", cfg.max_body_bytes),
    ];
    let mut store = vec!["path = \"fuzz-data\"".to_string()];
    let mut auth = if cfg.auth_none {
        vec!["mode = \"none\"".to_string()]
    } else {
        vec![format!(
            "hs256_secret = \"{}\"",
            "s".repeat(32 + usize::from(cfg.secret_extra))
        )]
    };
    let mut tasks = vec![
        format!("poll_interval_ms = {}", cfg.poll_interval_ms),
        format!(
            "max_poll_interval_ms = {}",
            u64::from(cfg.poll_interval_ms) + u64::from(cfg.poll_spread)
        ),
    ];
    let mut ups: Vec<Vec<String>> = cfg
        .upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let mut l = vec![format!("name = \"u{i}\""), format!("path = \"/p{i}\"")];
            if u.stdio {
                l.push("command = [\"@self\", \"demo-upstream\"]".into());
            } else {
                l.push(format!("url = \"http://127.0.0.1:{}/mcp\"", 1000 + i));
            }
            l.push(format!("max_concurrency = {}", u.max_concurrency));
            l.push(format!(
                "max_message_bytes = {}",
                1024 + u64::from(u.max_message_extra)
            ));
            l
        })
        .collect();
    let section = key.split(['.', '[']).next().unwrap_or("");
    // Faults replace the line of the same key (TOML refuses a key twice).
    let put = |lines: &mut Vec<String>, line: &str| {
        let name = line.split(' ').next().unwrap_or("");
        lines.retain(|l| l.split(' ').next() != Some(name));
        lines.push(line.to_string());
    };
    match section {
        "server" => put(&mut server, line),
        "store" => put(&mut store, line),
        "auth" if !cfg.auth_none => put(&mut auth, line),
        // With `mode = "none"` the JWT keys are not checked: use JWT for these faults.
        "auth" => {
            auth = vec![line.to_string()];
            if !line.starts_with("hs256_secret") {
                auth.push(format!("hs256_secret = \"{}\"", "s".repeat(40)));
            }
        }
        "tasks" => put(&mut tasks, line),
        "upstream" if key == "upstream" => ups.clear(),
        "upstream" => {
            if let Some(l) = ups.get_mut(last) {
                put(l, line);
            }
        }
        "unknown" => server.push(line.to_string()),
        _ => {}
    }
    let mut out = String::new();
    for (name, lines) in [
        ("server", &server),
        ("store", &store),
        ("auth", &auth),
        ("tasks", &tasks),
    ] {
        out.push_str(&format!("[{name}]\n{}\n\n", lines.join("\n")));
    }
    for (i, l) in ups.iter().enumerate() {
        out.push_str(&format!("[[upstream]]\n{}\n", l.join("\n")));
        if let Some(t) = cfg.upstreams.get(i).and_then(|u| u.tool.as_ref()) {
            out.push_str(&format!("[upstream.tools.{t}]\ntask = \"never\"\n"));
        }
        out.push('\n');
    }
    out
}

fn check_built(cfg: &Built, fault: usize) {
    let text = render(cfg, fault);
    let (key, _) = FAULTS[fault];
    let last = cfg.upstreams.len().saturating_sub(1);
    let key = key.replace("[L]", &format!("[{last}]"));
    // An env override of the secret would hide the secret faults.
    if key.starts_with("auth.hs256") && std::env::var_os("TASKGATE_HS256_SECRET").is_some() {
        return;
    }
    let got = Config::parse(&text);
    match (fault, got) {
        (0, Ok(c)) => {
            assert_eq!(c.server.listen, format!("127.0.0.1:{}", cfg.port));
            assert_eq!(
                c.server.max_body_bytes as u64,
                u64::from(cfg.max_body_bytes)
            );
            assert_eq!(
                c.tasks.poll_interval,
                std::time::Duration::from_millis(u64::from(cfg.poll_interval_ms))
            );
            assert_eq!(c.upstreams.len(), cfg.upstreams.len());
            for (i, (u, b)) in c.upstreams.iter().zip(&cfg.upstreams).enumerate() {
                assert_eq!(u.name, format!("u{i}"));
                assert_eq!(u.path, format!("/p{i}"));
                assert_eq!(
                    matches!(u.transport, UpstreamTransport::Stdio { .. }),
                    b.stdio
                );
                assert_eq!(u.max_concurrency, usize::from(b.max_concurrency));
                assert_eq!(
                    u.max_message_bytes as u64,
                    1024 + u64::from(b.max_message_extra)
                );
                let tools: Vec<&String> = u.tools.keys().collect();
                assert_eq!(tools, b.tool.iter().collect::<Vec<_>>());
            }
        }
        (0, Err(e)) => panic!("refused a valid configuration: {e}\n{text}"),
        (_, Ok(_)) => panic!("accepted a configuration with a bad {key}\n{text}"),
        (_, Err(ConfigError::Parse { message, .. })) => {
            assert_eq!(key, "unknown", "{message}\n{text}");
            assert!(message.contains("surprise"), "{message}");
        }
        (_, Err(ConfigError::Invalid { key: got, problem })) => {
            assert_eq!(got, key, "{problem}\n{text}");
        }
        (_, Err(e)) => panic!("{e}"),
    }
}
