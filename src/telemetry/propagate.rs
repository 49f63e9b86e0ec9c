//! W3C trace context (`traceparent`, `tracestate`) and baggage, read from and written
//! to HTTP headers and the `_meta` carrier of `protocol::trace`.

use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::protocol::TraceCarrier;
use crate::protocol::trace::TRACE_KEYS;

fn propagator() -> &'static TextMapCompositePropagator {
    static P: OnceLock<TextMapCompositePropagator> = OnceLock::new();
    P.get_or_init(|| {
        TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ])
    })
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        TRACE_KEYS
            .into_iter()
            .filter(|k| self.0.contains_key(*k))
            .collect()
    }
}

struct Carrier<'a>(&'a TraceCarrier);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.pairs().map(|(k, _)| k).collect()
    }
}

struct Writer<'a>(&'a mut TraceCarrier);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.set(key, value);
    }
}

/// The remote context a valid `traceparent` in `headers` names.
pub fn context_of_headers(headers: &HeaderMap) -> Option<Context> {
    valid(propagator().extract(&Headers(headers)))
}

/// The remote context a valid `traceparent` in `carrier` names.
pub fn context_of_carrier(carrier: &TraceCarrier) -> Option<Context> {
    if carrier.is_empty() {
        return None;
    }
    valid(propagator().extract(&Carrier(carrier)))
}

fn valid(cx: Context) -> Option<Context> {
    cx.span().span_context().is_valid().then_some(cx)
}

/// The context of `span` as the keys that carry it on (empty for a disabled span).
pub fn carrier_of(span: &tracing::Span) -> TraceCarrier {
    let mut out = TraceCarrier::default();
    if span.is_none() {
        return out;
    }
    propagator().inject_context(&span.context(), &mut Writer(&mut out));
    out
}

/// Set the carrier's keys as HTTP headers, replacing any already there.
pub fn insert_headers(carrier: &TraceCarrier, headers: &mut HeaderMap) {
    for (k, v) in carrier.pairs() {
        if let Ok(v) = HeaderValue::from_str(v) {
            headers.insert(HeaderName::from_static(k), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn headers_and_meta_name_the_same_context() {
        let mut h = HeaderMap::new();
        h.insert("traceparent", HeaderValue::from_static(PARENT));
        let from_headers = context_of_headers(&h).map(|c| c.span().span_context().clone());
        let carrier = TraceCarrier {
            traceparent: Some(PARENT.into()),
            ..Default::default()
        };
        let from_meta = context_of_carrier(&carrier).map(|c| c.span().span_context().clone());
        assert!(from_headers.is_some());
        assert_eq!(from_headers, from_meta);
    }

    #[test]
    fn a_malformed_traceparent_is_no_context() {
        let carrier = TraceCarrier {
            traceparent: Some("00-zz-yy-01".into()),
            ..Default::default()
        };
        assert!(context_of_carrier(&carrier).is_none());
        assert!(context_of_headers(&HeaderMap::new()).is_none());
    }

    #[test]
    fn a_disabled_span_carries_nothing() {
        assert!(carrier_of(&tracing::Span::none()).is_empty());
    }
}
