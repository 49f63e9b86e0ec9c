//! OpenTelemetry traces (docs/design.md §24 "Operations"): the exporter
//! (`export.rs`), W3C context in headers and in `params._meta` (`propagate.rs`), and
//! the spans the request path opens (`spans.rs`). Off unless `[telemetry]` names a
//! collector; while off, every span here is `Span::none()` and costs a relaxed load.

mod export;
mod propagate;
mod spans;

use std::sync::atomic::{AtomicBool, Ordering};

pub use export::{Telemetry, TelemetryError, start};
pub use propagate::{carrier_of, context_of_carrier, context_of_headers, insert_headers};
pub use spans::{
    Incoming, client_span, current_traceparent, edge_span, link_creation, record_error,
    record_http_status, record_principal_of, record_rpc_error, server_span, settle_span,
    spawn_in_current_span, target_of,
};

/// The `tracing` target of the spans exported as OpenTelemetry spans; log lines
/// never show them.
pub const TARGET: &str = "taskgate::otel";

static ENABLED: AtomicBool = AtomicBool::new(false);
static RECORD_PRINCIPAL: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

pub(crate) fn set_record_principal(on: bool) {
    RECORD_PRINCIPAL.store(on, Ordering::Relaxed);
}

fn records_principal() -> bool {
    RECORD_PRINCIPAL.load(Ordering::Relaxed)
}
