#!/usr/bin/env python3
"""The user story's memory, from Python: a MiniVess-like set resampled to one spacing, fed as
augmented training patches by voxcache's PatchLoader and by MONAI's CacheDataset pipeline,
each in a process of its own, with the proportional set size (PSS) of each process tree
sampled as it runs.

    python scripts/bench_python_pss.py --data DIR --cache CACHE --spacing 1,1,1
        [--patch 16,128,128] [--batch 2] [--iterations 1000] [--every 100]
        [--threads 4] [--workers 4] [--cap-gb 16] [--side voxcache monai]

DIR is a dataset in nnU-Net's layout (`prep synth --preset minivess --out DIR` makes the
MiniVess-like one, the 4.97 um outlier included). --spacing is x,y,z in the files' unit, as
`prep build-cache --spacing` and MONAI's Spacingd take it.

- voxcache: the cache at CACHE (built by voxcache.build_cache(DIR, CACHE, spacing=...) when it
  is missing), opened with voxcache.open(mapped_mib=--mapped-mib), then
  PatchLoader(augment="default", threads=--threads) for --iterations batches, each handed to
  torch.from_numpy. The cache's pages the reads map are file-backed PSS: clean page cache the
  kernel reclaims first, but counted; --mapped-mib bounds them.
- MONAI: LoadImaged, EnsureChannelFirstd, Spacingd to the same spacing (bilinear image, nearest
  label), NormalizeIntensityd (z-score of the nonzero voxels, as voxcache's default), SpatialPadd
  to the patch, cached by CacheDataset (cache_rate 1, --workers threads), then
  RandCropByPosNegLabeld (pos 1, neg 2) and the random transforms closest to nnU-Net's
  defaults (scripts/monai_augment.py), DataLoader with --workers worker processes, cases drawn
  with replacement, for --iterations batches.

The parent samples every process of a side's tree (/proc/PID/smaps_rollup: Pss, and its
anonymous part) every 0.2 s and at every --every-th batch, and stops a side whose tree passes
--cap-gb (so that a pipeline that needs more than the machine has ends with a figure, not with
the OOM killer choosing what to kill). Prints a table of PSS at each mark, the peak, whether
the curve from batch 100 to the last is flat (within 5%), and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_python_ranks import tree  # noqa: E402  (a process and its descendants)


def tree_pss(root: int) -> tuple:
    """(PSS, anonymous PSS) of `root`'s process tree, bytes."""
    total = anon = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                    elif line.startswith("Pss_Anon:"):
                        anon += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total, anon


def cases(data: Path) -> list:
    images = sorted((data / "imagesTr").glob("*_0000.nii*"))
    if not images:
        sys.exit(f"bench_python_pss: error: {data}/imagesTr holds no *_0000.nii(.gz) files")
    out = []
    for img in images:
        case = img.name.split("_0000.nii")[0]
        labels = list((data / "labelsTr").glob(f"{case}.nii*"))
        if not labels:
            sys.exit(f"bench_python_pss: error: no label for {img} in {data}/labelsTr")
        out.append({"image": str(img), "label": str(labels[0])})
    return out


def run_voxcache(a: argparse.Namespace, say) -> None:
    import torch  # noqa: F401  (imported on both sides: the same baseline)
    import voxcache

    say("phase iterating")
    patch = tuple(int(v) for v in a.patch.split(","))
    cache = voxcache.open(a.cache, mapped_mib=a.mapped_mib)
    # Endless, so that the last mark is taken with the threads still at work.
    loader = voxcache.PatchLoader(cache, patch, a.batch, augment="default", threads=a.threads, seed=0)
    for i, b in enumerate(loader):
        torch.from_numpy(b["image"])
        if (i + 1) % a.every == 0:
            say(f"batch {i + 1}")
        if i + 1 == a.iterations:
            time.sleep(1.0)  # the last mark is sampled with the loader still open
            break


def run_monai(a: argparse.Namespace, say) -> None:
    import torch
    from monai import data as md
    from monai import transforms as mt

    import monai_augment

    keys = ["image", "label"]
    spacing = tuple(float(v) for v in a.spacing.split(","))
    # MONAI's arrays are the files' (x, y, z) axes; the patch is given z, y, x.
    patch_xyz = tuple(int(v) for v in reversed(a.patch.split(",")))
    steps = [
        mt.LoadImaged(keys=keys), mt.EnsureChannelFirstd(keys=keys),
        mt.Spacingd(keys=keys, pixdim=spacing, mode=("bilinear", "nearest")),
        mt.NormalizeIntensityd(keys="image", nonzero=True, channel_wise=True),
        mt.SpatialPadd(keys=keys, spatial_size=patch_xyz),
        mt.RandCropByPosNegLabeld(keys=keys, label_key="label", spatial_size=patch_xyz, pos=1,
                                  neg=2, num_samples=1),
    ] + monai_augment.nnunet_like(mt, keys) + [mt.SelectItemsd(keys=keys)]
    say("phase caching")
    ds = md.CacheDataset(cases(Path(a.data)), transform=mt.Compose(steps), cache_rate=1.0,
                         num_workers=a.workers, progress=False)
    # More samples than drawn, so that the last mark is taken with the workers still at work.
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=2 * a.iterations * a.batch)
    say("phase iterating")
    loader = md.DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers)
    for i, _ in enumerate(loader):
        if (i + 1) % a.every == 0:
            say(f"batch {i + 1}")
        if i + 1 == a.iterations:
            time.sleep(1.0)  # the last mark is sampled with the loader still open
            break


