//! The one change-stream pump of both eras: an open SSE stream that relays what its
//! client asked to hear — the upstream session's notifications and the changes of
//! tasks it follows — with keep-alive comments, until the client goes away or the
//! stream ends. `subscriptions.rs` pumps a 2026 `subscriptions/listen`;
//! `legacy/stream.rs` a 2025-era session's standalone GET stream. What each admits,
//! and how it tells a task's change, is the stream's ([`Stream`]); the loop is here.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};

use super::reply;
use crate::tasks::Change;
use crate::upstream::SessionNotification;

/// What a stream does after a task change was announced (or changes were missed).
pub(super) enum Reread {
    /// Read these tasks again; `only_changed`: tell only what differs from what this
    /// stream showed (changes were missed, so every task is read).
    Tasks {
        ids: Vec<String>,
        only_changed: bool,
    },
    /// Nothing this stream follows.
    Nothing,
    /// The change stream ended: so does this stream.
    Stop,
    /// The change stream ended: this stream goes on without it.
    Detach,
}

/// What one stream makes of what it hears.
pub(super) trait Stream: Send + 'static {
    /// An upstream session notification as a message for this stream, if admitted.
    fn notification(&mut self, n: SessionNotification) -> Option<Value>;
    /// What to read again after a task change.
    fn changed(&mut self, c: Result<Change, RecvError>) -> Reread;
    /// Follow a task from now on (one this stream's client created).
    fn follow(&mut self, id: String) -> Option<String>;
    /// Read task `id` and send what this stream tells of it: `false` once the client
    /// went away.
    fn announce(
        &mut self,
        id: &str,
        only_changed: bool,
        tx: &mpsc::Sender<Bytes>,
    ) -> impl Future<Output = bool> + Send;
}

/// Where a stream hears from.
pub(super) struct Sources {
    pub(super) notes: broadcast::Receiver<SessionNotification>,
    /// Task changes, when the stream follows tasks.
    pub(super) changes: Option<broadcast::Receiver<Change>>,
    /// Tasks to follow from now on, when the stream's client creates them.
    pub(super) followed: Option<mpsc::Receiver<String>>,
    /// The stream's end, other than its client going away (a session's end).
    pub(super) ended: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Relay until the client goes away or the stream ends.
pub(super) async fn pump<S: Stream>(
    mut stream: S,
    mut src: Sources,
    tx: &mpsc::Sender<Bytes>,
    keepalive: Duration,
) {
    let mut ticker = tokio::time::interval(keepalive);
    ticker.tick().await;
    loop {
        tokio::select! {
            n = src.notes.recv() => match n {
                Ok(n) => {
                    if let Some(msg) = stream.notification(n)
                        && tx.send(reply::sse_event(&msg)).await.is_err()
                    {
                        break;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
            id = recv_followed(&mut src.followed), if src.followed.is_some() => {
                let Some(id) = id else {
                    src.followed = None;
                    continue;
                };
                if let Some(id) = stream.follow(id)
                    && !stream.announce(&id, false, tx).await
                {
                    break;
                }
            }
            c = recv_change(&mut src.changes), if src.changes.is_some() => {
                match stream.changed(c) {
                    Reread::Tasks { ids, only_changed } => {
                        for id in ids {
                            if !stream.announce(&id, only_changed, tx).await {
                                return;
                            }
                        }
                    }
                    Reread::Nothing => {}
                    Reread::Stop => break,
                    Reread::Detach => src.changes = None,
                }
            }
            () = src.ended.as_mut() => break,
            _ = ticker.tick() => {
                if tx.send(reply::sse_keepalive()).await.is_err() {
                    break;
                }
            }
        }
    }
}

async fn recv_followed(rx: &mut Option<mpsc::Receiver<String>>) -> Option<String> {
    match rx.as_mut() {
        Some(r) => r.recv().await,
        None => None,
    }
}

async fn recv_change(rx: &mut Option<broadcast::Receiver<Change>>) -> Result<Change, RecvError> {
    match rx.as_mut() {
        Some(r) => r.recv().await,
        None => Err(RecvError::Closed),
    }
}
