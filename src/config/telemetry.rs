//! `[telemetry]`: OpenTelemetry traces over OTLP/HTTP (docs/design.md §24
//! "Operations"). Off unless an endpoint is set, in the file or by the standard
//! `OTEL_EXPORTER_OTLP_*` variables.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::error::{ConfigError, invalid};

/// The OTLP path of traces, appended to a base endpoint (docs/design.md §24 "Traces").
const TRACES_PATH: &str = "/v1/traces";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's base URL (`http://…` or `https://…`); `/v1/traces` is appended
    /// unless the URL already ends with it. Unset: traces are off.
    pub otlp_endpoint: Option<String>,
    /// The CA bundle that verifies an `https://` collector (else the system roots).
    pub ca_file: Option<PathBuf>,
    /// Extra headers on every export (vendors' API keys).
    pub headers: BTreeMap<String, String>,
    /// The share of new traces recorded; a request that arrives with a sampled or
    /// unsampled parent follows its parent (parent-based sampling).
    pub sample_ratio: f64,
    pub service_name: String,
    /// Record the tenant and subject on request spans.
    pub record_principal: bool,
    /// Spans waiting for export at most; more are dropped and counted.
    pub queue_spans: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            ca_file: None,
            headers: BTreeMap::new(),
            sample_ratio: 1.0,
            service_name: "taskgate".into(),
            record_principal: false,
            queue_spans: 4096,
        }
    }
}

/// The exporter's settings once the file and the environment are merged.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceExport {
    /// Where spans are posted (the full traces URL).
    pub url: String,
    pub ca_file: Option<PathBuf>,
    pub headers: Vec<(String, String)>,
    pub sample_ratio: f64,
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, as pairs.
    pub resource: Vec<(String, String)>,
    pub record_principal: bool,
    pub queue_spans: usize,
}

impl TelemetryConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.otlp_endpoint {
            check_url("telemetry.otlp_endpoint", url)?;
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(invalid(
                "telemetry.sample_ratio",
                "must be between 0.0 and 1.0",
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(invalid("telemetry.service_name", "must not be empty"));
        }
        if self.queue_spans == 0 {
            return Err(invalid("telemetry.queue_spans", "must be at least 1"));
        }
        for (k, v) in &self.headers {
            check_header("telemetry.headers", k, v)?;
        }
        Ok(())
    }

    /// Merge the file with the standard variables `env` reads: what the file sets
    /// wins, the variables fill the rest (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`,
    /// `…_HEADERS`, `…_CERTIFICATE`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
    /// `OTEL_TRACES_SAMPLER_ARG`; `OTEL_SDK_DISABLED=true` turns traces off).
    /// `None`: traces are off.
    pub fn export(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<TraceExport>, ConfigError> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let url = match (
            &self.otlp_endpoint,
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            env("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(base), _, _) => traces_url(base),
            // The signal-specific variable is the full URL (OTLP exporter spec).
            (None, Some(full), _) => full,
            (None, None, Some(base)) => traces_url(&base),
            (None, None, None) => return Ok(None),
        };
        check_url(
            "telemetry.otlp_endpoint (or OTEL_EXPORTER_OTLP_*ENDPOINT)",
            &url,
        )?;
        let mut headers: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for var in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            for (k, v) in pairs(&env(var).unwrap_or_default()) {
                check_header(var, &k, &v)?;
                if !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(&k)) {
                    headers.push((k, v));
                }
            }
        }
        let ca_file = self.ca_file.clone().or_else(|| {
            env("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
                .or_else(|| env("OTEL_EXPORTER_OTLP_CERTIFICATE"))
                .map(PathBuf::from)
        });
        let defaults = Self::default();
        let service_name = if self.service_name != defaults.service_name {
            self.service_name.clone()
        } else {
            env("OTEL_SERVICE_NAME").unwrap_or_else(|| self.service_name.clone())
        };
        let sample_ratio = if self.sample_ratio != defaults.sample_ratio {
            self.sample_ratio
        } else {
            match env("OTEL_TRACES_SAMPLER_ARG") {
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        invalid("OTEL_TRACES_SAMPLER_ARG", "must be between 0.0 and 1.0")
                    })?,
                None => self.sample_ratio,
            }
        };
        Ok(Some(TraceExport {
            url,
            ca_file,
            headers,
            sample_ratio,
            service_name,
            resource: pairs(&env("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default()),
            record_principal: self.record_principal,
            queue_spans: self.queue_spans,
        }))
    }
}

