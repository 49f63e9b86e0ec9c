//! Transport-level checks before the body is read (policy 12): Origin/Host against
//! DNS rebinding, Content-Type, Accept.

use http::{HeaderMap, header};

use crate::config::ServerConfig;

fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[');
    let h = h.split(']').next().unwrap_or(h);
    let name = if host.starts_with('[') {
        h
    } else {
        h.rsplit_once(':').map(|(n, _)| n).unwrap_or(h)
    };
    matches!(name.to_ascii_lowercase().as_str(), "localhost" | "::1")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
        || name.to_ascii_lowercase().ends_with(".localhost")
}

/// The host part of an Origin (`scheme://host[:port]`), lowercased, with port.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.trim_end_matches('/'))
}

/// `Err(reason)` when Origin or Host is not allowed (→ 403).
pub fn check_origin_host(headers: &HeaderMap, cfg: &ServerConfig) -> Result<(), String> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().map_err(|_| "invalid Origin header")?;
        let allowed = cfg.allowed_origins.iter().any(|o| o == origin || o == "*")
            || origin_authority(origin).is_some_and(is_loopback_host);
        if !allowed {
            return Err(format!("origin {origin:?} is not allowed"));
        }
    }
    let host = headers
        .get(header::HOST)
        .map(|h| h.to_str().map_err(|_| "invalid Host header".to_string()))
        .transpose()?;
    if let Some(host) = host {
        let allowed = is_loopback_host(host)
            || cfg.allowed_hosts.iter().any(|h| {
                h.eq_ignore_ascii_case(host)
                    || host
                        .rsplit_once(':')
                        .is_some_and(|(name, _)| h.eq_ignore_ascii_case(name))
            });
        if !allowed {
            return Err(format!("host {host:?} is not allowed"));
        }
    }
    Ok(())
}

fn media_type(v: &str) -> String {
    v.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

pub fn content_type_is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| media_type(v) == "application/json")
}

/// `Accept` must admit both `application/json` and `text/event-stream` (spec A11).
pub fn accept_allows_json_and_sse(headers: &HeaderMap) -> bool {
    let ranges: Vec<String> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(media_type)
        .collect();
    let admits = |t: &str| {
        let (major, _) = t.split_once('/').unwrap_or((t, ""));
        ranges
            .iter()
            .any(|r| r == t || r == "*/*" || *r == format!("{major}/*"))
    };
    admits("application/json") && admits("text/event-stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn loopback_hosts() {
        let cfg = ServerConfig::default();
        for host in ["localhost:8080", "127.0.0.1:9", "[::1]:80", "localhost"] {
            assert!(
                check_origin_host(&h(&[("host", host)]), &cfg).is_ok(),
                "{host}"
            );
        }
        assert!(check_origin_host(&h(&[("host", "evil.example.com")]), &cfg).is_err());
        assert!(
            check_origin_host(
                &h(&[("host", "localhost"), ("origin", "http://evil.example.com")]),
                &cfg
            )
            .is_err()
        );
        assert!(
            check_origin_host(
                &h(&[("host", "localhost"), ("origin", "http://localhost:3000")]),
                &cfg
            )
            .is_ok()
        );
    }

    #[test]
    fn accept_rules() {
        assert!(accept_allows_json_and_sse(&h(&[(
            "accept",
            "application/json, text/event-stream"
        )])));
        assert!(accept_allows_json_and_sse(&h(&[("accept", "*/*")])));
        assert!(!accept_allows_json_and_sse(&h(&[(
            "accept",
            "application/json"
        )])));
        assert!(!accept_allows_json_and_sse(&HeaderMap::new()));
    }
}
