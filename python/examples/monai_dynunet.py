"""Train MONAI's DynUNet on a voxcache cache with voxcache's patch loader: MONAI's network,
loss, sliding-window inference and metric as they are; batches from Rust threads (no
DataLoader workers, no copies of the volumes per process).

    pip install ./python monai torch
    python python/examples/monai_dynunet.py --data data/vessels --cache /tmp/vessels-cache

It builds the cache when it is missing (``voxcache.build_cache``, the same job as
``prep build-cache``), holds out the last two cases, trains on the rest with nnU-Net's default
augmentation, then segments each held-out case with MONAI's ``sliding_window_inference`` and
scores it with MONAI's ``DiceMetric``. It prints the time per step, the share of it spent
waiting for a batch, and each held-out case's Dice.

The batches follow MONAI's dict convention: ``image`` (B, C, z, y, x) float32 and ``label``
(B, 1, z, y, x), channel first, the axes of the cached volumes (z, y, x). The label values are
the cached ones; a dataset whose labels are not 0..K-1 maps them first.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from monai.inferers import sliding_window_inference
from monai.losses import DiceCELoss
from monai.metrics import DiceMetric
from monai.networks.nets import DynUNet

import voxcache


def dynunet(channels: int, classes: int, patch) -> DynUNet:
    """A DynUNet for ``patch`` (z, y, x): strides of 2 on each axis while it stays at 8 voxels
    or more, nnU-Net's rule of thumb, at most 4 downsamplings."""
    sizes, strides = list(patch), [[1, 1, 1]]
    for _ in range(4):
        s = [2 if n >= 16 else 1 for n in sizes]
        if s == [1, 1, 1]:
            break
        strides.append(s)
        sizes = [n // k for n, k in zip(sizes, s)]
    return DynUNet(
        spatial_dims=3,
        in_channels=channels,
        out_channels=classes,
        kernel_size=[[3, 3, 3]] * len(strides),
        strides=strides,
        upsample_kernel_size=strides[1:],
        norm_name="instance",
        res_block=False,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/vessels", help="dataset folder (to build the cache)")
    ap.add_argument("--cache", default="/tmp/voxcache-monai-cache")
    ap.add_argument("--patch", type=int, nargs=3, default=[16, 64, 64], help="z y x")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2, help="loader threads")
    ap.add_argument("--classes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)

    if not os.path.isfile(os.path.join(a.cache, "manifest.json")):
        r = voxcache.build_cache(a.data, a.cache)
        print(f"cache: {r['built']} built, {r['failed']} failed")
    cache = voxcache.open(a.cache)
    ids = cache.cases()
    train_ids, val_ids = ids[:-2], ids[-2:]
    channels = cache[ids[0]].channels

    net = dynunet(channels, a.classes, a.patch)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.99, nesterov=True, weight_decay=3e-5)
    loader = voxcache.PatchLoader(
        cache, a.patch, a.batch, augment="default", cases=train_ids,
        threads=a.threads, seed=a.seed, steps=a.steps,
    )
    net.train()
    waited, started, last = 0.0, time.perf_counter(), time.perf_counter()
    for step, batch in enumerate(loader):
        waited += time.perf_counter() - last
        image = torch.from_numpy(batch["image"])  # shares the loader's buffer
        label = torch.from_numpy(batch["label"].astype(np.int64))[:, None]
        for g in opt.param_groups:  # nnU-Net's polynomial decay
            g["lr"] = 1e-2 * (1 - step / a.steps) ** 0.9
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(image), label)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")
        last = time.perf_counter()
    wall = time.perf_counter() - started
    print(f"train: {a.steps} steps, {wall / a.steps:.3f} s/step, "
          f"{100 * waited / wall:.1f}% waiting for batches")

    net.eval()
    dice = DiceMetric(include_background=False, reduction="mean")
    with torch.no_grad():
        for cid in val_ids:
            case = cache[cid]
            image = torch.from_numpy(np.ascontiguousarray(case.image[...]))[None]
            label = torch.from_numpy(case.label[...].astype(np.int64))[None, None]
            logits = sliding_window_inference(image, a.patch, 2, net, overlap=0.5, mode="gaussian")
            pred = logits.argmax(1, keepdim=True)
            onehot = lambda t: torch.nn.functional.one_hot(t[:, 0], a.classes).permute(0, 4, 1, 2, 3)
            d = dice(onehot(pred), onehot(label))
            print(f"{cid}: Dice {d.item():.4f}")
    print(f"held-out mean Dice {dice.aggregate().item():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
