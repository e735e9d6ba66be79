#!/usr/bin/env python3
"""Cross-check `evaluate` against MedPy (medpy.metric.binary, from PyPI) on the same files.

MedPy is the implementation nnU-Net v1 evaluated with. Its Dice (`dc`), IoU (`jc`) and
Hausdorff distance (`hd`) are compared as they are. For HD95 and ASD, `evaluate` follows MONAI
(HausdorffDistanceMetric(percentile=95): the larger of the two directed 95th percentiles;
SurfaceDistanceMetric(symmetric=True): the mean of both directions' distances together), so
those are computed here from MedPy's directed surface distances (`__surface_distances`: edge
voxels by binary erosion with the 6-connected cross, scipy's exact distance transform scaled by
the voxel spacing), which are the distances MONAI's metrics take their percentiles and means of.

clDice (Shit et al. 2021) is compared with the clDice authors' metric: the same formula on
scikit-image's `skeletonize` of each mask. Skeletons from two thinning algorithms differ by a
voxel here and there (scripts/skeleton_check.py states how much), so clDice agrees to a
tolerance (0.05), not exactly, and only where both skeletons have 50 voxels or more: a blob's
skeleton is a handful of voxels whose count each algorithm sets differently, and clDice of blobs
means little (it is a metric for tubes). The largest difference of each kind is printed.

With `--monai` (torch and monai installed; not in CI: torch is gigabytes), every number is also
compared with MONAI's own metrics (DiceMetric, MeanIoU, HausdorffDistanceMetric with and without
percentile=95, SurfaceDistanceMetric(symmetric=True), each given the header spacing).

Cases: synthetic label volumes written by nibabel (blobs of two classes, thin tubes, objects
touching the grid's border, anisotropic spacing, a class one side lacks, a 2-D image), and
optionally a folder of real predictions with their references (CI: the README chain's
predictions of the bundled data).

    python scripts/evaluate_check.py --evaluate target/debug/evaluate [--pred DIR --gt DIR] [--monai]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import nibabel as nib
import numpy as np
from medpy.metric import binary as mb
from skimage.morphology import skeletonize

surface_distances = getattr(mb, "__surface_distances")
failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print(f"FAIL {what}")


def close(a, b, rel=1e-6):
    return a is not None and abs(a - b) <= rel * max(1.0, abs(b))


def save(path, data, zooms):
    img = nib.Nifti1Image(data.astype(np.uint8), np.diag(list(zooms) + [1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))


def blobs(rng, shape, n, value, out, scale=(1.0, 1.0, 1.0)):
    grid = np.indices(shape).astype(np.float64)
    for _ in range(n):
        c = [rng.uniform(0, s) for s in shape]
        r = rng.uniform(3, 9)
        d = sum(((grid[k] - c[k]) * scale[k]) ** 2 for k in range(3))
        out[d < r * r] = value


def tube(shape, value, out, shift):
    """A thin tube winding along z, about two voxels across."""
    for z in range(shape[2]):
        x = int(shape[0] / 2 + 8 * np.sin(z / 6.0) + shift)
        y = int(shape[1] / 2 + 6 * np.cos(z / 9.0))
        out[x - 1 : x + 1, y - 1 : y + 1, z] = value


def synthetic(folder):
    """Write pred/ and ref/ cases; return them with their spacings."""
    rng = np.random.default_rng(12)
    (folder / "pred").mkdir()
    (folder / "ref").mkdir()
    cases = []
    for i in range(6):
        shape = (int(rng.integers(40, 70)), int(rng.integers(40, 70)), int(rng.integers(20, 40)))
        zooms = (float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.5, 1.0)), float(rng.uniform(1.0, 3.0)))
        ref = np.zeros(shape, np.uint8)
        pred = np.zeros(shape, np.uint8)
        blobs(rng, shape, 4, 1, ref, scale=(1, 1, 2))
        # The prediction: the reference's blobs moved a little, plus some of its own.
        pred[:] = np.roll(ref, shift=(int(rng.integers(-2, 3)), int(rng.integers(-2, 3)), 1), axis=(0, 1, 2))
        blobs(rng, shape, 1, 1, pred)
        if i != 3:
            tube(shape, 2, ref, 0)
            # Case 4 predicts no tube at all (a class one side lacks); the rest a shifted one.
            if i != 4:
                tube(shape, 2, pred, int(rng.integers(0, 3)))
        if i == 5:
            # Objects touching the grid's border: edges there too.
            ref[:4, :, :] = 1
            pred[:3, :, :] = 1
        save(folder / "ref" / f"case_{i}.nii.gz", ref, zooms)
        save(folder / "pred" / f"case_{i}.nii.gz", pred, zooms)
        cases.append(f"case_{i}")
    # Vessels: winding tubes 2.4 to 5 voxels across, the prediction thinner or thicker, shifted
    # a voxel, with gaps (the breaks clDice is for).
    for i in range(3):
        shape = (48, 48, 100)
        ref = np.zeros(shape, np.uint8)
        pred = np.zeros(shape, np.uint8)
        grid = np.indices(shape[:2]).astype(np.float64)
        for _ in range(3):
            a, b = rng.uniform(-12, 12, 2)
            f, g = rng.uniform(6, 14, 2)
            r = rng.uniform(1.2, 2.5)
            dr = rng.uniform(-0.5, 0.5)
            gaps = rng.integers(5, 95, 2)
            shift = int(rng.integers(0, 2))
            for z in range(shape[2]):
                cx, cy = 24 + a * np.sin(z / f), 24 + b * np.cos(z / g)
                d2 = (grid[0] - cx) ** 2 + (grid[1] - cy) ** 2
                ref[..., z] |= d2 < r * r
                if not any(abs(z - gz) < 4 for gz in gaps):
                    d2 = (grid[0] - cx - shift) ** 2 + (grid[1] - cy) ** 2
                    pred[..., z] |= d2 < (r + dr) ** 2
        zooms = (0.8, 0.8, 1.5)
        save(folder / "ref" / f"vessels_{i}.nii.gz", ref, zooms)
        save(folder / "pred" / f"vessels_{i}.nii.gz", pred, zooms)
        cases.append(f"vessels_{i}")
    # A 2-D image (one slice, dim[0] = 2): measured in 2-D, as MedPy and MONAI measure 2-D arrays.
    ref = np.zeros((50, 40), np.uint8)
    pred = np.zeros((50, 40), np.uint8)
    ref[10:30, 8:25] = 1
    pred[12:33, 6:24] = 1
    for name, data in (("ref", ref), ("pred", pred)):
        img = nib.Nifti1Image(data, np.diag([0.7, 1.3, 1.0, 1.0]))
        img.header.set_xyzt_units("mm")
        nib.save(img, str(folder / name / "flat.nii.gz"))
    return folder / "pred", folder / "ref"


def medpy_metrics(p, g, zooms):
    d_pg = surface_distances(p, g, zooms, 1)
    d_gp = surface_distances(g, p, zooms, 1)
    return {
        "dice": mb.dc(p, g),
        "iou": mb.jc(p, g),
        "hd": mb.hd(p, g, zooms, 1),
        "hd95": max(np.percentile(d_pg, 95), np.percentile(d_gp, 95)),
        "asd": float(np.mean(np.concatenate([d_pg, d_gp]))),
    }


def cldice_skimage(p, g):
    """The clDice authors' metric (their cl_score and harmonic mean) on skimage's skeletons,
    and the smaller skeleton's voxel count."""
    sp, sg = skeletonize(p) > 0, skeletonize(g) > 0
    tprec = (sp & g).sum() / max(sp.sum(), 1)
    tsens = (sg & p).sum() / max(sg.sum(), 1)
    cl = 0.0 if tprec + tsens == 0 else 2 * tprec * tsens / (tprec + tsens)
    return cl, int(min(sp.sum(), sg.sum()))


