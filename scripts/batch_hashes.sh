#!/usr/bin/env bash
# Hashes of augmented batches (image, label, distance maps, skeleton) through the trainer's
# loader, for every augmentation mode, three patch shapes and each vector build this CPU runs
# (VOXCACHE_SIMD caps it): a refactor of the reader or the augmentation must leave every line
# the same. Prints one line per run: patch mode build hash.
#
#   bash scripts/batch_hashes.sh > before.txt; (change); bash scripts/batch_hashes.sh | diff before.txt -
#
# Data: the MiniVess outlier (prep synth --preset outlier) at 4x4x4 um with distance maps and
# skeletons. Environment: BENCH_DIR (bench-out/hashes), BIN (target/release), BATCHES (8).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/hashes}"
BIN="${BIN:-$ROOT/target/release}"
BATCHES="${BATCHES:-8}"
(cd "$ROOT" && cargo build --release --quiet --bin prep --example bench_augment)
mkdir -p "$B"
[ -d "$B/data/imagesTr" ] || "$BIN/prep" synth --preset outlier --out "$B/data" >/dev/null
[ -f "$B/cache/manifest.json" ] || "$BIN/prep" build-cache "$B/data" --cache-dir "$B/cache" >&2 \
    --spacing 4,4,4 --derived distance,skeleton --quiet
for build in avx512 avx2 portable; do
    for patch in 32,96,96 16,128,128 40,72,56; do
        for mode in default all crop spatial scale intensity mix-intensity none; do
            h=$(VOXCACHE_SIMD=$build BATCH_HASH=1 "$BIN/examples/bench_augment" "$B/cache" "$patch" \
                "$BATCHES" "$mode" derived | sed -n 's/.*"hash":"\([0-9a-f]*\)".*/\1/p')
            echo "$patch $mode $build $h"
        done
    done
done
