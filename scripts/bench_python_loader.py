#!/usr/bin/env python3
"""voxcache's Python patch loader beside nnU-Net v2's own data loader and MONAI's CacheDataset
pipeline, in one process, rounds alternating, on the same cases: patches per second as a
PyTorch user would get them.

    python scripts/bench_python_loader.py --cache CACHE --out DIR [--patch 32,64,64]
        [--batch 2] [--batches N] [--rounds 5] [--threads 1 [2 ...]] [--augment]
        [--nnunet-workers 0 [1 2 ...]] [--monai-workers 0 [2 ...]]

Run it with a Python that has nnunetv2 (and monai for --monai-workers) and the voxcache
package (`pip install nnunetv2 monai ./python`). DIR holds the cache's cases converted as
nnU-Net's preprocessing writes them (scripts/bench_loader_nnunet.py does the conversion, and its
docstring says what nnU-Net's side measures). Every side draws a third of each batch on
foreground and ends with torch tensors in the main process.

Without --augment every side draws raw patches: nnU-Net's generate_train_batch(),
voxcache.PatchLoader(augment=None). With --augment every side augments:
- nnU-Net: its nnUNetDataLoader draws its trainer's larger initial patch (get_patch_size with
  the 3D rotation and scale ranges) and applies nnUNetTrainer.get_training_transforms (no deep
  supervision, mirroring on every axis). `--nnunet-workers 0` calls it in this process, as
  nnU-Net's trainer does with nnUNet_n_proc_DA=0; N > 0 runs it in N worker processes through
  the NonDetMultiThreadedAugmenter the trainer builds (num_cached max(6, N // 2)).
- MONAI: a CacheDataset of the cases in memory (padded to the patch, foreground and background
  indices precomputed: the cached, deterministic part), then RandCropByPosNegLabeld (pos 1,
  neg 2) and the random transforms closest to nnU-Net's defaults (scripts/monai_augment.py);
  monai.data.DataLoader with N workers (`--monai-workers N`).
- voxcache: PatchLoader(augment="default", threads=T) for each T of --threads: nnU-Net's
  default augmentation as voxcache implements it, built by Rust threads in this process.
Worker processes and loader threads keep filling their queues while other sides are timed
(nnU-Net's two queues of max(6, N // 2) batches, MONAI's 2 a worker, ours 4, plus one a
worker or thread), so each round first draws that many batches untimed: the timed batches are made while they are waited for. Prints each round, then the medians, the ratios of ours at T
threads against each side using T cores (T = its workers, at least 1), and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # every side's workers single-threaded, as ours
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader_nnunet as nn  # noqa: E402  (exits naming what to install without nnunetv2)
import monai_augment  # noqa: E402

try:
    import voxcache
except ImportError as e:
    nn.fail(f"{e}; install the package: pip install ./python")

ROTATION = (-30.0 / 360 * 2 * nn.np.pi, 30.0 / 360 * 2 * nn.np.pi)


def nnunet_side(out: Path, patch, batch: int, augment: bool, workers: int):
    ds = nn.nnUNetDatasetBlosc2(str(out))
    lm = nn.LabelManager({"background": 0, "vessel": 1}, regions_class_order=None)
    initial, transforms = patch, None
    if augment:
        from nnunetv2.training.data_augmentation.compute_initial_patch_size import get_patch_size
        from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

        initial = tuple(int(v) for v in get_patch_size(patch, ROTATION, ROTATION, ROTATION, (0.85, 1.25)))
        transforms = nnUNetTrainer.get_training_transforms(
            patch, ROTATION, None, (0, 1, 2), False, use_mask_for_norm=[False], is_cascaded=False,
            foreground_labels=[1], regions=None, ignore_label=None)
    dl = nn.nnUNetDataLoader(ds, batch, initial, patch, lm, oversample_foreground_percent=0.33,
                             transforms=transforms)
    if workers == 0:
        return dl.generate_train_batch, None, 0
    from batchgenerators.dataloading.nondet_multi_threaded_augmenter import NonDetMultiThreadedAugmenter

    gen = NonDetMultiThreadedAugmenter(data_loader=dl, transform=None, num_processes=workers,
                                       num_cached=max(6, workers // 2), seeds=None, pin_memory=False,
                                       wait_time=0.002)
    return (lambda: next(gen)), gen._finish, 2 * max(6, workers // 2) + workers  # two queues


def monai_side(cache: Path, patch, batch: int, augment: bool, workers: int):
    try:
        import monai
        from monai import transforms as mt
    except ImportError as e:
        nn.fail(f"{e}; --monai-workers needs `pip install monai`")
    import zarr

    data = []
    for _, entry in nn.cache_cases(cache, None):
        g = zarr.open_group(str(entry), mode="r")
        image = nn.np.asarray(g["image"][...], dtype=nn.np.float32)
        data.append({"image": image if image.ndim == 4 else image[None],
                     "label": nn.np.asarray(g["label"][...]).astype(nn.np.int16)[None]})
    keys = ["image", "label"]
    steps = [mt.EnsureTyped(keys=keys), mt.SpatialPadd(keys=keys, spatial_size=patch),
             mt.FgBgToIndicesd(keys="label", fg_postfix="_fg", bg_postfix="_bg"),
             mt.RandCropByPosNegLabeld(keys=keys, label_key="label", spatial_size=patch, pos=1, neg=2,
                                       num_samples=1, fg_indices_key="label_fg", bg_indices_key="label_bg")]
    if augment:
        steps += monai_augment.nnunet_like(mt, keys)
    steps.append(mt.SelectItemsd(keys=keys))
    monai.utils.set_determinism(seed=1234)
    ds = monai.data.CacheDataset(data, transform=mt.Compose(steps), cache_rate=1.0, num_workers=1,
                                 progress=False)
    # Cases drawn with replacement (as nnU-Net's loader draws them), one endless epoch.
    sampler = nn.torch.utils.data.RandomSampler(ds, replacement=True, num_samples=1 << 40)
    it = iter(monai.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers))
    return (lambda: next(it)), None, 3 * workers  # prefetch 2 a worker, 1 in hand


def ours_side(cache: Path, patch, batch: int, augment: bool, threads: int):
    it = iter(voxcache.PatchLoader(str(cache), patch, batch, augment="default" if augment else None,
                                   threads=threads, seed=1234))

    def draw():
        b = next(it)
        return nn.torch.from_numpy(b["image"]), nn.torch.from_numpy(b["label"])

    return draw, None, 4 + threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="voxcache cache folder")
    ap.add_argument("--out", required=True, help="folder for nnU-Net's preprocessed files")
    ap.add_argument("--patch", default="32,64,64", help="z,y,x")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batches", type=int, default=200, help="batches per round and side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="voxcache loader threads (one side each)")
    ap.add_argument("--nnunet-workers", type=int, nargs="*", default=[0],
                    help="nnU-Net augmentation processes (0: in this process), one side each")
    ap.add_argument("--monai-workers", type=int, nargs="*", default=[],
                    help="MONAI DataLoader workers, one side each (none: no MONAI side)")
    ap.add_argument("--augment", action="store_true", help="nnU-Net's default augmentation on every side")
    a = ap.parse_args()
    patch = tuple(int(v) for v in a.patch.split(","))
    if len(patch) != 3 or min(patch) < 1 or min(a.batch, a.batches, a.rounds, *a.threads) < 1:
        nn.fail("--patch wants z,y,x; --batch, --batches, --rounds and --threads positive")
    if min(a.nnunet_workers + a.monai_workers, default=0) < 0:
        nn.fail("--nnunet-workers and --monai-workers take counts >= 0")
    if not a.augment and any(a.nnunet_workers):
        nn.fail("--nnunet-workers above 0 needs --augment (nnU-Net's workers run its transforms)")
    cache, out = Path(a.cache), Path(a.out)
    nn.torch.set_num_threads(1)
    nn.convert(nn.cache_cases(cache, None), out, patch, nn.np.int16)

    sides, closers, cores, depth = {}, [], {}, {}
    nn.np.random.seed(1234)
    for w in a.nnunet_workers:
        name = "nnU-Net in-process" if w == 0 else f"nnU-Net {w} worker{'s' * (w > 1)}"
        sides[name], close, depth[name] = nnunet_side(out, patch, a.batch, a.augment, w)
        cores[name] = max(w, 1)
        closers.append(close)
    for w in a.monai_workers:
        name = f"MONAI {w} worker{'s' * (w != 1)}"
        sides[name], close, depth[name] = monai_side(cache, patch, a.batch, a.augment, w)
        cores[name] = max(w, 1)
    for t in a.threads:
        name = f"voxcache {t} thread{'s' * (t > 1)}"
        sides[name], _, depth[name] = ours_side(cache, patch, a.batch, a.augment, t)
        cores[name] = t
    for draw in sides.values():  # warm up: workers started, first batches made
        for _ in range(5):
            draw()

    def timed(name: str) -> float:
        draw = sides[name]
        for _ in range(depth[name]):  # what the queue made while other sides ran
            draw()
        t0 = time.perf_counter()
        for _ in range(a.batches):
            draw()
        return a.batches * a.batch / (time.perf_counter() - t0)

    rates = {k: [] for k in sides}
    try:
        for r in range(a.rounds):
            for k in sides:
                rates[k].append(timed(k))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()) + " patches/s",
                  flush=True)
    finally:
        for close in closers:
            if close:
                close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios = {}
    for k, c in cores.items():
        ours = f"voxcache {c} thread{'s' * (c > 1)}"
        if not k.startswith("voxcache") and ours in med:
            ratios[f"{ours} / {k}"] = round(med[ours] / med[k], 2)
    print(f"median patches/s, patch {list(patch)}, batch {a.batch}, augmentation "
          f"{'on' if a.augment else 'off'}: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
    for k, v in ratios.items():
        print(f"  {k}: {v:.1f}x")
    versions = {"nnunetv2": nn.version("nnunetv2")}
    if a.monai_workers:
        versions["monai"] = nn.version("monai")
    print(json.dumps({
        **versions, "patch": list(patch), "batch": a.batch, "augment": a.augment,
        "rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "median_patches_per_s": {k: round(v, 1) for k, v in med.items()}, "ratios": ratios,
    }))


if __name__ == "__main__":
    main()
