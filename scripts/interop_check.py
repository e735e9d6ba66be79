#!/usr/bin/env python3
"""Cross-check `prep build-cache` output against zarr-python, SimpleITK and scipy.

Builds a small real-data dataset (the MNI152 1 mm T1 template and brain mask shipped in the
PyPI package `nimare`, plus a cropped copy of it with a permuted, flipped, anisotropic affine,
scaled int16 voxels and a uint16 label), caches it with the `prep` binary under several
settings, and checks that

  * zarr-python (v3) opens every entry and sees the shapes, dtypes and dimension names the
    group attributes promise;
  * the image matches SimpleITK's ResampleImageFilter (linear) and scipy.ndimage.zoom
    (order=1, grid_mode=True, mode='nearest'), and the label matches nearest-neighbour
    resampling, under the documented edge-aligned convention: per axis with n input voxels of
    spacing s and target t, m = max(1, round(n*s/t)), and output voxel j samples input
    coordinate x = (j+0.5)*n/m - 0.5, clamped to [0, n-1]; label ties go to the lower index;
  * the output affine and spacing equal SimpleITK's output geometry (LPS -> RAS);
  * compressed, sharded, odd-chunked and float16 builds read back the same values;
  * two builds of the same thing are byte-identical;
  * the foreground index and per-class statistics agree with the label array.

Prints one PASS/FAIL line per check and ends with `interop: N passed, M failed` (exit 1 if any
failed). Usage:

    PY=$(bash scripts/python_env.sh | tail -n1)
    cargo build --release --bin prep
    "$PY" scripts/interop_check.py [--prep target/release/prep] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import scipy
import scipy.ndimage as ndi
import SimpleITK as sitk
import zarr

REPO = Path(__file__).resolve().parent.parent

NIMARE_VERSION = "0.22.1"
T1_MEMBER = "nimare/resources/templates/tpl-MNI152NLin6Asym_res-01_T1w.nii.gz"
MASK_MEMBER = "nimare/resources/templates/tpl-MNI152NLin6Asym_res-01_desc-brain_mask.nii.gz"

# Two target spacings: non-integer downsampling ratios on every axis, and upsampling.
SPACING_DOWN = "1.7,1.3,2.2"
SPACING_UP = "0.8,0.8,0.8"

# Tolerances, relative to the input intensity range.
SITK_TOL = 1e-4  # brief: float32 result vs ITK's double pipeline
SCIPY_TOL = 1e-5  # same arithmetic in double; ours is three float32 lerps
AFFINE_TOL = 1e-6
LABEL_MIN_AGREEMENT = 0.999


# --------------------------------------------------------------------------------------------
# Check bookkeeping


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def record(self, name: str, ok: bool, detail: str) -> bool:
        ok = bool(ok)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        return ok

    def run(self, name: str, fn, *args) -> bool:
        """Run fn(*args) -> (ok, detail); an exception is a failure."""
        try:
            ok, detail = fn(*args)
        except Exception as e:  # noqa: BLE001 - a crash of one check must not stop the rest
            tb = traceback.format_exc(limit=3).strip().splitlines()
            return self.record(name, False, f"error: {type(e).__name__}: {e} [{' | '.join(tb[-3:])}]")
        return self.record(name, ok, detail)


def fmt(x: float) -> str:
    return f"{x:.3g}"


# --------------------------------------------------------------------------------------------
# The convention, in exact integer arithmetic where it matters


def out_len(n: int, s: float, t: float) -> int:
    """m = max(1, round(n*s/t)), rounding halves away from zero like Rust's f64::round."""
    v = n * s / t
    return max(1, int(np.floor(v + 0.5))) if np.isfinite(v) else 1


def source_coord(n: int, m: int) -> np.ndarray:
    j = np.arange(m, dtype=np.float64)
    return (j + 0.5) * n / m - 0.5


def interior_axis(n: int, m: int) -> np.ndarray:
    """Output indices whose source coordinate lies in [0, n-1] (exact)."""
    num = (2 * np.arange(m, dtype=np.int64) + 1) * n - m  # x = num / (2m)
    return (num >= 0) & (num <= 2 * m * (n - 1))


def tie_axis(n: int, m: int) -> np.ndarray:
    """Output indices whose source coordinate is exactly k + 0.5 (exact)."""
    return ((2 * np.arange(m, dtype=np.int64) + 1) * n) % (2 * m) == 0


