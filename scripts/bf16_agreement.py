#!/usr/bin/env python3
"""How far `predict --precision bf16` lands from f32: the same model on the same inputs, once in
f32 (with its class probabilities) and once in bf16; per case the share of voxels whose label
differs, and for those the gap between the two most likely classes in f32 (a near tie is a gap
under --tie).

    python scripts/bf16_agreement.py --model RUN_DIR INPUT... [--bin target/release]
        [--work DIR] [--tie 0.1] [--time] [-- PREDICT_OPTIONS...]

RUN_DIR is a run folder made by `train`; an nnU-Net model is given as `--nnunet-model DIR`
after `--`, with RUN_DIR then ignored (give `-`). Runs with a Python that has numpy, nibabel and
zarr (scripts/python_env.sh makes one). Prints a line a case, the totals and one JSON line.
With --time each run goes under GNU time (/usr/bin/time -v): its wall time and peak RSS are
printed too (the f32 run also writes its probabilities, so it is not plain f32's cost).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np


def predict(a, out: Path, precision: str, probabilities: bool) -> dict:
    """Runs predict; with --time, its wall seconds and peak RSS (MiB) by GNU time."""
    cmd = [str(Path(a.bin) / "predict"), *a.inputs, "--out", str(out), "--precision", precision,
           "-q"]
    if a.model != "-":
        cmd += ["--model", a.model]
    if probabilities:
        cmd.append("--save-probabilities")
    cmd += a.rest
    report = out.parent / f"{out.name}.time"
    if a.time:
        cmd = ["/usr/bin/time", "-v", "-o", str(report), *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\nfailed ({done.returncode}):\n{done.stderr[-3000:]}")
    if not a.time:
        return {}
    cost = {}
    for line in report.read_text().splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key == "Maximum resident set size (kbytes)":
            cost["peak_rss_mib"] = round(int(value) / 1024)
        elif key.startswith("Elapsed (wall clock) time"):
            seconds = 0.0
            for part in value.split(":"):
                seconds = seconds * 60 + float(part)
            cost["wall_s"] = round(seconds, 1)
    print(f"{precision}: {cost}", flush=True)
    return cost


def probabilities(folder: Path, case: str):
    """The f32 run's class probabilities (class, z, y, x), ours or nnU-Net's files."""
    zarr_dir = folder / f"{case}.probabilities.zarr"
    if zarr_dir.is_dir():
        import zarr
        return np.asarray(zarr.open_array(str(zarr_dir), mode="r")[:], dtype=np.float32)
    npz = folder / f"{case}.npz"
    if npz.is_file():
        return np.load(npz)["probabilities"].astype(np.float32)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="run folder, or - with --nnunet-model after --")
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--work", default="/tmp/voxcache-bf16-agreement")
    ap.add_argument("--tie", type=float, default=0.1, help="a near tie: top-2 gap under this")
    ap.add_argument("--time", action="store_true", help="each run's wall time and peak RSS")
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.rest = rest
    work = Path(a.work)
    f32, bf16 = work / "f32", work / "bf16"
    work.mkdir(parents=True, exist_ok=True)
    costs = {"f32": predict(a, f32, "f32", True), "bf16": predict(a, bf16, "bf16", False)}
    total = differ = ties = 0
    worst_gap = 0.0
    rows = []
    for seg in sorted(f32.glob("*.nii.gz")):
        case = seg.name[: -len(".nii.gz")]
        x = np.asarray(nib.load(seg).dataobj)
        y = np.asarray(nib.load(bf16 / seg.name).dataobj)
        mask = x != y
        n, d = x.size, int(mask.sum())
        gaps = np.array([])
        p = probabilities(f32, case)
        if p is not None and d:
            # The probabilities are (class, z, y, x); the NIfTI's array is (x, y, z).
            top = np.sort(p, axis=0)
            gap = (top[-1] - top[-2]).transpose(2, 1, 0)
            gaps = gap[mask]
        near = int((gaps < a.tie).sum()) if gaps.size else 0
        worst = float(gaps.max()) if gaps.size else 0.0
        total, differ, ties = total + n, differ + d, ties + near
        worst_gap = max(worst_gap, worst)
        rows.append({"case": case, "voxels": n, "differ": d, "near_ties": near, "worst_gap": worst})
        print(f"{case}: {100 * (1 - d / n):.4f}% of {n} voxels equal; {d} differ, {near} of them "
              f"near ties (f32 top-2 gap < {a.tie}); largest gap {worst:.4f}", flush=True)
    print(f"all: {100 * (1 - differ / max(total, 1)):.4f}% of {total} voxels equal; {differ} "
          f"differ, {ties} near ties; largest gap {worst_gap:.4f}")
    print(json.dumps({"equal_share": 1 - differ / max(total, 1), "voxels": total, "differ": differ,
                      "near_ties": ties, "tie": a.tie, "worst_gap": worst_gap, "cases": rows,
                      "costs": costs}))


if __name__ == "__main__":
    main()
