"""nnU-Net's trainer fed by voxcache's loader: no augmentation worker processes.

    python -m voxcache.nnunet train DATASET CONFIGURATION FOLD [-p nnUNetPlans] [-device cuda]

runs nnU-Net v2's own ``nnUNetTrainer`` (its network, loss, optimizer, schedule, logging and
checkpoints) with its data loaders replaced by :class:`voxcache.PatchLoader` over a cache of
nnU-Net's own preprocessing (``prep build-cache --nnunet-plans``; built, or brought up to date,
first at ``nnUNet_preprocessed/DATASET/voxcache_PLANS_CONFIGURATION``). Batches are built by
Rust threads (``nnUNet_n_proc_DA`` of them, at least one) in the training process.

What stays nnU-Net's: the plans' patch and batch size, its 5-fold split (``splits_final.json``,
created the way nnU-Net creates it), the deep-supervision targets (its nearest-exact
downsampling), region targets, the checkpoint format. The checkpoint records the stock
``nnUNetTrainer`` as its trainer (the network is the stock one), so ``nnUNetv2_predict -tr
nnUNetTrainerVoxcache`` and nnU-Net's other tools load it unchanged.

What is voxcache's: patch sampling (nnU-Net's foreground oversampling, from the cache's
foreground index, the ignore label never a centre) and the augmentation (nnU-Net's default
transforms, its probabilities and ranges, implemented in voxcache). Under torch.distributed
each rank draws its share of every step's batch (PatchLoader's default). nnU-Net's
``MaskImageTransform`` is applied by the loader: where the plans normalize a channel within the
nonzero mask, augmented patches have it zeroed outside the mask the cache keeps (nnU-Net's -1),
the mask read through the spatial map by nearest voxel.

The final validation (``perform_actual_validation``) reads nnU-Net's own preprocessed arrays:
it runs when ``nnUNetv2_preprocess`` made them for this configuration, and is skipped with a
message otherwise. Import this module only where nnunetv2 and torch are installed.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

import numpy as np
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

import voxcache

__all__ = ["nnUNetTrainerVoxcache", "cache_path", "build"]

STOCK_TRAINER = "nnUNetTrainer"


def cache_path(preprocessed_dataset_folder_base: str, plans_identifier: str, configuration: str) -> str:
    """Where the runner keeps a dataset's cache for one plans file and configuration."""
    return os.path.join(preprocessed_dataset_folder_base, f"voxcache_{plans_identifier}_{configuration}")


def build(raw_dataset_folder: str, plans_file: str, configuration: str, cache: str, jobs: int = 0) -> dict:
    """``prep build-cache --nnunet-plans``: the cache of nnU-Net's preprocessing (cases already
    there are kept)."""
    return voxcache.build_cache(raw_dataset_folder, cache, nnunet_plans=plans_file,
                                configuration=configuration, jobs=jobs)


def _cache_dataset_class(cache: voxcache.Cache):
    """A stand-in for nnU-Net's dataset class that lists the cache's cases: nnU-Net's own
    ``do_split`` then makes (or reads) ``splits_final.json`` over them."""

    class CacheCases:
        def __init__(self, folder, identifiers=None, folder_with_segs_from_previous_stage=None):
            self.identifiers = list(identifiers) if identifiers is not None else cache.cases()

        @staticmethod
        def get_identifiers(folder) -> List[str]:
            return cache.cases()

        @staticmethod
        def unpack_dataset(*args, **kwargs) -> None:
            pass  # the cache is read as it is

    return CacheCases


class _Batches:
    """nnU-Net's batch format from a PatchLoader: ``data`` float32 (B, C, z, y, x), ``target``
    (B, 1, z, y, x) label values, or region memberships (B, R, z, y, x) as nnU-Net's region
    transform gives them, downsampled for deep supervision as nnU-Net does (nearest-exact)."""

    def __init__(self, loader: voxcache.PatchLoader, regions, ds_scales):
        self.loader = loader
        self.it = iter(loader)
        self.regions = regions
        self.ds_scales = ds_scales

    def __iter__(self):
        return self

    def _target(self, label: torch.Tensor) -> torch.Tensor:
        seg = label[:, None].to(torch.int16)
        if self.regions is None:
            return seg
        out = torch.zeros((seg.shape[0], len(self.regions), *seg.shape[2:]), dtype=torch.bool)
        for r, values in enumerate(self.regions):
            out[:, r] = torch.isin(seg[:, 0], torch.as_tensor(values, dtype=torch.int16))
        return out

    def __next__(self):
        b = next(self.it)
        data = torch.from_numpy(b["image"])
        target = self._target(torch.from_numpy(b["label"].astype(np.int32)))
        if self.ds_scales is not None:
            levels = []
            full = None
            for s in self.ds_scales:
                if all(f == 1 for f in s):
                    levels.append(target)
                    continue
                if full is None:
                    full = target.float()
                shape = [round(n * f) for n, f in zip(target.shape[2:], s)]
                levels.append(torch.nn.functional.interpolate(full, shape, mode="nearest-exact").to(target.dtype))
            target = levels
        return {"data": data, "target": target, "keys": list(b["case"])}


