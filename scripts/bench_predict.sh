#!/usr/bin/env bash
# Benchmark: `predict` beside MONAI's inference pipeline (scripts/monai_predict.py: LoadImage,
# Spacing, NormalizeIntensity, sliding_window_inference in Gaussian mode, Invertd, SaveImage)
# with the same network and weights in PyTorch, on the MiniVess outlier (one 512x512x61 case at
# 4.97x4.97x5 um), alternating, one run each per round. Prints wall time and peak RSS
# (/usr/bin/time -v) of each, windows per second of our sliding window against PyTorch's bare
# forward pass of the same network on the same threads, and the two segmentations' agreement
# (evaluate).
#
#   bash scripts/bench_predict.sh                 # model spacing 4,4,5 um (636x636x61 predicted)
#   SPACING=2,2,5 bash scripts/bench_predict.sh   # 1272x1272x61
#
# The issue's case is a model trained at 1 um (2545x2545x305 voxels to predict): on a 2-core CPU
# that is hours of forward passes for either tool, so the default is a coarser model spacing;
# memory is what the benchmark is about, and ours does not grow with the volume.
#
# Environment: SPACING (model spacing x,y,z in um; default 4,4,5), PATCH (z,y,x; 16,64,64), BASE
# (8), STAGES (4), STEPS (training steps for the weights; 20), ROUNDS (1), BENCH_DIR
# (bench-out/predict), BIN (folder of prep/train/predict/evaluate; target/release, built if
# missing), TORCH_PYTHON (a python with torch and monai; default: $BENCH_DIR/torchenv, made from
# PyPI: several GB with torch's CUDA libraries), PEERS=0 (ours alone: no PyTorch, no MONAI,
# nothing installed), BENCH_SMALL=1 (smoke test: the bundled small preset's first case at its
# own spacing, weights of 2 steps).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/predict}"
PEERS="${PEERS:-1}"
if [ "${BENCH_SMALL:-0}" = 1 ]; then
    PRESET=small SPACING="${SPACING:-auto}" STEPS="${STEPS:-2}"
else
    PRESET=outlier
fi
SPACING="${SPACING:-4,4,5}"
PATCH="${PATCH:-16,64,64}"
BASE="${BASE:-8}"
STAGES="${STAGES:-4}"
STEPS="${STEPS:-20}"
ROUNDS="${ROUNDS:-1}"
BIN="${BIN:-$ROOT/target/release}"
step() { echo "== $*" >&2; }
die() { echo "bench_predict: $*" >&2; exit 1; }
[ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) is needed for peak RSS: apt install time"
mkdir -p "$B"

if [ ! -x "$BIN/predict" ] || [ ! -x "$BIN/evaluate" ]; then
    step "building release binaries"
    (cd "$ROOT" && cargo build --release --bins)
fi
if [ "$PEERS" = 0 ]; then
    echo "skipped: the MONAI pipeline needs PyTorch (PEERS=0)"
    PY=python3  # reads our JSON report: the standard library is enough
else
    PY="${TORCH_PYTHON:-$B/torchenv/bin/python}"
    if ! "$PY" -c "import torch, monai, nibabel" >/dev/null 2>&1; then
        step "creating $B/torchenv with torch and monai (PyPI)"
        python3 -m venv "$B/torchenv"
        "$B/torchenv/bin/pip" install -q torch numpy monai nibabel
        PY="$B/torchenv/bin/python"
    fi
fi

step "data: prep synth --preset $PRESET"
[ -d "$B/data/imagesTr" ] || "$BIN/prep" synth --preset "$PRESET" --out "$B/data" >/dev/null
IMAGE="$(ls "$B"/data/imagesTr/*.nii.gz | head -n 1)"
step "weights: a model at $SPACING um (patch $PATCH, base $BASE, $STAGES stages, $STEPS steps)"
if [ ! -f "$B/run/run.json" ]; then
    "$BIN/prep" build-cache "$B/data" --cache-dir "$B/cache" --spacing "$SPACING" --quiet
    "$BIN/train" --cache-dir "$B/cache" --out "$B/run" --patch "$PATCH" --base-channels "$BASE" \
        --stages "$STAGES" --steps "$STEPS" --val-fraction 0 --no-progress >"$B/train.log"
fi

threads="$(nproc)"
torch_fwd=""
if [ "$PEERS" != 0 ]; then
    step "PyTorch forward pass alone: batch 2, $threads threads"
    torch_fwd="$("$PY" "$ROOT/scripts/monai_predict.py" --model "$B/run" --forward-only 20 --threads "$threads")"
    echo "$torch_fwd"
fi

peak() { awk -F': ' '/Maximum resident/ {printf "%.0f", $2 / 1024}' "$1"; }
wall() { awk -F': ' '/Elapsed \(wall/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; printf "%.1f", s}' "$1"; }
printf 'round\ttool\twall_s\tpeak_MiB\twindows_per_s\n' >"$B/results.tsv"
for r in $(seq 1 "$ROUNDS"); do
    step "round $r: voxcache predict"
    rm -rf "$B/pred-ours"
    /usr/bin/time -v "$BIN/predict" --model "$B/run" "$IMAGE" --out "$B/pred-ours" --json --quiet \
        >"$B/ours.json" 2>"$B/ours.time" || die "predict failed: $(tail -n 5 "$B/ours.time")"
    wps="$("$PY" -c "import json; r = json.load(open('$B/ours.json')); print(f\"{r['windows'] / r['window_seconds']:.2f}\")")"
    printf '%s\tvoxcache\t%s\t%s\t%s\n' "$r" "$(wall "$B/ours.time")" "$(peak "$B/ours.time")" "$wps" >>"$B/results.tsv"
    [ "$PEERS" = 0 ] && continue
    step "round $r: MONAI pipeline (PyTorch)"
    rm -rf "$B/pred-monai"
    /usr/bin/time -v "$PY" "$ROOT/scripts/monai_predict.py" --model "$B/run" --input "$IMAGE" \
        --out "$B/pred-monai" --threads "$threads" >"$B/monai.log" 2>"$B/monai.time" \
        || die "the MONAI pipeline failed: $(grep -v '^\s' "$B/monai.time" | tail -n 5)"
    printf '%s\tmonai\t%s\t%s\t\n' "$r" "$(wall "$B/monai.time")" "$(peak "$B/monai.time")" >>"$B/results.tsv"
done

step "results ($B/results.tsv)"
column -t -s $'\t' "$B/results.tsv"
[ "$PEERS" = 0 ] && exit 0
echo "$torch_fwd"
grep "resampled image" "$B/monai.log" || true
step "agreement of the two segmentations (evaluate, ours as the reference)"
"$BIN/evaluate" "$B"/pred-monai/*_seg.nii.gz "$B/pred-ours/$(basename "${IMAGE%_0000.nii.gz}").nii.gz" --quiet | sed -n '1,2p'
