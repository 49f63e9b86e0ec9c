//! `taskgate token`: mint an HS256 dev token from the configured secret.

use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Map, Value, json};

use crate::config::AuthConfig;

#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error(
        "auth.hs256_secret: no HS256 secret is configured (hs256_secret, hs256_secret_env or TASKGATE_HS256_SECRET)"
    )]
    NoSecret,
    #[error("auth.algorithms: HS256 is not enabled, so the gateway would refuse an HS256 token")]
    Hs256Disabled,
    #[error("invalid token request: {0}")]
    Invalid(&'static str),
    #[error("cannot sign the token: {0}")]
    Sign(String),
}

/// Mints an HS256 token with `sub`, the tenant claim (`auth.tenant_claim`), `iat`,
/// `exp = now + ttl`, `iss`/`aud` when configured and `scope` when `scopes` is non-empty.
pub fn mint_token(
    cfg: &AuthConfig,
    subject: &str,
    tenant: &str,
    scopes: &[String],
    ttl: Duration,
) -> Result<String, MintError> {
    if !cfg.algorithms.iter().any(|a| a == "HS256") {
        return Err(MintError::Hs256Disabled);
    }
    let secret = cfg.resolved_hs256_secret().ok_or(MintError::NoSecret)?;
    if subject.is_empty() {
        return Err(MintError::Invalid("subject must not be empty"));
    }
    if tenant.is_empty() {
        return Err(MintError::Invalid("tenant must not be empty"));
    }
    if ttl.as_secs() == 0 {
        return Err(MintError::Invalid("ttl must be at least one second"));
    }
    let now = jsonwebtoken::get_current_timestamp();
    let mut claims = Map::new();
    claims.insert("sub".into(), json!(subject));
    claims.insert(cfg.tenant_claim.clone(), json!(tenant));
    claims.insert("iat".into(), json!(now));
    claims.insert("exp".into(), json!(now.saturating_add(ttl.as_secs())));
    if let Some(iss) = cfg.issuer.as_deref().filter(|s| !s.is_empty()) {
        claims.insert("iss".into(), json!(iss));
    }
    if let Some(aud) = cfg.audience.as_deref().filter(|s| !s.is_empty()) {
        claims.insert("aud".into(), json!(aud));
    }
    let scopes: Vec<&str> = scopes.iter().flat_map(|s| s.split_whitespace()).collect();
    if !scopes.is_empty() {
        claims.insert("scope".into(), json!(scopes.join(" ")));
    }
    let key =
        EncodingKey::from_secret(secret.as_bytes()).map_err(|e| MintError::Sign(e.to_string()))?;
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &Value::Object(claims), &key)
        .map_err(|e| MintError::Sign(e.to_string()))
}

/// Parses `"90s"`, `"30m"`, `"1h"`, `"2d"` (or bare seconds, `"3600"`) into a duration.
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid ttl {s:?}: expected a number and a unit (s, m, h, d), e.g. \"1h\""
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid ttl {s:?}: number too large"))?;
    let mult: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("invalid ttl {s:?}: unit must be s, m, h or d")),
    };
    let secs = n
        .checked_mul(mult)
        .ok_or_else(|| format!("invalid ttl {s:?}: too large"))?;
    if secs == 0 {
        return Err(format!("invalid ttl {s:?}: must be greater than zero"));
    }
    Ok(Duration::from_secs(secs))
}
