#!/usr/bin/env bash
# Runs the micro-benchmarks and the load harness and writes one Markdown report.
#
#   bash benches/run.sh [OUT.md] [extra load-harness args, e.g. --scale 100000]
#
# Peers are installed into .peers/ first (outside the measured time; cargo install of
# mcp-proxy 0.6.0 takes ~8 min cold on 2 cores and is skipped when present). The runs
# themselves take ~5-8 minutes on 2 cores. Loopback only; every load point is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benches/last-run.md}"
shift || true

PEERS="$PWD/.peers"
MCP_PROXY="$PEERS/mcp-proxy/bin/mcp-proxy"
if [ ! -x "$MCP_PROXY" ]; then
    echo "== installing mcp-proxy 0.6.0 into .peers/mcp-proxy (one-time)"
    mkdir -p "$PEERS"
    cargo install mcp-proxy --version 0.6.0 --locked --root "$PEERS/mcp-proxy" \
        >"$PEERS/mcp-proxy-install.log" 2>&1 \
        || echo "   mcp-proxy install failed (see .peers/mcp-proxy-install.log); its rows will say so"
fi

echo "== peers for the native reference rows (.peers/venv-fastmcp; idempotent)"
bash scripts/install-peers.sh "$PWD" >"$PEERS/install-peers.log" 2>&1 \
    || echo "   install-peers failed (see .peers/install-peers.log); the native rows will say so"

# One feature set for every step (the edge's rows need `taskgate edge`), so nothing is
# built twice; the same as scripts/test.sh's (`external-tests` changes no code outside
# tests), so a run after the tests builds nothing either.
FEATURES=(--features edge,external-tests)
echo "== build (release, ${FEATURES[*]})"
cargo build --release --all-targets --locked "${FEATURES[@]}" 2>&1 | tail -n 1

START=$(date +%s)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== micro-benchmarks (divan)"
cargo bench --locked "${FEATURES[@]}" --bench micro 2>/dev/null | tee "$TMP/micro.txt"

echo "== load harness (under a throwaway PostgreSQL for the store and replica rows)"
bash scripts/pg.sh run cargo bench --locked "${FEATURES[@]}" --bench load -- --out "$TMP/load.md" \
    --mcp-proxy "$MCP_PROXY" "$@" >/dev/null

echo "== store backends (sled next to a throwaway PostgreSQL; scripts/pg.sh)"
bash scripts/pg.sh run cargo bench --locked "${FEATURES[@]}" --bench store_backends 2>/dev/null \
    | grep '^|' >"$TMP/stores.md" \
    || echo "| store backends | failed: see \`bash scripts/pg.sh run cargo bench --bench store_backends\` | |" >"$TMP/stores.md"

END=$(date +%s)
{
    echo "## Run of $(date -u '+%Y-%m-%d %H:%M UTC') ($(git rev-parse --short HEAD))"
    echo
    echo "Machine: \`nproc\` = $(nproc); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//');"
    echo "memory (\`free -h\`): $(free -h | awk '/^Mem:/ {print "total " $2 ", used " $3 ", available " $7}');"
    echo "kernel $(uname -r); rustc $(rustc --version | cut -d' ' -f2). Shared, noisy machine:"
    echo "compare rows of the same run, not absolute numbers across runs."
    echo
    echo "### Micro-benchmarks (divan; median is the figure to read)"
    echo
    echo '```'
    sed -n '/^micro /,$p' "$TMP/micro.txt"
    echo '```'
    cat "$TMP/load.md"
    echo
    echo "### Store backends at the TaskStore level (benches/store_backends.rs)"
    echo
    cat "$TMP/stores.md"
    echo
    echo "Benchmark wall time (micro + load + stores, excluding build and installs): $((END - START)) s."
} >"$OUT"
echo "== report written to $OUT"
