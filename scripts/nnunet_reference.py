#!/usr/bin/env python3
"""Torch-free reference of nnU-Net v2's (2.8.1) inference preprocessing and window placement.

What it computes, for a test case (one file per channel) and a trained model's plans.json and
dataset.json, the way `nnUNetv2_predict` prepares it before the network sees it:

1. reading as nnU-Net's SimpleITKIO does, through nibabel: the array in (z, y, x) order (nibabel's
   (x, y, z) array transposed), the spacing reversed to (z, y, x), channels stacked as float32;
2. `transpose_forward` of the plans, applied to the array and the spacing;
3. the crop to the nonzero bounding box: mask = any channel != 0, holes filled with scipy's
   binary_fill_holes, half-open box [lo, hi) per axis (the whole image when nothing is nonzero);
4. the per-channel normalization of the configuration, on the cropped array before resampling, in
   float32 as nnU-Net computes it (CTNormalization: clip to the plans'
   foreground_intensity_properties_per_channel percentile_00_5..percentile_99_5, minus their mean,
   over their std; ZScoreNormalization: this case's own mean and std, over the cropped nonzero mask
   when use_mask_for_norm (voxels outside it stay 0), else over the whole cropped array;
   NoNormalization; RescaleTo01Normalization; RGBTo01Normalization);
5. the new shape round(old_spacing / new_spacing * old_shape) (Python's round: half to even) and
   nnU-Net's resample_data_or_seg_to_shape: skimage's resize (order 3, mode edge, no anti-aliasing,
   output clipped to its input's min..max) of each channel in float64, or, when the spacing is
   anisotropic (max/min > 3, the input's spacing checked first, then the target's; not when two axes
   share the largest spacing), the same 2D resize of every slice across the low-resolution axis
   (clipped to that slice's range), then that axis by nearest neighbour (scipy map_coordinates
   order 0, mode nearest: index floor(c + 0.5) of c = (n_in / n_out) * (k + 0.5) - 0.5, clamped);
   float32 result;
6. the sliding-window starts: the preprocessed array padded (zeros, `pad_nd_image`: below = d // 2,
   above = d - d // 2) to at least the patch, then per axis n = ceil((size - patch) / (patch * step)) + 1
   starts int(np.round(i * (size - patch) / (n - 1))) (half to even); a 2d configuration slides over
   every slice d: starts [d, y, x]. Starts are in the padded array's coordinates.
7. the Gaussian importance map: a unit impulse at patch // 2 blurred by scipy's gaussian_filter
   (sigma = patch / 8, mode constant, truncate 4) in float64, divided by max / 10, cast to float16
   the way torch does from float64 (through float32), zeros replaced by the smallest nonzero value.

Only numpy, scipy, scikit-image and nibabel (scripts/requirements.txt): no torch, no nnunetv2.
It is written from nnunetv2 2.8.1's code (preprocessing/preprocessors/default_preprocessor.py
run_case_npy, preprocessing/cropping/cropping.py, preprocessing/normalization/
default_normalization_schemes.py, preprocessing/resampling/default_resampling.py,
inference/sliding_window_prediction.py, inference/predict_from_raw_data.py, imageio/
simpleitk_reader_writer.py; acvl_utils 0.2.6's pad_nd_image and get_bbox_from_mask);
`scripts/nnunet_import_check.py reference` checks it against nnunetv2 itself on every test case of the
harness and on random arrays (normalization schemes, resampling rules, window steps, Gaussians).

CLI (writes what examples/nnunet_stages.rs, the harness's --stages-example, writes:
DIR/preprocessed.npy, float32 (c, z, y, x) in nnU-Net's transposed axes, and DIR/stages.json):

    python scripts/nnunet_reference.py --plans plans.json --dataset-json dataset.json \\
        --configuration 3d_fullres --out DIR CASE_0000.nii.gz [CASE_0001.nii.gz ...]
    python scripts/nnunet_reference.py --nnunet-model RESULTS/DatasetX/TRAINER__PLANS__CONFIG --out DIR IMAGES...

With --nnunet-model it takes the stages example's arguments, so that the harness can run it in the
example's place (`nnunet_import_check.py compare --stages-example "PYTHON scripts/nnunet_reference.py"`).

`--gaussian` also writes DIR/gaussian.npy (float16, the patch's importance map).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ANISO_THRESHOLD = 3.0  # nnunetv2/configuration.py


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------

def resolve_configuration(plans: dict, name: str) -> dict:
    """A configuration of plans.json with `inherits_from` resolved (the child's keys win)."""
    confs = plans["configurations"]
    if name not in confs:
        raise KeyError(f"configuration {name!r} not in plans (has {sorted(confs)})")
    seen = []
    chain = []
    while name is not None:
        if name in seen:
            raise ValueError(f"circular inherits_from: {seen + [name]}")
        seen.append(name)
        chain.append(confs[name])
        name = confs[name].get("inherits_from")
    out: dict = {}
    for c in reversed(chain):
        out.update(c)
    return out


def model_files(model_dir: Path) -> tuple[dict, dict, str]:
    """plans, dataset.json and the configuration named by a TRAINER__PLANS__CONFIG folder."""
    parts = model_dir.name.split("__")
    if len(parts) != 3:
        raise ValueError(f"{model_dir}: not a TRAINER__PLANS__CONFIGURATION folder")
    plans = json.loads((model_dir / "plans.json").read_text())
    dj = json.loads((model_dir / "dataset.json").read_text())
    return plans, dj, parts[2]


# --------------------------------------------------------------------------------------------
# 1. Reading (SimpleITKIO's view through nibabel)
# --------------------------------------------------------------------------------------------

def read_images(paths) -> tuple[np.ndarray, list[float]]:
    """Channels stacked as float32 (c, z, y, x) and the spacing (z, y, x), as nnU-Net's SimpleITKIO
    returns them for NIfTI files: SimpleITK's array is nibabel's (x, y, z) array transposed, its
    spacing (pixdim) reversed. A 2D image becomes (c, 1, y, x) with spacing (999 * max, sy, sx).
    Assumes headers without intensity scaling or with scaling nibabel and ITK apply alike."""
    import nibabel as nib

    arrays, spacings = [], []
    for p in paths:
        img = nib.load(str(p))
        arr = np.asanyarray(img.dataobj)
        zooms = [abs(float(z)) for z in img.header.get_zooms()]
        if arr.ndim == 2:
            arr = arr.T[None, None]
            sp = [max(zooms[:2]) * 999, zooms[1], zooms[0]]
        elif arr.ndim == 3:
            arr = arr.transpose(2, 1, 0)[None]
            sp = [zooms[2], zooms[1], zooms[0]]
        else:
            raise ValueError(f"{p}: {arr.ndim}D images are not handled by this reference")
        arrays.append(arr)
        spacings.append(sp)
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"channels differ in shape: {[a.shape for a in arrays]}")
    if any(not np.allclose(s, spacings[0], rtol=0, atol=0) for s in spacings):
        raise ValueError(f"channels differ in spacing: {spacings}")
    data = np.vstack(arrays, dtype=np.float32, casting="unsafe")
    return data, spacings[0]


