#!/usr/bin/env python3
"""Tiny real nnU-Net v2 results folders as test fixtures (no PyTorch needed to use them).

    python3 scripts/nnunet_fixtures.py --work /tmp/nnfix --nnunet-python /work/bench/nnenv/bin/python \
        --out tests/fixtures/nnunet_models

What it does (all nnU-Net work runs in child processes of --nnunet-python, through
scripts/nnunet_fixtures_driver.py; this file itself uses only Python's standard library):

  1. data      synthetic datasets in nnU-Net's raw layout (numpy + nibabel, .nii.gz):
                 Dataset981_FixCT       CT-like, spacing about 0.8 x 0.8 x 3 mm (x, y, z), channel "CT"
                                        (CTNormalization), labels 0 background, 1 organ, 2 lesion
                 Dataset982_FixRegions  two channels "T1", "FLAIR" (ZScore) with a zero region around
                                        the head (nnU-Net's plans: use_mask_for_norm true), BraTS-like
                                        nested labels 1, 2, 3 trained as regions whole/core/enhancing
               and two test cases per dataset at other spacings than the plans' (one finer, one
               coarser; one with a zero border around the nonzero region).
  2. plan      nnU-Net's fingerprint extraction, planner (ExperimentPlanner, nnUNetPlannerResEncM) and
               preprocessing; the planned network of each configuration used is then replaced in the
               plans by a tiny one (3 stages, features 4/8/16, one conv or block per stage, a small
               patch, batch 2) whose strides and kernels come from nnU-Net's get_pool_and_conv_props.
  3. train     nnU-Net's nnUNetTrainer with only the number of epochs and iterations per epoch changed
               (a subclass that records itself as "nnUNetTrainer"), CPU, one thread, seeded. When a
               model's predictions have no foreground (or miss a class), it is trained again with
               twice the iterations (at most --max-attempts times).
  4. predict   nnUNetv2_predict -device cpu --save_probabilities (step 0.5, mirroring on) on a staged
               copy of the pruned results folder (only what goes into the fixture), so the fixture is
               known to be sufficient for nnU-Net itself.
  5. collect   OUT/<fixture>/: the results folder (plans.json, dataset.json, dataset_fingerprint.json,
               fold_K/checkpoint_final.pth as torch.save wrote it), inputs/, expected*/ (CASE.nii.gz
               and CASE_probabilities.npy: nnU-Net's .npz array (float32, (classes, z, y, x)) stored as
               float16), README.md and manifest.json. Sizes are checked (< 3 MB in all, checkpoints
               < 500 kB).

Timings of every step go to WORK/timings.json (not into OUT, so a regeneration changes only the models).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from nnunet_import_check import nnunet_env  # the same folders and thread limits

TRAINER = "nnUNetTrainer"
NNUNET_VERSION = "2.8.1"

# Datasets: id -> name, generator kind, number of training cases.
DATASETS = {
    981: dict(name="Dataset981_FixCT", kind="ct", n=10),
    982: dict(name="Dataset982_FixRegions", kind="regions", n=10),
}

# The tiny networks: per (dataset, plans) the planner and per configuration the patch (nnU-Net's transposed
# axes), batch size, features; strides and kernels from nnU-Net's get_pool_and_conv_props on that patch.
PLANS = {
    (981, "nnUNetPlans"): dict(planner="ExperimentPlanner",
                               configs={"3d_fullres": dict(patch=[8, 16, 16]), "2d": dict(patch=[16, 16])}),
    (982, "nnUNetResEncUNetMPlans"): dict(planner="nnUNetPlannerResEncM",
                                          configs={"3d_fullres": dict(patch=[16, 16, 16])}),
}
FEATURES = [4, 8, 16]
BATCH = 2

# Fixtures: dataset, plans, configuration, folds trained, predictions (folder -> folds), training length.
FIXTURES = {
    "ct3d": dict(dataset=981, plans="nnUNetPlans", config="3d_fullres", folds=[0, 1],
                 predictions={"expected_fold0": [0], "expected_folds01": [0, 1]}, epochs=2, iters=50),
    "ct2d": dict(dataset=981, plans="nnUNetPlans", config="2d", folds=[0],
                 predictions={"expected": [0]}, epochs=2, iters=150),
    "regions_resenc": dict(dataset=982, plans="nnUNetResEncUNetMPlans", config="3d_fullres", folds=[0],
                           predictions={"expected": [0]}, epochs=2, iters=200),
}
VAL_ITERS = 1

MAX_TOTAL_BYTES = 3 * 1024 * 1024
MAX_CHECKPOINT_BYTES = 500 * 1000




# --------------------------------------------------------------------------------------------
# Orchestration (standard library only)
# --------------------------------------------------------------------------------------------

class Failure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[nnfixtures {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, logfile: Path, env: dict) -> float:
    cmd = [str(c) for c in cmd]
    logfile.parent.mkdir(parents=True, exist_ok=True)
    log(f"$ {shlex.join(cmd)}  (log: {logfile})")
    t = time.time()
    with open(logfile, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    wall = time.time() - t
    if rc != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-40:]
        raise Failure(f"exit status {rc} after {wall:.0f} s: {shlex.join(cmd)}\n"
                      + "\n".join("    " + line for line in tail))
    return wall


class Ctx:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work).resolve()
        self.out = Path(a.out).resolve()
        self.py = a.nnunet_python
        self.timings: dict = {}
        self.work.mkdir(parents=True, exist_ok=True)
        self.driver = Path(__file__).resolve().parent / "nnunet_fixtures_driver.py"

    def drive(self, args: list, logname: str, da_procs: int = 0) -> float:
        return run([self.py, self.driver, *args], self.work / "logs" / logname, nnunet_env(self.work, da_procs))

    def time(self, key: str, seconds: float) -> None:
        self.timings[key] = round(seconds, 1)
        (self.work / "timings.json").write_text(json.dumps(self.timings, indent=1))


def load(p: Path):
    return json.loads(p.read_text())


def results_dir(work_results: Path, fx: dict) -> Path:
    return work_results / DATASETS[fx["dataset"]]["name"] / f"{TRAINER}__{fx['plans']}__{fx['config']}"


def stage_results(c: Ctx, key: str) -> Path:
    """A copy of the model's results folder with only what the fixture keeps (WORK/stage/<key>/...)."""
    fx = FIXTURES[key]
    src = results_dir(c.work / "nnUNet_results", fx)
    root = c.work / "stage" / key
    if root.exists():
        shutil.rmtree(root)
    dst = results_dir(root, fx)
    dst.mkdir(parents=True)
    for f in ("plans.json", "dataset.json", "dataset_fingerprint.json"):
        shutil.copy2(src / f, dst / f)
    for fold in fx["folds"]:
        (dst / f"fold_{fold}").mkdir()
        shutil.copy2(src / f"fold_{fold}" / "checkpoint_final.pth", dst / f"fold_{fold}" / "checkpoint_final.pth")
    return root


