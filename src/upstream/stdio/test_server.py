# Tiny legacy (2025-era) stdio MCP server used by the stdio transport tests.
# Speaks newline-delimited JSON-RPC on stdin/stdout; notes what happened on stderr and
# (if TG_LOG is set) in a file the tests can poll.
import json, os, signal, subprocess, sys, threading, time

STUBBORN = "--stubborn" in sys.argv  # ignores SIGTERM and stdin EOF
if STUBBORN:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
LOG = os.environ.get("TG_LOG")
PID = os.getpid()
lock = threading.Lock()


def note(s):
    sys.stderr.write("%d %s\n" % (PID, s))
    sys.stderr.flush()
    if LOG:
        with open(LOG, "a") as f:
            f.write("%d %s\n" % (PID, s))


def send(m):
    with lock:
        sys.stdout.write(json.dumps(m) + "\n")
        sys.stdout.flush()


def result(cid, text, **extra):
    r = {"content": [{"type": "text", "text": text}], "pid": PID}
    r.update(extra)
    send({"jsonrpc": "2.0", "id": cid, "result": r})


pending = {}  # our request id -> the tools/call id waiting for its answer
cancelled = set()
grandchild = []


def sleeper(cid, secs, on_cancel):
    deadline = time.time() + secs
    while time.time() < deadline:
        if cid in cancelled:
            if on_cancel == "answer":
                result(cid, "late")
            return
        time.sleep(0.02)
    result(cid, "slept")


def gate(cid, path):
    while not os.path.exists(path):
        time.sleep(0.02)
    result(cid, "gate open")


def tool(cid, name, args, meta):
    token = (meta or {}).get("progressToken")
    note("call %s %s" % (name, cid))
    if name == "echo":
        result(cid, args.get("text", ""), args=args)
    elif name == "progress":
        send({"jsonrpc": "2.0", "method": "notifications/progress",
              "params": {"progressToken": token, "progress": 1, "total": 2, "message": "half"}})
        send({"jsonrpc": "2.0", "method": "notifications/progress",
              "params": {"progressToken": "not-mine", "progress": 9}})
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "info", "data": "working"}})
        result(cid, "done", token=token)
    elif name == "batch":
        sys.stdout.write(json.dumps([
            {"jsonrpc": "2.0", "method": "notifications/progress",
             "params": {"progressToken": token, "progress": 1}},
            {"jsonrpc": "2.0", "id": cid, "result": {"content": [], "pid": PID, "batched": True}},
        ]) + "\n")
        sys.stdout.flush()
    elif name == "elicit":
        pending["e%d" % cid] = cid
        send({"jsonrpc": "2.0", "id": "e%d" % cid, "method": "elicitation/create",
              "params": {"message": "name?", "requestedSchema": {"type": "object"}}})
    elif name == "sleep":
        threading.Thread(target=sleeper, args=(cid, args.get("secs", 1), args.get("on_cancel", "ignore")),
                         daemon=True).start()
    elif name == "gate":
        threading.Thread(target=gate, args=(cid, args["path"]), daemon=True).start()
    elif name == "crash":
        os.kill(PID, signal.SIGKILL)
    elif name == "big":
        sys.stdout.write("x" * args.get("n", 100000) + "\n")
        sys.stdout.flush()
    elif name == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        result(cid, "after garbage")
    elif name == "notify":
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        result(cid, "notified")
    elif name == "grandchild":
        p = subprocess.Popen(["sleep", "1000"])
        grandchild.append(p)
        result(cid, "spawned", grandchild=p.pid)
    else:
        send({"jsonrpc": "2.0", "id": cid, "error": {"code": -32602, "message": "unknown tool " + name}})


note("started")
while True:
    line = sys.stdin.readline()
    if not line:
        note("stdin eof")
        if STUBBORN:
            while True:
                time.sleep(1000)
        sys.exit(0)
    try:
        msg = json.loads(line)
    except Exception:
        note("bad line")
        continue
    method = msg.get("method")
    mid = msg.get("id")
    if method == "initialize":
        note("initialize " + msg["params"]["protocolVersion"])
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "pyfixture", "version": "1.0"}}})
    elif method == "notifications/initialized":
        note("initialized")
        # Unowned request right after the handshake: the gateway must answer it itself.
        send({"jsonrpc": "2.0", "id": "r0", "method": "roots/list"})
    elif method == "notifications/cancelled":
        note("cancelled %s" % msg["params"]["requestId"])
        cancelled.add(msg["params"]["requestId"])
    elif method == "tools/call":
        p = msg.get("params", {})
        tool(mid, p.get("name"), p.get("arguments", {}), p.get("_meta"))
    elif method is None and mid is not None:
        if mid == "r0":
            note("roots answer " + json.dumps(msg.get("result")))
        elif mid in pending:
            cid = pending.pop(mid)
            result(cid, "elicited", answer=msg.get("result"), error=msg.get("error"))
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "nope"}})
