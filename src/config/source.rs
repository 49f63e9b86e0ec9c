//! Where a configuration comes from: `--config`, `./config/taskgate.toml` or the
//! default compiled into the binary.

use std::path::{Path, PathBuf};

use super::error::ConfigError;

/// The shipped `config/taskgate.toml`, compiled in so the file and the binary's
/// default cannot drift apart.
pub const SHIPPED_DEFAULT: &str = include_str!("../../config/taskgate.toml");

/// Where `taskgate` looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "config/taskgate.toml";

/// Where a configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    File(PathBuf),
    /// [`SHIPPED_DEFAULT`]: no `--config` and no `./config/taskgate.toml`.
    Embedded,
}

impl ConfigSource {
    /// `--config` when given; else `./config/taskgate.toml` when it exists; else the
    /// embedded default, so the binary works outside the repository.
    pub fn resolve(explicit: Option<PathBuf>) -> Self {
        match explicit {
            Some(path) => Self::File(path),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                Self::File(PathBuf::from(DEFAULT_CONFIG_PATH))
            }
            None => Self::Embedded,
        }
    }

    /// The file's path (empty for the embedded default) and its text.
    pub(super) fn read(&self) -> Result<(PathBuf, String), ConfigError> {
        match self {
            Self::File(path) => std::fs::read_to_string(path)
                .map(|text| (path.clone(), text))
                .map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                }),
            Self::Embedded => Ok((PathBuf::new(), SHIPPED_DEFAULT.to_string())),
        }
    }

    /// What the start-up log says about the source.
    pub fn describe(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Embedded => {
                "the built-in default (no --config, no ./config/taskgate.toml)".into()
            }
        }
    }
}
