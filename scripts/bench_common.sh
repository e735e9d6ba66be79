# Shared helpers of scripts/bench_*.sh (sourced, not run).
#
# Environment (all optional):
#   BENCH_DIR      where datasets, outputs and results.jsonl live (default: <repo>/bench-out)
#   BENCH_SMALL=1  smoke-test scale: the small preset, seconds in all
#   REPEAT         runs of each tool (default set by each script)
#   PREP           prep binary to use (default: build target/release/prep with cargo)
#   PYTHON         python with SimpleITK, numpy, nibabel (default: last line of scripts/python_env.sh)
#   SITK_FORMAT    nii (default), nii.gz or npy: how the reference saves
#   SITK_ARGS      extra arguments for scripts/sitk_reference.py (e.g. --normalize-first)
#   PREP_ARGS      extra arguments for prep build-cache (e.g. -j 4)
#   BENCH_COLD=1   drop the page cache before every run (needs root and a writable
#                  /proc/sys/vm/drop_caches); by default inputs are read once beforehand so that
#                  every run starts with them warm in the page cache
#   SEED           synth seed (default 7, prep's default)

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_DIR="${BENCH_DIR:-$REPO/bench-out}"
BENCH_SMALL="${BENCH_SMALL:-0}"
SITK_FORMAT="${SITK_FORMAT:-nii}"
SITK_ARGS="${SITK_ARGS:-}"
PREP_ARGS="${PREP_ARGS:-}"
BENCH_COLD="${BENCH_COLD:-0}"
SEED="${SEED:-7}"

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# /usr/bin/time (GNU time) measures peak RSS; install it when missing and we can.
ensure_gnu_time() {
    if [[ -x /usr/bin/time ]] && /usr/bin/time -v true >/dev/null 2>&1; then
        return
    fi
    step "installing GNU time (/usr/bin/time is missing)"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    if command -v apt-get >/dev/null 2>&1 \
        && $sudo apt-get update -qq && $sudo apt-get install -y -qq time >/dev/null; then
        [[ -x /usr/bin/time ]] && return
    fi
    die "/usr/bin/time (GNU time) is needed to measure peak memory: install it (apt-get install time) and run again"
}

# Sets PREP to a current release binary.
ensure_prep() {
    if [[ -n "${PREP:-}" ]]; then
        [[ -x "$PREP" ]] || die "PREP=$PREP is not an executable"
        info "prep: $PREP (from \$PREP)"
        return
    fi
    step "cargo build --release --bin prep"
    (cd "$REPO" && cargo build --release --bin prep) || die "cargo build failed"
    PREP="$REPO/target/release/prep"
    info "prep: $PREP"
}

# Sets PY to the benchmark venv's python.
ensure_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        PY="$PYTHON"
    else
        step "python environment (scripts/python_env.sh)"
        [[ -f "$REPO/scripts/python_env.sh" ]] || die "scripts/python_env.sh is missing (or set PYTHON=/path/to/python with SimpleITK, numpy, nibabel)"
        PY="$(bash "$REPO/scripts/python_env.sh" | tail -n 1)" \
            || die "scripts/python_env.sh failed (or set PYTHON=/path/to/python with SimpleITK, numpy, nibabel)"
    fi
    [[ -n "$PY" && -x "$PY" ]] || die "no python executable found (got '$PY'); set PYTHON=..."
    "$PY" -c 'import SimpleITK, numpy, nibabel' 2>/dev/null \
        || die "$PY lacks SimpleITK, numpy or nibabel"
    info "python: $PY ($("$PY" -c 'import SimpleITK as s, numpy as n, nibabel as b; print(f"SimpleITK {s.Version.VersionString()}, numpy {n.__version__}, nibabel {b.__version__}")'))"
}

# synth_once PRESET DIR: generate a prep synth dataset unless DIR already holds a complete one.
synth_once() {
    local preset="$1" dir="$2"
    if [[ -f "$dir/.bench-complete" ]] && [[ "$(cat "$dir/.bench-complete")" == "$preset seed $SEED" ]]; then
        info "dataset $dir: present ($(find "$dir" -name '*.nii*' | wc -l) files, $(du -sh "$dir" | cut -f1))"
        return
    fi
    step "generating the '$preset' dataset in $dir (once; kept for later runs)"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    "$PREP" synth --out "$dir" --preset "$preset" --seed "$SEED" 2>&1 | tail -n 3
    echo "$preset seed $SEED" >"$dir/.bench-complete"
    info "$(du -sh "$dir" | cut -f1) in $dir"
}

# free_bytes DIR: bytes available on DIR's file system.
free_bytes() { df -P -B1 "$1" | awk 'NR == 2 { print $4 }'; }

