#!/usr/bin/env python3
"""CI check: our reproduction of nnU-Net's inference preprocessing and window placement
(examples/nnunet_stages.rs) against the numpy/scipy/scikit-image reference
(scripts/nnunet_reference.py, itself checked against nnunetv2 by scripts/nnunet_import_check.py),
on every input of the nnU-Net model fixtures (tests/fixtures/nnunet_models).

    python scripts/nnunet_reference_check.py --example target/debug/examples/nnunet_stages

Per case: the crop box, the shapes and every window start equal; the preprocessed array within
1e-4 of its largest magnitude. Exit 1 on any difference.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def cases(inputs: Path):
    """Case id -> channel files, in channel order."""
    out = {}
    for f in sorted(inputs.glob("*_[0-9][0-9][0-9][0-9].nii*")):
        out.setdefault(f.name.rsplit("_", 1)[0], []).append(f)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", required=True, help="the nnunet_stages example binary")
    ap.add_argument("--fixtures", default=str(ROOT / "tests/fixtures/nnunet_models"))
    args = ap.parse_args()
    failures, checked = [], 0
    for fixture in sorted(p for p in Path(args.fixtures).iterdir() if p.is_dir()):
        model = next(p for p in fixture.iterdir() if "__" in p.name)
        for cid, files in cases(fixture / "inputs").items():
            with tempfile.TemporaryDirectory() as tmp:
                ours, ref = Path(tmp, "ours"), Path(tmp, "ref")
                subprocess.run([args.example, "--nnunet-model", str(model), "--out", str(ours), *map(str, files)], check=True)
                subprocess.run([sys.executable, str(ROOT / "scripts/nnunet_reference.py"), "--model", str(model), "--out", str(ref), *map(str, files)], check=True)
                a, b = np.load(ours / "preprocessed.npy"), np.load(ref / "preprocessed.npy")
                sa, sb = json.loads((ours / "stages.json").read_text()), json.loads((ref / "stages.json").read_text())
                name = f"{fixture.name}/{cid}"
                problems = []
                for key in ("bbox", "shape_after_cropping", "preprocessed_shape", "window_starts"):
                    if key in sb and sa[key] != sb[key]:
                        problems.append(f"{key}: ours {sa[key]} reference {sb[key]}")
                if a.shape != b.shape:
                    problems.append(f"array shape {a.shape} vs {b.shape}")
                else:
                    diff = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
                    scale = max(float(np.max(np.abs(b))), 1e-12)
                    if diff > 1e-4 * scale:
                        problems.append(f"array differs by {diff:.3g} (largest value {scale:.3g})")
                    print(f"{name}: {a.shape}, largest difference {diff:.3g} of {scale:.3g}, {len(sa['window_starts'])} windows")
                checked += 1
                failures += [f"{name}: {p}" for p in problems]
    for f in failures:
        print("FAIL", f)
    if checked == 0:
        print("FAIL no case checked")
        return 1
    print(f"{checked} cases, {len(failures)} differences")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
