#!/usr/bin/env python3
"""PyTorch reference for the training-step benchmarks (scripts/bench_train.sh on the CPU,
scripts/gpu_check.sh on a GPU with --device cuda, optionally --amp bf16|f16).

Builds the same network as voxcache's `train::model::UNet` (two conv3x3x3 + InstanceNorm(affine) +
LeakyReLU(0.01) blocks a stage, strided first conv, transposed-conv up with kernel = stride,
skip concatenation, 1x1x1 head, no deep supervision), the same Dice + CE loss and AdamW, and
times forward + backward + optimizer step on random data. Prints one JSON line.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def plan_strides(patch, stages, min_size=4):
    size, strides = list(patch), []
    while len(strides) + 1 < stages:
        s = [2 if size[a] % 2 == 0 and size[a] // 2 >= min_size else 1 for a in range(3)]
        if s == [1, 1, 1]:
            break
        size = [size[a] // s[a] for a in range(3)]
        strides.append(s)
    return strides


def block(cin, cout, stride):
    return nn.Sequential(
        nn.Conv3d(cin, cout, 3, stride=stride, padding=1),
        nn.InstanceNorm3d(cout, affine=True, eps=1e-5),
        nn.LeakyReLU(0.01),
    )


class UNet(nn.Module):
    def __init__(self, classes, base, max_ch, strides):
        super().__init__()
        ch = [min(base << s, max_ch) for s in range(len(strides) + 1)]
        self.enc = nn.ModuleList()
        for s in range(len(ch)):
            cin = 1 if s == 0 else ch[s - 1]
            stride = [1, 1, 1] if s == 0 else strides[s - 1]
            self.enc.append(nn.Sequential(block(cin, ch[s], stride), block(ch[s], ch[s], 1)))
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for s in reversed(range(len(ch) - 1)):
            self.up.append(nn.ConvTranspose3d(ch[s + 1], ch[s], strides[s], stride=strides[s]))
            self.dec.append(nn.Sequential(block(2 * ch[s], ch[s], 1), block(ch[s], ch[s], 1)))
        self.head = nn.Conv3d(ch[0], classes, 1)

    def forward(self, x):
        skips = []
        for e in self.enc:
            x = e(x)
            skips.append(x)
        skips.pop()
        for up, dec in zip(self.up, self.dec):
            x = dec(torch.cat([up(x), skips.pop()], 1))
        return self.head(x)


def dice_ce(logits, target_onehot):
    logp = F.log_softmax(logits, 1)
    ce = -(logp * target_onehot).sum(1).mean()
    p = logp.exp()[:, 1:]
    t = target_onehot[:, 1:]
    dims = (0, 2, 3, 4)
    inter = (p * t).sum(dims)
    dice = (2 * inter + 1e-5) / (p.sum(dims) + t.sum(dims) + 1e-5)
    return ce + (1 - dice.mean())


def status_mib(field):
    """VmRSS or VmHWM (peak RSS) of this process in MiB, from /proc (Linux); 0 elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--patch", default="32,64,64", help="z,y,x")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--base", type=int, default=16)
    ap.add_argument("--max-ch", type=int, default=128)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--classes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", default="", choices=["", "bf16", "f16"],
                    help="autocast (f16 with a GradScaler), as nnU-Net trains")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        # nnU-Net's setting: let cuDNN time its algorithms for each shape.
        torch.backends.cudnn.benchmark = True
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    # What importing torch costs before any tensor (its libraries' pages), to tell the step's
    # own memory from the process's.
    rss_start = status_mib("VmRSS")
    patch = [int(v) for v in a.patch.split(",")]
    net = UNet(a.classes, a.base, a.max_ch, plan_strides(patch, a.stages)).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    x = torch.randn(a.batch, 1, *patch).to(dev)
    lab = (torch.rand(a.batch, *patch) < 0.1).long()
    onehot = F.one_hot(lab, a.classes).permute(0, 4, 1, 2, 3).float().to(dev)
    amp_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(a.amp)
    scaler = torch.amp.GradScaler("cuda") if a.amp == "f16" else None
    times = []
    for i in range(a.warmup + a.steps):
        if cuda and i == a.warmup:
            torch.cuda.reset_peak_memory_stats(dev)
        if cuda:
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = net(x)
        loss = dice_ce(logits.float(), onehot)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize(dev)
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
    print(json.dumps({
        "impl": "pytorch" + (f" amp {a.amp}" if a.amp else ""),
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "patch_zyx": patch,
        "batch": a.batch,
        "params": sum(p.numel() for p in net.parameters()),
        "median_step_s": statistics.median(times),
        "min_step_s": min(times),
        "steps": len(times),
        "rss_start_mib": round(rss_start, 1),
        "peak_rss_mib": round(status_mib("VmHWM"), 1),
        "peak_gpu_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else 0,
    }))


if __name__ == "__main__":
    main()
