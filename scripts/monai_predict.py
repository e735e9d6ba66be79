#!/usr/bin/env python3
"""The reference for `predict`: MONAI's inference pipeline as a user writes it, with the same
network and weights in PyTorch.

    python scripts/monai_predict.py --model RUN_DIR --input CASE_0000.nii.gz --out DIR
    python scripts/monai_predict.py --model RUN_DIR --forward-only 40

LoadImaged + EnsureChannelFirstd, Spacingd to the run's target spacing (bilinear),
NormalizeIntensityd over non-zero voxels (the run's zscore-nonzero), sliding_window_inference
(Gaussian mode, the run's patch, overlap 0.5, batch 2), softmax, Invertd back to the input's
space (linear on the probabilities), AsDiscreted(argmax), SaveImaged. The U-Net is
scripts/torch_unet_step.py's, loaded with the run's weights through scripts/torch_crosscheck.py's
name map (checkpoints/best/, else the latest checkpoints/step-N/, as predict picks). MONAI's
tensors are (x, y, z), ours (z, y, x): the window is transposed on its way into the network and
back.

`--forward-only N` times N forward passes of a batch of windows on random input instead
(no_grad) and prints windows per second: the figure `predict`'s windows per second is set
beside. Run it under /usr/bin/time -v for peak memory.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_crosscheck import load_weights, read_safetensors  # noqa: E402
from torch_unet_step import UNet, plan_strides  # noqa: E402


def network(run_dir):
    run = json.load(open(os.path.join(run_dir, "run.json")))
    cfg = run["config"]
    strides = plan_strides(cfg["patch"], cfg["stages"])
    net = UNet(run["num_classes"], cfg["base_channels"], cfg["max_channels"], strides)
    # predict's default checkpoint: best/ (best validation Dice), else the latest step-N/.
    ckpt = os.path.join(run_dir, "checkpoints")
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))
    chosen = "best" if os.path.isdir(os.path.join(ckpt, "best")) else steps[-1]
    load_weights(net, read_safetensors(os.path.join(ckpt, chosen, "model.safetensors")),
                 len(strides) + 1, inference=True)
    return run, net.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input")
    ap.add_argument("--out")
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--forward-only", type=int, default=0, metavar="N")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run, net = network(args.model)
    patch = run["config"]["patch"]  # (z, y, x)

    def forward(x):  # x: (N, C, x, y, z) in MONAI's order
        return net(x.permute(0, 1, 4, 3, 2)).permute(0, 1, 4, 3, 2)

    if args.forward_only:
        x = torch.randn(args.batch, 1, *patch[::-1])
        with torch.no_grad():
            forward(x)  # warm-up
            t = time.perf_counter()
            for _ in range(args.forward_only):
                forward(x)
            dt = time.perf_counter() - t
        print(f"pytorch forward: {args.forward_only * args.batch / dt:.2f} windows/s "
              f"(batch {args.batch}, patch {patch}, {args.threads} threads)")
        return

    from monai.data import decollate_batch, list_data_collate
    from monai.inferers import sliding_window_inference
    from monai.transforms import (Activationsd, AsDiscreted, Compose, EnsureChannelFirstd,
                                  Invertd, LoadImaged, NormalizeIntensityd, SaveImaged,
                                  Spacingd)

    spacing = run["preprocessing"]["params"]["target_spacing_xyz"]
    pre = Compose([
        LoadImaged(keys="image"),
        EnsureChannelFirstd(keys="image"),
        Spacingd(keys="image", pixdim=spacing, mode="bilinear"),
        NormalizeIntensityd(keys="image", nonzero=True),
    ])
    post = Compose([
        Activationsd(keys="pred", softmax=True),
        Invertd(keys="pred", transform=pre, orig_keys="image", nearest_interp=False),
        AsDiscreted(keys="pred", argmax=True),
        SaveImaged(keys="pred", output_dir=args.out, output_postfix="seg",
                   separate_folder=False, output_dtype="uint8", resample=False),
    ])
    t = time.perf_counter()
    batch = list_data_collate([pre({"image": args.input})])
    t_pre = time.perf_counter() - t
    with torch.no_grad():
        print(f"resampled image {tuple(batch['image'].shape[2:])} (x, y, z)", flush=True)
        t = time.perf_counter()
        batch["pred"] = sliding_window_inference(
            batch["image"], roi_size=patch[::-1], sw_batch_size=args.batch, predictor=forward,
            overlap=args.overlap, mode="gaussian")
        t_sw = time.perf_counter() - t
    t = time.perf_counter()
    for d in decollate_batch(batch):
        post(d)
    t_post = time.perf_counter() - t
    print(f"monai: preprocessing {t_pre:.1f} s, sliding window {t_sw:.1f} s, "
          f"invert + save {t_post:.1f} s")


if __name__ == "__main__":
    main()
