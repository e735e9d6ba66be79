#!/usr/bin/env bash
# Benchmark: an input far bigger than it looks. A ~4 MB .nii.gz that inflates to a
# 2048x2048x1024 uint8 volume (4 GiB) and its label, built into a cache at 2x2x2 (zstd) and
# inspected. Memory must not follow the input: inputs above --input-ram-mib (default 256) are
# inflated once into the cache's tmp/ and read from there. Reports wall time and peak RSS
# (/usr/bin/time -v) of `prep build-cache` and `prep inspect`, medians of REPEAT runs.
#
#   bash scripts/bench_big_input.sh                 # full size (needs ~9 GB of free disk)
#   BENCH_SMALL=1 bash scripts/bench_big_input.sh   # 512x512x256, seconds
#
# Environment: REPEAT (default 3), SHAPE (x,y,z), and those of scripts/bench_common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

REPEAT="${REPEAT:-3}"
if [[ "$BENCH_SMALL" == 1 ]]; then SHAPE="${SHAPE:-512,512,256}"; else SHAPE="${SHAPE:-2048,2048,1024}"; fi
step "bench big-input: $SHAPE uint8, REPEAT=$REPEAT, nproc $(nproc), BENCH_DIR=$BENCH_DIR"
mkdir -p "$BENCH_DIR"
ensure_gnu_time
ensure_prep
ensure_python

DATA="$BENCH_DIR/data/big-$SHAPE"
if [[ ! -f "$DATA/.complete" ]]; then
    step "writing the dataset (streamed: the generator never holds the volume)"
    rm -rf "$DATA" && mkdir -p "$DATA/imagesTr" "$DATA/labelsTr"
    "$PY" "$REPO/scripts/make_big_input.py" "$DATA/imagesTr/big_0000.nii.gz" \
        --label "$DATA/labelsTr/big.nii.gz" --shape "$SHAPE"
    touch "$DATA/.complete"
fi
info "dataset: $(du -sh "$DATA" | cut -f1) on disk, $SHAPE voxels inflated"

run() { # LABEL ARGS...: one timed run, prints "seconds peak_kib"
    local log="$BENCH_DIR/big-$1.time"; shift
    /usr/bin/time -v "$@" >"$log.out" 2>"$log" || { cat "$log.out" "$log" >&2; die "failed: $*"; }
    local wall rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$log")
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
    echo "$wall $rss"
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -a B_T B_M I_T I_M
for i in $(seq "$REPEAT"); do
    rm -rf "$BENCH_DIR/big-cache"
    read -r t m < <(run build "$PREP" build-cache "$DATA" --cache-dir "$BENCH_DIR/big-cache" \
        --spacing 2 --compression zstd --quiet $PREP_ARGS)
    B_T+=("$t"); B_M+=("$m")
    read -r t m < <(run inspect "$PREP" inspect "$DATA")
    I_T+=("$t"); I_M+=("$m")
    info "run $i: build ${B_T[-1]} s, ${B_M[-1]} KiB; inspect ${I_T[-1]} s, ${I_M[-1]} KiB"
done
"$PREP" inspect "$BENCH_DIR/big-cache" --verify >/dev/null || die "the built cache does not verify"
bt=$(printf '%s\n' "${B_T[@]}" | median); bm=$(printf '%s\n' "${B_M[@]}" | median)
it=$(printf '%s\n' "${I_T[@]}" | median); im=$(printf '%s\n' "${I_M[@]}" | median)
step "medians of $REPEAT"
printf '    %-22s %8s s  peak %6d MiB\n' "prep build-cache" "$bt" $((bm / 1024)) "prep inspect" "$it" $((im / 1024))
echo "{\"bench\":\"big-input\",\"shape\":\"$SHAPE\",\"build_s\":$bt,\"build_peak_kib\":$bm,\"inspect_s\":$it,\"inspect_peak_kib\":$im}" >>"$BENCH_DIR/results.jsonl"
rm -rf "$BENCH_DIR/big-cache"
