//! `[legacy]`: the bounds on 2025-era client sessions (docs/design.md §22 "Clients of
//! the 2025 era").

use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use super::millis::millis;

/// Shortest idle time a session may be given: a shorter one would expire sessions
/// between a client's ordinary requests.
const MIN_SESSION_IDLE: Duration = Duration::from_millis(1_000);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LegacyConfig {
    /// Sessions one principal may hold at once; at the cap the oldest idle one is
    /// closed to make room, and when every one is in use a new one is refused.
    pub max_sessions_per_principal: usize,
    /// A session nobody used for this long is closed by the sweeper.
    #[serde(rename = "session_idle_ms", deserialize_with = "millis")]
    pub session_idle: Duration,
}

impl Default for LegacyConfig {
    fn default() -> Self {
        Self {
            max_sessions_per_principal: 100,
            session_idle: Duration::from_millis(1_800_000),
        }
    }
}

impl LegacyConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_sessions_per_principal == 0 {
            return Err(invalid("legacy.max_sessions_per_principal", "must be >= 1"));
        }
        if self.session_idle < MIN_SESSION_IDLE {
            return Err(invalid("legacy.session_idle_ms", "must be >= 1000"));
        }
        Ok(())
    }
}
