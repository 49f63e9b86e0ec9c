//! RFC 9728 protected-resource metadata and the RFC 6750 `WWW-Authenticate` challenges.

use http::StatusCode;
use serde_json::{Value, json};

use super::outcome::AuthFailure;
use crate::config::AuthConfig;

pub(crate) struct Metadata {
    public_url: String,
    resource: Option<String>,
    issuer: Option<String>,
    required_scope: Option<String>,
    /// `<public_url>/.well-known/oauth-protected-resource`, already quote-safe.
    metadata_url: String,
}

impl Metadata {
    pub(crate) fn new(cfg: &AuthConfig, public_url: &str) -> Self {
        let public_url = public_url.trim_end_matches('/').to_owned();
        let resource = cfg.resource.clone().filter(|r| !r.is_empty());
        // The metadata lives where clients reach the resource: behind a TLS-terminating
        // edge the listener itself is plain HTTP and cannot tell, so `auth.resource`
        // (its scheme and authority) decides when it is set (README "TLS").
        let base = resource
            .as_deref()
            .and_then(origin_of)
            .unwrap_or_else(|| public_url.clone());
        let metadata_url = quote_safe(&format!("{base}/.well-known/oauth-protected-resource"));
        Metadata {
            public_url,
            resource,
            issuer: cfg.issuer.clone().filter(|i| !i.is_empty()),
            required_scope: cfg.required_scope.clone().filter(|s| !s.trim().is_empty()),
            metadata_url,
        }
    }

    pub(crate) fn document(&self, resource_path: &str) -> Value {
        let resource = match &self.resource {
            Some(r) => r.clone(),
            None => format!("{}{}", self.public_url, resource_path),
        };
        let mut doc = json!({
            "resource": resource,
            "bearer_methods_supported": ["header"],
        });
        if let Some(obj) = doc.as_object_mut() {
            if let Some(iss) = &self.issuer {
                obj.insert("authorization_servers".into(), json!([iss]));
            }
            if let Some(scope) = &self.required_scope {
                let scopes: Vec<&str> = scope.split_whitespace().collect();
                obj.insert("scopes_supported".into(), json!(scopes));
            }
        }
        doc
    }

    /// No credentials at all: a bare challenge, no error code (RFC 6750 §3.1).
    pub(crate) fn no_credentials(&self) -> AuthFailure {
        AuthFailure {
            status: StatusCode::UNAUTHORIZED,
            www_authenticate: format!("Bearer resource_metadata=\"{}\"", self.metadata_url),
            error: "invalid_request",
            description: "missing bearer token".into(),
        }
    }

    pub(crate) fn invalid_token(&self, description: &str) -> AuthFailure {
        self.challenge(StatusCode::UNAUTHORIZED, "invalid_token", description)
    }

    pub(crate) fn invalid_request(&self, description: &str) -> AuthFailure {
        self.challenge(StatusCode::UNAUTHORIZED, "invalid_request", description)
    }

    pub(crate) fn insufficient_scope(&self, required: &[String]) -> AuthFailure {
        let scope = quote_safe(&required.join(" "));
        AuthFailure {
            status: StatusCode::FORBIDDEN,
            www_authenticate: format!(
                "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{}\"",
                self.metadata_url
            ),
            error: "insufficient_scope",
            description: format!("the token lacks the required scope \"{scope}\""),
        }
    }

    fn challenge(&self, status: StatusCode, error: &'static str, description: &str) -> AuthFailure {
        AuthFailure {
            status,
            www_authenticate: format!(
                "Bearer error=\"{error}\", error_description=\"{}\", resource_metadata=\"{}\"",
                quote_safe(description),
                self.metadata_url
            ),
            error,
            description: description.to_owned(),
        }
    }
}

/// Keeps a value usable inside a quoted-string of a header: printable ASCII without
/// `"` and `\` (RFC 6750 §3 restricts `error_description` the same way).
fn quote_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '"' || c == '\\' || !(' '..='~').contains(&c) {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// `scheme://authority` of an absolute URL; `None` for anything else.
fn origin_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(format!("{}://{}", uri.scheme_str()?, uri.authority()?))
}