class nnUNetTrainerVoxcache(nnUNetTrainer):
    """nnU-Net's trainer with voxcache's loader (see the module's text). Set ``voxcache_cache``
    (the cache's folder) before training; ``voxcache_seed`` and ``voxcache_threads`` are
    optional."""

    voxcache_cache: Optional[str] = None
    voxcache_seed: int = 0
    voxcache_threads: Optional[int] = None

    def _open_cache(self) -> voxcache.Cache:
        if self.voxcache_cache is None:
            raise voxcache.ConfigError(
                "nnUNetTrainerVoxcache: set voxcache_cache (the cache built with prep build-cache "
                "--nnunet-plans) before training; python -m voxcache.nnunet train does it")
        return voxcache.open(self.voxcache_cache)

    def initialize(self):
        # nnU-Net's initialize looks at its preprocessed folder for the dataset's file format,
        # which a voxcache run need not have: it gets the cache's stand-in instead.
        from nnunetv2.training.nnUNetTrainer import nnUNetTrainer as module

        real = module.infer_dataset_class
        cases = _cache_dataset_class(self._open_cache())
        module.infer_dataset_class = lambda folder: cases
        try:
            super().initialize()
        finally:
            module.infer_dataset_class = real

    def get_dataloaders(self):
        cache = self._open_cache()
        self.dataset_class = _cache_dataset_class(cache)
        # Sets inference_allowed_mirroring_axes, which the checkpoint carries to the predictor.
        self.configure_rotation_dummyDA_mirroring_and_inital_patch_size()
        tr_keys, val_keys = self.do_split()
        ds = self._get_deep_supervision_scales()
        ds = None if ds is None else [list(map(float, s)) for s in ds]
        lm = self.label_manager
        regions = None
        if lm.has_regions:
            regions = [list(r) if isinstance(r, (list, tuple)) else [r] for r in lm.foreground_regions]
            if lm.has_ignore_label:
                regions.append([lm.ignore_label])
        threads = self.voxcache_threads or max(1, _allowed_threads())
        patch = tuple(int(p) for p in self.configuration_manager.patch_size)
        iters = self.num_epochs * self.num_iterations_per_epoch
        val_iters = self.num_epochs * self.num_val_iterations_per_epoch
        first = self.current_epoch * self.num_iterations_per_epoch
        first_val = self.current_epoch * self.num_val_iterations_per_epoch
        common = dict(patch_size=patch, batch_size=self.batch_size, threads=threads,
                      fg_fraction=float(self.oversample_foreground_percent))
        train = voxcache.PatchLoader(cache, augment="default", seed=self.voxcache_seed,
                                     cases=tr_keys, steps=iters, first_step=first, **common)
        val = voxcache.PatchLoader(cache, augment=None, seed=self.voxcache_seed + 1,
                                   cases=val_keys, steps=val_iters, first_step=first_val, **common)
        return _Batches(train, regions, ds), _Batches(val, regions, ds)

    def save_checkpoint(self, filename: str) -> None:
        # Recorded as the stock trainer: the network is the stock one, so nnU-Net's predictor
        # (which looks the class up by name inside its own package) rebuilds it.
        real = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("trainer_name") == type(self).__name__:
                obj = dict(obj, trainer_name=STOCK_TRAINER)
            return real(obj, f, *args, **kwargs)

        torch.save = save
        try:
            super().save_checkpoint(filename)
        finally:
            torch.save = real

    def perform_actual_validation(self, save_probabilities: bool = False):
        from nnunetv2.training.dataloading.nnunet_dataset import infer_dataset_class

        folder = self.preprocessed_dataset_folder
        if not os.path.isdir(folder) or not os.listdir(folder):
            self.print_to_log_file(
                f"validation skipped: it predicts nnU-Net's own preprocessed arrays, and {folder} has none "
                "(run nnUNetv2_preprocess for this configuration, then python -m voxcache.nnunet "
                "train ... --val)")
            return
        self.dataset_class = infer_dataset_class(folder)
        return super().perform_actual_validation(save_probabilities)


