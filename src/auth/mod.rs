//! STUB — replaced by the real auth module.
use std::time::Duration;
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal { pub tenant: String, pub subject: String }
pub struct Authenticator;
#[derive(Debug, thiserror::Error)]
#[error("auth init")]
pub struct AuthInitError;
#[derive(Debug, thiserror::Error)]
#[error("mint")]
pub struct MintError;
pub struct AuthFailure { pub status: http::StatusCode, pub www_authenticate: String, pub error: &'static str, pub description: String }
impl AuthFailure { pub fn body(&self) -> serde_json::Value { serde_json::json!({}) } }
impl Authenticator {
    pub fn new(_cfg: &crate::config::AuthConfig, _public_url: &str) -> Result<Self, AuthInitError> { Ok(Self) }
    pub async fn authenticate(&self, _headers: &http::HeaderMap, _query: Option<&str>) -> Result<Principal, AuthFailure> { Ok(Principal{tenant:"default".into(), subject:"anonymous".into()}) }
    pub fn resource_metadata(&self, _p: &str) -> serde_json::Value { serde_json::json!({}) }
    pub fn is_enabled(&self) -> bool { false }
}
pub fn mint_token(_cfg: &crate::config::AuthConfig, _s: &str, _t: &str, _sc: &[String], _ttl: Duration) -> Result<String, MintError> { Err(MintError) }
pub fn parse_ttl(_s: &str) -> Result<Duration, String> { Ok(Duration::from_secs(3600)) }
