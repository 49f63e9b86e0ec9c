//! Token verification: header pre-check, key selection, `jsonwebtoken::decode` with a
//! single algorithm, then claim extraction. Errors are short static descriptions that
//! never contain token content.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::jwks::{self, JwksSource, JwksStore, KeyEntry, KeySet, Select};
use super::outcome::{AuthInitError, Principal};
use crate::config::AuthConfig;
use crate::protocol::loose::Loose;

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
        // Through a map first: a header that is no object is malformed, and a repeated
        // member counts once (the last), where a struct read from the bytes would
        // refuse the header.
        let header: Map<String, Value> =
            serde_json::from_slice(&header_bytes).map_err(|_| "malformed token")?;
        let header = JoseHeader::deserialize(&header).map_err(|_| "malformed token")?;
        let alg = match header.alg.0.as_deref() {
            Some("HS256") => Algorithm::HS256,
            Some("RS256") => Algorithm::RS256,
            Some("ES256") => Algorithm::ES256,
            Some(_) => return Err("algorithm not allowed"),
            None => return Err("malformed token"),
        };
        if !self.algorithms.contains(&alg) {
            return Err("algorithm not allowed");
        }
        let kid = match header.kid {
            None => None,
            Some(Loose(Some(k))) => Some(k),
            Some(Loose(None)) => return Err("malformed token"),
        };
        Ok((alg, kid))
    }

    fn extract(&self, mut claims: Map<String, Value>) -> Result<Verified, &'static str> {
        // Read before `sub` and the tenant claim are taken out, as it always was.
        let exp = ExpClaim::deserialize(&claims).map_err(|_| "invalid exp claim")?;
        let exp = match exp.exp {
            Some(Loose(Some(n))) => n
                .as_u64()
                .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
                .ok_or("invalid exp claim")?,
            Some(Loose(None)) => return Err("invalid exp claim"),
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
        // Read after they are taken out: a tenant claim named `scope` or `scp` is not
        // read again as scopes. Every member is read loosely, so this cannot fail; if
        // it did, the token would carry no scopes, the side that grants nothing.
        let granted = ScopeClaims::deserialize(&claims).unwrap_or_default();
        let mut scopes: Vec<String> = Vec::new();
        if let Some(s) = granted.scope.0 {
            scopes.extend(s.split_whitespace().map(str::to_owned));
        }
        match granted.scp.0 {
            Some(Value::Array(items)) => scopes.extend(items.into_iter().filter_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })),
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

/// The JOSE header members the pre-check reads. `alg` of another type than a string
/// is malformed, as a missing one is; `kid` may be missing or `null`, and is malformed
/// as anything but a string, which is only said once `alg` passed (`None`: missing
/// or `null`; `Some(Loose(None))`: another type).
#[derive(Deserialize)]
struct JoseHeader {
    #[serde(default)]
    alg: Loose<String>,
    #[serde(default)]
    kid: Option<Loose<String>>,
}

/// The `exp` claim: missing (`None`), a number, or anything else (`null` included),
/// which is an invalid claim rather than a missing one.
#[derive(Deserialize)]
struct ExpClaim {
    #[serde(default, deserialize_with = "present")]
    exp: Option<Loose<Number>>,
}

/// The scopes a token grants: `scope`, a space-separated string; `scp`, a list of
/// strings (its other items are skipped) or such a string. Of another type, either
/// grants nothing.
#[derive(Default, Deserialize)]
struct ScopeClaims {
    #[serde(default)]
    scope: Loose<String>,
    /// A list of scopes or a space-separated string; read as sent and matched by its
    /// type (an untagged enum would buffer it: tests/serde_buffering.rs).
    #[serde(default)]
    scp: Loose<Value>,
}

/// A member that is there, `null` included (serde reads a `null` `Option` as `None`,
/// which would make a `null` claim a missing one).
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
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

#[cfg(test)]
mod tests {
    //! The typed reads of the header and the claims against the lookups they replaced
    //! (kept here as `by_lookup_*`): the same answer for every odd shape.

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use jsonwebtoken::Algorithm;
    use serde_json::{Map, Value};

    use super::Verifier;
    use crate::config::AuthConfig;

    fn verifier(tenant_claim: &str) -> Verifier {
        let cfg = AuthConfig {
            hs256_secret: Some("test-secret-0123456789abcdef-0123456789abcdef".into()),
            tenant_claim: tenant_claim.into(),
            ..AuthConfig::default()
        };
        Verifier::new(&cfg).unwrap()
    }

