#!/usr/bin/env bash
# End to end, two builds side by side, alternating: `train --benchmark` on the bundled cache (the
# default pipeline, and a 32x64x64 patch with 16 base channels), and `predict` of the 10 bundled
# images with one model (trained 20 steps by the first build). Medians by eye over ROUNDS.
# For a refactor: build the old commit in a git worktree (cargo build --release --bin prep
# --bin train --bin predict), then
#
#   bash scripts/bench_compare.sh OLD/target/release target/release [ROUNDS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD=$(realpath "$1"); NEW=$(realpath "$2"); ROUNDS=${3:-3}
W="${BENCH_DIR:-$ROOT/bench-out/compare}"; rm -rf "$W"; mkdir -p "$W"
cd "$ROOT"
bin() { if [ "$1" = old ]; then echo "$OLD"; else echo "$NEW"; fi; }
step_s() { grep -o 'step time *[0-9.]* s median' | grep -o '[0-9.]* s'; }
for v in old new; do "$(bin $v)/prep" build-cache data/vessels --cache-dir "$W/cache-$v" --quiet >/dev/null; done
"$OLD/train" --cache-dir "$W/cache-old" --out "$W/run" --steps 20 --no-progress >/dev/null
for r in $(seq "$ROUNDS"); do
    for v in old new; do
        B=$(bin $v)
        a=$("$B/train" --cache-dir "$W/cache-$v" --benchmark 20 --no-progress 2>&1 | step_s)
        b=$("$B/train" --cache-dir "$W/cache-$v" --benchmark 10 --patch 32,64,64 --base-channels 16 --no-progress 2>&1 | step_s)
        rm -rf "$W/pred-$v"
        t0=$(date +%s.%N)
        "$B/predict" --model "$W/run" data/vessels/imagesTr --out "$W/pred-$v" >/dev/null 2>&1
        t1=$(date +%s.%N)
        echo "round $r $v: train --benchmark default $a, 32x64x64/16 $b; predict $(echo "$t1 - $t0" | bc) s"
    done
done