def nearest_lower_axis(n: int, m: int) -> np.ndarray:
    """Nearest input index per output index, ties to the lower index, clamped (exact)."""
    num = (2 * np.arange(m, dtype=np.int64) + 1) * n - 2 * m  # x - 0.5 = num / (2m)
    idx = -((-num) // (2 * m))  # ceil
    return np.clip(idx, 0, n - 1)


def grid_masks(in_zyx, out_zyx):
    """Broadcastable (interior, tie) boolean masks over the output grid (z, y, x)."""
    ins = [interior_axis(n, m) for n, m in zip(in_zyx, out_zyx)]
    ties = [tie_axis(n, m) for n, m in zip(in_zyx, out_zyx)]
    interior = ins[0][:, None, None] & ins[1][None, :, None] & ins[2][None, None, :]
    tie = ties[0][:, None, None] | ties[1][None, :, None] | ties[2][None, None, :]
    return interior, tie


# --------------------------------------------------------------------------------------------
# Data


def data_cache_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if os.environ.get("VOXCACHE_INTEROP_CACHE"):
        return Path(os.environ["VOXCACHE_INTEROP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxcache-interop"


def get_wheel(cache: Path) -> tuple[Path, bool]:
    cache.mkdir(parents=True, exist_ok=True)
    name = f"nimare-{NIMARE_VERSION}-py3-none-any.whl"
    wheel = cache / name
    if wheel.is_file() and zipfile.is_zipfile(wheel):
        return wheel, False
    tmp = Path(tempfile.mkdtemp(prefix="dl-", dir=cache))
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             "-q", f"nimare=={NIMARE_VERSION}", "-d", str(tmp)],
            check=True,
        )
        got = list(tmp.glob("nimare-*.whl"))
        if len(got) != 1:
            raise RuntimeError(f"pip download gave {got}")
        os.replace(got[0], wheel)  # atomic: a half download never looks cached
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return wheel, True


def save_gz(path: Path, img: nib.Nifti1Image, slope_inter: tuple[float, float] | None = None) -> None:
    """Write a .nii.gz deterministically; optionally force scl_slope/scl_inter in the header."""
    raw = bytearray(img.to_bytes())
    if slope_inter is not None:
        endian = img.header.endianness
        raw[112:120] = np.array(slope_inter, dtype=endian + "f4").tobytes()
    path.write_bytes(gzip.compress(bytes(raw), compresslevel=6, mtime=0))


def make_dataset(wheel: Path, root: Path) -> dict:
    """imagesTr/ + labelsTr/ with two cases; returns facts about them."""
    src = root / "src"
    with zipfile.ZipFile(wheel) as z:
        z.extract(T1_MEMBER, src)
        z.extract(MASK_MEMBER, src)
    t1 = nib.load(src / T1_MEMBER)
    mask = nib.load(src / MASK_MEMBER)
    data = root / "mni152"
    (data / "imagesTr").mkdir(parents=True)
    (data / "labelsTr").mkdir(parents=True)

    # Case "mni": the template as shipped (int16, RAS, 1 mm, qform = sform) and the brain mask
    # rewritten as uint8 0/1 with exactly the image's header geometry.
    shutil.copyfile(src / T1_MEMBER, data / "imagesTr" / "mni_0000.nii.gz")
    m = np.asarray(mask.dataobj)
    mask01 = (m > 0).astype(np.uint8)
    hdr = t1.header.copy()
    hdr.set_data_dtype(np.uint8)
    lab = nib.Nifti1Image(mask01, t1.affine, header=hdr)
    lab.header.set_slope_inter(1.0, 0.0)
    save_gz(data / "labelsTr" / "mni.nii.gz", lab)
    mask_affine_diff = float(np.abs(mask.affine - t1.affine).max())

    # Case "mniperm": a crop of the same voxels, re-labelled with a permuted + flipped,
    # anisotropic sform (no qform), int16 storage with scl_slope/scl_inter, and a 3-class
    # uint16 label (classes 1, 2, 300). The rotation is a cyclic permutation with two flips:
    # exactly representable, so NIfTI readers cannot disagree by rounding.
    raw = np.asarray(t1.dataobj)[30:150, 30:190, 60:120].astype(np.int16)
    crop_mask = mask01[30:150, 30:190, 60:120]
    rot = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    sp = np.array([1.1, 0.7, 2.5], dtype=np.float32).astype(np.float64)
    aff = np.eye(4)
    aff[:3, :3] = rot * sp[None, :]
    aff[:3, 3] = [-37.5, 61.0, 44.25]
    img = nib.Nifti1Image(raw, aff)
    img.header.set_data_dtype(np.int16)
    img.header.set_sform(aff, code=2)
    img.header.set_qform(aff, code=0)
    save_gz(data / "imagesTr" / "mniperm_0000.nii.gz", img, slope_inter=(0.5, -10.0))
    inside = raw[crop_mask > 0]
    t_lo, t_hi = np.percentile(inside, [35, 70])
    lab3 = np.zeros(raw.shape, np.uint16)
    lab3[(crop_mask > 0) & (raw <= t_lo)] = 1
    lab3[(crop_mask > 0) & (raw > t_lo) & (raw <= t_hi)] = 2
    lab3[(crop_mask > 0) & (raw > t_hi)] = 300
    limg = nib.Nifti1Image(lab3, aff)
    limg.header.set_data_dtype(np.uint16)
    limg.header.set_sform(aff, code=2)
    limg.header.set_qform(aff, code=0)
    save_gz(data / "labelsTr" / "mniperm.nii.gz", limg)

    # Sanity of what we wrote, through nibabel.
    facts = {"dir": data, "mask_affine_diff": mask_affine_diff, "cases": {}}
    for case in ("mni", "mniperm"):
        im = nib.load(data / "imagesTr" / f"{case}_0000.nii.gz")
        lb = nib.load(data / "labelsTr" / f"{case}.nii.gz")
        facts["cases"][case] = {
            "shape": im.shape,
            "affine_diff": float(np.abs(im.affine - lb.affine).max()),
            "label_dtype": str(lb.get_data_dtype()),
        }
    fimg = nib.load(data / "imagesTr" / "mniperm_0000.nii.gz")
    expect = raw.astype(np.float64) * 0.5 - 10.0
    facts["scaled_ok"] = bool(np.array_equal(fimg.get_fdata(), expect))
    return facts


class CaseRef:
    """Reference inputs of one case, read with nibabel (arrays) and SimpleITK (images)."""

    def __init__(self, data_dir: Path, case: str) -> None:
        self.case = case
        self.image_path = data_dir / "imagesTr" / f"{case}_0000.nii.gz"
        self.label_path = data_dir / "labelsTr" / f"{case}.nii.gz"
        nimg = nib.load(self.image_path)
        nlab = nib.load(self.label_path)
        # (x, y, z) on disk -> (z, y, x) C order, as the cache stores it.
        self.image_zyx = np.ascontiguousarray(nimg.get_fdata(dtype=np.float64).transpose(2, 1, 0))
        self.label_zyx = np.ascontiguousarray(np.asarray(nlab.dataobj).transpose(2, 1, 0))
        self.nib_affine = nimg.affine
        self.range = float(self.image_zyx.max() - self.image_zyx.min())
        self.sitk_image = sitk.ReadImage(str(self.image_path))
        self.sitk_label = sitk.ReadImage(str(self.label_path))


# --------------------------------------------------------------------------------------------
# prep


class Build:
    def __init__(self, name: str, cache: Path, report: dict, seconds: float, args: list[str]) -> None:
        self.name = name
        self.cache = cache
        self.report = report
        self.seconds = seconds
        self.args = args
        self.keys = {c["id"]: c["key"] for c in report["cases"]}

    def entry(self, case: str) -> Path:
        key = self.keys[case]
        return self.cache / "entries" / key[:2] / key


def run_prep(prep: Path, data: Path, cache: Path, spacing: str, extra: list[str]) -> tuple[dict, float, list[str]]:
    args = [str(prep), "build-cache", str(data), "--cache-dir", str(cache), "--spacing", spacing,
            "--normalization", "none", "--json", "--quiet", *extra]
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-800:]} {p.stdout.strip()[-400:]}")
    return json.loads(p.stdout), dt, args


