#!/usr/bin/env python3
"""The cascade (3d_lowres -> 3d_cascade_fullres) beside 3d_fullres, in voxcache and in nnU-Net v2.

What it measures
----------------
Both tools train, on the same data, plan, folds and iterations:
  1. 3d_lowres on all five folds of nnU-Net's cross-validation (each fold predicts its held-out
     cases: those predictions are the second stage's input for every case);
  2. 3d_fullres on fold 0;
  3. 3d_cascade_fullres on fold 0 (3d_fullres with the first stage's segmentation as channels);
then ONE metric code (voxcache's `evaluate`) scores each configuration's fold-0 validation
predictions (each tool's own fold validation, in the cases' own geometry, no test-time mirroring
on either side) against the labels: Dice over the foreground classes, mean over the validation
cases. It prints a table (configuration x tool) and writes every figure to WORK/results.json.

Data: `prep synth --preset PRESET`. The default, ct-like (12 cases of 512x512x38..84,
anisotropic), is cropped to the central `--crop` x `--crop` voxels in plane (default 160) so that
two CPU cores can train seven networks per tool and predict at full resolution; the crop keeps
each voxel where it was (the affine moves with it). `--preset organs --crop 0` is the set made
for the cascade: two organs wider than the fullres patch, classed only by a small core that the
first stage's coarser patch sees (docs/usage.md, `prep synth`). nnU-Net's planner does not plan 3d_lowres for cases this small, so
the script defines it for both tools: 3d_fullres's spacing times `--lowres-factor` (default 2)
on every axis, with the topology nnU-Net's planner derives for `--lowres-patch`. 3d_fullres and
3d_cascade_fullres use `--patch` and its topology; everything else is each tool's default, as in
scripts/quality_match.py (whose helpers, driver and plan check this script uses).

nnU-Net side: its own cascade code. The plans get `3d_lowres_qm` (with `next_stage`) and
`3d_cascade_fullres_qm` (`inherits_from` 3d_fullres_qm, `previous_stage` 3d_lowres_qm), so that
its lowres fold validations write `predicted_next_stage/` and its cascade trainer reads them.
voxcache side: `train --fold 0,1,2,3,4` of 3d_lowres, `prep build-cache --previous-stage` of
that run, `train` of 3d_cascade_fullres (docs/usage.md, "The cascade").

Reproduce (from the repository root, after `cargo build --release`; nnU-Net 2.8.x in its venv):

    python3 scripts/cascade_match.py --nnunet-python /work/bench/nnunet/bin/python \
        --work /work/bench/cm --seeds 0
    python3 scripts/cascade_match.py --nnunet-python /work/bench/nnunet/bin/python \
        --work /work/bench/cm-organs --preset organs --crop 0 --seeds 0,1,2

`--skip-nnunet` / `--skip-ours` reuse the other side's saved figures (WORK/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality_match as qm  # noqa: E402

LOW, FULL, CASC = "3d_lowres_qm", qm.CONFIG_QM, "3d_cascade_fullres_qm"
OURS = {LOW: "3d_lowres", FULL: "3d_fullres", CASC: "3d_cascade_fullres"}

# Run with nnU-Net's python beside WORK/nnunet_qm_driver.py (quality_match's driver).
DRIVER = r'''
"""The cascade part of scripts/cascade_match.py (written by it; run with nnU-Net's python)."""
import argparse
import json
import os
import sys
from copy import deepcopy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nnunet_qm_driver import _dump, _arch_summary, set_topology


def cmd_crop(a):
    """Central in-plane crop of every image and label, the affine moved with it."""
    import nibabel as nib
    import numpy as np
    for sub in ("imagesTr", "labelsTr"):
        os.makedirs(os.path.join(a.dst, sub), exist_ok=True)
        for fn in sorted(os.listdir(os.path.join(a.src, sub))):
            if not fn.endswith(".nii.gz"):
                continue
            img = nib.load(os.path.join(a.src, sub, fn))
            x0 = (img.shape[0] - a.size) // 2
            y0 = (img.shape[1] - a.size) // 2
            data = np.asarray(img.dataobj)[x0:x0 + a.size, y0:y0 + a.size]
            aff = img.affine.copy()
            aff[:3, 3] = img.affine[:3, :3] @ np.array([x0, y0, 0]) + img.affine[:3, 3]
            hdr = img.header.copy()
            out = nib.Nifti1Image(data, aff, header=hdr)
            out.set_qform(aff, code=int(hdr["qform_code"]) or 1)
            out.set_sform(aff, code=int(hdr["sform_code"]) or 1)
            nib.save(out, os.path.join(a.dst, sub, fn))
    with open(os.path.join(a.src, "dataset.json")) as f:
        dj = json.load(f)
    dj.pop("cases", None)
    dj["description"] = f"{dj.get('description', '')} Cropped to {a.size}x{a.size} in plane."
    _dump(dj, os.path.join(a.dst, "dataset.json"))


def cmd_plan(a):
    """Add 3d_lowres_qm and 3d_cascade_fullres_qm to the plans; preprocess 3d_lowres_qm."""
    from nnunetv2.experiment_planning.plan_and_preprocess_api import preprocess
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    plans_file = os.path.join(pre, a.plans + ".json")
    with open(plans_file) as f:
        plans = json.load(f)
    full = plans["configurations"][a.full]
    tf = plans["transpose_forward"]
    low = deepcopy(full)
    low["spacing"] = [float(s) * a.factor for s in full["spacing"]]
    low["median_image_size_in_voxels"] = [float(s) / a.factor for s in full["median_image_size_in_voxels"]]
    low["data_identifier"] = a.plans + "_" + a.low
    set_topology(low, a.dataset_id, a.plans, tf, a.patch)
    low["next_stage"] = a.casc
    plans["configurations"][a.low] = low
    plans["configurations"][a.casc] = {"inherits_from": a.full, "previous_stage": a.low}
    _dump(plans, plans_file)
    marker = os.path.join(pre, ".qm_preprocessed_" + low["data_identifier"])
    if not os.path.isfile(marker):
        preprocess([a.dataset_id], plans_identifier=a.plans, configurations=[a.low], num_processes=[1])
        open(marker, "w").close()
    pm = PlansManager(plans_file)
    _dump({"transpose_forward": tf, "low": _arch_summary(pm.get_configuration(a.low)),
           "casc": _arch_summary(pm.get_configuration(a.casc)),
           "casc_previous_stage": pm.get_configuration(a.casc).previous_stage_name}, a.out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("crop")
    c.add_argument("--src", required=True)
    c.add_argument("--dst", required=True)
    c.add_argument("--size", type=int, required=True)
    p = sub.add_parser("plan")
    p.add_argument("--dataset-id", type=int, required=True)
    p.add_argument("--plans", required=True)
    for k in ("full", "low", "casc", "out"):
        p.add_argument("--" + k, required=True)
    p.add_argument("--factor", type=float, required=True)
    p.add_argument("--patch", type=int, nargs=3, required=True)
    a = ap.parse_args()
    {"crop": cmd_crop, "plan": cmd_plan}[a.cmd](a)
'''


def prepare_data(a, work: Path, binp: Path) -> Path:
    data = work / "data"
    if (data / "dataset.json").is_file():
        return data
    full = work / a.preset
    if not (full / "dataset.json").is_file():
        shutil.rmtree(full, ignore_errors=True)
        qm.run([binp / "prep", "synth", "--preset", a.preset, "--out", full], work / "logs" / "synth.log")
    shutil.rmtree(data, ignore_errors=True)
    if a.crop == 0:
        shutil.copytree(full, data)
        return data
    qm.run([a.nnunet_python, work / "nnunet_cm_driver.py", "crop", "--src", full, "--dst", data,
            "--size", a.crop], work / "logs" / "crop.log")
    return data


def cascade_plans(a, work: Path, plans: dict) -> dict:
    """nnU-Net's lowres and cascade configurations, and voxcache's plan file with the same three."""
    out = work / "plan" / "nnunet_cascade.json"
    qm.run([a.nnunet_python, work / "nnunet_cm_driver.py", "plan", "--dataset-id", a.dataset_id,
            "--plans", qm.PLANS, "--full", FULL, "--low", LOW, "--casc", CASC, "--out", out,
            "--factor", a.lowres_factor, "--patch", *a.lowres_patch],
           work / "logs" / "nnunet_cascade_plan.log", env=qm.nnunet_env(a, work))
    nn = json.loads(out.read_text())
    tf = nn["transpose_forward"]
    low = qm.nn_plan_zyx(nn["low"], tf, plans["mm_per_unit"])
    low["spacing"] = [float(f"{s:.7g}") for s in low["spacing"]]
    casc = qm.nn_plan_zyx(nn["casc"], tf, plans["mm_per_unit"])
    if casc != plans["plan_zyx"] or nn["casc_previous_stage"] != LOW:
        raise qm.Failure(f"nnU-Net's {CASC} is not {FULL} with previous stage {LOW}: {nn}")
    text = Path(plans["plan_toml"]).read_text()
    full_tbl = tomllib.loads(text)["configurations"]["3d_fullres"]

    def table(name: str, values: dict, extra: dict) -> str:
        lines = [f"\n[configurations.{name}]"]
        lines += [f"{k} = {qm.toml_value(v)}" for k, v in {**values, **extra}.items()]
        return "\n".join(lines) + "\n"

    low_tbl = {"spacing": low["spacing"], **{k: low[k] for k in qm.PLAN_KEYS}, "encoder": "plain"}
    text += table("3d_lowres", low_tbl, {})
    text += table("3d_cascade_fullres", full_tbl, {"previous_stage": "3d_lowres"})
    path = work / "plan" / "cascade.toml"
    path.write_text(text)
    ours = tomllib.loads(path.read_text())["configurations"]
    diffs = qm.plan_differences(ours["3d_lowres"], low)
    if diffs:
        raise qm.Failure("the two 3d_lowres plans differ: " + "; ".join(diffs))
    qm.log(f"3d_lowres in both: spacing {low['spacing']} (x, y, z), patch {low['patch']}, "
           f"strides {low['strides']}")
    return {"toml": str(path), "lowres_zyx": low, "nnunet": nn}


def score(a, binp: Path, data: Path, pred: Path, base: Path, tag: str, val_ids, nn_env=None,
          plans=None) -> dict:
    """Dice of a folder of fold-0 validation predictions (nnU-Net's get the reference header)."""
    if nn_env is not None:
        fixed = pred.parent / (pred.name + "_refheader")
        qm.run([a.nnunet_python, base.parent.parent / "nnunet_qm_driver.py", "refheader", "--src", pred,
                "--ref", data / "labelsTr", "--dst", fixed, "--ending", ".nii.gz",
                "--mm-per-unit", plans["mm_per_unit"]], base / f"refheader_{tag}.log", env=nn_env)
        pred = fixed
    return qm.evaluate(binp, pred, data, base / f"evaluate_{tag}.json", base / f"evaluate_{tag}.log", val_ids)


def run_nnunet(a, work: Path, binp: Path, data: Path, plans: dict, seed: int, val_ids) -> dict:
    base = work / "nnunet" / f"seed{seed}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    env = qm.nnunet_env(a, work, results=base / "results")
    out, walls = {}, {}
    jobs = [(LOW, k, a.lowres_iterations) for k in range(5)] + [(FULL, 0, a.iterations), (CASC, 0, a.iterations)]
    for config, fold, iters in jobs:
        epochs, ipe = qm.split_iterations(iters, a.iters_per_epoch)
        info = base / f"{config}_fold{fold}.json"
        walls[f"{config}/{fold}"] = qm.run(
            [a.nnunet_python, work / "nnunet_qm_driver.py", "train", "--dataset-id", a.dataset_id,
             "--plans", qm.PLANS, "--config", config, "--fold", fold, "--no-mirror", "--seed", seed,
             "--epochs", epochs, "--iters-per-epoch", ipe, "--val-iters", a.nnunet_val_iters,
             "--threads", a.threads, "--out", info], base / f"train_{config}_fold{fold}.log", env=env)
        if fold == 0:
            folder = Path(json.loads(info.read_text())["output_folder"])
            out[config] = score(a, binp, data, folder / "validation", base, config, val_ids, env, plans)
            own = json.loads((folder / "validation" / "summary.json").read_text())
            out[config]["nnunet_summary_dice"] = own["foreground_mean"]["Dice"]
        if not a.keep_checkpoints:
            for p in Path(json.loads(info.read_text())["output_folder"]).glob("checkpoint_*.pth"):
                p.unlink()
    return {"scores": out, "wall_s": walls}


def run_ours(a, work: Path, binp: Path, data: Path, cplans: dict, seed: int, splits: Path, val_ids) -> dict:
    base = work / "ours" / f"seed{seed}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    toml = cplans["toml"]
    walls = {}

    def build(config: str, cache: Path, extra=()):
        walls[f"build {config}"] = qm.run(
            [binp / "prep", "build-cache", data, "--pipeline", toml, "--configuration", config,
             "--cache-dir", cache, *extra], base / f"build_{config}.log")

    def train(config: str, cache: Path, folds: str, steps: int, out: Path):
        walls[f"train {config}"] = qm.run(
            [binp / "train", "--cache-dir", cache, "--pipeline", toml, "--configuration", config,
             "--fold", folds, "--splits", splits, "--steps", steps, "--seed", seed, "--out", out,
             "--val-every", "0", "--log-every", "10", "--no-progress", "-j", a.threads],
            base / f"train_{config}.log")

    build("3d_lowres", work / "cache_lowres")
    build("3d_fullres", work / "cache_fullres")
    low_run, full_run, casc_run = base / "lowres", base / "fullres", base / "cascade"
    train("3d_lowres", work / "cache_lowres", "0,1,2,3,4", a.lowres_iterations, low_run)
    train("3d_fullres", work / "cache_fullres", "0", a.iterations, full_run)
    build("3d_cascade_fullres", base / "cache_cascade", ["--previous-stage", low_run])
    train("3d_cascade_fullres", base / "cache_cascade", "0", a.iterations, casc_run)
    out = {
        LOW: score(a, binp, data, low_run / "fold_0" / "validation", base, LOW, val_ids),
        FULL: score(a, binp, data, full_run / "validation", base, FULL, val_ids),
        CASC: score(a, binp, data, casc_run / "validation", base, CASC, val_ids),
    }
    if not a.keep_checkpoints:
        for d in (low_run, full_run, casc_run):
            for c in d.rglob("checkpoints"):
                shutil.rmtree(c, ignore_errors=True)
        shutil.rmtree(base / "cache_cascade", ignore_errors=True)
    return {"scores": out, "wall_s": walls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/voxcache-cascade-match")
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--nnunet-python", default="python3")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--preset", default="ct-like", help="prep synth preset (ct-like, organs, ...)")
    ap.add_argument("--crop", type=int, default=160, help="in-plane crop of the cases (0: none)")
    ap.add_argument("--patch", type=int, nargs=3, default=[16, 48, 48], help="3d_fullres and cascade patch (z y x)")
    ap.add_argument("--lowres-patch", type=int, nargs=3, default=[16, 48, 48])
    ap.add_argument("--lowres-factor", type=float, default=2.0, help="3d_lowres spacing / 3d_fullres spacing")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=200, help="3d_fullres and cascade iterations")
    ap.add_argument("--lowres-iterations", type=int, default=100, help="iterations of each 3d_lowres fold")
    ap.add_argument("--dataset-id", type=int, default=778)
    ap.add_argument("--iters-per-epoch", type=int, default=50)
    ap.add_argument("--nnunet-val-iters", type=int, default=5)
    ap.add_argument("--nnunet-da-procs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--keep-checkpoints", action="store_true")
    ap.add_argument("--skip-nnunet", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    a = ap.parse_args()
    a.data = None

    work = Path(a.work).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    binp = Path(a.bin).resolve()
    t0 = time.time()
    (work / "nnunet_qm_driver.py").write_text(qm.DRIVER)
    (work / "nnunet_cm_driver.py").write_text(DRIVER)
    data = prepare_data(a, work, binp)
    _, dj = qm.register_nnunet(a, work, data)
    plans = qm.make_plans(a, work, binp, data, dj)
    cplans = cascade_plans(a, work, plans)
    splits = Path(plans["nnunet"]["splits_file"])
    val_ids = json.loads(splits.read_text())[0]["val"]
    qm.log(f"fold 0 validation: {val_ids}")

    results = work / "results"
    results.mkdir(exist_ok=True)
    rows = {}
    for seed in [int(s) for s in a.seeds.split(",")]:
        for tool, skip, fn in (("nnU-Net", a.skip_nnunet, lambda s: run_nnunet(a, work, binp, data, plans, s, val_ids)),
                               ("voxcache", a.skip_ours, lambda s: run_ours(a, work, binp, data, cplans, s, splits, val_ids))):
            saved = results / f"{tool}_seed{seed}.json"
            if skip:
                if saved.is_file():
                    rows[(tool, seed)] = json.loads(saved.read_text())
                continue
            qm.log(f"{tool}, seed {seed}")
            r = fn(seed)
            saved.write_text(json.dumps(r, indent=2))
            rows[(tool, seed)] = r

    print("\n| configuration | tool | seed | Dice (fold 0 validation) |")
    print("|---|---|---:|---:|")
    for config in (LOW, FULL, CASC):
        for (tool, seed), r in sorted(rows.items()):
            print(f"| {OURS[config]} | {tool} | {seed} | {qm.fmt(r['scores'][config]['dice'])} |")
    out = {"work": str(work), "iterations": a.iterations, "lowres_iterations": a.lowres_iterations,
           "patch": a.patch, "lowres_patch": a.lowres_patch, "lowres_factor": a.lowres_factor,
           "preset": a.preset, "crop": a.crop, "validation_cases": val_ids, "plans": plans, "cascade_plans": cplans,
           "runs": {f"{t}/{s}": r for (t, s), r in rows.items()}, "wall_s": time.time() - t0}
    (work / "results.json").write_text(json.dumps(out, indent=2))
    qm.log(f"figures in {work / 'results.json'}; {time.time() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except qm.Failure as e:
        print(f"cascade_match: {e}", file=sys.stderr)
        sys.exit(1)
