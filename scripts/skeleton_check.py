#!/usr/bin/env python3
"""Compare voxcache's skeletons (src/prep/derived/thinning.rs) with scikit-image's 3D `skeletonize`.

Masks: straight and oblique tubes, a branching tree of thin tubes (one to three voxels across,
like `prep synth --preset thin`), a torus (a tunnel), a hollow ball (a cavity) and random
blobs. For each, our skeleton must keep the mask's number of 26-connected components and its
Euler number (topology kept; scikit-image's is printed beside it, and on random blobs it loses
components), and each skeleton must lie within one voxel of the other for at least 90% of its
voxels; the agreement is printed (voxels in both, and within one voxel).

    python scripts/skeleton_check.py --example target/debug/examples/skeleton_mask
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import ndimage
from skimage.measure import euler_number, label
from skimage.morphology import skeletonize


def tube(mask: np.ndarray, a: np.ndarray, b: np.ndarray, r: float) -> None:
    z, y, x = np.indices(mask.shape)
    p = np.stack([z, y, x], -1).astype(float)
    d = b - a
    t = np.clip(((p - a) @ d) / (d @ d), 0, 1)
    dist = np.linalg.norm(p - (a + t[..., None] * d), axis=-1)
    mask |= dist <= r


def cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    out = []
    m = np.zeros((30, 24, 24), bool)
    tube(m, np.array([2.0, 12, 12]), np.array([27.0, 12, 12]), 3.5)
    out.append(("straight tube, radius 3.5", m))
    m = np.zeros((32, 32, 32), bool)
    tube(m, np.array([3.0, 4, 5]), np.array([28.0, 27, 22]), 2.2)
    out.append(("oblique tube, radius 2.2", m))
    m = np.zeros((40, 48, 48), bool)
    tube(m, np.array([4.0, 24, 6]), np.array([20.0, 24, 30]), 1.4)
    tube(m, np.array([20.0, 24, 30]), np.array([36.0, 10, 42]), 1.0)
    tube(m, np.array([20.0, 24, 30]), np.array([30.0, 40, 40]), 0.9)
    tube(m, np.array([12.0, 24, 18]), np.array([6.0, 40, 12]), 1.2)
    out.append(("branching thin tubes, radius 0.9-1.4", m))
    z, y, x = np.indices((16, 40, 40))
    ring = (np.sqrt((y - 19.5) ** 2 + (x - 19.5) ** 2) - 12) ** 2 + (z - 7.5) ** 2 <= 9
    out.append(("torus", ring))
    z, y, x = np.indices((24, 24, 24))
    rr = np.sqrt((z - 11.5) ** 2 + (y - 11.5) ** 2 + (x - 11.5) ** 2)
    out.append(("hollow ball", (rr <= 10) & (rr >= 6)))
    blobs = ndimage.gaussian_filter(rng.random((24, 40, 40)), 2.0)
    out.append(("random blobs", blobs > np.quantile(blobs, 0.8)))
    return out


def within_one(a: np.ndarray, b: np.ndarray) -> float:
    """Share of a's voxels with a voxel of b in their 3x3x3 neighbourhood."""
    if not a.any():
        return 1.0
    near = ndimage.binary_dilation(b, structure=np.ones((3, 3, 3), bool))
    return float((a & near).sum() / a.sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", required=True)
    args = ap.parse_args()
    failed = 0
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, mask) in enumerate(cases(np.random.default_rng(3))):
            src, dst = Path(tmp) / f"m{k}.u8", Path(tmp) / f"s{k}.u8"
            mask.astype(np.uint8).tofile(src)
            subprocess.run([args.example, str(src), ",".join(map(str, mask.shape)), str(dst)], check=True)
            ours = np.fromfile(dst, dtype=np.uint8).reshape(mask.shape).astype(bool)
            theirs = skeletonize(mask).astype(bool)
            comps = [label(v, connectivity=3).max() for v in (mask, ours, theirs)]
            eul = [euler_number(v, connectivity=3) for v in (mask, ours, theirs)]
            both = (ours & theirs).sum() / max(1, (ours | theirs).sum())
            near = min(within_one(ours, theirs), within_one(theirs, ours))
            ok = comps[0] == comps[1] and eul[0] == eul[1] and near >= 0.9
            total += 1
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {ours.sum()} voxels (scikit-image {theirs.sum()}), "
                  f"components {comps[1]} (mask {comps[0]}, scikit-image {comps[2]}), Euler {eul[1]} "
                  f"(mask {eul[0]}, scikit-image {eul[2]}); identical voxels {both:.0%}, within one voxel {near:.0%}")
    print(f"skeleton_check: {total - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