def attrs_of(entry: Path) -> dict:
    return json.loads((entry / "zarr.json").read_text())["attributes"]["voxcache"]


def open_entry(entry: Path):
    g = zarr.open_group(str(entry), mode="r")
    return g, g.attrs.asdict()["voxcache"]


def read_arrays(entry: Path):
    """Attributes, the image's one channel (the array is (c, z, y, x)), label and fg."""
    g, a = open_entry(entry)
    img = g["image"]
    assert img.ndim == 4 and img.shape[0] == 1, f"image shape {img.shape}"
    return a, img[0], g["label"][...], g["fg"][...]


# --------------------------------------------------------------------------------------------
# Checks


def check_data(facts: dict, wheel: Path, downloaded: bool):
    c = facts["cases"]
    ok = (facts["mask_affine_diff"] == 0.0 and facts["scaled_ok"]
          and all(v["affine_diff"] == 0.0 for v in c.values()))
    return ok, (f"{wheel.name} ({'downloaded' if downloaded else 'cached'}, {wheel.stat().st_size} B); "
                f"mni {c['mni']['shape']} label {c['mni']['label_dtype']}, mniperm {c['mniperm']['shape']} "
                f"label {c['mniperm']['label_dtype']}; image/label affine diff "
                f"{max(v['affine_diff'] for v in c.values())}, template mask vs T1 affine diff "
                f"{facts['mask_affine_diff']}, scl_slope case scaled ok={facts['scaled_ok']}")


def check_build(b: Build, cases: list[str]):
    st = {c["id"]: c["outcome"]["status"] for c in b.report["cases"]}
    ok = sorted(st) == sorted(cases) and all(s == "built" for s in st.values())
    manifest = json.loads((b.cache / "manifest.json").read_text())
    mkeys = {}
    for ds in manifest["datasets"].values():
        for cid, rec in ds["cases"].items():
            mkeys[cid] = rec["key"]
    ok = ok and all(mkeys.get(cid) == key for cid, key in b.keys.items())
    ok = ok and all((b.entry(cid) / "zarr.json").is_file() for cid in b.keys)
    return ok, f"{st} in {b.seconds:.1f}s; manifest keys match report: {all(mkeys.get(k) == v for k, v in b.keys.items())}"


def check_zarr(b: Build, case: str, expect_label: str, expect_image: str = "float32"):
    entry = b.entry(case)
    g, a = open_entry(entry)
    img, lab, fg = g["image"], g["label"], g["fg"]
    shape = tuple(a["output"]["shape_zyx"])
    problems = []
    if tuple(a["output"]["shape_xyz"])[::-1] != shape:
        problems.append(f"shape_xyz {a['output']['shape_xyz']} vs shape_zyx {shape}")
    # The image has a leading channel axis (one channel here), one channel per chunk.
    for name, arr, dt, lead in (("image", img, expect_image, ("c",)), ("label", lab, expect_label, ())):
        want = (1,) * len(lead) + shape
        if arr.shape != want:
            problems.append(f"{name} shape {arr.shape} != {want}")
        if str(arr.dtype) != dt:
            problems.append(f"{name} dtype {arr.dtype} != {dt}")
        dims = tuple(arr.metadata.dimension_names or ())
        if dims != lead + ("z", "y", "x"):
            problems.append(f"{name} dimension_names {dims}")
    if img.chunks[0] != 1:
        problems.append(f"image chunks {img.chunks} hold more than one channel")
    if a["label"]["dtype"] != expect_label:
        problems.append(f"label attr dtype {a['label']['dtype']}")
    if str(fg.dtype) != "uint32" or fg.ndim != 2 or fg.shape[1] != 4:
        problems.append(f"fg {fg.dtype} {fg.shape}")
    # Read everything once through zarr-python (decodes every chunk).
    vals = img[...]
    labs = lab[...]
    if not np.isfinite(vals).all():
        problems.append("non-finite image values")
    n = a["normalization"][0]
    if not (n["shift"] == 0.0 and n["scale"] == 1.0 and n["clip"] is None):
        problems.append(f"normalization {n} is not identity")
    return not problems, (f"zarr {zarr.__version__} read image {img.dtype}{list(img.shape)} chunks {img.chunks} "
                          f"label {lab.dtype} fg {list(fg.shape)}; dims c,z,y,x and z,y,x; labels {np.unique(labs).tolist()}"
                          + (f"; problems: {problems}" if problems else ""))


def sitk_affine_ras(im: sitk.Image) -> np.ndarray:
    d = np.array(im.GetDirection(), dtype=np.float64).reshape(3, 3)
    a = np.eye(4)
    a[:3, :3] = d * np.array(im.GetSpacing())[None, :]
    a[:3, 3] = im.GetOrigin()
    a[:2, :] *= -1.0  # LPS -> RAS
    return a


