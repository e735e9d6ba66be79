#!/usr/bin/env python3
"""Whole-volume SimpleITK reference for `prep build-cache` (benchmarks only).

What a SimpleITK user would write to preprocess an nnU-Net-layout dataset, one case at a time
(the memory-friendly way): read image and label, resample each to the target spacing with
ResampleImageFilter (linear for the image, nearest neighbour for the label), z-score the image
over its nonzero voxels (numpy, float32) and save both.

Spacings are in the files' units, like prep's (SimpleITK itself turns micrometers into mm; the
outputs are written in mm, as SimpleITK writes them). The output grid is the same edge-aligned
grid as prep's: per axis m = round(n * s / t) voxels
(half away from zero, at least 1) of spacing s * n / m, the first voxel centred at continuous
input index 0.5 * n / m - 0.5.

By default the image is resampled first and z-scored after (over the resampled volume's
nonzero voxels). `--normalize-first` z-scores the input before resampling instead, which is
what prep does and saves one output-sized copy.

SimpleITK's own multithreading uses every core unless --threads says otherwise.

Usage:
    python scripts/sitk_reference.py DATA --out DIR --spacing x,y,z [--format nii|nii.gz|npy]
                                     [--normalize-first] [--threads N] [--json]
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import SimpleITK as sitk

NII_SUFFIXES = (".nii.gz", ".nii")


def strip_nii(name):
    for suf in NII_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return None


def find_cases(data):
    """(id, image path, label path or None) for each imagesTr/{id}_0000.nii[.gz]."""
    images = data / "imagesTr"
    labels = data / "labelsTr"
    if not images.is_dir():
        sys.exit(f"error: {images} is not a folder (expected an nnU-Net layout dataset)")
    cases = []
    for p in sorted(images.iterdir()):
        stem = strip_nii(p.name)
        if stem is None or not stem.endswith("_0000"):
            continue
        cid = stem[: -len("_0000")]
        label = None
        for suf in NII_SUFFIXES:
            q = labels / f"{cid}{suf}"
            if q.is_file():
                label = q
                break
        cases.append((cid, p, label))
    if not cases:
        sys.exit(f"error: no imagesTr/*_0000.nii[.gz] files in {data}")
    return cases


def unit_scale(img):
    """SimpleITK lengths per file length unit: ITK's NIfTI reader turns meters and micrometers
    into millimeters (xyzt_units 1: x1000, 3: x0.001), while prep and --spacing use the files'
    own units."""
    code = 2
    if img.HasMetaDataKey("xyzt_units"):
        try:
            code = int(img.GetMetaData("xyzt_units")) & 7
        except ValueError:
            pass
    return {1: 1000.0, 3: 0.001}.get(code, 1.0)


def output_grid(img, target):
    """Size, spacing and origin of the edge-aligned output grid (same as prep's); `target` in
    the file's units, the result in SimpleITK's."""
    n = img.GetSize()
    k = unit_scale(img)
    target = [t * k for t in target]
    s = img.GetSpacing()
    m = [max(1, int(math.floor(n[a] * s[a] / target[a] + 0.5))) for a in range(3)]
    spacing = [s[a] * n[a] / m[a] for a in range(3)]
    origin = img.TransformContinuousIndexToPhysicalPoint([0.5 * n[a] / m[a] - 0.5 for a in range(3)])
    return m, spacing, origin


def resample(img, size, spacing, origin, interpolator, pixel_type):
    f = sitk.ResampleImageFilter()
    f.SetSize([int(v) for v in size])
    f.SetOutputSpacing(spacing)
    f.SetOutputOrigin(origin)
    f.SetOutputDirection(img.GetDirection())
    f.SetTransform(sitk.Transform())
    f.SetInterpolator(interpolator)
    f.SetDefaultPixelValue(0)
    f.SetOutputPixelType(pixel_type)
    return f.Execute(img)


def zscore_nonzero_inplace(arr):
    """arr = (arr - mean) / std on its nonzero voxels, in place, float64 sums, in slabs of ~16
    Mvoxel so no temporary grows with the volume (mean and std as in prep: population std,
    floor 1e-8)."""
    slab = max(1, (16 << 20) // max(1, arr.shape[1] * arr.shape[2]))
    n, total = 0, 0.0
    for z in range(0, arr.shape[0], slab):
        a = arr[z : z + slab]
        nz = a[a != 0]
        n += nz.size
        total += float(nz.sum(dtype=np.float64))
    if n == 0:
        return
    mean = total / n
    ss = 0.0
    for z in range(0, arr.shape[0], slab):
        a = arr[z : z + slab]
        d = a[a != 0].astype(np.float64) - mean
        ss += float(np.dot(d, d))
    std = max(math.sqrt(ss / n), 1e-8)
    for z in range(0, arr.shape[0], slab):
        a = arr[z : z + slab]
        mask = a != 0
        a[mask] = ((a[mask] - np.float32(mean)) * np.float32(1.0 / std)).astype(np.float32)


def nifti_affine(img):
    """RAS affine (in mm) of a SimpleITK (LPS) image's geometry."""
    d = np.array(img.GetDirection(), dtype=np.float64).reshape(3, 3)
    a = np.eye(4)
    a[:3, :3] = d * np.array(img.GetSpacing())[None, :]
    a[:3, 3] = img.GetOrigin()
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ a


def save_array(arr_zyx, like, path, fmt):
    """Save a (z, y, x) numpy array with the geometry of SimpleITK image `like`."""
    if fmt == "npy":
        np.save(path, arr_zyx)
        return
    img = nib.Nifti1Image(arr_zyx.T, nifti_affine(like))  # (x, y, z) view, no copy
    img.header.set_xyzt_units("mm")  # SimpleITK's units, as sitk.WriteImage writes them
    img.set_qform(img.affine, code=1)
    img.set_sform(img.affine, code=1)
    nib.save(img, str(path))


def save_image(img, path, fmt):
    if fmt == "npy":
        np.save(path, sitk.GetArrayViewFromImage(img))
    else:
        sitk.WriteImage(img, str(path), useCompression=(fmt == "nii.gz"))


def file_bytes(path):
    return path.stat().st_size if path.exists() else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, help="dataset folder with imagesTr/ and labelsTr/")
    ap.add_argument("--out", type=Path, required=True, help="output folder (created)")
    ap.add_argument("--spacing", required=True, help="target spacing x,y,z")
    ap.add_argument("--format", choices=["nii", "nii.gz", "npy"], default="nii")
    ap.add_argument("--normalize-first", action="store_true",
                    help="z-score the input before resampling (prep's order) instead of after")
    ap.add_argument("--threads", type=int, default=0, help="SimpleITK threads (default: all cores)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = ap.parse_args()

    try:
        target = [float(v) for v in args.spacing.split(",")]
        assert len(target) == 3 and all(t > 0 and math.isfinite(t) for t in target)
    except (ValueError, AssertionError):
        sys.exit(f"error: --spacing {args.spacing!r}: expected three positive numbers x,y,z")
    if args.threads > 0:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(args.threads)
    threads = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()

    cases = find_cases(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    ext = {"nii": ".nii", "nii.gz": ".nii.gz", "npy": ".npy"}[args.format]
    order = "normalize-first" if args.normalize_first else "resample-first"
    print(f"sitk_reference: {len(cases)} cases from {args.data} -> {args.out}, spacing {target}, "
          f"format {args.format}, {order}, SimpleITK {sitk.Version.VersionString()} "
          f"with {threads} threads", flush=True)

    t_all = time.perf_counter()
    total_vox = 0
    total_bytes = 0
    per_case = []
    for cid, img_path, lab_path in cases:
        t0 = time.perf_counter()
        img = sitk.ReadImage(str(img_path))
        lab = sitk.ReadImage(str(lab_path)) if lab_path else None
        t_read = time.perf_counter()
        size, spacing, origin = output_grid(img, target)

        if args.normalize_first:
            arr = sitk.GetArrayFromImage(img).astype(np.float32)
            zscore_nonzero_inplace(arr)
            src = sitk.GetImageFromArray(arr, isVector=False)
            src.CopyInformation(img)
            del arr, img
            res = resample(src, size, spacing, origin, sitk.sitkLinear, sitk.sitkFloat32)
            del src
            t_res = time.perf_counter()
            t_norm = t_res
            img_out = args.out / f"{cid}_0000{ext}"
            save_image(res, img_out, args.format)
        else:
            res = resample(img, size, spacing, origin, sitk.sitkLinear, sitk.sitkFloat32)
            del img
            t_res = time.perf_counter()
            arr = sitk.GetArrayFromImage(res)  # writable float32 copy, (z, y, x)
            zscore_nonzero_inplace(arr)
            t_norm = time.perf_counter()
            img_out = args.out / f"{cid}_0000{ext}"
            save_array(arr, res, img_out, args.format)
            del arr
        del res

        t_lab = time.perf_counter()
        lab_out = None
        if lab is not None:
            lres = resample(lab, size, spacing, origin, sitk.sitkNearestNeighbor, sitk.sitkUInt8)
            del lab
            lab_out = args.out / f"{cid}{ext}"
            save_image(lres, lab_out, args.format)
            del lres
        t1 = time.perf_counter()

        vox = size[0] * size[1] * size[2]
        nbytes = file_bytes(img_out) + (file_bytes(lab_out) if lab_out else 0)
        total_vox += vox
        total_bytes += nbytes
        dt = t1 - t0
        per_case.append({"id": cid, "out_shape_xyz": size, "out_voxels": vox, "seconds": round(dt, 3)})
        print(f"  {cid}: {tuple(size)} = {vox / 1e6:.1f} Mvoxel in {dt:.2f} s "
              f"(read {t_read - t0:.2f}, image resample {t_res - t_read:.2f}, "
              f"zscore {t_norm - t_res:.2f}, image save+label {t1 - t_norm:.2f} "
              f"[label {t1 - t_lab:.2f}]); {nbytes / 2**20:.1f} MiB", flush=True)

    wall = time.perf_counter() - t_all
    rate = total_vox / wall if wall > 0 else 0.0
    print(f"total: {len(cases)} cases, {total_vox / 1e6:.1f} Mvoxel out, "
          f"{total_bytes / 2**20:.1f} MiB written, {wall:.2f} s, {rate / 1e6:.1f} Mvoxel/s")
    if args.json:
        print(json.dumps({
            "tool": "sitk_reference", "cases": len(cases), "out_voxels": total_vox,
            "bytes_written": total_bytes, "wall_seconds": wall, "voxels_per_second": rate,
            "threads": threads, "format": args.format, "order": order,
            "simpleitk": sitk.Version.VersionString(), "per_case": per_case,
        }))


if __name__ == "__main__":
    main()
