// Drive taskgate as a plain 2025-era client with the TypeScript SDK 1.x
// (@modelcontextprotocol/sdk 1.32.2: Client + StreamableHTTPClientTransport, installed by
// scripts/install-peers.sh into .peers/npm). The session calls tools without
// `params.task`, so a tool in `plain_clients = "handle"` mode answers a call that
// outlives `promote_after_ms` with an ordinary tool result naming a task, which this
// driver follows through the gateway's own tools `taskgate_task_status`,
// `taskgate_task_cancel` and `taskgate_task_list` (issue 51, "task handles as tool
// results for plain clients").
//
//     node handle_ts_client.mjs NODE_MODULES URL TOKEN SCENARIO SPEC_JSON [TOKEN2]
//
// SCENARIO is one of `list`, `handle`, `cancel`, `foreign`, `status`, `output_schema`,
// `elicit_late` (the same scenarios and facts as tests/peers/handle_py_client.py);
// SPEC_JSON carries their inputs (`ms`, `wait`, `task_id`, `message`, `answer`,
// optionally `tool` and `args` to call another tool in place of the scenario's own, and
// `prefix`, the task tools' name prefix, default `taskgate_`). Input the upstream asks
// for after the handle reaches this client as an elicitation request on the status
// call's SSE stream, answered by the client's request handler. Prints one JSON object
// on the last stdout line: {"ok": true, ...facts} or {"ok": false, "error": ...};
// tests/task_handles.rs asserts on the facts.

