//! What differs between the eras once a request is typed (docs/design.md §22
//! "Clients of the 2025 era"): the one dispatch (`dispatch.rs`) and the task tools
//! (`task_tools/`) serve a request through [`Answers`], which `dispatch::Modern` and
//! the session's answers in `legacy/` implement, with the request's [`Ctx`].

use std::future::Future;
use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::Value;
use tokio::time::Instant;

use super::answer::Final;
use super::gateway::Gateway;
use super::reply::Body;
use super::wire::ValidRequest;
use crate::auth::Principal;
use crate::protocol::meta::ClientCaps;
use crate::protocol::params::{Forward, TaskRef, ToolCallParams};
use crate::protocol::{Request, RequestId, RpcError};
use crate::store::TaskRecord;
use crate::tasks::{Caller, Pending};
use crate::upstream::{Scope, Upstream, UpstreamInfo};

/// What a request is served with: the gateway, the upstream of its path, the
/// principal, and when the HTTP request arrived (the start of `sync_timeout_ms`,
/// docs/design.md §2 "Clients without the tasks extension").
pub(super) struct Ctx<'a> {
    pub(super) gw: &'a Gateway,
    pub(super) upstream: &'a Arc<Upstream>,
    pub(super) principal: Principal,
    pub(super) received: Instant,
}

/// A started call to answer on its request (the one held-call responder, `held.rs`).
pub(super) struct HeldCall<'a> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) req: Request<Forward>,
    pub(super) pending: Pending,
    pub(super) server_info: Value,
    /// The deadline of a call that becomes a task then (docs/design.md §28).
    pub(super) promote: Option<super::held::Deadline>,
}

/// Writes a `CallToolResult` the gateway made as an era answers a `tools/call`, given
/// the upstream's `serverInfo`.
pub(super) type Envelope = fn(Value, &Value) -> Value;

/// What a `tools/list` answer adds to the upstream's first page (docs/design.md §28).
#[derive(Default)]
pub(super) struct Listed {
    /// Tools after the upstream's own (the task tools of a plain client).
    pub(super) tools: Vec<Value>,
    /// The list differs by client kind: never for a shared cache.
    pub(super) private: bool,
}

impl Listed {
    /// Append [`Listed::tools`] to a `tools/list` result.
    pub(super) fn append_to(&self, list: &mut Value) {
        if let Some(tools) = list.get_mut("tools").and_then(Value::as_array_mut) {
            tools.extend(self.tools.iter().cloned());
        }
    }
}

/// What differs between the eras once a request is typed: how a few answers are
/// written, and who the caller is to the engine.
pub(super) trait Answers: Send + Sync {
    /// Whether the caller may use the tasks methods (a 2026 client declares the
    /// extension on each request; a session speaks the 2025-11-25 dialect by its
    /// version, and no other session's request reaches here as one).
    fn declares_tasks(&self, req: &ValidRequest) -> bool;
    /// The HTTP status of `-32601` for a method the upstream does not declare.
    fn missing_method_status(&self) -> StatusCode;
    /// Who calls a tool ([`Caller`]).
    fn caller(&self, req: &Request<ToolCallParams>) -> Caller;
    /// Whether the caller cannot take a task (docs/design.md §2): what it is answered
    /// with at a call's deadline, and whether its lists carry the task tools (§28).
    fn plain(&self, req: &ValidRequest) -> bool;
    /// What the client declared it can be asked (elicitation, sampling, roots).
    fn input_caps(&self, req: &Request<ToolCallParams>) -> ClientCaps;
    /// How this era writes a `tools/call` result the gateway made itself (a task
    /// tool's answer, a handle) around the `CallToolResult`.
    fn tool_result_envelope(&self) -> Envelope;
    /// The upstream session a call or the cached `tools/list` is made in.
    fn scope<'a>(&'a self, principal: &'a Principal) -> Scope<'a>;
    /// The 2025-era session a call is made for (it picks the upstream session).
    fn session(&self) -> Option<String>;
    /// The cached first page of `tools/list` as this era answers it, with `extra` (the
    /// task tools, docs/design.md §28) after the upstream's tools; `private` when the
    /// list differs by client kind.
    fn tools_listed(
        &self,
        id: &RequestId,
        list: Value,
        server_info: &Value,
        extra: Listed,
    ) -> Response<Body>;
    /// An upstream's error answer to `tools/list`, as this era passes it on.
    fn list_error(&self, e: RpcError) -> RpcError;
    /// `sync_timeout_ms` passed before the upstream answered.
    fn sync_timed_out(&self, ctx: &Ctx<'_>, id: &RequestId) -> Final;
    /// A tool call the engine made a task, durable.
    fn task_created(
        &self,
        ctx: &Ctx<'_>,
        id: &RequestId,
        rec: &TaskRecord,
        server_info: &Value,
    ) -> impl Future<Output = Response<Body>> + Send;
    /// A started call, answered on its request.
    fn held(&self, call: HeldCall<'_>) -> impl Future<Output = Response<Body>> + Send;
    /// `tasks/get`, after the poll limiter.
    fn task_get(
        &self,
        ctx: &Ctx<'_>,
        id: &RequestId,
        task: TaskRef,
        info: &UpstreamInfo,
    ) -> impl Future<Output = Response<Body>> + Send;
    /// `tasks/cancel`.
    fn task_cancel(
        &self,
        ctx: &Ctx<'_>,
        id: &RequestId,
        task: TaskRef,
        info: &UpstreamInfo,
    ) -> impl Future<Output = Response<Body>> + Send;
}
