//! The cascade's second-stage input: the previous stage's segmentation of a patch as one
//! channel per foreground label (0 or 1), appended to the image channels. In training it is
//! perturbed as nnU-Net (2.8) perturbs it, so the second stage learns to correct the first
//! instead of copying it: with probability 0.4 a random binary operator (dilation, erosion,
//! opening or closing by a ball of radius uniform in 1..8 voxels) on each label with probability
//! 0.5, labels in random order, a voxel a label gains leaving every other label; then with
//! probability 0.2 the removal, for each label with probability 0.5, of one of its connected
//! components (26 neighbours) chosen at random among those covering under 15% of the patch.
//!
//! Morphology by a ball is computed from exact distance transforms (a voxel is within r of a
//! set when its distance to the set is at most r), so its cost does not grow with the radius.
//! Beyond the patch counts as background for the dilation and as foreground for the erosion,
//! as nnU-Net's operators have it (a zero-padded dilation, and the erosion as the dilation of
//! the complement).

use crate::error::Result;
use crate::geometry::components::{Components, Connectivity};
use crate::prep::derived::edt::squared_distance_to;
use crate::util::rng::Rng;

/// nnU-Net's perturbations of the previous stage's segmentation.
#[derive(Clone, Debug, PartialEq)]
pub struct CascadeAugment {
    /// Probability of the binary operators, per patch.
    pub binary_prob: f64,
    /// Range of the ball's radius, voxels.
    pub radius: [f64; 2],
    /// Probability of the component removal, per patch.
    pub component_prob: f64,
    /// A component covering this share of the patch or more is never removed.
    pub component_max_share: f64,
    /// Probability of each label's perturbation, in a patch drawn for one.
    pub label_prob: f64,
}

impl Default for CascadeAugment {
    /// nnU-Net v2's trainer: 0.4, radius 1 to 8, 0.2, 15%, each label 0.5.
    fn default() -> Self {
        CascadeAugment {
            binary_prob: 0.4,
            radius: [1.0, 8.0],
            component_prob: 0.2,
            component_max_share: 0.15,
            label_prob: 0.5,
        }
    }
}

/// The binary operators nnU-Net draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Morphology {
    /// Grow by the ball.
    Dilation,
    /// Shrink by the ball.
    Erosion,
    /// Dilation, then erosion.
    Closing,
    /// Erosion, then dilation.
    Opening,
}

/// Voxels within `r` of `mask` (dilation by a ball of radius `r` voxels).
fn dilate(mask: &[bool], shape: [usize; 3], r: f64) -> Vec<bool> {
    if !mask.iter().any(|&m| m) {
        return mask.to_vec();
    }
    let d = squared_distance_to(mask, shape, [1.0; 3]);
    d.iter().map(|&v| v <= r * r).collect()
}

/// Voxels of `mask` farther than `r` from every voxel of the patch outside it (erosion by a ball
/// of radius `r` voxels). Beyond the patch counts as inside, as in nnU-Net's erosion (the
/// dilation of the complement, zero-padded): a label reaching the patch's edge is not eaten
/// from there, which with radii up to 8 would empty most of a thin patch.
fn erode(mask: &[bool], shape: [usize; 3], r: f64) -> Vec<bool> {
    let outside: Vec<bool> = mask.iter().map(|&m| !m).collect();
    if !outside.iter().any(|&o| o) {
        return mask.to_vec();
    }
    let d = squared_distance_to(&outside, shape, [1.0; 3]);
    mask.iter().zip(&d).map(|(&m, &d)| m && d > r * r).collect()
}

/// `op` by a ball of radius `r` voxels.
pub fn morphology(mask: &[bool], shape: [usize; 3], op: Morphology, r: f64) -> Vec<bool> {
    match op {
        Morphology::Dilation => dilate(mask, shape, r),
        Morphology::Erosion => erode(mask, shape, r),
        Morphology::Closing => erode(&dilate(mask, shape, r), shape, r),
        Morphology::Opening => dilate(&erode(mask, shape, r), shape, r),
    }
}

/// Remove one connected component of `mask` chosen at random among those smaller than
/// `max_voxels`; false when there is none.
fn remove_component(
    mask: &mut [bool],
    shape: [usize; 3],
    max_voxels: f64,
    rng: &mut Rng,
) -> Result<bool> {
    let plane = shape[1] * shape[2];
    let slice = |z: usize| Ok(mask[z * plane..(z + 1) * plane].to_vec());
    let mut comps = Components::find(shape, Connectivity::Full, slice)?;
    let small: Vec<u32> = comps
        .sizes()
        .iter()
        .enumerate()
        .filter(|(_, &s)| (s as f64) < max_voxels)
        .map(|(i, _)| i as u32 + 1)
        .collect();
    if small.is_empty() {
        return Ok(false);
    }
    let chosen = small[rng.below(small.len() as u64) as usize];
    let mut labels = vec![0u32; mask.len()];
    let copy = mask.to_vec();
    comps.relabel(
        |z| Ok(copy[z * plane..(z + 1) * plane].to_vec()),
        |z, l| {
            labels[z * plane..(z + 1) * plane].copy_from_slice(l);
            Ok(())
        },
    )?;
    for (m, l) in mask.iter_mut().zip(&labels) {
        if *l == chosen {
            *m = false;
        }
    }
    Ok(true)
}

