#!/usr/bin/env python3
"""Our planner (`prep plan`) against the plans that nnU-Net v2.8.1 itself wrote, dataset by dataset.

For each dataset and each preset (default, resenc-m, resenc-l, resenc-xl) this runs
`prep plan DATA --preset P --out FILE.toml`, reads nnU-Net's plans file for the same preset
(nnUNetPlans.json, nnUNetResEncUNet{M,L,XL}Plans.json) and prints one markdown table row per
configuration (2d, 3d_fullres, 3d_lowres): spacing, patch, batch size, strides, kernels, features,
encoder and decoder blocks, nnU-Net's value beside ours, and "same" or "differs: <keys>".
docs/planner-comparison.md shows the result and explains every difference.

Axes. Everything is shown in (z, y, x) order, nnU-Net's values put back from its transposed order
(`transpose_forward`), spacings in the files' unit (nnU-Net writes mm; our TOML writes the unit
of the files, read here from the first image's NIfTI header). A 2d configuration is shown on the
two axes it covers: our TOML gives it one voxel (stride 1, kernel 1) on the third axis, which is
checked and then dropped. Spacings are equal when they agree to 1e-9 relative.

Exit status: 0 every configuration is the same, or differs only in keys of ALLOWED below (each a
known, documented difference); 1 some configuration differs in another key; 2 the comparison
could not run (bad arguments, `prep plan` failed, a plans file missing or unreadable).

Python 3.11+ and the standard library only: nothing here imports torch or nnunetv2; nnU-Net's
side is only the JSON files it wrote.

Reproduce (the tables of docs/planner-comparison.md; nnU-Net in its own venv, paths of the
machine where it was run):

    source /work/bench/planner/env.sh    # nnUNet_raw/_preprocessed/_results, the venv on PATH
    # raw datasets = per-file symlinks: $nnUNet_raw/Dataset503_CtLike/{dataset.json,imagesTr/*,labelsTr/*}
    #   -> /work/bench/plan4/ct-like/..., Dataset504_MriLike -> /work/bench/plan4/mri-like/...
    #   (Dataset501_Vessels -> data/vessels and Dataset502_MiniVess -> minivess, made the same way)
    for id in 501 502 503 504; do
        nnUNetv2_extract_fingerprint -d $id -np 1 --verify_dataset_integrity
        for pl in ExperimentPlanner nnUNetPlannerResEncM nnUNetPlannerResEncL nnUNetPlannerResEncXL; do
            nnUNetv2_plan_experiment -d $id -pl $pl
        done
    done
    python3 scripts/planner_compare.py --prep /work/bench/plan4/prep \\
        --dataset data/vessels 501 \\
        --dataset /work/bench/plan4/minivess 502 \\
        --dataset /work/bench/plan4/ct-like 503 \\
        --dataset /work/bench/plan4/mri-like 504 \\
        | tee /work/bench/plan4/compare.log
    # --doc prints the condensed per-dataset tables of the documentation page instead

A dataset's second value is a folder holding nnU-Net's plans files, or a dataset id looked up as
$nnUNet_preprocessed/DatasetNNN_*.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

# Our preset name -> nnU-Net's plans file for it.
PRESETS = {
    "default": "nnUNetPlans.json",
    "resenc-m": "nnUNetResEncUNetMPlans.json",
    "resenc-l": "nnUNetResEncUNetLPlans.json",
    "resenc-xl": "nnUNetResEncUNetXLPlans.json",
}
CONFIGURATIONS = ["2d", "3d_fullres", "3d_lowres"]  # 3d_cascade_fullres is 3d_fullres again
KEYS = ["spacing", "patch", "batch", "strides", "kernels", "features", "blocks", "decoder_blocks"]

# Differences that are known and documented, so they do not fail the run. Key -> why.
ALLOWED = {
    # NIfTI stores the spacing as float32. SimpleITK widens it exactly (0.99 -> 0.9900000095367432)
    # and nnU-Net computes from that; voxcache reads it through its shortest decimal form (0.99,
    # docs/usage.md "Coordinate convention"). The two spacings then differ by less than one float32
    # step (2^-23 relative). On the datasets compared every planner decision came out the same; a
    # spacing ratio of exactly 3 can flip nnU-Net's anisotropy test (docs/planner-comparison.md),
    # which then shows here as a full "spacing" difference (not allowed).
    "spacing~f32": "float32 header spacing read as its shortest decimal (docs/usage.md)",
}
F32_REL = 2.0**-23  # one float32 step, relative: the spacing's precision in the NIfTI header
REL_TOL = 1e-9  # spacings closer than this, relative, are equal

# NIfTI xyzt_units (spatial part) -> millimetres per unit; 0 (unknown) is taken as mm, as ITK does.
UNIT_MM = {0: 1.0, 1: 1000.0, 2: 1.0, 3: 0.001}
UNIT_NAME = {0: "mm", 1: "m", 2: "mm", 3: "um"}


def fail(msg: str) -> None:
    print(f"planner_compare: {msg}", file=sys.stderr)
    sys.exit(2)


def nifti_header(path: Path) -> tuple[list[int], int]:
    """(shape x,y,z, spatial unit code) from a .nii or .nii.gz header (NIfTI-1 or -2)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read(540)
    for endian in "<>":
        size = struct.unpack(endian + "i", raw[:4])[0]
        if size == 348:
            dims = struct.unpack(endian + "8h", raw[40:56])
            units = raw[123]
            break
        if size == 540:
            dims = struct.unpack(endian + "8q", raw[16:80])
            units = struct.unpack(endian + "i", raw[500:504])[0]
            break
    else:
        fail(f"{path}: not a NIfTI header")
    shape = [int(d) if i < dims[0] else 1 for i, d in enumerate(dims[1:4])]
    return shape, units & 7


