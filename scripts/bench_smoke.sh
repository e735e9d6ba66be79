#!/usr/bin/env bash
# Every benchmark script and example once, in its smallest setting, on the debug binaries
# (`cargo test` has built nearly all of them already): CI runs this so that none of them can stop
# working unnoticed again. Not a benchmark: no timing it prints means anything.
#
#   bash scripts/bench_smoke.sh
#
# The PyTorch sides of the comparisons (batchgeneratorsv2, MONAI, nnunetv2, the PyTorch U-Net)
# are left out: torch is several GB. Their scripts are byte-compiled instead, and our side of
# each comparison still runs in full; the peers in the CI venv (SimpleITK, scipy) run.
# Everything is written to a temporary folder, removed at the end. Keeps going after a failure
# and exits 1 naming every step that failed (with the end of its output).
#
# Environment: PYTHON (the venv's python; default: last line of scripts/python_env.sh),
# CARGO_TARGET_DIR (where the debug binaries are; default target/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEBUG="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
EX="$DEBUG/examples"
start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/logs"

echo "== debug binaries and examples (cargo build --bins --examples)"
cargo build --locked --quiet --bins --examples
PY="${PYTHON:-$(bash scripts/python_env.sh | tail -n 1)}"

failed=()
covered=()
# step NAME COMMAND...: run COMMAND with its output in a log; on failure show the log's end.
step() {
    local name="$1" t0=$SECONDS rc=0
    shift
    covered+=("$name")
    "$@" >"$tmp/logs/$name.log" 2>&1 || rc=$?
    if ((rc == 0)); then
        printf 'ok    %-28s %4d s\n' "$name" $((SECONDS - t0))
        # What a script left out (the PyTorch sides), so the CI log says so.
        grep -E 'skipped:|left out' "$tmp/logs/$name.log" | sed 's/^ */      /' || true
    else
        printf 'FAIL  %-28s %4d s (exit %d), the end of its output:\n' "$name" $((SECONDS - t0)) "$rc"
        tail -n 40 "$tmp/logs/$name.log" | sed 's/^/      | /'
        failed+=("$name")
    fi
}
# Run by one of the scripts below (named for the check at the end).
covered+=(bench_augment bench_patches bench_train_step export_forward)

