-- taskgate PostgreSQL schema, version 3: 2025-era client sessions
-- (docs/design.md §22 "Clients of the 2025 era").
--
-- Expand-only: a gateway that predates it never reads the table.

-- One row per session, bound to the principal that opened it. The record is the
-- exact bytes of its JSON (never jsonb: the client's clientInfo and capabilities stay
-- byte-exact); the other columns are copies of record fields that queries filter or
-- sort on. Updated only by compare-and-swap on `version`.
CREATE TABLE legacy_sessions (
    session_id   text   PRIMARY KEY,
    tenant       text   NOT NULL,
    subject      text   NOT NULL,
    last_seen_ms bigint NOT NULL,
    version      bigint NOT NULL,
    record       bytea  NOT NULL
);
-- A principal's sessions (the cap, and which to evict at it).
CREATE INDEX legacy_sessions_owner ON legacy_sessions (tenant, subject, last_seen_ms);
-- The idle sweep, least recently seen first.
CREATE INDEX legacy_sessions_idle ON legacy_sessions (last_seen_ms);
