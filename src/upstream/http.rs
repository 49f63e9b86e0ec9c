//! STUB
use super::*;
use std::sync::Arc;
pub struct HttpOptions {
    pub name: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub max_message_bytes: usize,
}
pub struct HttpUpstream;
impl HttpUpstream {
    pub fn start(_opts: HttpOptions) -> Arc<Self> {
        Arc::new(Self)
    }
}
impl LegacyTransport for HttpUpstream {
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
