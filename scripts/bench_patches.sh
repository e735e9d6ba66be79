#!/usr/bin/env bash
# Benchmark: patch loading for training. Random 64x64x32 (x,y,z) float32 patches read from a
# cache built from a quarter of the MiniVess-like set (--part 0/4, spacing 0.99,0.99,5.0,
# uncompressed), four ways side by side in one run (examples/bench_patches.rs): the
# memory-mapped reader, the same reader decoding through zarrs, a plain zarrs
# retrieve_array_subset per patch, and reading the .nii.gz + cropping (a loader without a
# cache), beside a memcpy of the same bytes. Reports median patches/s and MB/s over rounds.
#
#   bash scripts/bench_patches.sh                  # MiniVess-like quarter (18 volumes)
#   BENCH_SMALL=1 bash scripts/bench_patches.sh    # smoke test: small preset, seconds
#
# Environment: PATCHES (per round, default 2000), NIFTI_PATCHES (default 8), ROUNDS (default 5),
# PATCH (z,y,x, default 32,64,64), CACHE_FLAGS (extra build-cache flags), KEEP_CACHE=1 (keep the
# ~0.9 GB cache in $BENCH_DIR/patches afterwards), and those of
# scripts/bench_common.sh (BENCH_DIR, PREP, PREP_ARGS). Appends one JSON line to
# $BENCH_DIR/results.jsonl.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

PATCHES="${PATCHES:-2000}"
NIFTI_PATCHES="${NIFTI_PATCHES:-8}"
ROUNDS="${ROUNDS:-5}"
PATCH="${PATCH:-32,64,64}"
CACHE_FLAGS="${CACHE_FLAGS:-}"
if [[ "$BENCH_SMALL" == 1 ]]; then
    PRESET="small"; PART="0/1"; SPACING="auto"
else
    PRESET="minivess"; PART="0/4"; SPACING="0.99,0.99,5.0"
fi

step "bench patches: preset $PRESET part $PART, patch $PATCH (z,y,x), nproc $(nproc), BENCH_DIR=$BENCH_DIR"
mkdir -p "$BENCH_DIR"
ensure_prep
step "cargo build --release --example bench_patches"
(cd "$REPO" && cargo build --release --quiet --example bench_patches) || die "cargo build failed"
BENCH="${CARGO_TARGET_DIR:-$REPO/target}/release/examples/bench_patches"

DATA="$BENCH_DIR/data/$PRESET"
synth_once "$PRESET" "$DATA"

CACHE="$BENCH_DIR/patches/cache"
step "building the cache ($CACHE)"
rm -rf "$CACHE"
mkdir -p "$(dirname "$CACHE")"
# shellcheck disable=SC2086
"$PREP" build-cache "$DATA" --cache-dir "$CACHE" --spacing "$SPACING" --part "$PART" \
    --compression none -q $CACHE_FLAGS $PREP_ARGS >/dev/null
info "$(du -sh "$CACHE/entries" | cut -f1) in $(find "$CACHE/entries" -type f | wc -l) files"

step "reading patches"
OUT="$("$BENCH" "$CACHE" --data "$DATA" --patch "$PATCH" --patches "$PATCHES" \
    --nifti-patches "$NIFTI_PATCHES" --rounds "$ROUNDS")"
echo "$OUT" | sed '$d'
JSON="$(echo "$OUT" | tail -n 1)"
echo "{\"bench\": \"patches\", \"preset\": \"$PRESET\", \"part\": \"$PART\", \"spacing\": \"$SPACING\", \"cache_flags\": \"$CACHE_FLAGS\", \"nproc\": $(nproc), \"time\": \"$(date -u +%FT%TZ)\", \"result\": $JSON}" \
    | tee -a "$BENCH_DIR/results.jsonl"
[[ "${KEEP_CACHE:-0}" == 1 ]] || rm -rf "$CACHE"