def sitk_resample(src: sitk.Image, out_xyz, interp, pixel_type, default: float, nudge: float = 0.0) -> sitk.Image:
    """Resample onto the edge-aligned output grid: size m, spacing s*n/m, same direction, first
    voxel centre at input continuous index 0.5*n/m - 0.5. `nudge` shifts the grid by that many
    input voxels (used to push exact ties down, never enough to move any other sample)."""
    n = src.GetSize()
    s = src.GetSpacing()
    f = sitk.ResampleImageFilter()
    f.SetSize([int(v) for v in out_xyz])
    f.SetOutputSpacing([s[a] * n[a] / out_xyz[a] for a in range(3)])
    f.SetOutputDirection(src.GetDirection())
    f.SetOutputOrigin(src.TransformContinuousIndexToPhysicalPoint(
        [0.5 * n[a] / out_xyz[a] - 0.5 + nudge for a in range(3)]))
    f.SetTransform(sitk.Transform())
    f.SetInterpolator(interp)
    f.SetOutputPixelType(pixel_type)
    f.SetDefaultPixelValue(default)
    return f.Execute(src)


def check_geometry(b: Build, ref: CaseRef, target: list[float]):
    a = attrs_of(b.entry(ref.case))
    in_xyz = a["input"]["shape_xyz"]
    sp_in = a["input"]["spacing_xyz"]
    m_expect = [out_len(in_xyz[k], sp_in[k], target[k]) for k in range(3)]
    out_xyz = a["output"]["shape_xyz"]
    src = ref.sitk_image
    out = sitk_resample(src, out_xyz, sitk.sitkNearestNeighbor, sitk.sitkUInt8, 0)
    d_in = float(np.abs(np.array(a["input"]["affine"]) - sitk_affine_ras(src)).max())
    d_in_nib = float(np.abs(np.array(a["input"]["affine"]) - ref.nib_affine).max())
    d_out = float(np.abs(np.array(a["output"]["affine"]) - sitk_affine_ras(out)).max())
    d_sp = float(np.abs(np.array(a["output"]["spacing_xyz"]) - np.array(out.GetSpacing())).max())
    ok = (list(out_xyz) == m_expect and list(src.GetSize()) == list(in_xyz)
          and d_in <= AFFINE_TOL and d_in_nib <= AFFINE_TOL and d_out <= AFFINE_TOL and d_sp <= AFFINE_TOL)
    return ok, (f"shape_xyz {in_xyz}->{out_xyz} (convention {m_expect}); |input.affine - ITK(RAS)| {fmt(d_in)}, "
                f"- nibabel {fmt(d_in_nib)}; |output.affine - ITK output(RAS)| {fmt(d_out)}; "
                f"|output.spacing - ITK| {fmt(d_sp)} ({a['input']['orientation']}, tol {AFFINE_TOL})")


def check_sitk_image(b: Build, ref: CaseRef):
    a, ours, _, _ = read_arrays(b.entry(ref.case))
    out_xyz = a["output"]["shape_xyz"]
    src = sitk.Cast(ref.sitk_image, sitk.sitkFloat64)
    res = sitk.GetArrayFromImage(sitk_resample(src, out_xyz, sitk.sitkLinear, sitk.sitkFloat64, float("nan")))
    interior, _ = grid_masks(ref.image_zyx.shape, ours.shape)
    interior = np.broadcast_to(interior, ours.shape)
    diff = np.abs(ours.astype(np.float64) - res)
    d_int = float(np.nanmax(diff[interior]))
    d_all = float(np.nanmax(diff))
    outside = int(np.isnan(res).sum())
    tol = SITK_TOL * ref.range
    ok = d_int <= tol and outside == 0
    return ok, (f"interior {int(interior.sum())}/{ours.size} voxels: max|ours-ITK| {fmt(d_int)} "
                f"(tol {fmt(tol)} = {SITK_TOL:g}*range {fmt(ref.range)}), mean {fmt(float(diff[interior].mean()))}; "
                f"all voxels max {fmt(d_all)}; ITK samples outside the input: {outside}")


def check_sitk_label(b: Build, ref: CaseRef):
    """ITK's nearest neighbour rounds exact ties (x = k + 0.5) up; ours go to the lower index.
    Pass: no disagreement outside tie voxels, and none at all once the ITK grid is nudged down by
    1e-6 voxel (which settles ties downward and cannot move any non-tie sample, whose distance to
    the nearest half-integer is at least 1/(2m))."""
    a, _, ours, _ = read_arrays(b.entry(ref.case))
    out_xyz = a["output"]["shape_xyz"]
    ptype = sitk.sitkUInt16 if ours.dtype == np.uint16 else sitk.sitkUInt8
    res = sitk.GetArrayFromImage(sitk_resample(ref.sitk_label, out_xyz, sitk.sitkNearestNeighbor, ptype, 0))
    low = sitk.GetArrayFromImage(
        sitk_resample(ref.sitk_label, out_xyz, sitk.sitkNearestNeighbor, ptype, 0, nudge=-1e-6))
    interior, tie = grid_masks(ref.label_zyx.shape, ours.shape)
    interior = np.broadcast_to(interior, ours.shape)
    tie = np.broadcast_to(tie, ours.shape)
    dis = (ours != res) & interior
    n_int = int(interior.sum())
    n_dis = int(dis.sum())
    n_dis_tie = int((dis & tie).sum())
    n_low = int(((ours != low) & interior).sum())
    n_low_all = int((ours != low).sum())
    agree = 1.0 - n_dis / max(n_int, 1)
    nontie = interior & ~tie
    agree_nontie = 1.0 - int((dis & ~tie).sum()) / max(int(nontie.sum()), 1)
    ok = n_dis == n_dis_tie and agree_nontie >= LABEL_MIN_AGREEMENT and n_low == 0
    return ok, (f"interior agreement {agree * 100:.4f}% ({n_dis} of {n_int} differ"
                f"{', brief bar 99.9% met' if agree >= LABEL_MIN_AGREEMENT else ', under the 99.9% bar only through ties'}); "
                f"{n_dis_tie} of the {n_dis} at exact ties (ITK rounds up), {n_dis - n_dis_tie} elsewhere; "
                f"interior tie voxels {int((tie & interior).sum())} ({100 * (tie & interior).sum() / max(n_int, 1):.1f}%); "
                f"ITK with ties nudged down: {n_low} interior / {n_low_all} total differ")


