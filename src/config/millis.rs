//! Durations in the file: a key ending in `_ms` holds an integer number of
//! milliseconds (the documented contract, README "Configuration"), and the code holds a
//! `Duration`, so no use site converts.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// `deserialize_with` for a `Duration` written as milliseconds.
pub(super) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// `deserialize_with` for an optional `Duration` written as milliseconds (the field
/// also needs `#[serde(default)]`, as any `deserialize_with` field that may be absent).
pub(super) fn opt_millis<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<u64>::deserialize(d).map(|ms| ms.map(Duration::from_millis))
}

/// A configured duration as whole milliseconds, for what carries milliseconds on
/// (task record fields, wire values, log lines and metrics). Exact for every configured
/// duration, since each was read from a `u64` of milliseconds.
pub fn as_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
