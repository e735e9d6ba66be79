#!/usr/bin/env python3
"""Seconds per training iteration of nnU-Net v2 and voxcache on one GPU: same data, plan and network.

What it measures
----------------
The whole training loop, steady state, of both tools on the same plan (patch, batch, strides,
kernels, features: nnU-Net's topology rule for `--patch`, agreed by scripts/quality_match.py's
plan check) and the same cases:
  - nnU-Net: its own trainer (nnUNetTrainer through quality_match.py's driver: `--epochs` epochs
    of `--iters` training iterations and 50 pseudo-Dice validation iterations, as nnU-Net's
    defaults; AMP, cudnn.benchmark, `nnUNet_n_proc_DA` augmentation workers, torch.compile off).
    Per epoch after the first: the training iterations' seconds (the driver's line) and nnU-Net's
    own "Epoch time" (validation iterations and the progress plot included), each / iterations.
  - voxcache: `prep build-cache` with the agreed plan, then `train --benchmark STEPS` (after
    3 warm-up steps) with `--precision`: the median step, loader included.
Printed as a table with the ratio ours / nnU-Net; every figure in WORK/gpu_loop.json.

`--cores N` pins both tools to the first N CPU cores (taskset) with N augmentation workers
(nnU-Net's nnUNet_n_proc_DA=N; our --workers N, -j N): clusters give 4 to 8 cores per GPU.

On the GPU machine (no network; nnU-Net's wheels carried, scripts/gpu_nnunet_wheels.sh; our
binaries from scripts/build_cuda.sh):

    PYTHONPATH=/tmp/site python3 scripts/gpu_loop_match.py --bin target/cuda-dist \\
        --work /tmp/glm --preset mri-like --patch 128 128 128 --batch 2
    ... --cores 4                                  # both tools on 4 cores
    ... --preset ct-like --patch 40 224 224        # the anisotropic CT-like plan

Smoke test on a CPU (minutes): `--device cpu --preset small --patch 16 32 32 --epochs 2
--iters 5 --steps 3`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality_match as qm  # noqa: E402


def stub_simpleitk(work: Path) -> Path:
    """A stand-in SimpleITK package: nnU-Net imports it at start-up, and with NibabelIO set in
    dataset.json never calls it (its wheel is 53 MB to carry)."""
    d = work / "stubs" / "SimpleITK"
    d.mkdir(parents=True, exist_ok=True)
    (d / "__init__.py").write_text('"""Stand-in: this run reads images with nibabel."""\n')
    return d.parent


def cuda_libraries() -> None:
    """Our CUDA binaries find cuBLAS, cuRAND, cuDNN and the runtime where gpu_check.sh finds
    them: the nvidia-* wheels of this Python (PyTorch's)."""
    import glob
    import site
    roots = [p for p in sys.path if p.endswith("site-packages")] + site.getsitepackages()
    dirs = sorted({d for r in roots
                   for d in glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)})
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = ":".join(dirs + ([old] if old else []))


def nibabel_units() -> None:
    """nnU-Net reads these files with NibabelIO, which takes the header's spacing as it stands;
    quality_match.py's plan check assumes SimpleITK, which converts micrometres to millimetres."""
    unit_of = qm.nifti_mm_per_unit
    qm.nifti_mm_per_unit = lambda path: (1.0, unit_of(path)[1])


def pinned(a, cmd: list) -> list:
    return (["taskset", "-c", f"0-{a.cores - 1}"] if a.cores else []) + cmd


def run_nnunet(a, work: Path) -> dict:
    out = work / "nnunet" / "driver.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = qm.nnunet_env(a, work, results=work / "nnunet" / "results")
    cmd = [a.nnunet_python, work / "nnunet_qm_driver.py", "train", "--dataset-id", a.dataset_id,
           "--plans", qm.PLANS, "--config", qm.CONFIG_QM, "--seed", 0, "--epochs", a.epochs,
           "--iters-per-epoch", a.iters, "--val-iters", a.val_iters, "--threads", a.threads,
           "--device", a.device, "--skip-validation", "--out", out]
    qm.run(pinned(a, cmd), work / "nnunet" / "train.log", env=env)
    info = json.loads(out.read_text())
    text = Path(info["log_file"]).read_text(errors="replace")
    train = [float(s) / int(n) for n, s in
             re.findall(r"qm: (\d+) training iterations in ([0-9.]+) s", text)]
    epoch = [float(x) / a.iters for x in re.findall(r"Epoch time: ([0-9.]+) s", text)]
    if len(train) != a.epochs:
        raise qm.Failure(f"{info['log_file']}: {len(train)} timing lines for {a.epochs} epochs")
    steady = slice(1, None) if a.epochs > 1 else slice(None)
    return {"s_per_iteration_train": statistics.median(train[steady]),
            "s_per_iteration_epoch": statistics.median(epoch[steady]) if epoch else None,
            "per_epoch_train": train, "per_epoch_whole": epoch,
            "batch_size": info["batch_size"], "patch_size": info["patch_size"]}


