//! `[admin]`: the operator API on `server.metrics_listen` (docs/design.md §24
//! "Operations").

use serde::Deserialize;

use super::error::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The scope a token must carry to use `/admin/` (verified like any client
    /// token: same issuer, audience and keys).
    pub scope: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            scope: "taskgate:admin".into(),
        }
    }
}

impl AdminConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        // A scope is one space-free token (RFC 6749 §3.3): an empty or spaced one
        // could never be matched, which would lock operators out silently.
        if self.scope.is_empty() || self.scope.chars().any(char::is_whitespace) {
            return Err(invalid(
                "admin.scope",
                "must be one non-empty scope token without spaces",
            ));
        }
        Ok(())
    }
}
