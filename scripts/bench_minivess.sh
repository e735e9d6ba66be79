#!/usr/bin/env bash
# Benchmark: the whole MiniVess-like synthetic set (70 volumes of 512x512x5..110 with MiniVess's
# spacing mix, outlier included) built at its median spacing 0.99,0.99,5.0 by `prep build-cache`
# and by the whole-volume SimpleITK reference (scripts/sitk_reference.py), side by side in one
# run. Reports median wall time and peak RSS (/usr/bin/time -v), output bytes and output
# voxels/s (NIfTI on disk to written output), and the prep / reference ratios. Also prints the
# target spacing `--spacing auto` would choose, for the record.
#
#   bash scripts/bench_minivess.sh                  # full size, REPEAT=1
#   BENCH_SMALL=1 bash scripts/bench_minivess.sh    # smoke test: small preset, seconds
#
# Environment: REPEAT (default 1), BENCH_MIN_FREE_GB (default: estimated from prep's plan), and
# those listed in scripts/bench_common.sh (BENCH_DIR, PREP, PYTHON, SITK_FORMAT, SITK_ARGS,
# PREP_ARGS, BENCH_COLD). Each run appends one JSON line to $BENCH_DIR/results.jsonl.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

REPEAT="${REPEAT:-1}"
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive whole number (got '$REPEAT')"

SPACING="0.99,0.99,5.0"
if [[ "$BENCH_SMALL" == 1 ]]; then
    NAME="minivess-small"
    PRESET="small"
else
    NAME="minivess"
    PRESET="minivess"
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

step "what --spacing auto would choose (prep build-cache --dry-run, header line only)"
auto_plan=$("$PREP" build-cache "$DATA" --cache-dir "$RUN_DIR/dry-run-cache" --spacing auto --dry-run 2>&1) \
    || die "prep --dry-run failed: $auto_plan"
AUTO_LINE=$(head -n 1 <<<"$auto_plan")
info "$AUTO_LINE"
export BENCH_NOTE_auto_spacing="$AUTO_LINE"
info "(this benchmark uses the median spacing $SPACING)"
rm -rf "$RUN_DIR/dry-run-cache"

step "planned output at $SPACING (prep build-cache --dry-run --json)"
"$PREP" build-cache "$DATA" --cache-dir "$RUN_DIR/dry-run-cache" --spacing "$SPACING" --dry-run --json \
    >"$LOG_DIR/plan.json" 2>/dev/null || die "prep --dry-run --json failed"
rm -rf "$RUN_DIR/dry-run-cache"
plan=$(plan_outputs "$LOG_DIR/plan.json") || die "could not read prep's plan ($LOG_DIR/plan.json)"
read -r _ _ NEED_BYTES <<<"$plan"
info "~$((NEED_BYTES / 1024 ** 3)) GiB of disk wanted for one run's output"

step "checking free disk space (outputs are deleted after every run)"
if [[ -n "${BENCH_MIN_FREE_GB:-}" ]]; then
    NEED_BYTES=$((BENCH_MIN_FREE_GB * 1024 ** 3))
fi
require_free "$BENCH_DIR" "$NEED_BYTES" "one run's output"

if [[ "$BENCH_COLD" != 1 ]]; then
    step "reading the inputs once (every run starts with them in the page cache)"
    warm_inputs "$DATA"
fi

bench_rounds "$REPEAT"

rc=0
bench_report "$NAME" "" || rc=$?
info "auto spacing, for the record: $AUTO_LINE"
info "logs: $LOG_DIR"
exit "$rc"
