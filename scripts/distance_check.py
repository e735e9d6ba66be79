#!/usr/bin/env python3
"""Cross-check voxcache's distance transforms against scipy's distance_transform_edt.

Random masks (sparse and dense, isotropic and anisotropic spacing, one-slice and thin
volumes, a tube) and the empty and full masks go through `examples/distance_map.rs`; the
distance to the nearest inside voxel must equal scipy.ndimage.distance_transform_edt(~mask,
sampling=spacing) to 1e-14 relative (the two add the per-axis squares in different orders:
equal in exact arithmetic, at times a last-bit apart in floating point), and the signed
distance must be -edt(mask) inside, +edt(~mask) outside (0 everywhere for an empty or full
mask).

    python scripts/distance_check.py --example target/debug/examples/distance_map
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.ndimage import distance_transform_edt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    cases = []
    for shape, spacing, density in [
        ((12, 20, 18), (1.0, 1.0, 1.0), 0.02),
        ((9, 31, 27), (2.9, 0.99, 0.99), 0.01),
        ((1, 40, 33), (4.0, 0.31, 0.5), 0.05),
        ((30, 6, 5), (0.7, 1.3, 2.2), 0.2),
        ((16, 16, 16), (1.0, 2.0, 0.5), 0.5),
    ]:
        cases.append((f"random {shape} at {spacing}, {density:.0%}", rng.random(shape) < density, spacing))
    z, y, x = np.meshgrid(np.arange(20), np.arange(24), np.arange(24), indexing="ij")
    tube = (y - 12) ** 2 + (x - 11.5) ** 2 <= 4
    cases.append(("a tube along z", tube, (1.5, 0.8, 0.8)))
    cases.append(("empty", np.zeros((5, 6, 7), bool), (1.0, 1.0, 1.0)))
    cases.append(("full", np.ones((5, 6, 7), bool), (1.0, 1.0, 1.0)))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, mask, sp) in enumerate(cases):
            path = Path(tmp) / f"m{k}.u8"
            mask.astype(np.uint8).tofile(path)
            out = Path(tmp) / f"o{k}"
            subprocess.run([args.example, str(path), ",".join(map(str, mask.shape)),
                            ",".join(map(str, sp)), str(out)], check=True)
            dist = np.fromfile(f"{out}.dist.f64", dtype="<f8").reshape(mask.shape)
            sdf = np.fromfile(f"{out}.sdf.f32", dtype="<f4").reshape(mask.shape)
            if mask.any() and not mask.all():
                want = distance_transform_edt(~mask, sampling=sp)
                want_sdf = np.where(mask, -distance_transform_edt(mask, sampling=sp),
                                    distance_transform_edt(~mask, sampling=sp)).astype(np.float32)
                rel = np.abs(dist - want).max() / max(1.0, want.max())
                exact = np.mean(dist == want)
                ok = rel <= 1e-14 and np.allclose(sdf, want_sdf, rtol=1e-6, atol=0)
                detail = f"max rel. diff {rel:.1e}, {exact:.2%} of voxels bit-identical"
            elif mask.all():
                ok = np.all(dist == 0) and np.all(sdf == 0)
                detail = "0 everywhere"
            else:
                ok = np.all(np.isinf(dist)) and np.all(sdf == 0)
                detail = "no inside voxel: infinite distance, signed distance 0"
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print(f"distance_check: {len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