/// Labels in random order (a Fisher-Yates shuffle of 0..n).
fn shuffled(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// The previous stage's segmentation `prev` (label-file values, a (z, y, x) patch of `shape`)
/// as one 0/1 channel per value of `labels` (the foreground labels, in channel order),
/// perturbed by `augment` when given, channels one after the other.
pub fn previous_stage_channels(
    prev: &[u16],
    labels: &[u16],
    shape: [usize; 3],
    augment: Option<(&CascadeAugment, &mut Rng)>,
) -> Result<Vec<f32>> {
    let mut masks: Vec<Vec<bool>> = labels
        .iter()
        .map(|&l| prev.iter().map(|&v| v == l).collect())
        .collect();
    if let Some((cfg, rng)) = augment {
        if rng.chance(cfg.binary_prob) {
            for c in shuffled(masks.len(), rng) {
                if !rng.chance(cfg.label_prob) {
                    continue;
                }
                let op = [
                    Morphology::Dilation,
                    Morphology::Erosion,
                    Morphology::Closing,
                    Morphology::Opening,
                ][rng.below(4) as usize];
                let r = rng.range(cfg.radius[0], cfg.radius[1]);
                let result = morphology(&masks[c], shape, op, r);
                // A voxel this label gained leaves the others: still one label a voxel.
                let gained: Vec<bool> = result
                    .iter()
                    .zip(&masks[c])
                    .map(|(&now, &was)| now && !was)
                    .collect();
                for (o, other) in masks.iter_mut().enumerate() {
                    if o != c {
                        other.iter_mut().zip(&gained).for_each(|(v, &g)| *v &= !g);
                    }
                }
                masks[c] = result;
            }
        }
        if rng.chance(cfg.component_prob) {
            let max_voxels = cfg.component_max_share * prev.len() as f64;
            for c in shuffled(masks.len(), rng) {
                if rng.chance(cfg.label_prob) && masks[c].iter().any(|&m| m) {
                    remove_component(&mut masks[c], shape, max_voxels, rng)?;
                }
            }
        }
    }
    Ok(masks
        .iter()
        .flat_map(|m| m.iter().map(|&b| b as u8 as f32))
        .collect())
}

/// The previous stage's channels of a cascade's second stage.
#[derive(Clone, Debug, PartialEq)]
pub struct CascadeInput {
    /// How many of the image channels, at the end, are the previous stage's (one a label).
    pub channels: usize,
    /// Their perturbations; `None`: only taken back to 0/1.
    pub augment: Option<CascadeAugment>,
}

/// The previous stage's channels of one patch (`tail`: `channels` patches of `n` voxels),
/// interpolated by the spatial transform, taken back to one label a voxel (the largest of those
/// at 0.5 or more) and perturbed by `augment`.
pub(crate) fn previous_stage(
    tail: &mut [f32],
    patch: [usize; 3],
    augment: Option<&CascadeAugment>,
    rng: &mut Rng,
) -> Result<()> {
    let n: usize = patch.iter().product();
    let k = tail.len() / n.max(1);
    let mut prev = vec![0u16; n];
    for (v, p) in prev.iter_mut().enumerate() {
        let mut best = 0.5f32;
        for j in 0..k {
            if tail[j * n + v] >= best {
                best = tail[j * n + v];
                *p = j as u16 + 1;
            }
        }
    }
    let labels: Vec<u16> = (1..=k as u16).collect();
    let channels = previous_stage_channels(&prev, &labels, patch, augment.map(|a| (a, rng)))?;
    tail.copy_from_slice(&channels);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Morphology by brute force: every voxel against every voxel (beyond the patch: background
    /// to the dilation, foreground to the erosion).
    fn brute(mask: &[bool], shape: [usize; 3], op: Morphology, r: f64) -> Vec<bool> {
        let [_, ny, nx] = shape;
        let at = |i: usize| [i / (ny * nx), (i / nx) % ny, i % nx];
        let near = |a: [usize; 3], b: [i64; 3]| {
            let d: f64 = (0..3)
                .map(|k| (a[k] as i64 - b[k]) as f64)
                .map(|v| v * v)
                .sum();
            d <= r * r
        };
        let dil = |m: &[bool]| -> Vec<bool> {
            (0..m.len())
                .map(|i| (0..m.len()).any(|j| m[j] && near(at(i), at(j).map(|v| v as i64))))
                .collect()
        };
        let ero = |m: &[bool]| -> Vec<bool> {
            let ri = r.ceil() as i64 + 1;
            (0..m.len())
                .map(|i| {
                    let p = at(i);
                    m[i] && (-ri..=ri).all(|dz| {
                        (-ri..=ri).all(|dy| {
                            (-ri..=ri).all(|dx| {
                                let q = [p[0] as i64 + dz, p[1] as i64 + dy, p[2] as i64 + dx];
                                if !near(p, q) {
                                    return true;
                                }
                                let inside = (0..3).all(|k| q[k] >= 0 && q[k] < shape[k] as i64);
                                !inside
                                    || m[(q[0] as usize * ny + q[1] as usize) * nx + q[2] as usize]
                            })
                        })
                    })
                })
                .collect()
        };
        match op {
            Morphology::Dilation => dil(mask),
            Morphology::Erosion => ero(mask),
            Morphology::Closing => ero(&dil(mask)),
            Morphology::Opening => dil(&ero(mask)),
        }
    }

    fn blob(shape: [usize; 3], seed: u64) -> Vec<bool> {
        let mut rng = Rng::new(seed);
        let n: usize = shape.iter().product();
        let mut m = vec![false; n];
        // A few boxes, some touching the patch's edge.
        for _ in 0..4 {
            let lo: Vec<usize> = shape
                .iter()
                .map(|&s| rng.below(s as u64) as usize)
                .collect();
            let hi: Vec<usize> = (0..3)
                .map(|k| (lo[k] + 1 + rng.below(5) as usize).min(shape[k]))
                .collect();
            for z in lo[0]..hi[0] {
                for y in lo[1]..hi[1] {
                    for x in lo[2]..hi[2] {
                        m[(z * shape[1] + y) * shape[2] + x] = true;
                    }
                }
            }
        }
        m
    }

    #[test]
    fn morphology_by_distance_equals_the_ball_by_brute_force() {
        let shape = [7, 9, 8];
        for seed in 0..4 {
            let m = blob(shape, seed);
            for op in [
                Morphology::Dilation,
                Morphology::Erosion,
                Morphology::Closing,
                Morphology::Opening,
            ] {
                for r in [1.0, 1.5, 2.3] {
                    assert_eq!(
                        morphology(&m, shape, op, r),
                        brute(&m, shape, op, r),
                        "seed {seed} {op:?} r {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn erosion_does_not_eat_a_label_from_the_patch_edge() {
        // A label filling the patch's first 6 slices: nnU-Net's erosion (the zero-padded
        // dilation of the complement) eats it only from its inner face.
        let shape = [16, 8, 8];
        let m: Vec<bool> = (0..16 * 64).map(|i| i / 64 < 6).collect();
        let e = morphology(&m, shape, Morphology::Erosion, 3.0);
        let want: Vec<bool> = (0..16 * 64).map(|i| i / 64 < 3).collect();
        assert_eq!(e, want);
        // A patch of the label alone is left whole; opening it too.
        let full = vec![true; 16 * 64];
        assert_eq!(morphology(&full, shape, Morphology::Erosion, 8.0), full);
        assert_eq!(morphology(&full, shape, Morphology::Opening, 8.0), full);
    }

    #[test]
    fn channels_are_one_hot_and_stay_one_label_a_voxel() {
        let shape = [8, 10, 10];
        let n: usize = shape.iter().product();
        let prev: Vec<u16> = (0..n).map(|i| ((i / 37) % 3) as u16).collect();
        let plain = previous_stage_channels(&prev, &[1, 2], shape, None).unwrap();
        assert_eq!(plain.len(), 2 * n);
        for i in 0..n {
            assert_eq!(plain[i], (prev[i] == 1) as u8 as f32);
            assert_eq!(plain[n + i], (prev[i] == 2) as u8 as f32);
        }
        let cfg = CascadeAugment {
            binary_prob: 1.0,
            component_prob: 1.0,
            label_prob: 1.0,
            ..Default::default()
        };
        let mut changed = false;
        for seed in 0..6 {
            let mut rng = Rng::new(seed);
            let a = previous_stage_channels(&prev, &[1, 2], shape, Some((&cfg, &mut rng))).unwrap();
            assert!((0..n).all(|i| a[i] + a[n + i] <= 1.0), "seed {seed}");
            changed |= a != plain;
            // The same draws give the same channels.
            let mut again = Rng::new(seed);
            let b =
                previous_stage_channels(&prev, &[1, 2], shape, Some((&cfg, &mut again))).unwrap();
            assert_eq!(a, b);
        }
        assert!(changed);
    }

    #[test]
    fn only_components_under_the_share_are_removed() {
        let shape = [4, 10, 10];
        let n: usize = shape.iter().product();
        // One big slab (60% of the patch) and one small cube apart from it.
        let mut m = vec![false; n];
        for (i, v) in m.iter_mut().enumerate() {
            let (z, y, x) = (i / 100, (i / 10) % 10, i % 10);
            *v = y < 6 || (z < 2 && y >= 8 && x >= 8);
        }
        let mut rng = Rng::new(1);
        let mut a = m.clone();
        assert!(remove_component(&mut a, shape, 0.15 * n as f64, &mut rng).unwrap());
        let removed: Vec<usize> = (0..n).filter(|&i| m[i] && !a[i]).collect();
        assert_eq!(removed.len(), 8, "the small cube only");
        let mut b: Vec<bool> = (0..n).map(|i| i / 10 % 10 < 6).collect();
        assert!(!remove_component(&mut b, shape, 0.15 * n as f64, &mut rng).unwrap());
    }
}
