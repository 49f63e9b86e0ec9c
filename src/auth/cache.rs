//! Bounded cache of verified tokens, keyed by SHA-256 of the token, honoured until `exp`.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::Principal;

pub(crate) type Digest = [u8; 32];

/// SHA-256 of the token; the cache never stores the token itself.
pub(crate) fn digest(token: &str) -> Digest {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

pub(crate) struct TokenCache {
    capacity: usize,
    map: Mutex<HashMap<Digest, (Principal, u64)>>,
}

impl TokenCache {
    pub(crate) fn new(capacity: usize) -> Self {
        TokenCache {
            capacity,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The cached principal if the token was verified before and `now < exp`.
    pub(crate) fn get(&self, key: &Digest, now: u64) -> Option<Principal> {
        let mut map = self.map.lock();
        match map.get(key) {
            Some((p, exp)) if now < *exp => Some(p.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers a verified token until `exp`. When full, expired entries go first,
    /// then an arbitrary tenth of the entries.
    pub(crate) fn insert(&self, key: Digest, principal: Principal, exp: u64, now: u64) {
        if exp <= now || self.capacity == 0 {
            return;
        }
        let mut map = self.map.lock();
        if map.len() >= self.capacity && !map.contains_key(&key) {
            map.retain(|_, (_, e)| now < *e);
            if map.len() >= self.capacity {
                let drop_n = (self.capacity / 10).max(1);
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
        self.map.lock().len()
    }
}
