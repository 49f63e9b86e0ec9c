//! Upstream identities, their tools' `Mcp-Param-*` header maps, and secrets.

use super::codec::{decode, encode, upgrade_none};
use super::schema::{META_SECRET, meta_key};
use super::{Cas, SledStore};
use crate::protocol::UpstreamInfo;
use crate::protocol::param_headers::ToolHeaders;
use crate::store::{StoreError, StoredIdentity, StoredToolHeaders};
use rand::RngCore;

impl SledStore {
    pub(crate) fn upstream_identity(&self, name: &str) -> Result<Option<UpstreamInfo>, StoreError> {
        let key = name.as_bytes();
        match self.upstream_identity.get(key) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                decode::<StoredIdentity<UpstreamInfo>>("upstream_identity", key, &b, upgrade_none)
                    .map(|stored| Some(stored.info))
            }
            Err(e) => Err(self.read_failed("get upstream identity", e)),
        }
    }

    pub(crate) fn put_upstream_identity(
        &self,
        name: &str,
        identity: &UpstreamInfo,
    ) -> Result<bool, StoreError> {
        let bytes = encode(
            "upstream_identity",
            name,
            &StoredIdentity::current(identity),
        )?;
        let key = name.as_bytes();
        let stored = self
            .upstream_identity
            .get(key)
            .map_err(|e| self.read_failed("get upstream identity", e))?;
        if stored.as_deref() == Some(bytes.as_slice()) {
            return Ok(false);
        }
        self.put(
            &self.upstream_identity,
            "put upstream identity",
            key,
            &bytes,
        )?;
        Ok(true)
    }

    pub(crate) fn upstream_tool_headers(
        &self,
        name: &str,
    ) -> Result<Option<ToolHeaders>, StoreError> {
        let key = name.as_bytes();
        match self.upstream_tool_headers.get(key) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                decode::<StoredToolHeaders>("upstream_tool_headers", key, &b, upgrade_none)
                    .map(|stored| Some(stored.tools))
            }
            Err(e) => Err(self.read_failed("get upstream tool headers", e)),
        }
    }

    /// Written only when the bytes differ, like the identity.
    pub(crate) fn put_upstream_tool_headers(
        &self,
        name: &str,
        headers: &ToolHeaders,
    ) -> Result<bool, StoreError> {
        let bytes = encode(
            "upstream_tool_headers",
            name,
            &StoredToolHeaders::current(headers),
        )?;
        let key = name.as_bytes();
        let stored = self
            .upstream_tool_headers
            .get(key)
            .map_err(|e| self.read_failed("get upstream tool headers", e))?;
        if stored.as_deref() == Some(bytes.as_slice()) {
            return Ok(false);
        }
        self.put(
            &self.upstream_tool_headers,
            "put upstream tool headers",
            key,
            &bytes,
        )?;
        Ok(true)
    }

    /// Get-or-create; creation is a compare-and-swap (concurrent first calls agree on
    /// one secret) followed by a blocking flush, so the secret is durable before it is
    /// returned the first time. Call it at start-up, not on a hot path.
    pub(crate) fn secret(&self, name: &str) -> Result<[u8; 32], StoreError> {
        let key = meta_key(META_SECRET, name.as_bytes());
        let as_secret = |v: &[u8]| {
            <[u8; 32]>::try_from(v).map_err(|_| {
                StoreError::Corrupt(format!("meta/secret/{name}: not 32 bytes").into())
            })
        };
        if let Some(v) = self
            .meta
            .get(&key)
            .map_err(|e| self.read_failed("get secret", e))?
        {
            return as_secret(&v);
        }
        let mut fresh = [0u8; 32];
        rand::rng().fill_bytes(&mut fresh);
        let r = self
            .meta
            .compare_and_swap(&key, None as Option<&[u8]>, Some(&fresh[..]));
        let secret = match self.cas("create secret", r)? {
            Cas::Done => fresh,
            Cas::Lost(Some(v)) => as_secret(&v)?,
            Cas::Lost(None) => {
                return Err(StoreError::Corrupt(
                    format!("meta/secret/{name}: compare-and-swap failed without a current value")
                        .into(),
                ));
            }
        };
        self.flush_blocking()?;
        Ok(secret)
    }
}
