"""Drive taskgate through agent frameworks' MCP tool abstractions, without an LLM, as a
model would use a task handle (issue 51, "task handles as tool results for plain
clients"): list the tools, call a long `sleep`, read the handle the gateway returns as
an ordinary tool result, then call `taskgate_task_status` with `waitSeconds` until the
tool's own result comes back. Both frameworks speak 2026-07-28 without the tasks
extension; both are pinned by scripts/peers/requirements-agents.txt and installed by
scripts/install-peers.sh into .peers/venv-agents:

- `pydantic_ai`: pydantic-ai-slim[mcp]==2.68.0, `pydantic_ai.mcp.MCPToolset(url,
  headers=...)` → `list_tools`, `direct_call_tool` (which maps a result to what a model
  would see: the structuredContent when every content part is text, else the text).
- `openai_agents`: openai-agents==0.24.0, `agents.mcp.MCPServerStreamableHttp(params=
  {url, headers, timeout})` → `connect`, `list_tools`, `call_tool` (the raw
  CallToolResult), with tracing off (`OPENAI_AGENTS_DISABLE_TRACING=1`).

    python handle_agent.py URL TOKEN SCENARIO SPEC_JSON

SPEC_JSON: {"ms": sleep length, "wait": waitSeconds, "prefix": the task tools' name
prefix (default `taskgate_`)}. Prints one JSON object on the last stdout line:
{"ok": true, ...facts} or {"ok": false, "error": ..., ...facts}; tests/task_handles.rs
asserts on the facts.
"""
import asyncio
import json
import os
import re
import sys
import time
import traceback

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

URL, TOKEN, SCENARIO = sys.argv[1], sys.argv[2], sys.argv[3]
SPEC = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
PREFIX = SPEC.get("prefix", "taskgate_")
STATUS = PREFIX + "task_status"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}

facts: dict = {}


def still_running(value, task_id):
    """A status answer (as the framework mapped it) saying the task is not done."""
    return isinstance(value, dict) and value.get("taskId") == task_id and \
        value.get("status") in ("working", "input_required")


def throttled(value):
    return isinstance(value, dict) and "retryAfterSeconds" in value


async def follow(call_status, task_id, wait, limit_s=90):
    """Call task_status with waitSeconds until it stops saying 'running'."""
    end = time.monotonic() + limit_s
    polls = 0
    while True:
        value = await call_status({"taskId": task_id, "waitSeconds": wait})
        polls += 1
        if throttled(value):
            await asyncio.sleep(value["retryAfterSeconds"])
        elif not still_running(value, task_id):
            return value, polls
        if time.monotonic() > end:
            return value, polls


async def pydantic_ai():
    import importlib.metadata as md

    from fastmcp.exceptions import ToolError
    from pydantic_ai.mcp import MCPToolset

    facts["version"] = md.version("pydantic-ai-slim")
    toolset = MCPToolset(URL, headers=HEADERS, tool_error_behavior="error", read_timeout=120)
    async with toolset:
        tools = {t.name: t for t in await toolset.list_tools()}
        facts["tools"] = sorted(tools)
        facts["sleep_has_output_schema"] = getattr(tools.get("sleep"), "outputSchema", None) is not None
        t0 = time.monotonic()
        handle = await toolset.direct_call_tool("sleep", {"ms": SPEC.get("ms", 20000)})
        facts["call_elapsed_s"] = round(time.monotonic() - t0, 3)
        facts["handle"] = handle
        task_id = handle.get("taskId") if isinstance(handle, dict) else None
        facts["task_id"] = task_id
        if not task_id:
            return

        async def call_status(args):
            # With tool_error_behavior="error" an isError result raises ToolError with
            # its text; a 'polled too often; call again in N s' is turned back into the
            # retryAfterSeconds the loop honours.
            try:
                return await toolset.direct_call_tool(STATUS, args)
            except ToolError as e:
                m = re.search(r"polled too often; call again in (\d+) s", str(e))
                if m is None:
                    raise
                return {"retryAfterSeconds": int(m.group(1))}

        facts["done"], facts["polls"] = await follow(call_status, task_id, SPEC.get("wait", 30))


async def openai_agents():
    import importlib.metadata as md

    from agents.mcp import MCPServerStreamableHttp

    facts["version"] = md.version("openai-agents")
    server = MCPServerStreamableHttp(
        params={"url": URL, "headers": HEADERS, "timeout": 120, "sse_read_timeout": 300},
        client_session_timeout_seconds=120,
        name="taskgate",
    )
    await server.connect()
    try:
        tools = {t.name: t for t in await server.list_tools()}
        facts["tools"] = sorted(tools)
        facts["sleep_has_output_schema"] = getattr(tools.get("sleep"), "outputSchema", None) is not None
        t0 = time.monotonic()
        r = await server.call_tool("sleep", {"ms": SPEC.get("ms", 20000)})
        facts["call_elapsed_s"] = round(time.monotonic() - t0, 3)
        facts["handle"] = r.model_dump(by_alias=True, exclude_none=True, mode="json")
        task_id = (r.structured_content or {}).get("taskId")
        facts["task_id"] = task_id
        if not task_id:
            return

        async def call_status(args):
            res = await server.call_tool(STATUS, args)
            # What the loop inspects is the structuredContent; the tool's own result
            # (completed) is recorded whole.
            dumped = res.model_dump(by_alias=True, exclude_none=True, mode="json")
            sc = res.structured_content
            if isinstance(sc, dict) and (still_running(sc, task_id) or throttled(sc)):
                return sc
            return dumped

        facts["done"], facts["polls"] = await follow(call_status, task_id, SPEC.get("wait", 30))
    finally:
        await server.cleanup()


async def main():
    fn = {"pydantic_ai": pydantic_ai, "openai_agents": openai_agents}[SCENARIO]
    try:
        await asyncio.wait_for(fn(), SPEC.get("limit_s", 150))
        out = {"ok": True, **facts}
    except BaseException as e:  # noqa: BLE001 - report everything to the Rust side
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(), **facts}
    print(json.dumps(out, default=str), flush=True)
    sys.exit(0 if out["ok"] else 1)


asyncio.run(main())