# require_free DIR NEED_BYTES WHAT
require_free() {
    local dir="$1" need="$2" what="$3" have
    have=$(free_bytes "$dir")
    info "free space on $dir: $((have / 1024 ** 3)) GiB (need ~$((need / 1024 ** 3)) GiB for $what)"
    if ((have < need)); then
        die "only $((have / 1024 ** 3)) GiB free on $(df -P "$dir" | awk 'NR == 2 { print $6 }'), ~$((need / 1024 ** 3)) GiB needed for $what; free some space or set BENCH_DIR to a bigger disk"
    fi
}

mem_available_bytes() { echo $(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) * 1024)); }

# plan_outputs PLAN_JSON: from `prep build-cache --dry-run --json`, print the case count, output
# voxels and the room one run needs on disk ("N VOXELS NEED_BYTES"), and say how much memory
# the whole-volume reference will need (its largest case: the resampled float32 image, a float32
# numpy copy unless --normalize-first, then the uint8 label) beside what is available.
plan_outputs() {
    B_SITK_ARGS="$SITK_ARGS" B_MEM="$(mem_available_bytes)" "$PY" - "$1" <<'EOF'
import json, os, sys
r = json.load(open(sys.argv[1]))
plans = r["plans"]
vox = sum(p["out_voxels"] for p in plans)
out = max(sum(p["out_bytes"] for p in plans), 5 * vox)  # float32 image + uint8 label
copies = 1 if "--normalize-first" in os.environ["B_SITK_ARGS"] else 2
big = max(plans, key=lambda p: p["out_voxels"])
need = copies * 4 * big["out_voxels"] + big["out_voxels"]
avail = int(os.environ["B_MEM"])
print(f"    {len(plans)} cases, {vox / 1e6:.0f} Mvoxel out; largest {big['id']} "
      f"{'x'.join(map(str, big['out_shape_xyz']))}", file=sys.stderr)
print(f"    the SimpleITK reference will need about {need / 2**30:.1f} GiB for it; "
      f"{avail / 2**30:.1f} GiB available now", file=sys.stderr)
if need > 0.9 * avail:
    print("    WARNING: the reference may be killed for lack of memory", file=sys.stderr)
print(len(plans), vox, int(1.5 * out) + 2 * 1024**3)
EOF
}

# warm_inputs DIR: read the dataset once so every run starts with it in the page cache.
warm_inputs() {
    find "$1" -name '*.nii*' -type f -exec cat {} + >/dev/null
}

drop_caches_if_cold() {
    [[ "$BENCH_COLD" == 1 ]] || return 0
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null \
        || die "BENCH_COLD=1 but the page cache cannot be dropped here (needs root and a writable /proc/sys/vm/drop_caches)"
}

# elapsed_seconds TIMEFILE: wall clock of a /usr/bin/time -v report, in seconds.
elapsed_seconds() {
    awk -F': ' '/Elapsed \(wall clock\) time/ {
        n = split($2, p, ":"); s = 0
        for (i = 1; i <= n; i++) s = s * 60 + p[i]
        printf "%.3f\n", s }' "$1"
}

# max_rss_kb TIMEFILE
max_rss_kb() { awk -F': ' '/Maximum resident set size/ { print $2 }' "$1"; }

# RECORDS: tab-separated file of one line per tool run, appended by timed_run.
# Columns: tool round wall_s max_rss_kb bytes disk_bytes out_voxels internal_wall_s out_shapes
RECORDS=""

