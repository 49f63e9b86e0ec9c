//! An upstream's identity (its `initialize` result) as the task plane shows it.
//!
//! `tasks/get|update|cancel` and `subscriptions/listen` answer from the store whatever
//! the upstream's state (README "Task plane and upstream plane"), yet every result
//! carries `_meta["io.modelcontextprotocol/serverInfo"]` and a listen acknowledges
//! only what the upstream's capabilities allow. So the identity must be known without
//! asking the upstream: every transport of the upstream (every isolation scope)
//! reports each completed `initialize` here; the last one is kept in memory and
//! published to whoever keeps it durable (the engine writes it to the task store,
//! only when it differs from what is stored). A restarted gateway starts from the
//! stored one, and an upstream that never answered falls back to `{name, version:
//! "unknown"}` with no capabilities.
//!
//! The `Mcp-Param-*` header map of the upstream's tools (docs/design.md §12 "HTTP
//! front") travels the same way: derived from each `tools/list` any scope fetches,
//! kept in memory, published to the engine, which stores it beside the identity, and
//! read back at start, so a restarted gateway checks headers before the first list.

use std::sync::Arc;

use serde_json::{Map, json};
use tokio::sync::watch;

use super::UpstreamInfo;
use crate::protocol::initialize;
use crate::protocol::param_headers::ToolHeaders;

/// The last known identity of one upstream; shared by all its transports.
pub struct Identity {
    name: String,
    last: watch::Sender<Option<UpstreamInfo>>,
    /// The header map of the last `tools/list` (or the stored one); `None` until one is
    /// known. Shared as an `Arc`: the front reads it on every `tools/call`.
    tool_headers: watch::Sender<Option<Arc<ToolHeaders>>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Start from what an earlier run learned, if anything: its identity and its
    /// tools' header map.
    pub fn new(
        name: &str,
        stored: Option<UpstreamInfo>,
        stored_tool_headers: Option<ToolHeaders>,
    ) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_string(),
            last: watch::Sender::new(stored),
            tool_headers: watch::Sender::new(stored_tool_headers.map(Arc::new)),
        })
    }

    /// A scope fetched `tools/list` and `headers` is its header map. Costs a comparison
    /// when nothing changed; otherwise [`tool_header_changes`](Self::tool_header_changes)
    /// wakes up.
    pub fn learned_tool_headers(&self, headers: ToolHeaders) {
        self.tool_headers.send_if_modified(|last| {
            if last.as_deref() == Some(&headers) {
                return false;
            }
            *last = Some(Arc::new(headers));
            true
        });
    }

    /// The header map of the last `tools/list` (or the stored one), `None` when no list
    /// was ever seen.
    pub fn tool_headers(&self) -> Option<Arc<ToolHeaders>> {
        self.tool_headers.borrow().clone()
    }

    /// Wakes whenever the header map changes, seeing only the latest (as
    /// [`changes`](Self::changes)).
    pub fn tool_header_changes(&self) -> watch::Receiver<Option<Arc<ToolHeaders>>> {
        self.tool_headers.subscribe()
    }

    /// A transport completed `initialize` with `info`. Costs a comparison when the
    /// upstream answered as before; otherwise [`changes`](Self::changes) wakes up.
    pub fn learned(&self, info: &UpstreamInfo) {
        self.last.send_if_modified(|last| {
            if last.as_ref() == Some(info) {
                return false;
            }
            *last = Some(info.clone());
            true
        });
    }

    /// Wakes whenever the identity changes, seeing only the latest one: whoever keeps
    /// it durable (the engine) writes what it sees, so a burst of changes costs one
    /// write and a later identity is never overwritten by an earlier one.
    pub fn changes(&self) -> watch::Receiver<Option<UpstreamInfo>> {
        self.last.subscribe()
    }

    /// Whether the server advertises 2025-11-25 tasks for `tools/call`
    /// (`capabilities.tasks.requests.tools.call`); `None` while no identity is known.
    /// A read of the shared value, no copy: every `tools/call` asks (docs/design.md
    /// §25).
    pub fn advertises_tasks(&self) -> Option<bool> {
        self.last.borrow().as_ref().map(advertises_tasks)
    }

    /// The last identity any transport learned (or the stored one), else the
    /// placeholder for an upstream that never answered.
    pub fn current(&self) -> UpstreamInfo {
        self.last
            .borrow()
            .clone()
            .unwrap_or_else(|| unknown(&self.name))
    }
}

/// Whether `info` advertises 2025-11-25 tasks for `tools/call`.
pub fn advertises_tasks(info: &UpstreamInfo) -> bool {
    initialize::advertises_tool_call_tasks(&info.capabilities)
}

/// The identity of an upstream that never completed `initialize`: its configured name,
/// version "unknown", no capabilities (so nothing is advertised that it may not do).
pub fn unknown(name: &str) -> UpstreamInfo {
    UpstreamInfo {
        protocol_version: String::new(),
        capabilities: Map::new(),
        server_info: json!({ "name": name, "version": "unknown" }),
        instructions: None,
    }
}
