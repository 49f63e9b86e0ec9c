//! Token verification: header pre-check, key selection, `jsonwebtoken::decode` with a
//! single algorithm, then claim extraction. Errors are short static descriptions that
//! never contain token content.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::jwks::{self, JwksSource, JwksStore, KeyEntry, KeySet, Select};
use super::outcome::{AuthInitError, Principal};
use crate::config::AuthConfig;

pub(crate) struct Verified {
    pub(crate) principal: Principal,
    pub(crate) scopes: Vec<String>,
    pub(crate) exp: u64,
}

enum PublicKeys {
    None,
    Static(KeySet),
    Jwks(JwksStore),
}

pub(crate) struct Verifier {
    algorithms: Vec<Algorithm>,
    hs_key: Option<DecodingKey>,
    public: PublicKeys,
    validation: Validation,
    tenant_claim: String,
}

enum KeyRef<'a> {
    Borrowed(&'a DecodingKey),
    Shared(Arc<KeyEntry>),
}

impl KeyRef<'_> {
    fn key(&self) -> &DecodingKey {
        match self {
            KeyRef::Borrowed(k) => k,
            KeyRef::Shared(e) => &e.key,
        }
    }
}

impl Verifier {
    pub(crate) fn new(cfg: &AuthConfig) -> Result<Self, AuthInitError> {
        let mut algorithms = Vec::new();
        for a in &cfg.algorithms {
            let alg = match a.as_str() {
                "HS256" => Algorithm::HS256,
                "RS256" => Algorithm::RS256,
                "ES256" => Algorithm::ES256,
                other => {
                    return Err(AuthInitError::new(
                        "auth.algorithms",
                        format!("unsupported algorithm {other:?} (HS256, RS256, ES256)"),
                    ));
                }
            };
            if !algorithms.contains(&alg) {
                algorithms.push(alg);
            }
        }
        if algorithms.is_empty() {
            return Err(AuthInitError::new(
                "auth.algorithms",
                "must name at least one algorithm",
            ));
        }
        let hs_key = if algorithms.contains(&Algorithm::HS256) {
            let secret = cfg.resolved_hs256_secret().ok_or_else(|| {
                AuthInitError::new(
                    "auth.hs256_secret",
                    "HS256 is enabled but no secret is set (hs256_secret, hs256_secret_env or TASKGATE_HS256_SECRET)",
                )
            })?;
            if secret.len() < 32 {
                return Err(AuthInitError::new(
                    "auth.hs256_secret",
                    "must be at least 32 bytes",
                ));
            }
            Some(
                DecodingKey::from_secret(secret.as_bytes())
                    .map_err(|e| AuthInitError::new("auth.hs256_secret", e.to_string()))?,
            )
        } else {
            None
        };
        let wants_public = algorithms.iter().any(|a| *a != Algorithm::HS256);
        let public = Self::public_keys(cfg)?;
        if wants_public && matches!(public, PublicKeys::None) {
            return Err(AuthInitError::new(
                "auth.algorithms",
                "RS256/ES256 need one of public_key_pem, jwks_file, jwks_url",
            ));
        }
        if let PublicKeys::Static(set) = &public {
            // A static key must serve at least one configured algorithm.
            let serves_any = algorithms.iter().any(|a| {
                *a != Algorithm::HS256 && matches!(set.select(*a, None), Select::Found(_))
            });
            if !serves_any {
                return Err(AuthInitError::new(
                    "auth.public_key_pem",
                    "the key type matches none of auth.algorithms (RSA → RS256, EC → ES256)",
                ));
            }
        }

        let mut validation = Validation::new(Algorithm::HS256);
        let mut required = vec!["exp"];
        validation.leeway = cfg.leeway_s;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        match cfg.issuer.as_deref().filter(|s| !s.is_empty()) {
            Some(iss) => {
                validation.set_issuer(&[iss]);
                required.push("iss");
            }
            None => validation.iss = None,
        }
        match cfg.audience.as_deref().filter(|s| !s.is_empty()) {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.validate_aud = true;
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);

        Ok(Verifier {
            algorithms,
            hs_key,
            public,
            validation,
            tenant_claim: cfg.tenant_claim.clone(),
        })
    }

