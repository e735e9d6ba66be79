//! Data augmentation of one patch after it is read: nnU-Net's intensity transforms
//! ([`intensity`](crate::train::intensity)), then mirroring (and optional quarter turns).
//! The spatial part (rotation, scaling, elastic deformation) happens while the patch is read,
//! in [`spatial`](crate::train::spatial), so that each array is interpolated once.
//!
//! Mirroring and turns only move voxels, on image and label alike; intensity transforms touch
//! the image only. Every draw comes from the `Rng` passed in, which the loader derives from
//! `(seed, step, sample)`, so augmentation is reproducible and resumable.

pub use crate::format::training::augmentation::AugmentConfig;
use crate::train::intensity;
use crate::util::rng::Rng;

/// Augment one patch in place (after its spatial transform). `image` holds one or more
/// channels of `size_zyx` voxels, C order (c, z, y, x), and `label` one, C order (z, y, x);
/// pass an empty `label` for an image-only patch. Mirrors and turns move every channel and the
/// label together; intensity draws are per channel where nnU-Net's are.
///
/// Panics if a buffer has the wrong length (a caller bug, not user input).
pub fn augment(
    image: &mut [f32],
    label: &mut [u16],
    size_zyx: [usize; 3],
    cfg: &AugmentConfig,
    rng: &mut Rng,
) -> Moves {
    let n: usize = size_zyx.iter().product();
    assert!(
        n > 0 && !image.is_empty() && image.len().is_multiple_of(n),
        "image buffer does not match the patch size"
    );
    assert!(
        label.is_empty() || label.len() == n,
        "label buffer does not match the patch size"
    );
    let in_plane = cfg.spatial.in_plane_for(size_zyx);
    intensity::apply(image, size_zyx, in_plane, &cfg.intensity, rng);
    let moves = draw_moves(size_zyx, cfg, rng);
    moves.apply(image, size_zyx);
    moves.apply(label, size_zyx);
    moves
}

/// The mirrorings and quarter turns of one patch. The loader draws them from a stream of
/// their own before the patch is read, so that the read writes it mirrored
/// ([`crate::train::spatial::TransformedReader::read_mirrored`]); then
/// [`augment_mirrored`] does the rest.
pub fn draw_moves(size_zyx: [usize; 3], cfg: &AugmentConfig, rng: &mut Rng) -> Moves {
    // Drawn whatever is applied, so one setting does not shift the stream of the others.
    let flips = [0, 1, 2].map(|_| rng.chance(cfg.mirror_prob));
    let quarter_turns = rng.below(4) as usize;
    Moves {
        flips,
        quarter_turns: match cfg.rot90 {
            false => 0,
            true if size_zyx[1] == size_zyx[2] => quarter_turns,
            true => quarter_turns & 2, // 0 or 180 degrees
        },
    }
}

/// [`augment`] of a patch read already mirrored by `moves.flips`: the intensity transforms
/// (on all but the last `fixed` channels: a cascade's previous-stage segmentation), then
/// `moves`' quarter turns. Mirroring before the intensity transforms instead of after
/// changes no distribution (noise is drawn per voxel alike, blur and the statistics are
/// symmetric); it saves a pass over the patch (a twentieth of the augmentation's time).
pub fn augment_mirrored(
    image: &mut [f32],
    label: &mut [u16],
    size_zyx: [usize; 3],
    cfg: &AugmentConfig,
    rng: &mut Rng,
    moves: &Moves,
    fixed: usize,
) {
    let in_plane = cfg.spatial.in_plane_for(size_zyx);
    let n: usize = size_zyx.iter().product();
    let transformed = image.len() - (fixed * n).min(image.len());
    intensity::apply(
        &mut image[..transformed],
        size_zyx,
        in_plane,
        &cfg.intensity,
        rng,
    );
    let turns = Moves {
        flips: [false; 3],
        ..*moves
    };
    turns.apply(image, size_zyx);
    turns.apply(label, size_zyx);
}

/// The mirrorings and quarter turns drawn for one patch, to move other arrays of the same patch
/// (distance maps, skeletons) the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moves {
    /// Mirror along z, y, x.
    pub flips: [bool; 3],
    /// Quarter turns in the (y, x) plane.
    pub quarter_turns: usize,
}

impl Moves {
    /// Move every patch of `data` (any number of `size_zyx` patches one after the other; empty
    /// is nothing to move).
    pub fn apply<T: Copy>(&self, data: &mut [T], size_zyx: [usize; 3]) {
        let n: usize = size_zyx.iter().product();
        if data.is_empty() || n == 0 {
            return;
        }
        for patch in data.chunks_exact_mut(n) {
            flip_axes(patch, size_zyx, self.flips);
            if self.quarter_turns != 0 {
                rotate_yx(patch, size_zyx, self.quarter_turns);
            }
        }
    }
}

pub use crate::geometry::mirror as flip_axes;

/// Mirror `data` (a (z, y, x) block of `size_zyx`) along one axis.
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
        2 => flip_axes(data, size_zyx, [false, true, true]),
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
    use crate::train::intensity::IntensityConfig;
    use crate::train::spatial::SpatialConfig;

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
    fn flips_in_one_pass_equal_one_axis_at_a_time() {
        for s in [[3, 4, 5], [4, 3, 6], [1, 1, 7], [2, 5, 1]] {
            for bits in 0..8 {
                let flips = [bits & 4 != 0, bits & 2 != 0, bits & 1 != 0];
                let (mut a, _) = ramp(s.iter().product());
                let mut b = a.clone();
                flip_axes(&mut a, s, flips);
                for (axis, &f) in flips.iter().enumerate() {
                    if f {
                        flip_axis(&mut b, s, axis);
                    }
                }
                assert_eq!(a, b, "{s:?} {flips:?}");
            }
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
            rot90: true,
            intensity: IntensityConfig::none(),
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
    fn intensity_changes_the_image_only() {
        let n: usize = SIZE.iter().product();
        let (img, lab) = ramp(n);
        let cfg = AugmentConfig {
            mirror_prob: 0.0,
            intensity: IntensityConfig {
                brightness_prob: 1.0,
                gamma_prob: 1.0,
                noise_prob: 1.0,
                ..IntensityConfig::none()
            },
            ..AugmentConfig::none()
        };
        for seed in 0..20 {
            let (mut i2, mut l2) = (img.clone(), lab.clone());
            augment(&mut i2, &mut l2, SIZE, &cfg, &mut Rng::new(seed));
            assert_eq!(l2, lab);
            assert_ne!(i2, img);
        }
    }

    #[test]
    fn invalid_configurations_are_errors() {
        assert!(AugmentConfig::default().validate().is_ok());
        assert!(AugmentConfig::none().validate().is_ok());
        let bad = [
            AugmentConfig {
                mirror_prob: 1.5,
                ..AugmentConfig::none()
            },
            AugmentConfig {
                spatial: SpatialConfig {
                    rotation_prob: -0.1,
                    ..SpatialConfig::default()
                },
                ..AugmentConfig::none()
            },
            AugmentConfig {
                intensity: IntensityConfig {
                    noise_variance: [0.1, 0.0],
                    ..IntensityConfig::default()
                },
                ..AugmentConfig::none()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
