//! Multi round-trip requests (MCP 2026-07-28 "Multi Round-Trip Requests";
//! docs/design.md §2 "Clients without the tasks extension" and §5 "Input requests"):
//! how an upstream server→client request reaches a client that gets no task.
//!
//! The upstream call is *held* here (in memory, with its event channel and the answer
//! channels of its outstanding requests) while the client gets an
//! `input_required` result carrying an HMAC-protected `requestState`. The client's
//! retry presents that state; it is verified (signature, expiry, principal, upstream,
//! method and the original params) before the held call is resumed with the answers.
//! Tampered, expired or foreign state gets `-32602` and changes nothing. A held call
//! whose retry never comes is cancelled after `input_timeout_ms`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::events::Pending;
use crate::auth::Principal;
use crate::protocol::params::{Forward, UpstreamParams};
use crate::protocol::results::add_server_info;
use crate::protocol::task_shapes::{HeldRequest, InputAnswerShape};
use crate::protocol::{Method, RpcError};
use crate::store::now_ms;
use crate::upstream::{InputAnswer, InputRequest};

/// What a request must match for its `requestState` to be accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StateClaims {
    /// Hold id.
    h: String,
    /// Round (a new state per round, so a stale state cannot be replayed).
    r: u32,
    t: String,
    s: String,
    u: String,
    m: String,
    /// Fingerprint of the original params.
    f: String,
    /// Expiry, ms since the epoch.
    e: u64,
    /// The replica holding the call: a retry reaching another replica is relayed
    /// there (docs/design.md §19 "Any replica answers").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p: Option<String>,
}

struct Held {
    pending: Pending,
    claims: StateClaims,
    /// Outstanding requests by key: `{method, params}`.
    outstanding: Map<String, Value>,
    responders: HashMap<String, oneshot::Sender<InputAnswer>>,
    issued: u64,
}

/// Result of presenting a `requestState`.
pub enum Resumed {
    /// Every outstanding request was answered: carry on waiting for the call.
    Call(Pending),
    /// Answers are still missing: a fresh `input_required` result (MCP 2026-07-28
    /// "Multi Round-Trip Requests").
    StillWaiting(Value),
    /// A valid state for a call another replica holds: relay the retry to it.
    Elsewhere(String),
}

/// The held calls of this process.
pub struct Holds {
    key: aws_lc_rs::hmac::Key,
    /// This replica's id, named in every state it signs.
    replica_id: Option<String>,
    input_timeout: Duration,
    held: Mutex<HashMap<String, Held>>,
}

/// Params minus `_meta` and the MRTR fields, fingerprinted to bind a state to its
/// request. States already issued carry this value: its input never changes.
pub fn params_fingerprint(method: Method, params: &UpstreamParams) -> String {
    super::fingerprint::fingerprint(&serde_json::json!({
        "method": method.as_str(),
        "params": Value::Object(params.as_map().clone()),
    }))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn random_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b64(&b)
}

fn invalid_state() -> RpcError {
    RpcError::invalid_params("invalid or expired requestState")
}

/// Whether an answer has the shape its request kind needs.
fn answer_is_valid(request: &Value, answer: &Value) -> bool {
    if !answer.is_object() {
        return false;
    }
    let shape = InputAnswerShape::read(answer);
    match HeldRequest::read(request).method {
        Some("elicitation/create") => {
            matches!(shape.action, Some("accept" | "decline" | "cancel"))
        }
        Some("roots/list") => shape.has_roots,
        Some("sampling/createMessage") => shape.has_content,
        _ => true,
    }
}

