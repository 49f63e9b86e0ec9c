//! Public keys for RS256/ES256: a static PEM, a JWKS file or a JWKS URL, with caching,
//! refresh on an unknown `kid`, a refresh rate limit and fail-closed behaviour.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::Value;

use crate::protocol::loose::Object;

/// Largest JWKS document accepted (file or HTTP body).
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// Whole-request timeout for a JWKS fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct KeyEntry {
    kid: Option<String>,
    /// The JWK's `alg`, if it named one.
    alg: Option<Algorithm>,
    family: AlgorithmFamily,
    pub(crate) key: DecodingKey,
}

impl KeyEntry {
    fn fits(&self, alg: Algorithm) -> bool {
        self.family == alg.family() && self.alg.is_none_or(|a| a == alg)
    }
}

#[derive(Default)]
pub(crate) struct KeySet {
    keys: Vec<Arc<KeyEntry>>,
}

pub(crate) enum Select {
    Found(Arc<KeyEntry>),
    /// No key with that `kid` (or, without a `kid`, no key fits): a refresh may help.
    Unknown,
    /// The set cannot serve this token, and a refresh would not change that.
    Refused(&'static str),
}

impl KeySet {
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn select(&self, alg: Algorithm, kid: Option<&str>) -> Select {
        match kid {
            Some(kid) => {
                let mut same_kid = self
                    .keys
                    .iter()
                    .filter(|k| k.kid.as_deref() == Some(kid))
                    .peekable();
                if same_kid.peek().is_none() {
                    return Select::Unknown;
                }
                match same_kid.find(|k| k.fits(alg)) {
                    Some(k) => Select::Found(k.clone()),
                    None => Select::Refused("key does not match the token algorithm"),
                }
            }
            None => {
                let mut fitting = self.keys.iter().filter(|k| k.fits(alg));
                match (fitting.next(), fitting.next()) {
                    (Some(k), None) => Select::Found(k.clone()),
                    (None, _) => Select::Unknown,
                    (Some(_), Some(_)) => {
                        Select::Refused("token has no kid and several keys match")
                    }
                }
            }
        }
    }
}

/// Parses a JWKS document. Keys that are not RSA or EC P-256 signature keys, or that
/// are malformed, are skipped; a document without any usable key is an error.
pub(crate) fn parse_jwks(bytes: &[u8]) -> Result<KeySet, String> {
    if bytes.len() > MAX_JWKS_BYTES {
        return Err(format!("JWKS larger than {MAX_JWKS_BYTES} bytes"));
    }
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    // JSON first, then the shape, so the two keep their own errors. The keys move out
    // of the parsed document; each is then read by `parse_jwk`.
    let Object(JwkSet { keys }) =
        serde_json::from_value(doc).map_err(|_| "no \"keys\" array".to_string())?;
    let mut set = KeySet::default();
    for (i, jwk) in keys.iter().enumerate() {
        match parse_jwk(jwk) {
            Ok(Some(entry)) => set.keys.push(Arc::new(entry)),
            Ok(None) => {}
            Err(e) => tracing::debug!(index = i, error = e, "skipping JWKS key"),
        }
    }
    if set.keys.is_empty() {
        return Err("no usable RSA or EC P-256 signature key".into());
    }
    Ok(set)
}

/// A JWKS document: an object whose `keys` is an array.
#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Value>,
}

fn parse_jwk(jwk: &Value) -> Result<Option<KeyEntry>, &'static str> {
    let s = |name: &str| jwk.get(name).and_then(Value::as_str);
    if s("use").is_some_and(|u| u != "sig") {
        return Ok(None);
    }
    let alg = match s("alg") {
        None => None,
        Some("RS256") => Some(Algorithm::RS256),
        Some("ES256") => Some(Algorithm::ES256),
        Some(_) => return Ok(None),
    };
    let kid = s("kid").map(str::to_owned);
    let (family, key) = match s("kty") {
        Some("RSA") => {
            let (Some(n), Some(e)) = (s("n"), s("e")) else {
                return Err("RSA key without n/e");
            };
            let key = DecodingKey::from_rsa_components(n, e).map_err(|_| "bad RSA n/e")?;
            (AlgorithmFamily::Rsa, key)
        }
        Some("EC") => {
            if s("crv") != Some("P-256") {
                return Ok(None);
            }
            let (Some(x), Some(y)) = (s("x"), s("y")) else {
                return Err("EC key without x/y");
            };
            let key = DecodingKey::from_ec_components(x, y).map_err(|_| "bad EC x/y")?;
            (AlgorithmFamily::Ec, key)
        }
        _ => return Ok(None),
    };
    if alg.is_some_and(|a| a.family() != family) {
        return Err("alg does not match kty");
    }
    Ok(Some(KeyEntry {
        kid,
        alg,
        family,
        key,
    }))
}