def test_inputs(c: Ctx, fx: dict) -> Path:
    return c.work / "inputs" / DATASETS[fx["dataset"]]["name"]


def predict_and_collect(c: Ctx, key: str, root: Path) -> dict:
    """nnUNetv2_predict for each prediction folder of the fixture; outputs collected into WORK/collected."""
    fx = FIXTURES[key]
    exe = Path(c.py).parent / "nnUNetv2_predict"
    facts = {}
    model = results_dir(root, fx)
    for folder, folds in fx["predictions"].items():
        pred = c.work / "pred" / key / folder
        if pred.exists():
            shutil.rmtree(pred)
        cmd = [exe, "-i", test_inputs(c, fx), "-o", pred, "-d", fx["dataset"], "-p", fx["plans"], "-tr", TRAINER,
               "-c", fx["config"], "-f", *folds, "-device", "cpu", "-npp", "1", "-nps", "1",
               "--save_probabilities", "--disable_progress_bar"]
        w = run(cmd, c.work / "logs" / f"predict_{key}_{folder}.log", nnunet_env(c.work, results=root))
        c.time(f"predict_{key}_{folder}_s", w)
        dest = c.work / "collected" / key / folder
        if dest.exists():
            shutil.rmtree(dest)
        info = c.work / "collected" / key / f"{folder}.json"
        w = c.drive(["collect", "--pred", pred, "--dest", dest, "--inputs", test_inputs(c, fx), "--model", model,
                     "--config", fx["config"], "--dataset-json", model / "dataset.json",
                     "--plans-json", model / "plans.json", "--out", info,
                     "--truth", c.work / "inputs" / "labels" / DATASETS[fx["dataset"]]["name"]],
                    f"collect_{key}_{folder}.log")
        c.time(f"collect_{key}_{folder}_s", w)
        facts[folder] = load(info)
        for cid, cs in facts[folder]["cases"].items():
            log(f"{key} {folder} {cid}: labels {cs['labels_present']}, probabilities {cs['probabilities_shape']} "
                f"({cs['npz_dtype']} in the .npz, float16 error {cs['float16_max_abs_error']:.2g}), "
                f"separate z {cs['separate_z']} (axis {cs['lowres_axis']}); Dice vs truth {cs.get('dice_vs_truth')}, "
                f"margin < 1e-3 at {cs.get('margin_lt_1e-3')} of {cs.get('voxels')} voxels (min {cs.get('margin_min', 0):.2g})")
    return facts


