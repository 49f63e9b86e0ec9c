//! What authentication hands out: a [`Principal`] for an accepted token, an
//! [`AuthFailure`] for a refused request, an [`AuthInitError`] for a configuration it
//! cannot start with. A file of its own, below the checks that produce these values
//! and the `Authenticator` that runs them.

use http::StatusCode;
use serde_json::json;

/// Who is calling: the unit of task ownership (docs/design.md §7 "Ownership").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub tenant: String,
    pub subject: String,
}

impl Principal {
    /// The principal used for every request when `auth.mode = "none"`.
    pub fn anonymous() -> Self {
        Principal {
            tenant: "default".into(),
            subject: "anonymous".into(),
        }
    }
}

/// Start-up error; `key` names the configuration key at fault.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration `{key}`: {message}")]
pub struct AuthInitError {
    pub key: &'static str,
    pub message: String,
}

impl AuthInitError {
    pub(super) fn new(key: &'static str, message: impl Into<String>) -> Self {
        AuthInitError {
            key,
            message: message.into(),
        }
    }
}

/// A refused request: the front answers `status` with the `WWW-Authenticate` header
/// and `body()` as JSON.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}: {description}")]
pub struct AuthFailure {
    pub status: StatusCode,
    pub www_authenticate: String,
    /// `invalid_token` | `insufficient_scope` | `invalid_request`
    pub error: &'static str,
    pub description: String,
}

impl AuthFailure {
    /// `{"error": …, "error_description": …}` (RFC 6750 style).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": self.error, "error_description": self.description})
    }
}