/// A single public key from `auth.public_key_pem` (RSA or EC).
pub(crate) fn parse_pem(pem: &[u8]) -> Result<KeySet, &'static str> {
    let (family, key) = if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
        (AlgorithmFamily::Rsa, k)
    } else if let Ok(k) = DecodingKey::from_ec_pem(pem) {
        (AlgorithmFamily::Ec, k)
    } else {
        return Err("not an RSA or EC public key in PEM form");
    };
    Ok(KeySet {
        keys: vec![Arc::new(KeyEntry {
            kid: None,
            alg: None,
            family,
            key,
        })],
    })
}

pub(crate) enum JwksSource {
    File(PathBuf),
    Url {
        uri: http::Uri,
        /// One client for the store's life: its pool keeps the TLS session, so a
        /// refresh after an unknown `kid` resumes instead of a full handshake. Boxed:
        /// the client is about 500 bytes, the file variant one path.
        client: Box<JwksClient>,
    },
}

type JwksClient =
    hyper_util::client::legacy::Client<crate::tls::client::HttpsConnector, Empty<Bytes>>;

impl JwksSource {
    /// A URL source whose `https://` server is verified by `tls`.
    pub(crate) fn url(uri: http::Uri, tls: &rustls::ClientConfig) -> Self {
        let connector = crate::tls::client::https_connector(tls, FETCH_TIMEOUT);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        Self::Url {
            uri,
            client: Box::new(client),
        }
    }
}

struct Snapshot {
    keys: Arc<KeySet>,
    /// When `keys` was loaded; `None` until the first successful load.
    loaded_at: Option<Instant>,
    /// Last fetch or re-read attempt, successful or not (rate limit).
    last_attempt: Option<Instant>,
    /// Bumped on every successful load (single-flight bookkeeping).
    generation: u64,
}

/// A JWKS file or URL with its cached key set.
pub(crate) struct JwksStore {
    source: JwksSource,
    /// URL only: how long a fetched set is fresh.
    cache_ttl: Duration,
    /// Minimum interval between two fetches / re-reads.
    refresh_min: Duration,
    state: RwLock<Snapshot>,
    refresh_lock: tokio::sync::Mutex<()>,
}

impl JwksStore {
    /// For a file the set is read synchronously here (start-up), so errors surface early.
    pub(crate) fn new(
        source: JwksSource,
        cache_ttl: Duration,
        refresh_min: Duration,
    ) -> Result<Self, String> {
        let mut snap = Snapshot {
            keys: Arc::new(KeySet::default()),
            loaded_at: None,
            last_attempt: None,
            generation: 0,
        };
        if let JwksSource::File(path) = &source {
            let bytes = read_file_sync(path)?;
            snap.keys = Arc::new(parse_jwks(&bytes)?);
            snap.loaded_at = Some(Instant::now());
            // The start-up read does not count against the refresh rate limit: a
            // rotation right after start must still be picked up.
        }
        Ok(JwksStore {
            source,
            cache_ttl,
            refresh_min,
            state: RwLock::new(snap),
            refresh_lock: tokio::sync::Mutex::new(()),
        })
    }

    fn snapshot(&self) -> (Arc<KeySet>, Option<Instant>, u64) {
        let s = self.state.read();
        (s.keys.clone(), s.loaded_at, s.generation)
    }

    /// Is a set loaded at `loaded_at` fresh (no refresh needed)?
    fn is_fresh(&self, loaded_at: Option<Instant>) -> bool {
        match (&self.source, loaded_at) {
            (_, None) => false,
            (JwksSource::File(_), Some(_)) => true,
            (JwksSource::Url { .. }, Some(t)) => t.elapsed() < self.cache_ttl,
        }
    }

    /// May a set loaded at `loaded_at` still be used after a failed refresh?
    fn is_usable(&self, loaded_at: Option<Instant>) -> bool {
        match (&self.source, loaded_at) {
            (_, None) => false,
            (JwksSource::File(_), Some(_)) => true,
            (JwksSource::Url { .. }, Some(t)) => t.elapsed() < self.cache_ttl.saturating_mul(2),
        }
    }

