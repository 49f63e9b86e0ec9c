//! The routing decision of the edge, from the request headers alone (the edge never
//! reads a body; docs/design.md §21).
//!
//! `tasks/get`, `tasks/update` and `tasks/cancel` (by `Mcp-Method`) with a well-formed
//! task id in `Mcp-Name` are keyed by that id, so every poll, answer and cancel of one
//! task reaches one replica while the ring is stable (the poll limiter stays exact,
//! policy 20). Everything else goes round-robin: `tools/call` (MRTR retries included;
//! a retry on another replica is relayed to the holder, policy 19),
//! `subscriptions/listen`, discovery and lists, and task methods without a valid
//! `Mcp-Name` (the replica answers the error).
//!
//! A `tools/call` whose `Mcp-Param-Task-Id` holds a well-formed task id is a plain
//! client's task-status tool (docs/design.md §28): keyed by that id like `tasks/get`,
//! so its polls meet the task's poll limiter on one replica. Any other value goes
//! round-robin, and any replica answers it correctly.
//!
//! A 2025-era request that carries an `Mcp-Session-Id` (and no 2026 version) is keyed
//! by its session id on the same ring, so a session's GET stream and its POSTs meet on
//! one replica while the ring is stable (docs/design.md §22 "Clients of the 2025 era";
//! the session record itself is in the store, so any replica can take over).

use crate::protocol::{Method, PROTOCOL_VERSION};
use crate::tasks::ids;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// A task method: consistent hashing of the task id over the healthy replicas.
    Task(String),
    /// A 2025-era session's request: consistent hashing of the session id.
    Session(String),
    /// Anything else: round-robin over the healthy replicas.
    Other,
}

impl Route {
    /// The `route` label of the edge's metrics and logs.
    pub(crate) fn class(&self) -> &'static str {
        match self {
            Route::Task(_) => "task",
            Route::Session(_) => "session",
            Route::Other => "other",
        }
    }
}

/// The request headers the route is decided by (as `http` spells header names, in
/// lower case): `MCP-Protocol-Version`, `Mcp-Session-Id`, `Mcp-Method`, `Mcp-Name`.
pub(crate) const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";
pub(crate) const METHOD_HEADER: &str = "mcp-method";
pub(crate) const NAME_HEADER: &str = "mcp-name";
/// The task-status tool's annotated `taskId` (SEP-2243 `x-mcp-header: "Task-Id"`).
pub(crate) const PARAM_TASK_ID_HEADER: &str = "mcp-param-task-id";

/// The longest session id the edge hashes; a longer one is no id the gateway minted
/// (the replica answers it 404).
const MAX_SESSION_ID: usize = 128;

/// The request headers a route is decided by (raw bytes; `None` when absent).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RouteHeaders<'a> {
    pub(crate) protocol_version: Option<&'a [u8]>,
    pub(crate) session: Option<&'a [u8]>,
    pub(crate) mcp_method: Option<&'a [u8]>,
    pub(crate) mcp_name: Option<&'a [u8]>,
    pub(crate) param_task_id: Option<&'a [u8]>,
}

/// The route of a request from its headers.
pub(crate) fn route_request(h: RouteHeaders<'_>) -> Route {
    let RouteHeaders {
        protocol_version,
        session,
        mcp_method,
        mcp_name,
        param_task_id,
    } = h;
    let modern = protocol_version == Some(PROTOCOL_VERSION.as_bytes());
    if !modern
        && let Some(s) = session
        && !s.is_empty()
        && s.len() <= MAX_SESSION_ID
        && s.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Route::Session(String::from_utf8_lossy(s).into_owned());
    }
    if mcp_method == Some(Method::ToolsCall.as_str().as_bytes())
        && let Some(id) = param_task_id
            .and_then(|v| std::str::from_utf8(v).ok())
            .filter(|id| ids::is_well_formed(id))
    {
        return Route::Task(id.to_string());
    }
    route(mcp_method, mcp_name)
}

