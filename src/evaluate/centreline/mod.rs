//! Centreline Dice (clDice, Shit et al., CVPR 2021): Dice barely moves when a thin vessel
//! breaks, clDice does. Topology precision is the share of the prediction's skeleton inside the
//! reference, topology sensitivity the share of the reference's skeleton inside the
//! prediction; clDice is their harmonic mean.
//!
//! Both skeletons come from [`crate::prep::derived::chunked_skeleton`], the thinning the cache
//! stores, block by block with a halo, so a volume of any size is measured in the memory of a
//! few blocks; the labels are read through [`LabelBoxes`] (a cache entry, or a
//! [`scratch::ScratchLabels`] file filled while a prediction streams by).

pub mod scratch;

use std::sync::Mutex;

use rayon::prelude::*;

use crate::error::Result;
use crate::prep::derived::{block_bounds, chunked_skeleton, LabelBoxes};

/// The blocks skeletons are thinned in (voxels, z y x). The halo (8 voxels a side, up to 32 for
/// thick structures) makes a block's region at most 128 voxels a side: 2 M voxels, about 12 MB
/// of working memory per thread. 128-voxel blocks measured no faster (validation of the
/// bundled data, 2 cores).
pub const BLOCK: [usize; 3] = [64, 64, 64];

/// Skeleton voxel counts of one class in one case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CentrelineCounts {
    /// Voxels of the prediction's skeleton.
    pub pred_skeleton: u64,
    /// ... of them inside the reference.
    pub pred_skeleton_in_ref: u64,
    /// Voxels of the reference's skeleton.
    pub ref_skeleton: u64,
    /// ... of them inside the prediction.
    pub ref_skeleton_in_pred: u64,
}

impl CentrelineCounts {
    fn add(&mut self, o: CentrelineCounts) {
        self.pred_skeleton += o.pred_skeleton;
        self.pred_skeleton_in_ref += o.pred_skeleton_in_ref;
        self.ref_skeleton += o.ref_skeleton;
        self.ref_skeleton_in_pred += o.ref_skeleton_in_pred;
    }

    /// Topology precision, |S_pred ∩ V_ref| / |S_pred| (NaN without a predicted skeleton).
    pub fn precision(&self) -> f64 {
        ratio(self.pred_skeleton_in_ref, self.pred_skeleton)
    }

    /// Topology sensitivity, |S_ref ∩ V_pred| / |S_ref| (NaN without a reference skeleton).
    pub fn sensitivity(&self) -> f64 {
        ratio(self.ref_skeleton_in_pred, self.ref_skeleton)
    }

    /// clDice: NaN when the class is in neither volume (thinning never removes a component, so
    /// a class present has a skeleton), 0 when in one only, as Dice.
    pub fn cldice(&self) -> f64 {
        match (self.pred_skeleton, self.ref_skeleton) {
            (0, 0) => f64::NAN,
            (0, _) | (_, 0) => 0.0,
            _ => {
                let (p, s) = (self.precision(), self.sensitivity());
                if p + s == 0.0 {
                    0.0
                } else {
                    2.0 * p * s / (p + s)
                }
            }
        }
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        f64::NAN
    } else {
        n as f64 / d as f64
    }
}

/// One class of a label volume as a 0/1 mask (`member` says which label values are in it: one
/// value, or an nnU-Net region of several).
pub struct ClassMask<'a> {
    /// The labels.
    pub labels: &'a dyn LabelBoxes,
    /// Whether a label value belongs to the class.
    pub member: &'a (dyn Fn(u16) -> bool + Sync),
}

impl LabelBoxes for ClassMask<'_> {
    fn read(&self, lo: [usize; 3], hi: [usize; 3]) -> Result<Vec<u16>> {
        let mut v = self.labels.read(lo, hi)?;
        for x in &mut v {
            *x = u16::from((self.member)(*x));
        }
        Ok(v)
    }
}