def child(a: argparse.Namespace) -> None:
    def say(msg: str) -> None:
        print(msg, flush=True)

    {"voxcache": run_voxcache, "monai": run_monai}[a.role](a, say)
    say("done")


def measure(a: argparse.Namespace, side: str) -> dict:
    cmd = [sys.executable, __file__, "--role", side] + sys.argv[1:]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    rec = {"side": side, "marks": [], "peak_pss": 0, "peak_anon": 0, "phase": "starting",
           "stopped": None}
    cap = a.cap_gb * 2 ** 30
    t0 = time.perf_counter()

    def sample() -> tuple:
        pss, anon = tree_pss(p.pid)
        rec["peak_pss"] = max(rec["peak_pss"], pss)
        rec["peak_anon"] = max(rec["peak_anon"], anon)
        if pss > cap and rec["stopped"] is None:
            rec["stopped"] = f"PSS {pss / 2 ** 30:.1f} GiB passed the cap while {rec['phase']}"
            for pid in reversed(tree(p.pid)):
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        return pss, anon

    def poll() -> None:
        while p.poll() is None:
            sample()
            time.sleep(0.2)

    threading.Thread(target=poll, daemon=True).start()
    for line in p.stdout:
        line = line.strip()
        if line.startswith("phase "):
            rec["phase"] = line[6:]
        elif line.startswith("batch "):
            pss, anon = sample()
            rec["marks"].append({"batch": int(line[6:]), "seconds": round(time.perf_counter() - t0, 1),
                                 "pss_mib": round(pss / 2 ** 20, 1), "anon_mib": round(anon / 2 ** 20, 1)})
            print(f"  {side}: batch {line[6:]}, PSS {pss / 2 ** 20:.0f} MiB "
                  f"(anonymous {anon / 2 ** 20:.0f})", flush=True)
    p.wait()
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    rec["returncode"] = p.returncode
    after = [m["pss_mib"] for m in rec["marks"] if m["batch"] >= 100]
    if len(after) >= 2:
        rec["flat_within"] = round(max(after) / min(after) - 1, 4)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="dataset folder (nnU-Net layout)")
    ap.add_argument("--cache", required=True, help="voxcache cache folder (built if missing)")
    ap.add_argument("--spacing", required=True, help="target spacing x,y,z in the files' unit")
    ap.add_argument("--patch", default="16,128,128", help="z,y,x")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100, help="sample PSS every N batches")
    ap.add_argument("--threads", type=int, default=4, help="voxcache loader threads")
    ap.add_argument("--mapped-mib", type=int, default=None,
                    help="voxcache.open(mapped_mib=): the cache's mapped pages kept resident (default: the kernel's)")
    ap.add_argument("--workers", type=int, default=4, help="MONAI caching threads and DataLoader workers")
    ap.add_argument("--cap-gb", type=float, default=16.0, help="stop a side whose tree PSS passes this")
    ap.add_argument("--side", nargs="+", default=["voxcache", "monai"], choices=["voxcache", "monai"])
    ap.add_argument("--role", choices=["voxcache", "monai"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if min(a.batch, a.iterations, a.every, a.threads) < 1 or a.workers < 0:
        sys.exit("bench_python_pss: error: --batch, --iterations, --every and --threads must be positive")
    if a.role:
        return child(a)
    if "voxcache" in a.side and not (Path(a.cache) / "manifest.json").is_file():
        import voxcache

        t = time.perf_counter()
        report = voxcache.build_cache(a.data, a.cache, spacing=a.spacing, jobs=0)
        print(f"built {a.cache}: {report.get('built')} entries in {time.perf_counter() - t:.0f} s", flush=True)
    results = []
    for side in a.side:
        print(f"{side}:", flush=True)
        r = measure(a, side)
        results.append(r)
        last = r["marks"][-1]["pss_mib"] if r["marks"] else None
        print(f"{side}: {len(r['marks']) * a.every} batches in {r['seconds']} s, peak PSS "
              f"{r['peak_pss'] / 2 ** 20:.0f} MiB (anonymous {r['peak_anon'] / 2 ** 20:.0f}), last mark "
              f"{last} MiB, flat within {r.get('flat_within')}"
              + (f"; stopped: {r['stopped']}" if r["stopped"] else ""), flush=True)
    print(json.dumps({"spacing": a.spacing, "patch": a.patch, "batch": a.batch,
                      "iterations": a.iterations, "threads": a.threads, "workers": a.workers,
                      "cap_gb": a.cap_gb, "results": results}))


if __name__ == "__main__":
    main()
