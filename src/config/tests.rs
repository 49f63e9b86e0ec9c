use std::time::Duration;

use super::server::{MAX_REPLICA_ID, is_replica_id, sanitize_replica_id};
use super::*;

const MIN: &str = r#"
[auth]
mode = "none"
[[upstream]]
name = "demo"
command = ["@self", "demo-upstream"]
"#;

const EDGE: &str = "[edge]\nlisten = \"127.0.0.1:8000\"\nreplicas = [\"http://127.0.0.1:8081\", \"http://localhost:8082/\"]\n";

#[test]
fn no_upstream_on_an_operational_path() {
    for path in OPERATIONAL_PATHS {
        let text = MIN.replace(
            "name = \"demo\"",
            &format!("name = \"demo\"\npath = \"{path}\""),
        );
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains("operational endpoint"), "{path}: {err}");
    }
}

#[test]
fn edge_table_gets_defaults_and_parses_replicas() {
    let e = EdgeConfig::parse(EDGE).unwrap();
    assert_eq!(e.health_interval, Duration::from_millis(1000));
    assert_eq!(e.grace_period_s, 30);
    assert_eq!(e.max_connections, 10_000);
    assert_eq!(e.log_format, LogFormat::Text);
    let urls = e.replica_urls().unwrap();
    assert_eq!(urls[0].authority(), "127.0.0.1:8081");
    assert_eq!(
        urls[1],
        ReplicaUrl {
            host: "localhost".into(),
            port: 8082,
            tls: false,
        }
    );
    // Other tables are a replica's business; the edge ignores them.
    let both = format!("{MIN}{EDGE}");
    assert!(EdgeConfig::parse(&both).is_ok());
    // And a replica accepts (and checks) an [edge] table.
    assert!(Config::parse(&both).unwrap().edge.is_some());
}

#[test]
fn edge_errors_name_the_key() {
    let err = |text: &str| EdgeConfig::parse(text).unwrap_err().to_string();
    assert!(
        err("[server]\n").contains("`edge`"),
        "{}",
        err("[server]\n")
    );
    assert!(err("[edge]\nreplicas = [\"http://a:1\"]\n").contains("edge.listen"));
    assert!(err("[edge]\nlisten = \"127.0.0.1:1\"\n").contains("edge.replicas"));
    let port_0 = err("[edge]\nlisten = \"127.0.0.1:0\"\nreplicas = [\"http://a:1\"]\n");
    assert!(
        port_0.contains("edge.listen") && port_0.contains("fixed port"),
        "{port_0}"
    );
    for bad in [
        "https://a:1",
        "http://a",
        "http://a:1/mcp",
        "http://:1",
        "http://a:0",
        "a:1",
        "http://u@a:1",
    ] {
        let text =
            format!("[edge]\nlisten = \"127.0.0.1:1\"\nreplicas = [\"http://b:2\", \"{bad}\"]\n");
        assert!(
            err(&text).contains("edge.replicas[1]"),
            "{bad}: {}",
            err(&text)
        );
    }
    let dup = "[edge]\nlisten = \"127.0.0.1:1\"\nreplicas = [\"http://b:2\", \"http://b:2/\"]\n";
    assert!(err(dup).contains("listed twice"), "{}", err(dup));
    assert!(err(&format!("{EDGE}health_interval_ms = 0\n")).contains("edge.health_interval_ms"));
    assert!(err(&format!("{EDGE}max_connections = 0\n")).contains("edge.max_connections"));
    assert!(err(&format!("{EDGE}log_format = \"xml\"\n")).contains("edge.log_format"));
    assert!(err(&format!("{EDGE}pid_file = \"\"\n")).contains("edge.pid_file"));
    assert!(err(&format!("{EDGE}bogus = 1\n")).contains("bogus"));
    assert!(ReplicaUrl::parse("http://[::1]:9/").unwrap().authority() == "[::1]:9");
}

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::parse(MIN).unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:8080");
    assert_eq!(c.tasks.promote_after, Duration::from_millis(1000));
    assert_eq!(c.upstreams[0].path, "/mcp");
    assert_eq!(c.upstreams[0].stdio_processes(), 16);
    assert_eq!(c.upstreams[0].stdio_spares(), 1);
}

