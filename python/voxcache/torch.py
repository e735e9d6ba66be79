"""voxcache for PyTorch: ``PatchDataset``, an ``IterableDataset`` of the patch loader's batches
for ``DataLoader(dataset, batch_size=None)``.

With ``num_workers=0`` (recommended: the loader's own threads build the batches, no worker
processes) the batches are exactly ``PatchLoader``'s. With workers, each worker starts its own
loader inside the worker (nothing is created before a fork, so fork and spawn both work) with
its own seed stream, derived from the seed and the worker's id, and yields its share of
``steps``: different batches from one process's, as reproducible. Tensors share the loader's
buffers (``torch.from_numpy``).

``PatchDataset.for_train(cache, args, ...)`` gives a ``train`` run's own batches
(``PatchLoader.for_train``): one stream, so only with ``num_workers=0``."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sequence, Union

import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import PatchLoader


class PatchDataset(IterableDataset):
    """``PatchLoader(cache, **options)`` as torch tensors: ``image`` float32 (B, C, z, y, x),
    ``label`` int64 (B, z, y, x) (the label values), ``case``, ``origin`` and ``step``; with
    ``targets=True`` ``target`` (and ``target_ds``, a list), and a run's ``distance`` and
    ``skeleton`` and ``centreline`` (int64) where its loss needs them."""

    def __init__(self, cache, **options: Any):
        super().__init__()
        self.cache = cache
        self.options = options
        self.train_args: Optional[Sequence[str]] = None

    @classmethod
    def for_train(cls, cache, args: Union[str, Sequence[str]], **options: Any) -> "PatchDataset":
        """The batches of the ``train`` run ``args`` (``PatchLoader.for_train``'s options)."""
        ds = cls(cache, **options)
        ds.train_args = args
        return ds

    def _loader(self) -> PatchLoader:
        info = get_worker_info()
        options = dict(self.options)
        cache = self.cache
        if info is not None:
            if self.train_args is not None:
                raise RuntimeError(
                    "PatchDataset.for_train: a train run's batches are one stream; give the "
                    "DataLoader num_workers=0 (the loader's own threads build them)")
            # A stream of its own: the seed mixed with the worker's id (64-bit golden ratio).
            seed = int(options.get("seed", 1234))
            options["seed"] = (seed + 0x9E3779B97F4A7C15 * (info.id + 1)) % 2**64
            steps = options.get("steps")
            if steps is not None:
                options["steps"] = steps // info.num_workers + (info.id < steps % info.num_workers)
            # Opened again in the worker: no reader made before a fork is used after it.
            cache = getattr(cache, "location", cache)
        if self.train_args is not None:
            return PatchLoader.for_train(cache, self.train_args, **options)
        return PatchLoader(cache, **options)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for batch in self._loader():
            out: Dict[str, Any] = {}
            for key, value in batch.items():
                if key in ("label", "skeleton", "centreline"):
                    # Label values as int64: torch's uint16 tensors take few operations.
                    out[key] = torch.from_numpy(value.astype("int64"))
                elif key == "target_ds":
                    out[key] = [torch.from_numpy(v) for v in value]
                elif hasattr(value, "dtype") and value.dtype != object:
                    out[key] = torch.from_numpy(value)
                else:
                    out[key] = value
            yield out