# timed_run TOOL ROUND OUTDIR LOGDIR -- COMMAND...: run under /usr/bin/time -v with a fresh OUTDIR,
# record the measurements, delete OUTDIR. COMMAND's stdout must end with a JSON report
# (prep --json, sitk_reference.py --json).
timed_run() {
    local tool="$1" round="$2" outdir="$3" logdir="$4"
    shift 5
    local tag="$tool.$round"
    rm -rf "$outdir"
    sync
    drop_caches_if_cold
    step "round $round: $tool"
    info "$*"
    local rc=0
    /usr/bin/time -v -o "$logdir/$tag.time" "$@" >"$logdir/$tag.out" 2>"$logdir/$tag.err" || rc=$?
    if ((rc != 0)); then
        tail -n 20 "$logdir/$tag.err" >&2
        rm -rf "$outdir"
        if grep -q 'terminated by signal 9' "$logdir/$tag.time" 2>/dev/null || ((rc == 137)); then
            die "$tool was killed (signal 9, most likely out of memory: peak RSS $(($(max_rss_kb "$logdir/$tag.time") / 1024)) MiB of $(($(mem_available_bytes) / 1024 ** 2)) MiB available now; logs: $logdir/$tag.{out,err,time})"
        fi
        die "$tool exited with status $rc (logs: $logdir/$tag.{out,err,time})"
    fi
    local wall rss bytes disk summary
    wall=$(elapsed_seconds "$logdir/$tag.time")
    rss=$(max_rss_kb "$logdir/$tag.time")
    bytes=$(du -sb "$outdir" | cut -f1)
    disk=$(du -sB1 "$outdir" | cut -f1)
    summary=$("$PY" - "$tool" "$logdir/$tag.out" <<'EOF'
import json, sys
tool, path = sys.argv[1], sys.argv[2]
text = open(path).read()
if tool == "prep":
    r = json.loads(text)
    assert r["failed"] == 0 and r["built"] == len(r["plans"]), "prep: not every case was built"
    vox, wall = r["voxels_built"], r["wall_seconds"]
    shapes = {p["id"]: p["out_shape_xyz"] for p in r["plans"]}
else:
    r = json.loads(text.strip().splitlines()[-1])
    vox, wall = r["out_voxels"], r["wall_seconds"]
    shapes = {c["id"]: c["out_shape_xyz"] for c in r["per_case"]}
print(vox, f"{wall:.3f}", json.dumps(shapes, sort_keys=True, separators=(",", ":")), sep="\t")
EOF
) || die "could not read $tool's report ($logdir/$tag.out)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$round" "$wall" "$rss" "$bytes" "$disk" "$summary" >>"$RECORDS"
    info "wall $wall s, peak RSS $((rss / 1024)) MiB, $((bytes / 1024 ** 2)) MiB written, $(cut -f1 <<<"$summary") output voxels"
    sync
    rm -rf "$outdir"
}

# bench_rounds REPEAT: run prep and the reference REPEAT times each, interleaved, the first tool
# alternating between rounds. Needs DATA, SPACING, RUN_DIR, LOG_DIR, PREP, PY.
bench_rounds() {
    local repeat="$1" r
    local prep_out="$RUN_DIR/prep-cache" sitk_out="$RUN_DIR/sitk-out"
    # shellcheck disable=SC2086
    for ((r = 1; r <= repeat; r++)); do
        local order=(prep sitk)
        ((r % 2 == 0)) && order=(sitk prep)
        for tool in "${order[@]}"; do
            if [[ $tool == prep ]]; then
                timed_run prep "$r" "$prep_out" "$LOG_DIR" -- \
                    "$PREP" build-cache "$DATA" --cache-dir "$prep_out" --spacing "$SPACING" --json -q $PREP_ARGS
            else
                timed_run sitk "$r" "$sitk_out" "$LOG_DIR" -- \
                    "$PY" "$REPO/scripts/sitk_reference.py" "$DATA" --out "$sitk_out" --spacing "$SPACING" \
                    --format "$SITK_FORMAT" --json $SITK_ARGS
            fi
        done
    done
}