def good_enough(facts: dict) -> tuple[bool, str]:
    """Every case has foreground, and every foreground label appears in some case."""
    why = []
    for folder, f in facts.items():
        seen = set()
        for cid, cs in f["cases"].items():
            if not cs["foreground_present"]:
                why.append(f"{folder}/{cid}: all background")
            seen.update(cs["labels_present"])
        missing = [v for v in f["foreground_labels"] if v not in seen]
        if missing:
            why.append(f"{folder}: labels {missing} predicted nowhere")
    return (not why), "; ".join(why)


def cmd_generate(a) -> int:
    c = Ctx(a)
    keys = [k.strip() for k in (a.only or ",".join(FIXTURES)).split(",") if k.strip()]
    for k in keys:
        if k not in FIXTURES:
            raise Failure(f"unknown fixture {k!r}: {', '.join(FIXTURES)}")
    t_all = time.time()
    datasets = sorted({FIXTURES[k]["dataset"] for k in keys})

    # 1. data
    data_json = c.work / "data.json"
    if a.regenerate_data or not data_json.is_file():
        spec = {str(d): DATASETS[d] for d in sorted(DATASETS)}
        c.time("data_s", c.drive(["data", "--work", c.work, "--spec", json.dumps(spec), "--out", data_json], "data.log"))
    data = load(data_json)

    # 2. plan, tiny networks, preprocess
    plan_info = {}
    for (ds, plans_name), spec in PLANS.items():
        if ds not in datasets:
            continue
        out = c.work / "logs" / f"plan_{ds}_{plans_name}.json"
        w = c.drive(["plan", "--dataset-id", ds, "--plans", plans_name, "--planner", spec["planner"],
                     "--tiny", json.dumps(spec["configs"]), "--features", *FEATURES, "--batch", BATCH,
                     "--out", out], f"plan_{ds}_{plans_name}.log", da_procs=1)
        c.time(f"plan_{ds}_{plans_name}_s", w)
        plan_info[(ds, plans_name)] = load(out)
        pi = plan_info[(ds, plans_name)]
        log(f"planned {pi['dataset']} {plans_name} in {w:.0f} s ({pi['times']}); transpose {pi['transpose_forward']}, "
            f"median relative size after cropping {pi['median_relative_size_after_cropping']}")
        for cname, cfg in pi["configurations"].items():
            log(f"  {cname}: spacing {cfg['spacing']}, patch {cfg['patch_size']}, strides {cfg['strides']}, "
                f"kernels {cfg['kernel_sizes']}, {cfg['normalization_schemes']} mask {cfg['use_mask_for_norm']}, "
                f"{cfg['network_class_name'].rsplit('.', 1)[-1]} (planned: {cfg['planned_network']})")

    # 3.-4. train, predict, check; retrain longer when the predictions are empty
    state_path = c.work / "state.json"
    state = load(state_path) if state_path.is_file() else {}
    facts = {}
    for key in keys:
        fx = FIXTURES[key]
        retrain = a.retrain
        iters = a.iterations or fx["iters"]
        epochs = a.epochs or fx["epochs"]
        for attempt in range(a.max_attempts):
            st = state.get(key, {})
            for fold in fx["folds"]:
                ck = results_dir(c.work / "nnUNet_results", fx) / f"fold_{fold}" / "checkpoint_final.pth"
                done = st.get("folds", {}).get(str(fold))
                if ck.is_file() and done == [epochs, iters] and not retrain:
                    log(f"{key} fold {fold}: trained already ({epochs} x {iters})")
                    continue
                out = c.work / "logs" / f"train_{key}_fold{fold}.json"
                w = c.drive(["train", "--dataset-id", fx["dataset"], "--plans", fx["plans"], "--config", fx["config"],
                             "--fold", fold, "--seed", a.seed + 100 * fx["dataset"] + fold, "--epochs", epochs,
                             "--iters", iters, "--val-iters", VAL_ITERS, "--out", out],
                            f"train_{key}_fold{fold}.log")
                info = load(out)
                c.time(f"train_{key}_fold{fold}_s", w)
                log(f"{key} fold {fold}: {epochs} epochs x {iters} iterations, {info['train_wall_s']:.0f} s training "
                    f"({w:.0f} s with start-up); mirroring axes {info['inference_allowed_mirroring_axes']}")
                st.setdefault("folds", {})[str(fold)] = [epochs, iters]
                state[key] = st
                state_path.write_text(json.dumps(state, indent=1))
            root = stage_results(c, key)
            facts[key] = predict_and_collect(c, key, root)
            ok, why = good_enough(facts[key])
            if ok:
                break
            if attempt + 1 == a.max_attempts:
                raise Failure(f"{key}: predictions still poor after {a.max_attempts} attempts: {why}")
            iters *= 2
            log(f"{key}: {why}; training again with {iters} iterations per epoch")
            retrain = True
        state[key]["iterations"] = [epochs, iters]
        state_path.write_text(json.dumps(state, indent=1))

    # 5. the fixtures
    c.out.mkdir(parents=True, exist_ok=True)
    manifest_path = c.out / "manifest.json"
    manifest = load(manifest_path) if manifest_path.is_file() else {}
    manifest.update({"nnunetv2_version": NNUNET_VERSION, "trainer": TRAINER,
                     "generator": "scripts/nnunet_fixtures.py"})
    manifest.setdefault("fixtures", {})
    for key in keys:
        fx = FIXTURES[key]
        ds = DATASETS[fx["dataset"]]
        dst = c.out / key
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        root = c.work / "stage" / key
        model_rel = results_dir(Path("."), fx).name
        shutil.copytree(results_dir(root, fx), dst / model_rel)
        (dst / "inputs").mkdir()
        for f in sorted(test_inputs(c, fx).iterdir()):
            shutil.copy2(f, dst / "inputs" / f.name)
        for folder in fx["predictions"]:
            shutil.copytree(c.work / "collected" / key / folder, dst / folder)
        pi = plan_info.get((fx["dataset"], fx["plans"]))
        if pi is None:
            pi = load(c.work / "logs" / f"plan_{fx['dataset']}_{fx['plans']}.json")
        cfg = pi["configurations"][fx["config"]]
        first = next(iter(facts[key].values()))
        cases = sorted(first["cases"])
        tests = {t["id"]: t for t in data[ds["name"]]["tests"]}
        manifest["fixtures"][key] = {
            "results_folder": f"{key}/{model_rel}",
            "dataset": ds["name"], "plans": fx["plans"], "configuration": fx["config"], "folds": fx["folds"],
            "network_class_name": cfg["network_class_name"],
            "patch_size": cfg["patch_size"], "features_per_stage": cfg["features_per_stage"],
            "strides": cfg["strides"], "kernel_sizes": cfg["kernel_sizes"],
            "target_spacing": cfg["spacing"], "transpose_forward": pi["transpose_forward"],
            "normalization_schemes": cfg["normalization_schemes"],
            "use_mask_for_norm": cfg["use_mask_for_norm"],
            "regions": first["regions"],
            "inference_allowed_mirroring_axes": {k: v["inference_allowed_mirroring_axes"]
                                                 for k, v in first["checkpoints"].items()},
            "training": {"epochs": state[key]["iterations"][0], "iterations_per_epoch": state[key]["iterations"][1],
                         "trainer_recorded_as": TRAINER},
            "inputs": "inputs",
            "expected": {folder: {"folder": folder, "folds": folds} for folder, folds in fx["predictions"].items()},
            "cases": {cid: {"spacing_xyz": tests[cid]["spacing_xyz"], "shape_xyz": tests[cid]["shape_xyz"],
                            "zero_border_xyz": tests[cid]["zero_border_xyz"],
                            "separate_z": first["cases"][cid]["separate_z"],
                            "lowres_axis": first["cases"][cid]["lowres_axis"],
                            "nonzero_bbox_xyz": first["cases"][cid]["nonzero_bbox_xyz"],
                            "nonzero_bbox_fraction": first["cases"][cid]["nonzero_bbox_fraction"],
                            "probabilities_shape": first["cases"][cid]["probabilities_shape"],
                            "expected": {f: {"labels_predicted": facts[key][f]["cases"][cid]["labels_present"],
                                             "dice_vs_synthetic_truth": facts[key][f]["cases"][cid]["dice_vs_truth"],
                                             "voxels_with_margin_below_1e-3":
                                                 facts[key][f]["cases"][cid]["margin_lt_1e-3"],
                                             "min_margin": round(facts[key][f]["cases"][cid]["margin_min"], 6)}
                                         for f in fx["predictions"]}}
                      for cid in cases},
            "probabilities": "CASE_probabilities.npy: the float32 array of nnU-Net's CASE.npz ('probabilities', "
                             "(classes or regions, z, y, x)) stored as float16",
            "margin": "top-1 minus top-2 probability (softmax) or 2 * min over regions of |p - 0.5| (regions), "
                      "from nnU-Net's float32 probabilities; voxels with a small margin may flip in an importer",
        }
    manifest["fixtures"] = {k: manifest["fixtures"][k] for k in sorted(manifest["fixtures"])}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    write_readme(c.out, manifest)

    # sizes
    total = sum(f.stat().st_size for f in c.out.rglob("*") if f.is_file())
    big = [(f, f.stat().st_size) for f in c.out.rglob("checkpoint_final.pth") if f.stat().st_size >= MAX_CHECKPOINT_BYTES]
    for f in sorted(c.out.rglob("checkpoint_final.pth")):
        log(f"{f.relative_to(c.out)}: {f.stat().st_size} bytes")
    log(f"{c.out}: {total} bytes in all")
    c.time("total_s", time.time() - t_all)
    log(f"timings: {json.dumps(c.timings)}")
    if big:
        raise Failure("checkpoints too large: " + ", ".join(f"{f} {s} bytes" for f, s in big))
    if total >= MAX_TOTAL_BYTES:
        raise Failure(f"{c.out} holds {total} bytes (limit {MAX_TOTAL_BYTES})")
    return 0


