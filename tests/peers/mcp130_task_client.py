"""Drive a 2025-11-25 task server (taskgate, or an upstream directly) with the Python
SDK `mcp` 1.30 client's experimental tasks API (`session.experimental.*`), installed
by scripts/install-peers.sh into .peers/venv-mcp130.

    python mcp130_task_client.py URL TOKEN MODE [ARG...]

TOKEN is sent as `Authorization: Bearer TOKEN`; `-` sends none. URL may also be
`stdio:` followed by a JSON array, the command of an upstream to drive over stdio
directly (TOKEN is then ignored). MODE:

- `create-poll-result TOOL ARGSJSON`: `call_tool_as_task`, then `get_task` at the
  task's pollInterval until terminal; on `input_required` it calls `get_task_result`
  (the stream that delivers the input request; the elicitation callback answers) and
  resumes polling when that returns; at the end `get_task_result` once more.
- `elicit TOOL ARGSJSON`: the same flow (named for the tests that expect input).
- `create-result TOOL ARGSJSON`: `get_task_result` right after creation (blocking),
  then `get_task`; repeated while the task is not terminal.
- `cancel TOOL ARGSJSON`: create, one `get_task`, wait CANCEL_AFTER_MS, `cancel_task`,
  `get_task`, `get_task_result` (bounded by 10 s), `cancel_task` again.
- `list [TOOL ARGSJSON]`: optionally create a task first, then `list_tasks` over every
  page.
- `get TASKID`, `result TASKID`, `cancel-id TASKID`: one operation on a known id (a
  second session or another principal probing).
- `sync TOOL ARGSJSON`: a plain `call_tool`.

TRACE=1 also prints every JSON-RPC message the client POSTs ({"event": "sent"}).
Environment: TASK_TTL (ms, default 60000), ANSWER (the elicitation's accepted content,
JSON, default {"answer": "42"}), ELICIT_ACTION (accept|decline|cancel, default
accept), CANCEL_AFTER_MS (default 500), DEADLINE_S (default 120).

Prints one JSON object per line as things happen ({"event": ...}), and a summary as
the last line: {"ok": true, ...facts} or {"ok": false, "error": ...}. `ok` is false
only when the driver itself broke; protocol errors are facts (`errors`). The Rust
tests assert on the summary.
"""

import json
import os
import sys
import time
import traceback
import warnings

# The SDK marks its experimental tasks API deprecated (for mcp 2.0); that is the
# dialect this driver exists to speak.
warnings.filterwarnings("ignore", category=DeprecationWarning)

import anyio  # noqa: E402
import mcp.types as types  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.shared.exceptions import McpError  # noqa: E402

RELATED = "io.modelcontextprotocol/related-task"
URL, TOKEN, MODE = sys.argv[1:4]
ARGV = sys.argv[4:]
TTL = int(os.environ.get("TASK_TTL", "60000"))
ANSWER = json.loads(os.environ.get("ANSWER", '{"answer": "42"}'))
ELICIT_ACTION = os.environ.get("ELICIT_ACTION", "accept")
CANCEL_AFTER_MS = int(os.environ.get("CANCEL_AFTER_MS", "500"))
DEADLINE = time.monotonic() + float(os.environ.get("DEADLINE_S", "120"))
TERMINAL = ("completed", "failed", "cancelled")

facts = {
    "mode": MODE,
    "statuses": [],  # every tasks/get status, in order
    "notified": [],  # statuses from notifications/tasks/status
    "progress": 0,
    "elicitations": [],
    "interim": [],  # tasks/result answers that came back before a terminal tasks/get
    "errors": [],
}
state = {"inResult": False}


def emit(event, **kw):
    print(json.dumps({"event": event, **kw}, default=str), flush=True)


def dump(model):
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def text_of(result):
    for c in result.get("content") or []:
        if c.get("type") == "text":
            return c.get("text")
    return None


def record_error(op, e, expected=False):
    """A protocol error as a fact; `expected` ones stay out of `errors`."""
    if isinstance(e, McpError):
        err = {"op": op, "code": e.error.code, "message": e.error.message}
    else:
        err = {"op": op, "code": None, "message": f"{type(e).__name__}: {e}"}
    if not expected:
        facts["errors"].append(err)
    emit("error", **err)
    return err


async def on_elicit(ctx, params):
    meta = ctx.meta.model_dump(by_alias=True, exclude_none=True) if ctx.meta else {}
    e = {
        "message": params.message,
        "relatedTask": (meta.get(RELATED) or {}).get("taskId"),
        "duringResult": state["inResult"],
    }
    facts["elicitations"].append(e)
    emit("elicitation", **e)
    if ELICIT_ACTION == "accept":
        return types.ElicitResult(action="accept", content=ANSWER)
    return types.ElicitResult(action=ELICIT_ACTION)


async def on_message(m):
    if isinstance(m, types.ServerNotification):
        root = m.root
        if isinstance(root, types.TaskStatusNotification):
            p = root.params
            facts["notified"].append(p.status)
            emit("notification", taskId=p.taskId, status=p.status, statusMessage=p.statusMessage)
        elif isinstance(root, types.ProgressNotification):
            facts["progress"] += 1
            emit("progress", progress=root.params.progress, total=root.params.total, message=root.params.message)
    elif isinstance(m, Exception):
        emit("transport-error", message=str(m))


