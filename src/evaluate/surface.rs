//! Surface distances between two sets of edge voxels, in physical units.
//!
//! The definitions are MONAI's (`HausdorffDistanceMetric`, `SurfaceDistanceMetric` with
//! `symmetric=True`), which MedPy computes the same way: the distance from an edge voxel of one
//! segmentation to the nearest edge voxel of the other, between voxel centres, each axis scaled
//! by its spacing. HD95 is the larger of the two directed 95th percentiles (linear
//! interpolation between order statistics, numpy's and torch's default); HD the larger of the
//! two directed maxima; ASD the mean of both directions' distances taken together.
//!
//! The nearest edge voxel is found in a k-d tree over the other side's edge voxels rather than
//! with a distance transform of the whole grid: memory follows the surface, not the volume.

use rayon::prelude::*;

use crate::util::stats::percentile_sorted as percentile;

/// Distances between the surfaces of a prediction and its reference for one class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SurfaceDistances {
    /// 95th-percentile Hausdorff distance (symmetric).
    pub hd95: f64,
    /// Hausdorff distance (the largest).
    pub hd: f64,
    /// Average surface distance (both directions together).
    pub asd: f64,
}

impl SurfaceDistances {
    /// Both surfaces empty: nothing to measure.
    pub const UNDEFINED: SurfaceDistances = SurfaceDistances {
        hd95: f64::NAN,
        hd: f64::NAN,
        asd: f64::NAN,
    };
    /// One surface empty: as far apart as can be (MONAI reports inf too).
    pub const INFINITE: SurfaceDistances = SurfaceDistances {
        hd95: f64::INFINITY,
        hd: f64::INFINITY,
        asd: f64::INFINITY,
    };
}

/// The distances between edge voxels `a` and `b` (voxel indices (x, y, z)) on a grid of
/// `spacing_xyz`.
pub fn surface_distances(
    a: &[[u32; 3]],
    b: &[[u32; 3]],
    spacing_xyz: [f64; 3],
) -> SurfaceDistances {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => return SurfaceDistances::UNDEFINED,
        (true, false) | (false, true) => return SurfaceDistances::INFINITE,
        _ => {}
    }
    let ab = directed(a, b, spacing_xyz);
    let ba = directed(b, a, spacing_xyz);
    let max = |d: &[f64]| d.last().copied().unwrap_or(f64::NAN);
    let sum: f64 = ab.iter().chain(&ba).sum();
    SurfaceDistances {
        hd95: percentile(&ab, 95.0).max(percentile(&ba, 95.0)),
        hd: max(&ab).max(max(&ba)),
        asd: sum / (ab.len() + ba.len()) as f64,
    }
}

/// For each voxel of `from`, the distance to the nearest voxel of `to` (not empty), sorted.
pub fn directed(from: &[[u32; 3]], to: &[[u32; 3]], spacing_xyz: [f64; 3]) -> Vec<f64> {
    let physical = |p: &[u32; 3]| {
        [
            p[0] as f64 * spacing_xyz[0],
            p[1] as f64 * spacing_xyz[1],
            p[2] as f64 * spacing_xyz[2],
        ]
    };
    let tree = KdTree::new(to.iter().map(physical).collect());
    let mut d: Vec<f64> = from
        .par_iter()
        .map(|p| tree.nearest_squared(physical(p)).sqrt())
        .collect();
    d.par_sort_unstable_by(f64::total_cmp);
    d
}

/// Points at or below this many are searched one by one.
const LEAF: usize = 8;

/// A balanced k-d tree stored implicitly: each range's middle point splits it on `axes[mid]`.
struct KdTree {
    points: Vec<[f64; 3]>,
    axes: Vec<u8>,
}

impl KdTree {
    fn new(mut points: Vec<[f64; 3]>) -> KdTree {
        let mut axes = vec![0u8; points.len()];
        build(&mut points, &mut axes);
        KdTree { points, axes }
    }

    /// Squared distance from `q` to the nearest point.
    fn nearest_squared(&self, q: [f64; 3]) -> f64 {
        let mut best = f64::INFINITY;
        self.search(0, self.points.len(), q, &mut best);
        best
    }