/// Count the skeletons of two masks of `shape` (non-zero: in the class) against each other,
/// block by block in parallel.
pub fn centreline_counts(
    pred: &dyn LabelBoxes,
    reference: &dyn LabelBoxes,
    shape: [usize; 3],
) -> Result<CentrelineCounts> {
    let block = [0, 1, 2].map(|a| BLOCK[a].min(shape[a]).max(1));
    let blocks: usize = (0..3).map(|a| shape[a].div_ceil(block[a])).product();
    let total = Mutex::new(CentrelineCounts::default());
    (0..blocks)
        .into_par_iter()
        .try_for_each(|i| -> Result<()> {
            let (_, lo, hi) = block_bounds(shape, block, i);
            let (p, r) = (pred.read(lo, hi)?, reference.read(lo, hi)?);
            let mut c = CentrelineCounts::default();
            // A block empty on one side has no skeleton there: skip its thinning.
            if p.iter().any(|&v| v != 0) {
                let (sp, _) = chunked_skeleton(pred, shape, lo, hi)?;
                for (&s, &r) in sp.iter().zip(&r) {
                    if s != 0 {
                        c.pred_skeleton += 1;
                        c.pred_skeleton_in_ref += u64::from(r != 0);
                    }
                }
            }
            if r.iter().any(|&v| v != 0) {
                let (sr, _) = chunked_skeleton(reference, shape, lo, hi)?;
                for (&s, &p) in sr.iter().zip(&p) {
                    if s != 0 {
                        c.ref_skeleton += 1;
                        c.ref_skeleton_in_pred += u64::from(p != 0);
                    }
                }
            }
            total.lock().unwrap_or_else(|e| e.into_inner()).add(c);
            Ok(())
        })?;
    Ok(total.into_inner().unwrap_or_else(|e| e.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prep::derived::LabelVolume;

    /// A tube along x at (y, z) = (c, c), `r` voxels around its axis (Chebyshev).
    fn tube(shape: [usize; 3], c: usize, r: usize, x: std::ops::Range<usize>) -> Vec<u16> {
        let mut v = vec![0u16; shape.iter().product()];
        for z in c - r..=c + r {
            for y in c - r..=c + r {
                for xx in x.clone() {
                    v[(z * shape[1] + y) * shape[2] + xx] = 1;
                }
            }
        }
        v
    }

    fn counts(p: &[u16], r: &[u16], shape: [usize; 3]) -> CentrelineCounts {
        let (p, r) = (
            LabelVolume { voxels: p, shape },
            LabelVolume { voxels: r, shape },
        );
        centreline_counts(&p, &r, shape).unwrap()
    }

    #[test]
    fn identical_masks_score_one_and_a_break_costs_sensitivity() {
        let shape = [9, 9, 150];
        let t = tube(shape, 4, 1, 0..150);
        let same = counts(&t, &t, shape);
        assert!(same.pred_skeleton > 100, "{same:?}");
        assert_eq!(same.cldice(), 1.0);
        // A 10-voxel gap: Dice drops under 7 %, the reference's skeleton loses its part there.
        let mut broken = t.clone();
        let gap = tube(shape, 4, 1, 70..80);
        for (b, g) in broken.iter_mut().zip(&gap) {
            if *g != 0 {
                *b = 0;
            }
        }
        let c = counts(&broken, &t, shape);
        assert_eq!(c.precision(), 1.0);
        assert!(c.sensitivity() < 0.95 && c.sensitivity() > 0.85, "{c:?}");
        assert!(c.cldice() < 1.0);
        // Neither, one side only.
        let empty = vec![0u16; t.len()];
        assert!(counts(&empty, &empty, shape).cldice().is_nan());
        assert_eq!(counts(&t, &empty, shape).cldice(), 0.0);
    }

    #[test]
    fn blocks_agree_with_one_whole_block() {
        // Wider than a block in x: the counts of the blocked pass equal those of thinning the
        // volume at once (the halo covers a tube three voxels across).
        let shape = [9, 9, 150];
        let a = tube(shape, 4, 1, 5..140);
        let b = tube(shape, 4, 1, 20..150);
        let c = counts(&a, &b, shape);
        let whole = |m: &[u16]| {
            crate::prep::derived::thinning::skeletonize(
                &m.iter().map(|&v| v != 0).collect::<Vec<_>>(),
                shape,
            )
        };
        let (sa, sb) = (whole(&a), whole(&b));
        let n = |s: &[bool], m: &[u16]| {
            let all = s.iter().filter(|&&v| v).count() as u64;
            let inside = s.iter().zip(m).filter(|(&s, &m)| s && m != 0).count() as u64;
            (all, inside)
        };
        assert_eq!((c.pred_skeleton, c.pred_skeleton_in_ref), n(&sa, &b));
        assert_eq!((c.ref_skeleton, c.ref_skeleton_in_pred), n(&sb, &a));
    }

    #[test]
    fn class_mask_selects_values() {
        let voxels = [0u16, 1, 2, 3];
        let v = LabelVolume {
            voxels: &voxels,
            shape: [1, 1, 4],
        };
        let m = ClassMask {
            labels: &v,
            member: &|x| x == 2 || x == 3,
        };
        assert_eq!(m.read([0, 0, 0], [1, 1, 4]).unwrap(), vec![0, 0, 1, 1]);
    }
}
