#!/usr/bin/env python3
"""Host memory of voxcache's Python loader under torchrun, against the world size: W ranks
(torch.distributed on the gloo backend, CPU), each with its own PatchLoader drawing its share of
every step's batch, the ranks' process tree sampled for its proportional set size.

    python scripts/bench_python_ranks.py --cache CACHE [--worlds 1,2,4] [--steps 200]
        [--patch 32,96,96] [--batch 2] [--threads 2] [--augment default]

Run it with a Python that has torch and the voxcache package (`pip install torch ./python`).
For each world size it starts `python -m torch.distributed.run --standalone --nproc_per_node W`
on this script's worker: each rank opens the cache, iterates `--steps` batches of `--batch`
patches (its share of the batch of batch x W that one process would draw), hands each to torch
(`torch.from_numpy`, no copy) and all-reduces a checksum every 10 steps over gloo, so the
process group is in use. Meanwhile the parent reads /proc/PID/smaps of every process in the tree
every 0.1 s and keeps the peaks, summed over the ranks, of: their anonymous PSS (each rank's
interpreter, torch and the loader's buffers), the PSS of their mappings of the cache's files (a
page mapped by W ranks counts 1/W in each, so the sum is the cache pages in memory once) and of
other files (shared libraries); and the launcher's whole PSS. A baseline run first: one rank
that imports torch and voxcache and joins the process group but makes no loader, so a rank's
anonymous PSS above it is the loader's. Prints one line per world size and
one JSON line. The cache's pages are not copied per rank: their PSS does not grow with W.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import voxcache

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.steps == 0:
        # The baseline: an interpreter with torch, voxcache and a process group, no loader.
        time.sleep(2.0)
        dist.barrier()
        if rank == 0:
            print(json.dumps({"world": world, "seconds": 0.0, "patches_per_s": 0.0}), flush=True)
        dist.destroy_process_group()
        return
    patch = tuple(int(v) for v in a.patch.split(","))
    augment = None if a.augment == "none" else a.augment
    loader = voxcache.PatchLoader(a.cache, patch_size=patch, batch_size=a.batch, augment=augment,
                                  threads=a.threads, seed=0, steps=a.steps)
    assert (loader.rank, loader.world_size) == (rank, world)
    check = torch.zeros(1, dtype=torch.float64)
    start = time.perf_counter()
    for i, b in enumerate(loader):
        image = torch.from_numpy(b["image"])
        check += image.double().sum()
        if i % 10 == 9:
            dist.all_reduce(check)
    dist.barrier()
    took = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"world": world, "seconds": took,
                          "patches_per_s": a.steps * a.batch * world / took}), flush=True)
    dist.destroy_process_group()


def tree(root: int) -> list:
    """The pids of `root` and its descendants."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def usage(pid: int, cache: str) -> dict:
    """One process's proportional set size, bytes: anonymous, file-backed, and the part of the
    file-backed that maps the cache's files (empty once the process is gone)."""
    out = {"anon": 0, "file": 0, "cache": 0}
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(maxsplit=6)
                if first and "-" in first[0] and not first[0].endswith(":"):
                    # A mapping's header: "start-end perms offset dev inode [path]".
                    path = first[5].strip() if len(first) > 5 else ""
                    kind = ("anon" if first[4] == "0" else
                            "cache" if path.startswith(cache) else "file")
                elif line.startswith("Pss:"):
                    out[kind] += int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "other"
    # The launcher's command line names torch.distributed.run (and passes --worker on).
    if b"torch.distributed.run" in args:
        return "launcher"
    return "rank" if b"--worker" in args else "other"


def measure(a: argparse.Namespace, world: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={world}", __file__, "--worker", "--cache", a.cache,
           "--steps", str(a.steps), "--patch", a.patch, "--batch", str(a.batch),
           "--threads", str(a.threads), "--augment", a.augment]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    cache = os.path.realpath(a.cache)
    keys = ("rank_anon", "rank_file", "cache", "launcher")
    peak = dict.fromkeys(keys, 0)
    while proc.poll() is None:
        now = dict.fromkeys(keys, 0)
        for pid in tree(proc.pid):
            u = usage(pid, cache)
            if not u:
                continue
            who = role(pid)
            if who == "rank":
                now["rank_anon"] += u["anon"]
                now["rank_file"] += u["file"]
                now["cache"] += u["cache"]
            elif who == "launcher":
                now["launcher"] += u["anon"] + u["file"]
        for k in keys:
            peak[k] = max(peak[k], now[k])
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"world size {world}: torchrun failed ({proc.returncode}):\n{err[-3000:]}")
    line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
    result = json.loads(line)
    result.update({f"peak_{k}_mib": v / MIB for k, v in peak.items()})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="voxcache cache folder")
    ap.add_argument("--worlds", default="1,2,4", help="world sizes to run")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--patch", default="32,96,96", help="z,y,x")
    ap.add_argument("--batch", type=int, default=2, help="patches per rank")
    ap.add_argument("--threads", type=int, default=2, help="loader threads per rank")
    ap.add_argument("--augment", default="default", help="default or none")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    try:
        import torch  # noqa: F401
        import voxcache  # noqa: F401
    except ImportError as e:
        sys.exit(f"{e}: run with a Python that has torch and voxcache (pip install torch ./python)")
    if not Path(a.cache, "manifest.json").is_file():
        sys.exit(f"{a.cache}: not a voxcache cache (no manifest.json)")
    base = measure(argparse.Namespace(**{**vars(a), "steps": 0}), 1)
    print(f"baseline (one rank, torch and voxcache imported, no loader): anonymous PSS "
          f"{base['peak_rank_anon_mib']:.0f} MiB", flush=True)
    rows = []
    for w in (int(v) for v in a.worlds.split(",")):
        r = measure(a, w)
        rows.append(r)
        print(f"world {w}: ranks' anonymous PSS {r['peak_rank_anon_mib']:.0f} MiB "
              f"({r['peak_rank_anon_mib'] / w:.0f} a rank), the cache's pages "
              f"{r['peak_cache_mib']:.0f} MiB, other files (libraries) "
              f"{r['peak_rank_file_mib']:.0f} MiB, the launcher {r['peak_launcher_mib']:.0f} MiB; "
              f"{r['patches_per_s']:.1f} patches/s", flush=True)
    print(json.dumps({"cache": a.cache, "baseline": base, "patch": a.patch, "batch_per_rank": a.batch,
                      "steps": a.steps, "threads": a.threads, "augment": a.augment, "runs": rows}))


if __name__ == "__main__":
    main()
