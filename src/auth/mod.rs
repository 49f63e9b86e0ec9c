//! JWT bearer authentication (docs/design.md §13 "Auth"; MCP Tasks extension, "Security
//! Considerations": auth binding).
//!
//! Every request to the gateway carries `Authorization: Bearer <jwt>`; the
//! [`Authenticator`] turns it into a [`Principal`] (`tenant`, `subject`) or into an
//! [`AuthFailure`] that the front renders as 401/403 with an RFC 6750
//! `WWW-Authenticate` header and an RFC 9728 `resource_metadata` pointer.
//!
//! Decisions:
//! - **Only the configured algorithms** (`auth.algorithms`, a subset of HS256/RS256/ES256).
//!   The token header is parsed by us first: `alg: none`, any other algorithm, or an
//!   allowed algorithm without a matching key is refused before any crypto runs. HS256
//!   is verified only with the configured secret and RS256/ES256 only with public keys,
//!   so the classic "HS256 signed with the RSA public key" confusion cannot apply. Each
//!   verification runs `jsonwebtoken::decode` with exactly one algorithm.
//! - **Claims.** `exp` is required; `nbf` is checked when present; `iss` and `aud` are
//!   required and checked when `auth.issuer` / `auth.audience` are set (a token carrying
//!   an `aud` is accepted when no audience is configured). Leeway is `auth.leeway_s`.
//!   `sub` is required; the tenant comes from the string claim `auth.tenant_claim`
//!   (missing/empty → 401 `invalid_token` "missing tenant claim"). Scopes come from
//!   `scope` (space separated) or `scp` (array or string); `auth.required_scope` (all of
//!   its space-separated items) missing → 403 `insufficient_scope`.
//! - **Key sources.** HS256 secret (`AuthConfig::resolved_hs256_secret`),
//!   `public_key_pem` (inline PEM, or a file path when it does not start with
//!   `-----BEGIN`; RSA or EC, the family decides which algorithm it serves), `jwks_file`
//!   (read at start-up; re-read on an unknown `kid`, so rotation is "replace the file"),
//!   `jwks_url` (plain `http://` only — TLS would need a new dependency, so an
//!   `https://` URL is refused at start-up; put the JWKS behind a local proxy or use
//!   `jwks_file`). A fetched JWKS is trusted for `jwks_cache_ms`; an unknown `kid` (or a
//!   `kid`-less token that no key fits) triggers a refetch, and *every* fetch/re-read
//!   is rate limited to one per `jwks_refresh_min_ms`, single-flight, so a flood of
//!   random `kid`s cannot hammer the JWKS server. If a refetch fails the previous set
//!   stays usable for one more `jwks_cache_ms` (then fail closed); with nothing valid
//!   cached every RS256/ES256 token is refused (fail closed). In a JWKS only RSA and EC
//!   P-256 signature keys are used; others are skipped.
//! - **Verified-token cache.** A bounded map (10 000 entries) from SHA-256(token) to the
//!   principal, honoured strictly until the token's `exp`, so a client polling
//!   `tasks/get` with the same token skips signature verification. Only fully accepted
//!   tokens (scope included) are cached. A key removed from a JWKS therefore stops
//!   working for new tokens at once, and for already-seen tokens at their `exp`.
//! - **Failures** are `AuthFailure` values with a short description that never contains
//!   token content; tokens and secrets are never logged. A token in the query string
//!   (`access_token=`) is always refused (RFC 9700 / MCP authorization spec), even if a
//!   valid header is also present. No credentials at all → 401 with a bare
//!   `Bearer resource_metadata="…"` challenge (RFC 6750 §3.1: no error code).
//! - `auth.mode = "none"` maps every request to `default`/`anonymous` and warns loudly
//!   at start-up; config validation already refuses it off loopback.

mod cache;
pub(crate) mod jwks;
mod jwt;
mod metadata;
mod mint;
mod outcome;
#[cfg(test)]
mod tests;

use crate::config::{AuthConfig, AuthMode};

pub use mint::{MintError, mint_token, parse_ttl};
pub use outcome::{AuthFailure, AuthInitError, Principal};

/// Verifies bearer tokens. `Send + Sync`; share it through an `Arc`.
pub struct Authenticator {
    enabled: bool,
    meta: metadata::Metadata,
    verifier: Option<jwt::Verifier>,
    cache: cache::TokenCache,
    required_scopes: Vec<String>,
}

/// Upper bound on the size of a bearer token we are willing to look at.
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Capacity of the verified-token cache.
const TOKEN_CACHE_CAPACITY: usize = 10_000;

impl Authenticator {
    /// Validates key material (PEM parse, JWKS file read/parse); errors name the config
    /// key. `public_url` is the gateway's public base URL (for RFC 9728 metadata).
    pub fn new(cfg: &AuthConfig, public_url: &str) -> Result<Self, AuthInitError> {
        let meta = metadata::Metadata::new(cfg, public_url);
        let required_scopes: Vec<String> = cfg
            .required_scope
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let (enabled, verifier) = match cfg.mode {
            AuthMode::None => {
                tracing::warn!(
                    "AUTHENTICATION IS DISABLED (auth.mode = \"none\"): every request runs as \
                     tenant \"default\", subject \"anonymous\". Use this for local demos only."
                );
                (false, None)
            }
            AuthMode::Jwt => (true, Some(jwt::Verifier::new(cfg)?)),
        };
        Ok(Authenticator {
            enabled,
            meta,
            verifier,
            cache: cache::TokenCache::new(TOKEN_CACHE_CAPACITY),
            required_scopes,
        })
    }

