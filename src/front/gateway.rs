//! The state every request handler shares: configuration, authenticator, upstreams,
//! engine (which holds the MRTR rounds), and the probes (`/readyz`, `/livez`) that report on them.

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::json;

use super::reply::{self, Body};
use crate::auth::Authenticator;
use crate::config::Config;
use crate::upstream::{TransportState, UpstreamSet};

/// Everything a request handler needs, shared by all connections.
pub struct Gateway {
    pub cfg: Arc<Config>,
    pub auth: Arc<Authenticator>,
    pub upstreams: Arc<UpstreamSet>,
    pub engine: Arc<crate::tasks::Engine>,
    /// The flow control the front applies before a request reaches the engine.
    pub limits: Arc<crate::limits::Limits>,
    /// What this replica holds for the 2025-era sessions it serves (docs/design.md
    /// §22 "Clients of the 2025 era").
    pub legacy: Arc<super::legacy::live::LegacyLive>,
    /// The upstreams whose own tools bear a task tool's name (docs/design.md §28):
    /// their endpoints hold plain clients' calls.
    pub shadowed: parking_lot::Mutex<std::collections::HashSet<String>>,
}

impl Gateway {
    /// Whether `upstream`'s tools were seen to bear a task tool's name.
    pub(super) fn task_tools_shadowed(&self, upstream: &crate::upstream::Upstream) -> bool {
        self.shadowed.lock().contains(upstream.name())
    }

    /// `upstream` lists a tool with a task tool's name: its endpoint holds from now on
    /// (logged once, counted).
    pub(super) fn note_task_tools_shadowed(&self, upstream: &crate::upstream::Upstream) {
        if self.shadowed.lock().insert(upstream.name().to_string()) {
            crate::metrics::fail_closed("task_tools_shadowed");
            tracing::warn!(
                upstream = %upstream.name(),
                prefix = %self.cfg.tasks.task_tools_prefix,
                "an upstream tool bears a task tool's name: plain clients of this endpoint are held, not given handles, until [tasks] task_tools_prefix is changed"
            );
        }
    }

    pub(super) fn readyz(&self) -> Response<Body> {
        let mut all_ready = true;
        let mut states = serde_json::Map::new();
        for u in self.upstreams.iter() {
            let s = match u.state() {
                TransportState::Ready => json!({"state": "ready"}),
                TransportState::Starting => {
                    all_ready = false;
                    json!({"state": "starting"})
                }
                TransportState::Down(reason) => {
                    all_ready = false;
                    json!({"state": "down", "reason": reason})
                }
            };
            states.insert(u.name().to_string(), s);
        }
        // A store that failed a write or flush cannot hand out task ids (docs/design.md
        // §16 "Durability, store failures and upgrades").
        let store_ok = self.engine.store_healthy();
        let lease = self.engine.lease_held();
        let drained = self.engine.drained();
        let ready = all_ready && store_ok && lease && !drained;
        reply::json(
            ok_or_unavailable(ready),
            &json!({
                "ready": ready,
                "store": if store_ok { "open" } else { "failed" },
                "lease": if lease { "held" } else { "lost" },
                "drained": drained,
                "upstreams": states
            }),
        )
    }

    /// `/livez`: whether this replica itself can serve (store reachable, lease held,
    /// not draining), whatever its upstreams do: what a load balancer in front of
    /// several replicas asks (docs/design.md §21). `/readyz` also reports the
    /// upstreams, which every replica shares.
    pub(super) fn livez(&self) -> Response<Body> {
        let store_ok = self.engine.store_healthy();
        let lease = self.engine.lease_held();
        let draining = self.engine.shutting_down() || self.engine.drained();
        let live = store_ok && lease && !draining;
        reply::json(
            ok_or_unavailable(live),
            &json!({
                "live": live,
                "replica": self.engine.replica_id(),
                "store": if store_ok { "open" } else { "failed" },
                "lease": if lease { "held" } else { "lost" },
                "draining": draining,
            }),
        )
    }
}

/// 200 for a probe that passes, 503 for one that does not (`/readyz`, `/livez`).
fn ok_or_unavailable(pass: bool) -> StatusCode {
    if pass {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}
