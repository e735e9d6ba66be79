#!/usr/bin/env bash
# Which chunk layout should the cache default to? For each candidate layout: build a quarter of
# the MiniVess-like set (--part 0/4, 18 volumes) and report build wall time, bytes on disk, file
# count, and random 64x64x32 (x,y,z) float patch reads through zarrs (examples/read_patches.rs),
# beside a memcpy of the same bytes.
#
#   bash scripts/bench_layouts.sh            # needs bench-out/data/minivess (made by bench_minivess.sh or here)
#   BENCH_SMALL=1 bash scripts/bench_layouts.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench-out}"
PATCHES="${PATCHES:-300}"
PATCH="${PATCH:-32,64,64}"
if [[ "${BENCH_SMALL:-0}" == 1 ]]; then PRESET=small; PART=0/1; SPACING=auto; else PRESET=minivess; PART=0/4; SPACING=0.99,0.99,5.0; fi

cargo build --release --quiet --bin prep --example read_patches
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
PREP="$TARGET/release/prep"
READ="$TARGET/release/examples/read_patches"
DATA="$BENCH_DIR/data/$PRESET"
[[ -d "$DATA/imagesTr" ]] || "$PREP" synth --out "$DATA" --preset "$PRESET" >/dev/null
[[ -x /usr/bin/time ]] || apt-get install -y -q time >/dev/null

layouts=(
  "raw-32x128x128|--chunk 32,128,128 --compression none"
  "raw-64x64x64|--chunk 64,64,64 --compression none"
  "raw-16x256x256|--chunk 16,256,256 --compression none"
  "zstd-32x128x128|--chunk 32,128,128 --compression zstd"
  "blosc-32x128x128|--chunk 32,128,128 --compression blosc"
  "f16-zstd-shard|--chunk 32,64,64 --shard 64,256,256 --compression zstd --image-dtype float16"
)
out="$BENCH_DIR/layouts"
mkdir -p "$out"
printf '%-18s %9s %10s %8s %12s %10s %12s\n' layout "build s" "disk MiB" files "patches/s" "MB/s" "memcpy MB/s"
for entry in "${layouts[@]}"; do
  name="${entry%%|*}"; flags="${entry#*|}"
  cache="$out/$name"
  rm -rf "$cache"; sync
  # shellcheck disable=SC2086
  /usr/bin/time -f '%e' -o "$out/$name.time" "$PREP" build-cache "$DATA" --cache-dir "$cache" --spacing "$SPACING" --part "$PART" -q $flags >/dev/null
  wall=$(cat "$out/$name.time")
  mib=$(du -sm "$cache/entries" | cut -f1)
  files=$(find "$cache/entries" -type f | wc -l)
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  json=$("$READ" "$cache" "$PATCHES" "$PATCH")
  pps=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"{d['zarrs_patches_per_s']:.0f} {d['zarrs_mb_per_s']:.0f} {d['memcpy_mb_per_s']:.0f}\")" "$json")
  read -r p mb mc <<<"$pps"
  printf '%-18s %9s %10s %8s %12s %10s %12s\n' "$name" "$wall" "$mib" "$files" "$p" "$mb" "$mc"
  echo "{\"bench\": \"layouts\", \"layout\": \"$name\", \"flags\": \"$flags\", \"build_s\": $wall, \"disk_mib\": $mib, \"files\": $files, \"read\": $json, \"nproc\": $(nproc), \"time\": \"$(date -u +%FT%TZ)\"}" >> "$BENCH_DIR/results.jsonl"
  rm -rf "$cache"
done
