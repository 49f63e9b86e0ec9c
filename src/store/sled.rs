//! sled backend (stub)
