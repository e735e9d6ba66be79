#!/usr/bin/env python3
"""Tiny real nnU-Net v2 results folders as test fixtures (no PyTorch needed to use them).

    python3 scripts/nnunet_fixtures.py --work /tmp/nnfix --nnunet-python /work/bench/nnenv/bin/python \
        --out tests/fixtures/nnunet_models

What it does (all nnU-Net work runs in child processes of --nnunet-python, through a driver this script
writes to WORK/nnunet_fixtures_driver.py; this file itself uses only Python's standard library):

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
# The driver (run by --nnunet-python). Module level stays light: nnU-Net's spawned workers import it.
# --------------------------------------------------------------------------------------------
DRIVER = r'''
"""nnU-Net side of scripts/nnunet_fixtures.py (written by it; run with nnU-Net's python)."""
import argparse
import glob
import json
import os
import random
import sys
import time


def _dump(obj, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


# ------------------------------------------------------------------ synthetic data

def _coords(shape_xyz, spacing_xyz, origin_shift):
    """Physical coordinates (mm) of voxel centres relative to the field of view's centre (plus a shift),
    one array per axis, broadcastable over (x, y, z)."""
    import numpy as np
    out = []
    for ax in range(3):
        n, s = shape_xyz[ax], spacing_xyz[ax]
        c = (np.arange(n) + 0.5) * s - n * s / 2.0 - origin_shift[ax]
        sh = [1, 1, 1]
        sh[ax] = n
        out.append(c.reshape(sh))
    return out


def _inside(g, centre, radii):
    x, y, z = g
    return (((x - centre[0]) / radii[0]) ** 2 + ((y - centre[1]) / radii[1]) ** 2
            + ((z - centre[2]) / radii[2]) ** 2) <= 1.0


def make_case(kind, shape_xyz, spacing_xyz, rng, zero_border=(0, 0, 0)):
    """(channels as int16 arrays (x, y, z), label uint8 (x, y, z))."""
    import numpy as np
    shape = tuple(int(s) for s in shape_xyz)
    fov = [n * s for n, s in zip(shape, spacing_xyz)]
    g = _coords(shape, spacing_xyz, [0.0, 0.0, 0.0])
    lab = np.zeros(shape, np.uint8)

    def j(r):
        return float(rng.uniform(-r, r))

    if kind == "ct":
        x, y, z = g
        body = np.broadcast_to((x / (0.46 * fov[0])) ** 2 + (y / (0.44 * fov[1])) ** 2 <= 1.0, shape)
        organ_c = (j(1.5), j(1.5), j(4.0))
        organ = _inside(g, organ_c, (6.0 + j(0.8), 5.5 + j(0.8), 14.0 + j(2.0))) & body
        lesion = _inside(g, (organ_c[0] + j(1.5), organ_c[1] + j(1.5), organ_c[2] + j(3.0)),
                         (2.8, 2.8, 5.5)) & organ
        lab[organ] = 1
        lab[lesion] = 2
        img = np.where(body, 40.0, -1000.0) + rng.normal(0, 1, shape) * np.where(body, 15.0, 10.0)
        img = np.where(lab == 1, 150.0 + rng.normal(0, 15, shape), img)
        img = np.where(lab == 2, 320.0 + rng.normal(0, 15, shape), img)
        img = np.round(img)
        img[img == 0] = 1  # zeros only where a zero border is asked for
        chans = [img.astype(np.int16)]
    elif kind == "regions":
        head = _inside(g, (j(0.8), j(0.8), j(0.8)), (8.5, 8.0, 8.5))
        tc = (j(1.5), j(1.5), j(1.5))
        whole = _inside(g, tc, (5.0 + j(0.5), 4.6 + j(0.5), 5.0 + j(0.5))) & head
        core = _inside(g, (tc[0] + j(0.6), tc[1] + j(0.6), tc[2] + j(0.6)), (3.3, 3.3, 3.3)) & whole
        necrosis = _inside(g, tc, (1.7, 1.7, 1.7)) & core
        lab[whole] = 1      # oedema
        lab[core] = 3       # enhancing rim ...
        lab[necrosis] = 2   # ... around necrosis: whole = 1,2,3; core = 2,3; enhancing = 3
        t1 = np.select([lab == 3, lab == 2, lab == 1, head], [700.0, 120.0, 280.0, 300.0], 0.0)
        flair = np.select([lab == 3, lab == 2, lab == 1, head], [380.0, 300.0, 460.0, 200.0], 0.0)
        t1 = np.where(head, np.maximum(1.0, t1 + rng.normal(0, 15, shape)), 0.0)
        flair = np.where(head, np.maximum(1.0, flair + rng.normal(0, 15, shape)), 0.0)
        chans = [np.round(t1).astype(np.int16), np.round(flair).astype(np.int16)]
    else:
        raise ValueError(kind)
    b = [int(v) for v in zero_border]
    if any(b):
        keep = np.zeros(shape, bool)
        keep[b[0]:shape[0] - b[0], b[1]:shape[1] - b[1], b[2]:shape[2] - b[2]] = True
        chans = [np.where(keep, c, 0).astype(c.dtype) for c in chans]
        lab = np.where(keep, lab, 0).astype(np.uint8)
    return chans, lab


def _save(arr_xyz, spacing_xyz, path):
    import nibabel as nib
    import numpy as np
    aff = np.diag([float(s) for s in spacing_xyz] + [1.0])
    aff[:3, 3] = [-n * s / 2.0 for n, s in zip(arr_xyz.shape, spacing_xyz)]
    img = nib.Nifti1Image(arr_xyz, aff)
    img.header.set_xyzt_units("mm", "sec")
    img.set_qform(aff, code=1)
    img.set_sform(aff, code=1)
    nib.save(img, path)


# Per kind: training spacing (x, y, z) and shape, test cases (id suffix, spacing, shape, zero border xyz).
KINDS = {
    "ct": dict(
        spacing=lambda r: [round(float(r.uniform(0.76, 0.84)), 3)] * 2 + [float(r.choice([2.75, 3.0, 3.25]))],
        shape=lambda r: [int(r.randint(26, 31)), int(r.randint(24, 29)), int(r.randint(15, 18))],
        tests=[("fine", [0.6, 0.6, 2.2], [36, 33, 21], (0, 0, 0)),
               ("coarse", [1.1, 1.1, 4.0], [24, 22, 13], (2, 2, 1))]),
    "regions": dict(
        spacing=lambda r: [round(float(r.uniform(0.95, 1.05)), 3) for _ in range(3)],
        shape=lambda r: [int(r.randint(23, 26)) for _ in range(3)],
        tests=[("fine", [0.8, 0.8, 0.8], [27, 27, 27], (0, 0, 0)),
               ("coarse", [1.3, 1.3, 1.3], [20, 20, 20], (0, 0, 0))]),
}
CHANNELS = {"ct": {"0": "CT"}, "regions": {"0": "T1", "1": "FLAIR"}}
LABELS = {"ct": {"background": 0, "organ": 1, "lesion": 2},
          "regions": {"background": 0, "whole": [1, 2, 3], "core": [2, 3], "enhancing": [3]}}
PREFIX = {"ct": "ct", "regions": "brain"}


def cmd_data(a):
    import numpy as np
    spec = json.loads(a.spec)
    out = {}
    for ds_id, d in sorted((int(k), v) for k, v in spec.items()):
        kind, name, n = d["kind"], d["name"], d["n"]
        rng = np.random.RandomState(ds_id)
        k = KINDS[kind]
        raw = os.path.join(a.work, "nnUNet_raw", name)
        for sub in ("imagesTr", "labelsTr"):
            os.makedirs(os.path.join(raw, sub), exist_ok=True)
        cases = []
        for i in range(n):
            sp, shape = k["spacing"](rng), k["shape"](rng)
            chans, lab = make_case(kind, shape, sp, rng)
            cid = f"{PREFIX[kind]}_{i:03d}"
            for c, ch in enumerate(chans):
                _save(ch, sp, os.path.join(raw, "imagesTr", f"{cid}_{c:04d}.nii.gz"))
            _save(lab, sp, os.path.join(raw, "labelsTr", f"{cid}.nii.gz"))
            cases.append({"id": cid, "spacing_xyz": sp, "shape_xyz": shape,
                          "labels": sorted(int(v) for v in np.unique(lab))})
        dj = {"channel_names": CHANNELS[kind], "labels": LABELS[kind], "numTraining": n,
              "file_ending": ".nii.gz", "name": name}
        if kind == "regions":
            dj["regions_class_order"] = [1, 2, 3]
        _dump(dj, os.path.join(raw, "dataset.json"))
        tdir = os.path.join(a.work, "inputs", name)
        os.makedirs(tdir, exist_ok=True)
        tests = []
        for suffix, sp, shape, border in k["tests"]:
            chans, lab = make_case(kind, shape, sp, rng, zero_border=border)
            cid = f"{PREFIX[kind]}_{suffix}"
            for c, ch in enumerate(chans):
                _save(ch, sp, os.path.join(tdir, f"{cid}_{c:04d}.nii.gz"))
            ldir = os.path.join(a.work, "inputs", "labels", name)  # the truth, for the report only
            os.makedirs(ldir, exist_ok=True)
            _save(lab, sp, os.path.join(ldir, f"{cid}.nii.gz"))
            tests.append({"id": cid, "spacing_xyz": sp, "shape_xyz": shape, "zero_border_xyz": list(border),
                          "labels": sorted(int(v) for v in np.unique(lab))})
        out[name] = {"training": cases, "tests": tests, "inputs": tdir}
        print(f"{name}: {n} training cases, {len(tests)} test cases")
    _dump(out, a.out)


# ------------------------------------------------------------------ planning, tiny networks

def _tiny(cfg, patch):
    """cfg with a tiny network: topology from nnU-Net's get_pool_and_conv_props on `patch`."""
    from copy import deepcopy
    from nnunetv2.experiment_planning.experiment_planners.network_topology import get_pool_and_conv_props
    n_pool, strides, kernels, padded, _ = get_pool_and_conv_props(cfg["spacing"], patch, 4, 999999)
    padded = [int(v) for v in padded]
    if padded != [int(v) for v in patch]:
        raise SystemExit(f"patch {patch} is not divisible by its strides (padded {padded})")
    n = len(strides)
    if n > len(FEATURES):
        raise SystemExit(f"patch {patch} at spacing {cfg['spacing']} gives {n} stages; at most {len(FEATURES)}")
    out = deepcopy(cfg)
    out["patch_size"] = padded
    out["batch_size"] = BATCH
    ak = out["architecture"]["arch_kwargs"]
    ak["n_stages"] = n
    ak["features_per_stage"] = FEATURES[:n]
    ak["strides"] = [[int(v) for v in s] for s in strides]
    ak["kernel_sizes"] = [[int(v) for v in k] for k in kernels]
    if "n_conv_per_stage" in ak:
        ak["n_conv_per_stage"] = [1] * n
    if "n_blocks_per_stage" in ak:
        ak["n_blocks_per_stage"] = [1] * n
    ak["n_conv_per_stage_decoder"] = [1] * (n - 1)
    return out


FEATURES = None
BATCH = None


def cmd_plan(a):
    global FEATURES, BATCH
    from nnunetv2.experiment_planning.plan_and_preprocess_api import extract_fingerprints, plan_experiments, \
        preprocess
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    FEATURES = [int(v) for v in a.features]
    BATCH = int(a.batch)
    tiny = json.loads(a.tiny)
    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    plans_file = os.path.join(pre, a.plans + ".json")
    times = {}
    t = time.time()
    if not os.path.isfile(os.path.join(pre, "dataset_fingerprint.json")):
        extract_fingerprints([a.dataset_id], num_processes=1, check_dataset_integrity=True)
    times["fingerprint_s"] = time.time() - t
    t = time.time()
    if not os.path.isfile(plans_file):
        plan_experiments([a.dataset_id], experiment_planner_class_name=a.planner)
    times["plan_s"] = time.time() - t
    with open(plans_file) as f:
        plans = json.load(f)
    planned = {}
    for cname, spec in tiny.items():
        cfg = plans["configurations"][cname]
        if "planned_network" in cfg:  # made tiny before (a rerun)
            continue
        planned[cname] = {"patch_size": cfg["patch_size"], "batch_size": cfg["batch_size"],
                          "n_stages": cfg["architecture"]["arch_kwargs"]["n_stages"],
                          "features_per_stage": cfg["architecture"]["arch_kwargs"]["features_per_stage"]}
        new = _tiny(cfg, spec["patch"])
        new["planned_network"] = planned[cname]  # unknown keys are ignored by nnU-Net
        plans["configurations"][cname] = new
    with open(plans_file, "w") as f:
        json.dump(plans, f, indent=4, sort_keys=False)
    t = time.time()
    for cname in tiny:
        ident = plans["configurations"][cname]["data_identifier"]
        marker = os.path.join(pre, f".fixtures_preprocessed_{a.plans}_{ident}")
        if not os.path.isfile(marker):
            preprocess([a.dataset_id], plans_identifier=a.plans, configurations=[cname], num_processes=[1])
            open(marker, "w").close()
    times["preprocess_s"] = time.time() - t
    with open(os.path.join(pre, "dataset_fingerprint.json")) as f:
        fp = json.load(f)
    out = {"dataset": name, "plans_file": plans_file, "times": times,
           "transpose_forward": plans["transpose_forward"],
           "median_relative_size_after_cropping": fp.get("median_relative_size_after_cropping"),
           "configurations": {}}
    for cname in tiny:
        c = plans["configurations"][cname]
        ak = c["architecture"]["arch_kwargs"]
        out["configurations"][cname] = {
            "patch_size": c["patch_size"], "batch_size": c["batch_size"], "spacing": c["spacing"],
            "normalization_schemes": c["normalization_schemes"], "use_mask_for_norm": c["use_mask_for_norm"],
            "network_class_name": c["architecture"]["network_class_name"],
            "n_stages": ak["n_stages"], "features_per_stage": ak["features_per_stage"],
            "strides": ak["strides"], "kernel_sizes": ak["kernel_sizes"],
            "planned_network": c.get("planned_network")}
    _dump(out, a.out)


# ------------------------------------------------------------------ training

def cmd_train(a):
    import numpy as np
    import torch
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer as Stock
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)

    class Short(Stock):
        """The stock trainer with a short schedule; nothing else differs."""

        def __init__(self, plans, configuration, fold, dataset_json, device=torch.device("cpu")):
            super().__init__(plans, configuration, fold, dataset_json, device)
            self.num_epochs = a.epochs
            self.num_iterations_per_epoch = a.iters
            self.num_val_iterations_per_epoch = a.val_iters

    # Recorded as the stock trainer (results folder name, checkpoint's trainer_name), so nnUNetv2_predict
    # -tr nnUNetTrainer and importers rebuild the network the stock way: the subclass does not change it.
    Short.__name__ = Short.__qualname__ = "nnUNetTrainer"

    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    with open(os.path.join(pre, a.plans + ".json")) as f:
        plans = json.load(f)
    plans["continue_training"] = False
    with open(os.path.join(pre, "dataset.json")) as f:
        dataset_json = json.load(f)
    trainer = Short(plans, a.config, a.fold, dataset_json, torch.device("cpu"))
    t0 = time.time()
    trainer.run_training()
    _dump({"output_folder": trainer.output_folder, "epochs": a.epochs, "iters_per_epoch": a.iters,
           "train_wall_s": time.time() - t0,
           "inference_allowed_mirroring_axes": list(trainer.inference_allowed_mirroring_axes or [])}, a.out)


# ------------------------------------------------------------------ after nnUNetv2_predict

def _sitk_spacing_zyx(path):
    """nnU-Net's own reader (SimpleITKIO): spacing in the array's (z, y, x) order."""
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
    _, props = SimpleITKIO().read_images([path])
    return [float(v) for v in props["spacing"]]


def cmd_collect(a):
    """nnUNetv2_predict's outputs into DEST (CASE.nii.gz, CASE_probabilities.npy float16); facts."""
    import numpy as np
    import nibabel as nib
    import torch
    from nnunetv2.preprocessing.resampling.default_resampling import determine_do_sep_z_and_axis

    with open(a.dataset_json) as f:
        dj = json.load(f)
    with open(a.plans_json) as f:
        plans = json.load(f)
    cfg = plans["configurations"][a.config]
    ending = dj["file_ending"]
    labels = {k: v for k, v in dj["labels"].items() if k != "ignore"}
    regions = any(isinstance(v, list) and len(v) > 1 for v in labels.values())
    fg = sorted({int(x) for k, v in labels.items() if k != "background" for x in (v if isinstance(v, list) else [v])})
    os.makedirs(a.dest, exist_ok=True)
    out = {"cases": {}, "regions": regions, "foreground_labels": fg}
    for seg_path in sorted(glob.glob(os.path.join(a.pred, "*" + ending))):
        cid = os.path.basename(seg_path)[:-len(ending)]
        seg = np.asanyarray(nib.load(seg_path).dataobj)
        probs = np.load(os.path.join(a.pred, cid + ".npz"))["probabilities"]
        p16 = probs.astype(np.float16)
        np.save(os.path.join(a.dest, cid + "_probabilities.npy"), p16)
        with open(seg_path, "rb") as f, open(os.path.join(a.dest, cid + ending), "wb") as g:
            g.write(f.read())
        present = sorted(int(v) for v in np.unique(seg))
        # The decision from the float16 probabilities: equal to nnU-Net's segmentation except at ties.
        if regions:
            dec = np.zeros(p16.shape[1:], np.uint8)
            for i, c in enumerate(dj["regions_class_order"]):
                dec[p16[i].astype(np.float32) > 0.5] = c
        else:
            dec = np.argmax(p16.astype(np.float32), 0)
        seg_zyx = seg.transpose(2, 1, 0)
        in0 = os.path.join(a.inputs, cid + "_0000" + ending)
        sp_zyx = _sitk_spacing_zyx(in0)
        sp_t = [sp_zyx[i] for i in plans["transpose_forward"]]
        target = list(cfg["spacing"])
        if len(target) == 2:  # 2d: the first (transposed) axis keeps its spacing
            target = [sp_t[0]] + target
        sepz, axis = determine_do_sep_z_and_axis(None, sp_t, target)
        nz = None
        for ch in sorted(glob.glob(os.path.join(a.inputs, cid + "_[0-9][0-9][0-9][0-9]" + ending))):
            m = np.asanyarray(nib.load(ch).dataobj) != 0
            nz = m if nz is None else (nz | m)
        idx = np.argwhere(nz)
        bbox_xyz = [[int(idx[:, d].min()), int(idx[:, d].max()) + 1] for d in range(3)] if len(idx) else None
        bbox_frac = (float(np.prod([hi - lo for lo, hi in bbox_xyz])) / nz.size) if bbox_xyz else 0.0
        # How confident the tiny model is: near-ties are where an importer's rounding may flip a voxel.
        pf = probs.astype(np.float64)
        if regions:
            margin = 2 * np.min(np.abs(pf - 0.5), axis=0)
        else:
            srt = np.sort(pf, axis=0)
            margin = srt[-1] - srt[-2]
        dice_truth = None
        tpath = os.path.join(a.truth, cid + ending) if a.truth else None
        if tpath and os.path.isfile(tpath):
            truth = np.asanyarray(nib.load(tpath).dataobj)
            dice_truth = {}
            for lname, v in labels.items():
                if lname == "background":
                    continue
                vals = v if isinstance(v, list) else [v]
                p_, t_ = np.isin(seg, vals), np.isin(truth, vals)
                den = int(p_.sum()) + int(t_.sum())
                dice_truth[lname] = round(1.0 if den == 0 else 2.0 * int((p_ & t_).sum()) / den, 4)
        out["cases"][cid] = {
            "seg_shape_zyx": list(seg_zyx.shape), "probabilities_shape": list(probs.shape),
            "npz_dtype": str(probs.dtype), "float16_max_abs_error": float(np.max(np.abs(p16.astype(np.float32) - probs))),
            "labels_present": present, "foreground_present": any(v in fg for v in present),
            "all_labels_present": all(v in present for v in fg),
            "float16_decision_equal_pct": 100.0 * float(np.mean(dec == seg_zyx)),
            "spacing_zyx": sp_zyx, "target_spacing_transposed": target,
            "separate_z": bool(sepz), "lowres_axis": None if axis is None else int(axis),
            "dice_vs_truth": dice_truth, "nonzero_bbox_xyz": bbox_xyz,
            "nonzero_bbox_fraction": round(bbox_frac, 4), "margin_min": float(margin.min()),
            "margin_lt_1e-2": int((margin < 1e-2).sum()), "margin_lt_1e-3": int((margin < 1e-3).sum()),
            "voxels": int(seg.size)}
    ck = {}
    for ckp in sorted(glob.glob(os.path.join(a.model, "fold_*", "checkpoint_final.pth"))):
        c = torch.load(ckp, map_location="cpu", weights_only=False)
        n_params = sum(int(v.numel()) for v in c["network_weights"].values())
        ck[os.path.basename(os.path.dirname(ckp))] = {
            "bytes": os.path.getsize(ckp), "trainer_name": c.get("trainer_name"),
            "current_epoch": c.get("current_epoch"), "n_parameters": n_params,
            "keys": sorted(c.keys()),
            "inference_allowed_mirroring_axes": list(c.get("inference_allowed_mirroring_axes") or [])}
    out["checkpoints"] = ck
    _dump(out, a.out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("data")
    p.add_argument("--work", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--dataset-id", type=int, required=True)
    p.add_argument("--plans", required=True)
    p.add_argument("--planner", required=True)
    p.add_argument("--tiny", required=True)
    p.add_argument("--features", type=int, nargs="+", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train")
    p.add_argument("--dataset-id", type=int, required=True)
    p.add_argument("--plans", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--fold", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--val-iters", type=int, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("collect")
    p.add_argument("--pred", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--dataset-json", required=True)
    p.add_argument("--plans-json", required=True)
    p.add_argument("--truth")
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"data": cmd_data, "plan": cmd_plan, "train": cmd_train, "collect": cmd_collect}[a.cmd](a)


if __name__ == "__main__":
    main()
'''


# --------------------------------------------------------------------------------------------
# Orchestration (standard library only)
# --------------------------------------------------------------------------------------------

class Failure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[nnfixtures {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def nnunet_env(work: Path, results: Path | None = None, da_procs: int = 0) -> dict:
    """nnU-Net's folders, one thread. nnUNet_n_proc_DA=0: augmentation in the training process (the
    planner passes nnUNet_n_proc_DA to torch.set_num_threads, which refuses 0: it gets 1)."""
    env = dict(os.environ)
    env.update({
        "nnUNet_raw": str(work / "nnUNet_raw"),
        "nnUNet_preprocessed": str(work / "nnUNet_preprocessed"),
        "nnUNet_results": str(results or (work / "nnUNet_results")),
        "nnUNet_n_proc_DA": str(da_procs),
        "nnUNet_def_n_proc": "1",
        "nnUNet_compile": "false",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
    })
    return env


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
        self.driver = self.work / "nnunet_fixtures_driver.py"
        if not self.driver.is_file() or self.driver.read_text() != DRIVER:
            self.driver.write_text(DRIVER)

    def drive(self, args: list, logname: str, da_procs: int = 0) -> float:
        return run([self.py, self.driver, *args], self.work / "logs" / logname, nnunet_env(self.work, None, da_procs))

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
        w = run(cmd, c.work / "logs" / f"predict_{key}_{folder}.log", nnunet_env(c.work, root))
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
