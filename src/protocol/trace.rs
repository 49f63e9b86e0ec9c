//! The W3C trace context as MCP carries it in `params._meta` (SEP-414): the same three
//! keys as the HTTP headers (`traceparent`, `tracestate`, `baggage`). Plain strings
//! here; `telemetry` parses them (docs/design.md §24 "Operations").

use serde_json::{Map, Value};

/// The keys, in the order they are written.
pub const TRACE_KEYS: [&str; 3] = ["traceparent", "tracestate", "baggage"];

/// A trace context as text, from a `_meta` object or for one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceCarrier {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub baggage: Option<String>,
}

impl TraceCarrier {
    /// The string values of the three keys of `meta`; anything else is ignored (a
    /// malformed context is no reason to refuse a request).
    pub fn from_meta(meta: &Map<String, Value>) -> Self {
        let get = |k: &str| meta.get(k).and_then(Value::as_str).map(str::to_string);
        Self {
            traceparent: get(TRACE_KEYS[0]),
            tracestate: get(TRACE_KEYS[1]),
            baggage: get(TRACE_KEYS[2]),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.traceparent.is_none()
    }

    /// The value of one key.
    pub fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "tracestate" => self.tracestate.as_deref(),
            "baggage" => self.baggage.as_deref(),
            _ => None,
        }
    }

    /// Set one key (unknown keys are ignored).
    pub fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" => self.tracestate = Some(value),
            "baggage" => self.baggage = Some(value),
            _ => {}
        }
    }

    /// The keys that are set, with their values.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        TRACE_KEYS
            .into_iter()
            .filter_map(|k| self.get(k).map(|v| (k, v)))
    }

    /// Write the keys into the `_meta` of `params`, replacing any the caller sent:
    /// what goes upstream names the gateway's span, not the client's.
    pub fn write_into_params(&self, params: &mut Map<String, Value>) {
        if self.is_empty() {
            return;
        }
        with_meta(params, |m| {
            for k in TRACE_KEYS {
                m.remove(k);
            }
            for (k, v) in self.pairs() {
                m.insert(k.into(), Value::String(v.to_string()));
            }
        });
    }

    /// The carrier in the `_meta` of `params`, if any.
    pub fn of_params(params: &Map<String, Value>) -> Self {
        params
            .get("_meta")
            .and_then(Value::as_object)
            .map(Self::from_meta)
            .unwrap_or_default()
    }
}

/// Edit the `_meta` object of `params`, created (or replacing a non-object) if
/// needed: what the gateway adds upstream (trace context, progress token) goes next
/// to whatever is there.
pub fn with_meta(params: &mut Map<String, Value>, edit: impl FnOnce(&mut Map<String, Value>)) {
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Some(m) = meta.as_object_mut() {
        edit(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_through_params_and_replaces_the_callers_keys() {
        let mut params =
            json!({"name": "t", "_meta": {"traceparent": "client", "progressToken": 7}});
        let carrier = TraceCarrier {
            traceparent: Some("00-aa-bb-01".into()),
            tracestate: None,
            baggage: Some("k=v".into()),
        };
        if let Value::Object(p) = &mut params {
            carrier.write_into_params(p);
            assert_eq!(TraceCarrier::of_params(p), carrier);
        }
        assert_eq!(params["_meta"]["progressToken"], 7);
        assert!(params["_meta"].get("tracestate").is_none());
    }

    #[test]
    fn non_strings_are_ignored() {
        let meta = json!({"traceparent": 5, "baggage": "a=b"});
        let c = meta
            .as_object()
            .map(TraceCarrier::from_meta)
            .unwrap_or_default();
        assert!(c.is_empty());
        assert_eq!(c.baggage.as_deref(), Some("a=b"));
    }
}
