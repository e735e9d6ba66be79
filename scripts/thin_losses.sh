#!/usr/bin/env bash
# On the thin-vessel preset (prep synth --preset thin: branching vessels one to three voxels
# across), train the same U-Net with the same steps and seed under three losses and compare
# validation Dice and centreline Dice (clDice):
#   dice+ce            the default (Dice + cross-entropy, deep supervision)
#   +skeleton_recall   Kirchhoff et al. 2024, weight 1 (their default)
#   +cldice            Shit et al. 2021, weight 0.5 (their alpha)
# Validation: two held-out cases, sliding window, every VAL_EVERY steps; the table gives the
# last validation and the best (by Dice) of each run, per seed, then the mean over seeds.
#
#   bash scripts/thin_losses.sh
#   STEPS=1200 SEEDS="1 2 3" bash scripts/thin_losses.sh
#
# Environment: BENCH_DIR (bench-out/thin_losses), BIN (target/release), STEPS (600),
# SEEDS ("1 2"), VAL_EVERY (100), EXTRA (more train flags, e.g. "--patch 16,64,64").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/thin_losses}"
BIN="${BIN:-$ROOT/target/release}"
STEPS="${STEPS:-600}"
SEEDS="${SEEDS:-1 2}"
VAL_EVERY="${VAL_EVERY:-100}"
EXTRA="${EXTRA:-}"
step() { echo "== $*" >&2; }
mkdir -p "$B"
if [ ! -x "$BIN/train" ] || [ ! -x "$BIN/prep" ]; then
    step "building release binaries"
    (cd "$ROOT" && cargo build --release --bin prep --bin train)
fi
[ -d "$B/thin/imagesTr" ] || "$BIN/prep" synth --preset thin --out "$B/thin" >/dev/null
step "cache with the derived arrays (distance, skeleton)"
"$BIN/prep" build-cache "$B/thin" --cache-dir "$B/cache" --derived distance,skeleton --quiet

declare -A LOSS=(
    ["dice+ce"]=""
    ["+skeleton_recall"]="--loss skeleton_recall=1"
    ["+cldice"]="--loss cldice=0.5"
)
results="$B/results.jsonl"
: >"$results"
for seed in $SEEDS; do
    for name in "dice+ce" "+skeleton_recall" "+cldice"; do
        slug="${name//+/}"
        run="$B/runs/seed$seed/${slug//[^a-z_]/_}"
        rm -rf "$run"
        mkdir -p "$(dirname "$run")"
        step "seed $seed, $name: $STEPS steps"
        start=$(date +%s.%N)
        # shellcheck disable=SC2086 # the flags are words
        "$BIN/train" --cache-dir "$B/cache" --out "$run" --steps "$STEPS" --seed "$seed" \
            --val-every "$VAL_EVERY" --no-progress ${LOSS[$name]} $EXTRA >"$run.log" 2>&1 \
            || { cat "$run.log" >&2; exit 1; }
        end=$(date +%s.%N)
        python3 - "$run/metrics.jsonl" "$name" "$seed" "$start" "$end" >>"$results" <<'PY'
import json, sys
path, name, seed, start, end = sys.argv[1:]
vals = [json.loads(l) for l in open(path) if '"val"' in l]
last = vals[-1]
best = max(vals, key=lambda v: v["mean_dice"] if v["mean_dice"] is not None else -1)
print(json.dumps({
    "loss": name, "seed": int(seed), "seconds": float(end) - float(start),
    "dice": last["mean_dice"], "cldice": last.get("mean_cldice"),
    "best_step": best["step"], "best_dice": best["mean_dice"], "best_cldice": best.get("mean_cldice"),
}))
PY
    done
done

python3 - "$results" "$STEPS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
f = lambda v: "-" if v is None else f"{v:.4f}"
print(f"thin preset, {sys.argv[2]} steps; validation on the held-out cases")
print(f"{'loss':<18} {'seed':>4} {'Dice':>7} {'clDice':>7} {'best@':>6} {'Dice':>7} {'clDice':>7} {'s':>6}")
for r in rows:
    print(f"{r['loss']:<18} {r['seed']:>4} {f(r['dice']):>7} {f(r['cldice']):>7} "
          f"{r['best_step']:>6} {f(r['best_dice']):>7} {f(r['best_cldice']):>7} {r['seconds']:>6.0f}")
print("mean over seeds (last validation):")
for name in dict.fromkeys(r["loss"] for r in rows):
    rs = [r for r in rows if r["loss"] == name]
    m = lambda k: statistics.mean(r[k] for r in rs if r[k] is not None)
    print(f"{name:<18} Dice {m('dice'):.4f}  clDice {m('cldice'):.4f}  ({len(rs)} seeds, {m('seconds'):.0f} s a run)")
PY
