//! What the task plane keeps of each upstream across restarts: the identity it
//! reported in `initialize`, and its tools' `Mcp-Param-*` header maps. Read once at
//! start-up (what is shown and checked until the upstream answers again), and each
//! change written (only when it differs from the stored record) and flushed in the
//! background.

use std::collections::HashMap;
use std::sync::Arc;

use super::engine::Engine;
use super::repo::TaskRepo;
use crate::config::Config;
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use crate::upstream::UpstreamSet;

/// The upstream identities earlier runs stored, by upstream name (what the task plane
/// shows until an upstream answers again). A read error is logged and counts as
/// nothing stored: the identity is only ever a fallback.
pub(super) async fn stored_identities(
    tasks: &TaskRepo,
    cfg: &Config,
) -> HashMap<String, UpstreamInfo> {
    let mut out = HashMap::new();
    for u in &cfg.upstreams {
        match tasks.upstream_identity(&u.name).await {
            Ok(Some(info)) => {
                out.insert(u.name.clone(), info);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(upstream = %u.name, error = %e, "reading the stored upstream identity failed");
            }
        }
    }
    out
}

/// Keep every upstream's identity durable: each change is written (only when it
/// differs from the stored record) and flushed in the background. Nothing waits for
/// it; losing one to a crash only means the previous identity is shown until the
/// upstream answers again.
pub(super) fn persist_identities(engine: &Arc<Engine>, upstreams: &UpstreamSet) {
    for u in upstreams.iter() {
        let mut changes = u.identity_changes();
        let name = u.name().to_string();
        let engine = engine.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(info) = changes.borrow_and_update().clone() else {
                    continue;
                };
                store_identity(&engine.tasks, &name, &info).await;
            }
        });
    }
}

/// The tools' `Mcp-Param-*` header maps earlier runs stored, by upstream name (what the
/// front checks `tools/call` headers against until a new `tools/list`). A read error
/// is logged and counts as nothing stored: the headers are then not checked until the
/// upstream lists its tools again.
pub(super) async fn stored_tool_headers(
    tasks: &TaskRepo,
    cfg: &Config,
) -> HashMap<String, ToolHeaders> {
    let mut out = HashMap::new();
    for u in &cfg.upstreams {
        match tasks.upstream_tool_headers(&u.name).await {
            Ok(Some(headers)) => {
                out.insert(u.name.clone(), headers);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(upstream = %u.name, error = %e, "reading the stored tool header map failed");
            }
        }
    }
    out
}

/// Keep every upstream's tool header map durable, as [`persist_identities`] does the
/// identity.
pub(super) fn persist_tool_headers(engine: &Arc<Engine>, upstreams: &UpstreamSet) {
    for u in upstreams.iter() {
        let mut changes = u.tool_header_changes();
        let name = u.name().to_string();
        let engine = engine.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(headers) = changes.borrow_and_update().clone() else {
                    continue;
                };
                store_tool_headers(&engine.tasks, &name, &headers).await;
            }
        });
    }
}

async fn store_tool_headers(tasks: &TaskRepo, name: &str, headers: &ToolHeaders) {
    match tasks.put_upstream_tool_headers(name, headers).await {
        Ok(false) => {}
        Ok(true) => {
            tracing::info!(upstream = %name, "tool header map stored");
            if let Err(e) = tasks.flush().await {
                tracing::warn!(upstream = %name, error = %e, "flushing the tool header map failed");
            }
        }
        Err(e) => {
            tracing::warn!(upstream = %name, error = %e, "storing the tool header map failed");
        }
    }
}

async fn store_identity(tasks: &TaskRepo, name: &str, info: &UpstreamInfo) {
    match tasks.put_upstream_identity(name, info).await {
        Ok(false) => {}
        Ok(true) => {
            tracing::info!(upstream = %name, "upstream identity stored");
            if let Err(e) = tasks.flush().await {
                tracing::warn!(upstream = %name, error = %e, "flushing the upstream identity failed");
            }
        }
        Err(e) => {
            tracing::warn!(upstream = %name, error = %e, "storing the upstream identity failed");
        }
    }
}
