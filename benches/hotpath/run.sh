#!/usr/bin/env bash
# Instructions per request on the four hot paths, counted by callgrind: deterministic,
# so CI can guard them where it must never time anything (benches/RESULTS.md "Hot-path
# instruction counts").
#
#   bash benches/hotpath/run.sh            # count, compare with baseline.txt, fail on a rise
#   bash benches/hotpath/run.sh --write    # count and write baseline.txt (a deliberate commit)
#   bash benches/hotpath/run.sh --profile  # also keep callgrind's files for callgrind_annotate
#
# Paths: `get` = a `tasks/get` of a completed task, polled again and again; `spread` =
# `tasks/get` over 1,000 completed tasks of 100 principals in 10 tenants, each read
# twice (its first read marks it read), seeded by the same binary running natively
# first; `echo` = an inline `tools/call echo`
# (demo upstream over HTTP); `task` = a promoted task from creation to terminal (the
# creation request, the background call and driver, one poll once completed);
# `status` = a plain client's `taskgate_task_status` of a completed task, polled again
# and again (docs/design.md §28: the handle's `tasks/get`, to set beside `get`).
#
# What is counted: only the request path. The gateway runs under callgrind with
# collection off, switched on inside the futures that carry a request — the front's
# connection tasks, the spawned upstream call, the task driver and the upstream HTTP
# client's background futures (its connections: src/upstream/http/executor.rs) — so
# start-up, timers, the sweeper, the log writer thread and sled's own flusher threads
# are not counted. Each count is Ir over the run / requests.
set -euo pipefail
# A failure inside `$(count …)` must stop the run too.
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
MODE="${1:-check}"
# Another build (an older commit, for a bisect) with TASKGATE_HOTPATH_BIN.
BIN="${TASKGATE_HOTPATH_BIN:-$PWD/target/release/taskgate}"
BASELINE="benches/hotpath/baseline.txt"
# A rise above this fails, per path: about three times the spread of repeated counts
# of one build (benches/RESULTS.md: ±0.6 % get, ±0.7 % spread since jemalloc, whose
# arenas depend on which worker frees what, ±1.1 % echo, whose upstream connection
# pool depends on timing, ±0.6 % task), and never below 2 %.
declare -A TOLERANCE_PCT=([get]=2 [spread]=3 [echo]=3 [task]=2 [status]=3)
# `spread` polls SPREAD_TASKS seeded tasks twice each.
SPREAD_TASKS=1000
declare -A REQUESTS=([get]=2000 [spread]=$((2 * SPREAD_TASKS)) [echo]=1000 [task]=300 [status]=2000)
# TASKGATE_HOTPATH_SCALE=K multiplies every request count (a difference of two scales
# cancels start-up in TASKGATE_HOTPATH_COUNT=process).
for p in "${!REQUESTS[@]}"; do REQUESTS[$p]=$((REQUESTS[$p] * ${TASKGATE_HOTPATH_SCALE:-1})); done
# TASKGATE_HOTPATH_PATHS="spread echo" counts only those (a bisect, a repeat).
read -r -a PATHS <<<"${TASKGATE_HOTPATH_PATHS:-get spread echo task status}"

command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
[ -x "$BIN" ] || { echo "$BIN is missing: cargo build --release first" >&2; exit 2; }