echo "== Python scripts: byte-compiled (the PyTorch ones cannot run here)"
step py_compile env PYTHONPYCACHEPREFIX="$tmp/pycache" "$PY" -m py_compile scripts/*.py python/examples/*.py

echo "== caches of the bundled data (plain, and with distance maps and skeletons)"
step cache "$DEBUG/prep" build-cache data/vessels --cache-dir "$tmp/cache" -q
step cache-derived "$DEBUG/prep" build-cache data/vessels --cache-dir "$tmp/derived" -q \
    --derived distance,skeleton

echo "== examples (those no script below runs)"
# The mask of the distance and skeleton examples: a 2x2 bar along x in an 8x12x16 block.
for ((z = 0; z < 8; z++)); do for ((y = 0; y < 12; y++)); do for ((x = 0; x < 16; x++)); do
    if ((z >= 3 && z <= 4 && y >= 5 && y <= 6 && x > 1)); then printf '\001'; else printf '\000'; fi
done; done; done >"$tmp/mask.u8"
step augment_patch "$EX/augment_patch" "$tmp/cache" "$tmp/augment_patch"
step bench_intensity "$EX/bench_intensity" 16,32,32 2
step bench_ops "$EX/bench_ops" --small --runs 1
step distance_map "$EX/distance_map" "$tmp/mask.u8" 8,12,16 1,1,1 "$tmp/distance"
# A copy of the corpus: a panic would save its input into the corpus folder.
cp -r tests/fuzz_corpus "$tmp/corpus"
step fuzz_headers "$EX/fuzz_headers" --iterations 2000 --corpus "$tmp/corpus"
step fuzz_records "$EX/fuzz_records" --iterations 20000
cp -r tests/checkpoint_corpus "$tmp/checkpoint_corpus"
step fuzz_checkpoints "$EX/fuzz_checkpoints" --iterations 300 --corpus "$tmp/checkpoint_corpus"
step skeleton_halo "$EX/skeleton_halo" "$tmp/derived"
step skeleton_mask "$EX/skeleton_mask" "$tmp/mask.u8" 8,12,16 "$tmp/skeleton.u8"
step nnunet_stages "$EX/nnunet_stages" --nnunet-model \
    tests/fixtures/nnunet_models/ct3d/nnUNetTrainer__nnUNetPlans__3d_fullres --out "$tmp/nnunet_stages" \
    tests/fixtures/nnunet_models/ct3d/inputs/ct_fine_0000.nii.gz
step plan_fingerprint "$EX/plan_fingerprint" tests/nnunet_plans/Dataset501_Vessels__dataset_fingerprint.json \
    tests/nnunet_plans/Dataset501_Vessels__dataset.json resenc-m
step components sh -c "head -c 512 /dev/zero > $tmp/cc.u8 && $EX/components $tmp/cc.u8 8,8,8 full $tmp/cc.u32"
step cv_splits sh -c "printf 'a\nb\nc\nd\ne\nf\n' | $EX/cv_splits"

echo "== benchmark scripts (BENCH_SMALL=1 or the fewest steps, PEERS=0: no PyTorch)"
echo "skipped: scripts/build_cuda.sh (needs the CUDA toolkit, GBs of wheels, and a release build)" \
    "and scripts/gpu_check.sh (needs an NVIDIA GPU)"
common=(env PEERS=0 BENCH_SMALL=1 PYTHON="$PY" PREP="$DEBUG/prep" BIN="$DEBUG")
step batch_hashes.sh "${common[@]}" BENCH_DIR="$tmp/hashes" bash scripts/batch_hashes.sh
step bench_augment.sh "${common[@]}" BENCH_DIR="$tmp/augment" bash scripts/bench_augment.sh
# A smaller --input-ram-mib than the small volume: the scratch-file path the full run takes.
step bench_big_input.sh "${common[@]}" BENCH_DIR="$tmp/big" REPEAT=1 PREP_ARGS="--input-ram-mib 16" \
    bash scripts/bench_big_input.sh
step bench_compare.sh "${common[@]}" BENCH_DIR="$tmp/compare" \
    bash scripts/bench_compare.sh "$DEBUG" "$DEBUG" 1
step bench_minivess.sh "${common[@]}" BENCH_DIR="$tmp/minivess" REPEAT=1 bash scripts/bench_minivess.sh
step bench_outlier.sh "${common[@]}" BENCH_DIR="$tmp/outlier" REPEAT=1 bash scripts/bench_outlier.sh
step bench_patches.sh "${common[@]}" BENCH_DIR="$tmp/patches" bash scripts/bench_patches.sh
step bench_predict.sh "${common[@]}" BENCH_DIR="$tmp/predict" bash scripts/bench_predict.sh
step bench_predict_memory.sh "${common[@]}" BENCH_DIR="$tmp/predict_memory" \
    bash scripts/bench_predict_memory.sh
step bench_s3.sh "${common[@]}" BENCH_DIR="$tmp/s3" bash scripts/bench_s3.sh
step bench_surface.sh "${common[@]}" BENCH_DIR="$tmp/surface" bash scripts/bench_surface.sh
step bench_train.sh "${common[@]}" BENCH_DIR="$tmp/train" bash scripts/bench_train.sh
step thin_losses.sh "${common[@]}" BENCH_DIR="$tmp/thin" STEPS=2 SEEDS=1 VAL_EVERY=2 \
    EXTRA="--patch 16,32,32 --base-channels 4" bash scripts/thin_losses.sh

# A script or example added later must be added here too, or this fails.
helpers=(bench_common.sh python_env.sh bench_smoke.sh build_cuda.sh gpu_check.sh gpu_nnunet_wheels.sh s3_server.sh)
for f in scripts/*.sh examples/*.rs; do
    name=$(basename "$f")
    [[ $f == *.rs ]] && name=${name%.rs}
    if [[ " ${covered[*]} ${helpers[*]} " != *" $name "* ]]; then
        echo "FAIL  $f is not run by scripts/bench_smoke.sh: add it there (smallest setting)"
        failed+=("$name (not run)")
    fi
done

if ((${#failed[@]})); then
    echo "bench_smoke: ${#failed[@]} failed: ${failed[*]} ($((SECONDS - start)) s)" >&2
    exit 1
fi
echo "bench_smoke: every benchmark script and example ran ($((SECONDS - start)) s)"
