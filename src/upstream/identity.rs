//! An upstream's identity (its `initialize` result) as the task plane shows it.
//!
//! `tasks/get|update|cancel` and `subscriptions/listen` answer from the store whatever
//! the upstream's state (README "Task plane and upstream plane"), yet every result
//! carries `_meta["io.modelcontextprotocol/serverInfo"]` and a listen acknowledges
//! only what the upstream's capabilities allow. So the identity must be known without
//! asking the upstream: every transport of the upstream (every isolation scope)
//! reports each completed `initialize` here; the last one is kept in memory and
//! persisted in the store (the `upstream_identity` tree), written only when it differs
//! from what is stored. A restarted gateway starts from the stored one, and an upstream
//! that never answered falls back to `{name, version: "unknown"}` with no capabilities.

use std::sync::{Arc, Mutex};

use serde_json::{Map, json};

use super::UpstreamInfo;
use crate::store::{SCHEMA_VERSION, TaskStore, UpstreamIdentity};

/// The last known identity of one upstream; shared by all its transports.
pub struct Identity {
    name: String,
    store: Arc<dyn TaskStore>,
    last: Mutex<Option<UpstreamInfo>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Start from what the store holds for upstream `name` (a read error is logged and
    /// treated as nothing stored: the identity is only ever a fallback).
    pub fn load(name: &str, store: Arc<dyn TaskStore>) -> Arc<Self> {
        let last = match store.upstream_identity(name) {
            Ok(Some(i)) => Some(UpstreamInfo {
                protocol_version: i.protocol_version,
                capabilities: i.capabilities,
                server_info: i.server_info,
                instructions: i.instructions,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(upstream = %name, error = %e, "reading the stored upstream identity failed");
                None
            }
        };
        Arc::new(Self {
            name: name.to_string(),
            store,
            last: Mutex::new(last),
        })
    }

    /// A transport completed `initialize` with `info`. Costs nothing when the upstream
    /// answered as before; otherwise the store is updated (and flushed in the
    /// background: nothing waits for it, and losing it to a crash only means the
    /// previous identity is shown until the upstream answers again).
    pub fn learned(&self, info: &UpstreamInfo) {
        // Held across the (short, synchronous) store write so that two scopes
        // initialising at once leave memory and store agreeing on the later one.
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if last.as_ref() == Some(info) {
            return;
        }
        *last = Some(info.clone());
        let record = UpstreamIdentity {
            v: SCHEMA_VERSION,
            protocol_version: info.protocol_version.clone(),
            server_info: info.server_info.clone(),
            capabilities: info.capabilities.clone(),
            instructions: info.instructions.clone(),
        };
        match self.store.put_upstream_identity(&self.name, &record) {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(upstream = %self.name, "upstream identity stored");
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let store = self.store.clone();
                    let name = self.name.clone();
                    rt.spawn(async move {
                        if let Err(e) = store.flush().await {
                            tracing::warn!(upstream = %name, error = %e, "flushing the upstream identity failed");
                        }
                    });
                }
            }
            Err(e) => {
                tracing::warn!(upstream = %self.name, error = %e, "storing the upstream identity failed");
            }
        }
    }

    /// The last identity any transport learned (or the stored one), else the
    /// placeholder for an upstream that never answered.
    pub fn current(&self) -> UpstreamInfo {
        self.last
            .lock()
            .ok()
            .and_then(|l| l.clone())
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
