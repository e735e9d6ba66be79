#!/usr/bin/env bash
# Benchmark: training step time and a whole run's memory and data wait.
#
# 1. Step time, side by side in one run, alternating: forward + backward + AdamW step of the same
#    U-Net (2 convs + InstanceNorm + LeakyReLU per stage, transposed-conv up, 1x1x1 head) and the
#    same Dice + CE loss on random data, batch 2, patch 32x64x64 (z,y,x), in voxcache
#    (examples/bench_train_step.rs, candle on the CPU) and in PyTorch on the CPU
#    (scripts/torch_unet_step.py). Same thread count for both.
#    Before the timing, scripts/torch_crosscheck.py checks that both compute the same thing: the
#    same weights and input give the same logits, loss and gradients (it stops the script if not).
# 2. A whole `train` run on a cache of the bundled data: peak RSS (/usr/bin/time -v), the
#    fraction of time spent waiting for data, patches/s (from the run's metrics.jsonl).
#
#   bash scripts/bench_train.sh
#
# Environment: TORCH_PYTHON (a python with torch; default: create $BENCH_DIR/torchenv and
# pip install torch), THREADS (default: all cores), PATCH (z,y,x, default 32,64,64), BASE
# (first-stage channels, default 16), STAGES (default 4), STEPS (timed steps a round, default 5),
# ROUNDS (default 3), RUN_STEPS (steps of the whole run, default 100), BIN (folder of prep, train
# and examples/; default: target/release, built), PEERS=0 (ours alone: no PyTorch, nothing
# installed; the weights are still exported), BENCH_SMALL=1 (smoke test: patch 16,32,32, base 4,
# 3 stages, 1 round of 1 step, a whole run of 4 steps without validation), and BENCH_DIR.
# Appends one JSON line to $BENCH_DIR/results.jsonl.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

PEERS="${PEERS:-1}"
RUN_FLAGS=""
if [[ "$BENCH_SMALL" == 1 ]]; then
    PATCH="${PATCH:-16,32,32}" BASE="${BASE:-4}" STAGES="${STAGES:-3}" STEPS="${STEPS:-1}"
    ROUNDS="${ROUNDS:-1}" RUN_STEPS="${RUN_STEPS:-4}"
    # A metrics line every step (the summary needs one); no held-out cases to validate.
    RUN_FLAGS="--log-every 1 --val-fraction 0"
fi
THREADS="${THREADS:-$(nproc)}"
PATCH="${PATCH:-32,64,64}"
BASE="${BASE:-16}"
STAGES="${STAGES:-4}"
STEPS="${STEPS:-5}"
ROUNDS="${ROUNDS:-3}"
RUN_STEPS="${RUN_STEPS:-100}"
mkdir -p "$BENCH_DIR"
ensure_gnu_time

if [[ "$PEERS" == 0 ]]; then
    echo "skipped: torch_crosscheck.py and torch_unet_step.py need PyTorch (PEERS=0)"
elif [[ -z "${TORCH_PYTHON:-}" ]]; then
    TORCH_PYTHON="$BENCH_DIR/torchenv/bin/python"
    if ! "$TORCH_PYTHON" -c "import torch" >/dev/null 2>&1; then
        step "creating $BENCH_DIR/torchenv with torch (PyPI; several GB with its CUDA libraries)"
        python3 -m venv "$BENCH_DIR/torchenv"
        "$BENCH_DIR/torchenv/bin/pip" install -q torch numpy
    fi
fi

if [[ -z "${BIN:-}" ]]; then
    step "building (release)"
    (cd "$REPO" && cargo build --release -q --example bench_train_step --example export_forward --bin train --bin prep)
    BIN="$REPO/target/release"
fi

step "cross-check: same weights and input in PyTorch (scripts/torch_crosscheck.py)"
xc="$BENCH_DIR/crosscheck"
mkdir -p "$xc"
"$BIN/examples/export_forward" "$xc" "$PATCH" "$BASE" "$STAGES" 2 > "$xc/config.json"
[[ "$PEERS" == 0 ]] || "$TORCH_PYTHON" "$REPO/scripts/torch_crosscheck.py" "$xc" --show 4

step "step time: batch 2, patch $PATCH, base $BASE, $STAGES stages, $THREADS threads, $ROUNDS rounds of $STEPS steps"
results="$BENCH_DIR/train_steps.jsonl"
: > "$results"
for _ in $(seq "$ROUNDS"); do
    RAYON_NUM_THREADS="$THREADS" "$BIN/examples/bench_train_step" "$PATCH" 2 "$BASE" "$STAGES" "$STEPS" | tee -a "$results"
    [[ "$PEERS" == 0 ]] && continue
    "$TORCH_PYTHON" "$REPO/scripts/torch_unet_step.py" --patch "$PATCH" --batch 2 --base "$BASE" \
        --stages "$STAGES" --steps "$STEPS" --threads "$THREADS" | tee -a "$results"
done

step "whole run: $RUN_STEPS steps on the bundled data"
work="$BENCH_DIR/train-run"
rm -rf "$work"
"$BIN/prep" build-cache "$REPO/data/vessels" --cache-dir "$work/cache" -q
# shellcheck disable=SC2086 # the flags are words
/usr/bin/time -v "$BIN/train" --cache-dir "$work/cache" --out "$work/run" --steps "$RUN_STEPS" \
    --val-every 0 --no-progress -j "$THREADS" $RUN_FLAGS 2> "$work/time.txt" | tee "$work/summary.txt"
rss_kb=$(awk -F: '/Maximum resident/ {gsub(/ /, "", $2); print $2}' "$work/time.txt")

python3 - "$results" "$work/run/metrics.jsonl" "$rss_kb" "$BENCH_DIR/results.jsonl" <<'PY'
import json, statistics, sys
steps, metrics, rss_kb, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(steps) if l.startswith("{")]
med = {}
for impl in ("voxcache", "pytorch"):
    xs = [r["median_step_s"] for r in rows if r["impl"] == impl]
    med[impl] = statistics.median(xs) if xs else None  # no PyTorch rows with PEERS=0
ratio = med["voxcache"] / med["pytorch"] if med["pytorch"] else None
recs = [json.loads(l) for l in open(metrics)]
train = [r for r in recs if r.get("kind") == "train"]
wait = statistics.median(r["data_wait_frac"] for r in train)
pps = statistics.median(r["patches_per_s"] for r in train)
res = {
    "bench": "train",
    "voxcache_step_s": med["voxcache"],
    "pytorch_step_s": med["pytorch"],
    "ratio_voxcache_over_pytorch": ratio,
    "params": next(r["params"] for r in rows if r["impl"] == "voxcache"),
    "run_peak_rss_mib": rss_kb / 1024,
    "run_data_wait_frac_median": wait,
    "run_patches_per_s_median": pps,
}
print(json.dumps(res, indent=1))
with open(out, "a") as f:
    f.write(json.dumps(res) + "\n")
theirs = (f"PyTorch {med['pytorch']*1e3:.0f} ms (ratio {ratio:.2f}; target <= 2)" if ratio
          else "PyTorch skipped")
print(f"\nstep time: voxcache {med['voxcache']*1e3:.0f} ms, {theirs}; whole run: peak RSS "
      f"{rss_kb/1024:.0f} MiB, data wait {100*wait:.2f}% (target < 5%)")
PY
