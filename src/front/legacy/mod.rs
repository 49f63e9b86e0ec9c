//! 2025-era clients on the same endpoint (docs/design.md §22 "Clients of the 2025
//! era"). `era.rs` decides which era a request speaks; this module serves the legacy
//! one: the gateway answers `initialize` itself from the upstream's stored identity
//! and mints a session bound to the principal (`tasks/sessions.rs` stores it), then
//! forwards the session's requests and notifications (`call.rs` holds a call open),
//! relays the client's answers to requests it was sent, serves the standalone GET
//! stream (`stream.rs`) and `DELETE`. Session-scoped state over a shared upstream
//! session is aggregated per replica in `live.rs`.
//!
//! Order of checks (after the path, Origin/Host, method, auth and content checks the
//! stack made): JSON → envelope → session → `MCP-Protocol-Version` → method →
//! capability → rate limits → dispatch.

mod aggregate;
mod call;
mod dialect;
pub(super) mod live;
mod message;
mod stream;
mod tasks;

use std::sync::Arc;

use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::Instrument;

use self::call::{DEFAULT_LOG_RANK, LegacyCall};
use self::live::SubChange;
use self::message::Message;
use self::tasks::TaskSession;
use super::answer::Final;
use super::answers::{Answers, Ctx, Envelope, HeldCall, Listed};
use super::dispatch;
use super::gateway::Gateway;
use super::reply::{self, Body};
use super::wire::ValidRequest;
use crate::auth::Principal;
use crate::protocol::legacy::{self as versions, LegacyOnly, LegacyRequest};
use crate::protocol::meta::{ClientCaps, RequestMeta, log_level_rank};
use crate::protocol::params::{Field, Params, TaskRef, ToolCallParams};
use crate::protocol::{self, Method, Request, RequestId, RpcError, TASKS_EXTENSION, error, fields};
use crate::store::SessionRecord;
use crate::store::TaskRecord;
use crate::tasks::Caller;
use crate::tasks::Failure;
use crate::tasks::Reply;
use crate::upstream::{Scope, Upstream, UpstreamInfo};

use super::era::SESSION_HEADER;

/// Serve a legacy POST (its body already parsed as JSON).
pub(super) async fn serve_post(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    parts: &Parts,
    body: Value,
    received: Instant,
) -> Response<Body> {
    let was_batch = body.is_array();
    let mut messages = match message::parse_body(body) {
        Ok(m) => m,
        Err(rej) => return reply::rpc_error(rej.status, rej.id.as_ref(), &rej.error),
    };
    // `initialize` opens a session; it never travels in a batch (MCP 2025-03-26
    // "Lifecycle").
    let is_init =
        |m: &Message| matches!(m, Message::Request { method, .. } if method == "initialize");
    if messages.iter().any(is_init) {
        if was_batch {
            let id = messages.iter().find(|m| is_init(m)).and_then(Message::id);
            return bad_request(id, "initialize must not be part of a batch");
        }
        if let Some(Message::Request { id, params, .. }) = messages.pop() {
            return initialize(gw, upstream, &principal, id, params).await;
        }
    }
    let first_id = messages.first().and_then(Message::id).cloned();
    let session = match session_of(gw, upstream, &principal, parts, first_id.as_ref()).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    if let Some(resp) = version_refused(parts, first_id.as_ref()) {
        return resp;
    }
    if was_batch && session.protocol_version != versions::BATCH_VERSION {
        return bad_request(
            first_id.as_ref(),
            &format!(
                "batches are accepted only in protocol version {}",
                versions::BATCH_VERSION
            ),
        );
    }
    let s = Session {
        gw,
        upstream,
        principal: &principal,
        rec: &session,
        received,
        headers: &parts.headers,
    };
    if !was_batch {
        return match messages.pop() {
            Some(Message::Request { id, method, params }) => {
                s.request(id, &method, params, true).await
            }
            Some(other) => {
                s.no_answer(other).await;
                reply::empty(StatusCode::ACCEPTED)
            }
            None => reply::empty(StatusCode::ACCEPTED),
        };
    }
    // A 2025-03-26 batch: the requests' answers as one JSON array; notifications and
    // responses need none (all of them: 202).
    let mut answers = Vec::new();
    for m in messages {
        match m {
            Message::Request { id, method, params } => {
                let resp = s.request(id.clone(), &method, params, false).await;
                answers.push(answer_value(&id, resp).await);
            }
            other => s.no_answer(other).await,
        }
    }
    if answers.is_empty() {
        reply::empty(StatusCode::ACCEPTED)
    } else {
        reply::json(StatusCode::OK, &Value::Array(answers))
    }
}