import crypto from "node:crypto";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [NODE_MODULES, URL_, TOKEN, SCENARIO, SPEC_JSON, TOKEN2] = process.argv.slice(2);
const SPEC = JSON.parse(SPEC_JSON ?? "{}");
const PREFIX = SPEC.prefix ?? "taskgate_";
const STATUS = `${PREFIX}task_status`;
const CANCEL = `${PREFIX}task_cancel`;
const LIST = `${PREFIX}task_list`;
const esm = (p) =>
  import(pathToFileURL(path.join(NODE_MODULES, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await esm("client/index.js");
const { StreamableHTTPClientTransport } = await esm("client/streamableHttp.js");
const T = await esm("types.js");

const facts = {};
const asked = [];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Each request may be held up to its waitSeconds; the SDK's default is 60 s.
const OPTS = { timeout: 120000 };

async function connect(token) {
  const transport = new StreamableHTTPClientTransport(new URL(URL_), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  const client = new Client(
    { name: "taskgate-handle-ts", version: "0.0.0" },
    { capabilities: { elicitation: {} } },
  );
  client.setRequestHandler(T.ElicitRequestSchema, async (req) => {
    asked.push(req.params.message ?? null);
    return { action: "accept", content: SPEC.answer ?? { answer: "42" } };
  });
  await client.connect(transport);
  facts.protocolVersion = transport.protocolVersion ?? null;
  return client;
}

/** tools/call; a JSON-RPC error becomes {error: {code, message}} instead of throwing. */
async function call(client, name, args) {
  try {
    return await client.callTool({ name, arguments: args }, undefined, OPTS);
  } catch (e) {
    if (e instanceof T.McpError) return { error: { code: e.code, message: e.message } };
    throw e;
  }
}

function status(client, taskId, wait) {
  const args = { taskId };
  if (wait !== undefined && wait !== null) args.waitSeconds = wait;
  return call(client, STATUS, args);
}

/** task_status with waitSeconds until the task is no longer working (honouring a
 *  'polled too often' answer's retryAfterSeconds); returns [last result, polls]. */
async function untilDone(client, taskId, wait, limitMs = 90000) {
  const end = Date.now() + limitMs;
  let polls = 0;
  for (;;) {
    const r = await status(client, taskId, wait);
    polls += 1;
    const sc = r.structuredContent ?? {};
    if (r.isError && sc.retryAfterSeconds !== undefined) {
      await sleep(sc.retryAfterSeconds * 1000);
    } else if (["working", "input_required"].includes(sc.status) && sc.taskId === taskId) {
      await sleep(Math.min(sc.pollAfterSeconds ?? 0, 1) * 1000);
    } else {
      return [r, polls];
    }
    if (Date.now() > end) return [r, polls];
  }
}

/** A well-formed id the gateway never issued: `tsk_` + 22 base64url characters. */
const neverIssued = () => "tsk_" + crypto.randomBytes(16).toString("base64url");

/** Call `tool`; record how long the answer took and the handle it carried. */
async function startHandle(client, tool, args) {
  const t0 = Date.now();
  const r = await call(client, tool, args);
  facts.call_elapsed_s = (Date.now() - t0) / 1000;
  facts.call = r;
  return r.structuredContent?.taskId ?? null;
}

const scenarios = {
  async list() {
    const c = await connect(TOKEN);
    const tools = (await c.listTools()).tools;
    const by = Object.fromEntries(tools.map((t) => [t.name, t]));
    facts.tools = Object.keys(by).sort();
    facts.sleep_has_output_schema = by.sleep?.outputSchema !== undefined;
    facts.measure_has_output_schema = by.measure?.outputSchema !== undefined;
    facts.task_tools = [STATUS, CANCEL, LIST].filter((n) => n in by);
    facts.task_status_input_schema = by[STATUS]?.inputSchema ?? null;
    facts.task_cancel_input_schema = by[CANCEL]?.inputSchema ?? null;
    facts.task_list_input_schema = by[LIST]?.inputSchema ?? null;
    // A quick call stays inline in either mode.
    facts.echo = await call(c, "echo", { text: SPEC.text ?? "hi plain ts" });
    await c.close();
  },

  async handle() {
    const c = await connect(TOKEN);
    const id = await startHandle(c, "sleep", { ms: SPEC.ms ?? 20000 });
    facts.task_id = id;
    if (id) {
      facts.running = await status(c, id);
      [facts.done, facts.polls] = await untilDone(c, id, SPEC.wait ?? 30);
      facts.list = await call(c, LIST, {});
    }
    await c.close();
  },

  async cancel() {
    const c = await connect(TOKEN);
    const id = await startHandle(c, "sleep", { ms: SPEC.ms ?? 60000 });
    facts.task_id = id;
    if (id) {
      facts.cancel = await call(c, CANCEL, { taskId: id });
      [facts.after, facts.polls] = await untilDone(c, id, SPEC.wait ?? 5);
      // Malformed and missing ids are JSON-RPC errors, not tool results.
      facts.malformed = await call(c, STATUS, { taskId: "not-a-task" });
      facts.missing = await call(c, STATUS, {});
    }
    await c.close();
  },

  async foreign() {
    const c = await connect(TOKEN2 ?? TOKEN);
    facts.foreign = await status(c, SPEC.task_id);
    facts.never_issued_id = neverIssued();
    facts.never_issued = await status(c, facts.never_issued_id);
    facts.identical = JSON.stringify(facts.foreign) === JSON.stringify(facts.never_issued);
    await c.close();
  },

  async status() {
    const c = await connect(TOKEN);
    const t0 = Date.now();
    facts.result = await status(c, SPEC.task_id, SPEC.wait);
    facts.elapsed_s = (Date.now() - t0) / 1000;
    await c.close();
  },

  async output_schema() {
    const c = await connect(TOKEN);
    // Listing caches each tool's outputSchema; callTool then validates a non-error
    // result's structuredContent against it and throws on a mismatch
    // (Client.callTool in the SDK): record that as a fact rather than failing.
    const listed = (await c.listTools()).tools.find((t) => t.name === "measure");
    facts.measure_listed = listed !== undefined;
    facts.measure_has_output_schema = listed?.outputSchema !== undefined;
    const t0 = Date.now();
    try {
      facts.call = await c.callTool({ name: "measure", arguments: { ms: SPEC.ms ?? 3000 } }, undefined, OPTS);
      facts.sdk_accepted = true;
    } catch (e) {
      const validation = /output schema|structured content/i.test(String(e?.message));
      if (!validation) {
        facts.call = { error: { code: e?.code ?? null, message: String(e?.message ?? e) } };
        await c.close();
        return;
      }
      facts.sdk_accepted = false;
      facts.sdk_error = String(e?.message ?? e);
      await c.close();
      return;
    }
    facts.call_elapsed_s = (Date.now() - t0) / 1000;
    const id = facts.call.structuredContent?.taskId ?? null;
    facts.task_id = id;
    if (id) {
      try {
        [facts.done, facts.polls] = await untilDone(c, id, SPEC.wait ?? 30);
        facts.status_sdk_accepted = true;
      } catch (e) {
        facts.status_sdk_accepted = false;
        facts.status_sdk_error = String(e?.message ?? e);
      }
    }
    await c.close();
  },

  async elicit_late() {
    const c = await connect(TOKEN);
    const id = await startHandle(
      c,
      SPEC.tool ?? "slow_elicit",
      SPEC.args ?? { ms: SPEC.ms ?? 3000, message: SPEC.message ?? "Favourite colour?" },
    );
    facts.task_id = id;
    facts.asked_before_handle = [...asked];
    if (id) {
      // The question arrives as elicitation/create on the status call's SSE stream;
      // the request handler above answers it.
      [facts.done, facts.polls] = await untilDone(c, id, SPEC.wait ?? 30);
      facts.asked = asked;
      facts.final_text = facts.done?.content?.find((b) => b.type === "text")?.text ?? null;
    }
    await c.close();
  },
};

try {
  const fn = scenarios[SCENARIO];
  if (!fn) throw new Error(`unknown scenario ${SCENARIO}`);
  const limit = (SPEC.limit_s ?? 150) * 1000;
  await Promise.race([fn(), sleep(limit).then(() => Promise.reject(new Error(`timed out after ${limit} ms`)))]);
  console.log(JSON.stringify({ ok: true, ...facts }));
  process.exit(0);
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: String(e?.stack ?? e), ...facts }));
  process.exit(1);
}