def _allowed_threads() -> int:
    from nnunetv2.utilities.default_n_proc_DA import get_allowed_n_proc_DA
    return get_allowed_n_proc_DA()


def train(dataset: str, configuration: str, fold: str, plans: str = "nnUNetPlans", device: str = "cpu",
          seed: int = 0, threads: Optional[int] = None, cache: Optional[str] = None,
          epochs: Optional[int] = None, iterations: Optional[int] = None,
          val_iterations: Optional[int] = None, validate: bool = True, jobs: int = 0,
          continue_training: bool = False, validation_only: bool = False):
    """Build (or update) the cache, then train one fold (``continue_training``: from its last
    checkpoint, as ``nnUNetv2_train --c``; ``validation_only``: only the final validation of a
    finished fold, as ``--val``); returns the trainer."""
    from batchgenerators.utilities.file_and_folder_operations import load_json
    from nnunetv2.paths import nnUNet_preprocessed, nnUNet_raw
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    for name, value in (("nnUNet_raw", nnUNet_raw), ("nnUNet_preprocessed", nnUNet_preprocessed)):
        if value is None:
            raise voxcache.ConfigError(f"{name} is not set: nnU-Net's folders are needed")
    name = maybe_convert_to_dataset_name(dataset)
    base = os.path.join(nnUNet_preprocessed, name)
    plans_file = os.path.join(base, plans + ".json")
    if not os.path.isfile(plans_file):
        raise voxcache.ConfigError(f"{plans_file}: no plans (run nnUNetv2_plan_experiment first)")
    cache = cache or cache_path(base, plans, configuration)
    report = build(os.path.join(nnUNet_raw, name), plans_file, configuration, cache, jobs)
    print(f"voxcache: {cache}: {report['built']} built, {report['cached']} cached, "
          f"{report['failed']} failed", flush=True)
    if report["failed"]:
        raise voxcache.CaseError(f"{report['failed']} case(s) failed to build: see the messages above")
    dataset_json = load_json(os.path.join(base, "dataset.json")) if os.path.isfile(
        os.path.join(base, "dataset.json")) else load_json(os.path.join(nnUNet_raw, name, "dataset.json"))
    from nnunetv2.run.run_training import maybe_load_checkpoint

    fold_value = fold if fold == "all" else int(fold)
    plans_dict = load_json(plans_file)
    plans_dict["continue_training"] = continue_training
    trainer = nnUNetTrainerVoxcache(plans_dict, configuration, fold_value, dataset_json,
                                    torch.device(device))
    trainer.voxcache_cache = cache
    trainer.voxcache_seed = seed
    trainer.voxcache_threads = threads
    if epochs is not None:
        trainer.num_epochs = epochs
    if iterations is not None:
        trainer.num_iterations_per_epoch = iterations
    if val_iterations is not None:
        trainer.num_val_iterations_per_epoch = val_iterations
    maybe_load_checkpoint(trainer, continue_training, validation_only)
    if not validation_only:
        trainer.run_training()
    if validate or validation_only:
        trainer.perform_actual_validation()
    return trainer


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voxcache.nnunet",
                                 description="nnU-Net's trainer with voxcache's loader")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train one fold, as nnUNetv2_train does")
    t.add_argument("dataset", help="dataset name or id")
    t.add_argument("configuration")
    t.add_argument("fold", help="0-4 or all")
    t.add_argument("-p", "--plans", default="nnUNetPlans")
    t.add_argument("-device", "--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, help="loader threads (default nnUNet_n_proc_DA, at least 1)")
    t.add_argument("--cache", help="the cache folder (default beside nnU-Net's preprocessed data)")
    t.add_argument("--epochs", type=int, help="nnU-Net's num_epochs (default 1000)")
    t.add_argument("--iterations", type=int, help="iterations per epoch (default 250)")
    t.add_argument("--val-iterations", type=int, help="validation iterations per epoch (default 50)")
    t.add_argument("--no-validation", action="store_true", help="skip the final validation")
    t.add_argument("-j", "--jobs", type=int, default=0, help="cache build threads (default: all cores)")
    t.add_argument("--c", dest="continue_training", action="store_true",
                   help="continue from the fold's last checkpoint")
    t.add_argument("--val", dest="validation_only", action="store_true",
                   help="only the final validation of a finished fold (needs nnU-Net's preprocessed arrays)")
    a = ap.parse_args(argv)
    try:
        train(a.dataset, a.configuration, a.fold, a.plans, a.device, a.seed, a.threads, a.cache,
              a.epochs, a.iterations, a.val_iterations, not a.no_validation, a.jobs, a.continue_training, a.validation_only)
    except voxcache.VoxcacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
