#!/usr/bin/env python3
"""voxcache.torch.PatchDataset under PyTorch's DataLoader, checked by hand (torch is kept out
of CI): the batches with no workers are PatchLoader's bit for bit; with 2 workers, under fork
and under spawn, every worker draws its own reproducible stream, the two start methods give the
same batches, and none hangs; for_train gives the run's batches and refuses workers.

    python scripts/torch_dataset_check.py [--cache CACHE]

Run it with a Python that has torch and the voxcache package (`pip install torch ./python`).
Without --cache it builds the bundled dataset's cache in a temporary folder. Prints one line a
check and exits 1 on the first that fails.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def digest(image, label) -> str:
    """A batch's fingerprint from its numpy arrays (the label as int64, as the dataset gives it)."""
    h = hashlib.sha256(image.tobytes())
    h.update(label.astype("int64").tobytes())
    return h.hexdigest()[:16]


def run(dataset, workers: int, context=None) -> list:
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=None, num_workers=workers,
                        multiprocessing_context=context, timeout=120 if workers else 0)
    return [(b["step"], digest(b["image"].numpy(), b["label"].numpy())) for b in loader]


def check(ok: bool, what: str) -> None:
    print(f"{'ok' if ok else 'FAILED'}: {what}", flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="a voxcache cache (default: the bundled data's, built here)")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401

        import voxcache
        from voxcache.torch import PatchDataset
    except ImportError as e:
        sys.exit(f"{e}: run with a Python that has torch and voxcache (pip install torch ./python)")
    tmp = tempfile.TemporaryDirectory()
    cache = a.cache
    if cache is None:
        cache = str(Path(tmp.name) / "cache")
        voxcache.build_cache(ROOT / "data" / "vessels", cache, jobs=2)
    options = dict(patch_size=(16, 32, 32), batch_size=2, augment="default", threads=2, seed=5,
                   steps=12)

    plain = [(b["step"], digest(b["image"], b["label"]))
             for b in voxcache.PatchLoader(cache, **options)]
    check(run(PatchDataset(cache, **options), 0) == plain,
          "no workers: PatchLoader's 12 batches, bit for bit")

    fork = run(PatchDataset(cache, **options), 2, "fork")
    spawn = run(PatchDataset(cache, **options), 2, "spawn")
    check(len(fork) == 12 and len(spawn) == 12, "2 workers: 12 batches in all (6 each)")
    check(sorted(fork) == sorted(spawn), "fork and spawn give the same batches")
    check(sorted(fork) == sorted(run(PatchDataset(cache, **options), 2, "fork")),
          "2 workers: the same batches again")
    check(not set(d for _, d in fork) & set(d for _, d in plain),
          "each worker draws a stream of its own, not the single process's")

    args = ["--steps", "4", "--patch", "16,32,32", "--fold", "0", "--seed", "3"]
    want = [(b["step"], digest(b["image"], b["label"]))
            for b in voxcache.PatchLoader.for_train(cache, args)]
    check(run(PatchDataset.for_train(cache, args), 0) == want,
          "for_train: the run's 4 batches through the DataLoader")
    try:
        run(PatchDataset.for_train(cache, args), 2, "fork")
        refused = False
    except RuntimeError as e:
        refused = "num_workers=0" in str(e)
    check(refused, "for_train with workers is refused, naming num_workers=0")


if __name__ == "__main__":
    main()
