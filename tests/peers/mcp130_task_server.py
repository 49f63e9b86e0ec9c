"""A 2025-11-25 task upstream built on the Python SDK `mcp` 1.30's experimental
server-side tasks (`server.experimental.enable_tasks()` + `ctx.experimental.run_task`),
installed by scripts/install-peers.sh into .peers/venv-mcp130.

    python mcp130_task_server.py stdio
    python mcp130_task_server.py http PORT      # Streamable HTTP on 127.0.0.1:PORT/mcp

It declares the 2025-11-25 `tasks` capability (list, cancel, requests.tools.call) and
serves these tools:

- `task_work` (`execution.taskSupport: "required"`): runs `ms` milliseconds (default
  2000) in `steps` steps (default 4), updating the task's statusMessage and sending
  `notifications/progress` on the call's progressToken after each step. With `ask`
  (a string) it asks for input once, half-way, with `elicitation/create` (schema
  `{answer: string}`, delivered through `tasks/result` as the SDK does). `fail`:
  "error" makes the work raise (the task ends `failed`, statusMessage the error),
  "isError" makes it return a `CallToolResult` with `isError: true`. It checks for
  cancellation before every step and stops. The result's text is
  `task_work done: <ms> ms, <steps> steps[, answer=<answer>]`.
- `task_optional` (`"optional"`): the same work; without `params.task` it runs inline
  and answers the `tools/call` itself (progress on the call's own stream).
- `echo` (no `execution`): a plain synchronous tool, `{text}` -> the text.

On HTTP it prints `listening on port PORT` to stderr once serving. A `tools/call` of
`task_work` without `params.task` is a JSON-RPC `-32601` error, as the 2025-11-25
spec (Tool-Level Negotiation) says; `echo` with `params.task` is also `-32601`.

Left as the SDK does it (a gateway in front must cope): task ids are
`<session scope>:<uuid>` and only the creating session sees them (get, result, cancel,
list); `params.task` without `ttl` yields a Task with no `ttl` key at all (the SDK drops
the null), which both SDK clients reject; `tasks/result` of a failed or cancelled task
is a success carrying only `_meta`; a result with `isError` ends `completed`; elicitation
request ids are strings (`task-<taskId>-<n>`); no notification on `tasks/cancel`.
Guarded here, since unguarded they crash the session: an input answer that arrives
after `tasks/cancel`, run_task's wrapper completing a cancelled task, and a status
notification to a session that has been deleted while its task runs.
"""

import json
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.lowlevel import Server

# The SDK marks its experimental tasks API deprecated (for mcp 2.0); that is the
# dialect this peer exists to speak.
warnings.filterwarnings("ignore", category=DeprecationWarning)

server = Server("taskgate-mcp130-task-server")
# Registers the default tasks/get, tasks/result, tasks/list and tasks/cancel handlers
# and makes `initialize` advertise `capabilities.tasks`.
support = server.experimental.enable_tasks()

WORK_SCHEMA = {
    "type": "object",
    "properties": {
        "ms": {"type": "integer", "minimum": 0},
        "steps": {"type": "integer", "minimum": 1},
        "ask": {"type": "string"},
        "fail": {"type": "string", "enum": ["error", "isError"]},
    },
}

TOOLS = [
    types.Tool(
        name="task_work",
        description="Runs ~2 s as a 2025-11-25 task: progress, optional input, cancellable.",
        inputSchema=WORK_SCHEMA,
        execution=types.ToolExecution(taskSupport=types.TASK_REQUIRED),
    ),
    types.Tool(
        name="task_optional",
        description="The same work; a task if asked for one, inline otherwise.",
        inputSchema=WORK_SCHEMA,
        execution=types.ToolExecution(taskSupport=types.TASK_OPTIONAL),
    ),
    types.Tool(
        name="echo",
        description="Synchronous echo.",
        inputSchema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
]
MODES = {t.name: (t.execution.taskSupport if t.execution else None) for t in TOOLS}

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "title": "Answer"}},
    "required": ["answer"],
}


def text_result(text: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=is_error)


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return TOOLS


async def quiet(send) -> None:
    """Await a send to the client, ignoring a session that has gone away."""
    try:
        await send
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass


async def stop_reason(task_id: str) -> str | None:
    """Why the work should stop: the task was cancelled, or the store dropped it
    (the in-memory store deletes a task `ttl` ms after creation, running or not)."""
    t = await support.store.get_task(task_id)
    if t is None:
        return "expired"
    return "cancelled" if t.status == types.TASK_STATUS_CANCELLED else None