# --------------------------------------------------------------------------------------------
# 3. Crop to the nonzero region
# --------------------------------------------------------------------------------------------

def nonzero_mask(data: np.ndarray) -> np.ndarray:
    from scipy.ndimage import binary_fill_holes

    mask = data[0] != 0
    for c in range(1, data.shape[0]):
        mask |= data[c] != 0
    return binary_fill_holes(mask)


def bbox_of(mask: np.ndarray) -> list[list[int]]:
    """Half-open [lo, hi) per axis of the True voxels; the whole extent when there are none (as
    acvl_utils' get_bbox_from_mask, whose defaults are the full range)."""
    box = []
    for ax in range(mask.ndim):
        other = tuple(i for i in range(mask.ndim) if i != ax)
        hit = np.flatnonzero(mask.any(axis=other))
        box.append([int(hit[0]), int(hit[-1]) + 1] if hit.size else [0, int(mask.shape[ax])])
    return box


def crop_to_nonzero(data: np.ndarray):
    mask = nonzero_mask(data)
    box = bbox_of(mask)
    sl = tuple(slice(lo, hi) for lo, hi in box)
    return data[(slice(None),) + sl], mask[sl], box


# --------------------------------------------------------------------------------------------
# 4. Normalization (in place on float32, per channel)
# --------------------------------------------------------------------------------------------

def _eps(dtype) -> float:
    return 1e-4 if dtype == np.float16 else 1e-8