class CreateFailed(Exception):
    pass


async def create(s, tool, args):
    # What `call_tool_as_task` sends, plus a progressToken (the 2025-11-25 spec keeps
    # it valid for the task's lifetime); the SDK drops the callback once the
    # CreateTaskResult arrives, so progress is counted in on_message.
    async def on_progress(*_a):
        pass

    try:
        created = await s.send_request(
            types.ClientRequest(
                types.CallToolRequest(
                    params=types.CallToolRequestParams(name=tool, arguments=args, task=types.TaskMetadata(ttl=TTL))
                )
            ),
            types.CreateTaskResult,
            progress_callback=on_progress,
        )
    except Exception as e:  # noqa: BLE001
        facts["createError"] = record_error("tools/call", e)
        raise CreateFailed() from e
    task = dump(created.task)
    facts["taskId"] = task["taskId"]
    facts["created"] = task
    emit("created", task=task, meta=created.meta)
    return created.task


async def get(s, task_id):
    t = await s.experimental.get_task(task_id)
    d = dump(t)
    facts["statuses"].append(t.status)
    emit("status", status=t.status, statusMessage=t.statusMessage, pollInterval=t.pollInterval, ttl=t.ttl)
    facts["lastTask"] = d
    return t


async def get_or_stop(s, task_id):
    """tasks/get inside a flow: an error (the task expired, another principal...) is a
    fact and ends the flow."""
    try:
        return await get(s, task_id)
    except Exception as e:  # noqa: BLE001
        record_error("tasks/get", e)
        return None


async def result(s, task_id, final):
    """tasks/result, validated as the SDK's callers do (CallToolResult) after capture."""
    state["inResult"] = True
    try:
        raw = dump(await s.experimental.get_task_result(task_id, types.GetTaskPayloadResult))
    finally:
        state["inResult"] = False
    try:
        types.CallToolResult.model_validate(raw)
        valid = True
    except Exception as e:  # noqa: BLE001 - the fact is whether it validates
        valid = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    r = {"result": raw, "text": text_of(raw), "relatedTask": (raw.get("_meta") or {}).get(RELATED, {}).get("taskId"),
         "validCallToolResult": valid}
    emit("result", final=final, **r)
    if final:
        facts["result"] = raw
        facts["resultText"] = r["text"]
        facts["resultRelatedTask"] = r["relatedTask"]
        facts["validCallToolResult"] = valid
    else:
        facts["interim"].append(r)
    return raw


async def sleep_poll(t):
    ms = t.pollInterval if t.pollInterval is not None else 500
    await anyio.sleep(max(ms, 50) / 1000)


async def poll_flow(s, tool, args):
    task = await create(s, tool, args)
    tid = task.taskId
    while time.monotonic() < DEADLINE:
        t = await get_or_stop(s, tid)
        if t is None:
            return
        if t.status in TERMINAL:
            break
        if t.status == "input_required":
            # The 2025-11-25 spec (Task Status): the requestor calls tasks/result to
            # receive the input request; it answers on the stream, then resumes
            # polling once tasks/result returns.
            try:
                await result(s, tid, final=False)
            except Exception as e:  # noqa: BLE001
                record_error("tasks/result", e)
            # Whether that answer was the terminal one: the status right after it.
            after = await get_or_stop(s, tid)
            if after is None:
                return
            if facts["interim"]:
                facts["interim"][-1]["statusAfter"] = after.status
            if after.status in TERMINAL:
                break
            await sleep_poll(after)
            continue
        await sleep_poll(t)
    else:
        raise TimeoutError("task did not reach a terminal status")
    try:
        await result(s, tid, final=True)
    except Exception as e:  # noqa: BLE001
        record_error("tasks/result", e)


async def result_first_flow(s, tool, args):
    task = await create(s, tool, args)
    tid = task.taskId
    while time.monotonic() < DEADLINE:
        try:
            await result(s, tid, final=False)
        except Exception as e:  # noqa: BLE001
            record_error("tasks/result", e)
        t = await get_or_stop(s, tid)
        if t is None:
            return
        if t.status in TERMINAL:
            break
        await sleep_poll(t)
    else:
        raise TimeoutError("task did not reach a terminal status")
    # The last answer was the terminal one: promote it.
    if facts["interim"]:
        last = facts["interim"].pop()
        facts["result"] = last["result"]
        facts["resultText"] = last["text"]
        facts["resultRelatedTask"] = last["relatedTask"]
        facts["validCallToolResult"] = last["validCallToolResult"]


