//! The first two steps of the request path (src/front/mod.rs): the replica header
//! every answer carries, and the path step that answers the operational and metadata
//! endpoints and picks the upstream of any other path.

use std::sync::Arc;

use http::{HeaderValue, Method, StatusCode};
use serde_json::json;

use super::gateway::Gateway;
use super::reply;
use super::stack::{Req, Resp, Step, Target};

/// RFC 9728 protected-resource metadata, per upstream path below it.
const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// The response header naming the replica that answered.
pub const REPLICA_HEADER: &str = "taskgate-replica";

/// The outermost step: every reply names the replica that gave it
/// (`Taskgate-Replica`, docs/design.md §19), whichever step answered.
#[derive(Clone)]
pub(super) struct ReplicaHeader(Option<HeaderValue>);

impl Step for ReplicaHeader {
    type Kept = ();

    fn before(&self, _req: &mut Req) -> Result<(), Resp> {
        Ok(())
    }

    fn after(&self, _kept: (), resp: &mut Resp) {
        if let Some(v) = &self.0 {
            resp.headers_mut().insert(REPLICA_HEADER, v.clone());
        }
    }
}

impl ReplicaHeader {
    pub(super) fn of(gw: &Gateway) -> Self {
        Self(HeaderValue::from_str(gw.engine.replica_id()).ok())
    }
}

/// The path step, first of the stack: the operational and metadata endpoints are
/// answered here and need no token (docs/design.md §12 "HTTP front"); an upstream's
/// path goes on with its [`Target`]; any other path is 404.
#[derive(Clone)]
pub(super) struct Route(pub(super) Arc<Gateway>);

impl Step for Route {
    type Kept = ();

    fn before(&self, req: &mut Req) -> Result<(), Resp> {
        let gw = &self.0;
        let path = req.uri().path();
        // Every arm here is in `config::OPERATIONAL_PATHS`, which no upstream may use.
        match path {
            "/healthz" => return Err(reply::json(StatusCode::OK, &json!({"status": "ok"}))),
            "/readyz" => return Err(gw.readyz()),
            "/livez" => return Err(gw.livez()),
            "/metrics" => return Err(reply::metrics()),
            _ => {}
        }
        if let Some(rest) = path.strip_prefix(PRM_PATH) {
            if req.method() != Method::GET {
                return Err(reply::method_not_allowed("GET"));
            }
            if rest.is_empty() || gw.upstreams.by_path(rest).is_some() {
                return Err(reply::json(
                    StatusCode::OK,
                    &gw.auth.resource_metadata(rest),
                ));
            }
            return Err(reply::empty(StatusCode::NOT_FOUND));
        }
        let Some(upstream) = gw.upstreams.by_path(path).cloned() else {
            return Err(reply::json(
                StatusCode::NOT_FOUND,
                &json!({"error": "not found", "path": path}),
            ));
        };
        req.extensions_mut().insert(Target(upstream));
        Ok(())
    }
}
