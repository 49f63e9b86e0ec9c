//! Session-scoped state over a shared upstream session (docs/design.md §22 "Clients
//! of the 2025 era"): the upstream requests that carry it — one resource subscription
//! whoever asked, the most verbose log level any session asked for — and what a
//! session's end gives back. `live.rs` keeps the counts; this file talks upstream.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::super::gateway::Gateway;
use super::live::SubChange;
use crate::auth::Principal;
use crate::protocol::meta::LOG_LEVELS;
use crate::upstream::{CallOutcome, CallSpec, Scope, Upstream};

/// What this replica holds for a session that ended: its calls, its relayed
/// requests, its share of upstream subscriptions and log level, and under
/// `isolation = "session"` its own upstream session.
pub(crate) async fn end_locally(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    session: &str,
) {
    let live = &gw.legacy;
    live.end_calls(session);
    let scope = Scope::session(principal, session);
    let key = upstream.scope_of(scope);
    for (up, sc, uri) in live.subscriptions_of(session) {
        if up == upstream.name()
            && sc == key
            && live.subscription(&up, &sc, &uri, session, false) == SubChange::Last
        {
            subscribe_upstream(gw, upstream, scope, &uri, false).await;
        }
    }
    if let Some(level) = live.log_level(upstream.name(), &key, session, None) {
        set_upstream_level(gw, upstream, scope, level).await;
    }
    upstream.end_session_scope(session).await;
}

/// Ask the upstream to (un)subscribe `uri`; `true` when it accepted.
pub(super) async fn subscribe_upstream(
    gw: &Gateway,
    upstream: &Upstream,
    scope: Scope<'_>,
    uri: &str,
    on: bool,
) -> bool {
    let method = if on {
        "resources/subscribe"
    } else {
        "resources/unsubscribe"
    };
    let mut params = Map::new();
    params.insert("uri".into(), Value::from(uri));
    upstream_request(gw, upstream, scope, method, params).await
}

pub(super) async fn set_upstream_level(
    gw: &Gateway,
    upstream: &Upstream,
    scope: Scope<'_>,
    rank: usize,
) -> bool {
    let Some(level) = LOG_LEVELS.get(rank) else {
        return false;
    };
    let mut params = Map::new();
    params.insert("level".into(), Value::from(*level));
    upstream_request(gw, upstream, scope, "logging/setLevel", params).await
}

/// A request of the gateway's own on the scope's upstream session.
async fn upstream_request(
    gw: &Gateway,
    upstream: &Upstream,
    scope: Scope<'_>,
    method: &str,
    params: Map<String, Value>,
) -> bool {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let spec = CallSpec {
        method: method.into(),
        tool: None,
        params,
        want_progress: false,
        tenant: None,
        session: scope.session.map(str::to_string),
    };
    matches!(
        gw.engine
            .call_upstream(upstream, scope.principal, spec, tx)
            .await,
        Ok(CallOutcome::Result(_))
    )
}
