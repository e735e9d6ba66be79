#!/usr/bin/env bash
# Benchmark: peak memory and wall time of `predict` at a real plan: nnU-Net's plain U-Net for an
# anisotropic CT-like set (patch 40x160x160, features 32, 64, 128, 256, 320, 320, six stages,
# strides 1x2x2 then 2x2x2 three times then 1x2x2, kernels 1x3x3 then 3x3x3), the kind of plan
# nnU-Net's planner gives such data (for this preset's cases, at 0.86 mm in-plane: 40x224x224,
# the same topology) and which the capped patches of the other benchmarks never reach.
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
# from PyPI; never CI's); then the segmentations are compared voxel for voxel with that venv's
# python (numpy, nibabel). The nnU-Net runs read copies of the inputs whose header unit is mm
# (prep synth writes its CT-like spacings, 0.6 to 1 in plane, with the unit um, which nnU-Net's
# SimpleITK reader and predict --nnunet-model both turn into mm/1000): a CT set in mm, as the
# model must be trained on (the same copies of the preset's cases; docs/benchmarks.md, "Predict
# at a real plan", has the steps).
# GNU time's maximum RSS is the largest single process's; nnUNetv2_predict is several, so its
# run also prints the peak PSS summed over its process tree (sampled from /proc once a second:
# the sampler takes a few % of a core).
#
# Environment: BENCH_DIR (bench-out/predict_memory), BIN (folder of prep/train/predict; default
# target/release, built if missing), BATCHES ("1 2"), PREDICT_ARGS (more options for every
# `predict` run, e.g. "--window-memory-mib 512"), OWN_MODEL=0 (skip our own model's runs: only
# the nnU-Net model's), BENCH_SMALL=1 (smoke test: the bundled small preset and a tiny plan,
# seconds; no peers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/predict_memory}"
BIN="${BIN:-$ROOT/target/release}"
BATCHES="${BATCHES:-1 2}"
read -r -a EXTRA <<<"${PREDICT_ARGS:-}"
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
if [ "${OWN_MODEL:-1}" != 0 ] && [ ! -f "$B/run/run.json" ]; then
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
# tree_pss PID OUT: the peak of the summed PSS (MiB) of PID and its descendants, sampled once a
# second until PID ends, written to OUT ("-" where /proc cannot tell).
tree_pss() {
    python3 - "$1" "$2" <<'PY' || echo - >"$2"
import os, sys, time
root, out = int(sys.argv[1]), sys.argv[2]
def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(l.split()[1]) for l in f if l.startswith("Pss:"))
    except OSError:
        return 0
best = 0
while os.path.exists(f"/proc/{root}"):
    kids, tree = {}, [root]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    for p in tree:
        tree.extend(kids.get(p, []))
    best = max(best, sum(pss(p) for p in tree))
    time.sleep(1.0)
open(out, "w").write(f"{best / 1024:.0f}\n" if best else "-\n")
PY
}
printf 'tool\tbatch\twall_s\tpeak_rss_MiB\tpeak_anon_MiB\tpeak_tree_pss_MiB\n' >"$B/results.tsv"
# run NAME BATCH COMMAND...: one timed run, its row in results.tsv; TREE=1 samples the tree's PSS.
run() {
    local name="$1" batch="$2" pid sampler=
    shift 2
    rm -rf "$B/out-$name" "$B/$name.pss"
    /usr/bin/time -v "$@" >"$B/$name.json" 2>"$B/$name.time" &
    pid=$!
    if [ "${TREE:-0}" = 1 ]; then
        tree_pss "$pid" "$B/$name.pss" &
        sampler=$!
    fi
    wait "$pid" || die "$name failed: $(tail -n 5 "$B/$name.time")"
    [ -z "$sampler" ] || wait "$sampler" || true
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$batch" "$(wall "$B/$name.time")" "$(peak "$B/$name.time")" \
        "$(anon "$B/$name.json")" "$(cat "$B/$name.pss" 2>/dev/null || echo -)" >>"$B/results.tsv"
}
for batch in $BATCHES; do
    [ "${OWN_MODEL:-1}" != 0 ] || break
    step "voxcache predict --model (batch $batch)"
    run "ours-b$batch" "$batch" "$BIN/predict" --model "$B/run" "$B/inputs" --out "$B/out-ours-b$batch" \
        --batch "$batch" --json --quiet ${EXTRA[@]+"${EXTRA[@]}"}
done
if [ -n "${NNUNET_MODEL:-}" ]; then
    # The same two inputs with the header's spatial unit set to mm (xyzt_units, byte 123 of
    # NIfTI-1), every other byte kept.
    rm -rf "$B/nn-in"
    python3 - "$B/inputs" "$B/nn-in" <<'PY'
import gzip, os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
for name in sorted(os.listdir(src)):
    with gzip.open(os.path.join(src, name)) as f:
        b = bytearray(f.read())
    if int.from_bytes(b[:4], "little") != 348:
        sys.exit(f"{name}: not NIfTI-1")
    b[123] = (b[123] & ~7) | 2
    with open(os.path.join(dst, name), "wb") as f:
        f.write(gzip.compress(bytes(b), compresslevel=1))
PY
    for batch in $BATCHES; do
        step "voxcache predict --nnunet-model (batch $batch)"
        run "nnunet-ours-b$batch" "$batch" "$BIN/predict" --nnunet-model "$NNUNET_MODEL" -f 0 \
            --disable-tta "$B/nn-in" --out "$B/out-nnunet-ours-b$batch" --batch "$batch" --json --quiet \
            ${EXTRA[@]+"${EXTRA[@]}"}
    done
    if [ -n "${NNUNET_PREDICT:-}" ]; then
        step "nnUNetv2_predict (PyTorch)"
        TREE=1 run nnunetv2 - env nnUNet_raw=/tmp nnUNet_preprocessed=/tmp nnUNet_results=/tmp \
            "$NNUNET_PREDICT" -i "$B/nn-in" -o "$B/out-nnunetv2" -m "$NNUNET_MODEL" \
            -f 0 --disable_tta -device cpu -npp 1 -nps 1
        step "segmentations voxel for voxel ($B/equality.tsv)"
        args=()
        for batch in $BATCHES; do args+=("$B/out-nnunet-ours-b$batch"); done
        "$(dirname "$NNUNET_PREDICT")/python" - "$B/out-nnunetv2" "${args[@]}" >"$B/equality.tsv" <<'PY'
import os, sys
import nibabel as nib
import numpy as np
ref = sys.argv[1]
print("ours\tcase\tvoxels\tdiffering\tequal_pct")
for ours in sys.argv[2:]:
    for name in sorted(f for f in os.listdir(ref) if f.endswith(".nii.gz")):
        a = np.asarray(nib.load(os.path.join(ours, name)).dataobj)
        b = np.asarray(nib.load(os.path.join(ref, name)).dataobj)
        if a.shape != b.shape:
            sys.exit(f"{ours}/{name}: shape {a.shape}, nnU-Net's {b.shape}")
        d = int(np.count_nonzero(a != b))
        print(f"{os.path.basename(ours)}\t{name}\t{a.size}\t{d}\t{100 * (a.size - d) / a.size:.4f}")
PY
        column -t -s $'\t' "$B/equality.tsv"
    fi
else
    echo "skipped: an nnU-Net model at the plan (set NNUNET_MODEL=DIR, and NNUNET_PREDICT for nnU-Net's own)"
fi
step "results ($B/results.tsv; $(date -u +%F), $(nproc) cores)"
column -t -s $'\t' "$B/results.tsv"