def write_readme(out: Path, manifest: dict) -> None:
    lines = [
        "# Tiny nnU-Net v2 models (test fixtures)",
        "",
        f"Real results folders of nnU-Net {manifest['nnunetv2_version']} (`nnUNetTrainer`), trained for a few "
        "iterations on synthetic data with a tiny network (3 stages, features 4/8/16) written into the plans, "
        "and nnUNetv2_predict's outputs on two test cases each (`-device cpu --save_probabilities`, step 0.5, "
        "mirroring on). Using them needs no PyTorch: checkpoints are kept exactly as torch.save wrote them.",
        "",
        "| fixture | results folder | folds | network | use_mask_for_norm | cases |",
        "|---|---|---|---|---|---|",
    ]
    for key, f in manifest["fixtures"].items():
        lines.append(f"| {key} | `{f['results_folder']}` | {','.join(map(str, f['folds']))} | "
                     f"{f['network_class_name'].rsplit('.', 1)[-1]} | {f['use_mask_for_norm']} | "
                     f"{', '.join(f['cases'])} |")
    lines += [
        "",
        "- `ct3d`: CT-like, spacing about 0.8 x 0.8 x 3 mm (x, y, z; separate-z resampling), CTNormalization, "
        "labels 0/1/2; 3d_fullres, folds 0 and 1 (`expected_fold0/`, `expected_folds01/` = the ensemble).",
        "- `ct2d`: the same dataset's 2d configuration, fold 0.",
        "- `regions_resenc`: two channels (T1, FLAIR: ZScore with use_mask_for_norm, a zero region around the "
        "head), BraTS-like regions whole/core/enhancing (sigmoid), nnUNetPlannerResEncM plans "
        "(ResidualEncoderUNet), fold 0.",
        "",
        "Each fixture: `inputs/` (CASE_0000.nii.gz[, CASE_0001.nii.gz]: one case finer and one coarser than the "
        "plans' spacing, one with a zero border), `expected*/CASE.nii.gz` (nnU-Net's segmentation) and "
        "`expected*/CASE_probabilities.npy` (the float32 array of nnU-Net's CASE.npz, (classes or regions, z, y, x), "
        "stored as float16). `manifest.json` has the details (spacings, separate-z, mirroring axes, nonzero "
        "boxes, near-tie voxels per case: where nnU-Net's own top-2 margin is tiny, an importer may differ).",
        "",
        "Check an importer, e.g. voxcache's:",
        "",
        "```",
        "target/release/predict --nnunet-model tests/fixtures/nnunet_models/ct3d/nnUNetTrainer__nnUNetPlans__3d_fullres \\",
        "    tests/fixtures/nnunet_models/ct3d/inputs --folds 0,1 --out /tmp/ct3d   # vs ct3d/expected_folds01/",
        "```",
        "",
        "(`--folds` takes several values: give the inputs before it, or write `--folds=0,1`.)",
        "",
        "```",
        "# nnU-Net itself on a fixture (gives the expected folders again, bit for bit on the generating machine):",
        "nnUNetv2_predict_from_modelfolder -m tests/fixtures/nnunet_models/ct3d/nnUNetTrainer__nnUNetPlans__3d_fullres \\",
        "    -i tests/fixtures/nnunet_models/ct3d/inputs -o /tmp/ct3d_nnunet -f 0 1 -device cpu --save_probabilities",
        "```",
        "",
        "Regenerate (needs nnunetv2 " + manifest["nnunetv2_version"] + " and torch; CPU, a few minutes):",
        "",
        "```",
        "python3 scripts/nnunet_fixtures.py --work /tmp/nnfix --nnunet-python /path/to/venv/bin/python \\",
        "    --out tests/fixtures/nnunet_models",
        "```",
        "",
        "Training is seeded but not bitwise reproducible across machines: a regeneration changes the weights and "
        "the expected outputs together.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--work", required=True, help="work folder (datasets, nnU-Net folders, logs), outside the repo")
    ap.add_argument("--nnunet-python", required=True, help="python with nnunetv2 " + NNUNET_VERSION + " and torch")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/nnunet_models")
    ap.add_argument("--only", help="comma-separated fixtures (default all): " + ", ".join(FIXTURES))
    ap.add_argument("--epochs", type=int, help="epochs per fold (default per fixture)")
    ap.add_argument("--iterations", type=int, help="training iterations per epoch (default per fixture: "
                    + ", ".join(f"{k} {v['iters']}" for k, v in FIXTURES.items()) + ")")
    ap.add_argument("--max-attempts", type=int, default=3,
                    help="train again with twice the iterations while predictions lack foreground (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regenerate-data", action="store_true", help="rewrite the synthetic datasets")
    ap.add_argument("--retrain", action="store_true", help="train again even when checkpoints exist")
    a = ap.parse_args()
    return cmd_generate(a)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"nnunet_fixtures: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
