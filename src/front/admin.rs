//! The operator API (docs/design.md §24 "Operations"), under `/admin/` on the
//! `server.metrics_listen` listener only: a tenant's tasks by status, one task, an
//! operator's cancel, the per-tenant counts, drain/undrain for rolling deploys, and
//! the purge of a tenant's data (docs/design.md §27 "Tenant purge").
//! Answers are JSON of task metadata only (`tasks::admin::TaskSummary`).
//!
//! Who may call: a bearer token the front's verifier accepts that carries the
//! `[admin] scope`. With `auth.mode = "none"` nobody is verified, so the API answers
//! only when `metrics_listen` is a loopback address (only this host can reach it).

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};

use super::gateway::Gateway;
use super::reply::{self, Body};
use crate::auth::percent_decode_lossy;
use crate::store::{OwnerCursor, TaskStatus};
use crate::tasks::PurgeError;
use crate::tasks::{MAX_PAGE, TaskQuery};

/// The page size when the request names none.
const DEFAULT_PAGE: usize = 50;

/// Answer one request under `/admin/`.
pub(super) async fn serve<B>(
    gw: Arc<Gateway>,
    req: Request<B>,
) -> Result<Response<Body>, Infallible> {
    let operator = match authorize(&gw, req.headers()).await {
        Ok(op) => op,
        Err(r) => return Ok(r),
    };
    let path = req.uri().path().trim_end_matches('/');
    let query = req.uri().query().unwrap_or("");
    let segments: Vec<&str> = path
        .strip_prefix("/admin")
        .unwrap_or("")
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let method = req.method().clone();
    Ok(match (method, segments.as_slice()) {
        (Method::GET, ["tasks"]) => list(&gw, query).await,
        (Method::GET, ["tasks", id]) => show(&gw, id).await,
        (Method::POST, ["tasks", id, "cancel"]) => cancel(&gw, id, &operator).await,
        (Method::GET, ["tenants"]) => tenants(&gw).await,
        (Method::POST, ["tenants", tenant, "purge"]) => purge(&gw, tenant, &operator).await,
        (Method::POST, ["drain"]) => drain(&gw, true, &operator),
        (Method::POST, ["undrain"]) => drain(&gw, false, &operator),
        (
            _,
            ["tasks"]
            | ["tasks", _]
            | ["tenants"]
            | ["tenants", _, "purge"]
            | ["tasks", _, "cancel"]
            | ["drain"]
            | ["undrain"],
        ) => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here"),
        _ => error(StatusCode::NOT_FOUND, "no such operator API route"),
    })
}

/// The operator's name for the audit log, or the refusal.
async fn authorize(gw: &Gateway, headers: &http::HeaderMap) -> Result<String, Response<Body>> {
    match gw
        .auth
        .authenticate_admin(headers, &gw.cfg.admin.scope)
        .await
    {
        Ok(Some(p)) => Ok(format!("{}/{}", p.tenant, p.subject)),
        Ok(None) if ops_listener_is_loopback(gw) => Ok("anonymous@loopback".into()),
        Ok(None) => Err(error(
            StatusCode::FORBIDDEN,
            "the operator API needs auth.mode = \"jwt\" unless server.metrics_listen is a \
             loopback address",
        )),
        Err(f) => {
            let mut r = reply::json(f.status, &f.body());
            if let Ok(v) = HeaderValue::from_str(&f.www_authenticate) {
                r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
            Err(r)
        }
    }
}

fn ops_listener_is_loopback(gw: &Gateway) -> bool {
    gw.cfg
        .server
        .metrics_listen
        .as_deref()
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .is_some_and(|a| a.ip().is_loopback())
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    reply::json(status, &json!({"error": message}))
}

fn store_failed(e: &crate::store::StoreError) -> Response<Body> {
    reply::json(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({"error": format!("the task store did not answer: {e}")}),
    )
}

/// `GET /admin/tasks?tenant=T[&status=S][&upstream=U][&tool=N][&min_age_ms=A]
/// [&limit=L][&cursor=C]`.
async fn list(gw: &Gateway, query: &str) -> Response<Body> {
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    let page = match gw.engine.admin_list(&q).await {
        Ok(p) => p,
        Err(e) => return store_failed(&e),
    };
    let within: Vec<&str> = [
        q.upstream.as_ref().map(|_| "upstream"),
        q.tool.as_ref().map(|_| "tool"),
        q.min_age_ms.map(|_| "min_age_ms"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut body = json!({
        "tasks": page.tasks,
        "next_cursor": page.next.as_ref().map(encode_cursor),
    });
    if !within.is_empty() {
        // Said in the answer: these filters are not indexed, so a page may be short
        // (even empty) while `next_cursor` still leads to more.
        body["filtered_within_page"] = json!(within);
    }
    reply::json(StatusCode::OK, &body)
}

fn parse_query(query: &str) -> Result<TaskQuery, String> {
    let mut q = TaskQuery {
        limit: DEFAULT_PAGE,
        ..TaskQuery::default()
    };
    let mut tenant = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode_lossy(v);
        match percent_decode_lossy(k).as_str() {
            "tenant" => tenant = Some(v),
            "status" => {
                q.status = Some(TaskStatus::parse(&v).ok_or_else(|| {
                    format!(
                        "status must be one of {}",
                        TaskStatus::ALL.map(TaskStatus::as_str).join(", ")
                    )
                })?);
            }
            "upstream" => q.upstream = Some(v),
            "tool" => q.tool = Some(v),
            "min_age_ms" => {
                q.min_age_ms = Some(
                    v.parse()
                        .map_err(|_| "min_age_ms must be a whole number".to_string())?,
                );
            }
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| format!("limit must be between 1 and {MAX_PAGE}"))?;
            }
            "cursor" => {
                q.after = Some(decode_cursor(&v).ok_or("cursor is not one this API issued")?);
            }
            other => return Err(format!("unknown parameter {other:?}")),
        }
    }
    // Lists are served by the (tenant, status, created) index: a tenant is what
    // keeps a page O(page). `/admin/tenants` says which tenants hold what.
    q.tenant = tenant
        .filter(|t| !t.is_empty())
        .ok_or("tenant is required (see /admin/tenants for the tenants and their counts)")?;
    Ok(q)
}

