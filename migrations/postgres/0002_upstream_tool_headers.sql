-- taskgate PostgreSQL schema, version 2: the `Mcp-Param-*` header map of each
-- upstream's tools (docs/design.md §12 "HTTP front").
--
-- Derived from the upstream's last `tools/list` and kept beside its identity, in a row
-- of its own so the identity record stays as it was (expand-only). The record is the
-- exact bytes of its JSON, `{"v", "tools": {tool: [{"name", "property"}]}}`, replaced
-- only when it differs.
CREATE TABLE upstream_tool_headers (
    name   text  PRIMARY KEY,
    record bytea NOT NULL
);
