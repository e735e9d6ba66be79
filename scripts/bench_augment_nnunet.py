#!/usr/bin/env python3
"""nnU-Net v2's training augmentation (batchgeneratorsv2, from PyPI), timed in one process.

The transform list is nnUNetTrainer.get_training_transforms with its default arguments for a
3D patch, written out here (nnunetv2 itself is not installed): spatial (rotation p 0.2 within
+-30 degrees per axis, or +-180 in-plane with the 3D->2D wrapping for anisotropic patches;
scaling p 0.2 in 0.7..1.4), Gaussian noise, blur, brightness, contrast, low resolution,
inverted gamma, gamma, mirroring, and the deep-supervision downsampling is left out (our loader
does not do it either). Like nnU-Net's data loader, each sample crops an enlarged patch
(nnU-Net's `get_patch_size` for those rotations, scale 0.85) from the case, here held in memory
as numpy arrays (nnU-Net reads it from its own files: this leaves their I/O out, in their
favour), then the transforms give the final patch.

    python scripts/bench_augment_nnunet.py --cache CACHE --patch 32,96,96 [--patches 100] [--mode default|all|crop|intensity|spatial]

Prints one JSON line: patches per second with torch on one thread.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import zarr
from batchgeneratorsv2.transforms.intensity.brightness import MultiplicativeBrightnessTransform
from batchgeneratorsv2.transforms.intensity.contrast import BGContrast, ContrastTransform
from batchgeneratorsv2.transforms.intensity.gamma import GammaTransform
from batchgeneratorsv2.transforms.intensity.gaussian_noise import GaussianNoiseTransform
from batchgeneratorsv2.transforms.noise.gaussian_blur import GaussianBlurTransform
from batchgeneratorsv2.transforms.spatial.low_resolution import SimulateLowResolutionTransform
from batchgeneratorsv2.transforms.spatial.mirroring import MirrorTransform
from batchgeneratorsv2.transforms.spatial.spatial import SpatialTransform
from batchgeneratorsv2.transforms.utils.compose import ComposeTransforms
from batchgeneratorsv2.transforms.utils.pseudo2d import Convert2DTo3DTransform, Convert3DTo2DTransform
from batchgeneratorsv2.transforms.utils.random import RandomTransform


def transforms(patch: tuple[int, int, int], mode: str) -> ComposeTransforms:
    """nnUNetTrainer.get_training_transforms (v2 defaults); mode `all` sets each probability to
    1, `crop`, `intensity` and `spatial` keep one part (see --mode)."""
    every = mode == "all"
    p = (lambda q: 1.0) if every else (lambda q: q)
    # The spatial part's and the intensity part's probabilities.
    ps = {"crop": lambda q: 0.0, "intensity": lambda q: 0.0, "spatial": lambda q: 1.0}.get(mode, p)
    pi = {"crop": lambda q: 0.0, "spatial": lambda q: 0.0}.get(mode, p)
    dummy_2d = max(patch) / patch[0] > 3
    if dummy_2d:
        rotation = (-np.pi, np.pi)
        spatial_patch, ignore_axes = patch[1:], (0,)
    else:
        rotation = (-30 / 360 * 2 * np.pi, 30 / 360 * 2 * np.pi)
        spatial_patch, ignore_axes = patch, None
    t = []
    if dummy_2d:
        t.append(Convert3DTo2DTransform())
    t.append(SpatialTransform(spatial_patch, patch_center_dist_from_border=0, random_crop=False,
                              p_elastic_deform=0, p_rotation=ps(0.2), rotation=rotation,
                              p_scaling=ps(0.2), scaling=(0.7, 1.4),
                              p_synchronize_scaling_across_axes=1, bg_style_seg_sampling=False))
    if dummy_2d:
        t.append(Convert2DTo3DTransform())
    t.append(RandomTransform(GaussianNoiseTransform(noise_variance=(0, 0.1), p_per_channel=1,
                                                    synchronize_channels=True), apply_probability=pi(0.1)))
    t.append(RandomTransform(GaussianBlurTransform(blur_sigma=(0.5, 1.0), synchronize_channels=False,
                                                   synchronize_axes=False, p_per_channel=p(0.5),
                                                   benchmark=True), apply_probability=pi(0.2)))
    t.append(RandomTransform(MultiplicativeBrightnessTransform(multiplier_range=BGContrast((0.75, 1.25)),
                                                               synchronize_channels=False, p_per_channel=1),
                             apply_probability=pi(0.15)))
    t.append(RandomTransform(ContrastTransform(contrast_range=BGContrast((0.75, 1.25)), preserve_range=True,
                                               synchronize_channels=False, p_per_channel=1),
                             apply_probability=pi(0.15)))
    t.append(RandomTransform(SimulateLowResolutionTransform(scale=(0.5, 1), synchronize_channels=False,
                                                            synchronize_axes=True, ignore_axes=ignore_axes,
                                                            allowed_channels=None, p_per_channel=p(0.5)),
                             apply_probability=pi(0.25)))
    t.append(RandomTransform(GammaTransform(gamma=BGContrast((0.7, 1.5)), p_invert_image=1,
                                            synchronize_channels=False, p_per_channel=1, p_retain_stats=1),
                             apply_probability=pi(0.1)))
    t.append(RandomTransform(GammaTransform(gamma=BGContrast((0.7, 1.5)), p_invert_image=0,
                                            synchronize_channels=False, p_per_channel=1, p_retain_stats=1),
                             apply_probability=pi(0.3)))
    t.append(MirrorTransform(allowed_axes=(0, 1, 2)) if not every else RandomTransform(
        MirrorTransform(allowed_axes=(0, 1, 2)), apply_probability=1))
    return ComposeTransforms(t)


def rot(v: np.ndarray, axis: int, a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    i, j = [k for k in range(3) if k != axis]
    m = np.eye(3)
    m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
    return m @ v


def initial_patch_size(patch: tuple[int, int, int]) -> np.ndarray:
    """nnU-Net's get_patch_size: the box the rotated final patch can reach, over scale 0.85."""
    dummy_2d = max(patch) / patch[0] > 3
    coords = np.array(patch, dtype=float)
    final = coords.copy()
    if dummy_2d:
        angles = [np.pi / 2, 0.0, 0.0]  # capped at 90 degrees as nnU-Net does
    else:
        angles = [30 / 360 * 2 * np.pi] * 3
    for axis, a in enumerate(angles):
        if a:
            final = np.maximum(final, np.abs(rot(coords, axis, a)))
    out = np.ceil(final / 0.85).astype(int)
    if dummy_2d:
        out[0] = patch[0]  # nnU-Net enlarges the in-plane axes only (z rides along as channels)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--patch", required=True)
    ap.add_argument("--patches", type=int, default=100)
    # default: nnU-Net's probabilities; all: every transform on every patch. For timing the
    # parts alone: crop (no spatial or intensity transform), intensity (nnU-Net's intensity
    # probabilities, no spatial transform), spatial (rotation and scaling on every patch, no
    # intensity transform). Mirroring as in default, except in all.
    ap.add_argument("--mode", choices=["default", "all", "crop", "intensity", "spatial"],
                    default="default")
    args = ap.parse_args()
    torch.set_num_threads(1)
    # The transforms draw from torch's and NumPy's global generators: seeded, so that every
    # run draws the same mix of transforms (with few patches, how many got the expensive
    # spatial transform moved the rate by a quarter between runs).
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    patch = tuple(int(v) for v in args.patch.split(","))
    cases = []
    for e in sorted(Path(args.cache, "entries").glob("*/*")):
        g = zarr.open_group(str(e), mode="r")
        cases.append((np.asarray(g["image"][:], dtype=np.float32), np.asarray(g["label"][:]).astype(np.int16)))
    rng = np.random.default_rng(7)
    big = initial_patch_size(patch)
    pipeline = transforms(patch, args.mode)

    def sample() -> None:
        image, label = cases[rng.integers(len(cases))]
        shape = np.array(label.shape)
        start = [int(rng.integers(min(0, s - b), max(0, s - b) + 1)) for s, b in zip(shape, big)]
        img = np.zeros((image.shape[0],) + tuple(big), dtype=np.float32)
        seg = np.zeros((1,) + tuple(big), dtype=np.int16)
        src = tuple(slice(max(0, a), min(s, a + b)) for a, s, b in zip(start, shape, big))
        dst = tuple(slice(r.start - a, r.stop - a) for r, a in zip(src, start))
        img[(slice(None),) + dst] = image[(slice(None),) + src]
        seg[(slice(None),) + dst] = label[src]
        out = pipeline(image=torch.from_numpy(img), segmentation=torch.from_numpy(seg))
        assert tuple(out["image"].shape[1:]) == patch, out["image"].shape

    for _ in range(4):
        sample()
    t = time.perf_counter()
    for _ in range(args.patches):
        sample()
    secs = time.perf_counter() - t
    print(json.dumps({"tool": "batchgeneratorsv2", "mode": args.mode, "patch": list(patch),
                      "patches": args.patches, "seconds": secs, "patches_per_s": args.patches / secs}))


if __name__ == "__main__":
    main()
