#!/usr/bin/env bash
# Benchmark: augmented patches per second, our loader (one worker thread: memory-mapped reads,
# spatial transform, intensity transforms, mirroring; examples/bench_augment.rs) beside nnU-Net
# v2's augmentation in batchgeneratorsv2 (scripts/bench_augment_nnunet.py: the same transforms
# and probabilities, torch on one thread, the case held in memory), alternating, ROUNDS rounds,
# medians printed, and the median of each round's ratio (ours twice: with the reader's default,
# mapped pages left to the kernel, and in strict memory mode, STRICT_MIB of mapped pages).
# Modes: `default` (nnU-Net's probabilities) and `all` (every transform on every patch).
# PARTS=1 times the parts alone instead, on both sides, to show where the ratio is made or
# lost: `crop` (no spatial or intensity transform), `spatial` (rotation and scaling on every
# patch), `intensity` (nnU-Net's intensity probabilities, no spatial transform).
#
#   bash scripts/bench_augment.sh
#   PATCHES="32,96,96 16,128,128" ROUNDS=3 bash scripts/bench_augment.sh
#   PARTS=1 ROUNDS=3 bash scripts/bench_augment.sh
#
# Data: the MiniVess outlier (prep synth --preset outlier) built at 4x4x4 um (636x636x76).
# Environment: BENCH_DIR (bench-out/augment), BIN (target/release), BG_PYTHON (a python with
# batchgeneratorsv2, zarr; default: $BENCH_DIR/bgenv made from PyPI, several GB with torch),
# PEERS=0 (ours alone: no batchgeneratorsv2, nothing installed), BENCH_SMALL=1 (smoke test: the
# bundled small preset at its own spacing, one 16x64x64 patch, 1 round of 2 batches).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${BENCH_DIR:-$ROOT/bench-out/augment}"
BIN="${BIN:-$ROOT/target/release}"
PEERS="${PEERS:-1}"
if [ "${BENCH_SMALL:-0}" = 1 ]; then
    PRESET=small SPACING=auto ROUNDS="${ROUNDS:-1}" PATCHES="${PATCHES:-16,64,64}" N="${N:-2}"
else
    PRESET=outlier SPACING=4,4,4
fi
ROUNDS="${ROUNDS:-3}"
# 72x136x136: the patch of the vessel training in our users' story (full 3D rotations).
PATCHES="${PATCHES:-32,96,96 16,128,128 72,136,136}"
# Patches per run (ours reads N batches of 2): enough that the mix of transforms drawn
# varies little between runs (60 moved batchgeneratorsv2's rate by up to a quarter).
N="${N:-300}"
# A third of that for patches of over 600k voxels (72x136x136: batchgeneratorsv2 makes about
# 5 a second in `all`), still enough for the mix (3 rounds measured 11.3-12.3x `default`).
per_patch() { local v; v=$(echo "$1" | tr ',' '*'); if [ $((v)) -gt 600000 ]; then echo $((N / 3)); else echo "$N"; fi; }
# The second run of ours: strict memory mode (the trainer's --mapped-mib) with this budget.
STRICT_MIB="${STRICT_MIB:-128}"
step() { echo "== $*" >&2; }
mkdir -p "$B"
if [ ! -x "$BIN/examples/bench_augment" ] || [ ! -x "$BIN/prep" ]; then
    step "building release binaries"
    (cd "$ROOT" && cargo build --release --bin prep --example bench_augment)
fi
if [ "$PEERS" = 0 ]; then
    echo "skipped: batchgeneratorsv2 needs PyTorch (PEERS=0)"
    PY=python3  # the summary below needs nothing beyond the standard library
else
    PY="${BG_PYTHON:-$B/bgenv/bin/python}"
    if ! "$PY" -c "import batchgeneratorsv2, zarr, torch" >/dev/null 2>&1; then
        step "creating $B/bgenv with batchgeneratorsv2 (PyPI)"
        python3 -m venv "$B/bgenv"
        "$B/bgenv/bin/pip" install -q batchgeneratorsv2 zarr
        PY="$B/bgenv/bin/python"
    fi
