#!/usr/bin/env python3
"""Cross-check the trainer's spatial augmentation against scipy on a real cache.

`examples/augment_patch.rs` writes rotated, scaled and elastically deformed patches of a cached
case, read through the trainer's code (only the box the coordinates need, one interpolation).
This script reads the same case whole with zarr-python and checks, per patch:

- the source coordinates equal the documented map, transcribed here independently:
  source(p) = centre + scale * Rz Ry Rx (p - (size - 1) / 2), centre = start + (size - 1) / 2;
- every image channel equals scipy.ndimage.map_coordinates(volume, coords, order=1,
  mode="grid-constant", cval=0) (linear over the zero-padded volume);
- the label equals the class with the largest linearly interpolated indicator (outside the
  volume: background), ties excepted.

    python scripts/augment_check.py --example target/debug/examples/augment_patch --cache CACHE
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import zarr
from scipy.ndimage import map_coordinates


def rotation(angles: list[float]) -> np.ndarray:
    """Rz @ Ry @ Rx acting on (z, y, x) vectors: Rz turns (y, x), Ry (z, x), Rx (z, y)."""
    az, ay, ax = angles
    c, s = np.cos, np.sin
    rz = np.array([[1, 0, 0], [0, c(az), -s(az)], [0, s(az), c(az)]])
    ry = np.array([[c(ay), 0, s(ay)], [0, 1, 0], [-s(ay), 0, c(ay)]])
    rx = np.array([[c(ax), -s(ax), 0], [s(ax), c(ax), 0], [0, 0, 1]])
    return rz @ ry @ rx


def expected_coords(meta: dict) -> np.ndarray:
    size = np.array(meta["size"])
    half = (size - 1) / 2.0
    centre = np.array(meta["start"], dtype=np.float64) + half
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in size], indexing="ij"), axis=-1).reshape(-1, 3)
    m = meta["scale"] * rotation(meta["angles"])
    return centre + (grid - half) @ m.T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", required=True, help="the built augment_patch example")
    ap.add_argument("--cache", required=True, help="a cache built by prep build-cache")
    args = ap.parse_args()
    failures = 0
    checks = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failures, checks
        checks += 1
        if not ok:
            failures += 1
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    with tempfile.TemporaryDirectory() as out:
        subprocess.run([args.example, args.cache, out], check=True, stdout=subprocess.DEVNULL)
        metas = sorted(Path(out).glob("patch_*.json"), key=lambda p: int(p.stem.split("_")[1]))
        check(len(metas) >= 5, f"{len(metas)} patches written")
        volumes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for mp in metas:
            meta = json.loads(mp.read_text())
            k = mp.stem
            size = tuple(meta["size"])
            n = int(np.prod(size))
            entry = meta["entry"]
            if entry not in volumes:
                g = zarr.open_group(entry, mode="r")
                volumes[entry] = (np.asarray(g["image"][:], dtype=np.float32), np.asarray(g["label"][:]))
            image, label = volumes[entry]
            coords = np.fromfile(Path(out) / f"{k}.coords.f64", dtype="<f8").reshape(n, 3)
            ours_img = np.fromfile(Path(out) / f"{k}.image.f32", dtype="<f4").reshape((meta["channels"],) + size)
            ours_lab = np.fromfile(Path(out) / f"{k}.label.u16", dtype="<u2").reshape(size)
            what = f"{k} (angles {np.round(meta['angles'], 2).tolist()}, scale {meta['scale']}, elastic {meta['elastic']})"
            if not meta["elastic"]:
                d = np.abs(coords - expected_coords(meta)).max()
                check(d < 1e-9, f"{what}: coordinates equal the documented map (max diff {d:.1e})")
            for c in range(meta["channels"]):
                ref = map_coordinates(image[c].astype(np.float64), coords.T, order=1,
                                      mode="grid-constant", cval=0.0, prefilter=False).reshape(size)
                err = np.abs(ours_img[c] - ref).max() / max(1.0, np.abs(ref).max())
                check(err < 1e-5, f"{what}: image channel {c} equals map_coordinates (max rel. diff {err:.1e})")
            classes = np.union1d([0], np.unique(label))
            weights = np.stack([
                map_coordinates((label == v).astype(np.float64), coords.T, order=1, mode="grid-constant",
                                cval=1.0 if v == 0 else 0.0, prefilter=False)
                for v in classes
            ])
            ref_lab = classes[np.argmax(weights, axis=0)].reshape(size)
            top2 = np.sort(weights, axis=0)[-2:] if len(classes) > 1 else np.zeros((2, n))
            tie = (np.abs(top2[1] - top2[0]) < 1e-9).reshape(size)
            bad = int(((ours_lab != ref_lab) & ~tie).sum())
            fg = int((ours_lab != 0).sum())
            check(bad == 0, f"{what}: label equals the per-class interpolation ({bad} differ, {int(tie.sum())} ties, {fg} foreground voxels)")
    print(f"augment_check: {checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
