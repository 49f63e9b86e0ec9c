"""Drives one hot path of a running gateway with a fixed number of requests
(benches/hotpath/run.sh). Every request is checked; nothing here is timed."""
import http.client
import json
import sys
import time

port, token, path, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)


def rpc(i, method, params, name):
    body = json.dumps(
        {"jsonrpc": "2.0", "id": i, "method": method, "params": dict(params, _meta=META)}
    )
    conn.request(
        "POST",
        "/mcp",
        body,
        {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "authorization": "Bearer " + token,
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": method,
            "mcp-name": name,
        },
    )
    r = conn.getresponse()
    raw = r.read()
    if r.status != 200:
        sys.exit(f"{method}: HTTP {r.status}: {raw[:300]!r}")
    return json.loads(raw)["result"]


def create(i):
    res = rpc(i, "tools/call", {"name": "sleep", "arguments": {"ms": 0}}, "sleep")
    if res.get("resultType") != "task":
        sys.exit(f"not promoted: {res}")
    return res["taskId"]


def settle(ids, first_id):
    """Poll each task once; those not completed yet are polled again a second later
    (rare: the calls take milliseconds and the driver waited already)."""
    rid, left = first_id, ids
    while left:
        again = []
        for tid in left:
            rid += 1
            if rpc(rid, "tasks/get", {"taskId": tid}, tid)["status"] != "completed":
                again.append(tid)
        if again:
            print(f"{len(again)} tasks not completed yet", file=sys.stderr)
            time.sleep(1)
        left = again


if path == "get":
    # One completed task, polled n times: the poll path of a finished task.
    tid = create(0)
    time.sleep(2)
    settle([tid], 0)
    for i in range(n):
        if rpc(i + 1, "tasks/get", {"taskId": tid}, tid)["status"] != "completed":
            sys.exit("the task left completed")
elif path == "echo":
    for i in range(n):
        res = rpc(i + 1, "tools/call", {"name": "echo", "arguments": {"text": "hello"}}, "echo")
        if res.get("resultType") != "complete":
            sys.exit(f"not inline: {res}")
elif path == "task":
    # n promoted tasks from creation to terminal, each polled once completed.
    ids = [create(i + 1) for i in range(n)]
    time.sleep(3)
    settle(ids, n + 1)
else:
    sys.exit(f"unknown path {path}")