fi
[ -d "$B/data/imagesTr" ] || "$BIN/prep" synth --preset "$PRESET" --out "$B/data" >/dev/null
[ -f "$B/cache/manifest.json" ] || "$BIN/prep" build-cache "$B/data" --cache-dir "$B/cache" --spacing "$SPACING" --quiet

results="$B/results.jsonl"
: >"$results"
# Our mode for each of the Python side's (the same transforms and probabilities).
ours() { case "$1" in intensity) echo mix-intensity ;; *) echo "$1" ;; esac; }
if [ -n "${PARTS:-}" ]; then MODES="crop spatial intensity"; else MODES="default all"; fi
for patch in $PATCHES; do
    n=$(per_patch "$patch")
    for mode in $MODES; do
        for r in $(seq 1 "$ROUNDS"); do
            step "round $r, patch $patch, $mode: voxcache"
            "$BIN/examples/bench_augment" "$B/cache" "$patch" "$n" "$(ours "$mode")" |
                sed "s/\"mode\":\"[a-z-]*\"/\"mode\":\"$mode\"/" >>"$results"
            step "round $r, patch $patch, $mode: voxcache, strict memory mode ($STRICT_MIB MiB)"
            MAPPED_MIB="$STRICT_MIB" "$BIN/examples/bench_augment" "$B/cache" "$patch" "$n" "$(ours "$mode")" |
                sed "s/\"mode\":\"[a-z-]*\"/\"mode\":\"$mode\"/" >>"$results"
            [ "$PEERS" = 0 ] && continue
            step "round $r, patch $patch, $mode: batchgeneratorsv2"
            "$PY" "$ROOT/scripts/bench_augment_nnunet.py" --cache "$B/cache" --patch "$patch" \
                --patches "$n" --mode "$mode" >>"$results"
        done
    done
done
"$PY" - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(tuple(r["patch"]), r["mode"]) for r in rows})
limits = sorted({r["mapped_mib"] for r in rows if r["tool"] == "voxcache"}, key=lambda m: m or 0)
# Each round's ratio: our runs over the batchgeneratorsv2 run that follows them (the file holds
# the rounds in order). On a host whose speed drifts, a slow spell lands on both sides of one
# round, so the median of these moves less than the ratio of the medians.
per_round = {}
pending = []
for r in rows:
    if r["tool"] == "voxcache":
        pending.append(r)
        continue
    for o in pending:
        key = (tuple(o["patch"]), o["mode"], o["mapped_mib"])
        per_round.setdefault(key, []).append(o["patches_per_s"] / r["patches_per_s"])
    pending = []
head = " ".join(f"{f'ours@{m}MiB/s' if m else 'ours/s':>15} {'ratio':>6} {'rounds':>6}" for m in limits)
print(f"{'patch':>12} {'mode':>8} {'bgv2/s':>8} {head}")
for patch, mode in keys:
    med = lambda keep: statistics.median(r["patches_per_s"] for r in rows
                                         if keep(r) and tuple(r["patch"]) == patch and r["mode"] == mode)
    # No batchgeneratorsv2 rows with PEERS=0: its rate and the ratios are NaN.
    has_b = any(r["tool"] == "batchgeneratorsv2" for r in rows)
    b = med(lambda r: r["tool"] == "batchgeneratorsv2") if has_b else float("nan")
    cols = []
    for m in limits:
        a = med(lambda r: r["tool"] == "voxcache" and r["mapped_mib"] == m)
        rr = statistics.median(per_round.get((patch, mode, m), [float("nan")]))
        cols.append(f"{a:>15.1f} {a / b:>5.1f}x {rr:>5.1f}x")
    print(f"{'x'.join(map(str, patch)):>12} {mode:>8} {b:>8.1f} {' '.join(cols)}")
print("ratio: of the medians; rounds: the median of each round's ratio")
EOF
