"""Drive taskgate as a 2025-era client with the Python SDK `mcp` 1.30 client
(`streamablehttp_client` + `ClientSession`), installed by scripts/install-peers.sh
into .peers/venv-mcp130.

    python mcp130_legacy_client.py URL TOKEN SCENARIO SPEC_JSON [TOKEN2]

SCENARIO is `all` (every flow on one session) or `foreign` (a session replayed with
TOKEN2). SPEC_JSON is the same as tests/peers/ts_legacy_client.mjs's. Prints one JSON
object on the last stdout line: {"ok": true, ...facts} or {"ok": false, "error": ...};
tests/legacy_clients.rs asserts on the facts.
"""

import asyncio
import json
import sys
import time
import traceback

import anyio
import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

URL, TOKEN, SCENARIO, SPEC_JSON = sys.argv[1:5]
TOKEN2 = sys.argv[5] if len(sys.argv) > 5 else None
SPEC = json.loads(SPEC_JSON)
facts = {}


def text(r):
    for c in r.content:
        if c.type == "text":
            return c.text
    return None


async def until(pred, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


async def all_flows():
    elicited, sampled, list_changed, updates = [], [], [], []

    async def on_elicit(ctx, params):
        elicited.append(params.message)
        answer = (SPEC.get("elicit") or {}).get("answer") or {"answer": "42"}
        return types.ElicitResult(action="accept", content=answer)

    async def on_sample(ctx, params):
        sampled.append(True)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="sampled by py"),
            model="py-test",
        )

    async def on_roots(ctx):
        return types.ListRootsResult(roots=[types.Root(uri="file:///py-root", name="py")])

    async def on_message(m):
        if isinstance(m, types.ServerNotification):
            if isinstance(m.root, types.ToolListChangedNotification):
                list_changed.append(True)
            elif isinstance(m.root, types.ResourceUpdatedNotification):
                updates.append(str(m.root.params.uri))

    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with streamablehttp_client(URL, headers=headers) as (read, write, get_sid):
        async with ClientSession(
            read,
            write,
            sampling_callback=on_sample,
            elicitation_callback=on_elicit,
            list_roots_callback=on_roots,
            message_handler=on_message,
        ) as s:
            init = await s.initialize()
            facts["serverInfo"] = init.serverInfo.model_dump()
            facts["capabilities"] = init.capabilities.model_dump(exclude_none=True)
            facts["protocolVersion"] = init.protocolVersion
            facts["sessionId"] = get_sid()
            facts["tools"] = [t.name for t in (await s.list_tools()).tools]
            if init.capabilities.prompts is not None:
                facts["prompts"] = len((await s.list_prompts()).prompts)
            first_uri = None
            if init.capabilities.resources is not None:
                listed = (await s.list_resources()).resources
                facts["resources"] = len(listed)
                first_uri = str(listed[0].uri) if listed else None
            facts["fast"] = text(await s.call_tool(SPEC["fast"]["tool"], SPEC["fast"]["args"]))
            progress = []

            async def on_progress(p, total, message):
                progress.append(p)

            facts["slow"] = text(
                await s.call_tool(
                    SPEC["slow"]["tool"], SPEC["slow"]["args"], progress_callback=on_progress
                )
            )
            facts["progress"] = len(progress)
            if SPEC.get("elicit"):
                r = await s.call_tool(SPEC["elicit"]["tool"], SPEC["elicit"]["args"])
                facts["elicit"] = text(r)
                facts["elicited"] = len(elicited)
            if SPEC.get("sample"):
                r = await s.call_tool(SPEC["sample"]["tool"], SPEC["sample"]["args"])
                facts["sample"] = text(r)
                facts["sampled"] = len(sampled)
            if SPEC.get("cancel"):
                started = time.monotonic()
                with anyio.move_on_after(0.7) as scope:
                    await s.call_tool(SPEC["cancel"]["tool"], SPEC["cancel"]["args"])
                # Leaving the scope cancels the request: the SDK sends
                # notifications/cancelled for it.
                facts["cancel"] = "aborted" if scope.cancelled_caught else "completed"
                facts["cancelMs"] = int((time.monotonic() - started) * 1000)
                await asyncio.sleep(0.3)
                facts["afterCancel"] = text(
                    await s.call_tool(SPEC["fast"]["tool"], SPEC["fast"]["args"])
                )
            if SPEC.get("touch"):
                await asyncio.sleep(0.5)
                await s.call_tool(SPEC["touch"]["tool"], SPEC["touch"]["args"])
                await until(lambda: list_changed, 10)
                facts["listChanged"] = len(list_changed)
            if SPEC.get("subscribe"):
                sub = SPEC["subscribe"]
                # The spec's resource, or the first the upstream lists.
                uri = sub.get("uri") or first_uri
                facts["subscribed"] = uri
                await s.subscribe_resource(uri)
                await s.call_tool(sub["tool"], sub["args"])
                await until(lambda: updates, 15)
                facts["updates"] = updates[:1]
                await s.unsubscribe_resource(uri)
    # Leaving the client sent DELETE (terminate_on_close): the session is gone.
    facts["afterDelete"] = await raw_status(TOKEN, facts["sessionId"])


async def raw_status(token, sid):
    async with httpx.AsyncClient() as h:
        r = await h.post(
            URL,
            headers={
                "Authorization": f"Bearer {token}",
                "Mcp-Session-Id": sid,
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        )
        return r.status_code


async def foreign():
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with streamablehttp_client(URL, headers=headers) as (read, write, get_sid):
        async with ClientSession(read, write) as s:
            await s.initialize()
            facts["sessionId"] = get_sid()
            facts["foreign"] = await raw_status(TOKEN2, get_sid())
            facts["owner"] = await raw_status(TOKEN, get_sid())


async def main():
    if SCENARIO == "all":
        await all_flows()
    elif SCENARIO == "foreign":
        await foreign()
    else:
        raise ValueError(f"unknown scenario {SCENARIO}")


try:
    asyncio.run(main())
    print(json.dumps({"ok": True, **facts}))
except BaseException:  # noqa: BLE001 - the report is the point
    print(json.dumps({"ok": False, "error": traceback.format_exc(), **facts}))
    sys.exit(1)
