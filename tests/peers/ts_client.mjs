// Drive taskgate with the official TypeScript SDK client (@modelcontextprotocol/client
// 2.4.0, 2026-07-28) and its Tasks extension (@modelcontextprotocol/ext-tasks 0.2.2),
// both installed by scripts/install-peers.sh into .peers/npm.
//
//     node ts_client.mjs NODE_MODULES URL TOKEN SCENARIO SPEC_JSON
//
// SCENARIO is fast | task | input | cancel; SPEC_JSON names the upstream's tool and
// arguments ({"tool": ..., "args": {...}, "answer": {...}}), so the same driver runs in
// front of any upstream. Prints one JSON object on the last stdout line:
// {"ok": true, ...facts} or {"ok": false, "error": ...}; tests/ts_client.rs asserts on
// the facts. Outcomes are reported as the SDK produced them (a failed outcome is a
// fact, not a driver error), so the Rust side shows what the SDK objected to.
//
// ext-tasks cannot send 2026-07-28 task traffic through the SDK Client's request path
// (the Client's codecs reject `resultType: "task"`), so it needs a host `rawDispatch`
// (its README). This one sends each request through a second instance of the SDK's
// own StreamableHTTPClientTransport, which derives MCP-Protocol-Version, Mcp-Method and
// Mcp-Name from the body, and picks the matching response out of its `onmessage`
// (found when trying the SDK against taskgate).

import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [NODE_MODULES, URL_, TOKEN, SCENARIO, SPEC_JSON] = process.argv.slice(2);
const SPEC = JSON.parse(SPEC_JSON ?? "{}");
const VERSION = "2026-07-28";
const CLIENT_INFO = { name: "taskgate-ts-driver", version: "0.0.0" };
const CAPABILITIES = { elicitation: {} };

// The peers live in .peers/npm, not next to this file, so bare specifiers would not
// resolve from here. Import each package's ESM entry by file URL, read from its own
// `exports` map; ext-tasks' own `import "@modelcontextprotocol/client"` resolves to the
// same file, so both share one module instance (its `instanceof` checks rely on it).
function entry(pkg, sub = ".") {
  const dir = path.join(NODE_MODULES, pkg);
  const exp = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).exports[sub];
  let target = typeof exp === "string" ? exp : exp.import;
  if (typeof target === "object") target = target.default;
  return pathToFileURL(fs.realpathSync(path.join(dir, target))).href;
}
const sdk = await import(entry("@modelcontextprotocol/client"));
const tasks = await import(entry("@modelcontextprotocol/ext-tasks", "./client"));
const { Client, StreamableHTTPClientTransport } = sdk;
const { createTaskSessionFromClient, DispatchError } = tasks;

function transport() {
  return new StreamableHTTPClientTransport(new URL(URL_), {
    requestInit: { headers: { authorization: `Bearer ${TOKEN}` } },
  });
}

// Every raw exchange, for the facts (method, task status, the completed result), and
// background errors the session reported.
const wire = [];
const errors = [];

/** A `rawDispatch` over the SDK's own transport (see the header comment). */
async function rawDispatcher() {
  const t = transport();
  const pending = new Map();
  t.onmessage = (m) => {
    const p = m && m.id !== undefined ? pending.get(m.id) : undefined;
    if (p !== undefined && ("result" in m || "error" in m)) {
      pending.delete(m.id);
      p.resolve(m);
    }
  };
  t.onerror = () => {}; // failures surface through send() and the pending map
  await t.start();
  let next = 0;
  const dispatch = async (request, options = {}) => {
    const id = `ts-raw-${++next}`;
    const message = { jsonrpc: "2.0", id, ...request };
    const reply = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
    const fail = (why, retryable, cause) => {
      pending.get(id)?.reject(new DispatchError(why, retryable, cause ? { cause } : undefined));
      pending.delete(id);
    };
    const aborted = () => fail("aborted", false);
    options.signal?.addEventListener("abort", aborted, { once: true });
    try {
      await t.send(message, {
        requestSignal: options.signal,
        headers: options.context?.headers,
        onRequestStreamEnd: () => fail(`${request.method}: stream ended without a response`, true),
      });
    } catch (e) {
      // A 429 (poll limiter) is worth the one retry ext-tasks allows; anything else
      // non-2xx is a transport failure as the SDK sees it.
      fail(`${request.method}: ${e?.message ?? e}`, e?.data?.status === 429, e);
    }
    try {
      const m = await reply;
      const r = m.result;
      wire.push({
        method: request.method,
        error: m.error?.code,
        resultType: r?.resultType,
        status: r?.status,
        server_info: r?._meta?.["io.modelcontextprotocol/serverInfo"],
        ...(r?.status === "completed" ? { result: r.result } : {}),
      });
      return "error" in m ? { kind: "error", error: m.error } : { kind: "result", result: r };
    } finally {
      options.signal?.removeEventListener("abort", aborted);
    }
  };
  return { dispatch, close: () => t.close() };
}

