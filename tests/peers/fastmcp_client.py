"""Drive taskgate with the real fastmcp 2026-07-28 + Tasks client (fastmcp[tasks]==4.1.4,
installed by scripts/install-peers.sh into .peers/venv-fastmcp).

    python fastmcp_client.py URL TOKEN SCENARIO

Prints one JSON object on the last stdout line: {"ok": true, ...facts} or
{"ok": false, "error": "..."}; tests/fastmcp_client.rs asserts on the facts.
The gateway fronts the bundled demo upstream (tools echo, sleep, elicit), except for
`research`: server-everything, whose `simulate-research-query` is its own 2025-11-25
task that the gateway follows (docs/design.md §25).
"""
import asyncio
import json
import sys
import traceback

import fastmcp
import fastmcp_tasks  # noqa: F401  (importing it turns on client task support)
from fastmcp.client.elicitation import ElicitResult

URL, TOKEN, SCENARIO = sys.argv[1], sys.argv[2], sys.argv[3]


def shim_mcp_name():
    """fastmcp-tasks 4.1.4 does not mark its tasks/* request types as name-bearing,
    so the mcp 2.3.0 session sends no `Mcp-Name: <taskId>` header on tasks/get,
    tasks/update and tasks/cancel, which SEP-2663 ("Streamable HTTP: Routing
    Headers") requires and taskgate enforces (400 -32020, as the conformance
    suite's tasks-request-headers scenario expects). Declaring `name_param` is the
    SDK's own mechanism for that header; nothing else about the client changes."""
    from fastmcp_tasks import client_models as m

    for cls in (m.GetTaskRequest, m.UpdateTaskRequest, m.CancelTaskRequest):
        cls.name_param = "taskId"


if SCENARIO != "unshimmed":
    shim_mcp_name()
asked = []


async def on_elicit(message, response_type, params, context):
    asked.append(message)
    return ElicitResult(action="accept", content={"answer": "octarine"})


def client(**kw):
    return fastmcp.Client(URL, auth=TOKEN, mode="2026-07-28", timeout=60, **kw)


def texts(result):
    return [getattr(c, "text", None) for c in result.content]


async def transparent():
    # call_tool on a tasked call polls tasks/get under the hood and returns the result.
    async with client() as c:
        tools = [t.name for t in await c.list_tools()]
        echo = await c.call_tool("echo", {"text": "hi fastmcp"})
        slow = await c.call_tool("sleep", {"ms": 1500})
        return {"tools": tools, "echo": texts(echo), "slow": texts(slow),
                "slow_is_error": slow.is_error}


async def handle():
    # The explicit handle: created as a task, status(), then result().
    async with client() as c:
        t = await fastmcp_tasks.call_tool_task(c, "sleep", {"ms": 1500})
        first = await t.status()
        res = await t.result()
        final = await t.status()
        return {"task_id": t.task_id, "created_status": t.create_result.status,
                "first_status": first.status, "final_status": final.status,
                "result": texts(res), "poll_interval_ms": t.create_result.poll_interval_ms}


async def elicit():
    # input_required answered by the elicitation handler through tasks/update.
    async with client(elicitation_handler=on_elicit) as c:
        t = await fastmcp_tasks.call_tool_task(c, "elicit", {"message": "Favourite colour?"})
        parked = await t.wait(state="input_required", timeout=30)
        res = await t.result()
        final = await t.status()
        return {"task_id": t.task_id, "parked": parked.status, "asked": asked,
                "result": texts(res), "final_status": final.status}


async def cancel():
    async with client() as c:
        t = await fastmcp_tasks.call_tool_task(c, "sleep", {"ms": 20000})
        await t.cancel()
        final = await t.wait(timeout=30)
        return {"task_id": t.task_id, "final_status": final.status}


async def on_research_elicit(message, response_type, params, context):
    asked.append(message)
    return ElicitResult(action="accept", content={"interpretation": "snake"})


async def research():
    # server-everything's research task: input through the elicitation handler, the
    # result, and a cancel that the gateway forwards upstream.
    async with client(elicitation_handler=on_research_elicit) as c:
        t = await fastmcp_tasks.call_tool_task(
            c, "simulate-research-query", {"topic": "python", "ambiguous": True})
        res = await t.result()
        final = await t.status()
        u = await fastmcp_tasks.call_tool_task(c, "simulate-research-query", {"topic": "go"})
        await asyncio.sleep(1.5)
        await u.cancel()
        cancelled = await u.wait(timeout=30)
        return {"task_id": t.task_id, "asked": asked, "result": texts(res),
                "final_status": final.status, "ttl_ms": t.create_result.ttl_ms,
                "cancelled": cancelled.status}


async def unshimmed():
    # The client exactly as shipped: its tasks/get lacks Mcp-Name (see shim_mcp_name).
    async with client() as c:
        t = await fastmcp_tasks.call_tool_task(c, "sleep", {"ms": 3000})
        try:
            await t.status()
            return {"task_id": t.task_id, "status_error": None}
        except Exception as e:  # noqa: BLE001
            return {"task_id": t.task_id, "status_error": f"{type(e).__name__}: {e}",
                    "code": getattr(getattr(e, "error", None), "code", getattr(e, "code", None))}


async def main():
    fn = {"unshimmed": unshimmed, "transparent": transparent, "handle": handle, "elicit": elicit, "cancel": cancel,
          "research": research}[SCENARIO]
    try:
        out = await asyncio.wait_for(fn(), 90)
        out["ok"] = True
    except BaseException as e:  # noqa: BLE001 - report everything to the Rust side
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    print(json.dumps(out, default=str), flush=True)


asyncio.run(main())
