//! `[auth]`: how bearer tokens are checked.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use super::millis::millis;

/// The dev HS256 secret shipped in `config/taskgate.toml`; refusing it on a
/// non-loopback listener is part of the hardening in docs/design.md §12 "HTTP front".
pub const SHIPPED_DEV_SECRET: &str = "taskgate-dev-secret-change-me-0123456789abcdef";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Jwt,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub tenant_claim: String,
    pub algorithms: Vec<String>,
    pub leeway_s: u64,
    pub resource: Option<String>,
    pub hs256_secret: Option<String>,
    pub hs256_secret_env: Option<String>,
    pub public_key_pem: Option<String>,
    pub jwks_file: Option<PathBuf>,
    pub jwks_url: Option<String>,
    /// Extra CA bundle (PEM) trusted for an `https://` `jwks_url`, besides the system
    /// roots.
    pub jwks_ca_file: Option<PathBuf>,
    pub required_scope: Option<String>,
    pub request_state_key_env: Option<String>,
    /// Minimum interval between JWKS refetches triggered by an unknown `kid`.
    #[serde(rename = "jwks_refresh_min_ms", deserialize_with = "millis")]
    pub jwks_refresh_min: Duration,
    /// How long a fetched JWKS is trusted before it is refetched.
    #[serde(rename = "jwks_cache_ms", deserialize_with = "millis")]
    pub jwks_cache: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::Jwt,
            issuer: None,
            audience: None,
            tenant_claim: "tenant".into(),
            algorithms: vec!["HS256".into()],
            leeway_s: 30,
            resource: None,
            hs256_secret: None,
            hs256_secret_env: None,
            public_key_pem: None,
            jwks_file: None,
            jwks_url: None,
            jwks_ca_file: None,
            required_scope: None,
            request_state_key_env: None,
            jwks_refresh_min: Duration::from_millis(10_000),
            jwks_cache: Duration::from_millis(300_000),
        }
    }
}

impl AuthConfig {
    /// The HS256 secret after env override: `hs256_secret_env` names a variable that,
    /// when set, wins over the inline `hs256_secret`; `TASKGATE_HS256_SECRET` always wins.
    pub fn resolved_hs256_secret(&self) -> Option<String> {
        if let Ok(v) = std::env::var("TASKGATE_HS256_SECRET")
            && !v.is_empty()
        {
            return Some(v);
        }
        if let Some(name) = &self.hs256_secret_env
            && let Ok(v) = std::env::var(name)
            && !v.is_empty()
        {
            return Some(v);
        }
        self.hs256_secret.clone()
    }
}

impl AuthConfig {
    /// Check `[auth]`; `listen` is the client listener (`server.listen`), since what is
    /// allowed depends on whether it is loopback.
    pub(super) fn validate(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        match self.mode {
            AuthMode::None => {
                if !listen.ip().is_loopback() {
                    return Err(invalid(
                        "auth.mode",
                        "\"none\" is only allowed on a loopback `server.listen`",
                    ));
                }
            }
            AuthMode::Jwt => {
                if self.algorithms.is_empty() {
                    return Err(invalid(
                        "auth.algorithms",
                        "must name at least one algorithm",
                    ));
                }
                for a in &self.algorithms {
                    if !matches!(a.as_str(), "HS256" | "RS256" | "ES256") {
                        return Err(invalid(
                            "auth.algorithms",
                            format!("unsupported algorithm {a:?} (HS256, RS256, ES256)"),
                        ));
                    }
                }
                let secret = self.resolved_hs256_secret();
                let has_hs = self.algorithms.iter().any(|a| a == "HS256");
                let has_asym = self.algorithms.iter().any(|a| a != "HS256");
                if has_hs && secret.is_none() {
                    return Err(invalid(
                        "auth.hs256_secret",
                        "HS256 is enabled but no secret is set (hs256_secret, hs256_secret_env or TASKGATE_HS256_SECRET)",
                    ));
                }
                if let Some(s) = &secret {
                    if has_hs && s.len() < 32 {
                        return Err(invalid("auth.hs256_secret", "must be at least 32 bytes"));
                    }
                    if has_hs && s == SHIPPED_DEV_SECRET && !listen.ip().is_loopback() {
                        return Err(invalid(
                            "auth.hs256_secret",
                            "the shipped dev secret is refused on a non-loopback `server.listen`",
                        ));
                    }
                }
                let key_sources = [
                    self.public_key_pem.is_some(),
                    self.jwks_file.is_some(),
                    self.jwks_url.is_some(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if has_asym && key_sources == 0 {
                    return Err(invalid(
                        "auth.algorithms",
                        "RS256/ES256 need one of public_key_pem, jwks_file, jwks_url",
                    ));
                }
                if key_sources > 1 {
                    return Err(invalid(
                        "auth",
                        "set only one of public_key_pem, jwks_file, jwks_url",
                    ));
                }
                match &self.jwks_url {
                    Some(u) if !u.starts_with("http://") && !u.starts_with("https://") => {
                        return Err(invalid(
                            "auth.jwks_url",
                            "must be an http:// or https:// URL",
                        ));
                    }
                    Some(u) if u.starts_with("https://") => {}
                    _ if self.jwks_ca_file.is_some() => {
                        return Err(invalid(
                            "auth.jwks_ca_file",
                            "only applies to an https:// jwks_url",
                        ));
                    }
                    _ => {}
                }
                if self.tenant_claim.is_empty() {
                    return Err(invalid("auth.tenant_claim", "must not be empty"));
                }
            }
        }
        Ok(())
    }
}
