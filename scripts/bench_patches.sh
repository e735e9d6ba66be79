#!/usr/bin/env bash
# Benchmark: training patches (32x64x64 image + label, one core) read from our cache in each
# chunk layout, beside nnU-Net v2's own loader (nnUNetDataLoader on its blosc2 files of the same
# cases, scripts/bench_loader_nnunet.py), alternating in one run: each round runs ours (every
# layout, examples/bench_patches.rs) and then nnU-Net's. Warm rounds (page cache holds the
# files) and cold rounds (every file evicted from the page cache first). Prints the table of
# docs/benchmarks.md: patches/s, the ratio to nnU-Net's loader, bytes on disk.
#
#   bash scripts/bench_patches.sh                  # MiniVess-like quarter (18 cases) at 0.99,0.99,2
#   BENCH_SMALL=1 bash scripts/bench_patches.sh    # smoke test: small preset, seconds
#
# Environment: ROUNDS (default 5), PATCHES (ours per round, default 2000; cold 500), PATCH
# (z,y,x, default 32,64,64), LAYOUTS (default "raw packed"), NNUNET_PYTHON (a python with
# nnunetv2 from PyPI, several GB with torch; default $BENCH_DIR/nnenv/bin/python, made when
# NNUNET=1; without it nnU-Net's column is left out), BIN (folder holding
# examples/bench_patches; default: a release build), and those of scripts/bench_common.sh
# (BENCH_DIR, PREP). Appends JSON lines to $BENCH_DIR/results.jsonl.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

ROUNDS="${ROUNDS:-5}"
PATCH="${PATCH:-32,64,64}"
LAYOUTS="${LAYOUTS:-raw packed}"
if [[ "$BENCH_SMALL" == 1 ]]; then
    PRESET="small"; PART="0/1"; SPACING="auto"; PATCHES="${PATCHES:-200}"; COLD_PATCHES=50
    ROUNDS="${ROUNDS_SMALL:-1}"
else
    PRESET="minivess"; PART="0/4"; SPACING="0.99,0.99,2.0"; PATCHES="${PATCHES:-2000}"
    COLD_PATCHES="${COLD_PATCHES:-500}"
fi

step "bench patches: preset $PRESET part $PART at $SPACING, patch $PATCH, layouts: $LAYOUTS, $ROUNDS rounds"
mkdir -p "$BENCH_DIR"
ensure_prep
if [[ -n "${BIN:-}" ]]; then
    BENCH="$BIN/examples/bench_patches"
else
    step "cargo build --release --example bench_patches"
    (cd "$REPO" && cargo build --release --quiet --example bench_patches) || die "cargo build failed"
    BENCH="${CARGO_TARGET_DIR:-$REPO/target}/release/examples/bench_patches"
fi

DATA="$BENCH_DIR/data/$PRESET"
synth_once "$PRESET" "$DATA"

caches=()
for layout in $LAYOUTS; do
    cache="$BENCH_DIR/patches/$PRESET-$layout"
    step "cache, layout $layout: $cache"
    "$PREP" build-cache "$DATA" --cache-dir "$cache" --spacing "$SPACING" --part "$PART" \
        --layout "$layout" -q | tail -n 2 | sed 's/^/    /'
    caches+=("$cache")
done

NN="${NNUNET_PYTHON:-$BENCH_DIR/nnenv/bin/python}"
if ! "$NN" -c "import nnunetv2, zarr" >/dev/null 2>&1; then
    if [[ "${NNUNET:-0}" == 1 ]]; then
        step "creating $BENCH_DIR/nnenv with nnunetv2 and zarr (PyPI; several GB with torch)"
        python3 -m venv "$BENCH_DIR/nnenv"
        "$BENCH_DIR/nnenv/bin/pip" install -q nnunetv2 zarr
        NN="$BENCH_DIR/nnenv/bin/python"
    else
        info "no nnunetv2 python ($NN): nnU-Net's loader is left out (NNUNET=1 installs it)"
        NN=""
    fi
fi
NNDIR="$BENCH_DIR/patches/$PRESET-nnunet"
if [[ -n "$NN" ]]; then
    step "nnU-Net's preprocessed files of the same cases: $NNDIR"
    "$NN" "$REPO/scripts/bench_loader_nnunet.py" --cache "${caches[0]}" --out "$NNDIR" \
        --patch "$PATCH" --convert-only
fi

RUN="$BENCH_DIR/patches/run.jsonl"
: >"$RUN"
for r in $(seq 1 "$ROUNDS"); do
    for mode in warm cold; do
        if [[ $mode == cold ]]; then n=$COLD_PATCHES; flag=--cold; else n=$PATCHES; flag=; fi
        step "round $r, $mode: ours ($n patches per layout)"
        # shellcheck disable=SC2086
        "$BENCH" "${caches[@]}" --patch "$PATCH" --patches "$n" --rounds 1 $flag | tail -n 1 \
            | sed "s/^/{\"round\": $r, \"mode\": \"$mode\", \"ours\": /; s/\$/}/" >>"$RUN"
        if [[ -n "$NN" ]]; then
            step "round $r, $mode: nnU-Net's loader"
            # shellcheck disable=SC2086
            "$NN" "$REPO/scripts/bench_loader_nnunet.py" --out "$NNDIR" --no-convert \
                --patch "$PATCH" --rounds 1 --batches $((n / 2)) $flag | tail -n 1 \
                | sed "s/^/{\"round\": $r, \"mode\": \"$mode\", \"nnunet\": /; s/\$/}/" >>"$RUN"
        fi
    done
done

step "table (medians over $ROUNDS rounds; ratios: of the medians)"
python3 - "$RUN" "$BENCH_DIR/results.jsonl" "$PRESET" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = []
for mode in ("warm", "cold"):
    nn = [r["nnunet"] for r in rows if r["mode"] == mode and "nnunet" in r]
    nn_rate = statistics.median(x["median_patches_per_s"] for x in nn) if nn else None
    print(f"\n{mode}:")
    print(f"{'reader':<44} {'patches/s':>10} {'vs nnU-Net':>11} {'disk MB':>9}")
    paths = {}
    for r in rows:
        if r["mode"] == mode and "ours" in r:
            for p in r["ours"]["paths"]:
                paths.setdefault(p["path"], []).append(p)
    for name, ps in paths.items():
        rate = statistics.median(p["patches_per_s"] for p in ps)
        label = name.rsplit("/", 1)[-1] + (f" ({ps[0]['layout']})" if ps[0]["layout"] else "")
        disk = ps[0]["bytes_on_disk"]
        vs = f"{rate / nn_rate:.1f}x" if nn_rate else "-"
        print(f"{label:<44} {rate:>10.0f} {vs:>11} {disk / 1e6 if disk else float('nan'):>9.0f}")
        out.append({"mode": mode, "reader": label, "patches_per_s": rate, "bytes_on_disk": disk})
    if nn_rate:
        disk = nn[0]["bytes_on_disk"]
        print(f"{'nnU-Net loader (nnunetv2 ' + nn[0]['nnunetv2'] + ', blosc2)':<44} {nn_rate:>10.0f} {'1.0x':>11} {disk / 1e6:>9.0f}")
        out.append({"mode": mode, "reader": "nnunet", "patches_per_s": nn_rate, "bytes_on_disk": disk})
with open(sys.argv[2], "a") as f:
    f.write(json.dumps({"bench": "patches", "preset": sys.argv[3], "rows": out}) + "\n")
EOF