impl Holds {
    /// `replica_id` names this replica in the states it signs, so that another
    /// replica sharing the secret can relay a retry here (`None`: one gateway).
    pub fn new(secret: [u8; 32], input_timeout: Duration, replica_id: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            key: aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &secret),
            replica_id,
            input_timeout,
            held: Mutex::new(HashMap::new()),
        })
    }

    fn sign(&self, claims: &StateClaims) -> String {
        let payload = serde_json::to_vec(claims).unwrap_or_default();
        let tag = aws_lc_rs::hmac::sign(&self.key, &payload);
        format!("{}.{}", b64(&payload), b64(tag.as_ref()))
    }

    fn verify(&self, state: &str) -> Option<StateClaims> {
        let (payload, tag) = state.split_once('.')?;
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .ok()?;
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(tag)
            .ok()?;
        aws_lc_rs::hmac::verify(&self.key, &payload, &tag).ok()?;
        serde_json::from_slice(&payload).ok()
    }

    fn input_required(&self, held: &Held, server_info: &Value) -> Value {
        let mut m = Map::new();
        m.insert("resultType".into(), Value::from("input_required"));
        m.insert(
            "inputRequests".into(),
            Value::Object(held.outstanding.clone()),
        );
        m.insert("requestState".into(), Value::from(self.sign(&held.claims)));
        add_server_info(&mut m, server_info);
        Value::Object(m)
    }

    fn add_inputs(held: &mut Held, batch: Vec<InputRequest>) {
        for ir in batch {
            held.issued += 1;
            let kind = ir.method.split('/').next().unwrap_or("input");
            let key = format!("{kind}-{}", held.issued);
            let mut req = Map::new();
            req.insert("method".into(), Value::from(ir.method));
            if let Some(mut params) = ir.params {
                if let Some(p) = params.as_object_mut() {
                    p.remove("elicitationId");
                }
                req.insert("params".into(), params);
            }
            held.outstanding.insert(key.clone(), Value::Object(req));
            held.responders.insert(key, ir.respond);
        }
    }

    /// Hold `pending` with its first input requests and return the
    /// `input_required` result for the client.
    #[allow(clippy::too_many_arguments)]
    pub fn hold(
        self: &Arc<Self>,
        pending: Pending,
        batch: Vec<InputRequest>,
        principal: &Principal,
        upstream: &str,
        method: Method,
        params: &impl AsRef<Forward>,
        server_info: &Value,
    ) -> Value {
        let claims = StateClaims {
            h: random_id(),
            r: 1,
            t: principal.tenant.clone(),
            s: principal.subject.clone(),
            u: upstream.to_string(),
            m: method.as_str().to_string(),
            f: params_fingerprint(method, &params.as_ref().upstream),
            e: now_ms() + self.input_timeout.as_millis() as u64,
            p: self.replica_id.clone(),
        };
        let mut held = Held {
            pending,
            claims,
            outstanding: Map::new(),
            responders: HashMap::new(),
            issued: 0,
        };
        Self::add_inputs(&mut held, batch);
        let result = self.input_required(&held, server_info);
        self.store_held(held);
        result
    }

    fn store_held(self: &Arc<Self>, held: Held) {
        let id = held.claims.h.clone();
        let round = held.claims.r;
        {
            let mut map = self.held.lock();
            map.insert(id.clone(), held);
        }
        // A retry may never come (MCP 2026-07-28 "Multi Round-Trip Requests"): cancel
        // the held call after the timeout.
        let holds = self.clone();
        let timeout = self.input_timeout;
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let expired = {
                let mut map = holds.held.lock();
                if map.get(&id).is_some_and(|h| h.claims.r == round) {
                    map.remove(&id)
                } else {
                    None
                }
            };
            if let Some(h) = expired {
                tracing::info!(hold = %id, "MRTR retry did not arrive within input_timeout_ms; cancelling the upstream call");
                h.pending.abort();
            }
        });
    }

    /// Verify a retry's `requestState` and resume (or re-ask for) the held call.
    pub fn resume(
        self: &Arc<Self>,
        state: &str,
        principal: &Principal,
        upstream: &str,
        method: Method,
        params: &Forward,
        server_info: &Value,
    ) -> Result<Resumed, RpcError> {
        let claims = self.verify(state).ok_or_else(invalid_state)?;
        let matches = claims.t == principal.tenant
            && claims.s == principal.subject
            && claims.u == upstream
            && claims.m == method.as_str()
            && claims.f == params_fingerprint(method, &params.upstream)
            && claims.e > now_ms();
        if !matches {
            return Err(invalid_state());
        }
        let mut held = {
            let mut map = self.held.lock();
            match (map.get(&claims.h), &claims.p) {
                (Some(h), _) if h.claims.r == claims.r => {}
                (None, Some(p)) if Some(p) != self.replica_id.as_ref() => {
                    return Ok(Resumed::Elsewhere(p.clone()));
                }
                _ => return Err(invalid_state()),
            }
            map.remove(&claims.h).ok_or_else(invalid_state)?
        };
        // Malformed answers count as none: the round is asked again.
        let responses = params
            .mrtr
            .input_responses
            .valid()
            .cloned()
            .unwrap_or_default();
        for (key, answer) in responses {
            let valid = held
                .outstanding
                .get(&key)
                .is_some_and(|req| answer_is_valid(req, &answer));
            if valid {
                held.outstanding.remove(&key);
                if let Some(tx) = held.responders.remove(&key) {
                    let _ = tx.send(InputAnswer::Result(answer));
                }
            }
        }
        if held.outstanding.is_empty() {
            return Ok(Resumed::Call(held.pending));
        }
        held.claims.r += 1;
        held.claims.e = now_ms() + self.input_timeout.as_millis() as u64;
        let result = self.input_required(&held, server_info);
        self.store_held(held);
        Ok(Resumed::StillWaiting(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_signature_round_trip_and_tamper() {
        let holds = Holds::new([7u8; 32], Duration::from_secs(1), None);
        let c = StateClaims {
            h: "x".into(),
            r: 1,
            t: "t".into(),
            s: "s".into(),
            u: "u".into(),
            m: "tools/call".into(),
            f: "f".into(),
            e: 1,
            p: None,
        };
        let s = holds.sign(&c);
        assert_eq!(holds.verify(&s), Some(c));
        assert!(holds.verify(&format!("{s}-TAMPERED")).is_none());
        let other = Holds::new([8u8; 32], Duration::from_secs(1), None);
        assert!(other.verify(&s).is_none());
    }

    /// A `requestState` binds the fingerprint of its request's params, and a task's
    /// idempotency record the fingerprint of its arguments: both are stored, so their
    /// values must never change (pinned from the code before typed params).
    #[test]
    fn fingerprints_are_pinned() {
        let body = r#"{"name":"echo","requestState":"s","arguments":{"b":[1.50,-0,1e999,1234567890123456789012345678901234567890],"a":{"z":null}},"inputResponses":{"k":{"action":"accept"}},"zeta":true}"#;
        let params: Map<String, Value> = serde_json::from_str(body).unwrap();
        let call = crate::protocol::params::ToolCallParams::parse(params);
        assert_eq!(
            params_fingerprint(Method::ToolsCall, &call.fwd.upstream),
            "c86e3567b3989838eb1a697dc7f724cdc3ecdd6ef011d9272dd2445aca1d07ef"
        );
        assert_eq!(
            super::super::tool_call::arguments_fingerprint(&call),
            "33a81f60a8b75d0185a3b9913cdf3a3706a6fe209530d03e40b59b311dd265a6"
        );
        let bare = crate::protocol::params::ToolCallParams::parse(
            serde_json::from_str(r#"{"name":"echo"}"#).unwrap(),
        );
        assert_eq!(
            super::super::tool_call::arguments_fingerprint(&bare),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn answer_shapes() {
        let el = serde_json::json!({"method": "elicitation/create"});
        assert!(answer_is_valid(
            &el,
            &serde_json::json!({"action": "accept", "content": {}})
        ));
        assert!(!answer_is_valid(&el, &serde_json::json!(12345)));
        assert!(!answer_is_valid(
            &el,
            &serde_json::json!({"action": "maybe"})
        ));
    }
}
