#!/usr/bin/env python3
"""Cross-check voxcache's candle U-Net against PyTorch on the same weights and input.

Usage:

    cargo run --release --example export_forward -- /tmp/xc 16,48,48 8 4 2 > /tmp/xc/config.json
    python scripts/torch_crosscheck.py /tmp/xc            # reads /tmp/xc/config.json

(or pass the JSON line with --config). The example writes weights.safetensors (every parameter
by voxcache's name) and io.safetensors (input, labels, logits, loss, grad/<name>, and which
side of 0 each LeakyReLU's input took); this script builds the PyTorch U-Net of
scripts/torch_unet_step.py with the same shape, loads the weights through an explicit name map,
runs forward + the same Dice + CE loss + backward in float64 and in float32, and compares
logits, loss and gradients with float64's.

Both PyTorch runs take ours' side of 0 at every LeakyReLU. An input within float32's rounding
of 0 may land on either side, and the derivative jumps there (1 against 0.01): one such voxel
moves the gradients of every layer below it by up to a few percent, which no tolerance tells
apart from a bug. On the same branches, ours and PyTorch's float32 are within ~1e-5 of float64.
The sides where ours and float64 differ must be near ties (--tie-band).

It exits 1 when the logits differ by more than --tol (relative to max |logit|), the loss by
more than --tol, a gradient (relative to its max |value|) by more than max(--tol, --slack x
PyTorch float32's worst gradient error), or a side differs away from 0.
Needs torch and numpy only (safetensors is read by hand).
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_unet_step import UNet, dice_ce  # noqa: E402

DTYPES = {"F32": np.float32, "F64": np.float64, "U32": np.uint32, "U8": np.uint8,
          "I64": np.int64, "F16": np.float16}


def read_safetensors(path):
    """Tiny reader: u64 LE header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=np.dtype(DTYPES[meta["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(meta["shape"]).copy())
    return out


def name_map(depth):
    """voxcache parameter name -> PyTorch state_dict key.

    voxcache: enc{s}.{b}.conv|norm.{weight,bias}, dec{s}.up.{weight,bias}, dec{s}.{b}.conv|norm,
    head. PyTorch (torch_unet_step.UNet): enc.{s}.{b}.0 (conv) / .1 (norm); up/dec ModuleLists
    run from the deepest decoder stage, so voxcache's dec{s} is index depth - 2 - s there.
    """
    m = {}
    parts = ("weight", "bias")
    for s in range(depth):
        for b in (0, 1):
            for p in parts:
                m[f"enc{s}.{b}.conv.{p}"] = f"enc.{s}.{b}.0.{p}"
                m[f"enc{s}.{b}.norm.{p}"] = f"enc.{s}.{b}.1.{p}"
    for s in range(depth - 1):
        i = depth - 2 - s
        for p in parts:
            m[f"dec{s}.up.{p}"] = f"up.{i}.{p}"
            for b in (0, 1):
                m[f"dec{s}.{b}.conv.{p}"] = f"dec.{i}.{b}.0.{p}"
                m[f"dec{s}.{b}.norm.{p}"] = f"dec.{i}.{b}.1.{p}"
    for p in parts:
        m[f"head.{p}"] = f"head.{p}"
    return m


def load_weights(net, ours, depth, inference=False):
    """Load our exported weights into torch_unet_step.UNet. `inference`: leave out the
    deep-supervision heads (ds1, ds2...), which only training uses and the PyTorch network lacks."""
    if inference:
        ours = {k: v for k, v in ours.items() if not re.match(r"ds\d+\.", k)}
    mapping = name_map(depth)
    sd = net.state_dict()
    errors = []
    missing_ours = sorted(set(mapping) - set(ours))
    extra_ours = sorted(set(ours) - set(mapping))
    unmapped_torch = sorted(set(sd) - set(mapping.values()))
    if missing_ours:
        errors.append(f"voxcache export lacks {missing_ours}")
    if extra_ours:
        errors.append(f"voxcache parameters with no PyTorch counterpart: {extra_ours}")
    if unmapped_torch:
        errors.append(f"PyTorch parameters nobody maps to: {unmapped_torch}")
    new = {}
    for ours_name, torch_name in mapping.items():
        if ours_name not in ours:
            continue
        if torch_name not in sd:
            errors.append(f"{ours_name} maps to {torch_name}, which PyTorch does not have")
            continue
        if tuple(ours[ours_name].shape) != tuple(sd[torch_name].shape):
            errors.append(f"{ours_name} {tuple(ours[ours_name].shape)} vs {torch_name} "
                          f"{tuple(sd[torch_name].shape)}")
            continue
        new[torch_name] = ours[ours_name].to(sd[torch_name].dtype)
    if errors:
        sys.exit("weight mapping failed:\n  " + "\n  ".join(errors))
    net.load_state_dict(new, strict=True)
    return mapping


def diff(ours, ref, scale=None):
    """(max abs difference, relative to `scale` (default max |ref|), scale)."""
    d = (ours.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item() if scale is None else scale
    return d, d / max(scale, 1e-30), scale


class Side(torch.nn.Module):
    """LeakyReLU that takes the side of 0 it is told (voxcache's, from io.safetensors) and
    keeps its input. Where an input lies within float32's error of 0, ours and float64 may
    take different sides, and the derivative jumps there (1 against the slope): one such
    voxel moves every gradient below it by a few percent. Taking ours gives the float64
    gradient of the branch ours computed; the sides that differ are checked to be near ties."""

    def __init__(self, slope, order, sides):
        super().__init__()
        self.slope, self.order, self.sides, self.z = slope, order, sides, None

    def forward(self, z):
        # The k-th activation the forward runs takes the k-th side ours traced.
        k = len(self.order)
        self.order.append(self)
        self.z = z.detach()
        up = z > 0 if self.sides is None else self.sides[k].to(torch.bool)
        return torch.where(up, z, self.slope * z)


def with_sides(net, sides):
    """Replace the LeakyReLUs of `net` by Sides taking `sides` (in forward order; None: their
    own); return the list the Sides append themselves to as the forward runs them."""
    order = []
    acts = []
    for mod in net.modules():
        for name, child in mod.named_children():
            if isinstance(child, torch.nn.LeakyReLU):
                acts.append(Side(child.negative_slope, order, sides))
                setattr(mod, name, acts[-1])
    if sides is not None and len(sides) != len(acts):
        sys.exit(f"voxcache traced {len(sides)} LeakyReLUs, PyTorch's network has {len(acts)}")
    return order


def reference(cfg, ours_w, io, dtype, sides):
    """PyTorch forward + loss + backward in `dtype`, each LeakyReLU on ours' side of 0:
    (logits, loss, {torch name: grad}, map, [each LeakyReLU's input in forward order])."""
    strides = [list(s) for s in cfg["strides"]]
    net = UNet(cfg["num_classes"], cfg["base_channels"], cfg["max_channels"], strides)
    n_torch = sum(p.numel() for p in net.parameters())
    if n_torch != cfg["params"]:
        sys.exit(f"parameter count differs: PyTorch {n_torch}, voxcache {cfg['params']}")
    mapping = load_weights(net, ours_w, len(strides) + 1)
    net = net.to(dtype)
    order = with_sides(net, sides)
    onehot = F.one_hot(io["labels"].long(), cfg["num_classes"]).permute(0, 4, 1, 2, 3)
    logits = net(io["input"].to(dtype))
    loss = dice_ce(logits, onehot.to(dtype))
    loss.backward()
    grads = {n: p.grad for n, p in net.named_parameters()}
    return logits.detach(), loss.item(), grads, mapping, [m.z for m in order]


def other_sides(sides, z64, z32, band):
    """The LeakyReLU inputs where ours took the other side of 0 than float64's:
    (count, [(activation, |z| / float32's RMS error there)] of the worst, worst ratio)."""
    worst, count, rows = 0.0, 0, []
    for k, (side, a, b) in enumerate(zip(sides, z64, z32)):
        rms = (a - b.double()).pow(2).mean().sqrt().item()
        flip = (a > 0) != side.to(torch.bool)
        n = int(flip.sum())
        if n:
            ratio = a[flip].abs().max().item() / max(rms, 1e-300)
            count += n
            rows.append((k, n, ratio))
            worst = max(worst, ratio)
    return count, rows, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="folder written by examples/export_forward.rs")
    ap.add_argument("--config", help="the example's JSON line (default: DIR/config.json)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--slack", type=float, default=3.0,
                    help="gradients pass within this factor of PyTorch float32's worst gradient "
                         "difference from float64 (when that exceeds --tol)")
    ap.add_argument("--tie-band", type=float, default=16.0,
                    help="ours may take the other side of a LeakyReLU than float64 only where "
                         "the input lies within this factor x the RMS of float32's forward "
                         "error there of 0")
    ap.add_argument("--show", type=int, default=6, help="gradient rows shown (worst first)")
    a = ap.parse_args()
    cfg = json.loads(a.config if a.config else open(os.path.join(a.dir, "config.json")).read())
    if cfg["norm"] != "instance" or cfg["upsampling"] != "transpose":
        sys.exit(f"torch_unet_step.UNet has instance norm and transposed-conv up only, "
                 f"got {cfg['norm']} / {cfg['upsampling']}")
    torch.manual_seed(0)
    ours_w = read_safetensors(os.path.join(a.dir, "weights.safetensors"))
    io = read_safetensors(os.path.join(a.dir, "io.safetensors"))

    # The reference runs in float64, so the differences measure float32 error (ours) alone;
    # PyTorch's own float32 run gives the error a correct float32 implementation has.
    # Both take ours' side of 0 at every LeakyReLU (see Side).
    sides = [io[f"side/{k}"] for k in range(sum(1 for n in io if n.startswith("side/")))]
    logits, loss, grads, mapping, z64 = reference(cfg, ours_w, io, torch.float64, sides)
    logits32, loss32, grads32, _, z32 = reference(cfg, ours_w, io, torch.float32, sides)

    print(f"patch {cfg['patch_zyx']} base {cfg['base_channels']} stages {cfg['stages']} "
          f"classes {cfg['num_classes']} strides {cfg['strides']} params {cfg['params']}")
    head = f"{'vs PyTorch float64':<26} {'max|ref|':>9} {'ours abs':>10} {'ours rel':>9} " \
           f"{'torch32 rel':>11}"
    print(head)
    failed = False
    ab, rel, sc = diff(io["logits"], logits)
    rel32 = diff(logits32, logits)[1]
    print(f"{'logits':<26} {sc:>9.4g} {ab:>10.2e} {rel:>9.2e} {rel32:>11.2e}")
    failed |= rel > a.tol
    ab_l = abs(io["loss"].double().item() - loss)
    print(f"{'loss':<26} {loss:>9.6g} {ab_l:>10.2e} {ab_l / abs(loss):>9.2e} "
          f"{abs(loss32 - loss) / abs(loss):>11.2e}")
    failed |= ab_l / abs(loss) > a.tol

    rows = []
    for ours_name, torch_name in mapping.items():
        g = io.get(f"grad/{ours_name}")
        if g is None:
            sys.exit(f"io.safetensors has no grad/{ours_name}")
        scale = None
        if ours_name.endswith("conv.bias"):
            # A conv bias ahead of an instance norm has zero gradient exactly (the norm
            # subtracts the mean); judge its float noise against the conv weight's gradient.
            scale = grads[mapping[ours_name[:-4] + "weight"]].abs().max().item()
        ab, rel, sc = diff(g, grads[torch_name], scale)
        rel32 = diff(grads32[torch_name], grads[torch_name], scale)[1]
        rows.append([ours_name, sc, ab, rel, rel32])
    # A gradient passes within --tol or within --slack x PyTorch float32's worst (on the same
    # branches), whichever is larger: a correct float32 implementation's noise floor.
    floor = max(r[4] for r in rows)
    limit = max(a.tol, a.slack * floor)
    for r in rows:
        r.append(r[3] <= limit)
    rows.sort(key=lambda r: -r[3])
    picks = {"enc0.0.conv.weight", "enc1.0.norm.weight", "dec0.up.weight", "head.weight"}
    shown = rows[:a.show] + [r for r in rows[a.show:] if r[0] in picks]
    for name, sc, ab, rel, rel32, ok in shown:
        mark = "" if ok else "  <- FAIL"
        print(f"{'grad ' + name:<26} {sc:>9.3g} {ab:>10.2e} {rel:>9.2e} {rel32:>11.2e}{mark}")
    bad = [r for r in rows if not r[5]]
    worst = rows[0]
    print(f"gradients: {len(rows)} tensors, worst relative {worst[3]:.2e} ({worst[0]}), PyTorch "
          f"float32 worst {floor:.2e}, limit {limit:.2e}, {len(bad)} failing")
    failed |= bool(bad)
    # A side that differs must be a near tie: its float64 input within a few float32 errors.
    count, flips, worst = other_sides(sides, z64, z32, a.tie_band)
    where = ", ".join(f"activation {k}: {n} ({r:.1f}x)" for k, n, r in flips)
    print(f"LeakyReLU sides: ours differs from float64's at {count} inputs"
          + (f" ({where}; |input| / float32's RMS error there)" if count else ""))
    if worst > a.tie_band:
        print(f"  <- FAIL: an input {worst:.1f}x float32's error from 0 took the other side "
              f"(limit {a.tie_band:g}x): the forward is off there")
        failed = True
    print("FAIL" if failed else "OK", f"(logits and loss within {a.tol:g} relative of max |ref|; "
          f"gradients within max({a.tol:g}, {a.slack:g} x PyTorch float32's worst))")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
