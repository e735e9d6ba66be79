#!/usr/bin/env bash
# Benchmark: a cache on S3 beside the same cache on local disk. Builds the MiniVess-like
# quarter (18 cases at 0.99,0.99,2) into a local folder and into s3://BUCKET/PREFIX, times
# bringing the S3 cache into an empty local tier (what `train --cache-dir s3://...` does
# first) and into a full one, and reads training patches (32x64x64 image + label, one core,
# examples/bench_patches) from the local cache and from the tier, warm and cold (page cache
# dropped). Prints the figures of docs/benchmarks.md, "Caches on S3".
#
#   bash scripts/bench_s3.sh                  # starts SeaweedFS on loopback (scripts/s3_server.sh)
#   BENCH_SMALL=1 bash scripts/bench_s3.sh    # smoke test: the small preset, seconds
#   AWS_ENDPOINT_URL=... S3_BUCKET=b bash scripts/bench_s3.sh   # another server (keys from AWS_*)
#
# Also, when ZARR_PYTHON (default $PYTHON, else python3) has zarr and obstore: the same patches read straight
# from S3 by zarr-python with no local tier (scripts/bench_s3_direct.py), with its reads per
# patch.
#
# Environment: ROUNDS (3), PATCHES (2000; cold 500), ZARR_PYTHON, and those of
# scripts/bench_common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

ROUNDS="${ROUNDS:-3}"
if [[ "$BENCH_SMALL" == 1 ]]; then
    PRESET=small; PART=0/1; SPACING=auto; PATCHES="${PATCHES:-200}"; COLD=50; ROUNDS=1
else
    PRESET=minivess; PART=0/4; SPACING=0.99,0.99,2.0; PATCHES="${PATCHES:-2000}"; COLD=500
fi
# CI's server (scripts/s3_server.sh, already started) when there is one.
export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-${VOXCACHE_TEST_S3_ENDPOINT:-}}"
if [[ -z "$AWS_ENDPOINT_URL" ]]; then
    step "starting SeaweedFS on loopback"
    s3_env=$(bash "$REPO/scripts/s3_server.sh" start) || die "the S3 server did not start"
    eval "$s3_env"
    export AWS_ENDPOINT_URL="$VOXCACHE_TEST_S3_ENDPOINT"
    trap 'bash "$REPO/scripts/s3_server.sh" stop' EXIT
fi
BUCKET="${S3_BUCKET:-${VOXCACHE_TEST_S3_BUCKET:-voxtest}}"
URL="s3://$BUCKET/bench-$(date +%s)-$$"
ensure_prep
if [[ -n "${BIN:-}" ]]; then BENCH="$BIN/examples/bench_patches"; else
    (cd "$REPO" && cargo build --release --quiet --example bench_patches)
    BENCH="${CARGO_TARGET_DIR:-$REPO/target}/release/examples/bench_patches"
fi
DATA="$BENCH_DIR/data/$PRESET"
synth_once "$PRESET" "$DATA"
W="$BENCH_DIR/s3"
rm -rf "$W"; mkdir -p "$W"
secs_to() { local f=$1 t0=$EPOCHREALTIME; shift; "$@" >"$f"; python3 -c "print(${EPOCHREALTIME} - $t0)"; }
secs() { secs_to /dev/null "$@"; }

