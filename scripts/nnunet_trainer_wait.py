#!/usr/bin/env python3
"""How long nnU-Net's trainer waits for its next batch: its own data loader (augmentation in
worker processes, nnUNet_n_proc_DA of them) against voxcache's (python -m voxcache.nnunet:
Rust threads in the training process), same plans, seed and schedule, on the CPU.

    PYTHON=/path/to/venv/bin/python   # nnunetv2 2.8.1, torch and the voxcache wheel installed
    $PYTHON scripts/nnunet_trainer_wait.py --work /tmp/nnwait --cores 1 2 --epochs 3 --iterations 50
    $PYTHON scripts/nnunet_trainer_wait.py --work /tmp/nnwait --cores 4 8 --device cuda   # on a GPU

1. data    a CT-like raw dataset (scripts/nnunet_fixtures_driver.py's generator, larger cases),
           planned and preprocessed by nnUNetv2_plan_and_preprocess (3d_fullres).
2. runs    per core count C (taskset to C cores, torch.set_num_threads(C)): nnU-Net's trainer
           with its loader (nnUNet_n_proc_DA = C), and nnUNetTrainerVoxcache (C loader threads),
           alternating, fold 0, --epochs x --iterations.
3. prints  the median and mean seconds each iteration spent in next(dataloader) (the figure of
           nnU-Net issue #3063), the median iteration, and the train loss of each epoch; with
           several --seeds, each tool's loss per epoch over the seeds (mean, lowest, highest)
           and whether ours stays within the spread of nnU-Net's own loader.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DATASET = 993
NAME = "Dataset993_WaitCT"


def make_data(work: Path, n: int, scale: float) -> None:
    import numpy as np
    from nnunet_fixtures_driver import CHANNELS, KINDS, LABELS, make_case
    from nnunet_import_driver import _dump, _save

    rng = np.random.RandomState(DATASET)
    raw = work / "nnUNet_raw" / NAME
    for sub in ("imagesTr", "labelsTr"):
        (raw / sub).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        sp, shape = KINDS["ct"]["spacing"](rng), KINDS["ct"]["shape"](rng)
        shape = [int(round(s * scale)) for s in shape]
        sp = [s / scale for s in sp]
        chans, lab = make_case("ct", shape, sp, rng)
        cid = f"ct_{i:03d}"
        _save(chans[0], sp, str(raw / "imagesTr" / f"{cid}_0000.nii.gz"))
        _save(lab, sp, str(raw / "labelsTr" / f"{cid}.nii.gz"))
    _dump({"channel_names": CHANNELS["ct"], "labels": LABELS["ct"], "numTraining": n,
           "file_ending": ".nii.gz", "name": NAME}, str(raw / "dataset.json"))


# One training run in a child process (so each gets a fresh interpreter, its own thread limits
# and nnU-Net's worker processes ended with it).
CHILD = r'''
import json, os, sys, time
import torch
which, cores, seed, epochs, iters, out, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
torch.set_num_threads(cores)
torch.manual_seed(seed)
import numpy as np, random
np.random.seed(seed); random.seed(seed)
from batchgenerators.utilities.file_and_folder_operations import load_json
from nnunetv2.paths import nnUNet_preprocessed
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from voxcache.nnunet import nnUNetTrainerVoxcache, cache_path, build
base = os.path.join(nnUNet_preprocessed, "''' + NAME + r'''")
Base = nnUNetTrainerVoxcache if which == "voxcache" else nnUNetTrainer

class Timed:
    def __init__(self, inner, waits):
        self.inner, self.waits = inner, waits
    def __iter__(self):
        return self
    def __next__(self):
        t = time.perf_counter()
        b = next(self.inner)
        self.waits.append(time.perf_counter() - t)
        return b

class Measured(Base):
    def on_train_start(self):
        super().on_train_start()
        self.waits, self.losses, self.iter_times = [], [], []
        self._loader = self.dataloader_train
        self.dataloader_train = Timed(self._loader, self.waits)
    def on_epoch_end(self):
        self.losses.append(float(self.logger.local_logger.my_fantastic_logging["train_losses"][-1]))
        super().on_epoch_end()
    def on_train_end(self):
        self.dataloader_train = self._loader
        super().on_train_end()

plans = load_json(os.path.join(base, "nnUNetPlans.json"))
plans["continue_training"] = False
t = Measured(plans, "3d_fullres", 0, load_json(os.path.join(base, "dataset.json")), torch.device(device))
t.num_epochs, t.num_iterations_per_epoch, t.num_val_iterations_per_epoch = epochs, iters, 5
if which == "voxcache":
    t.voxcache_cache = cache_path(base, "nnUNetPlans", "3d_fullres")
    t.voxcache_seed = seed
    t.voxcache_threads = cores
t0 = time.perf_counter()
t.run_training()
json.dump({"waits": t.waits, "losses": t.losses, "wall": time.perf_counter() - t0,
           "iterations": epochs * iters}, open(out, "w"))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--scale", type=float, default=2.0, help="case size over the fixture generator's")
    ap.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--keep", action="store_true", help="reuse the data and plans in --work")
    ap.add_argument("--device", default="cpu", help="torch device of the network: cpu, cuda (where the wait matters)")
    a = ap.parse_args()
    work = a.work.resolve()
    env = dict(os.environ, nnUNet_raw=str(work / "nnUNet_raw"),
               nnUNet_preprocessed=str(work / "nnUNet_preprocessed"),
               nnUNet_results=str(work / "nnUNet_results"), nnUNet_compile="false",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if not (a.keep and (work / "nnUNet_preprocessed" / NAME).is_dir()):
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        make_data(work, a.cases, a.scale)
        bin_dir = Path(sys.executable).parent
        subprocess.run([str(bin_dir / "nnUNetv2_plan_and_preprocess"), "-d", str(DATASET), "-c", "3d_fullres",
                        "-np", "1", "-npfp", "1"], env=env, check=True, stdout=subprocess.DEVNULL)
    # The cache, built before any timing.
    subprocess.run([sys.executable, "-c",
                    "import os; from voxcache.nnunet import build, cache_path; "
                    f"b = os.path.join(os.environ['nnUNet_preprocessed'], '{NAME}'); "
                    f"build(os.path.join(os.environ['nnUNet_raw'], '{NAME}'), os.path.join(b, 'nnUNetPlans.json'), "
                    "'3d_fullres', cache_path(b, 'nnUNetPlans', '3d_fullres'))"], env=env, check=True)
    plans = json.load(open(work / "nnUNet_preprocessed" / NAME / "nnUNetPlans.json"))
    cfg = plans["configurations"]["3d_fullres"]
    print(f"plans: patch {cfg['patch_size']}, batch {cfg['batch_size']}, features "
          f"{cfg['architecture']['arch_kwargs']['features_per_stage']}")
    results = {}
    for cores in a.cores:
        cpus = ",".join(str(c) for c in range(cores))
        for seed in a.seeds:
            for which in ("nnunet", "voxcache"):
                shutil.rmtree(work / "nnUNet_results", ignore_errors=True)
                out = work / f"run_{which}_{cores}_{seed}.json"
                run_env = dict(env, nnUNet_n_proc_DA=str(cores))
                subprocess.run(["taskset", "-c", cpus, sys.executable, "-c", CHILD, which, str(cores), str(seed),
                                str(a.epochs), str(a.iterations), str(out), a.device], env=run_env, check=True,
                               stdout=subprocess.DEVNULL)
                r = json.load(open(out))
                waits = r["waits"][1:]  # the first batch waits for the workers to start
                results[(which, cores, seed)] = r
                print(f"{cores} core(s) seed {seed} {which:9s}: wait per iteration median "
                      f"{statistics.median(waits) * 1e3:8.1f} ms, mean {statistics.mean(waits) * 1e3:8.1f} ms; "
                      f"iteration {r['wall'] / r['iterations']:.3f} s (wall / iterations); train loss by epoch "
                      f"{[round(x, 4) for x in r['losses']]}", flush=True)
        if len(a.seeds) > 1:
            spread = {}
            for which in ("nnunet", "voxcache"):
                by_epoch = list(zip(*(results[(which, cores, s)]["losses"] for s in a.seeds)))
                spread[which] = [(statistics.mean(e), min(e), max(e)) for e in by_epoch]
                print(f"{cores} core(s) {which:9s} loss by epoch over seeds {a.seeds} (mean [lowest, highest]): "
                      + ", ".join(f"{m:.4f} [{lo:.4f}, {hi:.4f}]" for m, lo, hi in spread[which]), flush=True)
            within = [lo <= m <= hi for (m, _, _), (_, lo, hi) in zip(spread["voxcache"], spread["nnunet"])]
            print(f"{cores} core(s): voxcache's mean loss within nnU-Net's seed spread at epochs "
                  f"{[e + 1 for e, w in enumerate(within) if w]} of {len(within)}", flush=True)
    json.dump({f"{w}_{c}_{s}": v for (w, c, s), v in results.items()}, open(work / "summary.json", "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
