#!/usr/bin/env python3
"""Segmentation quality and training speed of nnU-Net v2 and voxcache: same data, same fold, same plan.

What it measures
----------------
Both tools train a 3D U-Net on fold 0 of nnU-Net's 5-fold cross-validation of one dataset (default:
`prep synth --preset small`, the bundled vessel dataset's generator: 10 cases, 1 MB) with the same
patch, batch size and network topology (nnU-Net's planner rules applied to that patch), for the same
number of iterations (optimizer steps), once per seed. Then each tool predicts fold 0's validation
cases its own way, and ONE metric code scores both: voxcache's `evaluate` (Dice and clDice of the
foreground classes, per case, averaged over the validation cases). nnU-Net's own summary.json Dice is
reported beside it as a cross-check of the metric. Speed: median seconds per training iteration,
validation and start-up excluded, from each tool's own records; per tool, the median of its quiet
runs (other processes kept at most 0.25 cores busy). The script prints a markdown table
(tool, seed, Dice, clDice, s/iteration), mean +- std and min-max per tool, whether voxcache's mean is
at or above nnU-Net's mean (else within nnU-Net's seed range, else below), and writes every figure to
a JSON file (`--json-out`, default WORK/results.json).

Reproduce
---------
From the repository root, after `cargo build --release` (nnU-Net v2 2.8.x with torch in its own venv):

    # the figures in docs/benchmarks.md (70 min on 2 free cores):
    python3 scripts/quality_match.py --nnunet-python /work/bench/nnenv/bin/python \
        --work /work/bench/qm/full --iterations 600 --seeds 0,1,2 --patch 16 48 48 --batch 2

    # the default plan, 1000 iterations: about 4.5 h on 2 cores
    python3 scripts/quality_match.py --nnunet-python /work/bench/nnenv/bin/python \
        --work /work/bench/qm/big --iterations 1000 --seeds 0,1,2

    # end-to-end check, both sides, one seed (about 4 minutes on 2 cores, planning included):
    python3 scripts/quality_match.py --nnunet-python /work/bench/nnenv/bin/python \
        --work /tmp/qm-tiny --iterations 10 --seeds 0

`--skip-nnunet` / `--skip-ours` rerun one side only (the other side's figures are read back from
WORK/results/ when a run with the same iterations and plan left them). Planning always runs nnU-Net's
planner (a few seconds once preprocessed): the plan and fold 0 come from it. One work folder per
dataset: the nnU-Net dataset, its plans, the cache and the runs live there. Nothing runs
concurrently: nnU-Net, then voxcache, one process tree at a time. This script uses only Python's
standard library; nnU-Net runs in child processes of `--nnunet-python`, through a small driver the
script writes to WORK/nnunet_qm_driver.py.

What each side runs
-------------------
Data: `prep synth --preset small --out WORK/data` (or `--data DIR`, any nnU-Net layout folder). It is
registered for nnU-Net as WORK/nnUNet_raw/Dataset<ID>_QualityMatch (`--dataset-id`, default 777) with
per-file symlinks and a copy of dataset.json (fields nnU-Net needs are added when missing:
`channel_names` from a Decathlon `modality`, `labels` name -> value, `file_ending`, `numTraining`).

Plan: nnU-Net's Python API extracts the fingerprint, plans (ExperimentPlanner, nnUNetPlans) and
preprocesses 3d_fullres (one process each); its splits_final.json is made with nnU-Net's own
`generate_crossval_split` (sorted ids, KFold(5, shuffle, 12345)) as its trainer would make it.
Then a configuration `3d_fullres_qm` is added to nnUNetPlans.json: 3d_fullres with `--patch` and
`--batch`, and the topology nnU-Net's planner derives from a patch (`get_pool_and_conv_props` with
the planner's minimum feature-map edge 4; features 32 doubling up to 320; 2 conv blocks per encoder
and decoder stage); a patch that is not a multiple of the strides is padded up by that function and
the padded patch is what both tools use. `prep plan DATA` writes voxcache's plan (the same planner:
the script reports whether its 3d_fullres equals nnU-Net's own), and WORK/plan/plan.toml is that file
with [configurations.3d_fullres] holding the same patch, batch, strides, kernels, features and blocks.
The script prints both plans side by side (z, y, x) and stops if they differ in any of spacing, patch,
batch, strides, kernels, features, encoder or decoder blocks.

nnU-Net side (per seed, nnUNet_results = WORK/nnunet/seed<S>): `nnUNetTrainer_QM`, a subclass of
nnUNetTrainer defined in the driver and run through the Python API (no file is written into the
nnU-Net installation). It changes only: epochs x iterations per epoch = `--iterations`
(`--iters-per-epoch`, default 50: 1000 iterations = 20 epochs of 50; the poly learning rate steps per
epoch as in nnU-Net), `--nnunet-val-iters` pseudo-Dice iterations per epoch (default 5 instead of 50;
they only feed the log and checkpoint_best), the seed (random, numpy, torch, and the data-augmentation
worker processes, which nnU-Net leaves unseeded), the CPU device, and a log line per epoch with the
time of the training iterations alone. Everything else is nnU-Net's default: SGD Nesterov lr 0.01
momentum 0.99 with poly decay, Dice + CE with deep supervision, its augmentation and foreground
oversampling 0.33. Then nnU-Net's own final validation (checkpoint_final, sliding window with
Gaussian weighting, step 0.5, mirroring) writes fold_0/validation/*.nii.gz and summary.json.
Environment: nnUNet_n_proc_DA = `--nnunet-da-procs` (default 1: one background augmentation process
for training, one for its validation batches; 0 runs augmentation in the main process),
nnUNet_def_n_proc = 1 (export and metrics), torch threads and OMP_NUM_THREADS = `--threads`
(default: all cores), nnUNet_compile off (nnU-Net turns it off on the CPU anyway).

voxcache side (per seed, WORK/ours/seed<S>): `prep build-cache DATA --pipeline plan.toml`, then
`train --pipeline plan.toml --fold 0 --splits splits_final.json --steps N --seed S --val-every 0
--log-every 1` with its own defaults for the rest (AdamW lr 0.003 with poly decay, Dice + CE with deep
supervision, nnU-Net's augmentation; `--ours-train-args "..."` adds flags, e.g. "--optimizer sgd
--lr 0.01"), `predict --checkpoint latest --mirror` on the validation cases' images (the last
checkpoint, as nnU-Net validates checkpoint_final, and 8-flip mirroring, as nnU-Net's validation
does), and `evaluate` against labelsTr. The run's run.json is checked against the agreed plan and
fold. What still differs by design (voxcache's defaults): AdamW instead of SGD; soft Dice over the
whole batch (nnU-Net's 3d_fullres here: per sample, batch_dice false); deep-supervision targets
max-pooled rather than subsampled, and no head at the lowest decoder resolution (nnU-Net builds one
and weights it 0: its network has that head's parameters more, which the script checks).

Scoring: `evaluate PRED DATA/labelsTr --json` on both tools' predictions. nnU-Net reads and writes
images through SimpleITK, which converts a micrometre header to millimetres: its predictions lie on
the reference grid but say "mm" where the references say "um", and `evaluate` refuses mixed units.
Their headers are therefore replaced by the reference's own header (the voxels untouched, after
checking that shape and affine agree up to the unit factor) into fold_0/validation_refheader/ before
scoring. Timing: nnU-Net from the per-epoch "qm: N training iterations in X s" lines the trainer
subclass writes into nnU-Net's training log (nnU-Net's own "Epoch time" includes the pseudo-Dice
validation and the progress plot), voxcache from metrics.jsonl (`elapsed_s` between consecutive
per-step records); medians.

Checkpoints are deleted after a seed is scored (disk; `--keep-checkpoints` keeps them).

How long
--------
Measured on this project's 2-core machine (AMD EPYC, no GPU, 23 GiB) at the default plan (patch
20x64x64, batch 2, 5 stages, features 32..320, about 16.1 M parameters), in the minutes when no other
process was running (`other processes' cores busy` near 0; the table reports it per run, as the
average number of cores other processes kept busy while a tool trained):

    nnU-Net 2.8.1 (torch, CPU)  1.8 s/iteration  (median of 6 free epochs of 5 iterations in 3 runs: 1.72-1.82)
    voxcache train              3.2 s/iteration  (median of 19 free steps in 2 runs: 2.7-4.1)

Per seed, beyond the iterations: nnU-Net ~2.5 s a epoch for its 5 pseudo-Dice batches and progress
plot, ~15 s start-up, ~45 s final validation of the 2 cases with mirroring; voxcache ~5 s final
validation, ~45 s `predict --mirror` of the 2 cases; scoring ~1 s each. Planning and preprocessing
~30 s once. A full run (1000 iterations x 3 seeds x 2 tools) is therefore about
3 x (1000 x 1.8 s + ~2 min) + 3 x (1000 x 3.2 s + ~1 min) = ~1.6 h + ~2.7 h, about 4.5 h on two
free cores. With one core taken by another job (as during most of the test runs), both tools ran at
4-5 s/iteration: about 7-8 h. The tiny runs: `--iterations 10 --seeds 0` 4 minutes from an empty
work folder; `--iterations 20 --iters-per-epoch 5 --seeds 0` 6.5 minutes (shared machine).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import resource
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import time
import tomllib
from pathlib import Path

CONFIG_QM = "3d_fullres_qm"
PLANS = "nnUNetPlans"

# --------------------------------------------------------------------------------------------
# The nnU-Net driver: written to WORK/nnunet_qm_driver.py and run with --nnunet-python. It uses
# nnU-Net's Python API only (no copy of its code). Module level stays light: nnU-Net's validation
# export pool uses the spawn start method, which imports this file again in each worker.
# --------------------------------------------------------------------------------------------
DRIVER = r'''
"""nnU-Net side of scripts/quality_match.py (written by it; run with nnU-Net's python)."""
import argparse
import json
import os
import random
import sys
import time
from copy import deepcopy


def _dump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def _arch_summary(cm):
    """A configuration as ConfigurationManager reads it (nnU-Net's axes)."""
    ak = cm.network_arch_init_kwargs
    return {
        "spacing": [float(x) for x in cm.spacing],
        "patch": [int(x) for x in cm.patch_size],
        "batch_size": int(cm.batch_size),
        "strides": [[int(v) for v in s] for s in ak["strides"]],
        "kernels": [[int(v) for v in k] for k in ak["kernel_sizes"]],
        "features": [int(x) for x in ak["features_per_stage"]],
        "blocks": [int(x) for x in ak["n_conv_per_stage"]],
        "decoder_blocks": [int(x) for x in ak["n_conv_per_stage_decoder"]],
        "batch_dice": bool(cm.batch_dice),
        "data_identifier": cm.data_identifier,
        "network_class": cm.network_arch_class_name,
    }


def set_topology(cfg, dataset_id, plans_name, tf, patch_zyx):
    """cfg's patch and network: what nnU-Net's planner derives from patch_zyx at cfg's spacing
    (get_pool_and_conv_props; features 32 doubling up to 320; its blocks per stage)."""
    from nnunetv2.experiment_planning.experiment_planners.default_experiment_planner import ExperimentPlanner
    from nnunetv2.experiment_planning.experiment_planners.network_topology import get_pool_and_conv_props
    planner = ExperimentPlanner(dataset_id, plans_name=plans_name)
    patch_nn = [int(patch_zyx[tf[i]]) for i in range(3)]
    _, strides, kernels, padded, _ = get_pool_and_conv_props(
        cfg["spacing"], patch_nn, planner.UNet_featuremap_min_edge_length, 999999)
    n = len(strides)
    cfg["patch_size"] = [int(x) for x in padded]
    ak = cfg["architecture"]["arch_kwargs"]
    ak["n_stages"] = n
    ak["features_per_stage"] = [min(planner.UNet_max_features_3d, planner.UNet_base_num_features * 2 ** i)
                                for i in range(n)]
    ak["strides"] = [[int(v) for v in s] for s in strides]
    ak["kernel_sizes"] = [[int(v) for v in k] for k in kernels]
    ak["n_conv_per_stage"] = list(planner.UNet_blocks_per_stage_encoder[:n])
    ak["n_conv_per_stage_decoder"] = list(planner.UNet_blocks_per_stage_decoder[:n - 1])


def cmd_plan(a):
    from nnunetv2.experiment_planning.plan_and_preprocess_api import (
        extract_fingerprints, plan_experiments, preprocess)
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.crossval_split import generate_crossval_split
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
    from nnunetv2.training.dataloading.nnunet_dataset import infer_dataset_class

    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    plans_file = os.path.join(pre, a.plans + ".json")
    timings = {}
    t = time.time()
    if not os.path.isfile(os.path.join(pre, "dataset_fingerprint.json")):
        extract_fingerprints([a.dataset_id], num_processes=a.processes, check_dataset_integrity=True)
    timings["fingerprint_s"] = time.time() - t
    t = time.time()
    if not os.path.isfile(plans_file):
        plan_experiments([a.dataset_id])
    timings["plan_s"] = time.time() - t
    with open(plans_file) as f:
        plans = json.load(f)
    base = plans["configurations"]["3d_fullres"]
    data_dir = os.path.join(pre, base["data_identifier"])
    marker = os.path.join(pre, ".qm_preprocessed_" + base["data_identifier"])  # not in data_dir: nnU-Net infers its format from the endings there
    t = time.time()
    if not os.path.isfile(marker):
        preprocess([a.dataset_id], plans_identifier=a.plans, configurations=["3d_fullres"],
                   num_processes=[a.processes])
        open(marker, "w").close()
    timings["preprocess_s"] = time.time() - t

    # Fold 0 as nnU-Net's trainer makes it (do_split), written now so that both tools read it.
    splits_file = os.path.join(pre, "splits_final.json")
    if not os.path.isfile(splits_file):
        ids = sorted(infer_dataset_class(data_dir).get_identifiers(data_dir))
        _dump(generate_crossval_split(ids, seed=12345, n_splits=5), splits_file)

    # The qm configuration: 3d_fullres with the requested patch and batch and the topology the
    # planner derives from that patch.
    tf = plans["transpose_forward"]
    cfg = deepcopy(base)
    set_topology(cfg, a.dataset_id, a.plans, tf, a.patch)
    cfg["batch_size"] = int(a.batch)
    plans["configurations"][a.config] = cfg
    _dump(plans, plans_file)

    # Read both back through nnU-Net's own plans handler.
    pm = PlansManager(plans_file)
    with open(os.path.join(pre, "dataset.json")) as f:
        dataset_json = json.load(f)
    out = {"dataset_name": name, "transpose_forward": tf, "splits_file": splits_file,
           "preprocessed": pre, "timings": timings}
    for key, cname in (("planned", "3d_fullres"), ("qm", a.config)):
        cm = pm.get_configuration(cname)
        out[key] = _arch_summary(cm)
    cm = pm.get_configuration(a.config)
    lm = pm.get_label_manager(dataset_json)
    net = get_network_from_plans(cm.network_arch_class_name, cm.network_arch_init_kwargs,
                                 cm.network_arch_init_kwargs_req_import,
                                 len(dataset_json["channel_names"]), lm.num_segmentation_heads,
                                 allow_init=False, deep_supervision=True)
    out["qm"]["parameters"] = int(sum(p.numel() for p in net.parameters()))
    _dump(out, a.out)


def cmd_train(a):
    import numpy as np
    import torch
    import nnunetv2.training.nnUNetTrainer.nnUNetTrainer as trainer_module
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    epoch_seconds = []

    class nnUNetTrainer_QM(nnUNetTrainer):
        """nnU-Net's trainer; iterations, pseudo-Dice iterations, seeds and timing set here."""

        def __init__(self, plans, configuration, fold, dataset_json, device=torch.device("cpu")):
            super().__init__(plans, configuration, fold, dataset_json, device)
            self.num_epochs = a.epochs
            self.num_iterations_per_epoch = a.iters_per_epoch
            self.num_val_iterations_per_epoch = a.val_iters

        def get_dataloaders(self):
            # nnU-Net starts its augmentation processes with seeds=None (each draws from the OS);
            # hand them seeds derived from ours for the time this call builds them.
            original = trainer_module.NonDetMultiThreadedAugmenter
            made = [0]

            def seeded(*args, **kwargs):
                procs = kwargs.get("num_processes", 1)
                kwargs["seeds"] = [a.seed * 1000 + 100 * made[0] + i for i in range(procs)]
                made[0] += 1
                return original(*args, **kwargs)

            trainer_module.NonDetMultiThreadedAugmenter = seeded
            try:
                return super().get_dataloaders()
            finally:
                trainer_module.NonDetMultiThreadedAugmenter = original

        def on_train_epoch_start(self):
            super().on_train_epoch_start()
            self._qm_t0 = time.perf_counter()

        def perform_actual_validation(self, save_probabilities=False):
            if a.no_mirror:
                self.inference_allowed_mirroring_axes = None  # the predictor mirrors over these axes
            super().perform_actual_validation(save_probabilities)

        def on_train_epoch_end(self, train_outputs):
            dt = time.perf_counter() - self._qm_t0
            epoch_seconds.append(dt)
            self.print_to_log_file(
                f"qm: {self.num_iterations_per_epoch} training iterations in {dt:.4f} s "
                f"({dt / self.num_iterations_per_epoch:.4f} s/iteration)")
            super().on_train_epoch_end(train_outputs)

    name = maybe_convert_to_dataset_name(a.dataset_id)
    pre = os.path.join(nnUNet_preprocessed, name)
    with open(os.path.join(pre, a.plans + ".json")) as f:
        plans = json.load(f)
    plans["continue_training"] = False
    with open(os.path.join(pre, "dataset.json")) as f:
        dataset_json = json.load(f)
    trainer = nnUNetTrainer_QM(plans, a.config, a.fold, dataset_json, torch.device(a.device))
    t0 = time.time()
    trainer.run_training()
    t1 = time.time()
    if not a.skip_validation:
        trainer.perform_actual_validation(False)
    t2 = time.time()
    _dump({
        "output_folder": trainer.output_folder,
        "log_file": trainer.log_file,
        "epochs": a.epochs,
        "iters_per_epoch": a.iters_per_epoch,
        "epoch_train_seconds": epoch_seconds,
        "train_wall_s": t1 - t0,
        "validation_wall_s": t2 - t1,
        "batch_size": trainer.batch_size,
        "patch_size": [int(x) for x in trainer.configuration_manager.patch_size],
    }, a.out)


def cmd_refheader(a):
    """Copy nnU-Net's predictions with the reference's header (SimpleITK wrote mm)."""
    import nibabel as nib
    import numpy as np
    os.makedirs(a.dst, exist_ok=True)
    done = []
    scale = a.mm_per_unit
    for fn in sorted(os.listdir(a.src)):
        if not fn.endswith(a.ending):
            continue
        ref_path = os.path.join(a.ref, fn)
        if not os.path.isfile(ref_path):
            continue
        p = nib.load(os.path.join(a.src, fn))
        r = nib.load(ref_path)
        if p.shape != r.shape:
            sys.exit(f"{fn}: prediction shape {p.shape} != reference {r.shape}")
        pa = np.array(p.affine, dtype=float)
        ra = np.array(r.affine, dtype=float)
        # The prediction's affine in the reference's unit: divide by mm per unit.
        pa_unit = pa.copy()
        pa_unit[:3, :] /= scale
        if not np.allclose(pa_unit[:3, :], ra[:3, :], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ra).max())):
            sys.exit(f"{fn}: prediction affine {pa.tolist()} is not the reference's {ra.tolist()} "
                     f"at {scale} mm per unit")
        data = np.asarray(p.dataobj)
        hdr = r.header.copy()
        hdr.set_data_dtype(data.dtype)
        out = nib.Nifti1Image(data, r.affine, header=hdr)
        out.header["scl_slope"] = 1
        out.header["scl_inter"] = 0
        nib.save(out, os.path.join(a.dst, fn))
        done.append(fn)
    print(f"{len(done)} predictions given their reference's header in {a.dst}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--dataset-id", type=int, required=True)
    p.add_argument("--plans", default="nnUNetPlans")
    p.add_argument("--config", required=True)
    p.add_argument("--patch", type=int, nargs=3, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--processes", type=int, default=1, help="fingerprint and preprocessing workers")
    t = sub.add_parser("train")
    t.add_argument("--dataset-id", type=int, required=True)
    t.add_argument("--plans", default="nnUNetPlans")
    t.add_argument("--config", required=True)
    t.add_argument("--fold", type=int, default=0)
    t.add_argument("--no-mirror", action="store_true", help="final validation without test-time mirroring")
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--epochs", type=int, required=True)
    t.add_argument("--iters-per-epoch", type=int, required=True)
    t.add_argument("--val-iters", type=int, required=True)
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--skip-validation", action="store_true", help="(tests) no final validation")
    t.add_argument("--device", default="cpu", help="cpu, or cuda (nnU-Net's AMP and cudnn.benchmark)")
    h = sub.add_parser("refheader")
    h.add_argument("--src", required=True)
    h.add_argument("--ref", required=True)
    h.add_argument("--dst", required=True)
    h.add_argument("--ending", default=".nii.gz")
    h.add_argument("--mm-per-unit", type=float, required=True)
    a = ap.parse_args()
    {"plan": cmd_plan, "train": cmd_train, "refheader": cmd_refheader}[a.cmd](a)


if __name__ == "__main__":
    main()
'''


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

class Failure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[qm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores, /proc/stat), None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: busy = all but idle and iowait
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# Per log file: seconds of wall time and the average number of cores that processes other than
# the child's (other users, other jobs) kept busy meanwhile: a timing taken while that is well
# above 0 was measured on a shared machine.
RUNS: dict[str, dict] = {}


def run(cmd: list[str], logfile: Path, env: dict | None = None, cwd: Path | None = None) -> float:
    """Run a child with its output in logfile; raise with the log's tail when it fails."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    log(f"$ {shlex.join(str(c) for c in cmd)}  (log: {logfile})")
    t = time.time()
    busy0, mine0 = busy_cpu_seconds(), children_cpu_seconds()
    with open(logfile, "w") as f:
        r = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env,
                           cwd=cwd)
    dt = time.time() - t
    busy1, mine1 = busy_cpu_seconds(), children_cpu_seconds()
    other = None
    if busy0 is not None and dt > 0:
        other = max(0.0, (busy1 - busy0) - (mine1 - mine0)) / dt
    RUNS[str(logfile)] = {"wall_s": dt, "other_cores_busy": other,
                          "child_cpu_s": mine1 - mine0}
    if r.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-40:]
        raise Failure(f"exit status {r.returncode} after {dt:.0f} s: {shlex.join(str(c) for c in cmd)}\n"
                      + "\n".join("    " + line for line in tail))
    return dt


def nifti_mm_per_unit(path: Path) -> tuple[float, str]:
    """Millimetres per spatial unit of a NIfTI-1/2 header (SimpleITK's view: unknown = mm)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        head = f.read(540)
    for endian in "<>":
        size = struct.unpack(endian + "i", head[:4])[0]
        if size == 348:
            code = head[123] & 7
            break
        if size == 540:
            code = struct.unpack(endian + "i", head[500:504])[0] & 7
            break
    else:
        raise Failure(f"{path}: not a NIfTI header")
    return {1: (1000.0, "m"), 2: (1.0, "mm"), 3: (0.001, "um")}.get(code, (1.0, "unknown (mm)"))


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=4):
    return "-" if x is None else f"{x:.{nd}f}"


def zyx_from_nn(values, tf):
    """nnU-Net's transposed axes back to (z, y, x) of the SimpleITK array (z, y, x)."""
    out = [None] * 3
    for i, v in enumerate(values):
        out[tf[i]] = v
    return out


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

def prepare_data(a, work: Path, binp: Path) -> Path:
    if a.data:
        data = Path(a.data).resolve()
    else:
        data = work / "data"
        if not (data / "dataset.json").is_file():
            if data.exists():
                shutil.rmtree(data)
            run([binp / "prep", "synth", "--preset", a.preset, "--out", data], work / "logs" / "synth.log")
    if not (data / "imagesTr").is_dir() or not (data / "labelsTr").is_dir():
        raise Failure(f"{data}: no imagesTr/ and labelsTr/")
    stamp = work / "dataset_source.txt"
    source = f"{data}\npreset={a.preset if not a.data else '-'}\n"
    if stamp.is_file() and stamp.read_text() != source:
        raise Failure(f"{work} was made for another dataset ({stamp.read_text().splitlines()[0]}): "
                      "give another --work")
    stamp.write_text(source)
    return data


def nnunet_dataset_json(data: Path) -> dict:
    """dataset.json with what nnU-Net v2 needs; missing fields are derived from the folder."""
    path = data / "dataset.json"
    dj = json.loads(path.read_text()) if path.is_file() else {}
    labels_files = sorted(p.name for p in (data / "labelsTr").iterdir() if ".nii" in p.name)
    if "file_ending" not in dj:
        dj["file_ending"] = ".nii.gz" if all(n.endswith(".nii.gz") for n in labels_files) else ".nii"
    end = dj["file_ending"]
    if "channel_names" not in dj:
        if "modality" in dj:
            dj["channel_names"] = dict(dj["modality"])
        else:
            chans = sorted({m.group(1) for p in (data / "imagesTr").iterdir()
                            if (m := re.search(r"_(\d{4})" + re.escape(end) + "$", p.name))})
            dj["channel_names"] = {str(int(c)): "image" for c in chans} or {"0": "image"}
    labels = dj.get("labels")
    if not labels:
        raise Failure(f"{path}: no labels; nnU-Net needs them (name -> value)")
    if all(str(k).isdigit() for k in labels):  # Decathlon: value -> name
        dj["labels"] = {name: int(v) for v, name in labels.items()}
    dj["numTraining"] = sum(1 for n in labels_files if n.endswith(end))
    return dj


def register_nnunet(a, work: Path, data: Path) -> tuple[str, dict]:
    name = f"Dataset{a.dataset_id:03d}_QualityMatch"
    raw = work / "nnUNet_raw"
    raw.mkdir(parents=True, exist_ok=True)
    for other in raw.glob(f"Dataset{a.dataset_id:03d}_*"):
        if other.name != name:
            raise Failure(f"{other} holds dataset id {a.dataset_id} under another name")
    dst = raw / name
    dj = nnunet_dataset_json(data)
    for sub in ("imagesTr", "labelsTr"):
        (dst / sub).mkdir(parents=True, exist_ok=True)
        for p in sorted((data / sub).iterdir()):
            if not p.name.endswith(dj["file_ending"]):
                continue
            link = dst / sub / p.name
            if link.is_symlink() or link.exists():
                if link.resolve() == p.resolve():
                    continue
                link.unlink()
            link.symlink_to(p.resolve())
    (dst / "dataset.json").write_text(json.dumps(dj, indent=2))
    return name, dj


def nnunet_env(a, work: Path, results: Path | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        "nnUNet_raw": str(work / "nnUNet_raw"),
        "nnUNet_preprocessed": str(work / "nnUNet_preprocessed"),
        "nnUNet_results": str(results or work / "nnunet" / "results"),
        "nnUNet_n_proc_DA": str(a.nnunet_da_procs),
        "nnUNet_def_n_proc": "1",
        "nnUNet_compile": "false",
        "OMP_NUM_THREADS": str(a.threads),
        "MKL_NUM_THREADS": str(a.threads),
        "PYTHONUNBUFFERED": "1",
    })
    return env


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------

PLAN_KEYS = ("patch", "batch_size", "strides", "kernels", "features", "blocks", "decoder_blocks")


def nn_plan_zyx(c: dict, tf, mm_per_unit: float) -> dict:
    """An nnU-Net configuration summary in (z, y, x) and the files' unit (spacing x, y, z)."""
    sp = zyx_from_nn(c["spacing"], tf)
    return {
        "spacing": [sp[2] / mm_per_unit, sp[1] / mm_per_unit, sp[0] / mm_per_unit],
        "patch": zyx_from_nn(c["patch"], tf),
        "batch_size": c["batch_size"],
        "strides": [zyx_from_nn(s, tf) for s in c["strides"]],
        "kernels": [zyx_from_nn(k, tf) for k in c["kernels"]],
        "features": c["features"],
        "blocks": c["blocks"],
        "decoder_blocks": c["decoder_blocks"],
    }


def plan_differences(ours: dict, nn: dict) -> list[str]:
    diffs = []
    for k in PLAN_KEYS:
        if json.loads(json.dumps(ours[k])) != json.loads(json.dumps(nn[k])):
            diffs.append(f"{k}: voxcache {ours[k]} vs nnU-Net {nn[k]}")
    for i, (x, y) in enumerate(zip(ours["spacing"], nn["spacing"])):
        if not math.isclose(x, y, rel_tol=1e-5):
            diffs.append(f"spacing[{'xyz'[i]}]: voxcache {ours['spacing']} vs nnU-Net {nn['spacing']}")
            break
    return diffs


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML spelling for {v!r}")


def write_plan_toml(path: Path, prep_plan: dict, qm_zyx: dict, note: str) -> None:
    src = prep_plan["configurations"]["3d_fullres"]
    table = {
        "spacing": src["spacing"],
        "patch": qm_zyx["patch"],
        "batch_size": qm_zyx["batch_size"],
        "strides": qm_zyx["strides"],
        "kernels": qm_zyx["kernels"],
        "features": qm_zyx["features"],
        "blocks": qm_zyx["blocks"],
        "decoder_blocks": qm_zyx["decoder_blocks"],
        "encoder": src.get("encoder", "plain"),
    }
    lines = [f"# {line}" for line in note.splitlines()]
    for key in ("description", "normalization"):
        if key in prep_plan:
            lines.append(f"{key} = {toml_value(prep_plan[key])}")
    lines.append('configuration = "3d_fullres"')
    lines.append("")
    lines.append("[configurations.3d_fullres]")
    lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")


def print_plan_table(ours: dict, nn: dict) -> None:
    def show(v, key=""):
        if key in ("features", "blocks", "decoder_blocks"):
            return str(v)  # per-stage counts, not a shape
        if isinstance(v, list) and v and isinstance(v[0], list):
            return " ".join("x".join(str(i) for i in s) for s in v)
        if isinstance(v, list) and len(v) == 3 and all(isinstance(i, int) for i in v):
            return "x".join(str(i) for i in v)
        if isinstance(v, list) and all(isinstance(i, float) for i in v):
            return "x".join(f"{i:.6g}" for i in v)
        return str(v)

    print("\n| plan (z,y,x; spacing x,y,z in the files' unit) | nnU-Net (3d_fullres_qm) | voxcache (plan.toml) |")
    print("|---|---|---|")
    for k in ("spacing",) + PLAN_KEYS:
        print(f"| {k} | {show(nn[k], k)} | {show(ours[k], k)} |")
    print()


def make_plans(a, work: Path, binp: Path, data: Path, dj: dict) -> dict:
    driver = work / "nnunet_qm_driver.py"
    driver.write_text(DRIVER)
    (work / "plan").mkdir(exist_ok=True)
    out = work / "plan" / "nnunet_plan.json"
    t = time.time()
    run([a.nnunet_python, driver, "plan", "--dataset-id", a.dataset_id, "--plans", PLANS,
         "--config", CONFIG_QM, "--patch", *a.patch, "--batch", a.batch, "--out", out,
         "--processes", getattr(a, "plan_processes", 1)],
        work / "logs" / "nnunet_plan.log", env=nnunet_env(a, work))
    nn = json.loads(out.read_text())
    nn["wall_s"] = time.time() - t
    tf = nn["transpose_forward"]

    first_image = sorted((data / "imagesTr").glob("*" + dj["file_ending"]))[0]
    mm_per_unit, unit = nifti_mm_per_unit(first_image)

    prep_toml = work / "plan" / "prep_plan.toml"
    run([binp / "prep", "plan", data, "--out", prep_toml], work / "logs" / "prep_plan.log")
    prep_plan = tomllib.loads(prep_toml.read_text())
    ours_planned = prep_plan["configurations"]["3d_fullres"]
    nn_planned = nn_plan_zyx(nn["planned"], tf, mm_per_unit)
    planner_diffs = plan_differences(ours_planned, nn_planned)
    if planner_diffs:
        log("prep plan's 3d_fullres differs from nnU-Net's own plan (information; the run uses the "
            "qm plan below): " + "; ".join(planner_diffs))
    else:
        log(f"prep plan's 3d_fullres equals nnU-Net's own 3d_fullres plan (patch "
            f"{'x'.join(map(str, nn_planned['patch']))}, batch {nn_planned['batch_size']})")

    qm = nn_plan_zyx(nn["qm"], tf, mm_per_unit)
    if qm["patch"] != list(a.patch):
        log(f"patch {'x'.join(map(str, a.patch))} is not a multiple of its strides; nnU-Net's topology "
            f"rule padded it to {'x'.join(map(str, qm['patch']))}, which both tools use")
    plan_toml = work / "plan" / "plan.toml"
    write_plan_toml(plan_toml, prep_plan, qm,
                    "Written by scripts/quality_match.py: prep plan's 3d_fullres with the patch, batch and\n"
                    "topology of nnU-Net's 3d_fullres_qm configuration (nnUNetPlans.json).")
    ours = tomllib.loads(plan_toml.read_text())["configurations"]["3d_fullres"]
    print_plan_table(ours, qm)
    diffs = plan_differences(ours, qm)
    if diffs:
        raise Failure("the two plans differ: " + "; ".join(diffs))
    log(f"plans agree; nnU-Net's network at this plan: {nn['qm']['parameters']:,} parameters "
        f"(with deep-supervision heads), batch_dice {nn['qm']['batch_dice']}")
    return {
        "nnunet": nn, "plan_toml": str(plan_toml), "prep_plan_toml": str(prep_toml),
        "plan_zyx": qm, "unit": unit, "mm_per_unit": mm_per_unit,
        "prep_plan_equals_nnunet_plan": not planner_diffs, "prep_plan_differences": planner_diffs,
        "nnunet_planned_zyx": nn_planned,
    }


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

def evaluate(binp: Path, pred: Path, data: Path, out_json: Path, logfile: Path, val_ids) -> dict:
    run([binp / "evaluate", pred, data / "labelsTr", "--dataset-json", data / "dataset.json",
         "--summary", out_json, "-q"], logfile)
    rep = json.loads(out_json.read_text())
    scored = sorted(c["id"] for c in rep["cases"] if c.get("status") == "evaluated")
    if scored != sorted(val_ids):
        raise Failure(f"{pred}: evaluated cases {scored} are not fold 0's validation cases {sorted(val_ids)}")
    fg = rep["foreground_mean"]
    return {
        "dice": fg["dice"],
        "cldice": fg.get("cldice"),
        "dice_per_class": {c["class"]: c["dice"] for c in rep["mean"]},
        "cldice_per_class": {c["class"]: c.get("cldice") for c in rep["mean"]},
        "dice_per_case": {c["id"]: [k["dice"] for k in c["classes"]] for c in rep["cases"]
                          if c.get("status") == "evaluated"},
        "evaluate_json": str(out_json),
    }


# --------------------------------------------------------------------------------------------
# The two sides
# --------------------------------------------------------------------------------------------

def run_nnunet_seed(a, work: Path, binp: Path, data: Path, plans: dict, seed: int, epochs: int,
                    ipe: int, val_ids) -> dict:
    base = work / "nnunet" / f"seed{seed}"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    out = base / "driver.json"
    env = nnunet_env(a, work, results=base / "results")
    wall = run([a.nnunet_python, work / "nnunet_qm_driver.py", "train", "--dataset-id", a.dataset_id,
                "--plans", PLANS, "--config", CONFIG_QM, "--seed", seed, "--epochs", epochs,
                "--iters-per-epoch", ipe, "--val-iters", a.nnunet_val_iters, "--threads", a.threads,
                "--out", out], base / "train.log", env=env)
    info = json.loads(out.read_text())
    meter = RUNS[str(base / "train.log")]
    fold = Path(info["output_folder"])
    log_text = Path(info["log_file"]).read_text(errors="replace")
    per_epoch = [float(s) / int(n) for n, s in
                 re.findall(r"qm: (\d+) training iterations in ([0-9.]+) s", log_text)]
    epoch_times = [float(x) for x in re.findall(r"Epoch time: ([0-9.]+) s", log_text)]
    if len(per_epoch) != epochs:
        raise Failure(f"{info['log_file']}: {len(per_epoch)} timing lines for {epochs} epochs")
    summary = json.loads((fold / "validation" / "summary.json").read_text())
    own = {
        "foreground_mean_dice": summary["foreground_mean"]["Dice"],
        "dice_per_class": {k: v["Dice"] for k, v in summary["mean"].items()},
    }
    fixed = fold / "validation_refheader"
    run([a.nnunet_python, work / "nnunet_qm_driver.py", "refheader", "--src", fold / "validation",
         "--ref", data / "labelsTr", "--dst", fixed, "--ending", plans["file_ending"],
         "--mm-per-unit", plans["mm_per_unit"]], base / "refheader.log", env=env)
    scores = evaluate(binp, fixed, data, base / "evaluate.json", base / "evaluate.log", val_ids)
    if not a.keep_checkpoints:
        for p in fold.glob("checkpoint_*.pth"):
            p.unlink()
    return {
        "tool": "nnU-Net", "seed": seed, **scores,
        "nnunet_summary": own,
        "s_per_iteration": median(per_epoch),
        "s_per_iteration_per_epoch": per_epoch,
        "nnunet_epoch_time_s": epoch_times,
        "iterations": epochs * ipe, "epochs": epochs, "iters_per_epoch": ipe,
        "train_wall_s": info["train_wall_s"], "validation_wall_s": info["validation_wall_s"],
        "total_wall_s": wall, "other_cores_busy": meter["other_cores_busy"],
        "cpu_s": meter["child_cpu_s"],
        "run_folder": str(fold), "training_log": info["log_file"],
    }


def voxcache_step_times(metrics: Path) -> list[float]:
    """Seconds per step between consecutive train records of metrics.jsonl (`elapsed_s` counts
    from the start of training); a window holding a validation (run after the train record of
    its step) is left out."""
    prev_step, prev_t, out = 0, 0.0, []
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    val_steps = {r["step"] for r in recs if r.get("kind") == "val"}
    for r in recs:
        if r.get("kind") != "train":
            continue
        step, t = r["step"], r["elapsed_s"]
        if step > prev_step and not any(prev_step <= v < step for v in val_steps):
            out.append((t - prev_t) / (step - prev_step))
        prev_step, prev_t = step, t
    return out


def run_ours_seed(a, work: Path, binp: Path, data: Path, plans: dict, seed: int, iterations: int,
                  val_ids, splits: Path | None, dj: dict) -> dict:
    base = work / "ours" / f"seed{seed}"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    cache = work / "cache"
    t0 = time.time()
    run([binp / "prep", "build-cache", data, "--pipeline", plans["plan_toml"], "--cache-dir", cache],
        base / "build_cache.log")
    cache_s = time.time() - t0
    rundir = base / "run"
    cmd = [binp / "train", "--cache-dir", cache, "--pipeline", plans["plan_toml"], "--fold", "0",
           "--steps", iterations, "--seed", seed, "--out", rundir, "--val-every", "0",
           "--log-every", "1", "--no-progress", "-j", a.threads]
    if splits is not None:
        cmd += ["--splits", splits]
    cmd += shlex.split(a.ours_train_args)
    train_s = run(cmd, base / "train.log")
    meter = RUNS[str(base / "train.log")]
    run_json = json.loads((rundir / "run.json").read_text())
    c = run_json["config"]
    ours_net = {"patch": c["patch"], "batch_size": c["batch_size"], "strides": [[1, 1, 1]] + c["strides"],
                "kernels": c["kernels"], "features": c["features"], "blocks": c["blocks"],
                "decoder_blocks": c["decoder_blocks"]}
    mism = [f"{k}: {ours_net[k]} vs {plans['plan_zyx'][k]}" for k in PLAN_KEYS
            if ours_net[k] != plans["plan_zyx"][k]]
    if mism:
        raise Failure(f"{rundir}/run.json: trained with another plan than agreed: " + "; ".join(mism))
    if sorted(run_json["split"]["val"]) != sorted(val_ids):
        raise Failure(f"{rundir}: fold 0 validation {run_json['split']['val']} != nnU-Net's {val_ids}")
    m = re.search(r"(\d+) parameters", (base / "train.log").read_text())
    params = int(m.group(1)) if m else None
    nn_params = plans["nnunet"]["qm"]["parameters"]
    if params is not None and params != nn_params:
        # nnU-Net builds a deep-supervision head at the lowest decoder resolution too (weight 0
        # in its loss); voxcache leaves it out: features[-2] x classes weights + classes biases.
        head = plans["plan_zyx"]["features"][-2] * len(dj["labels"]) + len(dj["labels"])
        log(f"parameters: voxcache {params:,}, nnU-Net {nn_params:,} (difference {nn_params - params:,}; "
            f"nnU-Net's unused lowest deep-supervision head has {head:,})")
    steps = voxcache_step_times(rundir / "metrics.jsonl")

    images = []
    for cid in val_ids:
        files = sorted((data / "imagesTr").glob(f"{cid}_[0-9][0-9][0-9][0-9]{dj['file_ending']}"))
        if not files:
            files = [data / "imagesTr" / f"{cid}{dj['file_ending']}"]
        images += files
    pred = base / "pred"
    t1 = time.time()
    mirror = [] if a.no_mirror else ["--mirror"]
    run([binp / "predict", "--model", rundir, "--checkpoint", "latest", *mirror, "--out", pred, *images],
        base / "predict.log")
    predict_s = time.time() - t1
    scores = evaluate(binp, pred, data, base / "evaluate.json", base / "evaluate.log", val_ids)
    if not a.keep_checkpoints:
        shutil.rmtree(rundir / "checkpoints", ignore_errors=True)
    return {
        "tool": "voxcache", "seed": seed, **scores,
        "s_per_iteration": median(steps),
        "s_per_iteration_steps": steps,
        "iterations": iterations, "parameters": params,
        "build_cache_wall_s": cache_s, "train_wall_s": train_s, "predict_wall_s": predict_s,
        "other_cores_busy": meter["other_cores_busy"], "cpu_s": meter["child_cpu_s"],
        "run_folder": str(rundir),
    }


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs), "n": len(xs)}


# A run during which other processes kept more cores busy than this is a shared run: its time
# per iteration is inflated, and left out of the speed figure when quiet runs exist.
SHARED_CORES = 0.25


def speed(runs: list[dict]):
    """Median s/iteration over the quiet runs (all runs when none was quiet)."""
    quiet = [r["s_per_iteration"] for r in runs
             if r.get("s_per_iteration") is not None and (r.get("other_cores_busy") or 0.0) <= SHARED_CORES]
    xs = quiet or [r["s_per_iteration"] for r in runs if r.get("s_per_iteration") is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "n": len(xs), "quiet": bool(quiet)}


def verdict(ours, nn) -> str:
    if ours is None or nn is None:
        return "n/a"
    if ours["mean"] >= nn["mean"]:
        return "at or above nnU-Net's mean"
    if ours["mean"] >= nn["min"]:
        return "below nnU-Net's mean, within its seed range"
    return "below nnU-Net's seed range"


def report(rows: list[dict]) -> dict:
    print("\n| tool | seed | Dice | clDice | s/iteration | nnU-Net summary.json Dice | other processes' cores busy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["tool"], r["seed"])):
        own = r.get("nnunet_summary", {}).get("foreground_mean_dice")
        print(f"| {r['tool']} | {r['seed']} | {fmt(r['dice'])} | {fmt(r['cldice'])} | "
              f"{fmt(r['s_per_iteration'], 3)} | {fmt(own) if own is not None else ''} | "
              f"{fmt(r.get('other_cores_busy'), 2)} |")
    agg = {}
    for tool in ("nnU-Net", "voxcache"):
        rs = [r for r in rows if r["tool"] == tool]
        if rs:
            agg[tool] = {k: stats([r[k] for r in rs]) for k in ("dice", "cldice")}
            agg[tool]["s_per_iteration"] = speed(rs)
    print("\n| tool | seeds | Dice mean +- std (min-max) | clDice mean +- std (min-max) | s/iteration median |")
    print("|---|---:|---|---|---:|")
    for tool, s in agg.items():
        def ms(v):
            return "-" if v is None else f"{v['mean']:.4f} +- {v['std']:.4f} ({v['min']:.4f}-{v['max']:.4f})"
        sp = s["s_per_iteration"]
        runs = "" if sp is None else f" ({sp['n']} {'quiet' if sp['quiet'] else 'shared'} runs)"
        print(f"| {tool} | {s['dice']['n']} | {ms(s['dice'])} | {ms(s['cldice'])} | "
              f"{fmt(sp['median'] if sp else None, 3)}{runs} |")
    verdicts = {}
    if "nnU-Net" in agg and "voxcache" in agg:
        for k in ("dice", "cldice"):
            verdicts[k] = verdict(agg["voxcache"][k], agg["nnU-Net"][k])
        print(f"\nvoxcache vs nnU-Net: Dice {verdicts['dice']}; clDice {verdicts['cldice']}")
        sp_o, sp_n = agg["voxcache"]["s_per_iteration"], agg["nnU-Net"]["s_per_iteration"]
        if sp_o and sp_n:
            print(f"speed (medians): voxcache {sp_o['median']:.3f} s/iteration, nnU-Net {sp_n['median']:.3f} "
                  f"s/iteration (voxcache takes {sp_o['median'] / sp_n['median']:.2f}x nnU-Net's time per "
                  "iteration)")
    # nnU-Net's own metric beside ours on the same files.
    for r in rows:
        own = r.get("nnunet_summary", {}).get("foreground_mean_dice")
        if own is not None and abs(own - r["dice"]) > 1e-6:
            print(f"note: seed {r['seed']}: evaluate's Dice {r['dice']:.6f} vs nnU-Net's summary.json "
                  f"{own:.6f} (difference {r['dice'] - own:+.2e})")
    return {"aggregate": agg, "verdict": verdicts}


# --------------------------------------------------------------------------------------------

def split_iterations(total: int, per_epoch: int) -> tuple[int, int]:
    """Epochs x iterations per epoch for nnU-Net: at least two epochs (a median of timings)."""
    ipe = max(1, min(per_epoch, total))
    if total >= 2 and total // ipe < 2:
        ipe = math.ceil(total / 2)
    return math.ceil(total / ipe), ipe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/voxcache-quality-match", help="work folder")
    ap.add_argument("--bin", default="target/release", help="folder of prep, train, predict, evaluate")
    ap.add_argument("--data", help="dataset folder (nnU-Net layout); default: prep synth --preset PRESET")
    ap.add_argument("--preset", default="small", help="prep synth preset when --data is not given")
    ap.add_argument("--iterations", type=int, default=1000, help="training iterations (optimizer steps)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--patch", type=int, nargs=3, default=[20, 64, 64], metavar=("Z", "Y", "X"),
                    help="patch (z, y, x) of both tools; default 20 64 64, nnU-Net's own 3d_fullres "
                         "patch for the small preset")
    ap.add_argument("--batch", type=int, default=2, help="batch size of both tools")
    ap.add_argument("--nnunet-python", default="python3", help="python with nnunetv2 and torch")
    ap.add_argument("--dataset-id", type=int, default=777, help="nnU-Net dataset id")
    ap.add_argument("--iters-per-epoch", type=int, default=50,
                    help="nnU-Net iterations per epoch (epochs = iterations / this)")
    ap.add_argument("--nnunet-val-iters", type=int, default=5,
                    help="nnU-Net pseudo-Dice validation iterations per epoch")
    ap.add_argument("--nnunet-da-procs", type=int, default=1,
                    help="nnUNet_n_proc_DA: augmentation processes (0: in the main process)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="compute threads of each tool (torch threads; train -j)")
    ap.add_argument("--ours-train-args", default="", help="extra flags for voxcache's train")
    ap.add_argument("--no-mirror", action="store_true",
                    help="voxcache predicts without mirroring (nnU-Net's validation always mirrors)")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep weights after scoring")
    ap.add_argument("--skip-nnunet", action="store_true", help="do not run nnU-Net (reuse earlier results)")
    ap.add_argument("--skip-ours", action="store_true", help="do not run voxcache (reuse earlier results)")
    ap.add_argument("--json-out", help="JSON with every figure (default WORK/results.json)")
    a = ap.parse_args()

    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    binp = Path(a.bin).resolve()
    for b in ("prep", "train", "predict", "evaluate"):
        if not (binp / b).is_file():
            raise Failure(f"{binp / b} missing: build with cargo build --release or give --bin")
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    epochs, ipe = split_iterations(a.iterations, a.iters_per_epoch)
    iterations = epochs * ipe
    if iterations != a.iterations:
        log(f"{a.iterations} iterations are not whole epochs of {ipe}: both tools train {iterations}")
    t_start = time.time()
    load_start = os.getloadavg()

    data = prepare_data(a, work, binp)
    name, dj = register_nnunet(a, work, data)
    log(f"dataset {data} ({dj['numTraining']} labelled cases) registered as {name}")
    plans = make_plans(a, work, binp, data, dj)
    plans["file_ending"] = dj["file_ending"]
    splits = Path(plans["nnunet"]["splits_file"])
    val_ids = json.loads(splits.read_text())[0]["val"]
    log(f"fold 0: {len(json.loads(splits.read_text())[0]['train'])} training, validation {val_ids}")

    results_dir = work / "results"
    results_dir.mkdir(exist_ok=True)
    rows = []
    for tool, skip in (("nnunet", a.skip_nnunet), ("ours", a.skip_ours)):
        for seed in seeds:
            saved = results_dir / f"{tool}_seed{seed}.json"
            if skip:
                if saved.is_file():
                    r = json.loads(saved.read_text())
                    if r.get("iterations") != iterations:
                        log(f"{saved}: {r.get('iterations')} iterations, not {iterations}; left out")
                        continue
                    if r.get("plan") != plans["plan_zyx"]:
                        log(f"{saved}: trained with another plan ({r.get('plan')}); left out")
                        continue
                    rows.append(r)
                continue
            log(f"{tool}, seed {seed}: {iterations} iterations"
                + (f" ({epochs} epochs of {ipe})" if tool == "nnunet" else ""))
            if tool == "nnunet":
                r = run_nnunet_seed(a, work, binp, data, plans, seed, epochs, ipe, val_ids)
            else:
                r = run_ours_seed(a, work, binp, data, plans, seed, iterations, val_ids, splits, dj)
            r["plan"] = plans["plan_zyx"]
            saved.write_text(json.dumps(r, indent=2))
            rows.append(r)
            log(f"{tool}, seed {seed}: Dice {fmt(r['dice'])}, clDice {fmt(r['cldice'])}, "
                f"{fmt(r['s_per_iteration'], 3)} s/iteration")
            other = r.get("other_cores_busy")
            if other is not None and other > SHARED_CORES:
                log(f"warning: other processes kept {other:.2f} cores busy on average while it trained: "
                    "its s/iteration is inflated (a shared machine)")

    summary = report(rows)
    out = {
        "work": str(work), "data": str(data), "dataset": name, "seeds": seeds,
        "iterations": iterations, "nnunet_epochs": epochs, "nnunet_iters_per_epoch": ipe,
        "threads": a.threads, "nnunet_da_procs": a.nnunet_da_procs,
        "nnunet_val_iters": a.nnunet_val_iters, "ours_train_args": a.ours_train_args,
        "mirror": not a.no_mirror, "validation_cases": val_ids, "plan": plans,
        "runs": rows, **summary, "wall_s": time.time() - t_start,
        "host": {"cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
    }
    jp = Path(a.json_out) if a.json_out else work / "results.json"
    jp.write_text(json.dumps(out, indent=2))
    log(f"figures in {jp}; {time.time() - t_start:.0f} s in all")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"quality_match: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