/// The standalone GET stream of a session.
pub(super) async fn serve_get(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    parts: &Parts,
) -> Response<Body> {
    let session = match session_of(gw, upstream, &principal, parts, None).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    if let Some(resp) = version_refused(parts, None) {
        return resp;
    }
    stream::open(gw, upstream, principal, session).await
}

/// `DELETE`: the client ends its session.
pub(super) async fn serve_delete(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: Principal,
    parts: &Parts,
) -> Response<Body> {
    let session = match session_of(gw, upstream, &principal, parts, None).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    match gw
        .engine
        .sessions()
        .close(&principal, &session.session_id)
        .await
    {
        Ok(true) => {
            aggregate::end_locally(gw, upstream, &principal, &session.session_id).await;
            reply::empty(StatusCode::NO_CONTENT)
        }
        Ok(false) => unknown_session(None),
        Err(e) => store_unavailable(None, &e),
    }
}

/// `initialize`: answered by the gateway from the upstream's stored identity (the
/// upstream may be down), with a new session bound to the principal.
async fn initialize(
    gw: &Gateway,
    upstream: &Arc<Upstream>,
    principal: &Principal,
    id: RequestId,
    params: Map<String, Value>,
) -> Response<Body> {
    if let Err(t) = gw.limits.check_request(principal) {
        return throttled(&id, t);
    }
    let init = versions::InitializeParams::parse(params);
    let Field::Valid(requested) = &init.protocol_version else {
        return invalid_params(&id, "params.protocolVersion must be a string");
    };
    let version = versions::negotiate(requested);
    let client_info = init.client_info;
    let Field::Valid(caps) = init.capabilities else {
        return invalid_params(&id, "params.capabilities must be an object");
    };
    let opened = gw
        .engine
        .sessions()
        .open(principal, upstream.name(), version, client_info, caps)
        .await;
    let rec = match opened {
        Ok(r) => r,
        Err(crate::tasks::SessionError::Refused { retry_after }) => {
            return throttled(&id, crate::limits::Throttled::legacy_sessions(retry_after));
        }
        Err(crate::tasks::SessionError::Store(e)) => {
            return store_unavailable(Some(&id), &e);
        }
    };
    let result = initialize_result(&upstream.identity(), version);
    let mut r = reply::json(StatusCode::OK, &protocol::response(&id, result));
    if let Ok(v) = HeaderValue::from_str(&rec.session_id) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

/// The `initialize` result from the upstream's identity: the upstream's own task
/// capabilities are never shown; a 2025-11-25 session gets the gateway's
/// (docs/design.md §25).
pub fn initialize_result(info: &UpstreamInfo, version: &str) -> Value {
    let mut caps = info.capabilities.clone();
    strip_task_capabilities(&mut caps);
    if tasks::speaks_tasks(version) {
        tasks::advertise(&mut caps);
    }
    let mut r = Map::new();
    r.insert("protocolVersion".into(), Value::from(version));
    r.insert("capabilities".into(), Value::Object(caps));
    r.insert("serverInfo".into(), info.server_info.clone());
    if let Some(i) = &info.instructions {
        r.insert("instructions".into(), Value::from(i.clone()));
    }
    Value::Object(r)
}

/// Remove the upstream's own 2025-11-25 `tasks` capability and the 2026 tasks
/// extension.
pub fn strip_task_capabilities(caps: &mut Map<String, Value>) {
    caps.remove("tasks");
    if let Some(Value::Object(ext)) = caps.get_mut("extensions") {
        ext.remove(TASKS_EXTENSION);
        if ext.is_empty() {
            caps.remove("extensions");
        }
    }
}

/// The session named by the request, owned by `principal`, on this upstream; else
/// the answer: 400 without one, 404 for one unknown, foreign or ended (the same
/// bytes, so a session id is no oracle), 503 when the store cannot say.
async fn session_of(
    gw: &Gateway,
    upstream: &Upstream,
    principal: &Principal,
    parts: &Parts,
    id: Option<&RequestId>,
) -> Result<SessionRecord, Response<Body>> {
    let mut values = parts.headers.get_all(SESSION_HEADER).iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return Err(bad_request(
            id,
            "an Mcp-Session-Id header is required (send initialize first)",
        ));
    };
    let Ok(sid) = v.to_str() else {
        return Err(unknown_session(id));
    };
    match gw.engine.sessions().resolve(principal, sid).await {
        Ok(Some(rec)) if rec.upstream == upstream.name() => Ok(rec),
        Ok(_) => Err(unknown_session(id)),
        Err(e) => Err(store_unavailable(id, &e)),
    }
}

