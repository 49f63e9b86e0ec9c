//! Upstream input requests (elicitation, sampling, roots) while a call is answered
//! inline or raced against its promotion deadline: which the client can be asked
//! (gathering those that arrive together is the call's event loop,
//! `src/tasks/events.rs`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::protocol::meta::InputKind;
use crate::protocol::params::Forward;
use crate::protocol::task_shapes::ElicitationParams;
use crate::protocol::{ClientCaps, Method, RpcError};
use crate::upstream::{CallSpec, InputAnswer, InputRequest};

/// Timing knobs for one inline call.
#[derive(Debug, Clone, Copy)]
pub struct InlineTiming {
    pub keepalive: Duration,
    pub sync_timeout: Duration,
}

/// Answer here the input requests a 2025-era client did not declare what they need
/// for, as an SDK client without the capability would (roots: an empty list; the
/// others: `-32601`), and give back the rest to relay (docs/design.md §22, §25). A
/// 2026 client is refused instead ([`screen`]): its capabilities travel with every
/// request.
pub fn answer_undeclared(caps: &ClientCaps, batch: Vec<InputRequest>) -> Vec<InputRequest> {
    batch
        .into_iter()
        .filter_map(|ir| {
            let kind = InputKind::of_method(&ir.method);
            if kind.is_none() || missing_capability(caps, &ir.method, ir.params.as_ref()).is_none()
            {
                return Some(ir);
            }
            let answer = if kind == Some(InputKind::Roots) {
                InputAnswer::Result(json!({ "roots": [] }))
            } else {
                InputAnswer::Error(RpcError::method_not_found(&ir.method))
            };
            let _ = ir.respond.send(answer);
            None
        })
        .collect()
}

/// The `requiredCapabilities` an input request needs that `caps` lacks, if any.
pub fn missing_capability(
    caps: &ClientCaps,
    method: &str,
    params: Option<&Value>,
) -> Option<RpcError> {
    let kind = InputKind::of_method(method)?;
    if !caps.declares(kind) {
        return Some(RpcError::missing_capability(
            format!(
                "the upstream needs the client capability `{}`",
                kind.capability()
            ),
            json!({ kind.capability(): {} }),
        ));
    }
    if kind == InputKind::Elicitation {
        let mode = params
            .and_then(|p| ElicitationParams::read(p).mode)
            .unwrap_or("form");
        if !caps.elicitation_allows_mode(mode) {
            return Some(RpcError::missing_capability(
                format!("the upstream needs elicitation mode `{mode}`"),
                json!({ "elicitation": { mode: {} } }),
            ));
        }
    }
    None
}

/// What to do with the upstream's input requests.
pub enum InputVerdict {
    /// The client did not declare a kind: cancel and answer `-32021`.
    Missing(RpcError),
    /// Relay them to the client as MRTR `input_required`.
    Relay(Vec<InputRequest>),
    /// Not relayable for this method: answered upstream with an error.
    Refused,
}

/// Screen a batch of upstream input requests for a client with `caps`, during a
/// `method` request (only some may return `input_required`). The requests it does not
/// relay are answered upstream with an error here.
pub fn screen(
    caps: &ClientCaps,
    method: Method,
    upstream: &str,
    batch: Vec<InputRequest>,
) -> InputVerdict {
    if let Some(err) = batch
        .iter()
        .find_map(|ir| missing_capability(caps, &ir.method, ir.params.as_ref()))
    {
        refuse(batch, "the client did not declare this capability");
        return InputVerdict::Missing(err);
    }
    if !method.is_mrtr_eligible() {
        tracing::warn!(upstream, method = %method, "upstream input request during a method that cannot return input_required");
        refuse(batch, "this request cannot ask the client for input");
        return InputVerdict::Refused;
    }
    InputVerdict::Relay(batch)
}

fn refuse(batch: Vec<InputRequest>, why: &str) {
    for ir in batch {
        let _ = ir.respond.send(InputAnswer::Error(RpcError::internal(why)));
    }
}

/// The upstream request for a `method` request: its params minus `_meta` and the
/// MRTR fields, which are the gateway's business, never the upstream's.
pub fn upstream_spec(method: Method, fwd: &Forward, want_progress: bool) -> CallSpec {
    CallSpec {
        method: method.as_str().to_string(),
        tool: fwd.upstream.name().map(str::to_string),
        params: fwd.upstream.as_map().clone(),
        want_progress,
        tenant: None,
        session: None,
    }
}
