//! Bounded cache of verified tokens, keyed by SHA-256 of the token, honoured until `exp`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::outcome::Principal;

pub(crate) type Digest = [u8; 32];

/// SHA-256 of the token; the cache never stores the token itself.
pub(crate) fn digest(token: &str) -> Digest {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Independent parts of the cache, each behind its own lock: every request looks its
/// token up here, and with one lock the runtime's worker threads queued behind each
/// other on it (benches/RESULTS.md, issue 26: most of the contended-lock yields on the
/// `tasks/get` path were this lock).
const SHARDS: usize = 16;

type Shard = Mutex<HashMap<Digest, (Arc<Principal>, u64)>>;

pub(crate) struct TokenCache {
    /// Entries per shard at most (the capacity split evenly, at least one).
    shard_capacity: usize,
    shards: [Shard; SHARDS],
}

impl TokenCache {
    pub(crate) fn new(capacity: usize) -> Self {
        TokenCache {
            shard_capacity: capacity.div_ceil(SHARDS),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    /// The digest is uniform, so its first byte picks a shard evenly.
    fn shard(&self, key: &Digest) -> &Shard {
        &self.shards[usize::from(key[0]) % SHARDS]
    }

    /// The cached principal if the token was verified before and `now < exp`.
    pub(crate) fn get(&self, key: &Digest, now: u64) -> Option<Principal> {
        // Only the `Arc` is cloned under the lock; the principal's strings after it.
        let hit = {
            let mut map = self.shard(key).lock();
            match map.get(key) {
                Some((p, exp)) if now < *exp => Some(p.clone()),
                Some(_) => {
                    map.remove(key);
                    None
                }
                None => None,
            }
        };
        hit.map(|p| (*p).clone())
    }

    /// Remembers a verified token until `exp`. When its shard is full, expired entries
    /// go first, then an arbitrary tenth of the shard's entries.
    pub(crate) fn insert(&self, key: Digest, principal: Principal, exp: u64, now: u64) {
        if exp <= now || self.shard_capacity == 0 {
            return;
        }
        let principal = Arc::new(principal);
        let cap = self.shard_capacity;
        let mut map = self.shard(&key).lock();
        if map.len() >= cap && !map.contains_key(&key) {
            map.retain(|_, (_, e)| now < *e);
            if map.len() >= cap {
                let drop_n = (cap / 10).max(1);
                let victims: Vec<Digest> = map.keys().take(drop_n).copied().collect();
                for v in victims {
                    map.remove(&v);
                }
            }
        }
        map.insert(key, (principal, exp));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.shard_capacity * SHARDS
    }
}
