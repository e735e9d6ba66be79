#!/usr/bin/env python3
"""The user's surface-distance loss in a PyTorch CPU training loop (scripts/bench_surface.sh).

The same U-Net as voxcache's (scripts/torch_unet_step.py), Dice + CE, AdamW, one patch a step;
with --surface, the distance-weighted term of Karimi and Salcudean as MONAI's HausdorffDTLoss
computes it (alpha 2): mean((p - g)^2 * (d_g^2 + d_p^2)), where d_g and d_p are the distance
fields (scipy's distance_transform_edt of the mask plus that of its complement, with the voxel
spacing) of the label and of the thresholded prediction, computed every step for every patch
and class, as the user's loss did. Prints one JSON line: median step time, and the process's
peak and current resident memory after each step (growth shows there).
"""
import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import distance_transform_edt, gaussian_filter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_unet_step import UNet, dice_ce, plan_strides  # noqa: E402


def distance_field(mask, spacing):
    if not mask.any() or mask.all():
        return np.zeros(mask.shape, np.float32)
    return (distance_transform_edt(mask, sampling=spacing)
            + distance_transform_edt(~mask, sampling=spacing)).astype(np.float32)


def surface_term(logits, label, classes, spacing):
    probs = F.softmax(logits, 1)
    total = 0.0
    for b in range(logits.shape[0]):
        for c in range(1, classes):
            g = (label[b] == c).numpy()
            p_mask = (probs[b, c] > 0.5).detach().numpy()
            dg = torch.from_numpy(distance_field(g, spacing))
            dp = torch.from_numpy(distance_field(p_mask, spacing))
            err = (probs[b, c] - torch.from_numpy(g.astype(np.float32))) ** 2
            total = total + (err * (dg ** 2 + dp ** 2)).mean()
    return total / (logits.shape[0] * (classes - 1))


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--patch", default="72,136,136", help="z,y,x")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--base", type=int, default=8)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--surface", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    patch = [int(v) for v in a.patch.split(",")]
    classes = 2
    net = UNet(classes, a.base, 128, plan_strides(patch, a.stages))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    spacing = (4.0, 4.0, 4.0)
    times, peak, current = [], [], []
    for i in range(a.warmup + a.steps):
        # A new patch every step, as a loader gives: smooth noise, its top 5% the "vessels".
        noise = gaussian_filter(rng.standard_normal([a.batch] + patch), 2.0)
        label = torch.from_numpy((noise > np.quantile(noise, 0.95)).astype(np.int64))
        x = torch.from_numpy(noise.astype(np.float32))[:, None]
        onehot = F.one_hot(label, classes).permute(0, 4, 1, 2, 3).float()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = net(x)
        loss = dice_ce(logits, onehot)
        if a.surface:
            loss = loss + surface_term(logits, label, classes, spacing)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
            peak.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            current.append(rss_mib())
    print(json.dumps({
        "impl": "pytorch+scipy",
        "surface": a.surface,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "patch_zyx": patch,
        "batch": a.batch,
        "median_step_s": statistics.median(times),
        "peak_rss_mib_first": peak[0],
        "peak_rss_mib_last": peak[-1],
        "rss_mib_first": current[0],
        "rss_mib_last": current[-1],
        "steps": len(times),
    }))


if __name__ == "__main__":
    main()