def check_scipy_image(b: Build, ref: CaseRef):
    _, ours, _, _ = read_arrays(b.entry(ref.case))
    zoom = [m / n for m, n in zip(ours.shape, ref.image_zyx.shape)]
    z = ndi.zoom(ref.image_zyx, zoom, order=1, grid_mode=True, mode="nearest")
    if z.shape != ours.shape:
        return False, f"scipy shape {z.shape} != ours {ours.shape}"
    interior, _ = grid_masks(ref.image_zyx.shape, ours.shape)
    interior = np.broadcast_to(interior, ours.shape)
    diff = np.abs(ours.astype(np.float64) - z)
    d_int = float(diff[interior].max())
    d_all = float(diff.max())
    tol = SCIPY_TOL * ref.range
    # mode='nearest' is exactly the documented clamp, so the border must match too.
    ok = d_int <= tol and d_all <= tol
    return ok, (f"max|ours-scipy| interior {fmt(d_int)}, all {ours.size} voxels {fmt(d_all)} "
                f"(tol {fmt(tol)} = {SCIPY_TOL:g}*range); zoom {[round(v, 4) for v in zoom]}")


def check_scipy_label(b: Build, ref: CaseRef):
    _, _, ours, _ = read_arrays(b.entry(ref.case))
    lab = ref.label_zyx
    zoom = [m / n for m, n in zip(ours.shape, lab.shape)]
    z = ndi.zoom(lab, zoom, order=0, grid_mode=True, mode="nearest")
    interior, tie = grid_masks(lab.shape, ours.shape)
    tie = np.broadcast_to(tie, ours.shape)
    interior = np.broadcast_to(interior, ours.shape)
    dis = ours != z
    n_nontie = int((dis & ~tie).sum())
    n_tie_dis = int((dis & tie).sum())
    # Ties: the documented rule (lower index), from an exact integer reference.
    idx = [nearest_lower_axis(n, m) for n, m in zip(lab.shape, ours.shape)]
    exact = lab[np.ix_(*idx)]
    n_ref = int((ours != exact).sum())
    n_ref_tie = int((ours != exact)[tie].sum())
    ok = n_nontie == 0 and n_ref == 0
    return ok, (f"non-tie voxels differing from scipy order=0: {n_nontie} of {int((~tie).sum())} "
                f"(interior {int((dis & ~tie & interior).sum())}); tie voxels {int(tie.sum())}, scipy (rounds up) "
                f"differs on {n_tie_dis}; vs exact lower-tie reference: {n_ref} differ ({n_ref_tie} at ties)")


def check_fg(b: Build, case: str):
    a, _, lab, fg = read_arrays(b.entry(case))
    k = a["params"]["fg_samples"]
    classes = {int(c): v for c, v in a["label"]["classes"].items()}
    rpc = {int(c): v for c, v in a["fg_index"]["rows_per_class"].items()}
    problems = []
    counts = np.bincount(lab.ravel().astype(np.int64))
    present = [int(c) for c in np.nonzero(counts)[0] if c != 0]
    if sorted(classes) != present:
        problems.append(f"classes {sorted(classes)} vs present {present}")
    if sorted(rpc) != present:
        problems.append(f"rows_per_class {sorted(rpc)} vs present {present}")
    for c in present:
        st = classes.get(c)
        if st is None:
            continue
        if st["voxels"] != int(counts[c]):
            problems.append(f"class {c} voxels {st['voxels']} != {int(counts[c])}")
        mask = lab == c
        bb_min, bb_max = [], []
        for ax in range(3):
            proj = np.nonzero(mask.any(axis=tuple(x for x in range(3) if x != ax)))[0]
            bb_min.append(int(proj[0]))
            bb_max.append(int(proj[-1]))
        if st["bbox_min_zyx"] != bb_min or st["bbox_max_zyx"] != bb_max:
            problems.append(f"class {c} bbox {st['bbox_min_zyx']}..{st['bbox_max_zyx']} != {bb_min}..{bb_max}")
        r = rpc.get(c)
        if r is not None:
            rows = fg[r["start"]: r["start"] + r["count"]]
            if r["count"] != min(k, int(counts[c])):
                problems.append(f"class {c} {r['count']} rows, expected min({k}, {int(counts[c])})")
            if rows.size and not (rows[:, 0] == c).all():
                problems.append(f"class {c} rows carry other class ids")
    if fg.shape[0] != sum(r["count"] for r in rpc.values()):
        problems.append(f"fg has {fg.shape[0]} rows, rows_per_class sums to {sum(r['count'] for r in rpc.values())}")
    coords = fg[:, 1:].astype(np.int64)
    inb = (coords >= 0).all(axis=1) & (coords < np.array(lab.shape)).all(axis=1)
    bad = int((~inb).sum())
    if bad:
        problems.append(f"{bad} rows out of bounds")
    at = lab[tuple(coords[inb].T)]
    wrong = int((at != fg[inb, 0]).sum())
    if wrong:
        problems.append(f"{wrong} rows point at a voxel of another class")
    dups = fg.shape[0] - np.unique(fg, axis=0).shape[0]
    if dups:
        problems.append(f"{dups} duplicate rows")
    summary = ", ".join(f"{c}: {classes[c]['voxels']} vox/{rpc[c]['count']} rows" for c in present if c in classes and c in rpc)
    return not problems, (f"{fg.shape[0]} rows all on their class; {summary}; counts and bboxes match"
                          if not problems else f"{problems}")


