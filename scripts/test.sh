#!/usr/bin/env bash
# The whole test suite, from a clean clone: installs the test peers (Node 22, the MCP
# conformance suite, server-everything, the TypeScript SDK client, pinned Python SDKs)
# into .peers/, builds once in release mode, checks formatting and lints, starts a
# throwaway PostgreSQL (scripts/pg.sh), then runs every test against the real binary;
# the hot paths' instruction counts are checked against their baseline on the way.
# Everything builds with the `edge` feature (`taskgate edge`, pingora) and with
# `external-tests` (the tests that need PostgreSQL or the peers, which plain `cargo test`
# leaves out: Cargo.toml): the same feature set in every cargo call below, so nothing is
# built twice and nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

# pingora's zlib-ng (libz-ng-sys) builds with cmake. Installed only when missing
# (apt-get install, about 13 s here).
if ! command -v cmake >/dev/null 2>&1; then
    echo "== installing cmake (pingora's libz-ng-sys builds with it)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake >/dev/null
fi
# valgrind counts the hot paths' instructions (benches/hotpath/run.sh, below).
if ! command -v valgrind >/dev/null 2>&1; then
    echo "== installing valgrind (the hot-path instruction counts)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
# promtool and prometheus check the alert rules and fire one alert end to end
# (tests/alerts.rs). Debian's package may try to start its service; the test runs its
# own server on a free port and a temporary directory, so that does not matter.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    echo "== installing prometheus (promtool and a server for tests/alerts.rs)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
# PgBouncer in transaction mode in front of the test cluster (tests/pooler.rs, README
# "Behind a connection pooler"); each test starts its own on a free port.
if [ ! -x /usr/sbin/pgbouncer ]; then
    echo "== installing pgbouncer (tests/pooler.rs)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
fi
FEATURES=(--features edge,external-tests)

echo "== installing test peers into .peers/"
bash scripts/install-peers.sh "$PWD"

# Runs one cargo step quietly: its last three lines when it passes. When it fails,
# its last lines, then its diagnostics and the disk's free space, printed last so that
# a CI log cut to its tail still says why (a full disk makes rustc exit 101 with only
# "LLVM ERROR: IO failure on output stream", which three lines of cargo never show).
cargo_step() {
    local log rc=0
    log=$(mktemp)
    "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -n 40 "$log" | cut -c1-400
        echo "== failed (exit $rc): $*"
        grep -E '^error|LLVM ERROR|panicked|No space left|Killed|signal:' "$log" | cut -c1-400 | tail -n 30
        df -h . | tail -n 1
        rm -f "$log"
        return "$rc"
    fi
    tail -n 3 "$log"
    rm -f "$log"
}

echo "== build (release, once; tests drive this build)"
# The edge feature adds the pingora crates: about 200 s of CPU (1.7 min of wall on 2
# cores) in a 13-minute cold release build (README "The two commands").
cargo_step cargo build --release --all-targets --locked "${FEATURES[@]}"
echo "target/ holds $(du -sh target | cut -f1); $(df -h . | awk 'NR == 2 {print $4}') free on its disk"

echo "== the previous release's binary (mixed-version tests, docs/design.md §27)"
# Built once with this build's dependencies and cached in target/ (scripts/prev-release.sh).
TASKGATE_PREV_BIN=$(bash scripts/prev-release.sh)
export TASKGATE_PREV_BIN

echo "== format and lints"
cargo fmt --all -- --check
cargo_step cargo clippy --release --all-targets --locked "${FEATURES[@]}" -- -D warnings
# The lean build (no pingora) stays lint-clean too.
cargo_step cargo clippy --release --lib --bins --locked -- -D warnings
# The library as the cargo-fuzz crate (fuzz/) builds it. The fuzz crate itself is not
# built here: it is one-line wrappers around this feature's functions, and building it
# means libFuzzer's C++ plus a second pass over the dependency tree (minutes, not
# seconds). README "Fuzzing" says how to run it.
cargo_step cargo clippy --release --lib --features fuzzing --locked -- -D warnings
# Rustdoc: broken intra-doc links and other doc warnings fail the run.
RUSTDOCFLAGS="-D warnings" cargo_step cargo doc --no-deps --locked "${FEATURES[@]}"

echo "== hot-path instruction counts against benches/hotpath/baseline.txt"
# Deterministic counts under callgrind, not timings (about 70 s); run while the machine
# is otherwise idle. A rise past the tolerance fails the run after the tests.
hot_rc=0
hot_log=$(mktemp)
bash benches/hotpath/run.sh 2>&1 | tee "$hot_log" || hot_rc=$?

echo "== PostgreSQL for the store tests (scripts/pg.sh; stopped on exit)"
# shellcheck source=scripts/pg.sh
source scripts/pg.sh
pg_start

echo "== tests"
export PATH="$PWD/.peers/node22/node_modules/.bin:$PATH"
if cargo nextest --version >/dev/null 2>&1; then
    run_tests() { cargo nextest run --release --locked "${FEATURES[@]}" --no-fail-fast --failure-output final "$@"; }
else
    run_tests() { cargo test --release --locked "${FEATURES[@]}" --no-fail-fast "$@"; }
fi
# The gateway's task tests once more with the PostgreSQL backend (the contract suite,
# tests/store_postgres.rs and the crash loop run on it in the main pass too). First, so
# the main pass's summary line ends the output; a failure here still fails the script.
echo "== tasks_lifecycle on the PostgreSQL store"
pg_t0=$(date +%s)
pg_rc=0
TASKGATE_TEST_STORE=postgres run_tests --test tasks_lifecycle || pg_rc=$?
echo "== PostgreSQL pass: $(($(date +%s) - pg_t0)) s, exit $pg_rc"

echo "== all tests"
main_rc=0
run_tests || main_rc=$?
if [ "$pg_rc" != 0 ]; then
    echo "FAILED: the tasks_lifecycle pass on PostgreSQL (exit $pg_rc, above)"
fi
if [ "$hot_rc" != 0 ]; then
    # Which path and by how much, where the end of a long log still shows it.
    grep -E '^(FAILED|== [a-z]+: [-+])' "$hot_log" || true
    echo "FAILED: a hot path got more expensive (benches/hotpath/run.sh, above)"
fi
if [ "$main_rc" != 0 ]; then exit "$main_rc"; fi
if [ "$pg_rc" != 0 ]; then exit "$pg_rc"; fi
exit "$hot_rc"
