//! The spans of the request path, named and attributed after the OpenTelemetry MCP
//! semantic conventions (docs/design.md §24 "Operations"): a server span per request,
//! a client span per upstream call, and a promoted task's settle span. Tool arguments,
//! results, input answers and tokens are never recorded; the tenant and subject only
//! with `record_principal`.

use http::HeaderMap;
use opentelemetry::trace::{Status, TraceContextExt};
use serde_json::{Map, Value};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::propagate::{context_of_carrier, context_of_headers};
use super::{TARGET, enabled, records_principal};
use crate::protocol::{Method, TraceCarrier};

/// What a server span is made of: the request as it arrived.
pub struct Incoming<'a> {
    pub method: &'a str,
    /// The tool, prompt or resource the request names (span name `{method} {target}`).
    pub target: Option<&'a str>,
    pub protocol_version: &'a str,
    /// The 2025-era session (`Mcp-Session-Id`).
    pub session: Option<&'a str>,
    pub request_id: &'a Value,
    pub headers: &'a HeaderMap,
    pub meta: &'a TraceCarrier,
}

/// The method a request names, when it is one the gateway serves (its target field,
/// the task methods aside: a task id is no span target).
fn served(method: &str) -> Option<(Method, &'static str)> {
    let m = Method::from_wire_bytes(method.as_bytes())?;
    let field = m.name_field()?;
    (!m.is_task_method()).then_some((m, field))
}

/// The target of a request after the conventions: the tool or prompt name, or the
/// resource URI.
pub fn target_of<'a>(method: &str, params: &'a Map<String, Value>) -> Option<&'a str> {
    let (_, field) = served(method)?;
    params.get(field).and_then(Value::as_str)
}

fn span_name(method: &str, target: Option<&str>) -> String {
    match target {
        Some(t) => format!("{method} {t}"),
        None => method.to_string(),
    }
}

fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The span of one request, child of the context in its `traceparent` header, else
/// of the one in its `_meta`; a `_meta` context that differs from the header's is a
/// link. `Span::none()` while traces are off.
pub fn server_span(i: Incoming<'_>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "mcp.server",
        otel.name = span_name(i.method, i.target),
        otel.kind = "server",
        mcp.method.name = i.method,
        mcp.protocol.version = i.protocol_version,
        jsonrpc.request.id = id_text(i.request_id),
        network.transport = "tcp",
    );
    if let Some(s) = i.session {
        span.set_attribute("mcp.session.id", s.to_string());
    }
    name_target(&span, i.method, i.target);
    let from_header = context_of_headers(i.headers);
    let from_meta = context_of_carrier(i.meta);
    match (from_header, from_meta) {
        (Some(h), meta) => {
            if let Some(m) = meta
                && m.span().span_context() != h.span().span_context()
            {
                span.add_link(m.span().span_context().clone());
            }
            let _ = span.set_parent(h);
        }
        (None, Some(m)) => {
            let _ = span.set_parent(m);
        }
        (None, None) => {}
    }
    span
}

fn name_target(span: &Span, method: &str, target: Option<&str>) {
    let (Some(t), Some((m, _))) = (target, served(method)) else {
        return;
    };
    match m {
        Method::ToolsCall => {
            span.set_attribute("gen_ai.tool.name", t.to_string());
            span.set_attribute("gen_ai.operation.name", "execute_tool");
        }
        Method::PromptsGet => span.set_attribute("gen_ai.prompt.name", t.to_string()),
        _ => span.set_attribute("mcp.resource.uri", t.to_string()),
    }
}

/// The edge's span of one proxied request, from its headers only (the edge never
/// reads bodies): child of the `traceparent` header's context, or a new trace.
pub fn edge_span(method: Option<&str>, target: Option<&str>, headers: &HeaderMap) -> Span {
    if !enabled() {
        return Span::none();
    }
    let m = method.unwrap_or("POST");
    // `Mcp-Name` names a task on the tasks methods: not a span target.
    let target = target.filter(|_| served(m).is_some());
    let span = tracing::info_span!(
        target: TARGET,
        "mcp.edge",
        otel.name = span_name(m, target),
        otel.kind = "server",
        network.transport = "tcp",
    );
    if let Some(m) = method {
        span.set_attribute("mcp.method.name", m.to_string());
        name_target(&span, m, target);
    }
    if let Some(cx) = context_of_headers(headers) {
        let _ = span.set_parent(cx);
    }
    span
}

