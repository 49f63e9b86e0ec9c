//! SSE parsing for legacy upstream streams.
