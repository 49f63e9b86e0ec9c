//! `server.log_format` and `edge.log_format`: how log lines are written on stderr.

use super::error::{ConfigError, invalid};

/// `"text"` (the default) or `"json"` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// The value of the `key` the file wrote as `written`. Read as a string first and
    /// turned into the enum at load, so an unknown value is refused as a problem with
    /// that key (`ConfigError::Invalid`), like every other invalid value.
    pub(super) fn from_key(key: &str, written: &str) -> Result<Self, ConfigError> {
        match written {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(invalid(key, "must be \"text\" or \"json\"")),
        }
    }
}
