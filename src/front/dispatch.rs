//! Routing a validated request to what serves it: the front itself
//! (`server/discover`, `subscriptions/listen`), the tasks methods, or the upstream.

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::{Map, Value, json};

use super::Gateway;
use super::inline::{self, InlineTiming};
use super::reply::{self, Body};
use super::results;
use super::wire::ValidRequest;
use crate::auth::Principal;
use crate::config::TaskMode;
use crate::protocol::{self, PROTOCOL_VERSION, RpcError, TASKS_EXTENSION};
use crate::upstream::{Upstream, UpstreamInfo};

/// The server capability a method needs from the upstream (policy 14: methods the
/// upstream does not declare answer 404, matching `server/discover`).
fn required_capability(method: &str) -> Option<&'static str> {
    match method {
        "tools/list" | "tools/call" => Some("tools"),
        "prompts/list" | "prompts/get" => Some("prompts"),
        "resources/list" | "resources/templates/list" | "resources/read" => Some("resources"),
        "completion/complete" => Some("completions"),
        _ => None,
    }
}

/// `server/discover` synthesised from the upstream's `initialize` result (spec A5).
pub fn discover_result(info: &UpstreamInfo) -> Value {
    let mut caps = info.capabilities.clone();
    // The legacy 2025-11-25 `tasks` capability is a different feature and must not be
    // advertised next to the extension (spec B12).
    caps.remove("tasks");
    let ext = caps
        .entry("extensions")
        .or_insert_with(|| Value::Object(Map::new()));
    if !ext.is_object() {
        *ext = Value::Object(Map::new());
    }
    if let Value::Object(e) = ext {
        e.insert(TASKS_EXTENSION.into(), json!({}));
    }
    let mut r = Map::new();
    r.insert("supportedVersions".into(), json!([PROTOCOL_VERSION]));
    r.insert("capabilities".into(), Value::Object(caps));
    if let Some(i) = &info.instructions {
        r.insert("instructions".into(), Value::from(i.clone()));
    }
    results::complete("server/discover", Value::Object(r), &info.server_info)
}

fn error_200(req: &ValidRequest, err: RpcError) -> Response<Body> {
    reply::rpc_error(StatusCode::OK, Some(&req.id), &err)
}

/// Serve one validated request for `upstream`.
pub async fn dispatch(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    req: ValidRequest,
) -> Response<Body> {
    // Capability checks that need no upstream (policy 12 order: capability → limits →
    // params and ownership).
    if req.method.starts_with("tasks/") && !req.meta.caps.declares_tasks() {
        return reply::rpc_error(
            StatusCode::BAD_REQUEST,
            Some(&req.id),
            &RpcError::tasks_extension_required(format!(
                "{} requires the tasks extension to be declared",
                req.method
            )),
        );
    }
    if req.method == "subscriptions/listen" {
        let wants_tasks = req
            .params
            .get("notifications")
            .and_then(|n| n.get("taskIds"))
            .is_some();
        if wants_tasks && !req.meta.caps.declares_tasks() {
            return reply::rpc_error(
                StatusCode::BAD_REQUEST,
                Some(&req.id),
                &RpcError::tasks_extension_required(
                    "subscriptions/listen with taskIds requires the tasks extension",
                ),
            );
        }
    }

    let info = match upstream.info().await {
        Ok(i) => i,
        Err(e) => return inline::upstream_failure(&req.id, upstream.name(), &e).into_response(),
    };

    if let Some(cap) = required_capability(&req.method)
        && !info.capabilities.contains_key(cap)
    {
        return reply::rpc_error(
            StatusCode::NOT_FOUND,
            Some(&req.id),
            &RpcError::method_not_found(&req.method),
        );
    }

    match req.method.as_str() {
        "server/discover" => reply::json(
            StatusCode::OK,
            &protocol::response(&req.id, discover_result(&info)),
        ),
        "tasks/get" | "tasks/update" | "tasks/cancel" => tasks_method(&req),
        "subscriptions/listen" => super::listen::open(upstream, &principal, &req, &info, gw),
        "tools/call" => tools_call(gw, upstream, principal, req, info).await,
        _ => {
            if req.method == "tools/list" && !req.params.contains_key("cursor") {
                return match upstream.tools_list(&principal).await {
                    Ok(crate::upstream::CallOutcome::Result(v)) => reply::json(
                        StatusCode::OK,
                        &protocol::response(
                            &req.id,
                            results::complete("tools/list", v, &info.server_info),
                        ),
                    ),
                    Ok(crate::upstream::CallOutcome::Error(e)) => {
                        error_200(&req, results::map_error(e))
                    }
                    Err(e) => {
                        inline::upstream_failure(&req.id, upstream.name(), &e).into_response()
                    }
                };
            }
            inline::run(
                upstream.clone(),
                principal,
                req,
                info.server_info,
                gw.inline_timing(),
            )
            .await
        }
    }
}

