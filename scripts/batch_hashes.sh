#!/usr/bin/env bash
# Hashes of augmented batches (image, label, distance maps, skeleton) through the trainer's
# loader, for every augmentation mode, three patch shapes and each vector build this CPU runs
# (VOXCACHE_SIMD caps it): a refactor of the reader or the augmentation must leave every line
# the same. Prints one line per run: patch mode build hash.
#
#   bash scripts/batch_hashes.sh > before.txt; (change); bash scripts/batch_hashes.sh | diff before.txt -
#
# Data: the MiniVess outlier (prep synth --preset outlier) at 4x4x4 um with distance maps and
# skeletons. Environment: BENCH_DIR (bench-out/hashes), BIN (folder of prep and
# examples/bench_augment; default target/release, built), BATCHES (8), BENCH_SMALL=1 (smoke
# test: the bundled small preset at its own spacing, one patch, this CPU's best build, 1 batch;
# its hashes are not comparable with a full run's).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/hashes}"
if [ -z "${BIN:-}" ]; then
    BIN="$ROOT/target/release"
    (cd "$ROOT" && cargo build --release --quiet --bin prep --example bench_augment)
fi
if [ "${BENCH_SMALL:-0}" = 1 ]; then
    PRESET=small SPACING=auto BUILDS=avx512 PATCHES=32,96,96 BATCHES="${BATCHES:-1}"
else
    PRESET=outlier SPACING=4,4,4 BUILDS="avx512 avx2 portable" PATCHES="32,96,96 16,128,128 40,72,56"
    BATCHES="${BATCHES:-8}"
fi
mkdir -p "$B"
[ -d "$B/data/imagesTr" ] || "$BIN/prep" synth --preset "$PRESET" --out "$B/data" >/dev/null
[ -f "$B/cache/manifest.json" ] || "$BIN/prep" build-cache "$B/data" --cache-dir "$B/cache" >&2 \
    --spacing "$SPACING" --derived distance,skeleton --quiet
for build in $BUILDS; do
    for patch in $PATCHES; do
        for mode in default all crop spatial scale intensity mix-intensity none; do
            h=$(VOXCACHE_SIMD=$build BATCH_HASH=1 "$BIN/examples/bench_augment" "$B/cache" "$patch" \
                "$BATCHES" "$mode" derived | sed -n 's/.*"hash":"\([0-9a-f]*\)".*/\1/p')
            [ -n "$h" ] || { echo "batch_hashes: no hash from bench_augment ($patch $mode $build)" >&2; exit 1; }
            echo "$patch $mode $build $h"
        done
    done
done