    /// `false` for `auth.mode = "none"`.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Fetches a `jwks_url` key set ahead of the first request (optional; without it the
    /// first RS256/ES256 request fetches). Failures are logged, never fatal.
    pub async fn prefetch_keys(&self) {
        if let Some(v) = &self.verifier {
            v.prefetch().await;
        }
    }

    /// RFC 9728 protected-resource metadata for `resource_path` (`""` for the root form
    /// `/.well-known/oauth-protected-resource`, or an upstream path such as `/mcp`).
    pub fn resource_metadata(&self, resource_path: &str) -> serde_json::Value {
        self.meta.document(resource_path)
    }

    /// Checks the request's `Authorization: Bearer <jwt>`; `query` is the raw URI query.
    pub async fn authenticate(
        &self,
        headers: &http::HeaderMap,
        query: Option<&str>,
    ) -> Result<Principal, AuthFailure> {
        let Some(verifier) = self.verifier.as_ref().filter(|_| self.enabled) else {
            return Ok(Principal::anonymous());
        };
        if query.is_some_and(query_has_access_token) {
            return Err(self
                .meta
                .invalid_request("tokens in the query string are refused"));
        }
        let token = self.bearer_token(headers)?;
        let now = jsonwebtoken::get_current_timestamp();
        let digest = cache::digest(token);
        if let Some(p) = self.cache.get(&digest, now) {
            return Ok(p);
        }
        let verified = verifier.verify(token).await.map_err(|reason| {
            tracing::debug!(reason, "bearer token refused");
            self.meta.invalid_token(reason)
        })?;
        if let Some(missing) = self
            .required_scopes
            .iter()
            .find(|s| !verified.scopes.iter().any(|have| have == *s))
        {
            tracing::debug!(
                scope = missing.as_str(),
                tenant = verified.principal.tenant.as_str(),
                subject = verified.principal.subject.as_str(),
                "token lacks the required scope"
            );
            return Err(self.meta.insufficient_scope(&self.required_scopes));
        }
        self.cache
            .insert(digest, verified.principal.clone(), verified.exp, now);
        Ok(verified.principal)
    }

    /// Checks an operator's `Authorization: Bearer <jwt>` for the operator API
    /// (docs/design.md §24): the same verifier as the front, the admin `scope`
    /// required, `auth.required_scope` not (it is the clients' requirement). Not
    /// cached: operators call rarely, and a revoked key must stop them at once.
    /// `Ok(None)` when authentication is disabled (the caller decides whether an
    /// anonymous operator may pass).
    pub async fn authenticate_admin(
        &self,
        headers: &http::HeaderMap,
        scope: &str,
    ) -> Result<Option<Principal>, AuthFailure> {
        let Some(verifier) = self.verifier.as_ref().filter(|_| self.enabled) else {
            return Ok(None);
        };
        let token = self.bearer_token(headers)?;
        let verified = verifier
            .verify(token)
            .await
            .map_err(|reason| self.meta.invalid_token(reason))?;
        if !verified.scopes.iter().any(|have| have == scope) {
            return Err(self.meta.insufficient_scope(&[scope.to_string()]));
        }
        Ok(Some(verified.principal))
    }

    /// Verifies `token` (signature and claims) bypassing the verified-token cache and
    /// the scope check. For benchmarks; the request path uses [`Self::authenticate`].
    #[doc(hidden)]
    pub async fn verify_uncached(&self, token: &str) -> Result<Principal, &'static str> {
        let verifier = self.verifier.as_ref().ok_or("authentication is disabled")?;
        verifier.verify(token).await.map(|v| v.principal)
    }

    /// Extracts the bearer token from the single `Authorization` header.
    fn bearer_token<'h>(&self, headers: &'h http::HeaderMap) -> Result<&'h str, AuthFailure> {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return Err(self.meta.no_credentials());
        };
        if values.next().is_some() {
            return Err(self
                .meta
                .invalid_request("more than one Authorization header"));
        }
        let Ok(value) = value.to_str() else {
            return Err(self.meta.invalid_request("malformed Authorization header"));
        };
        let value = value.trim();
        let (scheme, rest) = match value.split_once([' ', '\t']) {
            Some((s, r)) => (s, r.trim()),
            None => (value, ""),
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(self
                .meta
                .invalid_request("the Authorization scheme must be Bearer"));
        }
        if rest.is_empty() {
            return Err(self.meta.invalid_request("empty bearer token"));
        }
        if rest.len() > MAX_TOKEN_BYTES {
            return Err(self.meta.invalid_token("token too large"));
        }
        Ok(rest)
    }
}

/// Does the raw query carry an `access_token` parameter (RFC 6750 §2.3)?
fn query_has_access_token(query: &str) -> bool {
    query.split('&').any(|pair| {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        name == "access_token" || percent_decode_lossy(name) == "access_token"
    })
}

/// Minimal percent-decoding (and `+` → space) of a query parameter name or value.
pub fn percent_decode_lossy(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
