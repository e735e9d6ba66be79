"""voxcache for PyTorch: ``PatchDataset``, an ``IterableDataset`` of the patch loader's batches
for ``DataLoader(dataset, batch_size=None)``.

With ``num_workers=0`` (recommended: the loader's own threads build the batches, no worker
processes) the batches are exactly ``PatchLoader``'s. With workers, each worker starts its own
loader inside the worker (nothing is created before a fork, so fork and spawn both work) with
its own seed stream, derived from the seed and the worker's id, and yields its share of
``steps``: different batches from one process's, as reproducible. Tensors share the loader's
buffers (``torch.from_numpy``)."""

from __future__ import annotations

from typing import Any, Dict, Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import PatchLoader


class PatchDataset(IterableDataset):
    """``PatchLoader(cache, **options)`` as torch tensors: ``image`` float32 (B, C, z, y, x),
    ``label`` int64 (B, z, y, x) (the label values), ``case``, ``origin`` and ``step``."""

    def __init__(self, cache, **options: Any):
        super().__init__()
        self.cache = cache
        self.options = options

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = get_worker_info()
        options = dict(self.options)
        cache = self.cache
        if info is not None:
            # A stream of its own: the seed mixed with the worker's id (64-bit golden ratio).
            seed = int(options.get("seed", 1234))
            options["seed"] = (seed + 0x9E3779B97F4A7C15 * (info.id + 1)) % 2**64
            steps = options.get("steps")
            if steps is not None:
                options["steps"] = steps // info.num_workers + (info.id < steps % info.num_workers)
            # Opened again in the worker: no reader made before a fork is used after it.
            cache = getattr(cache, "location", cache)
        for batch in PatchLoader(cache, **options):
            yield {
                "image": torch.from_numpy(batch["image"]),
                "label": torch.from_numpy(batch["label"].astype("int64")),
                "case": batch["case"],
                "origin": torch.from_numpy(batch["origin"]),
                "step": batch["step"],
            }