def check_variant(base: Build, var: Build, case: str, kind: str):
    _, img0, lab0, fg0 = read_arrays(base.entry(case))
    _, img1, lab1, fg1 = read_arrays(var.entry(case))
    meta = json.loads((var.entry(case) / "image" / "zarr.json").read_text())
    codecs = [c["name"] for c in meta["codecs"]]
    inner = []
    for c in meta["codecs"]:
        if c["name"] == "sharding_indexed":
            inner = [x["name"] for x in c["configuration"]["codecs"]]
    problems = []
    if var.keys[case] == base.keys[case]:
        problems.append("same cache key as the baseline")
    if kind in ("zstd", "blosc") and kind not in codecs:
        problems.append(f"codecs {codecs} lack {kind}")
    if kind == "shard" and "sharding_indexed" not in codecs:
        problems.append(f"codecs {codecs} lack sharding_indexed")
    if img1.shape != img0.shape or not np.array_equal(lab1, lab0) or lab1.dtype != lab0.dtype:
        problems.append("label differs")
    if not np.array_equal(fg1, fg0):
        problems.append("fg differs")
    extra = ""
    if kind == "float16":
        if img1.dtype != np.float16:
            problems.append(f"image dtype {img1.dtype}")
        x0 = img0.astype(np.float64)
        d = np.abs(img1.astype(np.float64) - x0)
        bound = np.abs(x0) * 2.0 ** -11 + 2.0 ** -25  # half an ulp of float16 (round to nearest)
        over = int((d > bound).sum())
        same = int((img1 == img0.astype(np.float16)).sum())
        if over:
            problems.append(f"{over} voxels beyond float16 rounding")
        extra = (f"max|f16-f32| {fmt(float(d.max()))}, max rel {fmt(float((d / np.maximum(np.abs(x0), 1e-30)).max()))}"
                 f" (bound 2^-11); bit-equal to numpy's f32->f16 on {same}/{img0.size}")
    else:
        if img1.dtype != img0.dtype or not np.array_equal(img1, img0):
            problems.append(f"image differs: max {fmt(float(np.abs(img1.astype(np.float64) - img0).max()))}")
        extra = "image, label and fg identical to the uncompressed build"
    shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
    return not problems, (f"codecs {codecs}{' inner ' + str(inner) if inner else ''}, chunk grid {shape}; {extra}"
                          + (f"; problems: {problems}" if problems else ""))


def tree_hashes(entry: Path) -> dict[str, str]:
    out = {}
    for p in sorted(entry.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(entry))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def check_repro(b1: Build, b2: Build):
    problems = []
    n_files = 0
    n_bytes = 0
    for case in sorted(b1.keys):
        if b1.keys[case] != b2.keys.get(case):
            problems.append(f"{case}: key {b1.keys[case][:12]} vs {str(b2.keys.get(case))[:12]}")
            continue
        h1, h2 = tree_hashes(b1.entry(case)), tree_hashes(b2.entry(case))
        n_files += len(h1)
        n_bytes += sum(p.stat().st_size for p in b1.entry(case).rglob("*") if p.is_file())
        if set(h1) != set(h2):
            problems.append(f"{case}: file sets differ: {sorted(set(h1) ^ set(h2))[:5]}")
        diff = [k for k in h1 if k in h2 and h1[k] != h2[k]]
        if diff:
            problems.append(f"{case}: {len(diff)} files differ, e.g. {diff[:5]}")
    return not problems, (f"{n_files} files, {n_bytes} bytes in {len(b1.keys)} entries: sha256 identical "
                          f"({' '.join(b1.args[b1.args.index('--spacing'):])} vs {' '.join(b2.args[b2.args.index('--spacing'):])})"
                          if not problems else f"{problems}")


def make_nifti2_copy(data: Path, root: Path) -> Path:
    """The same cases rewritten by nibabel as NIfTI-2 (images .nii.gz, labels .nii)."""
    out = root / "mni152-nifti2"
    for sub, ext in (("imagesTr", ".nii.gz"), ("labelsTr", ".nii")):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for f in sorted((data / sub).glob("*.nii*")):
            img = nib.load(f)
            # nibabel's NIfTI-2 header with every NIfTI-1 field carried over (f32 -> f64 is
            # exact), then the stored values as they are: nibabel's array writer would rescale.
            hdr = nib.Nifti2Header.from_header(img.header)
            hdr["vox_offset"] = 544
            # nibabel moves a loaded file's scaling into its data proxy: put it back.
            hdr["scl_slope"], hdr["scl_inter"] = img.dataobj.slope, img.dataobj.inter
            raw = np.asanyarray(img.dataobj.get_unscaled()).astype(hdr.get_data_dtype())
            body = hdr.binaryblock + b"\0" * 4 + raw.tobytes(order="F")
            name = f.name.split(".nii")[0] + ext
            path = out / sub / name
            path.write_bytes(gzip.compress(body, compresslevel=6, mtime=0) if ext.endswith(".gz") else body)
            back = nib.load(path)
            assert isinstance(back, nib.Nifti2Image) and back.header["sizeof_hdr"] == 540, name
            assert np.array_equal(back.get_fdata(), img.get_fdata()), name
            assert np.array_equal(back.affine, img.affine), name
    return out