def dataset_images(data: Path) -> list[Path]:
    """The first channel of every labelled case (imagesTr/ID_0000.nii.gz with labelsTr/ID...)."""
    desc = json.loads((data / "dataset.json").read_text())
    ending = desc.get("file_ending", ".nii.gz")
    out = []
    for label in sorted((data / "labelsTr").glob("*" + ending)):
        case = label.name[: -len(ending)]
        for image in (data / "imagesTr" / f"{case}_0000{ending}", data / "imagesTr" / f"{case}{ending}"):
            if image.exists():
                out.append(image)
                break
    if not out:
        fail(f"{data}: no labelled case found")
    return out


def plans_folder(spec: str) -> Path:
    """A folder of plans files, or a dataset id under $nnUNet_preprocessed."""
    if spec.isdigit():
        root = os.environ.get("nnUNet_preprocessed")
        if not root:
            fail(f"dataset id {spec} given but nnUNet_preprocessed is not set")
        hits = sorted(Path(root).glob(f"Dataset{int(spec):03d}_*"))
        if len(hits) != 1:
            fail(f"dataset id {spec}: {len(hits)} folders Dataset{int(spec):03d}_* in {root}")
        return hits[0]
    return Path(spec)


def run_prep(prep: str, data: Path, preset: str, out: Path) -> tuple[dict, float]:
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [prep, "plan", str(data), "--preset", preset, "--out", str(out)],
            capture_output=True,
            text=True,
        )
    except OSError as e:
        fail(f"cannot run {prep}: {e}")
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        fail(f"prep plan {data} --preset {preset} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    with open(out, "rb") as f:
        return tomllib.load(f), dt


def theirs_zyx(cfg: dict, tf: list[int]) -> dict:
    """One nnU-Net configuration in (z, y, x) order, on the axes it covers (all 3, or 2 for 2d)."""
    a = cfg["architecture"]["arch_kwargs"]
    dim = len(cfg["patch_size"])
    axes = tf[3 - dim :]  # the zyx axis of each of the configuration's axes

    def order(v):  # values of the covered axes, sorted by zyx axis
        return [x for _, x in sorted(zip(axes, v))]

    enc = a.get("n_conv_per_stage", a.get("n_blocks_per_stage"))
    return {
        "axes": sorted(axes),
        "spacing_mm": order(cfg["spacing"]),
        "patch": order(cfg["patch_size"]),
        "batch": cfg["batch_size"],
        "strides": [order(s) for s in a["strides"]],
        "kernels": [order(k) for k in a["kernel_sizes"]],
        "features": list(a["features_per_stage"]),
        "blocks": list(enc),
        "decoder_blocks": list(a["n_conv_per_stage_decoder"]),
        "encoder": {"PlainConvUNet": "plain", "ResidualEncoderUNet": "residual"}.get(
            cfg["architecture"]["network_class_name"].rsplit(".", 1)[-1], "?"
        ),
    }


def ours_zyx(t: dict, axes: list[int], mm_per_unit: float) -> tuple[dict, list[str]]:
    """Our TOML table on the same axes; also whether the axes it leaves out are one voxel."""
    sp_zyx = list(reversed(t["spacing"]))  # TOML spacing is x, y, z
    dropped = [i for i in range(3) if i not in axes]
    bad = []
    for i in dropped:
        if t["patch"][i] != 1 or any(s[i] != 1 for s in t["strides"]) or any(
            k[i] != 1 for k in t["kernels"]
        ):
            bad.append("2d-axis")
    pick = lambda v: [v[i] for i in axes]  # noqa: E731
    return {
        "axes": axes,
        "spacing_mm": [sp_zyx[i] * mm_per_unit for i in axes],
        "patch": pick(t["patch"]),
        "batch": t["batch_size"],
        "strides": [pick(s) for s in t["strides"]],
        "kernels": [pick(k) for k in t["kernels"]],
        "features": list(t["features"]),
        "blocks": list(t["blocks"]),
        "decoder_blocks": list(t["decoder_blocks"]),
        "encoder": t.get("encoder", "?"),
    }, bad


def compare(th: dict | None, ou: dict | None) -> list[str]:
    """The keys in which two configurations differ ("exists" when only one side has it)."""
    if th is None or ou is None:
        return [] if th is None and ou is None else ["exists"]
    keys = []
    worst = max(
        abs(a - b) / abs(a) for a, b in zip(th["spacing_mm"], ou["spacing_mm"])
    ) if len(th["spacing_mm"]) == len(ou["spacing_mm"]) else float("inf")
    if worst > F32_REL:
        keys.append("spacing")
    elif worst > REL_TOL:
        keys.append("spacing~f32")
        th["spacing_gap"] = worst  # shown in the result column
    keys += [k for k in KEYS[1:] if th[k] != ou[k]]
    if th["encoder"] != ou["encoder"]:
        keys.append("encoder")
    return keys


def fmt_shape(v) -> str:
    return "x".join(str(x) for x in v)


def fmt_list(vs, short=False) -> str:
    """Stages as '1x1x1 1x2x2 ...'; short: runs of the same value as 'v×n'."""
    items = [fmt_shape(v) if isinstance(v, list) else str(v) for v in vs]
    if not short:
        return (" " if isinstance(vs[0], list) else ",").join(items) if vs else ""
    runs = []
    for it in items:
        if runs and runs[-1][0] == it:
            runs[-1][1] += 1
        else:
            runs.append([it, 1])
    sep = " " if vs and isinstance(vs[0], list) else ","
    return sep.join(f"{v}×{n}" if n > 2 else sep.join([v] * n) for v, n in runs)


def fmt_spacing(mm: list[float], mm_per_unit: float) -> str:
    return "x".join("%.6g" % (v / mm_per_unit) for v in mm)


def cells(c: dict | None, mm_per_unit: float, short=False) -> dict:
    if c is None:
        return {k: "—" for k in KEYS}
    return {
        "spacing": fmt_spacing(c["spacing_mm"], mm_per_unit),
        "patch": fmt_shape(c["patch"]),
        "batch": str(c["batch"]),
        "strides": fmt_list(c["strides"], short),
        "kernels": fmt_list(c["kernels"], short),
        "features": fmt_list(c["features"], short),
        "blocks": fmt_list(c["blocks"], short),
        "decoder_blocks": fmt_list(c["decoder_blocks"], short),
    }


def crop_note(plans_dir: Path, images: list[Path], headers: dict) -> str:
    """Whether nnU-Net's crop to the nonzero region changed any case's shape (we do not crop)."""
    fp_path = plans_dir / "dataset_fingerprint.json"
    if not fp_path.exists():
        return "no dataset_fingerprint.json beside the plans: crop not checked"
    fp = json.loads(fp_path.read_text())
    theirs = sorted(tuple(s) for s in fp["shapes_after_crop"])
    ours = sorted(tuple(reversed(headers[p][0])) for p in images)
    same = theirs == ours
    return (
        f"nnU-Net's crop to nonzero: median relative size {fp['median_relative_size_after_cropping']}, "
        f"cropped shapes {'equal' if same else 'DIFFER from'} the files' shapes ({len(ours)} cases)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", required=True, help="our prep binary")
    ap.add_argument(
        "--dataset",
        nargs=2,
        action="append",
        required=True,
        metavar=("DATA", "PLANS"),
        help="dataset folder and nnU-Net's plans folder (or dataset id); repeat per dataset",
    )
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated (default: all)")
    ap.add_argument("--doc", action="store_true", help="condensed tables, '=' where ours is equal")
    ap.add_argument("--keep", help="folder to keep our TOML plans in (default: a temporary one)")
    args = ap.parse_args()
    presets = args.presets.split(",")
    for p in presets:
        if p not in PRESETS:
            fail(f"unknown preset {p!r}: {', '.join(PRESETS)}")

    t_start = time.perf_counter()
    t_prep = 0.0
    n_total = n_same = 0
    failing: list[str] = []
    allowed_seen: dict[str, int] = {}
    all_notes: list[str] = []
    tmp = tempfile.TemporaryDirectory()
    keep = Path(args.keep or tmp.name)
    keep.mkdir(parents=True, exist_ok=True)

    head_full = (
        "| dataset | preset | configuration | spacing nnU-Net | spacing ours | patch nnU-Net | patch ours "
        "| batch nnU-Net | batch ours | strides nnU-Net | strides ours | kernels nnU-Net | kernels ours "
        "| features nnU-Net | features ours | blocks nnU-Net | blocks ours | decoder nnU-Net | decoder ours "
        "| result |"
    )
    head_doc = (
        "| preset | configuration | spacing | ours | patch | ours | batch | ours | strides | ours "
        "| kernels | ours | features | ours | blocks enc / dec | ours | result |"
    )
    if not args.doc:
        print("Axes z,y,x (2d: y,x); spacing in the files' unit; nnU-Net's value, then ours.\n")
        print(head_full)
        print("|" + "---|" * head_full.count(" | ") + "---|")

    for data_s, plans_s in args.dataset:
        data = Path(data_s)
        plans_dir = plans_folder(plans_s)
        images = dataset_images(data)
        headers = {p: nifti_header(p) for p in images}
        unit_code = headers[images[0]][1]
        mm_per_unit = UNIT_MM.get(unit_code, 1.0)
        name = data.resolve().name
        desc = json.loads((data / "dataset.json").read_text())
        notes = [
            f"{name}: {len(images)} labelled cases (numTraining {desc.get('numTraining')}), "
            f"unit {UNIT_NAME.get(unit_code, 'mm')}, nnU-Net plans in {plans_dir}",
            crop_note(plans_dir, images, headers),
        ]
        if args.doc:
            print(f"\n#### {name} (nnU-Net: {plans_dir.name})\n")
            print(head_doc)
            print("|" + "---|" * head_doc.count(" | ") + "---|")
        neither: list[str] = []
        for preset in presets:
            pf = plans_dir / PRESETS[preset]
            try:
                plans = json.loads(pf.read_text())
            except (OSError, ValueError) as e:
                fail(f"{pf}: {e}")
            toml, dt = run_prep(args.prep, data, preset, keep / f"{name}-{preset}.toml")
            t_prep += dt
            tf = plans["transpose_forward"]
            ours_cfgs = toml.get("configurations", {})
            for cname in CONFIGURATIONS:
                tc = plans["configurations"].get(cname)
                th = theirs_zyx(tc, tf) if tc is not None else None
                bad: list[str] = []
                ou = None
                if cname in ours_cfgs:
                    axes = th["axes"] if th else ([1, 2] if cname == "2d" else [0, 1, 2])
                    ou, bad = ours_zyx(ours_cfgs[cname], axes, mm_per_unit)
                if th is None and ou is None:
                    neither.append(preset)  # planned by neither side: agreed, nothing to compare
                    continue
                keys = compare(th, ou) + bad
                n_total += 1
                if not keys:
                    n_same += 1
                    result = "same"
                else:
                    result = "differs: " + ", ".join(keys)
                    if "spacing~f32" in keys:
                        result += f" (largest relative gap {th['spacing_gap']:.1e})"
                    for k in keys:
                        if k in ALLOWED:
                            allowed_seen[k] = allowed_seen.get(k, 0) + 1
                    if any(k not in ALLOWED for k in keys):
                        failing.append(f"{name} {preset} {cname}: {result}")
                ct, co = cells(th, mm_per_unit, args.doc), cells(ou, mm_per_unit, args.doc)
                if args.doc:
                    row = [preset, cname]
                    for k in ["spacing", "patch", "batch", "strides", "kernels", "features"]:
                        eq = ct[k] == co[k] and th is not None and ou is not None
                        if k == "spacing" and "spacing~f32" in keys:
                            eq = True  # shown equal at 6 digits; the f32 step is in the result
                        row += [ct[k], "=" if eq else co[k]]
                    bt = f"{ct['blocks']} / {ct['decoder_blocks']}"
                    bo = f"{co['blocks']} / {co['decoder_blocks']}"
                    short = result
                    if keys == ["spacing~f32"]:
                        short = f"≈ (f32 spacing, {th['spacing_gap']:.1e})"
                    row += [bt, "=" if bt == bo and th and ou else bo, short]
                else:
                    row = [name, preset, cname]
                    for k in KEYS:
                        row += [ct[k], co[k]]
                    row.append(result)
                print("| " + " | ".join(row) + " |")
        if neither:
            notes.append(f"3d_lowres planned by neither side: {', '.join(neither)}")
        if args.doc:
            print()
            for n in notes:
                print(f"- {n}")
        else:
            all_notes.extend(notes)

    elapsed = time.perf_counter() - t_start
    out = sys.stdout
    if all_notes:
        print()
        for n in all_notes:
            print(f"- {n}")
    print(
        f"\n{n_total} configurations compared, {n_same} identical, "
        f"{n_total - n_same - len(failing)} differ only in allowed keys, {len(failing)} differ otherwise.",
        file=out,
    )
    for k, n in allowed_seen.items():
        print(f"allowed difference {k!r} in {n} configurations: {ALLOWED[k]}", file=out)
    for f in failing:
        print(f"NOT ALLOWED: {f}", file=out)
    print(
        f"time: {elapsed:.2f} s in all, {t_prep:.2f} s in {len(args.dataset) * len(presets)} `prep plan` runs",
        file=out,
    )
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