    fn by_lookup_precheck(
        algorithms: &[Algorithm],
        header_bytes: &[u8],
    ) -> Result<(Algorithm, Option<String>), &'static str> {
        let header: Value = serde_json::from_slice(header_bytes).map_err(|_| "malformed token")?;
        let alg = match header.get("alg").and_then(Value::as_str) {
            Some("HS256") => Algorithm::HS256,
            Some("RS256") => Algorithm::RS256,
            Some("ES256") => Algorithm::ES256,
            Some(_) => return Err("algorithm not allowed"),
            None => return Err("malformed token"),
        };
        if !algorithms.contains(&alg) {
            return Err("algorithm not allowed");
        }
        let kid = match header.get("kid") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) => Some(k.clone()),
            Some(_) => return Err("malformed token"),
        };
        Ok((alg, kid))
    }

    type Extracted = (String, String, Vec<String>, u64);

    fn by_lookup_extract(
        tenant_claim: &str,
        mut claims: Map<String, Value>,
    ) -> Result<Extracted, &'static str> {
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
        let tenant = match claims.remove(tenant_claim) {
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
        Ok((tenant, subject, scopes, exp))
    }

    #[test]
    fn header_reads_as_the_lookups_did() {
        let v = verifier("tenant");
        let algs = [
            "",
            r#""HS256""#,
            r#""RS256""#,
            r#""ES256""#,
            r#""PS256""#,
            r#""none""#,
            "5",
            "null",
            "[]",
        ];
        let kids = [
            "", r#""k1""#, "null", "5", "1e3", "{}", r#"["k"]"#, "true", r#""""#,
        ];
        let mut texts = vec![
            "[]".to_string(),
            r#"["HS256"]"#.into(),
            r#""HS256""#.into(),
            "null".into(),
            "not json".into(),
            r#"{"alg":"RS256","alg":"HS256"}"#.into(),
            r#"{"alg":"HS256","alg":5}"#.into(),
            r#"{"alg":"HS256","kid":5,"kid":"k"}"#.into(),
            r#"{"alg":"HS256","typ":"JWT","kid":"k","x5c":[1,{"a":null}]}"#.into(),
        ];
        for alg in algs {
            for kid in kids {
                let mut members = Vec::new();
                if !alg.is_empty() {
                    members.push(format!(r#""alg":{alg}"#));
                }
                if !kid.is_empty() {
                    members.push(format!(r#""kid":{kid}"#));
                }
                texts.push(format!("{{{}}}", members.join(",")));
            }
        }
        for text in texts {
            let token = format!("{}.e30.sig", URL_SAFE_NO_PAD.encode(&text));
            assert_eq!(
                v.precheck(&token),
                by_lookup_precheck(&v.algorithms, text.as_bytes()),
                "{text}"
            );
        }
    }

    #[test]
    fn claims_read_as_the_lookups_did() {
        let exps = [
            None,
            Some("1700000000"),
            Some("-5"),
            Some("-0"),
            Some("1.5"),
            Some("1e3"),
            Some("1E400"),
            Some("18446744073709551616"),
            Some("null"),
            Some(r#""1700000000""#),
            Some("[1]"),
            Some("{}"),
        ];
        let scopes = [
            None,
            Some(r#""read  write""#),
            Some("5"),
            Some("null"),
            Some(r#"["read"]"#),
        ];
        let scps = [
            None,
            Some(r#"["a", 5, "b", null, ["c"], "d e"]"#),
            Some(r#""x y""#),
            Some("{}"),
            Some("null"),
            Some("1.0"),
            Some("[]"),
        ];
        let subs = [Some(r#""alice""#), Some(r#""""#), Some("5"), None];
        let mut cases = Vec::new();
        for exp in exps {
            for scope in scopes {
                for scp in scps {
                    for sub in subs {
                        let mut members = vec![r#""tenant":"acme""#.to_string()];
                        for (name, value) in
                            [("exp", exp), ("scope", scope), ("scp", scp), ("sub", sub)]
                        {
                            if let Some(value) = value {
                                members.push(format!(r#""{name}":{value}"#));
                            }
                        }
                        cases.push(format!("{{{}}}", members.join(",")));
                    }
                }
            }
        }
        // A tenant claim that is also a claim the extraction reads itself.
        cases.push(r#"{"exp":5,"sub":"a","scope":"acme","scp":"acme"}"#.into());
        cases.push(r#"{"exp":5,"sub":"a","tenant":"t","scope":"read"}"#.into());
        for tenant_claim in ["tenant", "scope", "scp", "sub", "exp"] {
            let v = verifier(tenant_claim);
            for text in &cases {
                let claims: Map<String, Value> = serde_json::from_str(text).unwrap();
                let got = v
                    .extract(claims.clone())
                    .map(|x| (x.principal.tenant, x.principal.subject, x.scopes, x.exp));
                assert_eq!(
                    got,
                    by_lookup_extract(tenant_claim, claims),
                    "{tenant_claim}: {text}"
                );
            }
        }
    }
}
