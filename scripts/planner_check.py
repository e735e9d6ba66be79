#!/usr/bin/env python3
"""Our planner (examples/plan_fingerprint.rs) against scripts/nnunet_planner_reference.py, the
numpy-only version of nnU-Net 2.8.1's planner (checked against nnunetv2 itself: see
docs/nnunet-planner.md), on the two stored fingerprints (tests/nnunet_plans) and on random
fingerprints of every shape family: isotropic, anisotropic (thick slices), a coarse axis that is
not the first, mixed spacings, single slices. Every preset; every configuration's spacing (to
the bit), median shape, patch, batch size, strides, kernels, features and blocks must agree, and
the same configurations must exist.

    python scripts/planner_check.py --example target/debug/examples/plan_fingerprint [--cases 250] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from nnunet_planner_reference import plan_experiment  # noqa: E402

PRESETS = {"default": "default", "M": "resenc-m", "L": "resenc-l", "XL": "resenc-xl"}


def random_fingerprint(rng: random.Random) -> tuple[dict, dict]:
    """A dataset of 3 to 40 cases of one shape family, spacings in mm (z, y, x)."""
    n = rng.randint(3, 40)
    family = rng.choice(["iso", "thick", "thick", "coarse-x", "slices", "mixed"])
    xy0 = rng.choice([0.3, 0.5, 0.7, 0.8, 1.0, 1.5])
    spacings, shapes = [], []
    for _ in range(n):
        xy = xy0 * rng.choice([1, 1, 1, 0.8, 1.25, 2])
        edge = rng.choice([64, 128, 256, 512, 700])
        inplane = [rng.randint(edge // 2, edge), rng.randint(edge // 2, edge)]
        if family == "iso":
            sp, z = [xy, xy, xy], rng.randint(5, edge)
        elif family == "thick":
            sp, z = [xy * rng.choice([2.5, 3, 4, 5, 6, 8, 10]), xy, xy], rng.randint(5, max(6, edge // 3))
        elif family == "coarse-x":
            sp, z = [xy, xy, xy * rng.choice([3, 5, 7])], rng.randint(edge // 2, edge)
            inplane[1] = rng.randint(5, 60)
        elif family == "slices":
            sp, z = [xy * rng.choice([3, 5]), xy, xy], 1
        else:
            sp, z = [xy * rng.uniform(0.5, 6), xy * rng.uniform(0.9, 1.1), xy], rng.randint(5, max(6, edge // 3))
        spacings.append(sp)
        shapes.append([z] + inplane)
    classes = rng.choice([2, 2, 3, 5])
    fingerprint = {"spacings": spacings, "shapes_after_crop": shapes,
                   "median_relative_size_after_cropping": 1.0,
                   "foreground_intensity_properties_per_channel": {"0": {}}}
    dataset = {"channel_names": {"0": "MRI"}, "labels": {"background": 0, **{f"c{i}": i for i in range(1, classes)}},
               "numTraining": rng.choice([n, 10, 70]), "file_ending": ".nii.gz"}
    return fingerprint, dataset


def compare(ours: dict, theirs: dict) -> list[str]:
    errors = []
    if ours["transpose_forward"] != theirs["transpose_forward"]:
        errors.append(f"axis order {ours['transpose_forward']} vs {theirs['transpose_forward']}")
    want = {k: v for k, v in theirs["configurations"].items() if k != "3d_cascade_fullres"}
    if sorted(ours["configurations"]) != sorted(want):
        return errors + [f"configurations {sorted(ours['configurations'])} vs {sorted(want)}"]
    for name, t in want.items():
        o, arch = ours["configurations"][name], t["architecture"]["arch_kwargs"]
        pairs = [("spacing", o["spacing"], t["spacing"]),
                 ("median shape", o["median_shape"], [float(x) for x in t["median_image_size_in_voxels"]]),
                 ("patch", o["patch_size"], t["patch_size"]), ("batch", o["batch_size"], t["batch_size"]),
                 ("strides", o["strides"], arch["strides"]), ("kernels", o["kernel_sizes"], arch["kernel_sizes"]),
                 ("features", o["features_per_stage"], arch["features_per_stage"]),
                 ("blocks", o["blocks"], arch.get("n_conv_per_stage", arch.get("n_blocks_per_stage"))),
                 ("decoder blocks", o["decoder_blocks"], arch["n_conv_per_stage_decoder"])]
        errors += [f"{name} {what}: ours {a} vs {b}" for what, a, b in pairs if a != b]
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", required=True, help="the built examples/plan_fingerprint binary")
    ap.add_argument("--cases", type=int, default=250, help="random fingerprints (each with every preset)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    stored = ROOT / "tests" / "nnunet_plans"
    datasets = [(json.loads((stored / f"{d}__dataset_fingerprint.json").read_text()),
                 json.loads((stored / f"{d}__dataset.json").read_text()), d)
                for d in ("Dataset501_Vessels", "Dataset502_MiniVess")]
    datasets += [(*random_fingerprint(rng), f"random #{i}") for i in range(args.cases)]
    passed, failed = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for fp, dj, what in datasets:
            (Path(tmp) / "fp.json").write_text(json.dumps(fp))
            (Path(tmp) / "ds.json").write_text(json.dumps(dj))
            for ref_name, ours_name in PRESETS.items():
                theirs, _ = plan_experiment(fp, dj, ref_name)
                run = subprocess.run([args.example, str(Path(tmp) / "fp.json"), str(Path(tmp) / "ds.json"),
                                      ours_name], capture_output=True, text=True)
                errors = [f"exit {run.returncode}: {run.stderr.strip()}"] if run.returncode else \
                    compare(json.loads(run.stdout), json.loads(json.dumps(theirs)))
                if errors:
                    failed += 1
                    print(f"FAIL {what} {ours_name}: " + "; ".join(errors[:4]))
                else:
                    passed += 1
    print(f"planner_check: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
