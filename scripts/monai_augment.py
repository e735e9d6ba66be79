"""MONAI's random transforms closest to nnU-Net v2's default training augmentation, for the
benchmarks that set MONAI beside nnU-Net and voxcache (scripts/bench_python_loader.py,
scripts/bench_python_pss.py).

nnU-Net rotates (+-30 degrees on each axis) and scales (0.7-1.4) a patch with probability 0.2
each; MONAI's RandAffined does both in one resampling, so it runs with p 0.36 (either of the
two). Then Gaussian noise (variance up to 0.1, p 0.1), smoothing (sigma 0.5-1, p 0.2),
multiplicative brightness and contrast (0.75-1.25, p 0.15 each), low resolution (0.5-1,
p 0.25), gamma on the inverted (p 0.1) and the plain image (p 0.3), and flips of each axis
(p 0.5)."""

from __future__ import annotations

import math

ROTATION = math.pi / 6  # 30 degrees


def nnunet_like(mt, keys=("image", "label")) -> list:
    """The list of MONAI dictionary transforms (`mt` is `monai.transforms`); `keys[0]` is the
    image, `keys[1]` the label."""
    image = keys[0]
    both = ("bilinear", "nearest")
    return [
        mt.RandAffined(keys=list(keys), prob=0.36, rotate_range=(ROTATION,) * 3,
                       scale_range=((-0.3, 0.4),) * 3, mode=both, padding_mode="zeros"),
        mt.RandGaussianNoised(keys=image, prob=0.1, std=0.1 ** 0.5),
        mt.RandGaussianSmoothd(keys=image, prob=0.2, sigma_x=(0.5, 1.0), sigma_y=(0.5, 1.0),
                               sigma_z=(0.5, 1.0)),
        mt.RandScaleIntensityd(keys=image, prob=0.15, factors=0.25),
        mt.RandScaleIntensityFixedMeand(keys=image, prob=0.15, factors=0.25, preserve_range=True),
        mt.RandSimulateLowResolutiond(keys=image, prob=0.25, zoom_range=(0.5, 1.0)),
        mt.RandAdjustContrastd(keys=image, prob=0.1, gamma=(0.7, 1.5), invert_image=True,
                               retain_stats=True),
        mt.RandAdjustContrastd(keys=image, prob=0.3, gamma=(0.7, 1.5), retain_stats=True),
    ] + [mt.RandFlipd(keys=list(keys), prob=0.5, spatial_axis=ax) for ax in range(3)]