def normalize_channel(image: np.ndarray, scheme: str, use_mask: bool, props: dict | None,
                      mask: np.ndarray | None) -> np.ndarray:
    """One channel (float32) normalized as nnU-Net's scheme classes do; `mask` is the cropped
    nonzero mask (nnU-Net's seg >= 0)."""
    image = image.astype(np.float32, copy=False)
    eps = _eps(image.dtype)
    if scheme == "ZScoreNormalization":
        if use_mask:
            if mask is None:
                raise ValueError("use_mask_for_norm needs the nonzero mask")
            mean = image[mask].mean()
            std = image[mask].std()
            image[mask] = (image[mask] - mean) / (max(std, eps))
        else:
            mean = image.mean()
            std = image.std()
            image -= mean
            image /= max(std, eps)
        return image
    if scheme == "CTNormalization":
        if props is None:
            raise ValueError("CTNormalization needs foreground_intensity_properties_per_channel")
        np.clip(image, props["percentile_00_5"], props["percentile_99_5"], out=image)
        image -= props["mean"]
        image /= max(props["std"], eps)
        return image
    if scheme == "NoNormalization":
        return image
    if scheme == "RescaleTo01Normalization":
        image -= image.min()
        image /= np.clip(image.max(), a_min=eps, a_max=None)
        return image
    if scheme == "RGBTo01Normalization":
        if image.min() < 0 or image.max() > 255:
            raise ValueError("RGBTo01Normalization needs values in 0..255")
        image /= 255.0
        return image
    raise ValueError(f"unknown normalization scheme {scheme!r}")


def normalize(data: np.ndarray, mask: np.ndarray, config: dict, plans: dict) -> np.ndarray:
    props = plans.get("foreground_intensity_properties_per_channel") \
        or plans.get("foreground_intensity_properties_by_modality") or {}
    for c in range(data.shape[0]):
        data[c] = normalize_channel(data[c], config["normalization_schemes"][c],
                                    bool(config["use_mask_for_norm"][c]), props.get(str(c)), mask)
    return data


# --------------------------------------------------------------------------------------------
# 5. Resampling
# --------------------------------------------------------------------------------------------

def compute_new_shape(old_shape, old_spacing, new_spacing) -> list[int]:
    return [int(round(i / j * k)) for i, j, k in zip(old_spacing, new_spacing, old_shape)]


def _lowres_axes(spacing) -> list[int]:
    sp = np.array(spacing, dtype=float)
    return [int(i) for i in np.where(max(spacing) / sp == 1)[0]]


def _anisotropic(spacing, threshold) -> bool:
    return bool(np.max(spacing) / np.min(spacing) > threshold)


def separate_z_rule(current_spacing, new_spacing, force_separate_z=None,
                    threshold: float = ANISO_THRESHOLD) -> tuple[bool, int | None]:
    """(separate z?, low-resolution axis), nnU-Net's determine_do_sep_z_and_axis."""
    if force_separate_z is not None:
        do = bool(force_separate_z)
        axes = _lowres_axes(current_spacing) if do else None
    elif _anisotropic(current_spacing, threshold):
        do, axes = True, _lowres_axes(current_spacing)
    elif _anisotropic(new_spacing, threshold):
        do, axes = True, _lowres_axes(new_spacing)
    else:
        do, axes = False, None
    if axes is not None:
        if len(axes) != 1:  # two or three axes share the coarsest spacing: resample in 3D
            return False, None
        return do, axes[0]
    return do, None


def _resize(x: np.ndarray, shape, order: int) -> np.ndarray:
    from skimage.transform import resize
    return resize(x, tuple(int(s) for s in shape), order, mode="edge", anti_aliasing=False)


def nearest_along_axis(arr: np.ndarray, axis: int, n_out: int) -> np.ndarray:
    """scipy map_coordinates(order=0, mode='nearest') on the grid nnU-Net builds when only `axis`
    changes size: source index floor(c + 0.5), c = (n_in / n_out) * (k + 0.5) - 0.5, clamped."""
    n_in = arr.shape[axis]
    scale = float(n_in) / n_out
    c = scale * (np.arange(n_out) + 0.5) - 0.5
    c = np.clip(c, 0, n_in - 1)
    idx = np.floor(c + 0.5).astype(np.int64)
    return np.take(arr, idx, axis=axis)


