#!/usr/bin/env bash
# Benchmark: peak memory and wall time of `predict` at a real plan: nnU-Net's plain U-Net for an
# anisotropic CT-like set (patch 40x160x160, features 32, 64, 128, 256, 320, 320, six stages,
# strides 1x2x2 then 2x2x2 three times then 1x2x2, kernels 1x3x3 then 3x3x3), which nnU-Net's
# planner gives such data and which the capped patches of the other benchmarks never reach.
# Our model at that plan (weights of one training step: memory does not depend on the values)
# predicts two CT-like inputs, one window per pass and two (--batch 1 and 2); each run's peak
# RSS and peak anonymous memory (`predict --json`) and wall time (/usr/bin/time -v) are printed.
#
#   bash scripts/bench_predict_memory.sh
#   NNUNET_MODEL=DIR bash scripts/bench_predict_memory.sh     # also an nnU-Net model's folder
#
# With NNUNET_MODEL (a trained nnU-Net results folder, e.g. nnUNetTrainer__nnUNetPlans__3d_fullres
# at such a plan), `predict --nnunet-model DIR -f 0 --disable-tta` runs on the same inputs, and
# beside it nnU-Net's own (`-device cpu -f 0 --disable_tta -npp 1 -nps 1`) when NNUNET_PREDICT
# names its nnUNetv2_predict_from_modelfolder (from a separate venv with torch and nnunetv2
# from PyPI; never CI's).
#
# Environment: BENCH_DIR (bench-out/predict_memory), BIN (folder of prep/train/predict; default
# target/release, built if missing), BATCHES ("1 2"), BENCH_SMALL=1 (smoke test: the bundled small
# preset and a tiny plan, seconds; no peers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/predict_memory}"
BIN="${BIN:-$ROOT/target/release}"
BATCHES="${BATCHES:-1 2}"
step() { echo "== $*" >&2; }
die() { echo "bench_predict_memory: $*" >&2; exit 1; }
[ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) is needed for peak RSS: apt install time"
mkdir -p "$B"
if [ ! -x "$BIN/predict" ] || [ ! -x "$BIN/train" ]; then
    step "building release binaries"
    (cd "$ROOT" && cargo build --release --bins)
fi

if [ "${BENCH_SMALL:-0}" = 1 ]; then
    PRESET=small
    cat >"$B/plan.toml" <<'TOML'
configuration = "bench"
[configurations.bench]
spacing = [1.0, 1.0, 1.0]
patch = [16, 32, 32]
batch_size = 1
strides = [[1, 1, 1], [1, 2, 2], [2, 2, 2]]
kernels = [[1, 3, 3], [3, 3, 3], [3, 3, 3]]
features = [4, 8, 16]
blocks = [2, 2, 2]
decoder_blocks = [2, 2]
encoder = "plain"
TOML
else
    PRESET=ct-like
    # nnU-Net's plan for anisotropic CT (3d_fullres), at a coarser in-plane spacing than a real
    # set so that the synthetic volumes stay small: memory depends on the patch, not the volume.
    cat >"$B/plan.toml" <<'TOML'
configuration = "ct_plan"
[configurations.ct_plan]
spacing = [1.6, 1.6, 2.5]
patch = [40, 160, 160]
batch_size = 1
strides = [[1, 1, 1], [1, 2, 2], [2, 2, 2], [2, 2, 2], [2, 2, 2], [1, 2, 2]]
kernels = [[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]]
features = [32, 64, 128, 256, 320, 320]
blocks = [2, 2, 2, 2, 2, 2]
decoder_blocks = [2, 2, 2, 2, 2]
encoder = "plain"
TOML
fi

step "data: prep synth --preset $PRESET"
[ -d "$B/data/imagesTr" ] || "$BIN/prep" synth --preset "$PRESET" --out "$B/data" >/dev/null
if [ ! -f "$B/run/run.json" ]; then
    step "weights: one training step at the plan ($B/plan.toml)"
    "$BIN/prep" build-cache "$B/data" --cache-dir "$B/cache" --pipeline "$B/plan.toml" --quiet
    /usr/bin/time -v "$BIN/train" --cache-dir "$B/cache" --out "$B/run" --pipeline "$B/plan.toml" \
        --steps 1 --val-fraction 0 --no-augment --no-progress >"$B/train.log" 2>"$B/train.time" \
        || die "train failed: $(tail -n 5 "$B/train.time")"
fi
mkdir -p "$B/inputs"
# The two smallest images (fewest bytes): the memory of a pass does not grow with the image.
for f in $(ls -S "$B"/data/imagesTr/*.nii.gz | tail -n 2); do ln -sf "$f" "$B/inputs/"; done

peak() { awk -F': ' '/Maximum resident/ {printf "%.0f", $2 / 1024}' "$1"; }
wall() { awk -F': ' '/Elapsed \(wall/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; printf "%.1f", s}' "$1"; }
anon() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round((r.get('peak_anon_bytes') or 0) / 2**20))" "$1" 2>/dev/null || echo "-"; }
printf 'tool\tbatch\twall_s\tpeak_rss_MiB\tpeak_anon_MiB\n' >"$B/results.tsv"
# run NAME BATCH COMMAND...: one timed run, its row in results.tsv.
run() {
    local name="$1" batch="$2"
    shift 2
    rm -rf "$B/out-$name"
    /usr/bin/time -v "$@" >"$B/$name.json" 2>"$B/$name.time" \
        || die "$name failed: $(tail -n 5 "$B/$name.time")"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$batch" "$(wall "$B/$name.time")" "$(peak "$B/$name.time")" \
        "$(anon "$B/$name.json")" >>"$B/results.tsv"
}
for batch in $BATCHES; do
    step "voxcache predict --model (batch $batch)"
    run "ours-b$batch" "$batch" "$BIN/predict" --model "$B/run" "$B/inputs" --out "$B/out-ours-b$batch" \
        --batch "$batch" --json --quiet
done
if [ -n "${NNUNET_MODEL:-}" ]; then
    for batch in $BATCHES; do
        step "voxcache predict --nnunet-model (batch $batch)"
        run "nnunet-ours-b$batch" "$batch" "$BIN/predict" --nnunet-model "$NNUNET_MODEL" -f 0 \
            --disable-tta "$B/inputs" --out "$B/out-nnunet-ours-b$batch" --batch "$batch" --json --quiet
    done
    if [ -n "${NNUNET_PREDICT:-}" ]; then
        step "nnUNetv2_predict (PyTorch)"
        mkdir -p "$B/nn-in"
        for f in "$B"/inputs/*.nii.gz; do ln -sf "$(readlink -f "$f")" "$B/nn-in/"; done
        run nnunetv2 - env nnUNet_raw=/tmp nnUNet_preprocessed=/tmp nnUNet_results=/tmp \
            "$NNUNET_PREDICT" -i "$B/nn-in" -o "$B/out-nnunetv2" -m "$NNUNET_MODEL" \
            -f 0 --disable_tta -device cpu -npp 1 -nps 1
    fi
else
    echo "skipped: an nnU-Net model at the plan (set NNUNET_MODEL=DIR, and NNUNET_PREDICT for nnU-Net's own)"
fi
step "results ($B/results.tsv; $(date -u +%F), $(nproc) cores)"
column -t -s $'\t' "$B/results.tsv"
