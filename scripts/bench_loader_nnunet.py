#!/usr/bin/env python3
"""nnU-Net v2's own training data loader (nnUNetDataLoader over nnUNetDatasetBlosc2), timed on
the cases of one of our caches, so its patches/s can be quoted next to ours.

    python scripts/bench_loader_nnunet.py --cache CACHE --out DIR [--patch 32,64,64] [--batch 2]
        [--batches N] [--rounds 5] [--dataset NAME] [--convert-only] [--no-convert]

Convert (once; cases already in DIR are kept): every case of the cache is read with zarr-python
and written the way nnunetv2's DefaultPreprocessor.run_case_save writes it: float32 data
(c,z,y,x) and the seg (1,z,y,x) as memory-mappable blosc2 files via
nnUNetDatasetBlosc2.save_case, with blocks/chunks from nnunetv2's comp_blosc2_params for the
patch size, plus the properties pickle whose class_locations come from
DefaultPreprocessor._sample_foreground_locations. The cache is already resampled and
normalised, so nnU-Net's crop/resample/normalise steps are not run (the loader does not
depend on them).

Timing: generate_train_batch() called in a loop in this one process, torch and blosc2 on one
thread, oversample_foreground_percent 0.33, patch_size == final_patch_size (a real nnU-Net run
crops a larger patch for its rotations), transforms=None. What is measured: picking cases,
opening the .b2nd files and the properties pickle (nnU-Net does this for every sample),
choosing the box, decompressing the crop, padding and the copy into torch tensors. What is
left out: augmentation, the multi-process augmenter, pin-memory and GPU transfer. The page cache
is warm (the conversion just wrote the files, and warm-up batches run first); --cold evicts the
files from it (posix_fadvise DONTNEED) before each round, so a round reads from disk.

Prints each round's patches/s and then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def fail(msg: str) -> None:
    sys.exit(f"bench_loader_nnunet: error: {msg}")


try:
    import blosc2
    import numpy as np
    import torch
    import nnunetv2
    from importlib.metadata import version
    from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor
    from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
    from nnunetv2.training.dataloading.nnunet_dataset import nnUNetDatasetBlosc2, comp_blosc2_params
    from nnunetv2.utilities.label_handling.label_handling import LabelManager
except ImportError as e:
    fail(f"{e}; run this with a Python that has `pip install nnunetv2 zarr`")

META = "voxcache_convert.json"  # records what DIR was converted with; nnU-Net ignores it


def cache_cases(cache: Path, dataset: str | None) -> list[tuple[str, Path]]:
    manifest = cache / "manifest.json"
    if not manifest.is_file():
        fail(f"{manifest} not found (is {cache} a cache built by `prep build-cache`?)")
    datasets = json.loads(manifest.read_text()).get("datasets", {})
    if dataset is None:
        if len(datasets) != 1:
            fail(f"the cache holds datasets {sorted(datasets)}; pick one with --dataset")
        dataset = next(iter(datasets))
    if dataset not in datasets:
        fail(f"dataset {dataset!r} not in {manifest} (has {sorted(datasets)})")
    cases = [(cid, cache / c["entry"]) for cid, c in sorted(datasets[dataset]["cases"].items())]
    if not cases:
        fail(f"dataset {dataset!r} in {manifest} lists no cases")
    return cases


def convert(cases: list[tuple[str, Path]], out: Path, patch: tuple[int, ...], seg_dtype) -> None:
    import zarr  # only the conversion needs it

    meta_file = out / META
    meta = {"patch": list(patch), "seg_dtype": np.dtype(seg_dtype).name}
    if meta_file.is_file() and json.loads(meta_file.read_text()) != meta:
        # Blocks/chunks depend on the patch size: mixing would time a layout nobody uses.
        fail(f"{out} was converted with {meta_file.read_text().strip()}, not {meta}; use another --out")
    out.mkdir(parents=True, exist_ok=True)
    meta_file.write_text(json.dumps(meta) + "\n")
    # Labels 0/1; nnU-Net's preprocessor asks for the foreground labels (no ignore label here).
    wanted = LabelManager({"background": 0, "vessel": 1}, regions_class_order=None).foreground_labels
    t0 = time.perf_counter()
    done = 0
    for cid, entry in cases:
        stem = out / cid
        # save_case writes the pickle last, so a present pickle means a finished case.
        if all(Path(f"{stem}{s}").is_file() for s in (".b2nd", "_seg.b2nd", ".pkl")):
            continue
        if not (entry / "zarr.json").is_file():
            fail(f"cache entry {entry} for case {cid} is missing")
        g = zarr.open_group(str(entry), mode="r")
        data = np.asarray(g["image"][...], dtype=np.float32)
        if data.ndim == 3:
            data = data[None]
        label = np.asarray(g["label"][...])
        if int(label.max()) > np.iinfo(seg_dtype).max:
            fail(f"case {cid}: label value {int(label.max())} does not fit {np.dtype(seg_dtype).name}")
        seg = label.astype(seg_dtype)[None]
        if data.shape[1:] != seg.shape[1:]:
            fail(f"case {cid}: image {data.shape} and label {seg.shape} differ")
        attrs = g.attrs.get("voxcache", {})
        spacing_zyx = list(reversed(attrs.get("output", {}).get("spacing_xyz", [1.0, 1.0, 1.0])))
        shape = list(data.shape[1:])
        # The keys DefaultPreprocessor leaves in the pickle; only class_locations is read by
        # the loader, the rest describes "no crop, no resample" so the files look normal.
        props = {
            "spacing": spacing_zyx,
            "shape_before_cropping": shape,
            "bbox_used_for_cropping": [[0, s] for s in shape],
            "shape_after_cropping_and_before_resampling": shape,
            "class_locations": DefaultPreprocessor._sample_foreground_locations(seg, wanted),
        }
        # Same calls as run_case_save: separate params for data and seg (itemsize differs).
        blocks, chunks = comp_blosc2_params(data.shape, patch, data.itemsize)
        blocks_seg, chunks_seg = comp_blosc2_params(seg.shape, patch, seg.itemsize)
        nnUNetDatasetBlosc2.save_case(data, seg, props, str(stem), chunks=chunks, blocks=blocks,
                                      chunks_seg=chunks_seg, blocks_seg=blocks_seg)
        done += 1
        print(f"  {cid}: shape {tuple(data.shape)} data blocks {blocks} chunks {chunks}, "
              f"seg blocks {blocks_seg} chunks {chunks_seg}", flush=True)
    if done:
        print(f"converted {done} case(s) in {time.perf_counter() - t0:.1f} s", flush=True)
    else:
        print(f"{out} already holds all {len(cases)} cases; nothing converted", flush=True)


def evict(files: list[Path]) -> None:
    """Drop the files' pages from the page cache (as examples/bench_patches --cold does)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def time_loader(out: Path, patch, batch: int, batches: int | None, rounds: int,
                cold: bool = False) -> dict:
    files = sorted(out.glob("*.b2nd")) + sorted(out.glob("*.pkl"))
    if not any(not f.name.endswith("_seg.b2nd") for f in files):
        fail(f"no nnU-Net .b2nd files in {out}; run without --no-convert first")
    ds = nnUNetDatasetBlosc2(str(out))
    lm = LabelManager({"background": 0, "vessel": 1}, regions_class_order=None)
    dl = nnUNetDataLoader(ds, batch, patch, patch, lm, oversample_foreground_percent=0.33,
                          transforms=None)
    # Loader and boxes draw from NumPy's global generator: seeded so reruns see the same patches.
    np.random.seed(1234)
    for _ in range(5):
        b = dl.generate_train_batch()
    assert tuple(b["data"].shape[2:]) == tuple(patch), b["data"].shape
    if batches is None:
        # Calibrate on a short run so each timed round lasts about 7 s on this machine.
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 1.0:
            dl.generate_train_batch()
            n += 1
        batches = max(10, round(7.0 * n / (time.perf_counter() - t0)))
    print(f"{len(ds.identifiers)} cases, batch {batch}, patch {list(patch)}, "
          f"{rounds} rounds of {batches} batches", flush=True)
    rates = []
    for r in range(rounds):
        if cold:
            # nnU-Net opens (and maps) the files per sample: nothing of ours holds them now.
            evict(files)
        t0 = time.perf_counter()
        for _ in range(batches):
            dl.generate_train_batch()
        dt = time.perf_counter() - t0
        rates.append(batches * batch / dt)
        print(f"  round {r + 1}: {rates[-1]:.1f} patches/s ({dt:.2f} s)", flush=True)
    return {
        "tool": "nnunet_loader",
        "nnunetv2": version("nnunetv2"),
        "blosc2": blosc2.__version__,
        "patch": list(patch),
        "batch": batch,
        "patches_per_s_rounds": [round(v, 2) for v in rates],
        "median_patches_per_s": round(statistics.median(rates), 2),
        "cold": cold,
        "bytes_on_disk": sum(f.stat().st_size for f in files if f.suffix == ".b2nd"),
        "cases": len(ds.identifiers),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="voxcache cache folder (holds manifest.json)")
    ap.add_argument("--out", required=True, help="folder for nnU-Net's preprocessed files")
    ap.add_argument("--patch", default="32,64,64", help="z,y,x")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batches", type=int, help="batches per round (default: ~7 s per round)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dataset", help="dataset in the manifest (default: the only one)")
    # nnunetv2 2.8's run_case_save stores the seg as int16 (run_case_npy alone gives int8).
    ap.add_argument("--seg-dtype", choices=["int16", "int8"], default="int16")
    ap.add_argument("--convert-only", action="store_true")
    ap.add_argument("--no-convert", action="store_true")
    ap.add_argument("--cold", action="store_true",
                    help="evict the files from the page cache before each round")
    args = ap.parse_args()
    try:
        patch = tuple(int(v) for v in args.patch.split(","))
    except ValueError:
        patch = ()
    if len(patch) != 3 or min(patch) < 1:
        fail(f"--patch wants three positive integers z,y,x, got {args.patch!r}")
    if args.batch < 1 or args.rounds < 1 or (args.batches is not None and args.batches < 1):
        fail("--batch, --batches and --rounds must be positive")
    if args.convert_only and args.no_convert:
        fail("--convert-only and --no-convert exclude each other")
    out = Path(args.out)
    # nnU-Net's blosc2 code sets its own thread counts; torch we pin here (one loader worker).
    torch.set_num_threads(1)
    if not args.no_convert:
        if not args.cache:
            fail("--cache is needed to convert (or pass --no-convert)")
        cache = Path(args.cache)
        if not cache.is_dir():
            fail(f"cache folder {cache} does not exist")
        convert(cache_cases(cache, args.dataset), out, patch, np.dtype(args.seg_dtype).type)
    elif not out.is_dir():
        fail(f"--out folder {out} does not exist")
    if args.convert_only:
        return
    meta_file = out / META
    if meta_file.is_file() and json.loads(meta_file.read_text()).get("patch") != list(patch):
        print(f"note: {out} was laid out for patch {json.loads(meta_file.read_text())['patch']}, "
              f"timing patch {list(patch)}", file=sys.stderr)
    print(json.dumps(time_loader(out, patch, args.batch, args.batches, args.rounds, args.cold)),
          flush=True)


if __name__ == "__main__":
    main()
