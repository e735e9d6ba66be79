#!/usr/bin/env bash
# Benchmark: what the surface-distance loss costs a training run, ours against the user's.
#
# Ours: `train --loss surface=1` against the same run without it, on the MiniVess outlier built
# at 4 um (636x636x76) with `--derived distance` (the label's distance map cached), patch
# 72x136x136 (the user's), batch 1, one step logged at a time; step time from metrics.jsonl,
# peak RSS from /usr/bin/time -v and per step from the log. The prediction's distance transform
# is computed in the training step (exact, linear time).
# Theirs: scripts/torch_surface_step.py: the same U-Net in PyTorch on the CPU, Dice + CE, with
# and without the same term computed the user's way (scipy distance_transform_edt of label and
# thresholded prediction, every step), random smooth patches of the same size.
# Each configuration runs ROUNDS times, alternating; medians printed.
#
#   bash scripts/bench_surface.sh
#   STEPS=30 ROUNDS=3 bash scripts/bench_surface.sh
#
# Environment: BENCH_DIR (bench-out/surface), BIN (target/release), STEPS (20), ROUNDS (1),
# TORCH_PYTHON (a python with torch and scipy; default: $BENCH_DIR/torchenv from PyPI), PEERS=0
# (ours alone: no PyTorch, nothing installed), BENCH_SMALL=1 (smoke test: the bundled small
# preset, patch 16,32,32, 4 steps: the fewest the step-time median takes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/surface}"
BIN="${BIN:-$ROOT/target/release}"
PEERS="${PEERS:-1}"
if [ "${BENCH_SMALL:-0}" = 1 ]; then
    PRESET=small PATCH=16,32,32 STEPS="${STEPS:-4}"
else
    PRESET=outlier PATCH=72,136,136
fi
STEPS="${STEPS:-20}"
ROUNDS="${ROUNDS:-1}"
step() { echo "== $*" >&2; }
mkdir -p "$B"
if [ ! -x "$BIN/train" ] || [ ! -x "$BIN/prep" ]; then
    step "building release binaries"
    (cd "$ROOT" && cargo build --release --bin prep --bin train)
fi
if [ "$PEERS" = 0 ]; then
    echo "skipped: torch_surface_step.py needs PyTorch (PEERS=0)"
else
    PY="${TORCH_PYTHON:-$B/torchenv/bin/python}"
    if ! "$PY" -c "import torch, scipy" >/dev/null 2>&1; then
        step "creating $B/torchenv with torch and scipy (PyPI)"
        python3 -m venv "$B/torchenv"
        "$B/torchenv/bin/pip" install -q torch scipy numpy
        PY="$B/torchenv/bin/python"
    fi
fi
[ -d "$B/data/imagesTr" ] || "$BIN/prep" synth --preset "$PRESET" --out "$B/data" >/dev/null
step "cache at 4 um with the distance map"
"$BIN/prep" build-cache "$B/data" --cache-dir "$B/cache" --spacing 4,4,4 --derived distance --quiet

results="$B/results.jsonl"
: >"$results"
ours() { # $1: name, $2...: extra flags
    local name="$1"; shift
    local run="$B/runs/$name"
    rm -rf "$run"
    mkdir -p "$B/runs"
    /usr/bin/time -v "$BIN/train" --cache-dir "$B/cache" --out "$run" --patch "$PATCH" \
        --batch-size 1 --steps "$STEPS" --log-every 1 --no-progress "$@" \
        >"$run.log" 2>"$run.time" || { cat "$run.log" "$run.time" >&2; exit 1; }
    python3 - "$run/metrics.jsonl" "$run.time" "$name" "$STEPS" >>"$results" <<'PY'
import json, re, statistics, sys
log, timefile, name, steps = sys.argv[1:]
recs = [json.loads(l) for l in open(log) if '"train"' in l]
el = [r["elapsed_s"] for r in recs]
dt = [b - a for a, b in zip(el, el[1:])][2:]  # the first steps warm up
peak = [r["peak_rss_mb"] for r in recs]
kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(timefile).read()).group(1))
print(json.dumps({"impl": "voxcache", "config": name, "median_step_s": statistics.median(dt),
                  "peak_rss_mib": kib / 1024, "log_peak_mib_step3": peak[2],
                  "log_peak_mib_last": peak[-1], "steps": int(steps)}))
PY
}
theirs() { # $1: name, $2...: extra flags
    local name="$1"; shift
    /usr/bin/time -v "$PY" "$ROOT/scripts/torch_surface_step.py" --patch "$PATCH" \
        --steps "$STEPS" "$@" >"$B/$name.json" 2>"$B/$name.time" \
        || { cat "$B/$name.time" >&2; exit 1; }
    python3 - "$B/$name.json" "$B/$name.time" "$name" >>"$results" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read()).group(1))
print(json.dumps({"impl": "pytorch+scipy", "config": sys.argv[3], "median_step_s": j["median_step_s"],
                  "peak_rss_mib": kib / 1024, "log_peak_mib_step3": j["peak_rss_mib_first"],
                  "log_peak_mib_last": j["peak_rss_mib_last"], "steps": j["steps"]}))
PY
}
for r in $(seq "$ROUNDS"); do
    step "round $r: voxcache dice+ce"; ours dice_ce
    step "round $r: voxcache +surface"; ours surface --loss surface=1
    [ "$PEERS" = 0 ] && continue
    step "round $r: pytorch dice+ce"; theirs torch_dice_ce
    step "round $r: pytorch +surface (scipy EDT)"; theirs torch_surface --surface
done

python3 - "$results" "$PATCH" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"surface loss, patch {sys.argv[2]} (z,y,x), batch 1; medians over rounds")
print(f"{'impl':<14} {'config':<14} {'step s':>7} {'peak RSS MiB':>13} {'RSS@3 -> last':>16}")
groups = {}
for r in rows:
    groups.setdefault((r["impl"], r["config"]), []).append(r)
med = {}
for (impl, config), rs in groups.items():
    m = lambda k: statistics.median(x[k] for x in rs)
    med[(impl, config)] = m("median_step_s")
    print(f"{impl:<14} {config:<14} {m('median_step_s'):>7.2f} {m('peak_rss_mib'):>13.0f} "
          f"{m('log_peak_mib_step3'):>7.0f} -> {m('log_peak_mib_last'):<7.0f}")
for impl, base, surf in (("voxcache", "dice_ce", "surface"), ("pytorch+scipy", "torch_dice_ce", "torch_surface")):
    if (impl, base) in med and (impl, surf) in med:
        print(f"{impl}: the surface term adds {100 * (med[(impl, surf)] / med[(impl, base)] - 1):.1f}% to the step")
PY