    pub(crate) async fn find(
        &self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<Arc<KeyEntry>, &'static str> {
        let (keys, loaded_at, generation) = self.snapshot();
        if self.is_fresh(loaded_at) {
            match keys.select(alg, kid) {
                Select::Found(k) => return Ok(k),
                Select::Refused(why) => return Err(why),
                Select::Unknown => {}
            }
        }
        self.refresh(generation).await;
        let (keys, loaded_at, _) = self.snapshot();
        if !self.is_usable(loaded_at) {
            return Err("signing keys unavailable");
        }
        match keys.select(alg, kid) {
            Select::Found(k) => Ok(k),
            Select::Refused(why) => Err(why),
            Select::Unknown => Err("unknown signing key"),
        }
    }

    /// Loads the set again unless another caller already did since `seen_generation`
    /// or the last attempt is younger than `refresh_min`. Single-flight.
    pub(crate) async fn refresh(&self, seen_generation: u64) {
        let _guard = self.refresh_lock.lock().await;
        {
            let s = self.state.read();
            if s.generation != seen_generation {
                return;
            }
            if s.last_attempt
                .is_some_and(|t| t.elapsed() < self.refresh_min)
            {
                return;
            }
        }
        self.state.write().last_attempt = Some(Instant::now());
        let loaded = match &self.source {
            JwksSource::File(path) => read_file(path).await,
            JwksSource::Url { uri, client } => fetch(client, uri).await,
        }
        .and_then(|bytes| parse_jwks(&bytes));
        match loaded {
            Ok(set) => {
                tracing::info!(keys = set.len(), "JWKS loaded");
                let mut s = self.state.write();
                s.keys = Arc::new(set);
                s.loaded_at = Some(Instant::now());
                s.generation += 1;
            }
            Err(e) => tracing::warn!(error = e.as_str(), "JWKS refresh failed"),
        }
    }

    /// Initial load for a URL source (no-op when something is loaded already).
    pub(crate) async fn prefetch(&self) {
        let (_, loaded_at, generation) = self.snapshot();
        if loaded_at.is_none() {
            self.refresh(generation).await;
        }
    }

    #[cfg(test)]
    pub(crate) fn key_count(&self) -> usize {
        self.snapshot().0.len()
    }
}

fn read_file_sync(path: &Path) -> Result<Vec<u8>, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.len() > MAX_JWKS_BYTES as u64 {
        return Err(format!(
            "{} is larger than {MAX_JWKS_BYTES} bytes",
            path.display()
        ));
    }
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

async fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || read_file_sync(&path))
        .await
        .map_err(|e| format!("JWKS read task failed: {e}"))?
}

/// GET the JWKS (`https://` verified, see `tls::client`), bounded in time and size.
async fn fetch(client: &JwksClient, uri: &http::Uri) -> Result<Vec<u8>, String> {
    let req = http::Request::get(uri.clone())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::USER_AGENT, "taskgate")
        .body(Empty::new())
        .map_err(|e| format!("bad JWKS request: {e}"))?;
    let work = async {
        let resp = client.request(req).await.map_err(|e| {
            if let Some(reason) = crate::tls::failure_reason(&e) {
                crate::metrics::tls_handshake_failed("outbound", "jwks", reason);
            }
            format!(
                "JWKS fetch from {uri} failed: {}",
                crate::tls::error_chain(&e)
            )
        })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("JWKS fetch answered {status}"));
        }
        let body = Limited::new(resp.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(|e| format!("JWKS body: {e}"))?;
        Ok(body.to_bytes().to_vec())
    };
    tokio::time::timeout(FETCH_TIMEOUT, work)
        .await
        .map_err(|_| format!("JWKS fetch timed out after {FETCH_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::parse_jwks;

    #[test]
    fn a_document_without_a_keys_array_says_so() {
        for doc in [
            "{}",
            r#"{"keys": null}"#,
            r#"{"keys": {"kty": "RSA"}}"#,
            r#"{"keys": "[]"}"#,
            r#"[{"keys": []}]"#,
            r#"[[]]"#,
            "5",
            "null",
        ] {
            assert_eq!(
                parse_jwks(doc.as_bytes()).err().as_deref(),
                Some("no \"keys\" array"),
                "{doc}"
            );
        }
        assert!(parse_jwks(b"{").is_err_and(|e| e.starts_with("not JSON: ")));
        // An empty or unusable list is a list: the error is about its keys.
        for doc in [
            r#"{"keys": []}"#,
            r#"{"keys": "x", "keys": [5, "k", null]}"#,
        ] {
            assert_eq!(
                parse_jwks(doc.as_bytes()).err().as_deref(),
                Some("no usable RSA or EC P-256 signature key"),
                "{doc}"
            );
        }
    }
}