def run_ours(a, work: Path, binp: Path, data: Path, plans: dict) -> dict:
    cache = work / "cache"
    qm.run(pinned(a, [binp / "prep", "build-cache", data, "--pipeline", plans["plan_toml"],
                      "--cache-dir", cache, "-q"]), work / "logs" / "build_cache.log")
    cmd = [binp / "train", "--cache-dir", cache, "--pipeline", plans["plan_toml"],
           "--benchmark", a.steps, "--device", a.device, "--no-progress"]
    if a.device != "cpu":
        cmd += ["--precision", a.precision]
    if a.cores:
        cmd += ["--workers", a.cores, "-j", a.cores]
    log = work / "logs" / "train_benchmark.log"
    qm.run(pinned(a, cmd), log)
    text = log.read_text(errors="replace")
    step = re.search(r"step time\s+([0-9.]+) s median", text)
    if not step:
        raise qm.Failure(f"{log}: no step time")
    wait = re.search(r"data wait\s+([0-9.]+)%", text)
    mem = re.search(r"peak memory\s+(.*)", text)
    return {"s_per_iteration": float(step.group(1)),
            "data_wait_percent": float(wait.group(1)) if wait else None,
            "peak_memory": mem.group(1).strip() if mem else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/voxcache-gpu-loop")
    ap.add_argument("--bin", default="target/cuda-dist", help="folder of our prep and train")
    ap.add_argument("--data", help="dataset folder (nnU-Net layout); default: prep synth --preset")
    ap.add_argument("--preset", default="mri-like")
    ap.add_argument("--patch", type=int, nargs=3, default=[128, 128, 128], metavar=("Z", "Y", "X"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="bf16", help="ours on the GPU: bf16 or f32")
    ap.add_argument("--epochs", type=int, default=4, help="nnU-Net epochs (the first is warm-up)")
    ap.add_argument("--iters", type=int, default=250, help="nnU-Net training iterations an epoch")
    ap.add_argument("--val-iters", type=int, default=50, help="nnU-Net validation iterations an epoch")
    ap.add_argument("--steps", type=int, default=100, help="our timed steps (train --benchmark)")
    ap.add_argument("--cores", type=int, default=0, help="pin both tools to cores 0..N-1")
    ap.add_argument("--nnunet-python", default=sys.executable)
    ap.add_argument("--dataset-id", type=int, default=778)
    ap.add_argument("--skip-nnunet", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    a = ap.parse_args()
    a.threads = a.cores or os.cpu_count()
    a.nnunet_da_procs = a.cores or max(1, min(12, (os.cpu_count() or 2) - 4))
    a.plan_processes = a.threads
    work = Path(a.work).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    binp = Path(a.bin).resolve()
    carried = Path(__file__).resolve().parent.parent / "target" / "gpu-carry" / "cuda-dist.tar.xz"
    if not (binp / "train").exists() and binp.name == "cuda-dist" and carried.is_file():
        import tarfile
        tarfile.open(carried).extractall(binp.parent)  # as gpu_check.sh unpacks it
    if a.device != "cpu":
        cuda_libraries()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(stub_simpleitk(work)), os.environ.get("PYTHONPATH", "")) if p)
    nibabel_units()
    try:
        data = qm.prepare_data(a, work, binp)
        name, dj = qm.register_nnunet(a, work, data)
        dj["overwrite_image_reader_writer"] = "NibabelIO"
        (work / "nnUNet_raw" / name / "dataset.json").write_text(json.dumps(dj, indent=2))
        plans = qm.make_plans(a, work, binp, data, dj)
        res_path = work / "gpu_loop.json"
        res = json.loads(res_path.read_text()) if res_path.is_file() else {}
        key = f"{a.preset} {'x'.join(map(str, a.patch))} b{a.batch} {a.device} cores={a.cores or 'all'}"
        row = res.get(key, {})
        if not a.skip_nnunet:
            row["nnunet"] = run_nnunet(a, work)
        if not a.skip_ours:
            row["voxcache"] = run_ours(a, work, binp, data, plans)
        row["plan"] = plans["plan_zyx"]
        res[key] = row
        res_path.write_text(json.dumps(res, indent=2))
    except qm.Failure as e:
        print(f"gpu_loop_match: {e}", file=sys.stderr)
        return 1
    nn, ours = row.get("nnunet"), row.get("voxcache")
    print(f"\n{key}: s/iteration, steady state")
    print("| nnU-Net training iterations | nnU-Net whole epoch / iterations | voxcache step | ratio |")
    print("|---:|---:|---:|---:|")
    f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    ratio = (f"{ours['s_per_iteration'] / nn['s_per_iteration_train']:.2f}x"
             if nn and ours else "-")
    print(f"| {f(nn and nn['s_per_iteration_train'])} | {f(nn and nn['s_per_iteration_epoch'])} "
          f"| {f(ours and ours['s_per_iteration'])} | {ratio} |")
    if ours:
        print(f"voxcache: data wait {ours['data_wait_percent']}%, peak memory {ours['peak_memory']}")
    print(f"figures: {res_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
