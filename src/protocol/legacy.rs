//! The 2025-era protocol as the gateway serves it to clients that speak it
//! (docs/design.md §22 "Clients of the 2025 era"): the versions it negotiates and what
//! a legacy request asks for. The methods both eras share are named by [`Method`], the
//! one table of served methods; only the methods of the 2025 lifecycle are spelled here.

use serde_json::{Map, Value};

use super::Method;
use super::params::{Field, Params, TaskRef};

/// The params of a 2025-era `initialize` (MCP 2025-11-25 "Lifecycle",
/// "Initialization"), parsed once; refused where the session opens.
#[derive(Debug, Clone, PartialEq)]
pub struct InitializeParams {
    pub protocol_version: Field<String>,
    /// Kept as sent (`null` when absent) for the session record.
    pub client_info: Value,
    /// Absent or `null` is no capabilities.
    pub capabilities: Field<Map<String, Value>>,
}

impl InitializeParams {
    pub fn parse(mut params: Map<String, Value>) -> Self {
        Self {
            protocol_version: match params.remove("protocolVersion") {
                None => Field::Absent,
                Some(Value::String(v)) => Field::Valid(v),
                Some(_) => Field::Invalid,
            },
            client_info: params.remove("clientInfo").unwrap_or(Value::Null),
            capabilities: match params.remove("capabilities") {
                None | Some(Value::Null) => Field::Valid(Map::new()),
                Some(Value::Object(c)) => Field::Valid(c),
                Some(_) => Field::Invalid,
            },
        }
    }
}

/// What only the 2025 era has, with its typed params (docs/design.md §22 "Clients of
/// the 2025 era", §25).
#[derive(Debug, Clone, PartialEq)]
pub enum LegacyOnly {
    Initialize(InitializeParams),
    Ping,
    /// `logging/setLevel`: session state, kept per client session.
    SetLogLevel {
        level: Field<String>,
    },
    /// `resources/subscribe` (`on`) or `resources/unsubscribe`.
    Subscribe {
        on: bool,
        uri: Field<String>,
    },
    /// The blocking `tasks/result` of the 2025-11-25 dialect.
    TaskResult(TaskRef),
    /// `tasks/list` of the 2025-11-25 dialect; a `null` cursor is none.
    TaskList {
        cursor: Field<String>,
    },
}

/// One 2025-era request, typed: a method both eras share, with the params the 2026
/// path parses ([`Params::parse`]), one only this era has, or one the session does not
/// serve.
#[derive(Debug, Clone, PartialEq)]
pub enum LegacyRequest {
    Shared(Method, Params),
    Only(LegacyOnly),
    /// `-32601`; `task_method` for a `tasks/*` method of a session without the task
    /// dialect, which never had one (answered 404, as before the dialect existed).
    NotFound {
        task_method: bool,
    },
}

impl LegacyRequest {
    /// `params` without `_meta`; `dialect`: the session negotiated 2025-11-25.
    pub fn parse(method: &str, mut params: Map<String, Value>, dialect: bool) -> Self {
        match LegacyMethod::of(method) {
            LegacyMethod::Initialize => {
                Self::Only(LegacyOnly::Initialize(InitializeParams::parse(params)))
            }
            LegacyMethod::Ping => Self::Only(LegacyOnly::Ping),
            LegacyMethod::SetLogLevel => Self::Only(LegacyOnly::SetLogLevel {
                level: string(&mut params, "level"),
            }),
            LegacyMethod::Subscribe(on) => Self::Only(LegacyOnly::Subscribe {
                on,
                uri: string(&mut params, "uri"),
            }),
            LegacyMethod::Tasks(_) if !dialect => Self::NotFound { task_method: true },
            LegacyMethod::Tasks(Some(LegacyTaskMethod::Get)) => {
                Self::Shared(Method::TasksGet, Params::parse(Method::TasksGet, params))
            }
            LegacyMethod::Tasks(Some(LegacyTaskMethod::Cancel)) => Self::Shared(
                Method::TasksCancel,
                Params::parse(Method::TasksCancel, params),
            ),
            LegacyMethod::Tasks(Some(LegacyTaskMethod::Result)) => {
                Self::Only(LegacyOnly::TaskResult(TaskRef::parse(&params)))
            }
            LegacyMethod::Tasks(Some(LegacyTaskMethod::List)) => {
                let cursor = match params.remove("cursor") {
                    None | Some(Value::Null) => Field::Absent,
                    Some(Value::String(c)) => Field::Valid(c),
                    Some(_) => Field::Invalid,
                };
                Self::Only(LegacyOnly::TaskList { cursor })
            }
            LegacyMethod::Tasks(None) | LegacyMethod::Unknown => {
                Self::NotFound { task_method: false }
            }
            LegacyMethod::Forward(m) => Self::Shared(m, Params::parse(m, params)),
        }
    }
}

fn string(params: &mut Map<String, Value>, key: &str) -> Field<String> {
    match params.remove(key) {
        None => Field::Absent,
        Some(Value::String(s)) => Field::Valid(s),
        Some(_) => Field::Invalid,
    }
}