def check_nifti2(one: Build, two: Build, case: str):
    """NIfTI-2 copies read as the same voxels and geometry: identical arrays and input affine."""
    a1, img1, lab1, fg1 = read_arrays(one.entry(case))
    a2, img2, lab2, fg2 = read_arrays(two.entry(case))
    problems = []
    if not np.array_equal(img1, img2):
        problems.append("image differs")
    if not np.array_equal(lab1, lab2) or lab1.dtype != lab2.dtype:
        problems.append("label differs")
    if not np.array_equal(fg1, fg2):
        problems.append("fg differs")
    for k in ("shape_xyz", "spacing_xyz", "affine", "affine_source", "datatype", "unit"):
        if a1["input"][k] != a2["input"][k]:
            problems.append(f"input.{k}: {a1['input'][k]} vs {a2['input'][k]}")
    if a1["output"] != a2["output"]:
        problems.append("output geometry differs")
    return not problems, (f"{img1.shape} image, label, fg and geometry identical to the NIfTI-1 build"
                          if not problems else f"{problems}")


def make_two_channel_copy(data: Path, root: Path) -> Path:
    """The same cases with a second channel: 2 * image - 100 as float32, written by nibabel with
    the first channel's geometry (`CASE_0001.nii.gz`); labels copied."""
    out = root / "mni152-2ch"
    (out / "imagesTr").mkdir(parents=True, exist_ok=True)
    shutil.copytree(data / "labelsTr", out / "labelsTr")
    for f in sorted((data / "imagesTr").glob("*_0000.nii.gz")):
        shutil.copyfile(f, out / "imagesTr" / f.name)
        img = nib.load(f)
        second = (2.0 * img.get_fdata(dtype=np.float64) - 100.0).astype(np.float32)
        hdr = img.header.copy()
        hdr.set_data_dtype(np.float32)
        two = nib.Nifti1Image(second, img.affine, hdr)
        two.header.set_slope_inter(1.0, 0.0)
        two.set_qform(img.get_qform(), int(img.header["qform_code"]))
        two.set_sform(img.get_sform(), int(img.header["sform_code"]))
        path = out / "imagesTr" / f.name.replace("_0000.nii.gz", "_0001.nii.gz")
        nib.save(two, path)
        assert np.array_equal(nib.load(path).affine, img.affine), path
    return out


def check_two_channels(one: Build, two: Build, case: str):
    """zarr-python reads the two-channel entry as (c, z, y, x), one channel per chunk; channel 0
    is the one-channel build's image exactly, channel 1 is 2 * it - 100 (linear resampling
    commutes with that map; float32 rounding only); the label is the same."""
    _, img1, lab1, _ = read_arrays(one.entry(case))
    g, a = open_entry(two.entry(case))
    img = g["image"]
    problems = []
    if img.ndim != 4 or img.shape[0] != 2:
        problems.append(f"image shape {img.shape}")
        return False, f"{problems}"
    if tuple(img.metadata.dimension_names or ()) != ("c", "z", "y", "x"):
        problems.append(f"dimension_names {img.metadata.dimension_names}")
    if img.chunks[0] != 1:
        problems.append(f"chunks {img.chunks} hold more than one channel")
    x = img[...]
    if not np.array_equal(x[0], img1):
        problems.append(f"channel 0 differs from the one-channel build: max {fmt(float(np.abs(x[0] - img1).max()))}")
    want = 2.0 * img1.astype(np.float64) - 100.0
    rel = float(np.abs(x[1] - want).max() / max(float(np.abs(want).max()), 1.0))
    if rel > 1e-6:
        problems.append(f"channel 1 is not 2 * channel 0 - 100: max relative error {fmt(rel)}")
    if not np.array_equal(g["label"][...], lab1):
        problems.append("label differs")
    if len(a["source"]["images"]) != 2 or len(a["normalization"]) != 2 or len(a["intensity"]) != 2:
        problems.append("attributes do not record two channels")
    return not problems, (f"zarr {zarr.__version__} read image {list(img.shape)} chunks {list(img.chunks)}; "
                          f"channel 0 identical to the one-channel build, channel 1 = 2x-100 within {fmt(rel)}"
                          if not problems else f"{problems}")


# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", default=str(REPO / "target" / "release" / "prep"),
                    help="path to the prep binary (default: target/release/prep in the repo)")
    ap.add_argument("--keep", metavar="TMPDIR", help="work in TMPDIR (created, must be empty) and keep it")
    ap.add_argument("--data-cache", metavar="DIR",
                    help="where the downloaded nimare wheel is kept (default: $VOXCACHE_INTEROP_CACHE, "
                         "else $XDG_CACHE_HOME/voxcache-interop, else ~/.cache/voxcache-interop)")
    args = ap.parse_args()

    t_start = time.perf_counter()
    checks = Checks()
    print(f"interop: python {sys.version.split()[0]}, numpy {np.__version__}, zarr {zarr.__version__}, "
          f"nibabel {nib.__version__}, SimpleITK {sitk.Version.VersionString()}, scipy {scipy.__version__}",
          flush=True)

    prep = Path(args.prep)
    if not prep.is_absolute():
        prep = (REPO / prep) if not prep.exists() else prep.resolve()
    if not (prep.is_file() and os.access(prep, os.X_OK)):
        checks.record("setup.prep", False, f"{prep} not found: run `cargo build --release --bin prep` first")
        print(f"interop: {checks.passed} passed, {checks.failed} failed")
        return 1

    if args.keep:
        work = Path(args.keep).resolve()
        work.mkdir(parents=True, exist_ok=True)
        if any(work.iterdir()):
            print(f"interop: --keep {work} is not empty", file=sys.stderr)
            return 2
    else:
        work = Path(tempfile.mkdtemp(prefix="voxcache-interop-"))
    try:
        run_all(checks, prep, work, data_cache_dir(args.data_cache))
    except Exception as e:  # noqa: BLE001
        checks.record("harness", False, f"{type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"interop: outputs kept in {work}", flush=True)
    print(f"interop: finished in {time.perf_counter() - t_start:.1f}s", flush=True)
    print(f"interop: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


def run_all(checks: Checks, prep: Path, work: Path, dcache: Path) -> None:
    # 1. Real data.
    wheel, downloaded = get_wheel(dcache)
    facts = make_dataset(wheel, work)
    if not checks.run("data.mni152", check_data, facts, wheel, downloaded):
        return
    data = facts["dir"]
    cases = ["mni", "mniperm"]
    label_dtype = {"mni": "uint8", "mniperm": "uint16"}

    # 2. Builds. Baselines (uncompressed float32) at both spacings; layout variants and
    # second copies for reproducibility at the small spacing. The second copies run with
    # one worker thread, the first with the default, so the order chunks finish in differs.
    plan = [
        ("down", SPACING_DOWN, []),
        ("up", SPACING_UP, []),
        ("down.zstd", SPACING_DOWN, ["--compression", "zstd"]),
        ("down.blosc", SPACING_DOWN, ["--compression", "blosc"]),
        ("down.shard", SPACING_DOWN, ["--chunk", "32,32,32", "--shard", "64,64,64", "--compression", "zstd"]),
        ("down.oddchunk", SPACING_DOWN, ["--chunk", "17,23,29"]),
        ("down.float16", SPACING_DOWN, ["--image-dtype", "float16"]),
        ("down.again", SPACING_DOWN, ["-j", "1"]),
        ("down.shard.again", SPACING_DOWN, ["--chunk", "32,32,32", "--shard", "64,64,64", "--compression", "zstd", "-j", "1"]),
    ]
    builds: dict[str, Build] = {}
    for name, spacing, extra in plan:
        cache = work / f"cache-{name}"
        try:
            report, dt, argv = run_prep(prep, data, cache, spacing, extra)
        except Exception as e:  # noqa: BLE001
            checks.record(f"build.{name}", False, f"{e}")
            continue
        b = Build(name, cache, report, dt, argv)
        if checks.run(f"build.{name}", check_build, b, cases):
            builds[name] = b
    print(f"interop: builds use `{' '.join(Path(a).name if i == 0 else a for i, a in enumerate(builds['down'].args))}`"
          if "down" in builds else "interop: no baseline build", flush=True)

    refs = {c: CaseRef(data, c) for c in cases}
    targets = {"down": [float(v) for v in SPACING_DOWN.split(",")], "up": [float(v) for v in SPACING_UP.split(",")]}
    bases = [n for n in ("down", "up") if n in builds]

    # 3. zarr-python.
    for bn in bases:
        for c in cases:
            checks.run(f"zarr.{bn}.{c}", check_zarr, builds[bn], c, label_dtype[c])
    # 4. SimpleITK.
    for bn in bases:
        for c in cases:
            checks.run(f"sitk.geometry.{bn}.{c}", check_geometry, builds[bn], refs[c], targets[bn])
            checks.run(f"sitk.image.{bn}.{c}", check_sitk_image, builds[bn], refs[c])
            checks.run(f"sitk.label.{bn}.{c}", check_sitk_label, builds[bn], refs[c])
    # 5. scipy.
    for bn in bases:
        for c in cases:
            checks.run(f"scipy.image.{bn}.{c}", check_scipy_image, builds[bn], refs[c])
            checks.run(f"scipy.label.{bn}.{c}", check_scipy_label, builds[bn], refs[c])
    # 6. Layout variants vs the uncompressed float32 build.
    if "down" in builds:
        for kind in ("zstd", "blosc", "shard", "oddchunk", "float16"):
            if f"down.{kind}" in builds:
                for c in cases:
                    checks.run(f"variant.{kind}.{c}", check_variant, builds["down"], builds[f"down.{kind}"], c, kind)
    # 7. Reproducibility.
    for a, b in (("down", "down.again"), ("down.shard", "down.shard.again")):
        if a in builds and b in builds:
            checks.run(f"repro.{a}", check_repro, builds[a], builds[b])
    # 8. Foreground index and class statistics.
    for bn in bases + [n for n in ("down.shard", "down.oddchunk") if n in builds]:
        for c in cases:
            checks.run(f"fg.{bn}.{c}", check_fg, builds[bn], c)
    # 9. NIfTI-2 (written by nibabel) reads as its NIfTI-1 original.
    # 10. Two channels (CASE_0000, CASE_0001): each cached as it would be alone.
    if "down" in builds:
        for name, make, prefix, check in (("nifti2", make_nifti2_copy, "nifti2", check_nifti2),
                                          ("2ch", make_two_channel_copy, "channels", check_two_channels)):
            copy = build_copy(checks, prep, work, data, name, make, cases)
            if copy is not None:
                for c in cases:
                    checks.run(f"{prefix}.{c}", check, builds["down"], copy, c)


def build_copy(checks: Checks, prep: Path, work: Path, data: Path, name: str, make, cases: list[str]):
    """Build `make(data, work)` (a rewritten copy of the dataset) at the small spacing; the
    Build when it built every case, else None (the failure recorded as `build.NAME`)."""
    try:
        copy_data = make(data, work)
        report, dt, argv = run_prep(prep, copy_data, work / f"cache-{name}", SPACING_DOWN, [])
    except Exception as e:  # noqa: BLE001
        checks.record(f"build.{name}", False, f"{e}")
        return None
    b = Build(name, work / f"cache-{name}", report, dt, argv)
    return b if checks.run(f"build.{name}", check_build, b, cases) else None

if __name__ == "__main__":
    sys.exit(main())
