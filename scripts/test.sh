#!/usr/bin/env bash
# The whole test suite, from a clean clone: installs the test peers (Node 22, the MCP
# conformance suite, server-everything, the TypeScript SDK client, pinned Python SDKs)
# into .peers/, builds once in release mode, checks formatting and lints, then runs every
# test against the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== installing test peers into .peers/"
bash scripts/install-peers.sh "$PWD"

echo "== build (release, once; tests drive this build)"
cargo build --release --all-targets --locked 2>&1 | tail -n 3

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --release --all-targets --locked -- -D warnings 2>&1 | tail -n 3
# The library as the cargo-fuzz crate (fuzz/) builds it. The fuzz crate itself is not
# built here: it is one-line wrappers around this feature's functions, and building it
# means libFuzzer's C++ plus a second pass over the dependency tree (minutes, not
# seconds). README "Fuzzing" says how to run it.
cargo clippy --release --lib --features fuzzing --locked -- -D warnings 2>&1 | tail -n 3
# Rustdoc: broken intra-doc links and other doc warnings fail the run (pipefail keeps
# cargo's exit status through `tail`).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked 2>&1 | tail -n 3

echo "== tests"
export PATH="$PWD/.peers/node22/node_modules/.bin:$PATH"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --release --locked --no-fail-fast --failure-output final
else
    cargo test --release --locked --no-fail-fast
fi