/// `MCP-Protocol-Version` after `initialize`: absent (2025-03-26 clients send none)
/// or a 2025-era version; anything else is refused with 400.
fn version_refused(parts: &Parts, id: Option<&RequestId>) -> Option<Response<Body>> {
    let mut values = parts.headers.get_all("mcp-protocol-version").iter();
    match (values.next(), values.next()) {
        (None, _) => None,
        (Some(v), None) if v.to_str().is_ok_and(versions::is_legacy_version) => None,
        _ => Some(reply::rpc_error(
            StatusCode::BAD_REQUEST,
            id,
            &RpcError::invalid_request("unsupported MCP-Protocol-Version")
                .with_data(json!({ "supported": versions::LEGACY_VERSIONS })),
        )),
    }
}

/// 429 (or 503 for a full queue) + `Retry-After`, `-32005` (docs/design.md §8).
fn throttled(id: &RequestId, t: crate::limits::Throttled) -> Response<Body> {
    Final::of(id, Reply::Failed(Failure::throttled(t))).into_response()
}

fn bad_request(id: Option<&RequestId>, why: &str) -> Response<Body> {
    reply::rpc_error(StatusCode::BAD_REQUEST, id, &RpcError::invalid_request(why))
}

fn invalid_params(id: &RequestId, why: &str) -> Response<Body> {
    reply::rpc_error(StatusCode::OK, Some(id), &RpcError::invalid_params(why))
}

fn unknown_session(id: Option<&RequestId>) -> Response<Body> {
    reply::rpc_error(
        StatusCode::NOT_FOUND,
        id,
        &RpcError::invalid_request("unknown session; send initialize to start a new one"),
    )
}

fn store_unavailable(id: Option<&RequestId>, e: &dyn std::fmt::Display) -> Response<Body> {
    tracing::warn!(error = %e, "legacy session store read failed");
    reply::unavailable(
        id,
        &RpcError::internal("the session store is unavailable; retry"),
        1,
    )
}

/// One request or notification of a resolved session.
struct Session<'a> {
    gw: &'a Gateway,
    upstream: &'a Arc<Upstream>,
    principal: &'a Principal,
    rec: &'a SessionRecord,
    received: Instant,
    /// The HTTP request's headers (its W3C trace context).
    headers: &'a http::HeaderMap,
}

