//! Data augmentation of one patch: flips, 90-degree in-plane rotations, intensity scale and
//! shift, Gaussian noise.
//!
//! Geometric transforms are applied to image and label alike and only move voxels (so label
//! values stay those of the input, and no interpolation blurs thin vessels); intensity
//! transforms touch the image only. Every draw comes from the `Rng` passed in, which the loader
//! derives from `(seed, step, sample)`, so augmentation is reproducible and resumable.

use crate::error::{Error, Result};
use crate::train::rng::Rng;

#[derive(Clone, Debug, PartialEq)]
pub struct AugmentConfig {
    /// Probability of flipping each axis (z, y, x independently).
    pub flip_prob: f64,
    /// Rotate by k * 90 degrees in the (y, x) plane, k uniform in 0..4, when the patch is
    /// square in-plane; by 0 or 180 degrees otherwise (the only shape-preserving angles).
    pub rot90: bool,
    /// Multiplicative intensity factor range, applied with `scale_prob`.
    pub scale: (f32, f32),
    pub scale_prob: f64,
    /// Additive intensity shift drawn from [-shift, shift], applied with `shift_prob`.
    pub shift: f32,
    pub shift_prob: f64,
    /// Noise standard deviation range, applied with `noise_prob`.
    pub noise_std: (f32, f32),
    pub noise_prob: f64,
}

impl AugmentConfig {
    /// No augmentation at all: patches come out exactly as read.
    pub fn none() -> Self {
        AugmentConfig {
            flip_prob: 0.0,
            rot90: false,
            scale: (1.0, 1.0),
            scale_prob: 0.0,
            shift: 0.0,
            shift_prob: 0.0,
            noise_std: (0.0, 0.0),
            noise_prob: 0.0,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let probs = [
            ("flip", self.flip_prob),
            ("scale", self.scale_prob),
            ("shift", self.shift_prob),
            ("noise", self.noise_prob),
        ];
        for (name, p) in probs {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::Config(format!(
                    "{name} augmentation probability {p} is not between 0 and 1"
                )));
            }
        }
        let (lo, hi) = self.scale;
        if !(lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi) {
            return Err(Error::Config(format!(
                "intensity scale range ({lo}, {hi}) must be positive and ordered"
            )));
        }
        if !(self.shift.is_finite() && self.shift >= 0.0) {
            return Err(Error::Config(format!(
                "intensity shift {} must be finite and not negative",
                self.shift
            )));
        }
        let (lo, hi) = self.noise_std;
        if !(lo.is_finite() && hi.is_finite() && 0.0 <= lo && lo <= hi) {
            return Err(Error::Config(format!(
                "noise standard deviation range ({lo}, {hi}) must be non-negative and ordered"
            )));
        }
        Ok(())
    }
}

impl Default for AugmentConfig {
    /// nnU-Net-like: mirror each axis half the time, rotate, and mild intensity changes on a
    /// minority of patches (nnU-Net: brightness 0.75..1.25 at 15 %; noise at 10 %, where nnU-Net draws a variance in
    /// 0..0.1 we draw the standard deviation in 0..0.1, milder).
    fn default() -> Self {
        AugmentConfig {
            flip_prob: 0.5,
            rot90: true,
            scale: (0.75, 1.25),
            scale_prob: 0.15,
            shift: 0.1,
            shift_prob: 0.15,
            noise_std: (0.0, 0.1),
            noise_prob: 0.1,
        }
    }
}

/// Augment one patch in place. `image` holds one or more channels of `size_zyx` voxels, C order
/// (c, z, y, x), and `label` one, C order (z, y, x); pass an empty `label` for an image-only
/// patch. Every channel gets the same flips, turns, scale and shift (one draw each, so a
/// one-channel patch draws what it always did); noise is drawn per voxel.
///
/// Panics if a buffer has the wrong length (a caller bug, not user input).
pub fn augment(
    image: &mut [f32],
    label: &mut [u16],
    size_zyx: [usize; 3],
    cfg: &AugmentConfig,
    rng: &mut Rng,
) {
    let n: usize = size_zyx.iter().product();
    assert!(
        n > 0 && !image.is_empty() && image.len().is_multiple_of(n),
        "image buffer does not match the patch size"
    );
    assert!(
        label.is_empty() || label.len() == n,
        "label buffer does not match the patch size"
    );
    // Draws happen in a fixed order, whatever is applied, so one setting does not shift the
    // random stream of the others.
    let flips = [0, 1, 2].map(|_| rng.chance(cfg.flip_prob));
    let quarter_turns = rng.below(4) as usize;
    for (axis, &flip) in flips.iter().enumerate() {
        if flip {
            image
                .chunks_exact_mut(n)
                .for_each(|c| flip_axis(c, size_zyx, axis));
            flip_axis(label, size_zyx, axis);
        }
    }
    if cfg.rot90 {
        let k = if size_zyx[1] == size_zyx[2] {
            quarter_turns
        } else {
            quarter_turns & 2 // 0 or 180 degrees
        };
        image
            .chunks_exact_mut(n)
            .for_each(|c| rotate_yx(c, size_zyx, k));
        rotate_yx(label, size_zyx, k);
    }

    let scale = rng.chance(cfg.scale_prob);
    let factor = rng.range(cfg.scale.0 as f64, cfg.scale.1 as f64) as f32;
    if scale {
        image.iter_mut().for_each(|v| *v *= factor);
    }
    let shift = rng.chance(cfg.shift_prob);
    let offset = rng.range(-cfg.shift as f64, cfg.shift as f64) as f32;
    if shift {
        image.iter_mut().for_each(|v| *v += offset);
    }
    let noise = rng.chance(cfg.noise_prob);
    let std = rng.range(cfg.noise_std.0 as f64, cfg.noise_std.1 as f64);
    if noise && std > 0.0 {
        image
            .iter_mut()
            .for_each(|v| *v += (std * rng.normal()) as f32);
    }
}

