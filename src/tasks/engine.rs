//! The `Engine` type: the parts it is made of (ARCHITECTURE.md "The engine's parts").
//! It is defined below the files that do the engine's work, so that one which needs
//! most of the engine can take `&Engine` without naming `mod.rs`, whose `impl Engine`
//! is the engine's surface and names those files (ARCHITECTURE.md "Layers": a type
//! whose behaviour is spread over its module's files sits in a file of its own below
//! them, `mod.rs` the public surface on top).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use super::live::LiveCalls;
use super::mrtr::Holds;
use super::replica_state::Replica;
use super::repo::TaskRepo;
use super::sessions::SessionRepo;
use super::tenant_calls::TenantCalls;
use crate::config::Config;
use crate::limits::Limits;
use crate::store::TaskStore;
use crate::upstream::UpstreamSet;

/// Shared state of the tasks engine.
pub struct Engine {
    /// The store, and every write and durable read of a task (`repo.rs`).
    pub(super) tasks: TaskRepo,
    pub(super) cfg: Arc<Config>,
    /// This gateway's flow control (owned by the gateway, not the process).
    pub(super) limits: Arc<Limits>,
    /// The promoted calls running in this process (`live.rs`).
    pub(super) calls: LiveCalls,
    /// This replica's seat, lease and relays on a shared store (`replica.rs`).
    pub(super) replica: Replica,
    /// An operator drained this replica (`admin.rs`): no new upstream calls.
    pub(super) admin_drained: AtomicBool,
    /// The 2025-era client sessions (`sessions.rs`).
    pub(super) sessions: SessionRepo,
    /// The upstreams, once started: a takeover re-attaches to upstream tasks through
    /// them (`follow.rs`).
    pub(super) upstreams: OnceLock<Arc<UpstreamSet>>,
    /// Each tenant's calls and creations in flight here, and the purge fence
    /// (`tenant_calls.rs`, `purge.rs`).
    pub(super) tenant_calls: TenantCalls,
    /// The calls held for an MRTR round, for every method that may answer
    /// `input_required` (`mrtr.rs`).
    pub(super) holds: Arc<Holds>,
}

/// An engine over `store`, with nothing running yet.
pub(super) fn assemble(
    store: Arc<dyn TaskStore>,
    cfg: Arc<Config>,
    limits: Arc<Limits>,
    holds: Arc<Holds>,
) -> Engine {
    Engine {
        replica: Replica::new(cfg.replica_id()),
        sessions: SessionRepo::new(store.clone(), &cfg.legacy),
        tasks: TaskRepo::new(store),
        cfg,
        limits,
        calls: LiveCalls::default(),
        upstreams: OnceLock::new(),
        admin_drained: AtomicBool::new(false),
        tenant_calls: TenantCalls::default(),
        holds,
    }
}
