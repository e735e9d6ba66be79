#!/usr/bin/env bash
# Benchmark: the MiniVess in-plane outlier (one 512x512x61 case at 4.97x4.97x5.0 um) resampled
# to 1x1x1 um (2545x2545x305 voxels, ~7.9 GB float32 image + ~2 GB label), by
# `prep build-cache` (out of core, chunk by chunk) and by the whole-volume SimpleITK reference
# (scripts/sitk_reference.py), interleaved in one run. Reports median wall time and peak RSS
# (/usr/bin/time -v), output bytes and output voxels/s, and the prep / reference ratios.
#
#   bash scripts/bench_outlier.sh                  # full size, REPEAT=3 (~10 GB written per run)
#   BENCH_SMALL=1 bash scripts/bench_outlier.sh    # smoke test: small preset, seconds
#
# Environment: REPEAT (default 3), BENCH_MIN_FREE_GB (default 25), and those listed in
# scripts/bench_common.sh (BENCH_DIR, PREP, PYTHON, SITK_FORMAT, SITK_ARGS, PREP_ARGS, BENCH_COLD).
# Each run appends one JSON line to $BENCH_DIR/results.jsonl.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

REPEAT="${REPEAT:-3}"
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive whole number (got '$REPEAT')"

if [[ "$BENCH_SMALL" == 1 ]]; then
    NAME="outlier-small"
    PRESET="small"
    SPACING="1,1,1"
    EXPECT=""  # ten different cases; only the tools' agreement is checked
    MIN_FREE_GB="${BENCH_MIN_FREE_GB:-1}"
else
    NAME="outlier"
    PRESET="outlier"
    SPACING="1,1,1"
    EXPECT="2545,2545,305"
    MIN_FREE_GB="${BENCH_MIN_FREE_GB:-25}"
fi

step "bench $NAME: preset $PRESET at spacing $SPACING, REPEAT=$REPEAT, nproc $(nproc), BENCH_DIR=$BENCH_DIR"
mkdir -p "$BENCH_DIR"
ensure_gnu_time
ensure_prep
ensure_python

DATA="$BENCH_DIR/data/$PRESET"
synth_once "$PRESET" "$DATA"

RUN_DIR="$BENCH_DIR/run-$NAME"
LOG_DIR="$RUN_DIR/logs"
rm -rf "$RUN_DIR"
mkdir -p "$LOG_DIR"
RECORDS="$LOG_DIR/records.tsv"
: >"$RECORDS"

step "planned output at $SPACING (prep build-cache --dry-run --json)"
"$PREP" build-cache "$DATA" --cache-dir "$RUN_DIR/dry-run-cache" --spacing "$SPACING" --dry-run --json \
    >"$LOG_DIR/plan.json" 2>/dev/null || die "prep --dry-run --json failed"
rm -rf "$RUN_DIR/dry-run-cache"
plan_outputs "$LOG_DIR/plan.json" >/dev/null || die "could not read prep's plan ($LOG_DIR/plan.json)"

step "checking free disk space (outputs are deleted after every run)"
require_free "$BENCH_DIR" $((MIN_FREE_GB * 1024 ** 3)) "one run's output"

if [[ "$BENCH_COLD" != 1 ]]; then
    step "reading the inputs once (every run starts with them in the page cache)"
    warm_inputs "$DATA"
fi

bench_rounds "$REPEAT"

rc=0
bench_report "$NAME" "$EXPECT" || rc=$?
info "logs: $LOG_DIR"
exit "$rc"
