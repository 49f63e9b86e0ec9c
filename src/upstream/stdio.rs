//! STUB
use super::*;
use std::sync::Arc;
pub struct StdioOptions {
    pub name: String,
    pub program: String,
    pub args: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub processes: usize,
    pub cancel_grace_ms: u64,
    pub idle_reap_ms: u64,
    pub max_message_bytes: usize,
    pub pid_dir: std::path::PathBuf,
}
pub struct StdioPool;
impl StdioPool {
    pub fn start(_opts: StdioOptions) -> Arc<Self> {
        Arc::new(Self)
    }
}
pub fn kill_leftovers(_pid_dir: &std::path::Path) -> usize {
    0
}
impl LegacyTransport for StdioPool {
    fn ensure_ready(&self) -> BoxFuture<'_, Result<UpstreamInfo, UpstreamError>> {
        Box::pin(async { Err(UpstreamError::ShuttingDown) })
    }
    fn info(&self) -> Option<UpstreamInfo> {
        None
    }
    fn state(&self) -> TransportState {
        TransportState::Starting
    }
    fn call(
        &self,
        _spec: CallSpec,
        _events: mpsc::Sender<CallEvent>,
    ) -> BoxFuture<'_, Result<CallOutcome, UpstreamError>> {
        Box::pin(async { Err(UpstreamError::ShuttingDown) })
    }
    fn notifications(&self) -> broadcast::Receiver<SessionNotification> {
        broadcast::channel(1).1
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