    fn search(&self, lo: usize, hi: usize, q: [f64; 3], best: &mut f64) {
        if hi - lo <= LEAF {
            for p in &self.points[lo..hi] {
                *best = best.min(squared(p, &q));
            }
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let axis = self.axes[mid] as usize;
        let p = &self.points[mid];
        *best = best.min(squared(p, &q));
        let d = q[axis] - p[axis];
        let (near, far) = if d < 0.0 {
            ((lo, mid), (mid + 1, hi))
        } else {
            ((mid + 1, hi), (lo, mid))
        };
        self.search(near.0, near.1, q, best);
        if d * d < *best {
            self.search(far.0, far.1, q, best);
        }
    }
}

fn squared(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    let (x, y, z) = (a[0] - b[0], a[1] - b[1], a[2] - b[2]);
    x * x + y * y + z * z
}

/// Arrange `points` so that every range's middle splits it on its widest axis.
fn build(points: &mut [[f64; 3]], axes: &mut [u8]) {
    if points.len() <= LEAF {
        return;
    }
    let mut lo = [f64::INFINITY; 3];
    let mut hi = [f64::NEG_INFINITY; 3];
    for p in points.iter() {
        for k in 0..3 {
            lo[k] = lo[k].min(p[k]);
            hi[k] = hi[k].max(p[k]);
        }
    }
    let axis = (0..3)
        .max_by(|&i, &j| (hi[i] - lo[i]).total_cmp(&(hi[j] - lo[j])))
        .unwrap_or(0);
    let mid = points.len() / 2;
    points.select_nth_unstable_by(mid, |a, b| a[axis].total_cmp(&b[axis]));
    axes[mid] = axis as u8;
    let (left, right) = points.split_at_mut(mid);
    let (left_axes, right_axes) = axes.split_at_mut(mid);
    build(left, left_axes);
    build(&mut right[1..], &mut right_axes[1..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest distance by looking at every pair.
    fn brute(from: &[[u32; 3]], to: &[[u32; 3]], s: [f64; 3]) -> Vec<f64> {
        let mut d: Vec<f64> = from
            .iter()
            .map(|a| {
                to.iter()
                    .map(|b| {
                        (0..3)
                            .map(|k| ((a[k] as f64 - b[k] as f64) * s[k]).powi(2))
                            .sum::<f64>()
                            .sqrt()
                    })
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        d.sort_by(f64::total_cmp);
        d
    }

    /// A small deterministic generator (no test may depend on a crate's random stream).
    fn points(seed: u64, n: usize, extent: u32) -> Vec<[u32; 3]> {
        let mut s = seed;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % extent as u64) as u32
        };
        (0..n).map(|_| [next(), next(), next()]).collect()
    }

    #[test]
    fn tree_equals_brute_force() {
        let spacing = [0.5, 1.25, 3.0];
        for (seed, n, m) in [(1, 1, 1), (2, 7, 300), (3, 500, 9), (4, 800, 1200)] {
            let a = points(seed, n, 40);
            let b = points(seed + 100, m, 40);
            assert_eq!(directed(&a, &b, spacing), brute(&a, &b, spacing));
        }
    }

    #[test]
    fn known_answers() {
        // One voxel each, 3 voxels apart along z at 2 units: every distance is 6.
        let d = surface_distances(&[[1, 1, 1]], &[[1, 1, 4]], [1.0, 1.0, 2.0]);
        assert_eq!((d.hd95, d.hd, d.asd), (6.0, 6.0, 6.0));
        let same = surface_distances(&[[0, 0, 0], [1, 0, 0]], &[[1, 0, 0], [0, 0, 0]], [1.0; 3]);
        assert_eq!((same.hd95, same.hd, same.asd), (0.0, 0.0, 0.0));
        assert!(surface_distances(&[], &[], [1.0; 3]).hd95.is_nan());
        assert!(surface_distances(&[[0, 0, 0]], &[], [1.0; 3])
            .hd95
            .is_infinite());
        // a = {0, 10} and b = {0} along x: directed a->b (0, 10), b->a (0); ASD 10/3.
        let d = surface_distances(&[[0, 0, 0], [10, 0, 0]], &[[0, 0, 0]], [1.0; 3]);
        assert_eq!(d.hd, 10.0);
        assert!((d.hd95 - 9.5).abs() < 1e-12);
        assert!((d.asd - 10.0 / 3.0).abs() < 1e-12);
    }
}