/// The 2025-era versions served, oldest first (MCP 2025-11-25 "Lifecycle").
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];

/// What `initialize` answers when the client asks for a version not served.
pub const LATEST_LEGACY_VERSION: &str = "2025-11-25";

/// The version answered to an `initialize` asking for `requested`: the client's own if
/// served, else the latest (MCP 2025-11-25 "Lifecycle", "Version Negotiation").
pub fn negotiate(requested: &str) -> &'static str {
    LEGACY_VERSIONS
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or(LATEST_LEGACY_VERSION)
}

/// Whether `v` names a 2025-era version.
pub fn is_legacy_version(v: &str) -> bool {
    LEGACY_VERSIONS.contains(&v)
}

/// The 2025-03-26 version, the only one whose clients may send JSON-RPC batches.
pub const BATCH_VERSION: &str = "2025-03-26";

/// What a legacy request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyMethod {
    Initialize,
    Ping,
    /// `logging/setLevel`: session state, kept per client session.
    SetLogLevel,
    /// `resources/subscribe` (`true`) or `resources/unsubscribe` (`false`).
    Subscribe(bool),
    /// A method the upstream answers, forwarded as sent.
    Forward(Method),
    /// A `tasks/*` method: the 2025-11-25 task dialect's (`None` for one it does
    /// not have, such as the 2026 `tasks/update`), served only in a session that
    /// negotiated 2025-11-25 (docs/design.md §25).
    Tasks(Option<LegacyTaskMethod>),
    Unknown,
}

/// The `tasks/*` methods of the 2025-11-25 task dialect (MCP 2025-11-25 "Tasks",
/// "Protocol Messages").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyTaskMethod {
    Get,
    Result,
    List,
    Cancel,
}

impl LegacyTaskMethod {
    /// The two methods both dialects share are named by [`Method`]; the two only the
    /// 2025-11-25 dialect has are spelled here.
    pub fn of(name: &str) -> Option<Self> {
        match Method::from_wire(name) {
            Some(Method::TasksGet) => return Some(Self::Get),
            Some(Method::TasksCancel) => return Some(Self::Cancel),
            _ => {}
        }
        match name {
            "tasks/result" => Some(Self::Result),
            "tasks/list" => Some(Self::List),
            _ => None,
        }
    }

    /// The wire name (the gateway sends these to an upstream's own tasks).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => Method::TasksGet.as_str(),
            Self::Result => "tasks/result",
            Self::List => "tasks/list",
            Self::Cancel => Method::TasksCancel.as_str(),
        }
    }
}

impl LegacyMethod {
    pub fn of(name: &str) -> Self {
        match name {
            "initialize" => return Self::Initialize,
            "ping" => return Self::Ping,
            "logging/setLevel" => return Self::SetLogLevel,
            "resources/subscribe" => return Self::Subscribe(true),
            "resources/unsubscribe" => return Self::Subscribe(false),
            _ => {}
        }
        if name.starts_with("tasks/") {
            return Self::Tasks(LegacyTaskMethod::of(name));
        }
        match Method::from_wire(name) {
            Some(m) if m.capability().is_some() => Self::Forward(m),
            // `server/discover` and `subscriptions/listen` are 2026-07-28 only.
            Some(_) => Self::Unknown,
            None => Self::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_echoes_a_served_version_else_the_latest() {
        assert_eq!(negotiate("2025-03-26"), "2025-03-26");
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("2025-11-25"), "2025-11-25");
        assert_eq!(negotiate("2024-11-05"), LATEST_LEGACY_VERSION);
        assert_eq!(negotiate("2026-07-28"), LATEST_LEGACY_VERSION);
        assert_eq!(negotiate(""), LATEST_LEGACY_VERSION);
    }

    #[test]
    fn methods_of_the_legacy_era() {
        assert_eq!(LegacyMethod::of("initialize"), LegacyMethod::Initialize);
        assert_eq!(
            LegacyMethod::of("tools/call"),
            LegacyMethod::Forward(Method::ToolsCall)
        );
        assert_eq!(
            LegacyMethod::of("resources/templates/list"),
            LegacyMethod::Forward(Method::ResourcesTemplatesList)
        );
        for (t, m) in [
            ("tasks/get", LegacyTaskMethod::Get),
            ("tasks/list", LegacyTaskMethod::List),
            ("tasks/result", LegacyTaskMethod::Result),
            ("tasks/cancel", LegacyTaskMethod::Cancel),
        ] {
            assert_eq!(LegacyMethod::of(t), LegacyMethod::Tasks(Some(m)), "{t}");
        }
        assert_eq!(LegacyMethod::of("tasks/update"), LegacyMethod::Tasks(None));
        for u in [
            "server/discover",
            "subscriptions/listen",
            "sampling/createMessage",
            "",
        ] {
            assert_eq!(LegacyMethod::of(u), LegacyMethod::Unknown, "{u}");
        }
    }
}