def resample_to_shape(data: np.ndarray, new_shape, current_spacing, new_spacing, order: int = 3,
                      order_z: int = 0, force_separate_z=None,
                      separate_z_anisotropy_threshold: float = ANISO_THRESHOLD,
                      dtype_out=None) -> np.ndarray:
    """nnU-Net's resample_data_or_seg_to_shape for images (is_seg False); `data` is (c, ...3D)."""
    from scipy.ndimage import map_coordinates

    do_sep, axis = separate_z_rule(current_spacing, new_spacing, force_separate_z,
                                   separate_z_anisotropy_threshold)
    shape = np.array(data.shape[1:])
    new_shape = np.array([int(s) for s in new_shape])
    if dtype_out is None:
        dtype_out = data.dtype
    if not np.any(shape != new_shape):
        return data
    data = data.astype(float, copy=False)
    out = np.zeros((data.shape[0], *new_shape), dtype=dtype_out)
    if do_sep:
        shape_2d = [int(s) for i, s in enumerate(new_shape) if i != axis]
        for c in range(data.shape[0]):
            tmp = new_shape.copy()
            tmp[axis] = shape[axis]
            here = np.zeros(tmp)
            for s in range(shape[axis]):
                idx = [slice(None)] * 3
                idx[axis] = s
                here[tuple(idx)] = _resize(data[c][tuple(idx)], shape_2d, order)
            if shape[axis] != new_shape[axis]:
                if order_z == 0:
                    out[c] = nearest_along_axis(here, axis, int(new_shape[axis]))
                else:
                    grids = []
                    for i in range(3):
                        scale = float(here.shape[i]) / new_shape[i]
                        grids.append(scale * (np.arange(new_shape[i]) + 0.5) - 0.5)
                    coords = np.array(np.meshgrid(*grids, indexing="ij"))
                    out[c] = map_coordinates(here, coords, order=order_z, mode="nearest")
            else:
                out[c] = here
    else:
        for c in range(data.shape[0]):
            out[c] = _resize(data[c], new_shape, order)
    return out


# --------------------------------------------------------------------------------------------
# The whole preprocessing (DefaultPreprocessor.run_case without a segmentation)
# --------------------------------------------------------------------------------------------

def preprocess(data: np.ndarray, spacing, plans: dict, config: dict):
    """(preprocessed float32 (c, ...), properties) for data (c, z, y, x) float32 read as above."""
    if config.get("resampling_fn_data", "resample_data_or_seg_to_shape") != "resample_data_or_seg_to_shape":
        raise ValueError(f"resampling function {config['resampling_fn_data']!r} is not handled")
    tf = list(plans["transpose_forward"])
    data = data.astype(np.float32)
    data = data.transpose([0, *[i + 1 for i in tf]])
    original_spacing = [spacing[i] for i in tf]
    props = {"spacing": [float(s) for s in spacing], "transpose_forward": tf,
             "shape_before_cropping": [int(s) for s in data.shape[1:]]}
    data, mask, box = crop_to_nonzero(data)
    props["bbox_used_for_cropping"] = box
    props["shape_after_cropping_and_before_resampling"] = [int(s) for s in data.shape[1:]]
    target = list(config["spacing"])
    if len(target) < data.ndim - 1:  # 2d: the slice axis keeps its spacing
        target = [original_spacing[0]] + target
    new_shape = compute_new_shape(data.shape[1:], original_spacing, target)
    data = normalize(data, mask, config, plans)
    kw = dict(config.get("resampling_fn_data_kwargs") or {})
    kw.pop("is_seg", None)
    do_sep, axis = separate_z_rule(original_spacing, target, kw.get("force_separate_z"),
                                   kw.get("separate_z_anisotropy_threshold", ANISO_THRESHOLD))
    data = resample_to_shape(data, new_shape, original_spacing, target, **kw)
    props.update({
        "original_spacing_transposed": [float(s) for s in original_spacing],
        "target_spacing": [float(s) for s in target],
        "new_shape": [int(s) for s in new_shape],
        "separate_z": bool(do_sep and list(new_shape) != props["shape_after_cropping_and_before_resampling"]),
        "lowres_axis": axis,
    })
    return data, props


# --------------------------------------------------------------------------------------------
# 6. Sliding windows, 7. the Gaussian
# --------------------------------------------------------------------------------------------

def sliding_window_steps(image_size, tile_size, step: float = 0.5) -> list[list[int]]:
    out = []
    for size, tile in zip(image_size, tile_size):
        target = tile * step
        n = int(np.ceil((size - tile) / target)) + 1
        actual = (size - tile) / (n - 1) if n > 1 else 99999999999
        out.append([int(np.round(actual * i)) for i in range(n)])
    return out


