"""Drive taskgate as a plain 2026-07-28 client with the Python `mcp` 2.3 SDK
(`mcp.client.client.Client` on `streamable_http_client`, mcp==2.3.0, installed by
scripts/install-peers.sh into .peers/venv-mcp23). The client declares no tasks
extension, so a tool in `plain_clients = "handle"` mode answers a call that outlives
`promote_after_ms` with an ordinary tool result naming a task, which this driver
follows through the gateway's own tools `taskgate_task_status`, `taskgate_task_cancel`
and `taskgate_task_list` (issue 51, "task handles as tool results for plain clients").

    python handle_py_client.py URL TOKEN SCENARIO SPEC_JSON [TOKEN2]

SCENARIO is one of `list`, `handle`, `cancel`, `foreign`, `status`, `output_schema`,
`elicit_late`; SPEC_JSON carries the scenario's inputs (`ms`, `wait`, `task_id`,
`message`, `answer`, optionally `tool` and `args` to call another tool in place of
the scenario's own, and `prefix`, the task tools' name prefix, default `taskgate_`).
Every result is recorded as the SDK parsed it (`model_dump(by_alias=True)`), so the
Rust side (tests/task_handles.rs) asserts on the wire shape. Prints one JSON object on
the last stdout line: {"ok": true, ...facts} or {"ok": false, "error": ..., ...facts}.
"""
import asyncio
import json
import secrets
import base64
import sys
import time
import traceback

import mcp_types as types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

URL, TOKEN, SCENARIO = sys.argv[1], sys.argv[2], sys.argv[3]
SPEC = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
TOKEN2 = sys.argv[5] if len(sys.argv) > 5 else None
PREFIX = SPEC.get("prefix", "taskgate_")
STATUS, CANCEL, LIST = PREFIX + "task_status", PREFIX + "task_cancel", PREFIX + "task_list"

facts: dict = {}
asked: list = []

async def on_elicit(context, params):
    """Answer every elicitation with SPEC.answer, recording the question."""
    asked.append(getattr(params, "message", None))
    return types.ElicitResult(action="accept", content=SPEC.get("answer", {"answer": "42"}))

class Plain:
    """One Client (2026-07-28, no extensions) with the bearer token on every request."""

    def __init__(self, token):
        self.token = token
        self.http = None
        self.client = None

    async def __aenter__(self):
        self.http = create_mcp_http_client(headers={"Authorization": f"Bearer {self.token}"})
        await self.http.__aenter__()
        self.client = Client(
            streamable_http_client(URL, http_client=self.http),
            mode="2026-07-28",
            elicitation_callback=on_elicit,
            read_timeout_seconds=120,
            cache=None,
        )
        await self.client.__aenter__()
        facts["protocolVersion"] = self.client.protocol_version
        # List first, as a model-driven client does: the session learns each tool's
        # `x-mcp-header` map (sent as Mcp-Param-* on 2026-07-28) and outputSchema.
        await self.client.list_tools()
        return self.client

    async def __aexit__(self, *exc):
        try:
            await self.client.__aexit__(*exc)
        finally:
            await self.http.__aexit__(*exc)

def dump(result):
    """A CallToolResult as its wire JSON."""
    return result.model_dump(by_alias=True, exclude_none=True, mode="json")

async def call(client, name, args):
    """tools/call; a JSON-RPC error becomes {"error": {code, message}} instead of raising."""
    try:
        return dump(await client.call_tool(name, args))
    except MCPError as e:
        return {"error": {"code": e.code, "message": e.message}}

async def status(client, task_id, wait=None):
    args = {"taskId": task_id}
    if wait is not None:
        args["waitSeconds"] = wait
    return await call(client, STATUS, args)

async def until_done(client, task_id, wait, limit_s=90):
    """task_status with waitSeconds until the task is no longer working (honouring a
    'polled too often' answer's retryAfterSeconds); returns (last result, polls)."""
    end = time.monotonic() + limit_s
    polls = 0
    while True:
        r = await status(client, task_id, wait)
        polls += 1
        sc = r.get("structuredContent") or {}
        if "retryAfterSeconds" in sc and r.get("isError"):
            await asyncio.sleep(sc["retryAfterSeconds"])
        elif sc.get("status") in ("working", "input_required") and sc.get("taskId") == task_id:
            await asyncio.sleep(min(sc.get("pollAfterSeconds") or 0, 1))
        else:
            return r, polls
        if time.monotonic() > end:
            return r, polls

def never_issued():
    """A well-formed id the gateway never issued: `tsk_` + 22 base64url characters."""
    return "tsk_" + base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")

async def start_handle(client, tool, args):
    """Call `tool`; record how long the answer took and the handle it carried."""
    t0 = time.monotonic()
    r = await call(client, tool, args)
    facts["call_elapsed_s"] = round(time.monotonic() - t0, 3)
    facts["call"] = r
    sc = r.get("structuredContent") or {}
    return sc.get("taskId"), r