fn traces_url(base: &str) -> String {
    let base = base.trim();
    if base.ends_with(TRACES_PATH) {
        base.to_string()
    } else {
        format!("{}{TRACES_PATH}", base.trim_end_matches('/'))
    }
}

fn check_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let ok = ["http://", "https://"]
        .iter()
        .any(|s| url.len() > s.len() && url[..s.len()].eq_ignore_ascii_case(s));
    if !ok || url.parse::<http::Uri>().is_err() {
        return Err(invalid(
            key,
            format!("`{url}` is not an http:// or https:// URL"),
        ));
    }
    Ok(())
}

fn check_header(key: &str, name: &str, value: &str) -> Result<(), ConfigError> {
    if http::HeaderName::from_bytes(name.as_bytes()).is_err()
        || http::HeaderValue::from_str(value).is_err()
    {
        return Err(invalid(key, format!("`{name}` is not a valid HTTP header")));
    }
    Ok(())
}

/// `k=v,k=v` as the OTEL variables write it (values percent-decoded where they are
/// `%XX`).
fn pairs(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(h) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(h);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_without_an_endpoint() {
        let c = TelemetryConfig::default();
        assert_eq!(c.export(env(&[])).ok(), Some(None));
    }

    #[test]
    fn the_file_wins_and_the_variables_fill_the_rest() {
        let c = TelemetryConfig {
            otlp_endpoint: Some("http://collector:4318".into()),
            headers: [("x-api-key".to_string(), "file".to_string())].into(),
            ..Default::default()
        };
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=env,tenant=a%20b"),
            ("OTEL_SERVICE_NAME", "gw-east"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
        ];
        let Ok(Some(e)) = c.export(env(&vars)) else {
            panic!("expected an export");
        };
        assert_eq!(e.url, "http://collector:4318/v1/traces");
        assert_eq!(
            e.headers,
            [
                ("x-api-key".to_string(), "file".to_string()),
                ("tenant".to_string(), "a b".to_string())
            ]
        );
        assert_eq!(e.service_name, "gw-east");
        assert_eq!(e.sample_ratio, 0.25);
        assert_eq!(
            e.resource,
            [("deployment.environment".to_string(), "prod".to_string())]
        );
    }

    #[test]
    fn the_signal_variable_is_a_full_url_and_disabled_wins() {
        let c = TelemetryConfig::default();
        let full = [(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://c.example/otlp/traces",
        )];
        assert_eq!(
            c.export(env(&full)).ok().flatten().map(|e| e.url),
            Some("https://c.example/otlp/traces".to_string())
        );
        let off = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert_eq!(c.export(env(&off)).ok(), Some(None));
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |c: TelemetryConfig| c.validate().map_err(|e| e.to_string()).err();
        let e = bad(TelemetryConfig {
            otlp_endpoint: Some("grpc://c:4317".into()),
            ..Default::default()
        });
        assert!(e.is_some_and(|e| e.contains("telemetry.otlp_endpoint")));
        let e = bad(TelemetryConfig {
            sample_ratio: 1.5,
            ..Default::default()
        });
        assert!(e.is_some_and(|e| e.contains("telemetry.sample_ratio")));
        let e = TelemetryConfig::default()
            .export(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER_ARG", "lots"),
            ]))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("OTEL_TRACES_SAMPLER_ARG")));
    }
}