def pad_amounts(shape, patch) -> tuple[list[int], list[int]]:
    """(padded shape, padding below) of pad_nd_image(new_shape=patch) on the last len(patch) axes."""
    shape = list(shape)
    lead = len(shape) - len(patch)
    new = shape[:lead] + [max(p, s) for p, s in zip(patch, shape[lead:])]
    below = [(n - s) // 2 for n, s in zip(new, shape)]
    return new, below


def window_starts(preprocessed_shape, patch, step: float = 0.5) -> dict:
    """Windows of nnU-Net's predictor for a preprocessed array of shape (z, y, x) (no channel axis):
    starts in the padded array, in nnU-Net's order (axis 0 outermost; 2d: slice d outermost)."""
    patch = [int(p) for p in patch]
    padded, below = pad_amounts(list(preprocessed_shape), patch)
    if len(patch) == len(padded) - 1:
        steps = sliding_window_steps(padded[1:], patch, step)
        starts = [[d, y, x] for d in range(padded[0]) for y in steps[0] for x in steps[1]]
    elif len(patch) == len(padded):
        steps = sliding_window_steps(padded, patch, step)
        starts = [[z, y, x] for z in steps[0] for y in steps[1] for x in steps[2]]
    else:
        raise ValueError(f"patch {patch} does not fit an image of shape {preprocessed_shape}")
    return {"padded_shape": padded, "pad_below": below, "steps_per_axis": steps, "window_starts": starts}


def gaussian_importance_map(patch, sigma_scale: float = 1.0 / 8, value_scaling_factor: float = 10.0,
                            dtype=np.float16) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    tmp = np.zeros([int(p) for p in patch])
    tmp[tuple(int(p) // 2 for p in patch)] = 1
    g = gaussian_filter(tmp, [p * sigma_scale for p in patch], 0, mode="constant", cval=0)
    g /= np.max(g) / value_scaling_factor
    if dtype == np.float16:
        g = g.astype(np.float32).astype(np.float16)  # torch converts float64 -> float16 through float32
    else:
        g = g.astype(dtype)
    zero = g == 0
    if zero.any():
        g[zero] = g[~zero].min()
    return g


# --------------------------------------------------------------------------------------------
# All stages of one case
# --------------------------------------------------------------------------------------------

def stages(images, plans: dict, dataset_json: dict, configuration: str, step: float = 0.5):
    """(preprocessed array, stages dict in the schema of the stages example's stages.json)."""
    config = resolve_configuration(plans, configuration)
    n_ch = len(dataset_json.get("channel_names") or dataset_json.get("modality"))
    if len(images) != n_ch:
        raise ValueError(f"{len(images)} images given, the model takes {n_ch} channels")
    data, spacing = read_images(images)
    pre, props = preprocess(data, spacing, plans, config)
    win = window_starts(pre.shape[1:], config["patch_size"], step)
    st = {
        "shape_before_cropping": props["shape_before_cropping"],
        "bbox": props["bbox_used_for_cropping"],
        "shape_after_cropping": props["shape_after_cropping_and_before_resampling"],
        "preprocessed_shape": [int(s) for s in pre.shape[1:]],
        "window_starts": win["window_starts"],
        # beyond the shared schema
        "spacing": props["spacing"],
        "transpose_forward": props["transpose_forward"],
        "target_spacing": props["target_spacing"],
        "separate_z": props["separate_z"],
        "lowres_axis": props["lowres_axis"],
        "patch_size": [int(p) for p in config["patch_size"]],
        "padded_shape": win["padded_shape"],
        "pad_below": win["pad_below"],
        "normalization_schemes": list(config["normalization_schemes"]),
        "use_mask_for_norm": [bool(x) for x in config["use_mask_for_norm"]],
    }
    return pre.astype(np.float32, copy=False), st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", "--nnunet-model", dest="model",
                    help="trained model folder TRAINER__PLANS__CONFIGURATION (plans.json, dataset.json)")
    ap.add_argument("--plans", help="plans.json (instead of --model)")
    ap.add_argument("--dataset-json", help="dataset.json (instead of --model)")
    ap.add_argument("--configuration", help="configuration name (default: from --model's folder name)")
    ap.add_argument("--step", type=float, default=0.5, help="tile step size (nnU-Net's default 0.5)")
    ap.add_argument("--gaussian", action="store_true", help="also write gaussian.npy (float16)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("images", nargs="+", help="one file per channel, in channel order")
    a = ap.parse_args(argv)
    if a.model:
        plans, dj, conf = model_files(Path(a.model))
    else:
        if not (a.plans and a.dataset_json):
            ap.error("give --model, or --plans and --dataset-json")
        plans = json.loads(Path(a.plans).read_text())
        dj = json.loads(Path(a.dataset_json).read_text())
        conf = None
    conf = a.configuration or conf
    if not conf:
        ap.error("--configuration is needed with --plans")
    pre, st = stages(a.images, plans, dj, conf, a.step)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "preprocessed.npy", pre)
    (out / "stages.json").write_text(json.dumps(st, indent=1))
    if a.gaussian:
        np.save(out / "gaussian.npy", gaussian_importance_map(st["patch_size"]))
    print(f"{out}: preprocessed {list(pre.shape)}, {len(st['window_starts'])} windows of "
          f"{'x'.join(map(str, st['patch_size']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