/// Reverse the order of voxels along `axis` (0 = z, 1 = y, 2 = x).
pub fn flip_axis<T>(data: &mut [T], size_zyx: [usize; 3], axis: usize) {
    if data.is_empty() {
        return;
    }
    let [nz, ny, nx] = size_zyx;
    match axis {
        0 => {
            let plane = ny * nx;
            for z in 0..nz / 2 {
                let (a, b) = data.split_at_mut((nz - 1 - z) * plane);
                a[z * plane..(z + 1) * plane].swap_with_slice(&mut b[..plane]);
            }
        }
        1 => {
            for slab in data.chunks_exact_mut(ny * nx) {
                for y in 0..ny / 2 {
                    let (a, b) = slab.split_at_mut((ny - 1 - y) * nx);
                    a[y * nx..(y + 1) * nx].swap_with_slice(&mut b[..nx]);
                }
            }
        }
        _ => data.chunks_exact_mut(nx).for_each(|row| row.reverse()),
    }
}

/// Rotate every (y, x) plane by `k` quarter turns: one turn maps voxel (y, x) to
/// (x, n - 1 - y). Quarter turns need a square plane; for other planes only even `k`
/// (180 degrees) is applied and odd `k` is ignored.
pub fn rotate_yx<T>(data: &mut [T], size_zyx: [usize; 3], k: usize) {
    let [_, ny, nx] = size_zyx;
    match k % 4 {
        0 => {}
        2 => {
            flip_axis(data, size_zyx, 1);
            flip_axis(data, size_zyx, 2);
        }
        turns if ny == nx && !data.is_empty() => {
            for plane in data.chunks_exact_mut(ny * nx) {
                for _ in 0..turns {
                    quarter_turn_square(plane, nx);
                }
            }
        }
        _ => {}
    }
}

