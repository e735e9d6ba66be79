"""Connected components (src/geometry/components.rs, through examples/components.rs) against
scipy.ndimage.label, 6- and 26-connectivity, on random masks of several densities and shapes,
one deeper than any block (the example reads one z-slice at a time), and the largest component:

    python scripts/components_check.py --example target/debug/examples/components
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from scipy import ndimage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--example", required=True)
    a = ap.parse_args()
    rng = np.random.default_rng(11)
    cases = [((9, 13, 17), 0.3), ((5, 40, 40), 0.5), ((160, 24, 20), 0.4), ((1, 64, 64), 0.55),
             ((30, 30, 30), 0.2), ((12, 12, 12), 0.0), ((8, 16, 16), 1.0)]
    structures = {"faces": ndimage.generate_binary_structure(3, 1), "full": np.ones((3, 3, 3))}
    checks = 0
    with tempfile.TemporaryDirectory() as t:
        for shape, p in cases:
            mask = (rng.random(shape) < p)
            # A smooth blob too: few large components, as predictions have.
            if p == 0.3:
                mask = ndimage.gaussian_filter(rng.random(shape), 1.5) > 0.52
            mpath, lpath = os.path.join(t, "m.u8"), os.path.join(t, "l.u32")
            mask.astype(np.uint8).tofile(mpath)
            for name, structure in structures.items():
                want, n = ndimage.label(mask, structure=structure)
                run = subprocess.run([a.example, mpath, ",".join(map(str, shape)), name, lpath],
                                     capture_output=True, text=True, check=True)
                got = np.fromfile(lpath, dtype="<u4").reshape(shape)
                if not np.array_equal(got, want):
                    sys.exit(f"{shape} p={p} {name}: labels differ from scipy's ({n} components)")
                if n:
                    sizes = np.bincount(want.ravel())[1:]
                    largest = int(np.argmax(sizes)) + 1
                    if f"largest Some({largest})" not in run.stdout:
                        sys.exit(f"{shape} {name}: largest {run.stdout.strip()}, scipy's {largest}")
                checks += 1
    print(f"components_check: {checks} labelings identical to scipy.ndimage.label")


if __name__ == "__main__":
    main()
