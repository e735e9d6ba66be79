#!/usr/bin/env python3
"""Cross-check the cache's label-derived arrays (`prep build-cache --derived distance,skeleton`)
with zarr-python, scipy and scikit-image, reading the entries as a user's Python code would.

Builds two caches with the `prep` binary: the bundled data (anisotropic output spacing, about
1 x 1 x 2.9 um) in small chunks (8x32x32, so both the streamed distance transform and the
skeleton's halo cross many chunk borders), and `prep synth --preset multichannel` (two
foreground classes and an ignore label). For every entry:

  * zarr-python opens `distance` (c, z, y, x) float32 and `skeleton` (z, y, x, the label's
    dtype) with the label's shape, one distance channel per class the attributes list;
  * each distance channel equals the signed distance scipy gives on the whole label volume:
    -distance_transform_edt(mask) inside, +distance_transform_edt(~mask) outside, sampling =
    the output spacing, to float32 rounding;
  * every skeleton voxel holds a class and lies inside that class; the counts equal the
    attributes'; each class's skeleton (built chunk by chunk with a halo) equals the thinning
    of the whole mask at once (`examples/skeleton_mask`) and keeps the number of 26-connected
    components of its mask; its agreement with scikit-image's skeleton of the whole mask (the
    share within one voxel of the other, both ways) is printed and must be 70% or more (the two
    thinnings differ on vessels several voxels thick; scripts/skeleton_check.py compares them
    on thin masks).

The ignore label (dataset.json's "ignore", unannotated voxels) is no class: it must have no
distance channel and no skeleton voxels.

    python scripts/derived_check.py --prep target/debug/prep --example target/debug/examples/skeleton_mask --data data/vessels
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
from scipy import ndimage
from scipy.ndimage import distance_transform_edt
from skimage.morphology import skeletonize

from skeleton_check import within_one  # scripts/ is on the path when run as a script

failures: list[str] = []
checks = 0


def check(ok: bool, what: str) -> None:
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print(f"FAIL {what}")


def components(m: np.ndarray) -> int:
    return int(ndimage.label(m, structure=np.ones((3, 3, 3), int))[1])


def whole_skeleton(example: str, mask: np.ndarray, tmp: Path) -> np.ndarray:
    src, dst = tmp / "mask.u8", tmp / "skeleton.u8"
    mask.astype(np.uint8).tofile(src)
    subprocess.run([example, str(src), ",".join(map(str, mask.shape)), str(dst)], check=True)
    return np.fromfile(dst, np.uint8).reshape(mask.shape) > 0


def check_entry(entry: Path, label_name: str, ignore: int | None, example: str, tmp: Path) -> tuple[float, float]:
    g = zarr.open_group(str(entry), mode="r")
    attrs = g.attrs.asdict()["voxcache"]
    case = attrs["case_id"]
    derived = attrs["derived"]
    label = np.asarray(g["label"][...])
    spacing = tuple(reversed(attrs["output"]["spacing_xyz"]))
    dist = g["distance"]
    classes = derived["distance"]["classes"]
    check(ignore not in classes, f"{label_name} {case}: the ignore label {ignore} has a distance channel")
    check(dist.dtype == np.float32, f"{label_name} {case}: distance dtype {dist.dtype}")
    check(tuple(dist.shape) == (len(classes),) + label.shape,
          f"{label_name} {case}: distance shape {dist.shape} vs label {label.shape}")
    worst = 0.0
    for k, c in enumerate(classes):
        mask = label == c
        want = np.where(mask, -distance_transform_edt(mask, sampling=spacing),
                        distance_transform_edt(~mask, sampling=spacing))
        if mask.all():
            want = np.zeros(mask.shape)
        got = np.asarray(dist[k]).astype(np.float64)
        err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
        worst = max(worst, float(err.max()))
        check(err.max() <= 1e-6, f"{label_name} {case} class {c}: distance off by {err.max():.2e}")
    sk = np.asarray(g["skeleton"][...])
    check(sk.dtype == label.dtype and sk.shape == label.shape,
          f"{label_name} {case}: skeleton {sk.dtype} {sk.shape} vs label {label.dtype} {label.shape}")
    check(bool(np.all((sk == 0) | (sk == label))), f"{label_name} {case}: skeleton voxels outside their class")
    counts = {str(int(c)): int((sk == c).sum()) for c in np.unique(sk) if c != 0}
    check(counts == {k: int(v) for k, v in derived["skeleton"]["voxels"].items()},
          f"{label_name} {case}: skeleton counts {counts} vs attributes {derived['skeleton']['voxels']}")
    near = 1.0
    check(ignore is None or not bool((sk == ignore).any()),
          f"{label_name} {case}: the ignore label {ignore} has skeleton voxels")
    for c in classes:
        mask = label == c
        ours = sk == c
        whole = whole_skeleton(example, mask, tmp)
        check(bool(np.array_equal(ours, whole)),
              f"{label_name} {case} class {c}: chunked skeleton differs from the whole-volume one "
              f"in {int((ours != whole).sum())} voxels")
        check(components(ours) == components(mask),
              f"{label_name} {case} class {c}: skeleton has {components(ours)} components, mask {components(mask)}")
        theirs = skeletonize(mask) > 0
        n = min(within_one(ours, theirs), within_one(theirs, ours))
        near = min(near, n)
        check(n >= 0.7, f"{label_name} {case} class {c}: within one voxel of scikit-image's for {n:.0%}")
    return worst, near


def build(prep: str, data: Path, cache: Path, extra: list[str]) -> list[Path]:
    subprocess.run([prep, "build-cache", str(data), "--cache-dir", str(cache),
                    "--derived", "distance,skeleton", "--quiet", *extra], check=True)
    return sorted(p.parent for p in (cache / "entries").glob("*/*/zarr.json"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", required=True)
    ap.add_argument("--example", required=True, help="examples/skeleton_mask")
    ap.add_argument("--data", required=True, help="the bundled dataset (data/vessels)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        t = Path(t)
        subprocess.run([args.prep, "synth", "--preset", "multichannel", "--out", str(t / "mc")],
                       check=True, capture_output=True)
        for name, data, extra in (
            ("bundled 8x32x32 chunks", Path(args.data), ["--chunk", "8,32,32"]),
            ("multichannel", t / "mc", []),
        ):
            entries = build(args.prep, data, t / name.split()[0], extra)
            check(len(entries) > 0, f"{name}: no entries")
            labels = json.loads((data / "dataset.json").read_text()).get("labels", {})
            ignore = labels.get("ignore")
            results = [check_entry(e, name, ignore, args.example, t) for e in entries]
            print(f"{name}: {len(entries)} entries; distance vs scipy: largest relative difference "
                  f"{max(r[0] for r in results):.1e}; skeleton equal to the whole-volume thinning, within one "
                  f"voxel of scikit-image's for at least {min(r[1] for r in results):.0%}")
    print(f"{checks - len(failures)}/{checks} checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
