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

use std::sync::Arc;

use serde_json::{Map, json};
use tokio::sync::watch;

use super::UpstreamInfo;

/// The last known identity of one upstream; shared by all its transports.
pub struct Identity {
    name: String,
    last: watch::Sender<Option<UpstreamInfo>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Start from `stored`: what an earlier run learned, if anything.
    pub fn new(name: &str, stored: Option<UpstreamInfo>) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_string(),
            last: watch::Sender::new(stored),
        })
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

    /// The last identity any transport learned (or the stored one), else the
    /// placeholder for an upstream that never answered.
    pub fn current(&self) -> UpstreamInfo {
        self.last
            .borrow()
            .clone()
            .unwrap_or_else(|| unknown(&self.name))
    }
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
