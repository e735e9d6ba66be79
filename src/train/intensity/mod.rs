//! nnU-Net's intensity augmentations of one patch, in its order: Gaussian noise, Gaussian blur,
//! multiplicative brightness, contrast, low-resolution simulation, inverted gamma, gamma.
//!
//! Probabilities and ranges are nnU-Net v2's defaults (`nnUNetTrainer.get_training_transforms`
//! with batchgeneratorsv2's transforms): each transform is applied to a patch with its
//! probability, then to each channel with its per-channel probability, with a draw of its own
//! per channel (nnU-Net's `synchronize_channels=False`) except the noise variance, which
//! channels share. Ranges marked "either side of 1" are drawn as nnU-Net's `BGContrast`: half
//! the time below 1, half the time above, so a factor is as likely to shrink as to grow.
//!
//! One file per transform family (`noise`, `blur`, `brightness` with contrast, `lowres`,
//! `gamma`), the one-pass statistics contrast and gamma share in `moments`, the options in
//! [`crate::format::training::augmentation`]; this file draws each transform's parameters in nnU-Net's order and picks the
//! vector build ([`apply`]).

mod blur;
mod brightness;
mod gamma;
mod lowres;
mod moments;
mod noise;
mod scratch;
#[cfg(test)]
mod tests;

pub use crate::format::training::augmentation::IntensityConfig;
pub use blur::gaussian_blur;
pub use brightness::contrast;
pub use gamma::gamma;
pub use lowres::low_resolution;

use crate::util::rng::Rng;
#[cfg(target_arch = "x86_64")]
use crate::util::simd::Simd;

/// Apply the intensity transforms to `image` (channels one after the other, each `size_zyx`
/// voxels in C order). `in_plane` keeps the low-resolution simulation off the z axis.
pub fn apply(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    #[cfg(target_arch = "x86_64")]
    match crate::util::simd::best() {
        // AVX-512 CPUs take the AVX2 build: a build of their own stays only for an
        // end-to-end gain of 10% or more, and its gains were a micro-benchmark's.
        // SAFETY: the CPU has AVX2 (`simd::best` checked it; every AVX-512 CPU has it too).
        Simd::Avx2 => return unsafe { apply_avx2(image, size_zyx, in_plane, cfg, rng) },
        Simd::Portable => {}
    }
    apply_body(image, size_zyx, in_plane, cfg, rng);
}

/// [`apply`] compiled for AVX2: the element-wise loops (gamma's power, blur, contrast) run 8
/// lanes wide instead of SSE's 4. Same results bit for bit: the operations and their order are
/// the same, only more of them per instruction (no fused multiply-add is enabled).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn apply_avx2(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    apply_body(image, size_zyx, in_plane, cfg, rng);
}

/// The transforms, inlined into each build of [`apply`].
#[inline(always)]
pub(super) fn apply_body(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    let n: usize = size_zyx.iter().product();
    if rng.chance(cfg.noise_prob) {
        let var = rng.range(cfg.noise_variance[0], cfg.noise_variance[1]);
        noise::gaussian_noise(image, var, rng);
    }
    if rng.chance(cfg.blur_prob) {
        for c in image.chunks_exact_mut(n) {
            if rng.chance(cfg.blur_channel_prob) {
                let sigma = [0, 1, 2].map(|_| rng.range(cfg.blur_sigma[0], cfg.blur_sigma[1]));
                blur::gaussian_blur(c, size_zyx, sigma);
            }
        }
    }
    if rng.chance(cfg.brightness_prob) {
        for c in image.chunks_exact_mut(n) {
            let f = either_side_of_one(cfg.brightness_range, rng) as f32;
            brightness::brightness(c, f);
        }
    }
    if rng.chance(cfg.contrast_prob) {
        for c in image.chunks_exact_mut(n) {
            let f = either_side_of_one(cfg.contrast_range, rng);
            contrast(c, f);
        }
    }
    if rng.chance(cfg.lowres_prob) {
        for c in image.chunks_exact_mut(n) {
            if rng.chance(cfg.lowres_channel_prob) {
                let zoom = rng.range(cfg.lowres_zoom[0], cfg.lowres_zoom[1]);
                lowres::low_resolution(c, size_zyx, zoom, in_plane);
            }
        }
    }
    for (p, invert) in [(cfg.inverted_gamma_prob, true), (cfg.gamma_prob, false)] {
        if rng.chance(p) {
            for c in image.chunks_exact_mut(n) {
                let g = either_side_of_one(cfg.gamma_range, rng);
                gamma::gamma(c, g, invert);
            }
        }
    }
}

/// nnU-Net's `BGContrast` draw: below 1 half the time (when the range reaches below 1), else
/// at or above 1.
pub(super) fn either_side_of_one([lo, hi]: [f64; 2], rng: &mut Rng) -> f64 {
    if rng.chance(0.5) && lo < 1.0 {
        rng.range(lo, hi.min(1.0))
    } else {
        rng.range(lo.max(1.0), hi.max(1.0))
    }
}