WORK=$(mktemp -d /tmp/taskgate-hotpath.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "$MODE" != "--profile" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The futures that carry a request (none runs inside another: collection toggles on
# each entry and exit). TASKGATE_HOTPATH_COUNT=tasks counts every task the runtime's
# workers run instead (background loops included): the only choice that reads the same
# across builds whose futures have other names, for comparing an older commit.
# TASKGATE_HOTPATH_COUNT=process counts the whole process, start-up and every thread
# included (for a difference of two request counts). A function's symbol names the
# file that defines it (`tasks::driver::drive`), not where `tasks` re-exports it.
COLLECT=(--collect-atstart=no)
if [ "${TASKGATE_HOTPATH_COUNT:-request}" = tasks ]; then
    TOGGLES=("--toggle-collect=tokio::runtime::scheduler::multi_thread::worker::Context::run_task")
elif [ "${TASKGATE_HOTPATH_COUNT:-request}" = process ]; then
    TOGGLES=()
    COLLECT=(--collect-atstart=yes)
else
TOGGLES=(
    "--toggle-collect=<tokio_util::task::task_tracker::TrackedFuture<F> as core::future::future::Future>::poll"
    "--toggle-collect=taskgate::tasks::call::start_call::{{closure}}"
    "--toggle-collect=taskgate::tasks::driver::drive::{{closure}}"
    "--toggle-collect=taskgate::front::task_tools::status::StatusCall::run::{{closure}}"
    "--toggle-collect=<taskgate::upstream::http::executor::ConnectionTask<F> as core::future::future::Future>::poll"
)
fi

# wait_ready PORT LOG: until /readyz answers 200 (the upstream answered its initialize,
# so the first call does not wait).
wait_ready() {
    for _ in $(seq 1 240); do
        if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/readyz', timeout=2)" 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    echo "the gateway never got ready:" >&2
    tail -20 "$2" >&2
    exit 1
}

# TASKGATE_HOTPATH_CACHE=1 also simulates the caches and prints, per request, the
# events callgrind counts (Ir, then I1/LL instruction misses, data reads and their
# D1/LL misses, data writes and theirs) to stderr: what instruction counts cannot show.
CACHE_SIM=()
if [ -n "${TASKGATE_HOTPATH_CACHE:-}" ]; then CACHE_SIM=(--cache-sim=yes); fi

# count PATH: prints the instructions per request of PATH.
count() {
    local path=$1 n=${REQUESTS[$1]} dir="$WORK/$1"
    mkdir -p "$dir"
    local dport gport
    dport=$(free_port)
    "$BIN" demo-upstream --http "127.0.0.1:$dport" 2>"$dir/demo.log" &
    local demo=$!
    PIDS+=("$demo")
    gport=$(free_port)
    cat >"$dir/taskgate.toml" <<EOF
[server]
listen = "127.0.0.1:$gport"
[store]
path = "$dir/data"
[auth]
mode = "jwt"
algorithms = ["HS256"]
hs256_secret = "hotpath-secret-0123456789abcdef0123456789abcdef"
issuer = "https://issuer.hotpath"
audience = "taskgate-hotpath"
[tasks]
poll_interval_ms = 1
max_poll_interval_ms = 1
[limits]
poll_burst = 1000000
[[upstream]]
name = "demo"
path = "/mcp"
url = "http://127.0.0.1:$dport/mcp"
[upstream.tools.sleep]
promote_after_ms = 0
EOF
    if [ "$path" = status ]; then
        # Only this path's endpoint offers handles: the others' stay as they were.
        echo 'plain_clients = "handle"' >>"$dir/taskgate.toml"
    fi
    local token gw
    token=$("$BIN" token --sub alice --tenant acme --config "$dir/taskgate.toml")
    if [ "$path" = spread ]; then
        # Seed natively, stop, then count on the same store.
        "$BIN" --config "$dir/taskgate.toml" 2>"$dir/seed.log" &
        gw=$!
        PIDS+=("$gw")
        wait_ready "$gport" "$dir/seed.log"
        python3 benches/hotpath/drive.py "$gport" \
            "hotpath-secret-0123456789abcdef0123456789abcdef" seed "$SPREAD_TASKS" "$dir/ids"
        kill -TERM "$gw"
        wait "$gw" || true
    fi
    TASKGATE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
        "${COLLECT[@]}" "${TOGGLES[@]}" "${CACHE_SIM[@]}" \
        "$BIN" --config "$dir/taskgate.toml" 2>"$dir/gateway.log" &
    gw=$!
    PIDS+=("$gw")
    wait_ready "$gport" "$dir/gateway.log"
    if ! python3 benches/hotpath/drive.py "$gport" "$token" "$path" "$n" "$dir/ids"; then
        # The work directory goes with the run: say what the gateway (and valgrind) said.
        echo "driving $path failed; the gateway's log (valgrind's report included):" >&2
        tail -n 40 "$dir/gateway.log" >&2
        exit 1
    fi
    kill -TERM "$gw"
    wait "$gw" || true
    kill "$demo" 2>/dev/null || true
    local total
    total=$(callgrind_annotate "$dir/callgrind.out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !seen {gsub(",", "", $1); print $1; seen = 1}')
    if [ -z "$total" ]; then
        echo "no callgrind totals for $path" >&2
        exit 1
    fi
    if [ -n "${TASKGATE_HOTPATH_CACHE:-}" ]; then
        callgrind_annotate "$dir/callgrind.out" 2>/dev/null |
            awk -v n="$n" -v p="$path" '/PROGRAM TOTALS/ && !seen {
                seen = 1; line = p ":"
                for (i = 1; i <= NF && $i !~ /PROGRAM/; i++) {
                    if ($i ~ /^\(/) continue
                    v = $i; gsub(",", "", v); line = line " " int(v / n)
                }
                print line > "/dev/stderr"
            }'
    fi
    echo $((total / n))
}

declare -A NOW
for p in "${PATHS[@]}"; do
    NOW[$p]=$(count "$p")
    echo "== $p: ${NOW[$p]} instructions per request (${REQUESTS[$p]} requests)"
done

if [ "$MODE" = "--write" ]; then
    {
        echo "# Instructions per request on the hot paths (benches/hotpath/run.sh --write)."
        echo "# Lower it deliberately, in its own commit, after a measured improvement."
        for p in "${PATHS[@]}"; do echo "$p ${NOW[$p]}"; done
    } >"$BASELINE"
    echo "== wrote $BASELINE"
    exit 0
fi
if [ "$MODE" = "--profile" ]; then
    echo "== callgrind files under $WORK (callgrind_annotate FILE)"
fi

rc=0
for p in "${PATHS[@]}"; do
    base=$(awk -v p="$p" '$1 == p {print $2}' "$BASELINE")
    if [ -z "$base" ]; then
        echo "FAILED: $BASELINE has no count for $p"
        rc=1
        continue
    fi
    change=$(python3 -c "print(f'{(${NOW[$p]} - $base) * 100 / $base:+.2f}')")
    tol=${TOLERANCE_PCT[$p]}
    if python3 -c "import sys; sys.exit(0 if ${NOW[$p]} > $base * (1 + $tol / 100) else 1)"; then
        echo "FAILED: hot path $p costs ${NOW[$p]} instructions per request, $change % against the baseline $base (tolerance $tol %)"
        rc=1
    else
        echo "== $p: $change % against the baseline $base (tolerance +$tol %)"
    fi
done
exit $rc
