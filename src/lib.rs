//! taskgate: an MCP 2026-07-28 + Tasks gateway in front of legacy synchronous MCP
//! servers. See `README.md` for what it does, `ARCHITECTURE.md` for the layers and
//! `docs/design.md` for the design decisions.

pub mod admin_client;
pub mod auth;
pub mod config;
pub mod demo;
#[cfg(feature = "edge")]
pub mod edge;
pub mod front;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod limits;
pub mod logsink;
pub mod metrics;
pub mod protocol;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod tls;
pub mod upstream;