    fn public_keys(cfg: &AuthConfig) -> Result<PublicKeys, AuthInitError> {
        if let Some(pem) = cfg.public_key_pem.as_deref() {
            let text = if pem.trim_start().starts_with("-----BEGIN") {
                pem.as_bytes().to_vec()
            } else {
                std::fs::read(pem.trim()).map_err(|e| {
                    AuthInitError::new(
                        "auth.public_key_pem",
                        format!("not an inline PEM, and cannot read it as a file: {e}"),
                    )
                })?
            };
            let set =
                jwks::parse_pem(&text).map_err(|e| AuthInitError::new("auth.public_key_pem", e))?;
            return Ok(PublicKeys::Static(set));
        }
        let ttl = cfg.jwks_cache;
        let min = cfg.jwks_refresh_min;
        if let Some(path) = &cfg.jwks_file {
            let store = JwksStore::new(JwksSource::File(path.clone()), ttl, min)
                .map_err(|e| AuthInitError::new("auth.jwks_file", e))?;
            return Ok(PublicKeys::Jwks(store));
        }
        if let Some(url) = cfg.jwks_url.as_deref() {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| AuthInitError::new("auth.jwks_url", format!("{e}")))?;
            let https = uri.scheme_str() == Some("https");
            if !(https || uri.scheme_str() == Some("http")) || uri.host().is_none() {
                return Err(AuthInitError::new(
                    "auth.jwks_url",
                    "must be an http:// or https:// URL with a host",
                ));
            }
            let tls = if https {
                crate::tls::client::client_config(cfg.jwks_ca_file.as_deref(), None)
                    .map(std::sync::Arc::new)
                    .map_err(|e| AuthInitError::new("auth.jwks_ca_file", e.to_string()))?
            } else {
                crate::tls::client::plaintext_only()
                    .map_err(|e| AuthInitError::new("auth.jwks_url", e.to_string()))?
            };
            let store = JwksStore::new(JwksSource::url(uri, &tls), ttl, min)
                .map_err(|e| AuthInitError::new("auth.jwks_url", e))?;
            return Ok(PublicKeys::Jwks(store));
        }
        Ok(PublicKeys::None)
    }

    pub(crate) async fn prefetch(&self) {
        if let PublicKeys::Jwks(store) = &self.public {
            store.prefetch().await;
        }
    }

    #[cfg(test)]
    pub(crate) fn jwks_key_count(&self) -> usize {
        match &self.public {
            PublicKeys::Jwks(s) => s.key_count(),
            _ => 0,
        }
    }

    pub(crate) async fn verify(&self, token: &str) -> Result<Verified, &'static str> {
        let (alg, kid) = self.precheck(token)?;
        let key = match alg.family() {
            AlgorithmFamily::Hmac => {
                KeyRef::Borrowed(self.hs_key.as_ref().ok_or("algorithm not allowed")?)
            }
            _ => match &self.public {
                PublicKeys::None => return Err("algorithm not allowed"),
                // A static key has no kid to match: the algorithm family decides.
                PublicKeys::Static(set) => match set.select(alg, None) {
                    Select::Found(k) => KeyRef::Shared(k),
                    _ => return Err("no key for the token algorithm"),
                },
                PublicKeys::Jwks(store) => KeyRef::Shared(store.find(alg, kid.as_deref()).await?),
            },
        };
        let mut validation = self.validation.clone();
        validation.algorithms = vec![alg];
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, key.key(), &validation)
            .map_err(|e| describe(e.kind()))?;
        self.extract(data.claims)
    }

    /// Parses the header ourselves so that `alg: none`, unknown or unconfigured
    /// algorithms are refused before any key lookup or crypto.
    fn precheck(&self, token: &str) -> Result<(Algorithm, Option<String>), &'static str> {
        let mut parts = token.split('.');
        let (Some(h), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("malformed token");
        };
        let header_bytes = URL_SAFE_NO_PAD.decode(h).map_err(|_| "malformed token")?;
        let header: Value = serde_json::from_slice(&header_bytes).map_err(|_| "malformed token")?;
        let alg = match header.get("alg").and_then(Value::as_str) {
            Some("HS256") => Algorithm::HS256,
            Some("RS256") => Algorithm::RS256,
            Some("ES256") => Algorithm::ES256,
            Some(_) => return Err("algorithm not allowed"),
            None => return Err("malformed token"),
        };
        if !self.algorithms.contains(&alg) {
            return Err("algorithm not allowed");
        }
        let kid = match header.get("kid") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) => Some(k.clone()),
            Some(_) => return Err("malformed token"),
        };
        Ok((alg, kid))
    }

    fn extract(&self, mut claims: Map<String, Value>) -> Result<Verified, &'static str> {
        let exp = match claims.get("exp") {
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
                .ok_or("invalid exp claim")?,
            None => return Err("missing exp claim"),
        };
        let subject = match claims.remove("sub") {
            Some(Value::String(s)) if !s.is_empty() => s,
            _ => return Err("missing sub claim"),
        };
        let tenant = match claims.remove(&self.tenant_claim) {
            Some(Value::String(s)) if !s.is_empty() => s,
            _ => return Err("missing tenant claim"),
        };
        let mut scopes: Vec<String> = Vec::new();
        if let Some(Value::String(s)) = claims.get("scope") {
            scopes.extend(s.split_whitespace().map(str::to_owned));
        }
        match claims.get("scp") {
            Some(Value::Array(items)) => {
                scopes.extend(items.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            Some(Value::String(s)) => scopes.extend(s.split_whitespace().map(str::to_owned)),
            _ => {}
        }
        Ok(Verified {
            principal: Principal { tenant, subject },
            scopes,
            exp,
        })
    }
}

fn describe(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "token expired",
        ErrorKind::ImmatureSignature => "token not yet valid",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::InvalidSignature => "invalid signature",
        ErrorKind::InvalidAlgorithm => "algorithm not allowed",
        ErrorKind::MissingRequiredClaim(c) => match c.as_str() {
            "exp" => "missing exp claim",
            "iss" => "missing iss claim",
            "aud" => "missing aud claim",
            _ => "missing required claim",
        },
        ErrorKind::InvalidClaimFormat(_) => "malformed claim",
        ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidRsaKey(_) | ErrorKind::InvalidKeyFormat => {
            "key does not match the token"
        }
        _ => "malformed token",
    }
}