/// Task ids are `tsk_` + base64url of 16 random bytes (policy 1).
pub fn is_well_formed_task_id(id: &str) -> bool {
    id.strip_prefix("tsk_").is_some_and(|rest| {
        rest.len() == 22
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

fn tasks_method(req: &ValidRequest) -> Response<Body> {
    let Some(task_id) = req.params.get("taskId").and_then(Value::as_str) else {
        return error_200(
            req,
            RpcError::invalid_params("params.taskId must be a string"),
        );
    };
    if !is_well_formed_task_id(task_id) {
        return error_200(req, RpcError::invalid_params("malformed task id"));
    }
    // No task engine yet: no id was ever issued, so every well-formed id is unknown.
    error_200(req, RpcError::invalid_params("task not found"))
}

async fn tools_call(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    req: ValidRequest,
    info: UpstreamInfo,
) -> Response<Body> {
    let Some(tool) = req
        .params
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return error_200(
            &req,
            RpcError::invalid_params("params.name must be a string"),
        );
    };
    if req.params.get("arguments").is_some_and(|a| !a.is_object()) {
        return error_200(
            &req,
            RpcError::invalid_params("params.arguments must be an object"),
        );
    }
    let configured = upstream
        .cfg
        .tools
        .get(&tool)
        .map(|t| t.task)
        .unwrap_or_default();
    let required = configured == TaskMode::Required
        || (configured != TaskMode::Never
            && upstream
                .tool_task_support(&principal, &tool)
                .await
                .as_deref()
                == Some("required"));
    if required && !req.meta.caps.declares_tasks() {
        return reply::rpc_error(
            StatusCode::BAD_REQUEST,
            Some(&req.id),
            &RpcError::tasks_extension_required(format!(
                "tool {tool:?} runs only as a task; declare the tasks extension"
            )),
        );
    }
    inline::run(
        upstream.clone(),
        principal,
        req,
        info.server_info,
        gw.inline_timing(),
    )
    .await
}

impl Gateway {
    pub fn inline_timing(&self) -> InlineTiming {
        InlineTiming {
            keepalive: std::time::Duration::from_millis(self.cfg.server.keepalive_ms),
            sync_timeout: std::time::Duration::from_millis(self.cfg.tasks.sync_timeout_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_id_shape() {
        assert!(is_well_formed_task_id("tsk_AAAAAAAAAAAAAAAAAAAAAA"));
        assert!(!is_well_formed_task_id("tsk_short"));
        assert!(!is_well_formed_task_id("AAAAAAAAAAAAAAAAAAAAAAAAAA"));
        assert!(!is_well_formed_task_id("tsk_AAAAAAAAAAAAAAAAAAAA/A"));
    }

    #[test]
    fn discover_strips_legacy_tasks() {
        let info = UpstreamInfo {
            protocol_version: "2025-11-25".into(),
            capabilities: serde_json::from_value(json!({"tools":{},"tasks":{"list":{}}})).unwrap(),
            server_info: json!({"name":"u","version":"1"}),
            instructions: Some("hi".into()),
        };
        let d = discover_result(&info);
        assert!(d["capabilities"].get("tasks").is_none());
        assert_eq!(d["capabilities"]["extensions"][TASKS_EXTENSION], json!({}));
        assert_eq!(d["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(d["instructions"], "hi");
        assert_eq!(d["resultType"], "complete");
    }
}
