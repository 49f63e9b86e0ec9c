#!/usr/bin/env bash
# Run the cargo-fuzz targets in fuzz/ one at a time, each for SECONDS (default 600),
# niced, then minimise its corpus in place. Only a stable toolchain is needed:
# RUSTC_BOOTSTRAP=1 lets it take the nightly-only sanitizer flags cargo-fuzz passes.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
# Install cargo-fuzz once with: cargo install cargo-fuzz --locked
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export RUSTC_BOOTSTRAP=1
secs=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi
cargo fuzz build -O
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== $t: ${secs}s"
    nice -n 10 cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 \
        2>&1 | tee "target/fuzz-$t.log" | grep -E '^(Done|stat::|==[0-9]+==ERROR|SUMMARY)' || true
    nice -n 10 cargo fuzz cmin -O "$t" "corpus/$t" >/dev/null 2>&1
    echo "   corpus: $(find "corpus/$t" -type f | wc -l) files, $(du -sh "corpus/$t" | cut -f1)"
done