cldice_gaps = {"tubes": [], "small skeletons": []}


def monai_metrics(p, g, zooms):
    import torch
    from monai.metrics import (DiceMetric, HausdorffDistanceMetric, MeanIoU,
                               SurfaceDistanceMetric)

    yp = torch.from_numpy(p[None, None].astype(np.float32))
    yg = torch.from_numpy(g[None, None].astype(np.float32))
    sp = list(zooms)
    one = lambda m, **kw: float(m(yp, yg, **kw).reshape(-1)[0])  # noqa: E731
    return {
        "dice": one(DiceMetric(include_background=True)),
        "iou": one(MeanIoU(include_background=True)),
        "hd95": one(HausdorffDistanceMetric(include_background=True, percentile=95), spacing=sp),
        "hd": one(HausdorffDistanceMetric(include_background=True), spacing=sp),
        "asd": one(SurfaceDistanceMetric(include_background=True, symmetric=True), spacing=sp),
    }


def compare(evaluate, pred_dir, ref_dir, label, monai=False):
    out = subprocess.run(
        [evaluate, str(pred_dir), str(ref_dir), "--json", "--quiet"],
        capture_output=True,
        text=True,
    )
    check(out.returncode == 0, f"{label}: evaluate exit {out.returncode}: {out.stderr.strip()}")
    if out.returncode != 0:
        return
    report = json.loads(out.stdout)
    measured = 0
    for case in report["cases"]:
        pred_img = nib.load(case["prediction"])
        ref_img = nib.load(case["reference"])
        zooms = tuple(float(z) for z in ref_img.header.get_zooms()[: len(ref_img.shape)])
        p_all = np.asarray(pred_img.dataobj)
        g_all = np.asarray(ref_img.dataobj)
        for m in case["classes"]:
            p = np.isin(p_all, m["values"])
            g = np.isin(g_all, m["values"])
            name = f"{label} {case['id']} {m['class']}"
            check(m["tp"] == int((p & g).sum()), f"{name}: tp {m['tp']} vs {(p & g).sum()}")
            if p.any() and g.any():
                ref = medpy_metrics(p, g, zooms)
                for k, v in ref.items():
                    check(close(m[k], v), f"{name}: {k} {m[k]} vs MedPy {v}")
                cl, voxels = cldice_skimage(p, g)
                gap = abs(m["cldice"] - cl)
                if voxels >= 50:
                    cldice_gaps["tubes"].append(gap)
                    check(gap <= 0.05, f"{name}: clDice {m['cldice']} vs skimage-based {cl}")
                else:
                    cldice_gaps["small skeletons"].append(gap)
                if monai:
                    # MONAI computes in float32 in places: a looser tolerance.
                    for k, v in monai_metrics(p, g, zooms).items():
                        check(close(m[k], v, 1e-5), f"{name}: {k} {m[k]} vs MONAI {v}")
                measured += 1
            elif p.any() or g.any():
                # One side empty: Dice 0, distances undefined (MONAI: inf; MedPy raises).
                check(
                    m["dice"] == 0.0 and m["cldice"] == 0.0 and m["hd95"] is None,
                    f"{name}: one side empty: {m}",
                )
    against = "MedPy and MONAI" if monai else "MedPy"
    print(f"{label}: {len(report['cases'])} cases, {measured} class pairs compared with {against}")
    for kind, gaps in cldice_gaps.items():
        if gaps:
            print(f"{label}: clDice vs skimage-skeleton clDice, {kind} ({len(gaps)} class pairs): "
                  f"largest difference {max(gaps):.4f}")
        gaps.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evaluate", required=True, help="the evaluate binary")
    ap.add_argument("--pred", help="a folder of predictions (optional)")
    ap.add_argument("--gt", help="their references")
    ap.add_argument("--monai", action="store_true", help="compare with MONAI's metrics too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        pred, ref = synthetic(Path(t))
        compare(args.evaluate, pred, ref, "synthetic", args.monai)
    if args.pred:
        compare(args.evaluate, args.pred, args.gt, "predictions", args.monai)
    print(f"{checks - len(failures)}/{checks} checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