async def run_work(args: dict[str, Any], progress, elicit, status, is_cancelled) -> types.CallToolResult | None:
    """The work shared by the task and the inline path; None when cancelled."""
    ms = int(args.get("ms", 2000))
    steps = max(1, int(args.get("steps", 4)))
    ask = args.get("ask")
    fail = args.get("fail")
    answer = None
    for i in range(steps):
        if await is_cancelled():
            return None
        if ask is not None and answer is None and i == steps // 2:
            got = await elicit(ask)
            answer = (got.content or {}).get("answer") if got.action == "accept" else f"<{got.action}>"
            if await is_cancelled():
                return None
        await anyio.sleep(ms / steps / 1000)
        await status(f"step {i + 1}/{steps}")
        await progress(i + 1, steps, f"step {i + 1}/{steps}")
    if await is_cancelled():
        return None
    if fail == "error":
        raise RuntimeError("task_work failed on request")
    text = f"task_work done: {ms} ms, {steps} steps" + (f", answer={answer}" if answer is not None else "")
    return text_result(text, is_error=(fail == "isError"))


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult | types.CreateTaskResult:
    ctx = server.request_context
    if name == "echo":
        return text_result(str(arguments.get("text", "")))
    token = ctx.meta.progressToken if ctx.meta else None

    if not ctx.experimental.is_task:
        # task_optional inline: progress and input on the tools/call's own stream.
        async def progress(p, total, msg):
            if token is not None:
                await ctx.session.send_progress_notification(token, p, total, msg, related_request_id=ctx.request_id)

        async def elicit(msg):
            return await ctx.session.elicit_form(msg, ANSWER_SCHEMA, related_request_id=ctx.request_id)

        async def nothing(*_a):
            return False

        result = await run_work(arguments, progress, elicit, nothing, nothing)
        return result if result is not None else text_result("cancelled", is_error=True)

    async def work(task: ServerTaskContext) -> types.CallToolResult:
        async def notify():
            # What the SDK's own notify=True sends, but quiet once the session is
            # gone (DELETEd while the task runs): unguarded, the send raises, run_task's
            # wrapper tries to fail the task, that notification raises again and the
            # session's task group crashes.
            t = task.task
            params = types.TaskStatusNotificationParams(
                taskId=t.taskId,
                status=t.status,
                statusMessage=t.statusMessage,
                createdAt=t.createdAt,
                lastUpdatedAt=t.lastUpdatedAt,
                ttl=t.ttl,
                pollInterval=t.pollInterval,
            )
            await quiet(ctx.session.send_notification(types.ServerNotification(types.TaskStatusNotification(params=params))))

        async def progress(p, total, msg):
            # The 2025-11-25 spec (Task Progress Notifications): the tools/call's
            # progressToken stays valid for the task's lifetime. The tools/call itself
            # was answered with the CreateTaskResult, so this goes on the session's
            # standalone stream (GET on HTTP).
            if token is not None:
                await quiet(ctx.session.send_progress_notification(token, p, total, msg))

        async def elicit(msg):
            # Queued for the task; delivered on the stream of the requestor's
            # tasks/result, with _meta["io.modelcontextprotocol/related-task"].
            try:
                return await task.elicit(msg, ANSWER_SCHEMA)
            except ValueError:
                # An answer that arrives after tasks/cancel: the SDK's elicit() sets
                # the cancelled task back to `working`, which the store refuses.
                # Unhandled, run_task's wrapper then fails the task, the store raises
                # again and the whole session crashes; stop quietly instead.
                if await stop_reason(task.task_id):
                    return types.ElicitResult(action="cancel")
                raise

        async def status(msg):
            try:
                await task.update_status(msg, notify=False)
            except ValueError:
                if await stop_reason(task.task_id):
                    return  # the next is_cancelled() stops the work
                raise
            await notify()

        async def is_cancelled():
            reason = await stop_reason(task.task_id)
            if reason == "cancelled":
                # Refresh the context's copy of the task (it reads `cancelled` now) so
                # the SDK's run_task wrapper does not try to complete a cancelled
                # task: the in-memory store raises on a transition out of a terminal
                # status, and that would escape into the session's task group.
                await task.update_status("cancelled by request; work stopped", notify=False)
            elif reason == "expired":
                # Nothing can be stored for a task the store dropped, and the context
                # offers no public way to say so: mark its copy terminal so run_task's
                # wrapper leaves it alone.
                task._ctx._task = task.task.model_copy(update={"status": types.TASK_STATUS_FAILED})  # noqa: SLF001
            return reason is not None

        async def finish(end):
            # Complete or fail here rather than in run_task's wrapper (which notifies
            # unguarded); a cancel that lands in between leaves the task cancelled.
            try:
                await end()
                await notify()
            except ValueError:
                if not await is_cancelled():
                    raise

        try:
            result = await run_work(arguments, progress, elicit, status, is_cancelled)
        except Exception as e:  # noqa: BLE001 - the task's failure is the report
            await finish(lambda: task.fail(str(e), notify=False))
            return text_result(str(e), is_error=True)  # not stored: the task is terminal
        if result is None:
            return text_result("cancelled", is_error=True)
        await finish(lambda: task.complete(result, notify=False))
        return result

    return await ctx.experimental.run_task(work)


# The decorator above turns any exception from call_tool (McpError included) into a
# CallToolResult with isError; the 2025-11-25 spec wants -32601 for a task mismatch,
# so check the mode before it, where an McpError becomes a JSON-RPC error.
_inner_call = server.request_handlers[types.CallToolRequest]


async def _checked_call(req: types.CallToolRequest) -> types.ServerResult:
    mode = MODES.get(req.params.name)
    if req.params.name in MODES:
        server.request_context.experimental.validate_task_mode(mode)
    return await _inner_call(req)


server.request_handlers[types.CallToolRequest] = _checked_call


def options():
    return server.create_initialization_options()


async def run_stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, options())


def run_http(port: int) -> None:
    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=server)

    @asynccontextmanager
    async def lifespan(_app) -> AsyncIterator[None]:
        async with manager.run():
            print(f"listening on port {port}", file=sys.stderr, flush=True)
            yield

    class McpApp:
        # An instance, not a function: Starlette's Route then hands it the raw ASGI
        # call, and `/mcp` is served without a redirect to `/mcp/`.
        async def __call__(self, scope, receive, send):
            await manager.handle_request(scope, receive, send)

    app = Starlette(routes=[Route("/mcp", endpoint=McpApp(), methods=["GET", "POST", "DELETE"])], lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        anyio.run(run_stdio)
    elif mode == "http":
        run_http(int(sys.argv[2]))
    else:
        print(json.dumps({"error": f"unknown mode {mode}"}), file=sys.stderr)
        sys.exit(2)
