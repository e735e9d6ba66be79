"""Cross-check of our networks against dynamic-network-architectures (the package nnU-Net
builds its networks with), run by hand where PyTorch is installed; CI checks the files it
writes (tests/suite/network_crosscheck.rs) without PyTorch.

    source /work/bench/planner/env.sh   # any venv with nnunetv2 2.8.1 (torch, dna 0.4.4)
    python scripts/resenc_check.py --out tests/fixtures/network_crosscheck

It writes:
- parameter_counts.json: for every configuration of the stored nnU-Net plans
  (tests/nnunet_plans/*Plans.json; default = PlainConvUNet, ResEnc M/L/XL =
  ResidualEncoderUNet), dna's parameter count with 1 input channel and 2 classes, and the
  parameters of its lowest segmentation layer, which nnU-Net computes and weights 0 in its
  deep-supervision loss and we do not build;
- resenc_small.safetensors: a small ResidualEncoderUNet (2 channels, 3 classes, 4 stages,
  anisotropic strides, every kind of skip path: identity, average pool, pool + projection,
  projection alone) with random weights (norm weights too, so that nnU-Net's zero-initialized
  second norm hides nothing), under our parameter names, an input batch of 2 and dna's
  deep-supervision outputs (`logits.0` full resolution, `logits.1` ...); resenc_small.json
  beside it has the network's shape in our UNetConfig spelling and both parameter counts.
"""

import argparse
import glob
import json
import os
import re

import torch
from torch import nn
from safetensors.torch import save_file
from dynamic_network_architectures.architectures.unet import ResidualEncoderUNet
from nnunetv2.utilities.get_network_from_plans import get_network_from_plans


def our_name(dna_name, n_stages):
    """Our parameter name for one of dna's (None: the lowest segmentation layer we do not build)."""
    rules = [
        (r"encoder\.stem\.convs\.0\.(conv|norm)\.(weight|bias)", lambda m: f"stem.{m[1]}.{m[2]}"),
        (r"encoder\.stages\.(\d+)\.blocks\.(\d+)\.(conv1|conv2)\.(conv|norm)\.(weight|bias)",
         lambda m: f"enc{m[1]}.{m[2]}.{m[3]}.{m[4]}.{m[5]}"),
        (r"encoder\.stages\.(\d+)\.blocks\.(\d+)\.skip\.\d+\.(conv|norm)\.(weight|bias)",
         lambda m: f"enc{m[1]}.{m[2]}.skip.{m[3]}.{m[4]}"),
        # PlainConvUNet's encoder: stages.S.0.convs.B (stage S, conv B).
        (r"encoder\.stages\.(\d+)\.0\.convs\.(\d+)\.(conv|norm)\.(weight|bias)",
         lambda m: f"enc{m[1]}.{m[2]}.{m[3]}.{m[4]}"),
        (r"decoder\.stages\.(\d+)\.convs\.(\d+)\.(conv|norm)\.(weight|bias)",
         lambda m: f"dec{n_stages - 2 - int(m[1])}.{m[2]}.{m[3]}.{m[4]}"),
        (r"decoder\.transpconvs\.(\d+)\.(weight|bias)",
         lambda m: f"dec{n_stages - 2 - int(m[1])}.up.{m[2]}"),
    ]
    for pattern, name in rules:
        m = re.fullmatch(pattern, dna_name)
        if m:
            return name(m)
    m = re.fullmatch(r"decoder\.seg_layers\.(\d+)\.(weight|bias)", dna_name)
    if m:
        level = n_stages - 2 - int(m[1])
        if level == 0:
            return f"head.{m[2]}"
        return None if level == n_stages - 2 else f"ds{level}.{m[2]}"
    raise SystemExit(f"no rule for dna parameter {dna_name}")


def parameter_counts(plans_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(plans_dir, "*Plans.json"))):
        plans = json.load(open(path))
        for name, conf in plans["configurations"].items():
            if "architecture" not in conf:
                continue  # a configuration that inherits another's (none in ours)
            arch = conf["architecture"]
            net = get_network_from_plans(arch["network_class_name"], arch["arch_kwargs"],
                                         arch["_kw_requires_import"], 1, 2,
                                         allow_init=True, deep_supervision=True)
            n_stages = arch["arch_kwargs"]["n_stages"]
            total = sum(p.numel() for p in net.parameters())
            unused = sum(p.numel() for k, p in net.named_parameters()
                         if our_name(k, n_stages) is None)
            rows.append({"plans": os.path.basename(path), "configuration": name,
                         "dna_parameters": total, "lowest_seg_layer": unused})
            print(f"{rows[-1]}")
    return rows


def small_resenc(out):
    torch.manual_seed(7)
    features = [4, 8, 12, 12]
    kernels = [[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]]
    strides = [[1, 1, 1], [1, 2, 2], [2, 2, 2], [2, 2, 2]]
    blocks = [1, 3, 4, 2]
    net = ResidualEncoderUNet(
        2, 4, features, nn.Conv3d, kernels, strides, blocks, 3, [1, 1, 1], conv_bias=True,
        norm_op=nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
        nonlin=nn.LeakyReLU, nonlin_kwargs={"inplace": True}, deep_supervision=True)
    with torch.no_grad():
        for k, p in net.named_parameters():
            if ".norm." in k:
                p.copy_(torch.rand_like(p) + 0.5 if k.endswith("weight") else 0.1 * torch.randn_like(p))
            elif k.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    net.eval()
    x = torch.randn(2, 2, 8, 16, 16)
    with torch.no_grad():
        outs = net(x)
    tensors = {"input": x}
    for i, o in enumerate(outs):
        tensors[f"logits.{i}"] = o.contiguous()
    mapped = 0
    for k, p in net.named_parameters():
        ours = our_name(k, 4)
        if ours is not None:
            tensors[ours] = p.detach().clone().contiguous()
            mapped += p.numel()
    config = {"in_channels": 2, "num_classes": 3, "base_channels": 4, "max_channels": 12,
              "strides": strides[1:], "norm": "instance", "upsampling": "transpose",
              "deep_supervision": True, "kernels": kernels, "features": features,
              "blocks": blocks, "decoder_blocks": [1, 1, 1], "encoder": "residual"}
    save_file(tensors, os.path.join(out, "resenc_small.safetensors"))
    meta = {"config": config, "parameters": mapped,
            "dna_parameters": sum(p.numel() for p in net.parameters())}
    with open(os.path.join(out, "resenc_small.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"small ResEnc: {mapped} parameters mapped, outputs {[tuple(o.shape) for o in outs]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/network_crosscheck")
    ap.add_argument("--plans", default="tests/nnunet_plans")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    small_resenc(a.out)
    rows = parameter_counts(a.plans)
    with open(os.path.join(a.out, "parameter_counts.json"), "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
