//! Bundled demo legacy MCP server (`taskgate demo-upstream`).
