#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU op tests, then the training-step benchmark table.
#
#   bash scripts/gpu_check.sh
#
# Needs, beside this checkout:
# - target/gpu-carry/cuda-dist.tar.xz (or target/cuda-dist) from `bash scripts/build_cuda.sh`,
#   built on any x86-64 Linux machine;
# - the NVIDIA driver (CUDA 13.0 or newer: driver 580+) and the CUDA 13 libraries cuBLAS,
#   cuRAND, cuDNN 9 and the runtime: taken from a Python environment's nvidia-* packages
#   (PyTorch's own, `pip install torch`; newer PyTorch needs `pip install nvidia-curand` beside
#   it), or from LD_LIBRARY_PATH;
# - for the comparison rows, a python with torch (PYTHON, default python3).
#
# Then the whole pipeline once on the GPU (bundled data: cache, 60 training steps, predict,
# evaluate), `train --benchmark` with the MiniVess pipeline's settings in f32 and bf16 (data
# wait, GPU memory), then the step-time table against PyTorch.
#
# Environment: STEPS (timed steps a run, default 20), ROUNDS (alternating rounds, default 3),
# ONLY_TESTS=1 to stop before the step table, SKIP_TESTS=1 to run the step table alone (a
# device call lasts at most 10 minutes: run the two halves as two calls). Writes $OUT_DIR/gpu_bench.jsonl (OUT_DIR default
# target/gpu-check).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
out=${OUT_DIR:-target/gpu-check}
mkdir -p "$out"

if [[ ! -x target/cuda-dist/train ]]; then
  "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    target/gpu-carry/cuda-dist.tar.xz target
fi
dist=target/cuda-dist

# The CUDA libraries of the Python environment's nvidia-* wheels (PyTorch installs them).
libs=$("$py" - <<'PY'
import glob, os, site, sys
roots = [p for p in sys.path if p.endswith("site-packages")] + site.getsitepackages()
dirs = sorted({d for r in roots for d in glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)})
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if ldd "$dist/train" | grep "not found"; then
  echo "the libraries above are missing: pip install the wheels that hold them (libcurand:" \
    "nvidia-curand, libcudnn: nvidia-cudnn-cu13, libcublas: nvidia-cublas, libcudart:" \
    "nvidia-cuda-runtime; recent PyTorch no longer brings nvidia-curand) or set LD_LIBRARY_PATH" >&2
  exit 1
fi

# A failing part is reported and the next one still runs: a GPU session is short, and one call
# should bring back everything there is to learn. The exit status counts the failed parts.
failed=0
part() {
  local name=$1
  shift
  echo "== $name"
  if ! "$@"; then
    echo "!! FAILED: $name" >&2
    failed=$((failed + 1))
  fi
}

op_tests() {
  "$dist/gpu_ops" --test-threads=1 --nocapture 2>&1 | tee "$out/gpu_ops.log"
}

e2e="$out/e2e"
end_to_end() {
  rm -rf "$e2e"
  "$dist/prep" build-cache --cache-dir "$e2e/cache" --quiet &&
    "$dist/train" --cache-dir "$e2e/cache" --out "$e2e/run" --device cuda --steps 60 \
      --val-every 30 --no-progress &&
    "$dist/predict" --model "$e2e/run" data/vessels/imagesTr --out "$e2e/pred" --device cuda \
      --quiet &&
    "$dist/evaluate" "$e2e/pred" data/vessels | tail -3 &&
    tail -2 "$e2e/run/metrics.jsonl"
}

train_benchmark() {
  [[ -d $e2e/cache ]] || "$dist/prep" build-cache --cache-dir "$e2e/cache" --quiet
  local p
  for p in f32 bf16; do
    "$dist/train" --cache-dir "$e2e/cache" --pipeline minivess --device cuda --precision "$p" \
      --benchmark 20 --no-progress 2>&1 | tee "$out/benchmark_$p.txt" || return 1
  done
}

if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  part "op tests: CUDA against CPU (tests/gpu_ops.rs)" op_tests
  part "end to end on the GPU: cache the bundled data, train 60 steps, predict, evaluate" end_to_end
  part "train --benchmark: the MiniVess pipeline's training settings on the bundled cache" \
    train_benchmark
fi
if [[ ${ONLY_TESTS:-0} == 1 ]]; then
  echo "== $failed part(s) failed"
  exit "$failed"
fi

STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
results="$out/gpu_bench.jsonl"
: >"$results"
# name, patch z,y,x, batch, base, stages, max channels: the MiniVess pipeline's network
# (pipelines/minivess.toml) and nnU-Net's 3d_fullres default for a 128^3 patch.
configs=(
  "minivess 16,128,128 2 32 5 320"
  "nnunet_3d_fullres 128,128,128 2 32 6 320"
)
for r in $(seq "$ROUNDS"); do
  for c in "${configs[@]}"; do
    read -r name patch batch base stages maxch <<<"$c"
    tag() { "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); d["config"]=sys.argv[2]; d["round"]=int(sys.argv[3]); print(json.dumps(d))' "$1" "$name" "$r"; }
    for prec in f32 bf16; do
      if line=$("$dist/bench_train_step" "$patch" "$batch" "$base" "$stages" "$STEPS" cuda \
        "$maxch" "$prec"); then
        tag "$line" | tee -a "$results"
      else
        echo "!! FAILED: voxcache $prec $name" >&2
        failed=$((failed + 1))
      fi
    done
    for amp in "" bf16 f16; do
      if line=$("$py" scripts/torch_unet_step.py --device cuda --patch "$patch" --batch "$batch" \
        --base "$base" --max-ch "$maxch" --stages "$stages" --steps "$STEPS" ${amp:+--amp $amp}); then
        tag "$line" | tee -a "$results"
      else
        echo "!! FAILED: pytorch ${amp:-f32} $name" >&2
        failed=$((failed + 1))
      fi
    done
  done
done

echo "== median step time (s) and peak GPU memory (MiB) over $ROUNDS rounds"
"$py" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["config"], r["impl"]) for r in rows})
print(f"{'config':20} {'impl':22} {'step s':>8} {'peak MiB':>9}")
for cfg, impl in keys:
    rs = [r for r in rows if r["config"] == cfg and r["impl"] == impl]
    step = statistics.median(r["median_step_s"] for r in rs)
    mem = max(r.get("peak_gpu_mib", 0) for r in rs)
    print(f"{cfg:20} {impl:22} {step:8.4f} {mem:9.0f}")
print("\nratio to PyTorch AMP bf16 (target: within 1.5x)")
for cfg in sorted({r["config"] for r in rows}):
    med = {impl: statistics.median(r["median_step_s"] for r in rows
                                   if r["config"] == cfg and r["impl"] == impl)
           for impl in {r["impl"] for r in rows if r["config"] == cfg}}
    ref = med.get("pytorch amp bf16")
    for impl in ("voxcache", "voxcache bf16"):
        if ref and impl in med:
            print(f"{cfg:20} {impl:22} {med[impl] / ref:8.2f}x")
PY
echo "== $failed part(s) failed"
exit "$failed"
