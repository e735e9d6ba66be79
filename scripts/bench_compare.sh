#!/usr/bin/env bash
# End to end, two builds side by side, alternating: `train --benchmark` on the bundled cache (the
# default pipeline, and a 32x64x64 patch with 16 base channels), and `predict` of the 10 bundled
# images with one model (trained 20 steps by the first build). Medians by eye over ROUNDS.
# For a refactor: build the old commit in a git worktree (cargo build --release --bin prep
# --bin train --bin predict), then
#
#   bash scripts/bench_compare.sh OLD/target/release target/release [ROUNDS]
#
# Environment: BENCH_DIR (bench-out/compare), BENCH_SMALL=1 (smoke test: 2 training and
# benchmark steps, no validation, the second benchmark at 16x32x32 with 8 base channels, one
# small image predicted).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD=$(realpath "$1"); NEW=$(realpath "$2"); ROUNDS=${3:-3}
W="${BENCH_DIR:-$ROOT/bench-out/compare}"; rm -rf "$W"; mkdir -p "$W"
cd "$ROOT"
if [ "${BENCH_SMALL:-0}" = 1 ]; then
    TRAIN="--steps 2 --val-fraction 0" BENCH_A=2 BENCH_B=2 PATCH_B=16,32,32 BASE_B=8
    IMAGES=data/vessels/imagesTr/vessels_002_0000.nii.gz
else
    TRAIN="--steps 20" BENCH_A=20 BENCH_B=10 PATCH_B=32,64,64 BASE_B=16 IMAGES=data/vessels/imagesTr
fi
bin() { if [ "$1" = old ]; then echo "$OLD"; else echo "$NEW"; fi; }
step_s() { grep -o 'step time *[0-9.]* s median' | grep -o '[0-9.]* s'; }
for v in old new; do "$(bin $v)/prep" build-cache data/vessels --cache-dir "$W/cache-$v" --quiet >/dev/null; done
# shellcheck disable=SC2086 # the flags are words
"$OLD/train" --cache-dir "$W/cache-old" --out "$W/run" $TRAIN --no-progress >/dev/null
for r in $(seq "$ROUNDS"); do
    for v in old new; do
        B=$(bin $v)
        a=$("$B/train" --cache-dir "$W/cache-$v" --benchmark "$BENCH_A" --no-progress 2>&1 | step_s)
        b=$("$B/train" --cache-dir "$W/cache-$v" --benchmark "$BENCH_B" --patch "$PATCH_B" --base-channels "$BASE_B" --no-progress 2>&1 | step_s)
        rm -rf "$W/pred-$v"
        t0=$(date +%s.%N)
        "$B/predict" --model "$W/run" "$IMAGES" --out "$W/pred-$v" >/dev/null 2>&1
        t1=$(date +%s.%N)
        echo "round $r $v: train --benchmark default $a, ${PATCH_B//,/x}/$BASE_B $b; predict $(awk "BEGIN { print $t1 - $t0 }") s"
    done
done
