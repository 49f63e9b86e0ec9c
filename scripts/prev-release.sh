#!/usr/bin/env bash
# The previous release's gateway binary, for the mixed-version tests (docs/design.md §27
# "Mixed versions", README "Upgrading"): release N−1 and this one serve one PostgreSQL
# schema at once in tests/edge.rs.
#
# `bash scripts/prev-release.sh` prints the binary's path, building it first if it is
# not cached. The previous release is PREV_RELEASE below: the commit before this
# release's first schema migration. Its tree comes from git (`git archive`, so the
# clone needs that commit's history) into target/prev-release/<commit>/src, and builds
# with this tree's target directory and feature set: the dependencies are this build's,
# so only the old crate compiles (a few minutes cold; nothing once cached in target/).
# One test target is named so cargo resolves features as the main build does (with
# dev-dependencies), which is what lets it reuse those dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

# Bump to the last commit before a new release's first migration, once per release.
PREV_RELEASE=be78584185fd94a98d1122234e21bf2402b0e797

out="$PWD/target/prev-release/$PREV_RELEASE"
bin="$out/taskgate"
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi
if ! git cat-file -e "$PREV_RELEASE^{commit}" 2>/dev/null; then
    echo "prev-release: commit $PREV_RELEASE is not in this clone; fetch the full history (git fetch --unshallow)" >&2
    exit 1
fi
src="$out/src"
rm -rf "$src"
mkdir -p "$src"
git archive "$PREV_RELEASE" | tar -x -C "$src"
# Cargo names a local package's build outputs after its name and version, not its
# path: under the same name and version the old crate's outputs would overwrite this
# tree's in target/ (and this tree would rebuild from scratch). A version of its own,
# in Cargo.toml and Cargo.lock alike, keeps them apart.
python3 - "$src" <<'PY'
import pathlib, re, sys
src = pathlib.Path(sys.argv[1])
for name, pattern in (
    ("Cargo.toml", r'(\[package\]\nname = "taskgate"\nversion = ")([^"]+)(")'),
    ("Cargo.lock", r'(\[\[package\]\]\nname = "taskgate"\nversion = ")([^"]+)(")'),
):
    path = src / name
    text, n = re.subn(pattern, r"\g<1>\g<2>-prev\g<3>", path.read_text(), count=1)
    if n != 1:
        sys.exit(f"prev-release: no taskgate version in {path}")
    path.write_text(text)
PY
echo "== building the previous release ($PREV_RELEASE) into $out" >&2
t0=$(date +%s)
# The old build writes its binary where this tree's goes: keep this tree's aside.
current="target/release/taskgate"
if [ -e "$current" ]; then
    cp -p "$current" "$out/current.bak"
fi
(
    cd "$src"
    CARGO_TARGET_DIR="$OLDPWD/target" cargo build --release --locked \
        --features edge,external-tests --bin taskgate --test docs_refs >&2
)
cp "$current" "$bin.tmp"
mv "$bin.tmp" "$bin"
if [ -e "$out/current.bak" ]; then
    mv "$out/current.bak" "$current"
fi
rm -rf "$src"
echo "== previous release built in $(($(date +%s) - t0)) s" >&2
echo "$bin"
