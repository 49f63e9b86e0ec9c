// Drive taskgate as a 2025-era client with the TypeScript SDK 1.x
// (@modelcontextprotocol/sdk 1.32.2: Client + StreamableHTTPClientTransport, or
// StdioClientTransport in front of mcp-remote 0.15.1), both installed by
// scripts/install-peers.sh into .peers/npm.
//
//     node ts_legacy_client.mjs NODE_MODULES URL TOKEN SCENARIO SPEC_JSON [TOKEN2]
//
// SCENARIO is `all` (every flow below on one session), `remote` (the same through
// mcp-remote over stdio) or `foreign` (a session replayed with TOKEN2). SPEC_JSON
// names the upstream's tools for each flow, so the same driver runs in front of any
// upstream: {"fast": {tool, args}, "slow": {tool, args},
// "elicit": {tool, args, answer}|null, "sample": {...}|null, "cancel": {...}|null, "touch": {...}|null,
// "subscribe": {"uri" (null: the first listed), "tool", "args"}|null}. Prints one JSON object on the last
// stdout line: {"ok": true, ...facts} or {"ok": false, "error": ...};
// tests/legacy_clients.rs asserts on the facts.

import path from "node:path";
import { pathToFileURL } from "node:url";

const [NODE_MODULES, URL_, TOKEN, SCENARIO, SPEC_JSON, TOKEN2] = process.argv.slice(2);
const SPEC = JSON.parse(SPEC_JSON ?? "{}");
const esm = (p) =>
  import(pathToFileURL(path.join(NODE_MODULES, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await esm("client/index.js");
const { StreamableHTTPClientTransport } = await esm("client/streamableHttp.js");
const { StdioClientTransport } = await esm("client/stdio.js");
const T = await esm("types.js");

const facts = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (r) => r?.content?.find((c) => c.type === "text")?.text ?? null;

function httpTransport(token, sessionId) {
  return new StreamableHTTPClientTransport(new URL(URL_), {
    sessionId,
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
}

function remoteTransport() {
  const proxy = path.join(NODE_MODULES, "mcp-remote/dist/proxy.js");
  return new StdioClientTransport({
    command: process.execPath,
    args: [proxy, URL_, "--header", `Authorization:Bearer ${TOKEN}`, "--allow-http", "--transport", "http-only"],
    env: { ...process.env, MCP_REMOTE_CONFIG_DIR: process.env.MCP_REMOTE_CONFIG_DIR ?? "/tmp" },
    stderr: "ignore",
  });
}

/** Wait until `pred()` holds, up to `ms`. */
async function until(pred, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (pred()) return true;
    await sleep(50);
  }
  return pred();
}

async function all(transport) {
  const client = new Client(
    { name: "taskgate-legacy-ts", version: "0.0.0" },
    { capabilities: { elicitation: {}, sampling: {}, roots: { listChanged: true } } },
  );
  const elicited = [];
  const sampled = [];
  client.setRequestHandler(T.ElicitRequestSchema, async (req) => {
    elicited.push(req.params.message ?? null);
    return { action: "accept", content: SPEC.elicit?.answer ?? { answer: "42" } };
  });
  client.setRequestHandler(T.CreateMessageRequestSchema, async () => {
    sampled.push(true);
    return { role: "assistant", content: { type: "text", text: "sampled by ts" }, model: "ts-test" };
  });
  client.setRequestHandler(T.ListRootsRequestSchema, async () => ({ roots: [{ uri: "file:///ts-root", name: "ts" }] }));
  let listChanged = 0;
  const updates = [];
  client.setNotificationHandler(T.ToolListChangedNotificationSchema, () => {
    listChanged += 1;
  });
  client.setNotificationHandler(T.ResourceUpdatedNotificationSchema, (n) => {
    updates.push(n.params.uri);
  });

  await client.connect(transport);
  facts.serverInfo = client.getServerVersion();
  facts.capabilities = client.getServerCapabilities();
  facts.sessionId = transport.sessionId ?? null;
  facts.protocolVersion = transport.protocolVersion ?? null;

  facts.tools = (await client.listTools()).tools.map((t) => t.name);
  if (facts.capabilities?.prompts) facts.prompts = (await client.listPrompts()).prompts.length;
  let firstUri = null;
  if (facts.capabilities?.resources) {
    const listed = (await client.listResources()).resources;
    facts.resources = listed.length;
    firstUri = listed[0]?.uri ?? null;
  }

  facts.fast = text(await client.callTool({ name: SPEC.fast.tool, arguments: SPEC.fast.args }));

  const progress = [];
  facts.slow = text(
    await client.callTool({ name: SPEC.slow.tool, arguments: SPEC.slow.args }, undefined, {
      onprogress: (p) => progress.push(p.progress),
      timeout: 60000,
    }),
  );
  facts.progress = progress.length;

  if (SPEC.elicit) {
    facts.elicit = text(await client.callTool({ name: SPEC.elicit.tool, arguments: SPEC.elicit.args }));
    facts.elicited = elicited.length;
  }
  if (SPEC.sample) {
    facts.sample = text(await client.callTool({ name: SPEC.sample.tool, arguments: SPEC.sample.args }));
    facts.sampled = sampled.length;
  }
  if (SPEC.cancel) {
    const ac = new AbortController();
    const started = Date.now();
    const p = client.callTool({ name: SPEC.cancel.tool, arguments: SPEC.cancel.args }, undefined, { signal: ac.signal });
    setTimeout(() => ac.abort("test cancel"), 700);
    try {
      await p;
      facts.cancel = "completed";
    } catch (e) {
      facts.cancel = "aborted";
    }
    facts.cancelMs = Date.now() - started;
    // The session keeps working after a cancel.
    facts.afterCancel = text(await client.callTool({ name: SPEC.fast.tool, arguments: SPEC.fast.args }));
  }
  if (SPEC.touch) {
    // The SDK opens the GET stream after `notifications/initialized`; give it a moment.
    await sleep(500);
    await client.callTool({ name: SPEC.touch.tool, arguments: SPEC.touch.args });
    await until(() => listChanged > 0, 10000);
    facts.listChanged = listChanged;
  }
  if (SPEC.subscribe) {
    // The spec's resource, or the first the upstream lists.
    const uri = SPEC.subscribe.uri ?? firstUri;
    facts.subscribed = uri;
    await client.subscribeResource({ uri });
    await client.callTool({ name: SPEC.subscribe.tool, arguments: SPEC.subscribe.args });
    await until(() => updates.length > 0, 15000);
    facts.updates = updates.slice(0, 1);
    await client.unsubscribeResource({ uri });
  }
  if (transport.terminateSession) {
    await transport.terminateSession();
    facts.terminated = transport.sessionId === undefined;
    // The old session is gone: a request with it is a 404.
    const stale = httpTransport(TOKEN, facts.sessionId);
    facts.afterDelete = await rawStatus(stale);
  }
  await client.close();
}

/** Send one `ping` on a bare transport; the HTTP status it failed with, or 200. */
async function rawStatus(t) {
  await t.start();
  try {
    await t.send({ jsonrpc: "2.0", id: 1, method: "ping" });
    return 200;
  } catch (e) {
    return e?.code ?? String(e);
  } finally {
    await t.close();
  }
}

async function foreign() {
  const owner = httpTransport(TOKEN);
  const client = new Client({ name: "taskgate-legacy-ts", version: "0.0.0" }, { capabilities: {} });
  await client.connect(owner);
  facts.sessionId = owner.sessionId;
  facts.foreign = await rawStatus(httpTransport(TOKEN2, owner.sessionId));
  facts.owner = await rawStatus(httpTransport(TOKEN, owner.sessionId));
  await client.close();
}

try {
  if (SCENARIO === "all") await all(httpTransport(TOKEN));
  else if (SCENARIO === "remote") await all(remoteTransport());
  else if (SCENARIO === "foreign") await foreign();
  else throw new Error(`unknown scenario ${SCENARIO}`);
  console.log(JSON.stringify({ ok: true, ...facts }));
  process.exit(0);
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: String(e?.stack ?? e), ...facts }));
  process.exit(1);
}
