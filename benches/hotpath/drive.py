"""Drives one hot path of a running gateway with a fixed number of requests
(benches/hotpath/run.sh). Every request is checked; nothing here is timed."""
import http.client
import json
import sys
import time

port, token, path, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
# `seed` and `spread` share a file of task ids and their owners' tokens.
IDS_FILE = sys.argv[5] if len(sys.argv) > 5 else None
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)


TOKENS = {}


def hs256(sub, tenant):
    """A token as `taskgate token` mints it, for one of many principals: one token per
    principal, minted once. (Minted per task, the tokens changed whenever the clock's
    second did, so how many distinct tokens the gateway verified -- and counted --
    depended on how long the seeding took.)"""
    if (sub, tenant) not in TOKENS:
        TOKENS[(sub, tenant)] = mint(sub, tenant)
    return TOKENS[(sub, tenant)]


def mint(sub, tenant):
    import base64, hashlib, hmac
    secret = token  # `seed` gets the secret where the other paths get a token
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    now = int(time.time())
    head = b64(json.dumps({"typ": "JWT", "alg": "HS256"}).encode())
    body = b64(json.dumps({"sub": sub, "tenant": tenant, "iat": now, "exp": now + 3600,
                           "iss": "https://issuer.hotpath", "aud": "taskgate-hotpath"}).encode())
    sig = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


# A client without the tasks extension (`status`: the task tools of docs/design.md §28).
PLAIN = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def rpc(i, method, params, name, bearer=None, meta=META, extra=None):
    body = json.dumps(
        {"jsonrpc": "2.0", "id": i, "method": method, "params": dict(params, _meta=meta)}
    )
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "authorization": "Bearer " + (bearer or token),
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": method,
        "mcp-name": name,
    }
    headers.update(extra or {})
    try:
        conn.request("POST", "/mcp", body, headers)
    except (BrokenPipeError, ConnectionResetError) as e:
        # The gateway closed the kept-alive connection before this request went out
        # (one CI run saw it once, in `task`, with its log gone). Sent again on a new
        # connection, once: a gateway that died refuses that one and fails the run.
        print(f"{method}: the connection was closed before the request ({e!r}); "
              "sending it again on a new one", file=sys.stderr)
        conn.close()
        conn.request("POST", "/mcp", body, headers)
    r = conn.getresponse()
    raw = r.read()
    if r.status != 200:
        sys.exit(f"{method}: HTTP {r.status}: {raw[:300]!r}")
    return json.loads(raw)["result"]


def create(i, bearer=None):
    res = rpc(i, "tools/call", {"name": "sleep", "arguments": {"ms": 0}}, "sleep", bearer)
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
elif path == "status":
    # One completed task, asked for n times through the plain client's status tool.
    tid = create(0)
    time.sleep(2)
    settle([tid], 0)
    tool = "taskgate_task_status"
    for i in range(n):
        res = rpc(i + 1, "tools/call", {"name": tool, "arguments": {"taskId": tid}}, tool,
                  meta=PLAIN, extra={"mcp-param-task-id": tid})
        if res.get("isError") or res.get("content", [{}])[0].get("text") != "slept 0 ms":
            sys.exit(f"not the task's result: {res}")
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
elif path == "seed":
    # n tasks over n/10 principals of 10 tenants, created and never read (the gateway
    # runs natively for this; the `spread` count follows on the same store).
    with open(IDS_FILE, "w") as out:
        for i in range(n):
            p = i % max(n // 10, 1)
            bearer = hs256(f"user{p}", f"tenant{p % 10}")
            out.write(f"{create(i + 1, bearer)} {bearer}\n")
    time.sleep(3)
elif path == "spread":
    # Every seeded task polled twice by its owner: the first read of each (which marks
    # it read) and a second one, as a poller spread over many tasks sees them.
    tasks = [line.split() for line in open(IDS_FILE)]
    rid = 0
    for _ in range(2):
        for tid, bearer in tasks:
            rid += 1
            if rpc(rid, "tasks/get", {"taskId": tid}, tid, bearer)["status"] != "completed":
                sys.exit(f"{tid} is not completed")
else:
    sys.exit(f"unknown path {path}")