/// The route of a request with these `Mcp-Method` and `Mcp-Name` header values (raw
/// bytes; `None` when absent).
pub(crate) fn route(mcp_method: Option<&[u8]>, mcp_name: Option<&[u8]>) -> Route {
    // The task methods are routed by their task id.
    let is_task_method = mcp_method
        .and_then(Method::from_wire_bytes)
        .is_some_and(Method::is_task_method);
    if !is_task_method {
        return Route::Other;
    }
    match mcp_name.and_then(|n| std::str::from_utf8(n).ok()) {
        Some(name) if ids::is_well_formed(name) => Route::Task(name.to_string()),
        _ => Route::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_methods_with_a_task_id_are_keyed_by_it() {
        let id = ids::new_task_id();
        for m in Method::ALL {
            let want = if m.is_task_method() {
                Route::Task(id.clone())
            } else {
                Route::Other
            };
            assert_eq!(
                route(Some(m.as_str().as_bytes()), Some(id.as_bytes())),
                want,
                "{m}"
            );
        }
        assert_eq!(
            route(Some(b"tasks/get"), Some(id.as_bytes())).class(),
            "task"
        );
    }

    #[test]
    fn everything_else_goes_round_robin() {
        let id = ids::new_task_id();
        let other = |m: Option<&[u8]>, n: Option<&[u8]>| assert_eq!(route(m, n), Route::Other);
        // Other methods, even with a task id as the name.
        for m in [
            "tools/call",
            "tools/list",
            "subscriptions/listen",
            "resources/read",
            "TASKS/GET",
            "tasks/list",
            "",
        ] {
            other(Some(m.as_bytes()), Some(id.as_bytes()));
        }
        // No method header at all.
        other(None, Some(id.as_bytes()));
        // Task methods without a valid name: the replica answers the error.
        other(Some(b"tasks/get"), None);
        other(Some(b"tasks/get"), Some(b""));
        other(Some(b"tasks/get"), Some(b"not-a-task"));
        other(Some(b"tasks/cancel"), Some(&[0xff, 0xfe]));
        let mut longer = id.clone();
        longer.push('x');
        other(Some(b"tasks/update"), Some(longer.as_bytes()));
        assert_eq!(Route::Other.class(), "other");
    }

    #[test]
    fn legacy_sessions_are_keyed_by_their_id() {
        let sid = b"mcs_abcdefABCDEF0123456789-_abcdefABCDEF0123";
        let session = |pv: Option<&'static [u8]>, m: Option<&'static [u8]>| RouteHeaders {
            protocol_version: pv,
            session: Some(sid),
            mcp_method: m,
            ..RouteHeaders::default()
        };
        let s = route_request(session(None, None));
        assert_eq!(s, Route::Session(String::from_utf8_lossy(sid).into_owned()));
        assert_eq!(s.class(), "session");
        // The same with a 2025 version header, whatever the method.
        assert_eq!(
            route_request(session(Some(b"2025-06-18"), Some(b"tools/call"))),
            s
        );
        // A 2026 request is routed as before, session header or not.
        let id = ids::new_task_id();
        assert_eq!(
            route_request(RouteHeaders {
                mcp_name: Some(id.as_bytes()),
                ..session(Some(b"2026-07-28"), Some(b"tasks/get"))
            }),
            Route::Task(id.clone())
        );
        assert_eq!(
            route_request(session(Some(b"2026-07-28"), Some(b"tools/list"))),
            Route::Other
        );
        // Not an id the gateway mints: round-robin (the replica answers 404).
        for bad in [&b""[..], b"has space", &[b'a'; 129][..], &[0xff][..]] {
            let h = RouteHeaders {
                session: Some(bad),
                ..RouteHeaders::default()
            };
            assert_eq!(route_request(h), Route::Other);
        }
        // No session: as before.
        assert_eq!(route_request(RouteHeaders::default()), Route::Other);
    }

    #[test]
    fn a_status_tool_call_with_a_task_id_header_is_keyed_by_it() {
        let id = ids::new_task_id();
        let call = |m: &'static [u8], v: Option<&[u8]>| {
            route_request(RouteHeaders {
                protocol_version: Some(b"2026-07-28"),
                mcp_method: Some(m),
                mcp_name: Some(b"taskgate_task_status"),
                param_task_id: v,
                ..RouteHeaders::default()
            })
        };
        assert_eq!(
            call(b"tools/call", Some(id.as_bytes())),
            Route::Task(id.clone())
        );
        // Not a task id, or not a tools/call: round-robin.
        assert_eq!(call(b"tools/call", Some(b"tsk_short")), Route::Other);
        assert_eq!(call(b"tools/call", None), Route::Other);
        assert_eq!(call(b"tools/list", Some(id.as_bytes())), Route::Other);
        // A 2025-era session's request stays on its session's key.
        let sid = b"mcs_abc";
        let legacy = route_request(RouteHeaders {
            session: Some(sid),
            mcp_method: Some(b"tools/call"),
            param_task_id: Some(id.as_bytes()),
            ..RouteHeaders::default()
        });
        assert_eq!(legacy, Route::Session("mcs_abc".into()));
    }
}
