#!/usr/bin/env python3
"""nnU-Net side of scripts/nnunet_fixtures.py, run by it with nnU-Net's python. Module level stays
light: nnU-Net's spawned workers import it."""
import argparse
import glob
import json
import os
import random
import sys
import time

# Helpers shared with the import harness's driver (same python, same folder).
from nnunet_import_driver import _dump, _save


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
