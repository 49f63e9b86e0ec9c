//! The transport's constants: the headers it speaks and the bounds it keeps (module
//! docs, "Bounds").

use std::time::Duration;

pub(super) const ACCEPT_POST: &str = "application/json, text/event-stream";
pub(super) const ACCEPT_SSE: &str = "text/event-stream";
pub(super) const SESSION_HEADER: &str = "mcp-session-id";
pub(super) const VERSION_HEADER: &str = "mcp-protocol-version";
pub(super) const LAST_EVENT_ID: &str = "last-event-id";

pub(super) const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A caller arriving this soon after a failed handshake gets the failure instead of a
/// new attempt, so a burst of calls against a dead upstream is not a burst of connects.
pub(super) const FAIL_FAST: Duration = Duration::from_millis(250);
pub(super) const INIT_TIMEOUT: Duration = Duration::from_secs(30);
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A notification or response POST is answered `202` at once by any live server.
pub(super) const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// `notifications/cancelled` plus the `ping` that verifies the session afterwards;
/// new calls wait at most this long for the verdict.
pub(super) const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const MAX_REDIRECTS: usize = 5;
/// When a stream ends without `retry:` but with an id, wait this long before resuming.
pub(super) const DEFAULT_RESUME_DELAY_MS: u64 = 500;
/// Cap on a server-supplied `retry:` so a hostile value cannot park a call forever.
pub(super) const MAX_RESUME_DELAY_MS: u64 = 60_000;
/// Consecutive resumptions that deliver no event at all before the call is abandoned.
pub(super) const MAX_EMPTY_RESUMES: u32 = 5;
pub(super) const SNIPPET_BYTES: usize = 512;
