#!/usr/bin/env bash
# Counts the ad-hoc JSON lookups of the gateway: `.get("literal")` (the literal may
# start on the next line) in the non-test Rust files of src/, outside src/protocol
# (where wire shapes are parsed into types) and src/demo (the bundled legacy server).
# Test code is left out: a file that its parent declares under a `#[cfg(...test...)]`
# attribute, and an inline `#[cfg(...test...)] mod … {` block (from there to the end
# of its file, where this crate keeps them). tests/layering.rs runs this script and
# fails above its ceiling (ARCHITECTURE.md "One request path").
#
#   bash scripts/count-lookups.sh          the total
#   bash scripts/count-lookups.sh -v       one line per file, then the total
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

verbose = "-v" in sys.argv[1:]
test_attr = re.compile(r'#\[cfg\([^\]]*\btest\b[^\]]*\)\]')
mod_decl = re.compile(r'^\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*;', re.M)

def test_only_files():
    """Files their parent module declares under a test cfg (`#[cfg(test)] mod x;`)."""
    out = set()
    for dp, _, fns in os.walk("src"):
        for fn in fns:
            if not fn.endswith(".rs"):
                continue
            path = os.path.join(dp, fn)
            lines = open(path, encoding="utf-8").read().split("\n")
            base = dp if fn in ("mod.rs", "lib.rs", "main.rs") else os.path.join(dp, fn[:-3])
            for i, line in enumerate(lines):
                m = mod_decl.match(line)
                if not m:
                    continue
                j, gated = i - 1, False
                while j >= 0 and lines[j].strip().startswith(("#[", "///", "//")):
                    gated |= bool(test_attr.search(lines[j]))
                    j -= 1
                if gated:
                    name = m.group(1)
                    for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name)):
                        out.add(os.path.normpath(cand))
    return out

skip = test_only_files()
inline_tests = re.compile(r'^[ \t]*#\[cfg\([^\]]*\btest\b[^\]]*\)\]\s*\n[ \t]*(?:pub(?:\([\w:]+\))?\s+)?mod\s+\w+\s*\{', re.M)
lookup = re.compile(r'\.get\(\s*"')
total, per = 0, []
for dp, _, fns in sorted(os.walk("src")):
    for fn in sorted(fns):
        path = os.path.normpath(os.path.join(dp, fn))
        if not fn.endswith(".rs") or path.startswith(("src/protocol/", "src/demo/")):
            continue
        if path in skip or any(path.startswith(s + "/") for s in skip):
            continue
        text = open(path, encoding="utf-8").read()
        m = inline_tests.search(text)
        if m:
            text = text[: m.start()]
        n = len(lookup.findall(text))
        if n:
            per.append((n, path))
            total += n
if verbose:
    for n, path in sorted(per, key=lambda x: (-x[0], x[1])):
        print(f"{n:4} {path}")
print(total)
PY