#[test]
fn stdio_spares_are_counted_within_the_pool() {
    let parse = |extra: &str| {
        Config::parse(&format!(
            "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"d\"\ncommand = [\"x\"]\n{extra}"
        ))
    };
    let one = parse("stdio_processes = 1\nstdio_spares = 1\n").unwrap();
    assert_eq!(
        one.upstreams[0].stdio_spares(),
        0,
        "a one-child pool has no spare"
    );
    let two = parse("stdio_processes = 4\nstdio_spares = 2\n").unwrap();
    assert_eq!(two.upstreams[0].stdio_spares(), 2);
    let err = parse("stdio_processes = 2\nstdio_spares = 3\n").unwrap_err();
    assert!(err.to_string().contains("stdio_spares"), "{err}");
}

#[test]
fn unknown_key_is_named() {
    let err = Config::parse("[server]\nlisten_addr = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("listen_addr"), "{err}");
}

#[test]
fn auth_none_refused_off_loopback() {
    let text = MIN.replace("[auth]", "[server]\nlisten = \"0.0.0.0:8080\"\n[auth]");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.to_string().contains("auth.mode"), "{err}");
}

#[test]
fn upstream_needs_command_or_url() {
    let err = Config::parse("[auth]\nmode=\"none\"\n[[upstream]]\nname=\"x\"\n").unwrap_err();
    assert!(err.to_string().contains("upstream[0].command"), "{err}");
}

#[test]
fn hs256_needs_secret() {
    let err =
        Config::parse("[[upstream]]\nname=\"x\"\nurl=\"http://127.0.0.1:1/mcp\"\n").unwrap_err();
    assert!(err.to_string().contains("auth.hs256_secret"), "{err}");
}

#[test]
fn replica_id_and_runtime_dir_defaults() {
    let c = Config::parse(MIN).unwrap();
    assert_eq!(c.store.runtime_dir(), PathBuf::from("data/run"));
    let id = c.replica_id();
    assert!(id.ends_with("-8080"), "{id}");
    assert!(is_replica_id(&id), "{id}");
    assert_eq!(c.replica_run_dir(), PathBuf::from("data/run").join(&id));

    let text = MIN.replace(
        "[auth]",
        "[server]\nreplica_id = \"gw-a.1\"\n[store]\npath = \"s\"\nruntime_dir = \"/tmp/r\"\n[auth]",
    );
    let c = Config::parse(&text).unwrap();
    assert_eq!(c.replica_id(), "gw-a.1");
    assert_eq!(c.replica_run_dir(), PathBuf::from("/tmp/r/gw-a.1"));
}