const texts = (result) => (result?.content ?? []).map((c) => c.text ?? null);

function describe(e) {
  if (e === undefined || e === null) return null;
  const out = { name: e.name, message: e.message };
  if (e.code !== undefined) out.code = e.code;
  if (e.issues !== undefined) out.issues = e.issues;
  if (e.cause !== undefined) out.cause = describe(e.cause);
  return out;
}

function outcomeFacts(outcome) {
  return {
    outcome: outcome.status,
    outcome_error: outcome.status === "failed" ? describe(outcome.error) : null,
    result: outcome.status === "completed" ? outcome.result : null,
    texts: outcome.status === "completed" ? texts(outcome.result) : [],
    terminal_task_status: outcome.task?.status ?? null,
  };
}

async function withSession(body, onInputRequest) {
  const client = new Client(CLIENT_INFO, {
    capabilities: CAPABILITIES,
    versionNegotiation: { mode: { pin: VERSION } },
  });
  await client.connect(transport());
  const raw = await rawDispatcher();
  const session = createTaskSessionFromClient(client, {
    endpointId: `taskgate-test:${URL_}`,
    rawDispatch: raw.dispatch,
    v2RequestFraming: {
      protocolVersion: VERSION,
      clientInfo: CLIENT_INFO,
      clientCapabilities: CAPABILITIES,
    },
    ...(onInputRequest ? { onInputRequest } : {}),
    onError: (e) => errors.push(describe(e)),
  });
  try {
    return { era: client.getProtocolEra(), ...(await body({ client, session })) };
  } finally {
    await session.close().catch(() => {});
    await raw.close().catch(() => {});
    await client.close().catch(() => {});
  }
}
// Settle an execution, recording every task status the SDK observed.
async function settle(execution) {
  const seen = [];
  const { outcome } = await execution.settle({
    onEvent: (ev) => {
      if (ev.type === "task") seen.push(ev.task.status);
    },
  });
  return { statuses: seen, ...outcomeFacts(outcome) };
}

const scenarios = {
  // A fast call: answered inline, no task; the SDK's own tools/list and callTool too.
  async fast() {
    return withSession(async ({ client, session }) => {
      const tools = (await client.listTools()).tools.map((t) => t.name);
      const plain = await client.callTool({ name: SPEC.tool, arguments: SPEC.args });
      const execution = await session.callTool(SPEC.tool, SPEC.args);
      return {
        tools,
        plain_texts: texts(plain),
        kind: execution.kind,
        ...(await settle(execution)),
      };
    });
  },

  // A slow call: a task, polled by the SDK to its completed result.
  async task() {
    return withSession(async ({ session }) => {
      const execution = await session.callTool(SPEC.tool, SPEC.args);
      const facts = { kind: execution.kind, task_id: execution.handle?.taskId ?? null };
      return { ...facts, ...(await settle(execution)) };
    });
  },

  // The upstream asks a question: the task turns input_required, the SDK calls the
  // application's handler and answers with tasks/update.
  async input() {
    const asked = [];
    const onInputRequest = async (request, context) => {
      asked.push({
        kind: request.kind,
        message: request.params?.message ?? null,
        scope: context.scope,
        delivery: context.delivery,
      });
      return { action: "accept", content: SPEC.answer };
    };
    return withSession(async ({ session }) => {
      const execution = await session.callTool(SPEC.tool, SPEC.args);
      const facts = { kind: execution.kind, task_id: execution.handle?.taskId ?? null };
      return { ...facts, ...(await settle(execution)), asked };
    }, onInputRequest);
  },

  // Cancel a running task; then read the task back until the gateway reports it terminal.
  async cancel() {
    return withSession(async ({ session }) => {
      const execution = await session.callTool(SPEC.tool, SPEC.args);
      if (execution.kind !== "task") return { kind: execution.kind };
      const taskId = execution.handle.taskId;
      await execution.cancel();
      const settled = await settle(execution);
      const controller = session.task(taskId);
      let server = null;
      const deadline = Date.now() + 30_000;
      while (Date.now() < deadline) {
        server = await controller.snapshot();
        if (["completed", "failed", "cancelled"].includes(server.status)) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      return { kind: execution.kind, task_id: taskId, ...settled, server_status: server?.status ?? null };
    });
  },
};

const guard = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, error: "driver timed out after 90 s", wire, errors }));
  process.exit(1);
}, 90_000);

let out;
try {
  const fn = scenarios[SCENARIO];
  if (fn === undefined) throw new Error(`unknown scenario ${SCENARIO}`);
  out = { ok: true, ...(await fn()) };
} catch (e) {
  out = { ok: false, error: describe(e), trace: e?.stack ?? null };
}
clearTimeout(guard);
console.log(JSON.stringify({ ...out, wire, errors }));
process.exit(0);