fn encode_cursor(c: &OwnerCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", c.created_at_ms, c.task_id))
}

fn decode_cursor(s: &str) -> Option<OwnerCursor> {
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(s).ok()?).ok()?;
    let (at, id) = raw.split_once(':')?;
    Some(OwnerCursor {
        created_at_ms: at.parse().ok()?,
        task_id: id.to_string(),
    })
}

async fn show(gw: &Gateway, id: &str) -> Response<Body> {
    match gw.engine.admin_show(id).await {
        Ok(Some(t)) => reply::json(StatusCode::OK, &json!({ "task": t })),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such task"),
        Err(e) => store_failed(&e),
    }
}

async fn cancel(gw: &Gateway, id: &str, operator: &str) -> Response<Body> {
    match gw.engine.admin_cancel(id, operator).await {
        Ok(Some(t)) => reply::json(StatusCode::OK, &json!({ "task": t })),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such task"),
        Err(e) => store_failed(&e),
    }
}

async fn tenants(gw: &Gateway) -> Response<Body> {
    let counts = match gw.engine.tenant_counts().await {
        Ok(c) => c,
        Err(e) => return store_failed(&e),
    };
    let mut out: Vec<Value> = Vec::new();
    for c in counts {
        let fresh = out.last().is_none_or(|t| t["tenant"] != c.tenant.as_str());
        if fresh {
            out.push(json!({"tenant": c.tenant, "tasks": {}}));
        }
        if let Some(t) = out.last_mut() {
            t["tasks"][c.status.as_str()] = json!(c.tasks);
        }
    }
    reply::json(StatusCode::OK, &json!({ "tenants": out }))
}

/// `POST /admin/tenants/{tenant}/purge`. The purge runs in a task of its own: a
/// client that goes away does not stop it half-way (a second purge would finish it,
/// but nobody would be told).
async fn purge(gw: &Gateway, tenant: &str, operator: &str) -> Response<Body> {
    let tenant = percent_decode_lossy(tenant);
    if tenant.is_empty() {
        return error(StatusCode::BAD_REQUEST, "tenant is required");
    }
    let engine = gw.engine.clone();
    let operator = operator.to_string();
    let run = tokio::spawn(async move { engine.admin_purge(&tenant, &operator).await });
    match run.await {
        Ok(Ok(report)) => reply::json(StatusCode::OK, &json!({ "purge": report })),
        Ok(Err(e @ PurgeError::Running(_))) => error(StatusCode::CONFLICT, &e.to_string()),
        Ok(Err(e @ PurgeError::Store { .. })) => reply::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": format!("{e}; run the purge again to finish it")}),
        ),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the purge task ended abnormally: {e}"),
        ),
    }
}

fn drain(gw: &Gateway, on: bool, operator: &str) -> Response<Body> {
    gw.engine.set_drained(on, operator);
    reply::json(
        StatusCode::OK,
        &json!({"replica": gw.engine.replica_id(), "drained": gw.engine.drained()}),
    )
}