impl Session<'_> {
    fn sid(&self) -> &str {
        &self.rec.session_id
    }

    fn task_session(&self) -> TaskSession<'_> {
        TaskSession {
            gw: self.gw,
            upstream: self.upstream,
            principal: self.principal,
            rec: self.rec,
        }
    }

    /// The upstream session this client session is served by.
    fn scope(&self) -> Scope<'_> {
        Scope::session(self.principal, self.sid())
    }

    /// A notification or a response: nothing to answer.
    async fn no_answer(&self, m: Message) {
        match m {
            Message::Response { id, answer } => {
                self.gw.legacy.answer(self.sid(), &id, answer);
            }
            // Other notifications are informational: `initialized`, and
            // `roots/list_changed` (a call's roots are asked for when it needs them,
            // and a shared upstream session is never told one client's).
            Message::Notification { method, params } => {
                if method == "notifications/cancelled"
                    && let Some(id) = fields::cancelled_request(&params)
                {
                    self.gw.legacy.cancel(self.sid(), id);
                }
            }
            Message::Request { .. } => {}
        }
    }

    /// A request: `stream` when the answer may be an SSE stream (not in a batch),
    /// inside its server span (docs/design.md §24 "Operations").
    async fn request(
        &self,
        id: RequestId,
        method: &str,
        params: Map<String, Value>,
        stream: bool,
    ) -> Response<Body> {
        if !crate::telemetry::enabled() {
            return self.request_in_span(id, method, params, stream).await;
        }
        let meta = crate::protocol::TraceCarrier::of_params(&params);
        let span = crate::telemetry::server_span(crate::telemetry::Incoming {
            method,
            target: crate::telemetry::target_of(method, &params),
            protocol_version: &self.rec.protocol_version,
            session: Some(self.sid()),
            request_id: &id,
            headers: self.headers,
            meta: &meta,
        });
        crate::telemetry::record_principal_of(
            &span,
            &self.principal.tenant,
            &self.principal.subject,
        );
        self.request_in_span(id, method, params, stream)
            .instrument(span)
            .await
    }

    async fn request_in_span(
        &self,
        id: RequestId,
        method: &str,
        mut params: Map<String, Value>,
        stream: bool,
    ) -> Response<Body> {
        // The client's `_meta` is the gateway's business: only its progress token is
        // kept, and the upstream never sees it.
        let progress_token = params
            .remove("_meta")
            .and_then(|m| fields::progress_token(&m));
        let dialect = tasks::speaks_tasks(&self.rec.protocol_version);
        let only = match LegacyRequest::parse(method, params, dialect) {
            LegacyRequest::Shared(method, params) => {
                let req = Request {
                    id,
                    method,
                    params,
                    meta: RequestMeta {
                        protocol_version: self.rec.protocol_version.clone(),
                        caps: ClientCaps(self.rec.client_capabilities.clone()),
                        client_info: None,
                        log_level: None,
                        progress_token,
                        trace: Default::default(),
                    },
                    idempotency_key: None,
                };
                let ctx = Ctx {
                    gw: self.gw,
                    upstream: self.upstream,
                    principal: self.principal.clone(),
                    received: self.received,
                };
                let era = SessionAnswers {
                    s: self,
                    stream,
                    dialect,
                };
                return dispatch::serve(&ctx, req, &era).await;
            }
            LegacyRequest::Only(only) => Ok(only),
            LegacyRequest::NotFound { task_method } => Err(task_method),
        };
        // Every request counts against the principal's rate, as in the 2026 era.
        if let Err(t) = self.gw.limits.check_request(self.principal) {
            return throttled(&id, t);
        }
        match only {
            Ok(LegacyOnly::Ping) => call::json_answer(&id, json!({})),
            Ok(LegacyOnly::Initialize(_)) => {
                bad_request(Some(&id), "the session is initialized already")
            }
            Ok(LegacyOnly::SetLogLevel { level }) => self.set_level(&id, level).await,
            Ok(LegacyOnly::Subscribe { on, uri }) => self.subscribe(&id, uri, on).await,
            Ok(LegacyOnly::TaskResult(task)) => self.task_session().result(id, task).await,
            Ok(LegacyOnly::TaskList { cursor }) => self.task_session().list(&id, cursor).await,
            // The gateway's own tasks, never the upstream's: an upstream `tasks/list`
            // on a shared session would list other tenants' tasks. Sessions of an
            // earlier version have no task dialect (404, as before it existed).
            Err(true) => reply::rpc_error(
                StatusCode::NOT_FOUND,
                Some(&id),
                &RpcError::method_not_found(method),
            ),
            Err(false) => reply::rpc_error(
                StatusCode::OK,
                Some(&id),
                &RpcError::method_not_found(method),
            ),
        }
    }

    /// The upstream's identity, when it is up; else the failure to answer.
    async fn info(&self, id: &RequestId) -> Result<Arc<UpstreamInfo>, Response<Body>> {
        if let Some(refused) = reply::not_accepting(&self.gw.engine, Some(id)) {
            return Err(refused);
        }
        self.upstream.info().await.map_err(|e| {
            super::answer::upstream_failure(id, self.upstream.name(), &e).into_response()
        })
    }

    /// A call of this session held open until the upstream answers (`call.rs`).
    fn held(
        &self,
        id: RequestId,
        progress_token: Option<Value>,
        streaming: bool,
        mark_tools: bool,
    ) -> LegacyCall {
        LegacyCall {
            upstream: self.upstream.clone(),
            live: self.gw.legacy.clone(),
            session: self.sid().to_string(),
            id,
            progress_token,
            caps: ClientCaps(self.rec.client_capabilities.clone()),
            log_rank: self
                .rec
                .log_level
                .as_deref()
                .and_then(log_level_rank)
                .unwrap_or(DEFAULT_LOG_RANK),
            keepalive: self.gw.cfg.server.keepalive,
            streaming,
            mark_tools,
            sync_timeout: self.gw.cfg.tasks.sync_timeout,
            received: self.received,
            _activity: Box::new(self.gw.engine.sessions().activity(self.sid())),
        }
    }

    /// `logging/setLevel`: this session's level; the upstream is set to the most
    /// verbose level any session on its upstream session asked for.
    async fn set_level(&self, id: &RequestId, level: Field<String>) -> Response<Body> {
        let Some((level, rank)) = level
            .valid()
            .and_then(|l| log_level_rank(l).map(|r| (l.as_str(), r)))
        else {
            return invalid_params(id, "params.level must be a logging level");
        };
        let info = match self.info(id).await {
            Ok(i) => i,
            Err(r) => return r,
        };
        if !info.capabilities.contains_key("logging") {
            return reply::rpc_error(
                StatusCode::OK,
                Some(id),
                &RpcError::method_not_found("logging/setLevel"),
            );
        }
        let updated = self
            .gw
            .engine
            .sessions()
            .update(self.sid(), |r| {
                r.log_level = Some(level.to_string());
                true
            })
            .await;
        if let Err(e) = updated {
            return store_unavailable(Some(id), &e);
        }
        let scope = self.upstream.scope_of(self.scope());
        if let Some(apply) =
            self.gw
                .legacy
                .log_level(self.upstream.name(), &scope, self.sid(), Some(rank))
            && !aggregate::set_upstream_level(self.gw, self.upstream, self.scope(), apply).await
        {
            return reply::rpc_error(
                StatusCode::OK,
                Some(id),
                &RpcError::internal("the upstream did not accept the logging level"),
            );
        }
        call::json_answer(id, json!({}))
    }

    /// `resources/subscribe` / `resources/unsubscribe`: kept in the session record,
    /// and subscribed upstream once per resource whoever asked.
    async fn subscribe(&self, id: &RequestId, uri: Field<String>, on: bool) -> Response<Body> {
        let Some(uri) = uri.valid().map(String::as_str) else {
            return invalid_params(id, "params.uri must be a string");
        };
        let info = match self.info(id).await {
            Ok(i) => i,
            Err(r) => return r,
        };
        if !fields::can_subscribe_resources(&info.capabilities) {
            let m = if on {
                "resources/subscribe"
            } else {
                "resources/unsubscribe"
            };
            return reply::rpc_error(StatusCode::OK, Some(id), &RpcError::method_not_found(m));
        }
        let scope = self.upstream.scope_of(self.scope());
        let change = self
            .gw
            .legacy
            .subscription(self.upstream.name(), &scope, uri, self.sid(), on);
        let upstream_ok = match change {
            SubChange::First | SubChange::Last => {
                aggregate::subscribe_upstream(self.gw, self.upstream, self.scope(), uri, on).await
            }
            SubChange::Shared => true,
        };
        if !upstream_ok && on {
            self.gw
                .legacy
                .subscription(self.upstream.name(), &scope, uri, self.sid(), false);
            return reply::rpc_error(
                StatusCode::OK,
                Some(id),
                &RpcError::internal("the upstream did not accept the subscription"),
            );
        }
        let uri = uri.to_string();
        let updated = self
            .gw
            .engine
            .sessions()
            .update(self.sid(), move |r| {
                let has = r.subscriptions.contains(&uri);
                if on && !has {
                    r.subscriptions.push(uri.clone());
                    true
                } else if !on && has {
                    r.subscriptions.retain(|u| *u != uri);
                    true
                } else {
                    false
                }
            })
            .await;
        if let Err(e) = updated {
            return store_unavailable(Some(id), &e);
        }
        call::json_answer(id, json!({}))
    }
}

