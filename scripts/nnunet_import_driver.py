#!/usr/bin/env python3
"""nnU-Net side of scripts/nnunet_import_check.py, run by it with nnU-Net's python (numpy, nibabel,
torch, nnunetv2). Module level stays light: nnU-Net's spawn pools import it."""
import argparse
import glob
import json
import os
import random
import time
from copy import deepcopy


def _dump(obj, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def _jsonable(x):
    import numpy as np
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    return x


# ------------------------------------------------------------------ synthetic data

def _grid(shape_xyz, spacing_xyz):
    """Centred physical coordinates (mm) of the voxel centres, each broadcastable over (x, y, z)."""
    import numpy as np
    out = []
    for ax, (n, s) in enumerate(zip(shape_xyz, spacing_xyz)):
        c = (np.arange(n) + 0.5) * s - n * s / 2.0
        sh = [1, 1, 1]
        sh[ax] = n
        out.append(c.reshape(sh))
    return out


def _ellipsoid(g, centre, radii):
    x, y, z = g
    return (((x - centre[0]) / radii[0]) ** 2 + ((y - centre[1]) / radii[1]) ** 2
            + ((z - centre[2]) / radii[2]) ** 2) <= 1.0


def phantom(kind, shape_xyz, spacing_xyz, rng, border=0, many=False):
    """(list of channel arrays (x, y, z), label (x, y, z) uint8) for a dataset kind."""
    import numpy as np
    g = _grid(shape_xyz, spacing_xyz)
    fov = [n * s for n, s in zip(shape_xyz, spacing_xyz)]
    x, y, z = g
    shape = tuple(shape_xyz)
    lab = np.zeros(shape, np.uint8)

    def jit(r):
        return rng.uniform(-r, r)

    def centres(base, step):
        """One organ centre, or (many) a grid of them across the field of view."""
        if not many:
            return [base]
        out = []
        for cx in np.arange(-fov[0] / 2 + step, fov[0] / 2 - step / 2, step):
            for cy in np.arange(-fov[1] / 2 + step, fov[1] / 2 - step / 2, step):
                for cz in np.arange(-fov[2] / 2 + step, fov[2] / 2 - step / 2, step):
                    out.append((cx + jit(3), cy + jit(3), cz + jit(3)))
        return out

    if kind == "ct":
        body = ((x / (0.42 * fov[0])) ** 2 + (y / (0.36 * fov[1])) ** 2 <= 1.0) & np.ones(shape, bool)
        img = np.where(body, 30.0, -1000.0) + rng.normal(0, 1, shape) * np.where(body, 20.0, 8.0)
        spine = (((x - 0) / 5.0) ** 2 + ((y + 0.22 * fov[1]) / 5.0) ** 2 <= 1.0) & body
        img[spine] = 700 + rng.normal(0, 40, int(spine.sum()))
        for c in centres((0.12 * fov[0] + jit(3), jit(3), jit(6)), 40.0):
            liver = _ellipsoid(g, c, (12, 10, 20)) & body
            tumour = _ellipsoid(g, (c[0] + 3 + jit(2), c[1] + jit(2), c[2] + jit(4)), (5, 5, 5)) & liver
            lab[liver] = 1
            lab[tumour] = 2
        img[lab == 1] = 130 + rng.normal(0, 15, int((lab == 1).sum()))
        img[lab == 2] = 230 + rng.normal(0, 15, int((lab == 2).sum()))
        chans = [np.clip(np.round(img), -1024, 3000).astype(np.int16)]
    elif kind == "mri":
        head = _ellipsoid(g, (0, 0, 0), (0.45 * fov[0], 0.42 * fov[1], 0.45 * fov[2]))
        img = np.where(head, 100.0, 20.0) + rng.normal(0, 1, shape) * np.where(head, 10.0, 4.0)
        img = np.abs(img) + 1.0  # nonzero everywhere: no crop, no mask for the normalization
        for c in centres((jit(5), jit(5), jit(5)), 30.0):
            s = _ellipsoid(g, c, (9, 7, 11)) & head
            lab[s] = 1
        img[lab == 1] = 170 + rng.normal(0, 10, int((lab == 1).sum()))
        chans = [img.astype(np.float32)]
    elif kind == "twochan":
        head = _ellipsoid(g, (0, 0, 0), (0.42 * fov[0], 0.40 * fov[1], 0.40 * fov[2]))
        for c in centres((jit(4), jit(4), jit(4)), 36.0):
            gland = _ellipsoid(g, c, (14, 11, 11)) & head
            zone = _ellipsoid(g, (c[0] + jit(2), c[1] + jit(2), c[2] + jit(2)), (7, 6, 6)) & gland
            lesion = _ellipsoid(g, (c[0] + 7 + jit(1), c[1] + jit(2), c[2] + jit(2)), (3.5, 3.5, 3.5)) & gland
            lab[gland] = 1
            lab[zone] = 2
            lab[lesion] = 3
        t2 = np.select([lab == 3, lab == 2, lab == 1, head], [220.0, 60.0, 150.0, 100.0], 0.0)
        ch1 = np.select([lab == 3, lab == 2, lab == 1, head], [100.0, 400.0, 250.0, 300.0], 0.0)
        t2 = np.where(head, t2 + rng.normal(0, 8, shape), 0.0)
        ch1 = np.where(head, ch1 + rng.normal(0, 15, shape), 0.0)
        chans = [t2.astype(np.float32), ch1.astype(np.float32)]
    elif kind == "regions":
        head = _ellipsoid(g, (0, 0, 0), (0.42 * fov[0], 0.40 * fov[1], 0.42 * fov[2]))
        for c in centres((jit(5), jit(5), jit(5)), 36.0):
            whole = _ellipsoid(g, c, (11, 10, 10)) & head
            core = _ellipsoid(g, (c[0] + jit(1.5), c[1] + jit(1.5), c[2] + jit(1.5)), (6.5, 6, 6)) & whole
            inner = _ellipsoid(g, c, (3.5, 3.5, 3.5))
            lab[whole] = 1
            lab[core] = 3          # enhancing rim ...
            lab[core & inner] = 2  # ... around a non-enhancing core
        flair = np.select([lab == 1, lab == 2, lab == 3, head], [180.0, 140.0, 230.0, 100.0], 0.0)
        t1c = np.select([lab == 1, lab == 2, lab == 3, head], [1.1, 0.6, 2.5, 1.0], 0.0)
        flair = np.where(head, flair + rng.normal(0, 8, shape), 0.0)
        t1c = np.where(head, t1c + rng.normal(0, 0.1, shape), 0.0)
        chans = [flair.astype(np.float32), t1c.astype(np.float32)]
    else:
        raise ValueError(kind)
    if border:
        b = [border, border, max(1, border // 3) if kind == "ct" else border]
        keep = np.zeros(shape, bool)
        keep[b[0]:shape[0] - b[0], b[1]:shape[1] - b[1], b[2]:shape[2] - b[2]] = True
        chans = [np.where(keep, ch, 0).astype(ch.dtype) for ch in chans]
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


# Per kind: training spacing sampler, field of view (mm, x y z), test cases (name, spacing, fov, border).
KINDS = {
    "ct": dict(
        spacing=lambda r: [round(r.uniform(0.6, 0.8), 3)] * 2 + [float(r.choice([2.5, 3.0, 3.5]))],
        fov=[56.0, 50.0, 72.0],
        tests=[("fine", [0.55, 0.55, 2.0], [56.0, 50.0, 72.0], 0),     # finer in-plane and z, still anisotropic
               ("coarse", [1.2, 1.2, 4.5], [60.0, 54.0, 76.0], 0),
               ("isoish", [1.0, 1.0, 1.5], [56.0, 50.0, 60.0], 0),     # separate z chosen from the target
               ("border", [0.75, 0.75, 3.2], [60.0, 54.0, 70.0], 6),   # zero border: crop to the nonzero box
               ("small", [1.0, 1.0, 4.0], [20.0, 20.0, 28.0], 0)]),    # smaller than the patch: padding
    "mri": dict(
        spacing=lambda r: [round(r.uniform(0.9, 1.1), 3) for _ in range(3)],
        fov=[48.0, 48.0, 48.0],
        tests=[("fine", [0.8, 0.8, 0.8], [48.0, 48.0, 48.0], 0),
               ("coarse", [1.5, 1.6, 1.4], [50.0, 50.0, 50.0], 0),
               ("border", [1.1, 1.1, 1.1], [52.0, 52.0, 52.0], 5),
               ("small", [1.4, 1.4, 1.4], [20.0, 20.0, 20.0], 0)]),
    "twochan": dict(
        spacing=lambda r: [round(r.uniform(1.4, 1.6), 3), round(r.uniform(0.75, 0.85), 3),
                           round(r.uniform(0.75, 0.85), 3)],
        fov=[60.0, 48.0, 48.0],
        tests=[("fine", [1.2, 0.7, 0.7], [60.0, 48.0, 48.0], 0),
               ("coarse", [2.2, 1.2, 1.2], [62.0, 50.0, 50.0], 0),
               ("border", [1.5, 0.8, 0.8], [60.0, 48.0, 48.0], 4),
               ("small", [2.0, 1.0, 1.0], [24.0, 18.0, 18.0], 0)]),
    "regions": dict(
        spacing=lambda r: [round(r.uniform(0.95, 1.05), 3) for _ in range(3)],
        fov=[56.0, 56.0, 56.0],
        tests=[("fine", [0.8, 0.8, 0.8], [56.0, 56.0, 56.0], 0),
               ("coarse", [1.6, 1.5, 1.7], [58.0, 58.0, 58.0], 0),
               ("small", [1.4, 1.4, 1.4], [22.0, 22.0, 22.0], 0)]),
}

CHANNELS = {"ct": {"0": "CT"}, "mri": {"0": "T1"}, "twochan": {"0": "T2", "1": "rescale_to_0_1"},
            "regions": {"0": "FLAIR", "1": "noNorm"}}
LABELS = {"ct": {"background": 0, "liver": 1, "tumour": 2}, "mri": {"background": 0, "structure": 1},
          "twochan": {"background": 0, "gland": 1, "zone": 2, "lesion": 3},
          "regions": {"background": 0, "whole": [1, 2, 3], "core": [2, 3], "enhancing": [3]}}


def cmd_data(a):
    import numpy as np
    work = a.work
    spec = json.loads(a.spec)
    manifest = {"datasets": {}, "large": None}
    for ds_id, (name, kind, n) in sorted(((int(k), v) for k, v in spec.items())):
        rng = np.random.RandomState(ds_id)
        k = KINDS[kind]
        raw = os.path.join(work, "nnUNet_raw", name)
        for sub in ("imagesTr", "labelsTr"):
            os.makedirs(os.path.join(raw, sub), exist_ok=True)
        prefix = name.split("_", 1)[1].lower()
        cases = []
        for i in range(n):
            sp = k["spacing"](rng)
            fov = [f * rng.uniform(0.95, 1.05) for f in k["fov"]]
            shape = [max(8, int(round(f / s))) for f, s in zip(fov, sp)]
            chans, lab = phantom(kind, shape, sp, rng)
            cid = f"{prefix}_{i:03d}"
            for c, ch in enumerate(chans):
                _save(ch, sp, os.path.join(raw, "imagesTr", f"{cid}_{c:04d}.nii.gz"))
            _save(lab, sp, os.path.join(raw, "labelsTr", f"{cid}.nii.gz"))
            cases.append({"id": cid, "spacing_xyz": sp, "shape_xyz": shape,
                          "labels_present": sorted(int(v) for v in np.unique(lab))})
        dj = {"channel_names": CHANNELS[kind], "labels": LABELS[kind], "numTraining": n,
              "file_ending": ".nii.gz", "name": name}
        if kind == "regions":
            dj["regions_class_order"] = [1, 2, 3]
        _dump(dj, os.path.join(raw, "dataset.json"))
        tdir = os.path.join(work, "inputs", name)
        os.makedirs(tdir, exist_ok=True)
        tests = []
        for tname, sp, fov, border in k["tests"]:
            shape = [max(6, int(round(f / s))) for f, s in zip(fov, sp)]
            chans, lab = phantom(kind, shape, sp, rng, border=border)
            cid = f"{prefix}_{tname}"
            for c, ch in enumerate(chans):
                _save(ch, sp, os.path.join(tdir, f"{cid}_{c:04d}.nii.gz"))
            os.makedirs(os.path.join(work, "inputs", "labels", name), exist_ok=True)
            _save(lab, sp, os.path.join(work, "inputs", "labels", name, f"{cid}.nii.gz"))
            tests.append({"id": cid, "spacing_xyz": sp, "shape_xyz": shape, "zero_border": border})
        manifest["datasets"][name] = {"id": ds_id, "kind": kind, "training": cases, "tests": tests,
                                      "inputs": tdir}
        print(f"{name}: {n} training cases, {len(tests)} test cases")
    # The large input: CT-like at a finer spacing, organs tiled across the body.
    rng = np.random.RandomState(7)
    shape, sp = [int(v) for v in a.large_shape], [float(v) for v in a.large_spacing]
    ldir = os.path.join(work, "inputs", "large")
    os.makedirs(ldir, exist_ok=True)
    chans, lab = phantom("ct", shape, sp, rng, many=True)
    _save(chans[0], sp, os.path.join(ldir, "large_0000.nii.gz"))
    manifest["large"] = {"dir": ldir, "id": "large", "shape_xyz": shape, "spacing_xyz": sp, "dataset": 901}
    print(f"large input: {'x'.join(map(str, shape))} at {sp} mm")
    _dump(manifest, os.path.join(work, "inputs", "manifest.json"))


# ------------------------------------------------------------------ planning

def _cap_configuration(cfg, planner, cap, batch_cap):
    """cfg with its patch capped at `cap` (nnU-Net's axes) and the topology the planner derives from it."""
    from nnunetv2.experiment_planning.experiment_planners.network_topology import get_pool_and_conv_props
    patch = [min(int(p), int(c)) for p, c in zip(cfg["patch_size"], cap)]
    if patch == list(cfg["patch_size"]) and cfg["batch_size"] <= batch_cap:
        return cfg, False
    _, strides, kernels, padded, _ = get_pool_and_conv_props(
        cfg["spacing"], patch, planner.UNet_featuremap_min_edge_length, 999999)
    n = len(strides)
    out = deepcopy(cfg)
    out["patch_size"] = [int(x) for x in padded]
    out["batch_size"] = int(min(cfg["batch_size"], batch_cap))
    ak = out["architecture"]["arch_kwargs"]
    maxf = planner.UNet_max_features_2d if len(patch) == 2 else planner.UNet_max_features_3d
    ak["n_stages"] = n
    ak["features_per_stage"] = [min(maxf, planner.UNet_base_num_features * 2 ** i) for i in range(n)]
    ak["strides"] = [[int(v) for v in s] for s in strides]
    ak["kernel_sizes"] = [[int(v) for v in k] for k in kernels]
    if "n_conv_per_stage" in ak:
        ak["n_conv_per_stage"] = list(planner.UNet_blocks_per_stage_encoder[:n])
    if "n_blocks_per_stage" in ak:
        ak["n_blocks_per_stage"] = list(planner.UNet_blocks_per_stage_encoder[:n])
    ak["n_conv_per_stage_decoder"] = list(planner.UNet_blocks_per_stage_decoder[:n - 1])
    return out, True


def cmd_plan(a):
    import nnunetv2
    from batchgenerators.utilities.file_and_folder_operations import join
    from nnunetv2.experiment_planning.plan_and_preprocess_api import extract_fingerprints, plan_experiments, \
        preprocess
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name
    from nnunetv2.utilities.find_class_by_name import recursive_find_python_class

    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    plans_file = os.path.join(pre, a.plans + ".json")
    t = time.time()
    if not os.path.isfile(os.path.join(pre, "dataset_fingerprint.json")):
        extract_fingerprints([a.dataset_id], num_processes=1, check_dataset_integrity=True)
    if not os.path.isfile(plans_file):
        plan_experiments([a.dataset_id], experiment_planner_class_name=a.planner)
    planner_cls = recursive_find_python_class(join(nnunetv2.__path__[0], "experiment_planning"), a.planner,
                                              current_module="nnunetv2.experiment_planning")
    planner = planner_cls(a.dataset_id)
    with open(plans_file) as f:
        plans = json.load(f)
    changed = {}
    caps = {"3d_fullres": (a.patch3d, a.batch3d), "2d": (a.patch2d, a.batch2d)}
    for cname in a.configs:
        cap, bcap = caps[cname]
        if cap is None:
            continue
        planned = plans["configurations"][cname]
        if "planned_patch_size" in planned:  # capped already (a rerun)
            continue
        new, did = _cap_configuration(planned, planner, cap, bcap)
        if did:
            new["planned_patch_size"] = list(planned["patch_size"])
            new["planned_batch_size"] = int(planned["batch_size"])
            plans["configurations"][cname] = new
            changed[cname] = {"from": [planned["patch_size"], planned["batch_size"]],
                              "to": [new["patch_size"], new["batch_size"]]}
    with open(plans_file, "w") as f:
        json.dump(plans, f, indent=4, sort_keys=False)
    for cname in a.configs:
        ident = plans["configurations"][cname]["data_identifier"]
        # one marker per data identifier: ResEnc plans reuse nnUNetPlans' 3d_fullres data (same spacing)
        marker = os.path.join(pre, f".import_check_preprocessed_{ident}")
        if not os.path.isfile(marker):
            preprocess([a.dataset_id], plans_identifier=a.plans, configurations=[cname], num_processes=[1])
            open(marker, "w").close()
    out = {"dataset": name, "plans_file": plans_file, "capped": changed, "wall_s": time.time() - t,
           "transpose_forward": plans["transpose_forward"], "configurations": {}}
    for cname in a.configs:
        c = plans["configurations"][cname]
        out["configurations"][cname] = {
            "patch_size": c["patch_size"], "batch_size": c["batch_size"], "spacing": c["spacing"],
            "normalization_schemes": c["normalization_schemes"], "use_mask_for_norm": c["use_mask_for_norm"],
            "network_class_name": c["architecture"]["network_class_name"],
            "n_stages": c["architecture"]["arch_kwargs"]["n_stages"]}
    _dump(out, a.out)


# ------------------------------------------------------------------ training

def cmd_train(a):
    import numpy as np
    import torch
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer as StockTrainer
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    times = []

    class ShortTrainer(StockTrainer):
        """nnU-Net's trainer with fewer epochs and iterations; everything else is the stock trainer's."""

        def __init__(self, plans, configuration, fold, dataset_json, device=torch.device("cpu")):
            super().__init__(plans, configuration, fold, dataset_json, device)
            self.num_epochs = a.epochs
            self.num_iterations_per_epoch = a.iters_per_epoch
            self.num_val_iterations_per_epoch = a.val_iters

        def on_train_epoch_start(self):
            super().on_train_epoch_start()
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, train_outputs):
            times.append(time.perf_counter() - self._t0)
            super().on_train_epoch_end(train_outputs)

    # Recorded (results folder, checkpoint's trainer_name) as nnU-Net's stock trainer, so that
    # nnUNetv2_predict -tr nnUNetTrainer finds a class it knows; the network it builds is the same.
    ShortTrainer.__name__ = ShortTrainer.__qualname__ = "nnUNetTrainer"

    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    with open(os.path.join(pre, a.plans + ".json")) as f:
        plans = json.load(f)
    plans["continue_training"] = False
    with open(os.path.join(pre, "dataset.json")) as f:
        dataset_json = json.load(f)
    trainer = ShortTrainer(plans, a.config, a.fold, dataset_json, torch.device("cpu"))
    t0, c0 = time.time(), time.process_time()
    trainer.run_training()
    t1, c1 = time.time(), time.process_time()
    if a.validate:
        trainer.perform_actual_validation(False)
    _dump({"output_folder": trainer.output_folder, "epochs": a.epochs, "iters_per_epoch": a.iters_per_epoch,
           "iterations": a.epochs * a.iters_per_epoch, "train_wall_s": t1 - t0, "train_cpu_s": c1 - c0,
           "epoch_train_s": times, "patch_size": [int(x) for x in trainer.configuration_manager.patch_size],
           "batch_size": int(trainer.batch_size),
           "inference_allowed_mirroring_axes": list(trainer.inference_allowed_mirroring_axes or [])}, a.out)


# ------------------------------------------------------------------ nnU-Net's stages, reference check

def _case_files(folder, ending):
    by = {}
    for f in sorted(glob.glob(os.path.join(folder, "*" + ending))):
        base = os.path.basename(f)[:-len(ending)]
        by.setdefault(base[:-5], []).append(f)
    return by


def _load_reference(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("nnunet_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cmd_stages(a):
    import numpy as np
    import torch
    from acvl_utils.cropping_and_padding.padding import pad_nd_image
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.inference.sliding_window_prediction import compute_gaussian

    torch.set_num_threads(1)
    ref = _load_reference(a.reference)
    folds = [int(f) for f in a.folds.split(",")]
    pred = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=True,
                           perform_everything_on_device=False, device=torch.device("cpu"), verbose=False,
                           allow_tqdm=False)
    pred.initialize_from_trained_model_folder(a.model, folds, a.checkpoint)
    pm, cm, dj = pred.plans_manager, pred.configuration_manager, pred.dataset_json
    prep = cm.preprocessor_class(verbose=False)
    patch = [int(p) for p in cm.patch_size]
    gauss = compute_gaussian(tuple(patch), sigma_scale=1. / 8, value_scaling_factor=10,
                             device=torch.device("cpu")).numpy()
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "gaussian.npy"), gauss)
    ref_gauss = ref.gaussian_importance_map(patch)
    with open(os.path.join(a.model, "plans.json")) as f:
        plans = json.load(f)
    config_name = os.path.basename(os.path.normpath(a.model)).split("__")[2]
    report = {"model": a.model, "patch_size": patch, "gaussian_dtype": str(gauss.dtype),
              "gaussian_equal": bool(ref_gauss.dtype == gauss.dtype and np.array_equal(ref_gauss, gauss)),
              "gaussian_max_abs_diff": float(np.max(np.abs(ref_gauss.astype(np.float64) - gauss.astype(np.float64)))),
              "inference_allowed_mirroring_axes": list(pred.allowed_mirroring_axes or []),
              "cases": {}}
    for cid, files in sorted(_case_files(a.inputs, dj["file_ending"]).items()):
        t = time.time()
        data, _seg, props = prep.run_case(files, None, pm, cm, dj)
        run_case_s = time.time() - t
        cdir = os.path.join(a.out, cid)
        os.makedirs(cdir, exist_ok=True)
        np.save(os.path.join(cdir, "preprocessed.npy"), data.astype(np.float32, copy=False))
        x = torch.from_numpy(data).to(dtype=torch.float32)
        padded, revert = pad_nd_image(x, cm.patch_size, "constant", {"value": 0}, True, None)
        slicers = pred._internal_get_sliding_window_slicers(padded.shape[1:])
        starts = []
        for sl in slicers:
            starts.append([s if isinstance(s, int) else s.start for s in sl[1:]])
        p = {k: _jsonable(props[k]) for k in ("shape_before_cropping", "bbox_used_for_cropping",
                                                "shape_after_cropping_and_before_resampling", "spacing")}
        p["preprocessed_shape"] = list(data.shape[1:])
        p["padded_shape"] = list(padded.shape[1:])
        p["pad_below"] = [int(s.start) for s in revert[1:]]
        _dump(p, os.path.join(cdir, "properties.json"))
        _dump({"patch_size": patch, "window_starts": starts}, os.path.join(cdir, "windows.json"))
        if a.dump_logits:
            logits = pred.predict_logits_from_preprocessed_data(x).cpu().numpy()
            np.save(os.path.join(cdir, "logits.npy"), logits)
        # the torch-free reference on the same files
        t = time.time()
        rpre, rst = ref.stages(files, plans, dj, config_name)
        ref_s = time.time() - t
        same_shape = list(rpre.shape) == list(data.shape)
        if same_shape:
            diff = float(np.max(np.abs(rpre.astype(np.float64) - data.astype(np.float64)))) if data.size else 0.0
        else:
            diff = None
        scale = float(np.max(np.abs(data))) if data.size else 0.0
        report["cases"][cid] = {
            "shape_before_cropping": p["shape_before_cropping"],
            "bbox": p["bbox_used_for_cropping"],
            "shape_after_cropping": p["shape_after_cropping_and_before_resampling"],
            "preprocessed_shape": p["preprocessed_shape"], "padded_shape": p["padded_shape"],
            "n_windows": len(starts), "separate_z": rst["separate_z"], "lowres_axis": rst["lowres_axis"],
            "reference_shape_equal": same_shape, "reference_max_abs_diff": diff, "max_abs": scale,
            "reference_bitwise_equal": bool(same_shape and np.array_equal(rpre, data.astype(np.float32))),
            "reference_windows_equal": rst["window_starts"] == starts,
            "reference_meta_equal": (rst["bbox"] == p["bbox_used_for_cropping"]
                                     and rst["shape_before_cropping"] == list(p["shape_before_cropping"])
                                     and rst["shape_after_cropping"]
                                     == list(p["shape_after_cropping_and_before_resampling"])),
            "nnunet_run_case_s": run_case_s, "reference_s": ref_s,
        }
        print(f"{cid}: preprocessed {list(data.shape)}, {len(starts)} windows; reference max |diff| "
              f"{diff} (max |x| {scale:.3g}), windows equal {rst['window_starts'] == starts}")
    _dump(report, os.path.join(a.out, "reference_check.json"))


def cmd_unit_checks(a):
    """nnU-Net's normalization classes and resampling function against the reference, random data."""
    import numpy as np
    from nnunetv2.preprocessing.normalization import default_normalization_schemes as ns
    from nnunetv2.preprocessing.resampling.default_resampling import resample_data_or_seg_to_shape, \
        compute_new_shape
    from nnunetv2.inference.sliding_window_prediction import compute_steps_for_sliding_window
    ref = _load_reference(a.reference)
    rng = np.random.RandomState(0)
    out = {"normalization": {}, "resampling": [], "steps": {}}
    props = {"mean": 57.3, "std": 41.9, "percentile_00_5": -80.2, "percentile_99_5": 260.7}
    for scheme in ("ZScoreNormalization", "CTNormalization", "NoNormalization", "RescaleTo01Normalization",
                   "RGBTo01Normalization"):
        for use_mask in (False, True):
            img = rng.uniform(0, 255, (13, 17, 19)).astype(np.float32)
            img[:2] = 0
            mask = img != 0
            cls = getattr(ns, scheme)
            mine = ref.normalize_channel(img.copy(), scheme, use_mask, props, mask)
            theirs = cls(use_mask_for_norm=use_mask, intensityproperties=props).run(
                img.copy(), np.where(mask, 0, -1).astype(np.int8))
            out["normalization"][f"{scheme}{'+mask' if use_mask else ''}"] = {
                "bitwise_equal": bool(np.array_equal(mine, theirs)),
                "max_abs_diff": float(np.max(np.abs(mine.astype(np.float64) - theirs)))}
    cases = [([1, 20, 30, 30], [3.0, 0.7, 0.7], [1.5, 0.9, 0.9]),   # separate z from the input, axis 0
             ([1, 12, 25, 40], [1.0, 1.0, 1.0], [3.5, 1.0, 1.0]),   # separate z from the target
             ([2, 30, 14, 22], [0.8, 4.0, 0.8], [1.0, 3.0, 1.0]),   # low-res axis 1
             ([1, 17, 23, 9], [1.0, 1.0, 3.5], [0.9, 0.9, 2.1]),    # low-res axis 2
             ([1, 15, 15, 15], [3.0, 3.0, 0.7], [2.0, 2.0, 0.7]),   # two axes share the max: 3D
             ([1, 21, 19, 17], [1.0, 1.2, 0.8], [0.7, 0.7, 0.7]),   # 3D, upsampling
             ([1, 40, 33, 29], [1.0, 1.0, 1.0], [1.6, 1.3, 1.9])]   # 3D, downsampling
    for shape, cur, new in cases:
        data = rng.normal(0, 1, shape).astype(np.float32)
        ns_ = compute_new_shape(shape[1:], cur, new)
        theirs = resample_data_or_seg_to_shape(data, ns_, cur, new, False, 3, 0, None)
        mine = ref.resample_to_shape(data, ref.compute_new_shape(shape[1:], cur, new), cur, new, 3, 0, None)
        out["resampling"].append({"shape": shape, "current": cur, "new": new, "new_shape": [int(x) for x in ns_],
                                  "shape_equal": list(mine.shape) == list(theirs.shape),
                                  "separate_z": list(ref.separate_z_rule(cur, new)),
                                  "bitwise_equal": bool(mine.shape == theirs.shape and np.array_equal(mine, theirs)),
                                  "max_abs_diff": float(np.max(np.abs(mine.astype(np.float64) - theirs)))
                                  if mine.shape == theirs.shape else None})
    bad = 0
    for _ in range(3000):
        tile = [int(rng.randint(4, 130)) for _ in range(3)]
        size = [t + int(rng.randint(0, 400)) for t in tile]
        if compute_steps_for_sliding_window(size, tile, 0.5) != ref.sliding_window_steps(size, tile, 0.5):
            bad += 1
    out["steps"] = {"random_cases": 3000, "different": bad}
    gauss_bad = []
    from nnunetv2.inference.sliding_window_prediction import compute_gaussian
    import torch
    for patch in ([24, 24, 24], [12, 32, 32], [16, 24, 24], [64, 64], [20, 64, 64], [7, 9, 11], [128, 128, 128]):
        g = compute_gaussian(tuple(patch), 1. / 8, 10, device=torch.device("cpu")).numpy()
        r = ref.gaussian_importance_map(patch)
        if not np.array_equal(g, r):
            gauss_bad.append(patch)
        compute_gaussian.cache_clear()
    out["gaussian_patches_different"] = gauss_bad
    _dump(out, a.out)
    print(json.dumps(out, indent=1))


def cmd_verify_ref(a):
    """nnUNetv2_predict's outputs: .npz shape, axis order, and the segmentation from the probabilities."""
    import numpy as np
    import nibabel as nib
    with open(a.dataset_json) as f:
        dj = json.load(f)
    regions = any(isinstance(v, list) and len(v) > 1 for v in dj["labels"].values())
    order = dj.get("regions_class_order")
    out = {}
    for seg_path in sorted(glob.glob(os.path.join(a.pred, "*" + dj["file_ending"]))):
        cid = os.path.basename(seg_path)[:-len(dj["file_ending"])]
        seg = np.asanyarray(nib.load(seg_path).dataobj).transpose(2, 1, 0)  # SimpleITK's (z, y, x)
        img0 = nib.load(os.path.join(a.inputs, cid + "_0000" + dj["file_ending"]))
        probs = np.load(os.path.join(a.pred, cid + ".npz"))["probabilities"]
        if regions:
            from_probs = np.zeros(probs.shape[1:], np.uint8)
            for i, c in enumerate(order):
                from_probs[probs[i] > 0.5] = c
        else:
            from_probs = probs.argmax(0)
        out[cid] = {"seg_shape_zyx": list(seg.shape), "input_shape_xyz": list(img0.shape),
                    "npz_shape": list(probs.shape), "npz_dtype": str(probs.dtype),
                    "npz_is_c_z_y_x_of_input": list(probs.shape[1:]) == list(img0.shape)[::-1],
                    "seg_equals_probabilities_decision": bool(np.array_equal(from_probs, seg)),
                    "classes_present": sorted(int(v) for v in np.unique(seg))}
    _dump(out, a.out)


# ------------------------------------------------------------------ scoring

def _margin(probs, regions):
    import numpy as np
    if regions:
        return 2 * np.min(np.abs(probs - 0.5), axis=0)
    s = np.sort(probs, axis=0)
    return s[-1] - s[-2]


def _read_zarr_probabilities(path):
    import zarr
    node = zarr.open(path, mode="r")
    if hasattr(node, "shape"):
        return node[...], ""
    arrays = list(node.arrays())
    named = [a for n, a in arrays if n in ("probabilities", "0")]
    arr = named[0] if named else arrays[0][1]
    return arr[...], arr.name


def cmd_score(a):
    import numpy as np
    import nibabel as nib
    with open(a.dataset_json) as f:
        dj = json.load(f)
    labels = {k: v for k, v in dj["labels"].items() if k != "ignore"}
    regions = any(isinstance(v, list) and len(v) > 1 for v in labels.values())
    try:
        import zarr  # noqa: F401
        have_zarr = True
    except ImportError:
        have_zarr = False
    out = {"zarr_available": have_zarr, "cases": {}}
    for seg_path in sorted(glob.glob(os.path.join(a.ref, "*" + dj["file_ending"]))):
        cid = os.path.basename(seg_path)[:-len(dj["file_ending"])]
        ours_path = os.path.join(a.ours, cid + dj["file_ending"])
        r = {}
        if not os.path.isfile(ours_path):
            out["cases"][cid] = {"error": f"{ours_path} missing"}
            continue
        ref = np.asanyarray(nib.load(seg_path).dataobj).transpose(2, 1, 0)
        ours_img = nib.load(ours_path)
        ours = np.asanyarray(ours_img.dataobj).transpose(2, 1, 0)
        if ours.shape != ref.shape:
            out["cases"][cid] = {"error": f"shape {list(ours.shape)} (z,y,x) != nnU-Net's {list(ref.shape)}"}
            continue
        aff_ok = bool(np.allclose(ours_img.affine, nib.load(seg_path).affine, atol=1e-4))
        eq = ours == ref
        r["voxels"] = int(ref.size)
        r["equal_pct"] = 100.0 * float(eq.mean())
        r["affine_equal"] = aff_ok
        dice = {}
        for name, v in labels.items():
            if name == "background":
                continue
            vals = v if isinstance(v, list) else [v]
            a_ = np.isin(ours, vals)
            b_ = np.isin(ref, vals)
            den = int(a_.sum()) + int(b_.sum())
            dice[name] = 1.0 if den == 0 else 2.0 * int((a_ & b_).sum()) / den
        r["dice"] = dice
        r["min_dice"] = min(dice.values()) if dice else 1.0
        probs = np.load(os.path.join(a.ref, cid + ".npz"))["probabilities"]
        r["nnunet_npz_shape"] = list(probs.shape)
        n_bad = int((~eq).sum())
        r["disagreeing"] = n_bad
        if n_bad:
            m = _margin(probs[:, ~eq], regions)
            r["max_margin"] = float(m.max())
            r["margin_quantiles"] = [float(q) for q in np.quantile(m, [0.5, 0.9, 0.99])]
        else:
            r["max_margin"] = None
        zpath = os.path.join(a.ours, cid + ".probabilities.zarr")
        if have_zarr and os.path.isdir(zpath):
            try:
                zp, zname = _read_zarr_probabilities(zpath)
                r["ours_probabilities_shape"] = list(zp.shape)
                r["ours_probabilities_array"] = zname
                if list(zp.shape) == list(probs.shape):
                    d = np.abs(zp.astype(np.float64) - probs)
                    r["probabilities_max_abs_diff"] = float(d.max())
                    r["probabilities_mean_abs_diff"] = float(d.mean())
                else:
                    r["probabilities_error"] = f"shape {list(zp.shape)} != nnU-Net's {list(probs.shape)}"
            except Exception as e:  # report, do not fail the segmentation comparison
                r["probabilities_error"] = f"{type(e).__name__}: {e}"
        elif not os.path.isdir(zpath):
            r["probabilities_error"] = "not written"
        out["cases"][cid] = r
    _dump(out, a.out)


def cmd_stagecmp(a):
    """Our STAGES output folder against nnU-Net's dumps of one case."""
    import numpy as np
    ours = np.load(os.path.join(a.ours, "preprocessed.npy"))
    theirs = np.load(os.path.join(a.ref, "preprocessed.npy"))
    with open(os.path.join(a.ours, "stages.json")) as f:
        st = json.load(f)
    with open(os.path.join(a.ref, "properties.json")) as f:
        p = json.load(f)
    with open(os.path.join(a.ref, "windows.json")) as f:
        w = json.load(f)
    r = {"shape_equal": list(ours.shape) == list(theirs.shape), "ours_shape": list(ours.shape),
         "nnunet_shape": list(theirs.shape), "ours_dtype": str(ours.dtype)}
    scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
    if r["shape_equal"]:
        d = float(np.max(np.abs(ours.astype(np.float64) - theirs))) if theirs.size else 0.0
        r["max_abs_diff"] = d
        r["rel_diff"] = d / scale if scale else d
    r["window_starts_equal"] = [list(x) for x in st.get("window_starts", [])] == w["window_starts"]
    r["n_windows"] = [len(st.get("window_starts", [])), len(w["window_starts"])]
    r["bbox_equal"] = st.get("bbox") == p["bbox_used_for_cropping"]
    r["shape_before_cropping_equal"] = st.get("shape_before_cropping") == p["shape_before_cropping"]
    r["shape_after_cropping_equal"] = st.get("shape_after_cropping") == p["shape_after_cropping_and_before_resampling"]
    r["preprocessed_shape_equal"] = st.get("preprocessed_shape") == p["preprocessed_shape"]
    _dump(r, a.out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("data")
    p.add_argument("--work", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--large-shape", nargs=3, type=int, required=True)
    p.add_argument("--large-spacing", nargs=3, type=float, required=True)
    p = sub.add_parser("plan")
    p.add_argument("--dataset-id", type=int, required=True)
    p.add_argument("--plans", required=True)
    p.add_argument("--planner", required=True)
    p.add_argument("--configs", nargs="+", required=True)
    p.add_argument("--patch3d", type=int, nargs="+")
    p.add_argument("--batch3d", type=int, default=2)
    p.add_argument("--patch2d", type=int, nargs="+")
    p.add_argument("--batch2d", type=int, default=8)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train")
    p.add_argument("--dataset-id", type=int, required=True)
    p.add_argument("--plans", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--fold", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--iters-per-epoch", type=int, required=True)
    p.add_argument("--val-iters", type=int, required=True)
    p.add_argument("--validate", action="store_true")
    p.add_argument("--out", required=True)
    p = sub.add_parser("stages")
    p.add_argument("--model", required=True)
    p.add_argument("--folds", required=True)
    p.add_argument("--checkpoint", default="checkpoint_final.pth")
    p.add_argument("--inputs", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--dump-logits", action="store_true")
    p.add_argument("--out", required=True)
    p = sub.add_parser("unit-checks")
    p.add_argument("--reference", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("verify-ref")
    p.add_argument("--pred", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--dataset-json", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("score")
    p.add_argument("--ref", required=True)
    p.add_argument("--ours", required=True)
    p.add_argument("--dataset-json", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("stagecmp")
    p.add_argument("--ours", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"data": cmd_data, "plan": cmd_plan, "train": cmd_train, "stages": cmd_stages,
     "unit-checks": cmd_unit_checks, "verify-ref": cmd_verify_ref, "score": cmd_score,
     "stagecmp": cmd_stagecmp}[a.cmd](a)


if __name__ == "__main__":
    main()