/// The HTTP status a span's request was answered with; 5xx marks it failed.
pub fn record_http_status(span: &Span, status: u16) {
    if span.is_none() {
        return;
    }
    span.set_attribute("http.response.status_code", i64::from(status));
    if status >= 500 || status == 0 {
        record_error(span, &status.to_string());
    }
}

/// The span of one call to an upstream, child of the current span.
pub fn client_span(
    method: &str,
    target: Option<&str>,
    upstream: &str,
    transport: &'static str,
) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "mcp.client",
        otel.name = span_name(method, target),
        otel.kind = "client",
        mcp.method.name = method,
        taskgate.upstream = upstream,
        network.transport = transport,
    );
    name_target(&span, method, target);
    span
}

/// Spawn `fut` in the current span when traces are on, so what it opens (the
/// upstream call's client span) is a child of the request's span. While traces are
/// off the future is spawned bare: the task is then the very future it was without
/// traces (benches/hotpath/run.sh counts inside it by its name).
pub fn spawn_in_current_span<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    if enabled() {
        tokio::spawn(tracing::Instrument::instrument(fut, Span::current()))
    } else {
        tokio::spawn(fut)
    }
}

/// The `traceparent` of the current span, to keep with a task created inside it.
pub fn current_traceparent() -> Option<String> {
    if !enabled() {
        return None;
    }
    super::propagate::carrier_of(&Span::current()).traceparent
}

/// Mark `span` failed with `error_type` (a JSON-RPC code, `tool_error`, `timeout`, …).
pub fn record_error(span: &Span, error_type: &str) {
    if span.is_none() {
        return;
    }
    span.set_attribute("error.type", error_type.to_string());
    span.set_status(Status::error(error_type.to_string()));
}

/// A JSON-RPC error answered inside the current span.
pub fn record_rpc_error(code: i64) {
    if !enabled() {
        return;
    }
    let span = Span::current();
    if span.is_none() {
        return;
    }
    span.set_attribute("rpc.response.status_code", code.to_string());
    record_error(&span, &code.to_string());
}

/// The tenant and subject on `span`, when `record_principal` allows.
pub fn record_principal_of(span: &Span, tenant: &str, subject: &str) {
    if span.is_none() || !records_principal() {
        return;
    }
    span.set_attribute("taskgate.tenant", tenant.to_string());
    span.set_attribute("enduser.id", subject.to_string());
}

/// Link the current span to the creation span of a task (`traceparent` kept with
/// its record).
pub fn link_creation(traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    if !enabled() {
        return;
    }
    let span = Span::current();
    if let Some(cx) = creation_context(tp) {
        span.add_link(cx.span().span_context().clone());
    }
}

fn creation_context(traceparent: &str) -> Option<opentelemetry::Context> {
    context_of_carrier(&TraceCarrier {
        traceparent: Some(traceparent.to_string()),
        ..Default::default()
    })
}

/// The span of a task turning terminal: in the creation's trace (child of its span,
/// and linked to it), on whichever replica settles it. Ended when dropped.
pub fn settle_span(task_id: &str, status: &str, creation: Option<&str>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "task.settle",
        otel.name = "task settle",
        otel.kind = "internal",
        taskgate.task.id = task_id,
        taskgate.task.status = status,
    );
    if let Some(cx) = creation.and_then(creation_context) {
        span.add_link(cx.span().span_context().clone());
        let _ = span.set_parent(cx);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_follow_the_conventions() {
        let p = json!({"name": "build", "uri": "file:///a"});
        let p = p.as_object().cloned().unwrap_or_default();
        assert_eq!(target_of("tools/call", &p), Some("build"));
        assert_eq!(target_of("resources/read", &p), Some("file:///a"));
        assert_eq!(target_of("tasks/get", &p), None);
        assert_eq!(span_name("tools/call", Some("build")), "tools/call build");
        assert_eq!(span_name("tasks/get", None), "tasks/get");
        assert_eq!(id_text(&json!("a")), "a");
        assert_eq!(id_text(&json!(7)), "7");
    }

    #[test]
    fn spans_are_none_while_traces_are_off() {
        assert!(client_span("tools/call", None, "u", "pipe").is_none());
        assert!(settle_span("t", "completed", None).is_none());
    }
}