/// How a session's requests are answered where the eras differ (`dispatch.rs`): the
/// upstream's answers as sent, `-32601` with 200, the 2025-11-25 task dialect, the
/// session's held calls.
struct SessionAnswers<'a> {
    s: &'a Session<'a>,
    /// The answer may become an SSE stream (not in a batch).
    stream: bool,
    /// The session negotiated 2025-11-25.
    dialect: bool,
}

impl Answers for SessionAnswers<'_> {
    /// Only a session with the dialect has a `tasks/*` method that reaches here.
    fn declares_tasks(&self, _req: &ValidRequest) -> bool {
        true
    }

    fn missing_method_status(&self) -> StatusCode {
        StatusCode::OK
    }

    /// A 2025-11-25 task is the gateway's (docs/design.md §25); other versions have
    /// no task augmentation and ignore the field (MCP 2025-11-25 "Tasks", "Task
    /// Support and Handling"). Either way the upstream never sees it.
    fn caller(&self, req: &Request<ToolCallParams>) -> Caller {
        if self.dialect && req.params.task != Field::Absent {
            Caller::SessionTask
        } else {
            Caller::Session(self.s.sid().to_string())
        }
    }

    /// A session is plain unless it asked for a 2025-11-25 task (and for lists,
    /// always: docs/design.md §28).
    fn plain(&self, req: &ValidRequest) -> bool {
        !(self.dialect && matches!(&req.params, Params::ToolsCall(p) if p.task != Field::Absent))
    }

    fn input_caps(&self, _req: &Request<ToolCallParams>) -> ClientCaps {
        ClientCaps(self.s.rec.client_capabilities.clone())
    }

    /// The result as the upstream would have sent it.
    fn tool_result_envelope(&self) -> Envelope {
        |result, _| result
    }

    fn scope<'a>(&'a self, _principal: &'a Principal) -> Scope<'a> {
        self.s.scope()
    }

    fn session(&self) -> Option<String> {
        Some(self.s.sid().to_string())
    }

    /// The task tools are added after the dialect's marks: they never run as tasks
    /// themselves. A 2025-era list has no cache scope to set.
    fn tools_listed(
        &self,
        id: &RequestId,
        mut list: Value,
        _server_info: &Value,
        extra: Listed,
    ) -> Response<Body> {
        if self.dialect {
            tasks::mark_tools(&self.s.upstream.cfg, &mut list);
        }
        extra.append_to(&mut list);
        call::json_answer(id, list)
    }

    fn list_error(&self, e: RpcError) -> RpcError {
        e
    }

    fn sync_timed_out(&self, ctx: &Ctx<'_>, id: &RequestId) -> Final {
        call::sync_timeout_of(id, ctx.gw.cfg.tasks.sync_timeout)
    }

    async fn task_created(
        &self,
        _ctx: &Ctx<'_>,
        id: &RequestId,
        rec: &TaskRecord,
        _server_info: &Value,
    ) -> Response<Body> {
        self.s.task_session().created(id, rec).await
    }

    async fn held(&self, call: HeldCall<'_>) -> Response<Body> {
        let mark_tools = self.dialect && call.req.method == Method::ToolsList;
        let (req, _) = call.req.split();
        let c = self
            .s
            .held(req.id, req.meta.progress_token, self.stream, mark_tools);
        call::serve(c, call.pending, call.promote).await
    }

    async fn task_get(
        &self,
        _ctx: &Ctx<'_>,
        id: &RequestId,
        task: TaskRef,
        _info: &UpstreamInfo,
    ) -> Response<Body> {
        self.s.task_session().get(id, &task).await
    }

    async fn task_cancel(
        &self,
        _ctx: &Ctx<'_>,
        id: &RequestId,
        task: TaskRef,
        _info: &UpstreamInfo,
    ) -> Response<Body> {
        self.s.task_session().cancel(id, &task).await
    }
}

/// A batch member's answer as a JSON value (its response was built as JSON).
async fn answer_value(id: &RequestId, resp: Response<Body>) -> Value {
    use http_body_util::BodyExt;
    match resp.into_body().collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or_else(|_| {
            protocol::error_response(
                Some(id),
                &RpcError::new(error::INTERNAL_ERROR, "internal error"),
            )
        }),
        Err(_) => protocol::error_response(
            Some(id),
            &RpcError::new(error::INTERNAL_ERROR, "internal error"),
        ),
    }
}
