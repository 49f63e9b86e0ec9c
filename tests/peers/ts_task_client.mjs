// Drive a 2025-11-25 task server (taskgate, or an upstream directly) with the
// TypeScript SDK 1.x client's experimental tasks API (@modelcontextprotocol/sdk
// 1.32.2: `client.experimental.tasks.*`, `Client.request(..., {task})`), installed by
// scripts/install-peers.sh into .peers/npm.
//
//     node ts_task_client.mjs NODE_MODULES URL TOKEN MODE [ARG...]
//
// TOKEN is sent as `Authorization: Bearer TOKEN`; `-` sends none. MODE is one of the
// modes of tests/peers/mcp130_task_client.py (`create-poll-result`, `elicit`,
// `create-result`, `cancel`, `list`, `get`, `result`, `cancel-id`, `sync`; same
// arguments, same environment: TASK_TTL, ANSWER, ELICIT_ACTION, CANCEL_AFTER_MS,
// DEADLINE_S), plus
//
// - `stream TOOL ARGSJSON`: the SDK's own flow,
//   `client.experimental.tasks.callToolStream(..., {task: {ttl}})`: it polls
//   `tasks/get` at pollInterval and, on `input_required`, calls `tasks/result` once
//   and takes that answer as the final result. `streamed` lists the message types it
//   yielded.
//
// TRACE=1 also prints every JSON-RPC message the client POSTs ({"event": "sent"}).
// Prints one JSON object per line as things happen ({"event": ...}) and a summary as
// the last line: {"ok": true, ...facts} or {"ok": false, "error": ...}; protocol
// errors are facts (`errors`), `ok` is false only when the driver itself broke.

import path from "node:path";
import { pathToFileURL } from "node:url";