/// One quarter turn of a square n x n plane in place, moving 4-cycles of voxels:
/// (y, x) -> (x, n-1-y) -> (n-1-y, n-1-x) -> (n-1-x, y) -> (y, x).
fn quarter_turn_square<T>(p: &mut [T], n: usize) {
    let at = |y: usize, x: usize| y * n + x;
    for y in 0..n / 2 {
        for x in y..n - 1 - y {
            let (a, b, c, d) = (
                at(y, x),
                at(x, n - 1 - y),
                at(n - 1 - y, n - 1 - x),
                at(n - 1 - x, y),
            );
            // The value at a moves to b, b's to c, c's to d, d's to a: three swaps carry
            // a's value along d, c, b while dropping each one's value into place.
            p.swap(a, d);
            p.swap(d, c);
            p.swap(c, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: [usize; 3] = [3, 5, 5];

    fn ramp(n: usize) -> (Vec<f32>, Vec<u16>) {
        let img = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let lab = (0..n).map(|i| ((i * 7) % 4) as u16).collect();
        (img, lab)
    }

    fn idx(s: [usize; 3], z: usize, y: usize, x: usize) -> usize {
        (z * s[1] + y) * s[2] + x
    }

    #[test]
    fn quarter_turn_matches_the_naive_mapping_and_four_are_identity() {
        for s in [[2, 4, 4], [1, 5, 5], [3, 1, 1], [2, 6, 6]] {
            let n: usize = s.iter().product();
            let (img, _) = ramp(n);
            let mut one = img.clone();
            rotate_yx(&mut one, s, 1);
            for z in 0..s[0] {
                for y in 0..s[1] {
                    for x in 0..s[2] {
                        let to = idx(s, z, x, s[1] - 1 - y);
                        assert_eq!(one[to], img[idx(s, z, y, x)], "{s:?} {z} {y} {x}");
                    }
                }
            }
            let mut four = img.clone();
            for _ in 0..4 {
                rotate_yx(&mut four, s, 1);
            }
            assert_eq!(four, img);
            let mut two = img.clone();
            rotate_yx(&mut two, s, 1);
            rotate_yx(&mut two, s, 1);
            let mut half = img.clone();
            rotate_yx(&mut half, s, 2);
            assert_eq!(two, half);
        }
    }

    #[test]
    fn flips_match_the_naive_mapping_and_undo_themselves() {
        let s = [3, 4, 5];
        let n: usize = s.iter().product();
        let (img, _) = ramp(n);
        for axis in 0..3 {
            let mut f = img.clone();
            flip_axis(&mut f, s, axis);
            for z in 0..s[0] {
                for y in 0..s[1] {
                    for x in 0..s[2] {
                        let mut p = [z, y, x];
                        p[axis] = s[axis] - 1 - p[axis];
                        assert_eq!(f[idx(s, p[0], p[1], p[2])], img[idx(s, z, y, x)]);
                    }
                }
            }
            flip_axis(&mut f, s, axis);
            assert_eq!(f, img);
        }
    }

    #[test]
    fn none_changes_nothing() {
        let n: usize = SIZE.iter().product();
        let (img, lab) = ramp(n);
        for seed in 0..50 {
            let (mut i2, mut l2) = (img.clone(), lab.clone());
            augment(
                &mut i2,
                &mut l2,
                SIZE,
                &AugmentConfig::none(),
                &mut Rng::new(seed),
            );
            assert_eq!(i2, img);
            assert_eq!(l2, lab);
        }
    }

    #[test]
    fn geometry_permutes_image_and_label_together() {
        // Intensity off: every output is a permutation of the input, the same one for image
        // and label (checked by carrying each voxel's index in the image).
        let cfg = AugmentConfig {
            scale_prob: 0.0,
            shift_prob: 0.0,
            noise_prob: 0.0,
            ..AugmentConfig::default()
        };
        for s in [SIZE, [4, 3, 6]] {
            let n: usize = s.iter().product();
            let img: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let lab: Vec<u16> = (0..n).map(|i| (i % 5) as u16).collect();
            let mut changed = 0;
            for seed in 0..64 {
                let (mut i2, mut l2) = (img.clone(), lab.clone());
                augment(&mut i2, &mut l2, s, &cfg, &mut Rng::new(seed));
                changed += (i2 != img) as usize;
                let mut sorted = i2.clone();
                sorted.sort_by(f32::total_cmp);
                assert_eq!(sorted, img);
                for (v, l) in i2.iter().zip(&l2) {
                    assert_eq!(lab[*v as usize], *l);
                }
            }
            assert!(changed > 50, "{changed}");
        }
    }

    #[test]
    fn intensity_changes_the_image_only_within_bounds() {
        let n: usize = SIZE.iter().product();
        let img = vec![1.0f32; n];
        let lab: Vec<u16> = (0..n).map(|i| (i % 3) as u16).collect();
        let cfg = AugmentConfig {
            flip_prob: 0.0,
            rot90: false,
            scale_prob: 1.0,
            shift_prob: 1.0,
            noise_prob: 0.0,
            ..AugmentConfig::default()
        };
        for seed in 0..100 {
            let (mut i2, mut l2) = (img.clone(), lab.clone());
            augment(&mut i2, &mut l2, SIZE, &cfg, &mut Rng::new(seed));
            assert_eq!(l2, lab);
            // 1 * scale + shift, the same for every voxel.
            assert!(i2.iter().all(|&v| v == i2[0]));
            assert!((0.65..=1.35).contains(&i2[0]), "{}", i2[0]);
        }
        let cfg = AugmentConfig {
            noise_prob: 1.0,
            noise_std: (0.1, 0.1),
            ..AugmentConfig::none()
        };
        let big = [4, 32, 32];
        let n: usize = big.iter().product();
        let mut i2 = vec![0.0f32; n];
        augment(&mut i2, &mut [], big, &cfg, &mut Rng::new(3));
        let mean = i2.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = i2.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.1).abs() < 0.005, "{}", var.sqrt());
    }

    #[test]
    fn invalid_configurations_are_errors() {
        assert!(AugmentConfig::default().validate().is_ok());
        assert!(AugmentConfig::none().validate().is_ok());
        let bad = [
            AugmentConfig {
                flip_prob: 1.5,
                ..AugmentConfig::none()
            },
            AugmentConfig {
                scale: (1.2, 0.8),
                ..AugmentConfig::none()
            },
            AugmentConfig {
                noise_std: (-0.1, 0.1),
                ..AugmentConfig::none()
            },
            AugmentConfig {
                shift: f32::NAN,
                ..AugmentConfig::none()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
