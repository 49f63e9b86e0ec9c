//! What a configuration problem looks like, and the checks several tables share.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config key `{key}`: {problem}")]
    Invalid { key: String, problem: String },
}

pub(crate) fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

/// A certificate and its key: both set or neither.
pub(super) fn tls_pair(
    cert_key: &str,
    cert: &Option<PathBuf>,
    key_key: &str,
    key: &Option<PathBuf>,
) -> Result<(), ConfigError> {
    match (cert, key) {
        (Some(_), None) => Err(invalid(key_key, format!("required with {cert_key}"))),
        (None, Some(_)) => Err(invalid(cert_key, format!("required with {key_key}"))),
        _ => Ok(()),
    }
}