const [NODE_MODULES, URL_, TOKEN, MODE, ...ARGV] = process.argv.slice(2);
const esm = (p) =>
  import(pathToFileURL(path.join(NODE_MODULES, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await esm("client/index.js");
const { StreamableHTTPClientTransport } = await esm("client/streamableHttp.js");
const T = await esm("types.js");

const RELATED = "io.modelcontextprotocol/related-task";
const env = process.env;
const TTL = Number(env.TASK_TTL ?? 60000);
const ANSWER = JSON.parse(env.ANSWER ?? '{"answer": "42"}');
const ELICIT_ACTION = env.ELICIT_ACTION ?? "accept";
const CANCEL_AFTER_MS = Number(env.CANCEL_AFTER_MS ?? 500);
const DEADLINE = Date.now() + Number(env.DEADLINE_S ?? 120) * 1000;
const TERMINAL = ["completed", "failed", "cancelled"];

const facts = {
  mode: MODE,
  statuses: [], // every tasks/get status, in order
  notified: [], // statuses from notifications/tasks/status
  progress: 0,
  elicitations: [],
  interim: [], // tasks/result answers that came back before a terminal tasks/get
  errors: [],
};
const state = { inResult: false };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const emit = (event, o = {}) => console.log(JSON.stringify({ event, ...o }));
const textOf = (r) => r?.content?.find((c) => c.type === "text")?.text ?? null;
// Requests may block (tasks/result): bound them by the run's deadline, not the SDK's
// 60 s default.
const reqOpts = () => ({ timeout: Math.max(1000, DEADLINE - Date.now()) });

function recordError(op, e, expected = false) {
  const err = { op, code: Number.isInteger(e?.code) ? e.code : null, message: String(e?.message ?? e) };
  if (!expected) facts.errors.push(err);
  emit("error", err);
  return err;
}

// Every POSTed JSON-RPC message, when TRACE=1.
async function tracingFetch(url, init) {
  if (env.TRACE === "1" && init?.method === "POST" && typeof init.body === "string") {
    try {
      emit("sent", { message: JSON.parse(init.body) });
    } catch {
      // not JSON: nothing to trace
    }
  }
  return fetch(url, init);
}

const client = new Client(
  { name: "taskgate-ts-task-client", version: "0.0.0" },
  { capabilities: { elicitation: {} } },
);
client.setRequestHandler(T.ElicitRequestSchema, async (req, extra) => {
  const e = {
    message: req.params.message ?? null,
    relatedTask: extra?._meta?.[RELATED]?.taskId ?? req.params?._meta?.[RELATED]?.taskId ?? null,
    duringResult: state.inResult,
  };
  facts.elicitations.push(e);
  emit("elicitation", e);
  return ELICIT_ACTION === "accept" ? { action: "accept", content: ANSWER } : { action: ELICIT_ACTION };
});
client.setNotificationHandler(T.TaskStatusNotificationSchema, (n) => {
  facts.notified.push(n.params.status);
  emit("notification", { taskId: n.params.taskId, status: n.params.status, statusMessage: n.params.statusMessage ?? null });
});

class CreateFailed extends Error {}

async function create(tool, args) {
  try {
    const created = await client.request(
      { method: "tools/call", params: { name: tool, arguments: args } },
      T.CreateTaskResultSchema,
      {
        task: { ttl: TTL },
        // The 2025-11-25 spec keeps the progressToken valid for the task's lifetime;
        // the SDK keeps this handler after the CreateTaskResult.
        onprogress: (p) => {
          facts.progress += 1;
          emit("progress", { progress: p.progress, total: p.total ?? null, message: p.message ?? null });
        },
        ...reqOpts(),
      },
    );
    facts.taskId = created.task.taskId;
    facts.created = created.task;
    emit("created", { task: created.task, meta: created._meta ?? null });
    return created.task;
  } catch (e) {
    facts.createError = recordError("tools/call", e);
    throw new CreateFailed();
  }
}

async function get(taskId) {
  const t = await client.experimental.tasks.getTask(taskId, reqOpts());
  facts.statuses.push(t.status);
  facts.lastTask = t;
  emit("status", { status: t.status, statusMessage: t.statusMessage ?? null, pollInterval: t.pollInterval ?? null, ttl: t.ttl });
  return t;
}

/** tasks/get inside a flow: an error (the task expired, another principal...) is a
 * fact and ends the flow. */
async function getOrStop(taskId) {
  try {
    return await get(taskId);
  } catch (e) {
    recordError("tasks/get", e);
    return null;
  }
}

/** tasks/result captured loosely, then checked against CallToolResultSchema. */
async function result(taskId, final) {
  state.inResult = true;
  let raw;
  try {
    raw = await client.experimental.tasks.getTaskResult(taskId, T.GetTaskPayloadResultSchema, reqOpts());
  } finally {
    state.inResult = false;
  }
  const parsed = T.CallToolResultSchema.safeParse(raw);
  const r = {
    result: raw,
    text: textOf(raw),
    relatedTask: raw?._meta?.[RELATED]?.taskId ?? null,
    validCallToolResult: parsed.success ? true : String(parsed.error?.message ?? parsed.error).split("\n")[0],
  };
  emit("result", { final, ...r });
  if (final) {
    facts.result = raw;
    facts.resultText = r.text;
    facts.resultRelatedTask = r.relatedTask;
    facts.validCallToolResult = r.validCallToolResult;
  } else {
    facts.interim.push(r);
  }
  return raw;
}

const pollSleep = (t) => sleep(Math.max(t.pollInterval ?? 500, 50));

async function pollFlow(tool, args) {
  const { taskId } = await create(tool, args);
  for (;;) {
    if (Date.now() > DEADLINE) throw new Error("task did not reach a terminal status");
    const t = await getOrStop(taskId);
    if (!t) return;
    if (TERMINAL.includes(t.status)) break;
    if (t.status === "input_required") {
      // The 2025-11-25 spec (Task Status): tasks/result delivers the input request;
      // the requestor answers on the stream and resumes polling once it returns.
      try {
        await result(taskId, false);
      } catch (e) {
        recordError("tasks/result", e);
      }
      const after = await getOrStop(taskId);
      if (!after) return;
      if (facts.interim.length) facts.interim[facts.interim.length - 1].statusAfter = after.status;
      if (TERMINAL.includes(after.status)) break;
      await pollSleep(after);
      continue;
    }
    await pollSleep(t);
  }
  try {
    await result(taskId, true);
  } catch (e) {
    recordError("tasks/result", e);
  }
}

async function resultFirstFlow(tool, args) {
  const { taskId } = await create(tool, args);
  for (;;) {
    if (Date.now() > DEADLINE) throw new Error("task did not reach a terminal status");
    try {
      await result(taskId, false);
    } catch (e) {
      recordError("tasks/result", e);
    }
    const t = await getOrStop(taskId);
    if (!t) return;
    if (TERMINAL.includes(t.status)) break;
    await pollSleep(t);
  }
  // The last answer was the terminal one: promote it.
  const last = facts.interim.pop();
  if (last) {
    facts.result = last.result;
    facts.resultText = last.text;
    facts.resultRelatedTask = last.relatedTask;
    facts.validCallToolResult = last.validCallToolResult;
  }
}

async function cancelFlow(tool, args) {
  const { taskId } = await create(tool, args);
  await get(taskId);
  await sleep(CANCEL_AFTER_MS);
  try {
    facts.cancelled = await client.experimental.tasks.cancelTask(taskId, reqOpts());
    emit("cancelled", { task: facts.cancelled });
  } catch (e) {
    recordError("tasks/cancel", e);
  }
  try {
    await get(taskId);
  } catch (e) {
    recordError("tasks/get", e);
  }
  try {
    state.inResult = true;
    const raw = await client.experimental.tasks.getTaskResult(taskId, T.GetTaskPayloadResultSchema, { timeout: 10000 });
    facts.result = raw;
    facts.resultText = textOf(raw);
    emit("result", { final: true, result: raw });
  } catch (e) {
    recordError("tasks/result", e);
  } finally {
    state.inResult = false;
  }
  try {
    facts.cancelAgain = await client.experimental.tasks.cancelTask(taskId, reqOpts());
  } catch (e) {
    facts.cancelAgainError = recordError("tasks/cancel", e, true);
  }
}

async function listFlow() {
  if (ARGV.length >= 2) {
    const { taskId } = await create(ARGV[0], JSON.parse(ARGV[1]));
    await get(taskId);
  }
  const seen = [];
  let cursor;
  let pages = 0;
  do {
    const page = await client.experimental.tasks.listTasks(cursor, reqOpts());
    pages += 1;
    seen.push(...page.tasks);
    cursor = page.nextCursor;
  } while (cursor && pages <= 100);
  facts.listed = seen.map((t) => ({ taskId: t.taskId, status: t.status }));
  facts.pages = pages;
  if (facts.taskId) facts.containsCreated = seen.some((t) => t.taskId === facts.taskId);
  emit("listed", { tasks: facts.listed, pages });
}

async function streamFlow(tool, args) {
  facts.streamed = [];
  const stream = client.experimental.tasks.callToolStream({ name: tool, arguments: args }, T.CallToolResultSchema, {
    task: { ttl: TTL },
    ...reqOpts(),
  });
  for await (const m of stream) {
    facts.streamed.push(m.type);
    if (m.type === "taskCreated") {
      facts.taskId = m.task.taskId;
      facts.created = m.task;
      emit("created", { task: m.task });
    } else if (m.type === "taskStatus") {
      facts.statuses.push(m.task.status);
      emit("status", { status: m.task.status, statusMessage: m.task.statusMessage ?? null });
    } else if (m.type === "result") {
      facts.result = m.result;
      facts.resultText = textOf(m.result);
      facts.resultRelatedTask = m.result?._meta?.[RELATED]?.taskId ?? null;
      emit("result", { final: true, result: m.result });
    } else if (m.type === "error") {
      recordError("callToolStream", m.error);
    }
  }
  // What the server says once the stream is done (the stream may have stopped at
  // the tasks/result it made for input_required).
  if (facts.taskId) facts.statusAfterStream = (await get(facts.taskId)).status;
}

async function single(op, taskId) {
  try {
    if (op === "get") await get(taskId);
    else if (op === "result") {
      state.inResult = true;
      const raw = await client.experimental.tasks.getTaskResult(taskId, T.GetTaskPayloadResultSchema, {
        timeout: Number(env.RESULT_TIMEOUT_S ?? 30) * 1000,
      });
      facts.result = raw;
      facts.resultText = textOf(raw);
      emit("result", { final: true, result: raw });
    } else {
      facts.cancelled = await client.experimental.tasks.cancelTask(taskId, reqOpts());
      emit("cancelled", { task: facts.cancelled });
    }
  } catch (e) {
    recordError(`tasks/${op}`, e);
  } finally {
    state.inResult = false;
  }
}

async function runMode() {
  const args = () => JSON.parse(ARGV[1]);
  switch (MODE) {
    case "create-poll-result":
    case "elicit":
      return pollFlow(ARGV[0], args());
    case "create-result":
      return resultFirstFlow(ARGV[0], args());
    case "cancel":
      return cancelFlow(ARGV[0], args());
    case "list":
      return listFlow();
    case "stream":
      return streamFlow(ARGV[0], args());
    case "get":
    case "result":
    case "cancel-id":
      return single(MODE.replace("-id", ""), ARGV[0]);
    case "sync":
      try {
        const r = await client.callTool({ name: ARGV[0], arguments: args() }, undefined, {
          onprogress: () => {
            facts.progress += 1;
          },
          ...reqOpts(),
        });
        facts.result = r;
        facts.resultText = textOf(r);
      } catch (e) {
        recordError("tools/call", e);
      }
      return;
    default:
      throw new Error(`unknown mode ${MODE}`);
  }
}

async function main() {
  const headers = TOKEN && TOKEN !== "-" ? { authorization: `Bearer ${TOKEN}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(URL_), {
    requestInit: { headers },
    fetch: tracingFetch,
  });
  await client.connect(transport);
  facts.protocolVersion = transport.protocolVersion ?? null;
  facts.serverCapabilities = client.getServerCapabilities();
  facts.sessionId = transport.sessionId ?? null;
  emit("initialized", { protocolVersion: facts.protocolVersion, capabilities: facts.serverCapabilities, sessionId: facts.sessionId });
  if (!["get", "result", "cancel-id"].includes(MODE)) {
    // Also primes the SDK's per-tool task cache (isToolTask / isToolTaskRequired).
    const tools = (await client.listTools(undefined, reqOpts())).tools;
    facts.tools = Object.fromEntries(tools.map((t) => [t.name, t.execution?.taskSupport ?? null]));
  }
  try {
    await runMode();
  } catch (e) {
    if (!(e instanceof CreateFailed)) throw e;
  }
  // Let late notifications (the terminal tasks/status) arrive.
  await sleep(300);
  await client.close();
}

try {
  await main();
  console.log(JSON.stringify({ ok: true, ...facts }));
  process.exit(0);
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: String(e?.stack ?? e), ...facts }));
  process.exit(1);
}