step "build: local folder, then $URL"
cat "$DATA"/imagesTr/* "$DATA"/labelsTr/* >/dev/null  # inputs warm for both
t_local=$(secs "$PREP" build-cache "$DATA" --cache-dir "$W/local" --spacing "$SPACING" --part "$PART" -q)
t_s3=$(secs "$PREP" build-cache "$DATA" --cache-dir "$URL" --spacing "$SPACING" --part "$PART" -q --local-cache "$W/stage")
bytes=$(du -sb "$W/local/entries" | cut -f1)
objects=$(find "$W/local/entries" -type f | wc -l)
step "local tier: empty (every entry fetched), then full (nothing fetched)"
t_cold=$(secs "$PREP" inspect "$URL" --local-cache "$W/tier")
t_warm=$(secs "$PREP" inspect "$URL" --local-cache "$W/tier")
cmp <(cd "$W/local/entries" && find . -type f | sort | xargs sha256sum) \
    <(cd "$W/tier/entries" && find . -type f | sort | xargs sha256sum) >/dev/null \
    || die "the tier's entries differ from the local cache's"

step "train --benchmark: local cache, then from S3 into an empty tier (files on first read)"
TRAIN="${TRAIN:-$(dirname "$PREP")/train}"
[[ -x "$TRAIN" ]] || (cd "$REPO" && cargo build --release --quiet --bin train)
TR=(--benchmark 10 --patch 32,64,64 --batch-size 2 --base-channels 8 --stages 4 --no-progress)
t_train_local=$(secs_to "$W/train_local.txt" "$TRAIN" --cache-dir "$W/local" "${TR[@]}")
t_train_s3=$(secs_to "$W/train_s3.txt" "$TRAIN" --cache-dir "$URL" --local-cache "$W/tier_lazy" "${TR[@]}")
lazy_bytes=$(du -sb "$W/tier_lazy/entries" | cut -f1)

ZPY="${ZARR_PYTHON:-${PYTHON:-python3}}"
DIRECT="$W/direct.json"; echo '{}' >"$DIRECT"
if "$ZPY" -c 'import zarr, obstore' 2>/dev/null; then
    step "patches read straight from S3 by zarr-python (no local tier)"
    "$ZPY" "$REPO/scripts/bench_s3_direct.py" --endpoint "$AWS_ENDPOINT_URL" --bucket "$BUCKET" \
        --prefix "${URL#s3://$BUCKET/}" --patches "$COLD" --rounds "$ROUNDS" >"$DIRECT"
else
    echo "(no zarr and obstore in $ZPY: set ZARR_PYTHON for the no-tier figure)"
fi

step "patches, $ROUNDS rounds: local cache and local tier, warm then cold"
RUN="$W/run.jsonl"; : >"$RUN"
for r in $(seq 1 "$ROUNDS"); do
    "$BENCH" "$W/local" "$W/tier" --patches "$PATCHES" --rounds 1 | tail -n 1 \
        | sed 's/^/{"mode": "warm", "r": /; s/$/}/' >>"$RUN"
    "$BENCH" "$W/local" "$W/tier" --patches "$COLD" --rounds 1 --cold | tail -n 1 \
        | sed 's/^/{"mode": "cold", "r": /; s/$/}/' >>"$RUN"
done
python3 - "$RUN" "$t_local" "$t_s3" "$t_cold" "$t_warm" "$bytes" "$objects" "$PRESET" "$BENCH_DIR/results.jsonl" \
    "$t_train_local" "$t_train_s3" "$lazy_bytes" "$DIRECT" <<'PY'
import json, os, statistics, sys
run, tl, ts, tc, tw, nbytes, nobj, preset, out, trl, trs, lazy, direct = sys.argv[1:]
direct = json.load(open(direct))
w = os.path.dirname(run)
for side in ("local", "s3"):
    mem = [l.split(None, 2)[2].split(" (")[0] for l in open(f"{w}/train_{side}.txt") if l.startswith("peak memory")]
    print(f"train --benchmark peak memory, {side}: {mem[0] if mem else '?'}")
tl, ts, tc, tw, nbytes, nobj, trl, trs, lazy = map(float, (tl, ts, tc, tw, nbytes, nobj, trl, trs, lazy))
rows = [json.loads(l) for l in open(run)]
print(f"\ncache: {nbytes / 1e9:.2f} GB in {int(nobj)} objects")
print(f"build: local {tl:.1f} s, to S3 {ts:.1f} s ({ts / tl:.2f}x)")
print(f"local tier: empty {tc:.1f} s ({nbytes / 1e6 / tc:.0f} MB/s, {int(nobj)} GETs + 1 LIST page per 1000), full {tw:.2f} s")
print(f"train --benchmark 10: local cache {trl:.1f} s; from S3, empty tier {trs:.1f} s "
      f"(+{trs - trl:.1f} s; {lazy / 1e6:.0f} MB in the tier when it ended, of {nbytes / 1e6:.0f})")
res = {"bench": "s3", "preset": preset, "build_local_s": tl, "build_s3_s": ts, "tier_cold_s": tc,
       "tier_warm_s": tw, "bytes": nbytes, "objects": nobj, "train_local_s": trl,
       "train_s3_empty_tier_s": trs, "tier_bytes_after_train": lazy}
for mode in ("warm", "cold"):
    rates = {}
    for r in rows:
        if r["mode"] == mode:
            for p in r["r"]["paths"]:
                rates.setdefault(p["path"].rstrip("/").rsplit("/", 1)[-1], []).append(p["patches_per_s"])
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"patches/s {mode}: local {med['local']:.0f}, tier {med['tier']:.0f} ({med['tier'] / med['local']:.2f}x)")
    res[f"patches_{mode}"] = med
if direct:
    print(f"patches/s straight from S3, {direct['tool']}: {direct['patches_per_s']:.0f} "
          f"({direct['reads_per_patch']:.1f} reads a patch)")
    res["direct"] = direct
with open(out, "a") as f:
    f.write(json.dumps(res) + "\n")
PY