# bench_report NAME EXPECT_SHAPE: print the table of medians and ratios, check that both tools
# produced the same output grids (and EXPECT_SHAPE "x,y,z" for every case when not empty), and
# append one JSON line to $BENCH_DIR/results.jsonl (with any exported BENCH_NOTE_<key> variables
# as extra "<key>" fields).
bench_report() {
    local name="$1" expect="$2"
    step "results ($name)"
    B_REPO="$REPO" B_SMALL="$BENCH_SMALL" B_DATA="$DATA" B_SPACING="$SPACING" B_REPEAT="$REPEAT" \
        B_COLD="$BENCH_COLD" B_SITK_FORMAT="$SITK_FORMAT" B_SITK_ARGS="$SITK_ARGS" \
        B_PREP_ARGS="$PREP_ARGS" \
        "$PY" - "$RECORDS" "$BENCH_DIR/results.jsonl" "$name" "$expect" <<'EOF'
import json, os, platform, statistics, subprocess, sys, time
records, results, name, expect = sys.argv[1:5]
env = os.environ
runs = {}
for line in open(records):
    tool, rnd, wall, rss, nbytes, disk, vox, iwall, shapes = line.rstrip("\n").split("\t")
    runs.setdefault(tool, []).append({
        "round": int(rnd), "wall_s": float(wall), "peak_rss_bytes": int(rss) * 1024,
        "bytes": int(nbytes), "disk_bytes": int(disk), "out_voxels": int(vox),
        "internal_wall_s": float(iwall), "shapes": json.loads(shapes)})
labels = {"prep": "prep build-cache", "sitk": "SimpleITK reference"}
ok = True
shapes = {t: rs[0]["shapes"] for t, rs in runs.items()}
if shapes.get("prep") != shapes.get("sitk"):
    diff = sorted(k for k in set(shapes["prep"]) | set(shapes["sitk"])
                  if shapes["prep"].get(k) != shapes["sitk"].get(k))
    print(f"    CHECK FAILED: output grids differ between the tools for {len(diff)} cases, e.g. "
          + ", ".join(f"{k}: prep {shapes['prep'].get(k)} vs sitk {shapes['sitk'].get(k)}" for k in diff[:3]))
    ok = False
if expect:
    want = [int(v) for v in expect.split(",")]
    for t, sh in shapes.items():
        bad = {k: v for k, v in sh.items() if v != want}
        if bad:
            print(f"    CHECK FAILED: {labels[t]} output {bad} is not {want}")
            ok = False
    if ok:
        print(f"    check: every output is {want[0]}x{want[1]}x{want[2]} voxels (both tools)")
elif ok:
    print(f"    check: both tools produced the same output grid for all {len(shapes['prep'])} cases")

summary = {}
for t, rs in runs.items():
    wall = statistics.median(r["wall_s"] for r in rs)
    vox = rs[0]["out_voxels"]
    summary[t] = {
        "runs": len(rs),
        "wall_s_median": wall,
        "peak_rss_mib_median": statistics.median(r["peak_rss_bytes"] for r in rs) / 2**20,
        "bytes": statistics.median(r["bytes"] for r in rs),
        "disk_bytes": statistics.median(r["disk_bytes"] for r in rs),
        "out_voxels": vox,
        "voxels_per_s": vox / wall if wall > 0 else None,
        "wall_s_all": [r["wall_s"] for r in rs],
        "internal_wall_s_all": [r["internal_wall_s"] for r in rs],
        "peak_rss_mib_all": [round(r["peak_rss_bytes"] / 2**20, 1) for r in rs],
    }
hdr = (f"    {'tool':<22}{'wall s':>10}{'peak RSS MiB':>14}{'output MiB':>12}{'Mvoxel/s':>11}"
       f"{'own wall s':>12}")
print(hdr)
print("    " + "-" * (len(hdr) - 4))
for t in ("prep", "sitk"):
    s = summary[t]
    print(f"    {labels[t]:<22}{s['wall_s_median']:>10.2f}{s['peak_rss_mib_median']:>14.1f}"
          f"{s['bytes'] / 2**20:>12.1f}{(s['voxels_per_s'] or 0) / 1e6:>11.1f}"
          f"{statistics.median(s['internal_wall_s_all']):>12.2f}")
p, q = summary["prep"], summary["sitk"]
ratios = {
    "wall_prep_over_sitk": p["wall_s_median"] / q["wall_s_median"],
    "rss_prep_over_sitk": p["peak_rss_mib_median"] / q["peak_rss_mib_median"],
    "bytes_prep_over_sitk": p["bytes"] / q["bytes"],
    "throughput_prep_over_sitk": (p["voxels_per_s"] or 0) / (q["voxels_per_s"] or 1),
}
print(f"    {'prep / SimpleITK':<22}{ratios['wall_prep_over_sitk']:>9.2f}x{ratios['rss_prep_over_sitk']:>13.3f}x"
      f"{ratios['bytes_prep_over_sitk']:>11.2f}x{ratios['throughput_prep_over_sitk']:>10.2f}x")
speed = q["wall_s_median"] / p["wall_s_median"]
print(f"    prep is {speed:.2f}x {'faster' if speed >= 1 else 'SLOWER'} (wall, median of "
      f"{p['runs']}/{q['runs']} runs) and uses {1 / ratios['rss_prep_over_sitk']:.1f}x "
      f"{'less' if ratios['rss_prep_over_sitk'] <= 1 else 'MORE'} peak memory than the reference")
print("    wall and peak RSS: /usr/bin/time -v, whole process (NIfTI on disk to written output,"
      " Python start-up and imports included);\n    output MiB: apparent size on disk;"
      " Mvoxel/s: output image voxels / wall; own wall s: the tool's own timer (median)")

def git(*a):
    try:
        return subprocess.run(["git", "-C", env["B_REPO"], *a], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None
line = {
    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "bench": name,
    "small": env["B_SMALL"] == "1",
    "nproc": int(subprocess.run(["nproc"], capture_output=True, text=True).stdout),
    "host": platform.node(),
    "git": git("rev-parse", "--short", "HEAD"),
    "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    "dataset": env["B_DATA"],
    "spacing": env["B_SPACING"],
    "repeat": int(env["B_REPEAT"]),
    "cold_cache": env["B_COLD"] == "1",
    "sitk_format": env["B_SITK_FORMAT"],
    "sitk_args": env["B_SITK_ARGS"],
    "prep_args": env["B_PREP_ARGS"],
    "checks_ok": ok,
    **{k[len("BENCH_NOTE_"):]: v for k, v in sorted(env.items()) if k.startswith("BENCH_NOTE_")},
    "tools": summary,
    "ratios": ratios,
}
with open(results, "a") as f:
    f.write(json.dumps(line) + "\n")
print(f"    appended to {results}")
sys.exit(0 if ok else 3)
EOF
}
