//! Bundled demo legacy MCP server (`taskgate demo-upstream`).
//!
//! Speaks the legacy protocol (2025-03-26 / 2025-06-18 / 2025-11-25, with an
//! `initialize` handshake) over stdio ([`run_stdio`]) or legacy Streamable
//! HTTP at `/mcp` ([`run_http`], [`serve_http`]). Both transports share the
//! protocol core in [`server`]; the tools live in `tools.rs`.

mod call;
pub mod http;
pub mod server;
pub mod stdio;
mod tools;

pub use http::{run_http, serve_http};
pub use stdio::run_stdio;