async def s_list():
    async with Plain(TOKEN) as c:
        tools = (await c.list_tools()).tools
        by = {t.name: t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in tools}
        facts["tools"] = sorted(by)
        facts["sleep_has_output_schema"] = "outputSchema" in by.get("sleep", {})
        facts["measure_has_output_schema"] = "outputSchema" in by.get("measure", {})
        facts["task_tools"] = [n for n in (STATUS, CANCEL, LIST) if n in by]
        facts["task_status_input_schema"] = by.get(STATUS, {}).get("inputSchema")
        facts["task_cancel_input_schema"] = by.get(CANCEL, {}).get("inputSchema")
        facts["task_list_input_schema"] = by.get(LIST, {}).get("inputSchema")
        # A quick call stays inline in either mode.
        facts["echo"] = await call(c, "echo", {"text": SPEC.get("text", "hi plain py")})

async def s_handle():
    async with Plain(TOKEN) as c:
        task_id, _ = await start_handle(c, "sleep", {"ms": SPEC.get("ms", 20000)})
        facts["task_id"] = task_id
        if not task_id:
            return
        facts["running"] = await status(c, task_id)
        facts["done"], facts["polls"] = await until_done(c, task_id, SPEC.get("wait", 30))
        facts["list"] = await call(c, LIST, {})

async def s_cancel():
    async with Plain(TOKEN) as c:
        task_id, _ = await start_handle(c, "sleep", {"ms": SPEC.get("ms", 60000)})
        facts["task_id"] = task_id
        if not task_id:
            return
        facts["cancel"] = await call(c, CANCEL, {"taskId": task_id})
        facts["after"], facts["polls"] = await until_done(c, task_id, SPEC.get("wait", 5))
        # Malformed and missing ids are JSON-RPC errors, not tool results.
        facts["malformed"] = await call(c, STATUS, {"taskId": "not-a-task"})
        facts["missing"] = await call(c, STATUS, {})

async def s_foreign():
    async with Plain(TOKEN2 or TOKEN) as c:
        facts["foreign"] = await status(c, SPEC["task_id"])
        facts["never_issued_id"] = never_issued()
        facts["never_issued"] = await status(c, facts["never_issued_id"])
        facts["identical"] = json.dumps(facts["foreign"], sort_keys=True) == json.dumps(
            facts["never_issued"], sort_keys=True)

async def s_status():
    async with Plain(TOKEN) as c:
        t0 = time.monotonic()
        facts["result"] = await status(c, SPEC["task_id"], SPEC.get("wait"))
        facts["elapsed_s"] = round(time.monotonic() - t0, 3)

async def s_output_schema():
    async with Plain(TOKEN) as c:
        listed = {t.name: t for t in (await c.list_tools()).tools}
        facts["measure_listed"] = "measure" in listed
        facts["measure_has_output_schema"] = listed.get("measure") is not None and \
            listed["measure"].output_schema is not None
        # The SDK validates a non-error result's structuredContent against the listed
        # outputSchema (mcp/client/session.py, validate_tool_result) and raises on a
        # mismatch: record that as a fact rather than failing the driver.
        t0 = time.monotonic()
        try:
            r = dump(await c.call_tool("measure", {"ms": SPEC.get("ms", 3000)}))
            facts["sdk_accepted"] = True
        except RuntimeError as e:
            facts["sdk_accepted"] = False
            facts["sdk_error"] = f"{type(e).__name__}: {e}"
            return
        except MCPError as e:
            facts["call"] = {"error": {"code": e.code, "message": e.message}}
            return
        facts["call_elapsed_s"] = round(time.monotonic() - t0, 3)
        facts["call"] = r
        task_id = (r.get("structuredContent") or {}).get("taskId")
        facts["task_id"] = task_id
        if task_id:
            try:
                facts["done"], facts["polls"] = await until_done(c, task_id, SPEC.get("wait", 30))
                facts["status_sdk_accepted"] = True
            except (RuntimeError, MCPError) as e:
                facts["status_sdk_accepted"] = False
                facts["status_sdk_error"] = f"{type(e).__name__}: {e}"

async def s_elicit_late():
    async with Plain(TOKEN) as c:
        task_id, _ = await start_handle(c, SPEC.get("tool", "slow_elicit"), SPEC.get("args") or {
            "ms": SPEC.get("ms", 3000), "message": SPEC.get("message", "Favourite colour?")})
        facts["task_id"] = task_id
        facts["asked_before_handle"] = list(asked)
        if not task_id:
            return
        # The question arrives as MRTR on the status call; Client.call_tool hands it to
        # on_elicit and retries the status call with the answer.
        facts["done"], facts["polls"] = await until_done(c, task_id, SPEC.get("wait", 30))
        facts["asked"] = asked
        d = facts["done"]
        facts["final_text"] = next(
            (b.get("text") for b in d.get("content", []) if b.get("type") == "text"), None)

async def main():
    fn = {"list": s_list, "handle": s_handle, "cancel": s_cancel, "foreign": s_foreign,
          "status": s_status, "output_schema": s_output_schema,
          "elicit_late": s_elicit_late}[SCENARIO]
    try:
        await asyncio.wait_for(fn(), SPEC.get("limit_s", 150))
        out = {"ok": True, **facts}
    except BaseException as e:  # noqa: BLE001 - report everything to the Rust side
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(), **facts}
    print(json.dumps(out, default=str), flush=True)
    sys.exit(0 if out["ok"] else 1)

asyncio.run(main())
