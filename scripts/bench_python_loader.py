#!/usr/bin/env python3
"""voxcache's Python patch loader beside nnU-Net v2's own data loader, in one process, rounds
alternating, on the same cases: patches per second as a PyTorch user would get them.

    python scripts/bench_python_loader.py --cache CACHE --out DIR [--patch 32,64,64]
        [--batch 2] [--batches N] [--rounds 5] [--threads 1] [--augment]

Run it with a Python that has nnunetv2 and the voxcache package (`pip install nnunetv2
./python`). DIR holds the cache's cases converted as nnU-Net's preprocessing writes them
(scripts/bench_loader_nnunet.py does the conversion, and its docstring says what nnU-Net's
side measures). Both sides draw raw patches (no augmentation) with a third of each batch on
foreground, and hand numpy arrays to Python: nnU-Net's generate_train_batch() on one thread,
voxcache.PatchLoader(augment=None, threads=--threads) whose Rust threads build the batches
while Python waits with the GIL released. Prints each round, then the medians, their ratio and
one JSON line.

With --augment both sides augment: nnU-Net's nnUNetDataLoader draws its larger initial patch
(get_patch_size with the rotation and scale ranges its trainer uses for a 3D patch) and applies
nnUNetTrainer.get_training_transforms (no deep supervision, mirroring on every axis) inside
generate_train_batch() on one thread; voxcache.PatchLoader(augment="default") applies nnU-Net's
default augmentation as voxcache implements it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader_nnunet as nn  # noqa: E402  (exits naming what to install without nnunetv2)

try:
    import voxcache
except ImportError as e:
    nn.fail(f"{e}; install the package: pip install ./python")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="voxcache cache folder")
    ap.add_argument("--out", required=True, help="folder for nnU-Net's preprocessed files")
    ap.add_argument("--patch", default="32,64,64", help="z,y,x")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batches", type=int, default=200, help="batches per round and side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="voxcache loader threads")
    ap.add_argument("--augment", action="store_true", help="nnU-Net's default augmentation on both sides")
    a = ap.parse_args()
    patch = tuple(int(v) for v in a.patch.split(","))
    if len(patch) != 3 or min(patch) < 1 or min(a.batch, a.batches, a.rounds, a.threads) < 1:
        nn.fail("--patch wants z,y,x; --batch, --batches, --rounds and --threads positive")
    out = Path(a.out)
    nn.torch.set_num_threads(1)
    nn.convert(nn.cache_cases(Path(a.cache), None), out, patch, nn.np.int16)

    ds = nn.nnUNetDatasetBlosc2(str(out))
    lm = nn.LabelManager({"background": 0, "vessel": 1}, regions_class_order=None)
    initial, transforms = patch, None
    if a.augment:
        from nnunetv2.training.data_augmentation.compute_initial_patch_size import get_patch_size
        from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

        rotation = (-30.0 / 360 * 2 * nn.np.pi, 30.0 / 360 * 2 * nn.np.pi)
        initial = tuple(int(v) for v in get_patch_size(patch, rotation, rotation, rotation, (0.85, 1.25)))
        transforms = nnUNetTrainer.get_training_transforms(
            patch, rotation, None, (0, 1, 2), False, use_mask_for_norm=[False], is_cascaded=False,
            foreground_labels=[1], regions=None, ignore_label=None)
    theirs = nn.nnUNetDataLoader(ds, a.batch, initial, patch, lm, oversample_foreground_percent=0.33,
                                 transforms=transforms)
    nn.np.random.seed(1234)
    ours = iter(voxcache.PatchLoader(a.cache, patch, a.batch, augment="default" if a.augment else None,
                                     threads=a.threads, seed=1234))
    for _ in range(5):
        theirs.generate_train_batch()
        next(ours)

    def timed(draw) -> float:
        t0 = time.perf_counter()
        for _ in range(a.batches):
            draw()
        return a.batches * a.batch / (time.perf_counter() - t0)

    rates = {"nnunet": [], "voxcache": []}
    for r in range(a.rounds):
        rates["nnunet"].append(timed(theirs.generate_train_batch))
        rates["voxcache"].append(timed(lambda: next(ours)))
        print(f"round {r + 1}: nnU-Net {rates['nnunet'][-1]:.1f}, voxcache "
              f"{rates['voxcache'][-1]:.1f} patches/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median: nnU-Net {med['nnunet']:.1f}, voxcache {med['voxcache']:.1f} patches/s "
          f"({med['voxcache'] / med['nnunet']:.1f}x), patch {list(patch)}, batch {a.batch}, "
          f"voxcache threads {a.threads}, augmentation {'on' if a.augment else 'off'}")
    print(json.dumps({
        "nnunetv2": nn.version("nnunetv2"), "patch": list(patch), "batch": a.batch,
        "threads": a.threads, "augment": a.augment, "rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "median_patches_per_s": {k: round(v, 1) for k, v in med.items()},
        "ratio": round(med["voxcache"] / med["nnunet"], 2),
    }))


if __name__ == "__main__":
    main()
