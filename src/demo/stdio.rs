//! stdio transport of the demo server: newline-delimited JSON-RPC.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::server::{Outbound, Session, SessionConfig, Sink, Stats, Transport};

enum WriterCmd {
    Line(String),
    /// Flush, shut the writer down and acknowledge.
    Close(oneshot::Sender<()>),
}

/// Sink that serialises messages as lines for the writer task.
struct LineSink(mpsc::UnboundedSender<WriterCmd>);

impl Sink for LineSink {
    fn send(&self, out: Outbound) {
        if let Outbound::Message(v) = out {
            let _ = self.0.send(WriterCmd::Line(v.to_string()));
        }
    }
}

/// How long in-flight calls may still answer after stdin EOF.
const EOF_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Runs the demo server on stdin/stdout until stdin reaches EOF (or forever
/// with `DEMO_IGNORE_EOF=1`).
pub async fn run_stdio() -> anyhow::Result<()> {
    let config = SessionConfig {
        transport: Transport::Stdio,
        send_roots_on_init: env_flag("DEMO_SEND_ROOTS_ON_INIT"),
    };
    // tokio's `io-std` feature is not enabled, so bridge the std handles
    // through in-memory pipes serviced by plain threads.
    let handle = tokio::runtime::Handle::current();
    let (stdin_tx, stdin_rx) = tokio::io::duplex(64 * 1024);
    let (stdout_tx, stdout_rx) = tokio::io::duplex(64 * 1024);
    {
        let handle = handle.clone();
        std::thread::Builder::new()
            .name("demo-stdin".into())
            .spawn(move || pump_stdin(handle, stdin_tx))?;
    }
    let (done_tx, done_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("demo-stdout".into())
        .spawn(move || {
            pump_stdout(handle, stdout_rx);
            let _ = done_tx.send(());
        })?;
    let result = serve_lines(
        tokio::io::BufReader::new(stdin_rx),
        stdout_tx,
        config,
        env_flag("DEMO_IGNORE_EOF"),
    )
    .await;
    // serve_lines shut the pipe down; wait for the bytes to reach stdout.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), done_rx).await;
    result
}

fn pump_stdin(handle: tokio::runtime::Handle, mut pipe: tokio::io::DuplexStream) {
    use std::io::Read;
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("demo: reading stdin failed: {e}");
                break;
            }
        };
        if handle.block_on(pipe.write_all(&buf[..n])).is_err() {
            break;
        }
    }
    let _ = handle.block_on(pipe.shutdown());
}

fn pump_stdout(handle: tokio::runtime::Handle, mut pipe: tokio::io::DuplexStream) {
    use std::io::Write;
    use tokio::io::AsyncReadExt;
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match handle.block_on(pipe.read(&mut buf)) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if stdout.write_all(&buf[..n]).is_err() || stdout.flush().is_err() {
            break;
        }
    }
}

/// The stdio server over arbitrary streams (used by `run_stdio` and tests).
pub async fn serve_lines<R, W>(
    reader: R,
    writer: W,
    config: SessionConfig,
    ignore_eof: bool,
) -> anyhow::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let writer_task = tokio::spawn(write_lines(rx, writer));
    let sink: Arc<dyn Sink> = Arc::new(LineSink(tx.clone()));
    let session = Session::new(config, Arc::new(Stats::default()), sink.clone());
    let mut lines = reader.lines();
    while let Some(line) = lines.next_line().await? {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            // 2025-03-26 batches: handle each element individually.
            Ok(Value::Array(items)) => {
                for item in items {
                    session.handle(item, sink.clone());
                }
            }
            Ok(msg) => session.handle(msg, sink.clone()),
            Err(e) => {
                tracing::warn!("demo: unparsable line: {e}");
                sink.send(Outbound::Message(json!({
                    "jsonrpc": "2.0",
                    "id": null,
                    "error": {"code": -32700, "message": "Parse error"},
                })));
            }
        }
    }
    if ignore_eof {
        eprintln!("taskgate-demo: stdin closed; ignoring EOF (DEMO_IGNORE_EOF=1)");
        std::future::pending::<()>().await;
    }
    // Give calls already running a short grace period to answer (so that
    // `printf ... | taskgate demo-upstream` works), then write out everything
    // queued so far and shut the writer down.
    let deadline = tokio::time::Instant::now() + EOF_GRACE;
    while session.in_flight_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (ack_tx, ack_rx) = oneshot::channel();
    if tx.send(WriterCmd::Close(ack_tx)).is_ok() {
        let _ = ack_rx.await;
    }
    writer_task.abort();
    Ok(())
}

async fn write_lines<W: AsyncWrite + Unpin>(mut rx: mpsc::UnboundedReceiver<WriterCmd>, mut w: W) {
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriterCmd::Line(mut line) => {
                line.push('\n');
                if w.write_all(line.as_bytes()).await.is_err() || w.flush().await.is_err() {
                    tracing::warn!("demo: stdout closed");
                    return;
                }
            }
            WriterCmd::Close(ack) => {
                let _ = w.flush().await;
                let _ = w.shutdown().await;
                drop(w);
                let _ = ack.send(());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[tokio::test]
    async fn stdio_roundtrip_and_eof_exit() {
        let (client_in, server_in) = tokio::io::duplex(1 << 16);
        let (server_out, client_out) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_lines(
            BufReader::new(server_in),
            server_out,
            SessionConfig {
                transport: Transport::Stdio,
                send_roots_on_init: false,
            },
            false,
        ));
        let mut client_in = client_in;
        let mut out = BufReader::new(client_out).lines();
        client_in
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-03-26\",\"capabilities\":{}}}\nnot json\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"yo\"}}}\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        for _ in 0..3 {
            let line = tokio::time::timeout(Duration::from_secs(5), out.next_line())
                .await
                .expect("timeout")
                .expect("read")
                .expect("line");
            got.push(serde_json::from_str::<Value>(&line).expect("json"));
        }
        assert_eq!(got[0]["result"]["protocolVersion"], "2025-03-26");
        assert_eq!(got[1]["error"]["code"], -32700);
        assert_eq!(got[2]["result"]["content"][0]["text"], "yo");
        drop(client_in);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("server did not exit on EOF")
            .expect("join")
            .expect("serve");
    }
}