#[test]
fn bad_replica_id_is_refused() {
    for bad in ["", "..", ".hidden", "a/b", "a b", "ü"] {
        let text = MIN.replace("[auth]", &format!("[server]\nreplica_id = {bad:?}\n[auth]"));
        let err = Config::parse(&text).unwrap_err();
        assert!(
            err.to_string().contains("server.replica_id"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn default_replica_id_is_sanitised() {
    assert_eq!(sanitize_replica_id("host/x y-8080"), "host_x_y-8080");
    assert_eq!(sanitize_replica_id("..-0"), "-0");
    assert_eq!(sanitize_replica_id("..."), "taskgate");
    assert_eq!(sanitize_replica_id(&"h".repeat(300)).len(), MAX_REPLICA_ID);
    assert!(is_replica_id(&sanitize_replica_id("hôst:name-1")));
}

#[test]
fn env_interpolation() {
    // SAFETY: test-only, single-threaded use of a unique variable name.
    unsafe { std::env::set_var("TG_TEST_TOKEN_X", "abc") };
    assert_eq!(
        interpolate_env("Bearer ${TG_TEST_TOKEN_X}").unwrap(),
        "Bearer abc"
    );
    assert!(interpolate_env("${TG_TEST_NOPE_NOPE}").is_err());
}

#[test]
fn store_backend_keys() {
    let c = Config::parse(MIN).unwrap();
    assert_eq!(c.store.backend, StoreBackend::Sled);
    let pg = |keys: &str| MIN.replace("[auth]", &format!("[store]\n{keys}\n[auth]"));
    let c = Config::parse(&pg("backend = \"postgres\"\nurl = \"postgres://u@h/db\"")).unwrap();
    assert_eq!(c.store.backend, StoreBackend::Postgres);
    assert_eq!(
        (c.store.pool_size, c.store.schema.as_str()),
        (16, "taskgate")
    );
    assert_eq!(c.store.postgres_url().unwrap(), "postgres://u@h/db");
    // SAFETY: test-only, single-threaded use of a unique variable name.
    unsafe { std::env::set_var("TG_TEST_PG_URL_X", "postgres://e@h/db") };
    let c = Config::parse(&pg(
        "backend = \"postgres\"\nurl_env = \"TG_TEST_PG_URL_X\"",
    ))
    .unwrap();
    assert_eq!(c.store.postgres_url().unwrap(), "postgres://e@h/db");
    for (keys, named) in [
        ("backend = \"postgres\"", "store.url"),
        (
            "backend = \"postgres\"\nurl = \"x\"\nurl_env = \"Y\"",
            "store.url",
        ),
        (
            "backend = \"postgres\"\nurl = \"x\"\npool_size = 0",
            "store.pool_size",
        ),
        (
            "backend = \"postgres\"\nurl = \"x\"\nschema = \"Bad-Name\"",
            "store.schema",
        ),
        (
            "backend = \"postgres\"\nurl = \"x\"\nschema = \"pg_x\"",
            "store.schema",
        ),
    ] {
        let err = Config::parse(&pg(keys)).unwrap_err();
        assert!(err.to_string().contains(named), "{keys}: {err}");
    }
    assert!(Config::parse(&pg("backend = \"mysql\"")).is_err());
    // Behind a transaction-mode pooler (docs/design.md §27 "Connection poolers").
    assert_eq!(c.store.pooler, StorePooler::None);
    let c = Config::parse(&pg(
        "backend = \"postgres\"\nurl = \"x\"\npooler = \"transaction\"",
    ))
    .unwrap();
    assert_eq!(c.store.pooler, StorePooler::Transaction);
    assert!(
        Config::parse(&pg(
            "backend = \"postgres\"\nurl = \"x\"\npooler = \"session\""
        ))
        .is_err()
    );
}

#[test]
fn millisecond_keys_are_durations() {
    let text = MIN.replace(
        "[auth]",
        "[server]\nkeepalive_ms = 250\n[tasks]\nsync_timeout_ms = 1500\n[auth]",
    ) + "call_timeout_ms = 700\n[upstream.tools.t]\npromote_after_ms = 0\n";
    let c = Config::parse(&text).unwrap();
    assert_eq!(c.server.keepalive, Duration::from_millis(250));
    assert_eq!(c.tasks.sync_timeout, Duration::from_millis(1500));
    assert_eq!(
        c.upstreams[0].call_timeout,
        Some(Duration::from_millis(700))
    );
    assert_eq!(c.upstreams[0].promote_after, None);
    assert_eq!(
        c.upstreams[0].tools["t"].promote_after,
        Some(Duration::ZERO)
    );
    assert_eq!(as_millis(c.tasks.poll_interval), 1000);
    let negative = MIN.replace("[auth]", "[server]\nkeepalive_ms = -1\n[auth]");
    assert!(matches!(
        Config::parse(&negative),
        Err(ConfigError::Parse { .. })
    ));
}

#[test]
fn log_format_is_an_enum_and_unknown_values_name_the_key() {
    assert_eq!(
        Config::parse(MIN).unwrap().server.log_format,
        LogFormat::Text
    );
    let json = MIN.replace("[auth]", "[server]\nlog_format = \"json\"\n[auth]");
    assert_eq!(
        Config::parse(&json).unwrap().server.log_format,
        LogFormat::Json
    );
    let xml = MIN.replace("[auth]", "[server]\nlog_format = \"xml\"\n[auth]");
    let err = Config::parse(&xml).unwrap_err().to_string();
    assert_eq!(
        err,
        "config key `server.log_format`: must be \"text\" or \"json\""
    );
}

#[test]
fn upstream_transport_is_built_at_load() {
    let c = Config::parse(MIN).unwrap();
    match &c.upstreams[0].transport {
        UpstreamTransport::Stdio { program, args } => {
            assert_ne!(program, "@self", "resolved to the running executable");
            assert_eq!(args, &["demo-upstream"]);
        }
        other => panic!("{other:?}"),
    }
    let http =
        "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"h\"\nurl = \"https://u.example/mcp\"\n";
    let c = Config::parse(http).unwrap();
    assert_eq!(
        c.upstreams[0].transport,
        UpstreamTransport::Http {
            url: "https://u.example/mcp".into()
        }
    );
    assert!(c.upstreams[0].transport.is_https());
    for (extra, problem) in [("command = [\"x\"]\n", "not both"), ("", "is required")] {
        let text = format!(
            "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"x\"\n{extra}url = \"http://a:1/\"\n"
        );
        let text = if extra.is_empty() {
            text.replace("url = \"http://a:1/\"\n", "")
        } else {
            text
        };
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(
            err.contains("upstream[0].command") && err.contains(problem),
            "{err}"
        );
    }
    let empty = "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"x\"\ncommand = [\"\"]\n";
    assert!(
        Config::parse(empty)
            .unwrap_err()
            .to_string()
            .contains("must name a program")
    );
    let ftp = "[auth]\nmode = \"none\"\n[[upstream]]\nname = \"x\"\nurl = \"ftp://a/\"\n";
    assert!(
        Config::parse(ftp)
            .unwrap_err()
            .to_string()
            .contains("upstream[0].url")
    );
}

#[test]
fn legacy_table_defaults_and_bounds() {
    let c = Config::parse(MIN).unwrap();
    assert_eq!(c.legacy.max_sessions_per_principal, 100);
    assert_eq!(c.legacy.session_idle, Duration::from_millis(1_800_000));
    let with = |body: &str| Config::parse(&format!("[legacy]\n{body}{MIN}"));
    let c = with("max_sessions_per_principal = 1\nsession_idle_ms = 1000\n").unwrap();
    assert_eq!(c.legacy.max_sessions_per_principal, 1);
    assert_eq!(c.legacy.session_idle, Duration::from_millis(1000));
    let err = with("max_sessions_per_principal = 0\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("legacy.max_sessions_per_principal"), "{err}");
    let err = with("session_idle_ms = 999\n").unwrap_err().to_string();
    assert!(err.contains("legacy.session_idle_ms"), "{err}");
    let err = with("idle_ms = 5000\n").unwrap_err().to_string();
    assert!(err.contains("idle_ms"), "{err}");
}

#[test]
fn isolation_values() {
    let text = MIN.replace(
        "name = \"demo\"",
        "name = \"demo\"\nisolation = \"session\"",
    );
    assert_eq!(
        Config::parse(&text).unwrap().upstreams[0].isolation,
        Isolation::Session
    );
    let bad = MIN.replace("name = \"demo\"", "name = \"demo\"\nisolation = \"user\"");
    assert!(Config::parse(&bad).is_err());
    let tenant = MIN.replace("name = \"demo\"", "name = \"demo\"\nisolation = \"tenant\"");
    assert_eq!(
        Config::parse(&tenant).unwrap().upstreams[0].isolation,
        Isolation::Tenant
    );
}

#[test]
fn plain_clients_resolve_per_tool_and_never_always_holds() {
    let c = Config::parse(MIN).unwrap();
    assert_eq!(c.upstreams[0].plain_clients, PlainClients::Hold);
    assert!(!c.upstreams[0].offers_handles());
    assert_eq!(c.tasks.task_tools_prefix, "taskgate_");
    assert_eq!(c.tasks.max_status_wait, Duration::from_millis(50_000));

    let text = MIN.to_string()
        + "plain_clients = \"handle\"\n[upstream.tools.quick]\nplain_clients = \"hold\"\n\
           [upstream.tools.never]\ntask = \"never\"\nplain_clients = \"handle\"\n";
    let c = Config::parse(&text).unwrap();
    let u = &c.upstreams[0];
    assert!(u.offers_handles());
    assert_eq!(u.plain_clients_of("sleep"), PlainClients::Handle);
    assert_eq!(u.plain_clients_of("quick"), PlainClients::Hold);
    assert_eq!(u.plain_clients_of("never"), PlainClients::Hold);

    // One tool in handle mode is enough for the task tools.
    let text = MIN.to_string() + "[upstream.tools.slow]\nplain_clients = \"handle\"\n";
    let c = Config::parse(&text).unwrap();
    assert!(c.upstreams[0].offers_handles());
    assert_eq!(c.upstreams[0].plain_clients_of("other"), PlainClients::Hold);

    let bad = MIN.to_string() + "plain_clients = \"poll\"\n";
    assert!(Config::parse(&bad).is_err());
    let empty = MIN.replace("[auth]", "[tasks]\ntask_tools_prefix = \"\"\n[auth]");
    let err = Config::parse(&empty).unwrap_err().to_string();
    assert!(err.contains("tasks.task_tools_prefix"), "{err}");
}
