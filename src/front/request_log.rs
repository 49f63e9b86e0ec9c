//! One log line and one metrics sample per request on an upstream's path that passed
//! Origin/Host (README "Limits and metrics"). Never logs tokens.

use std::time::Instant;

use super::stack::{LogFields, Received, Req, Resp, Step, Target};

/// Times the request, hands the steps after it a [`LogFields`] to fill, and writes the
/// line once the response is ready.
#[derive(Clone, Copy)]
pub(super) struct RequestLog;

/// What the line needs from the request.
pub(super) struct Started {
    at: Instant,
    upstream: String,
    fields: LogFields,
}

impl Step for RequestLog {
    type Kept = Started;

    fn before(&self, req: &mut Req) -> Result<Started, Resp> {
        let at = Instant::now();
        let fields = LogFields::default();
        let upstream = req
            .extensions()
            .get::<Target>()
            .map(|t| t.0.name().to_string())
            .unwrap_or_default();
        req.extensions_mut().insert(fields.clone());
        req.extensions_mut().insert(Received(at.into()));
        Ok(Started {
            at,
            upstream,
            fields,
        })
    }

    fn after(&self, started: Started, resp: &mut Resp) {
        let status = resp.status().as_u16();
        let elapsed = started.at.elapsed();
        let log = started.fields.snapshot();
        let method = log.method.map_or("-", crate::protocol::Method::as_str);
        crate::metrics::request(method, status, elapsed);
        tracing::info!(
            target: "taskgate::request",
            upstream = %started.upstream,
            method,
            tenant = log.tenant.as_deref().unwrap_or("-"),
            subject = log.subject.as_deref().unwrap_or("-"),
            task = log.task_id.as_deref().unwrap_or("-"),
            status,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "request"
        );
    }
}
