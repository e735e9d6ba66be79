"""voxcache from Python: the out-of-core cache of a NIfTI dataset and the trainer's patch loader.

The work is done by the Rust library, the same code as the ``prep``, ``train`` and ``predict``
command-line tools: the GIL is released while it runs, and batches are built by Rust threads
and handed to numpy without a copy (``torch.from_numpy`` then shares them too).

    import voxcache
    voxcache.build_cache("data/vessels", "cache")
    cache = voxcache.open("cache")
    for batch in voxcache.PatchLoader(cache, patch_size=(16, 48, 48), batch_size=2, steps=10):
        image, label = batch["image"], batch["label"]   # (B, C, z, y, x) float32, (B, z, y, x)

Errors are ``VoxcacheError`` subclasses carrying the command-line tools' messages.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _voxcache
from ._voxcache import (  # noqa: F401  (re-exported)
    CacheError,
    CaseError,
    ConfigError,
    InputError,
    StorageError,
    VoxcacheError,
)

__version__ = _voxcache.__version__
__all__ = [
    "build_cache",
    "inspect",
    "open",
    "Cache",
    "Case",
    "PatchLoader",
    "VoxcacheError",
    "ConfigError",
    "CacheError",
    "CaseError",
    "InputError",
    "StorageError",
]

PathLike = Union[str, "os.PathLike[str]"]


def _flags(options: Dict[str, Any]) -> List[str]:
    """Keyword options as the command line spells them: ``spacing=(1, 1, 2)`` is
    ``--spacing 1,1,2``, ``derived=["distance"]`` is ``--derived distance``, ``True`` a bare
    flag; ``None`` and ``False`` are left out."""
    out: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def build_cache(data: PathLike, cache_dir: PathLike, **options: Any) -> Dict[str, Any]:
    """Build (or update) the cache at ``cache_dir`` (a folder or ``s3://BUCKET/PREFIX``) from
    the dataset folder ``data``, as ``prep build-cache DATA --cache-dir CACHE_DIR`` does.

    ``options`` are that command's options by name: ``pipeline``, ``spacing``,
    ``normalization``, ``derived``, ``jobs``, ``name``, ``s3_endpoint``, ... Returns the
    build report (what ``--json`` prints) as a dict."""
    report = _voxcache.build_cache(os.fspath(data), os.fspath(cache_dir), _flags(options))
    return json.loads(report)


def inspect(path: PathLike, verify: bool = False) -> Dict[str, Any]:
    """``prep inspect PATH --json``: the report of a dataset folder or a cache, as a dict
    (``verify=True`` checks every chunk of a cache against its checksum)."""
    return json.loads(_voxcache.inspect(os.fspath(path), verify))


class _Array:
    """A case's array read on indexing: ``case.image[0, 10:20, :, 5:9]`` reads that box
    through the memory-mapped reader into a new numpy array (steps of 1; integers drop the
    axis)."""

    def __init__(self, shape: Tuple[int, ...], read, channels: bool):
        self.shape = shape
        self._read = read
        self._channels = channels
        self.ndim = len(shape)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1 :]
        key = key + (slice(None),) * (self.ndim - len(key))
        if len(key) != self.ndim:
            raise IndexError(f"{len(key)} indices for an array of {self.ndim} dimensions")
        starts, sizes, drop = [], [], []
        for axis, (k, n) in enumerate(zip(key, self.shape)):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise IndexError("only steps of 1 are read; slice the result for others")
                starts.append(start)
                sizes.append(max(stop - start, 0))
            else:
                i = int(k)
                if i < -n or i >= n:
                    raise IndexError(f"index {i} out of range for axis {axis} of size {n}")
                starts.append(i % n)
                sizes.append(1)
                drop.append(axis)
        out = self._read(starts, sizes)
        if drop:
            out = out.squeeze(axis=tuple(drop))
        return out

    def __array__(self, dtype=None, copy=None):
        a = self[...]
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"<voxcache array {self.shape}>"


class Case:
    """One case of a cache: ``id``, ``shape`` (z, y, x), ``channels``, ``spacing`` (z, y, x)
    in ``unit``, ``key``; ``image`` (C, z, y, x) float32 and ``label`` (z, y, x) uint16 read
    on slicing; ``read_image(start, size)`` and ``read_label(start, size)`` read a box that may
    reach outside the grid (zero there); ``foreground(value)`` the voxels the sampler draws
    foreground patches from. Label-derived arrays, where the cache was built with them:
    ``distance`` (K, z, y, x) float32, the signed distance maps of ``distance_labels``;
    ``skeleton`` (z, y, x) uint16; ``norm_mask`` (z, y, x) uint8, nnU-Net's normalization mask
    of the ``norm_mask_channels`` (a cache of nnU-Net's preprocessing); each ``None`` when
    absent."""

    def __init__(self, inner: "_voxcache.Case"):
        self._inner = inner
        self.id = inner.id
        self.shape = inner.shape
        self.channels = inner.channels
        self.spacing = inner.spacing
        self.unit = inner.unit
        self.key = inner.key
        self.has_label = inner.has_label
        self.distance_labels = list(inner.distance_labels)
        self.norm_mask_channels = list(inner.norm_mask_channels)

    @property
    def image(self) -> _Array:
        def read(starts, sizes):
            return self._inner.read_image(starts[1:], sizes[1:])[starts[0] : starts[0] + sizes[0]]

        return _Array((self.channels,) + tuple(self.shape), read, channels=True)

    @property
    def label(self) -> _Array:
        return _Array(tuple(self.shape), lambda s, z: self._inner.read_label(s, z), channels=False)

    @property
    def distance(self) -> Optional[_Array]:
        if not self.distance_labels:
            return None
        import numpy as np

        def read(starts, sizes):
            labels = self.distance_labels[starts[0] : starts[0] + sizes[0]]
            maps = [self._inner.read_distance(v, starts[1:], sizes[1:]) for v in labels]
            return np.stack(maps) if maps else np.zeros((0, *sizes[1:]), np.float32)

        return _Array((len(self.distance_labels),) + tuple(self.shape), read, channels=True)

    @property
    def skeleton(self) -> Optional[_Array]:
        if not self._inner.has_skeleton:
            return None
        return _Array(tuple(self.shape), lambda s, z: self._inner.read_skeleton(s, z), channels=False)

    @property
    def norm_mask(self) -> Optional[_Array]:
        if not self.norm_mask_channels:
            return None
        return _Array(tuple(self.shape), lambda s, z: self._inner.read_norm_mask(s, z), channels=False)

    def read_image(self, start: Sequence[int], size: Sequence[int]):
        return self._inner.read_image(list(start), list(size))

    def read_label(self, start: Sequence[int], size: Sequence[int]):
        return self._inner.read_label(list(start), list(size))

    def foreground(self, value: int):
        return self._inner.foreground(value)

    def __repr__(self) -> str:
        return repr(self._inner)


class Cache:
    """A cache opened for reading (``voxcache.open``): ``datasets``, ``cases(dataset=None)``
    and ``case(id, dataset=None)``; indexing by id and iterating give the cases of the only
    dataset."""

    def __init__(self, location: PathLike, mapped_mib: Optional[int] = None, **s3_options: Any):
        if mapped_mib is not None and (isinstance(mapped_mib, bool) or int(mapped_mib) < 1):
            raise ConfigError(f"mapped_mib={mapped_mib!r}: give a number of MiB, at least 1, or None")
        self._inner = _voxcache.Cache(os.fspath(location), _flags(s3_options),
                                      None if mapped_mib is None else int(mapped_mib))
        self.location = os.fspath(location)

    @property
    def datasets(self) -> List[str]:
        return self._inner.datasets

    def cases(self, dataset: Optional[str] = None) -> List[str]:
        return self._inner.cases(dataset)

    def case(self, case_id: str, dataset: Optional[str] = None) -> Case:
        return Case(self._inner.case(case_id, dataset))

    def __getitem__(self, case_id: str) -> Case:
        return self.case(case_id)

    def __iter__(self) -> Iterable[Case]:
        return (self.case(c) for c in self.cases())

    def __len__(self) -> int:
        return len(self.cases())

    def __repr__(self) -> str:
        return f"voxcache.Cache({self.location!r})"


def open(location: PathLike, mapped_mib: Optional[int] = None, **s3_options: Any) -> Cache:  # noqa: A001
    """Open the cache at ``location``: a folder, or ``s3://BUCKET/PREFIX`` (``s3_endpoint=``,
    ``local_cache=`` as the command line's options); an S3 cache is read from its local tier.
    ``mapped_mib``: about how many MiB of the cache's memory-mapped pages the reads keep
    resident (``train --mapped-mib``); by default the kernel's choice: they are clean page cache,
    reclaimed first under memory pressure, but a process's RSS and PSS count those it touched,
    up to the part of the cache a run reads."""
    return Cache(location, mapped_mib=mapped_mib, **s3_options)


def _rank_and_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The rank and world size given, else torch.distributed's (when it is initialized), else
    torchrun's environment, else a single process."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    found = None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        found = (dist.get_rank(), dist.get_world_size())
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            found = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        except ValueError:
            raise ConfigError(
                f"RANK={os.environ['RANK']!r}, WORLD_SIZE={os.environ['WORLD_SIZE']!r}: not integers"
            ) from None
    r, w = found or (0, 1)
    return (r if rank is None else int(rank)), (w if world_size is None else int(world_size))


class PatchLoader:
    """The trainer's patch loader: batches of ``batch_size`` patches of ``patch_size`` (z, y, x)
    from a cache's labelled cases, built by ``threads`` Rust threads (no worker processes).

    Each batch is a dict: ``image`` float32 (B, C, z, y, x), ``label`` uint16 (B, z, y, x)
    (the label values as cached), ``case`` (the case ids), ``origin`` int64 (B, 3): each
    patch's first voxel (z, y, x) in its case's cached grid before augmentation (negative where
    it reaches outside: zero there), and ``step``. Batch ``s`` depends only on (seed, s):
    the same seed gives the same batches for any number of threads.

    - ``augment``: ``None`` for raw patches; ``"default"`` (or ``True``) for nnU-Net's default
      augmentation; or a dict of the ``[train.augmentation]`` table (its keys, its defaults
      for the rest).
    - ``cases``: the case ids to draw from (a fold's training cases); default every labelled
      case. ``dataset``: when the cache holds several.
    - ``fg_fraction``: the share of each batch centred on foreground (nnU-Net's 1/3).
    - ``steps``: batches an iteration gives (then ``len()`` works); default without end.
    - ``first_step``: the step to start at (to resume).
    - ``rank``, ``world_size``: several processes training one model (torch.distributed,
      torchrun): ``batch_size`` is per rank, and rank ``r`` gets samples ``r*batch_size ..``
      of the batch of ``batch_size * world_size`` that one process would draw at each step,
      so the ranks together see exactly that process's batches. Default: the process group's
      when torch.distributed is initialized, else torchrun's ``RANK`` and ``WORLD_SIZE``, else
      one process. Each rank opens the cache itself; its pages are shared through the page
      cache, not copied per rank.
    - ``targets``: also give ``target`` int64 (B, z, y, x), the label values as the trainer's
      class indices: every value the dataset's labelled cases hold (named and completed by its
      dataset.json) in value order, background 0, so 0, 2, 5 train as classes 0, 1, 2; the
      ignore label as -100 (PyTorch's ``ignore_index``). ``classes`` lists ``(value, name)`` per
      index. A dataset labelled in regions (dataset.json's BraTS-style label lists) gets
      ``target`` uint8 (B, R, z, y, x) instead: 1 where a voxel's label is one of region r's,
      for a sigmoid per region (``.float()`` for ``BCEWithLogitsLoss`` or MONAI's
      ``DiceLoss(sigmoid=True)``); with an ignore label, a last channel marks it (0 in every
      region there), as nnU-Net's region targets do. ``regions`` lists ``(name, values)``.
    - ``deep_supervision``: with ``targets``, factors (z, y, x) that each divide the patch,
      e.g. ``[(1, 2, 2), (2, 4, 4)]``: ``target_ds`` holds the target at each, pooled as the
      trainer pools it (a coarse voxel is foreground when any fine voxel is, the class most of
      them hold; ignored only when all are), for a network's deep-supervision outputs."""

    def __init__(
        self,
        cache: Union[Cache, PathLike],
        patch_size: Sequence[int],
        batch_size: int,
        augment: Union[None, bool, str, Dict[str, Any]] = None,
        threads: int = 2,
        seed: int = 1234,
        dataset: Optional[str] = None,
        cases: Optional[Sequence[str]] = None,
        fg_fraction: float = 1.0 / 3.0,
        queue_depth: int = 4,
        steps: Optional[int] = None,
        first_step: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        targets: bool = False,
        deep_supervision: Sequence[Sequence[int]] = (),
    ):
        rank, world_size = _rank_and_world(rank, world_size)
        if not isinstance(cache, Cache):
            cache = open(cache)
        if augment is None or augment is False:
            table = None
        elif augment is True or augment == "default":
            table = "{}"
        elif isinstance(augment, dict):
            table = json.dumps(augment)
        else:
            raise ConfigError(f"augment={augment!r}: give None, 'default' or a dict of [train.augmentation]")
        if len(tuple(patch_size)) != 3:
            raise ConfigError(f"patch_size={tuple(patch_size)!r}: give three sizes (z, y, x)")
        self.cache = cache
        self.patch_size = tuple(int(p) for p in patch_size)
        self.batch_size = int(batch_size)
        self._inner = _voxcache.PatchLoader(
            cache._inner,
            list(self.patch_size),
            self.batch_size,
            table,
            threads,
            seed,
            dataset,
            None if cases is None else list(cases),
            fg_fraction,
            queue_depth,
            steps,
            first_step,
            rank,
            world_size,
            bool(targets),
            [[int(v) for v in f] for f in deep_supervision],
        )
        self.rank, self.world_size = rank, world_size

    @classmethod
    def for_train(
        cls,
        cache: Union[Cache, PathLike],
        args: Union[str, Sequence[str]],
        threads: Optional[int] = None,
        steps: Optional[int] = None,
        first_step: int = 0,
        targets: bool = False,
        deep_supervision: Sequence[Sequence[int]] = (),
        device: str = "cpu",
    ) -> "PatchLoader":
        """The batches a ``train`` run with the options ``args`` draws from ``cache``: ``train``'s
        own flags (a list, or one string split as a shell would), e.g. ``["--pipeline",
        "pipeline.toml", "--configuration", "3d_fullres", "--fold", "0", "--seed", "0"]``,
        parsed and resolved by the same code as the binary's. The run's fold (or split) chooses
        the cases; its patch, batch size, sampler, augmentation, the derived arrays its loss
        needs (``distance`` float32 (B, K, z, y, x) for ``distance_labels``, ``skeleton`` and
        ``centreline`` uint16 (B, z, y, x)) and a cascade's previous-stage channels (the last
        image channels) are the trainer's, batch for batch: ``train --batch-hashes`` records a
        hash of each batch the trainer takes, to compare.

        ``threads``: default the run's ``workers``. ``steps``: default the run's batches (its
        steps times ``accumulate``) from ``first_step`` on. ``first_step``: the batch to start
        at. ``device``: what a planned patch (a pipeline that leaves it to the planner) is
        planned for, as ``train --device``. ``targets`` and ``deep_supervision`` as for ``PatchLoader``. One
        process's stream: refused under torch.distributed with several ranks."""
        _, world_size = _rank_and_world(None, None)
        if world_size > 1:
            raise ConfigError(
                f"PatchLoader.for_train under {world_size} processes: a train run's batches are one "
                "process's stream, so every rank would get the same ones; under torch.distributed "
                "make a PatchLoader, which draws each rank's share")
        if not isinstance(cache, Cache):
            cache = open(cache)
        if isinstance(args, str):
            args = shlex.split(args)
        self = cls.__new__(cls)
        self._inner = _voxcache.PatchLoader.for_train(
            cache._inner,
            [os.fspath(a) for a in args],
            threads,
            steps,
            first_step,
            bool(targets),
            [[int(v) for v in f] for f in deep_supervision],
            device,
        )
        self.cache = cache
        self.patch_size = tuple(self._inner.patch_size)
        self.batch_size = self._inner.batch_size
        self.rank, self.world_size = 0, 1
        return self

    @property
    def distance_labels(self) -> List[int]:
        """The label values whose signed distance maps ``distance`` holds, in order (a
        ``for_train`` run whose loss needs them; else empty)."""
        return self._inner.distance_labels

    @property
    def case_ids(self) -> List[str]:
        return self._inner.case_ids

    @property
    def step(self) -> int:
        return self._inner.step

    @property
    def classes(self) -> Optional[List[Tuple[int, str]]]:
        """With ``targets=True``: ``(label value, name)`` of each class index, in order."""
        return self._inner.classes

    @property
    def regions(self) -> Optional[List[Tuple[str, List[int]]]]:
        """With ``targets=True`` on a dataset labelled in regions: ``(name, label values)`` of
        each of ``target``'s region channels, in order."""
        return self._inner.regions

    def __iter__(self):
        return self._inner

    def __next__(self):
        return next(self._inner)

    def __len__(self) -> int:
        return len(self._inner)
