"""Native 2026-07-28 + tasks reference server for the load harness (benches/load.rs,
"Native reference" rows): fastmcp[tasks]==4.1.4 (.peers/venv-fastmcp, installed by
scripts/install-peers.sh), streamable HTTP on loopback, no auth.

    python native_fastmcp_server.py [PORT] [--concurrency N]

PORT 0 (the default) binds an ephemeral port. Once the app's lifespan has run (the
Docket backend and worker are up) and the socket is served, it prints one line on
stdout:

    native fastmcp listening on http://127.0.0.1:PORT/mcp

Tool `sleep {ms}` awaits asyncio.sleep(ms / 1000) and returns "slept N ms". It is
declared `task=True` (TaskConfig mode "optional"): a call whose `_meta` declares the
io.modelcontextprotocol/tasks client capability always runs as a task (the server
answers with a CreateTaskResult at once and a Docket worker runs the body), the
native counterpart of taskgate's `promote_after_ms = 0`; a call without it runs
inline. The task backend is fastmcp-tasks' default `memory://` Docket (burner-redis
in this process): task state lives in memory only, nothing is written to disk.

`--concurrency` is the Docket worker's concurrent-task limit (fastmcp-tasks' default
is 10; the harness raises it so 100 ms sleeps do not queue behind each other, like
taskgate's upstream `max_concurrency`). It is bounded by this one Python process.
"""

import argparse
import asyncio
import logging
import os
import signal
import stat
import sys
import threading

import uvicorn
from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension


def exit_on_stdin_eof() -> None:
    """Exit when the harness goes away even if it could not kill us: it holds our
    stdin pipe open, so EOF on it means it is gone. No-op unless stdin is a pipe."""
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return
    except OSError:
        return

    def wait() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            os._exit(0)

    threading.Thread(target=wait, daemon=True).start()


def build(concurrency: int) -> FastMCP:
    mcp = FastMCP("native-reference")
    mcp.add_extension(TasksExtension(url="memory://", concurrency=concurrency))

    @mcp.tool(task=True)
    async def sleep(ms: int = 100) -> str:
        """Sleep `ms` milliseconds (asynchronously), then answer."""
        await asyncio.sleep(max(ms, 0) / 1000)
        return f"slept {ms} ms"

    return mcp


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", nargs="?", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=1000)
    args = ap.parse_args()

    mcp = build(args.concurrency)
    app = mcp.http_app(path="/mcp")

    config = uvicorn.Config(
        app,
        # uvicorn binds (getaddrinfo gives an IPPROTO_TCP socket, so asyncio sets
        # TCP_NODELAY on accepted connections, as in a default `mcp.run()`; a socket
        # pre-bound with proto 0 would not get it and keep-alive requests would stall
        # ~40 ms on Nagle + delayed ACK).
        host="127.0.0.1",
        port=args.port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
        backlog=4096,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())

    for _ in range(3000):
        if server.started or serving.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        print("native fastmcp failed to start", file=sys.stderr, flush=True)
        if serving.done():
            serving.result()  # surface the exception
        os._exit(1)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"native fastmcp listening on http://127.0.0.1:{port}/mcp", flush=True)
    await serving


if __name__ == "__main__":
    logging.getLogger("docket").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    exit_on_stdin_eof()
    asyncio.run(main())