async def cancel_flow(s, tool, args):
    task = await create(s, tool, args)
    tid = task.taskId
    await get(s, tid)
    await anyio.sleep(CANCEL_AFTER_MS / 1000)
    try:
        c = await s.experimental.cancel_task(tid)
        facts["cancelled"] = dump(c)
        emit("cancelled", task=facts["cancelled"])
    except Exception as e:  # noqa: BLE001
        record_error("tasks/cancel", e)
    try:
        await get(s, tid)
    except Exception as e:  # noqa: BLE001
        record_error("tasks/get", e)
    try:
        with anyio.fail_after(10):
            await result(s, tid, final=True)
    except TimeoutError:
        facts["errors"].append({"op": "tasks/result", "code": None, "message": "timeout after 10 s"})
    except Exception as e:  # noqa: BLE001
        record_error("tasks/result", e)
    try:
        again = await s.experimental.cancel_task(tid)
        facts["cancelAgain"] = dump(again)
    except Exception as e:  # noqa: BLE001
        facts["cancelAgainError"] = record_error("tasks/cancel", e, expected=True)


async def list_flow(s):
    if len(ARGV) >= 2:
        task = await create(s, ARGV[0], json.loads(ARGV[1]))
        await get(s, task.taskId)
    seen, cursor, pages = [], None, 0
    while True:
        page = await s.experimental.list_tasks(cursor)
        pages += 1
        seen.extend(dump(t) for t in page.tasks)
        cursor = page.nextCursor
        if not cursor or pages > 100:
            break
    facts["listed"] = [{"taskId": t["taskId"], "status": t["status"]} for t in seen]
    facts["pages"] = pages
    if "taskId" in facts:
        facts["containsCreated"] = any(t["taskId"] == facts["taskId"] for t in seen)
    emit("listed", tasks=facts["listed"], pages=pages)


async def single(s, op, tid):
    try:
        if op == "get":
            await get(s, tid)
        elif op == "result":
            with anyio.fail_after(float(os.environ.get("RESULT_TIMEOUT_S", "30"))):
                await result(s, tid, final=True)
        else:
            c = await s.experimental.cancel_task(tid)
            facts["cancelled"] = dump(c)
            emit("cancelled", task=facts["cancelled"])
    except TimeoutError:
        facts["errors"].append({"op": op, "code": None, "message": "timeout"})
    except Exception as e:  # noqa: BLE001
        record_error(f"tasks/{op}", e)


async def trace_request(request):
    if request.method == "POST":
        try:
            emit("sent", message=json.loads(request.content))
        except ValueError:
            pass  # not JSON: nothing to trace


def tracing_client(headers=None, timeout=None, auth=None):
    """The SDK's own client, plus a hook printing each POSTed message when TRACE=1."""
    c = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)
    if os.environ.get("TRACE") == "1":
        c.event_hooks["request"].append(trace_request)
    return c


async def main():
    if URL.startswith("stdio:"):
        cmd = json.loads(URL.removeprefix("stdio:"))
        params = StdioServerParameters(command=cmd[0], args=cmd[1:])
        async with stdio_client(params) as (read, write):
            await session(read, write, lambda: None)
    else:
        headers = {} if TOKEN in ("-", "") else {"Authorization": f"Bearer {TOKEN}"}
        async with streamablehttp_client(URL, headers=headers, httpx_client_factory=tracing_client) as (
            read,
            write,
            get_sid,
        ):
            await session(read, write, get_sid)


async def session(read, write, get_sid):
    async with ClientSession(read, write, elicitation_callback=on_elicit, message_handler=on_message) as s:
        init = await s.initialize()
        facts["protocolVersion"] = init.protocolVersion
        facts["serverCapabilities"] = dump(init.capabilities)
        facts["sessionId"] = get_sid()
        emit("initialized", protocolVersion=init.protocolVersion, capabilities=facts["serverCapabilities"],
             sessionId=facts["sessionId"])
        if MODE not in ("get", "result", "cancel-id"):
            tools = (await s.list_tools()).tools
            facts["tools"] = {t.name: (t.execution.taskSupport if t.execution else None) for t in tools}
        try:
            await run_mode(s)
        except CreateFailed:
            pass  # recorded as createError
        # Let late notifications (the terminal tasks/status) arrive.
        await anyio.sleep(0.3)


async def run_mode(s):
    if MODE in ("create-poll-result", "elicit"):
        await poll_flow(s, ARGV[0], json.loads(ARGV[1]))
    elif MODE == "create-result":
        await result_first_flow(s, ARGV[0], json.loads(ARGV[1]))
    elif MODE == "cancel":
        await cancel_flow(s, ARGV[0], json.loads(ARGV[1]))
    elif MODE == "list":
        await list_flow(s)
    elif MODE in ("get", "result", "cancel-id"):
        await single(s, MODE.removesuffix("-id"), ARGV[0])
    elif MODE == "sync":
        async def on_progress(*_a):
            facts["progress"] += 1

        try:
            r = dump(await s.call_tool(ARGV[0], json.loads(ARGV[1]), progress_callback=on_progress))
            facts["result"], facts["resultText"] = r, text_of(r)
        except Exception as e:  # noqa: BLE001
            record_error("tools/call", e)
    else:
        raise ValueError(f"unknown mode {MODE}")


try:
    anyio.run(main)
    print(json.dumps({"ok": True, **facts}, default=str), flush=True)
except BaseException:  # noqa: BLE001 - the report is the point
    print(json.dumps({"ok": False, "error": traceback.format_exc(), **facts}, default=str), flush=True)
    sys.exit(1)
