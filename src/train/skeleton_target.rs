//! The Skeleton Recall loss's target: each foreground class's skeleton, thickened into a thin
//! tube and kept inside the class (Kirchhoff et al., 2024).
//!
//! When the cache holds the label's skeleton (`--derived skeleton`), the loader samples it
//! through the patch's spatial map and only the tube is made per patch; otherwise the skeleton
//! of each augmented label patch is computed in the loader's threads, as their data loader does.

use crate::prep::derived::thinning::skeletonize;

/// Per voxel the label value whose tubed skeleton covers it, 0 elsewhere: for every non-zero
/// value, the skeleton of its voxels, dilated twice by the 6-neighbour cross, then cut back to
/// the value's own voxels.
pub fn tubed_skeleton(label: &[u16], size: [usize; 3]) -> Vec<u16> {
    tube_around(&skeleton_of(label, size), label, size)
}

/// Per voxel the label value whose skeleton passes there (each non-zero value thinned on its
/// own), 0 elsewhere.
pub fn skeleton_of(label: &[u16], size: [usize; 3]) -> Vec<u16> {
    let mut out = vec![0u16; label.len()];
    for v in values(label) {
        let mask: Vec<bool> = label.iter().map(|&l| l == v).collect();
        for (o, s) in out.iter_mut().zip(skeletonize(&mask, size)) {
            if s {
                *o = v;
            }
        }
    }
    out
}

/// The tube around a skeleton (as [`skeleton_of`] gives it, or read from the cache): each
/// value's skeleton dilated twice by the 6-neighbour cross, then cut back to the voxels of
/// that value in `label`.
pub fn tube_around(skeleton: &[u16], label: &[u16], size: [usize; 3]) -> Vec<u16> {
    let mut out = vec![0u16; label.len()];
    for v in values(skeleton) {
        let mut tube: Vec<bool> = skeleton.iter().map(|&s| s == v).collect();
        for _ in 0..2 {
            tube = dilate_cross(&tube, size);
        }
        for ((o, &t), &l) in out.iter_mut().zip(&tube).zip(label) {
            if t && l == v {
                *o = v;
            }
        }
    }
    out
}

/// The non-zero values of a patch, ascending.
fn values(v: &[u16]) -> Vec<u16> {
    let mut vals: Vec<u16> = v.iter().copied().filter(|&x| x != 0).collect();
    vals.sort_unstable();
    vals.dedup();
    vals
}

/// One dilation by the 6-neighbour cross.
fn dilate_cross(m: &[bool], s: [usize; 3]) -> Vec<bool> {
    let mut out = m.to_vec();
    let (sy, sz) = (s[2], s[1] * s[2]);
    for z in 0..s[0] {
        for y in 0..s[1] {
            for x in 0..s[2] {
                let i = z * sz + y * sy + x;
                if !m[i] {
                    continue;
                }
                if x > 0 {
                    out[i - 1] = true;
                }
                if x + 1 < s[2] {
                    out[i + 1] = true;
                }
                if y > 0 {
                    out[i - sy] = true;
                }
                if y + 1 < s[1] {
                    out[i + sy] = true;
                }
                if z > 0 {
                    out[i - sz] = true;
                }
                if z + 1 < s[0] {
                    out[i + sz] = true;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thick_tube_gets_a_thin_tube_inside_it_and_classes_stay_apart() {
        let s = [12, 20, 20];
        let mut label = vec![0u16; s.iter().product()];
        for z in 0..12 {
            for y in 0..20 {
                for x in 0..20 {
                    let (dy, dx) = (y as f64 - 6.0, x as f64 - 6.0);
                    if dy * dy + dx * dx <= 16.0 {
                        label[(z * 20 + y) * 20 + x] = 1;
                    }
                    if y == 15 && x >= 2 {
                        label[(z * 20 + y) * 20 + x] = 3;
                    }
                }
            }
        }
        let t = tubed_skeleton(&label, s);
        let ones = t.iter().filter(|&&v| v == 1).count();
        let tube = label.iter().filter(|&&v| v == 1).count();
        // A tube of radius 2 (the cross twice) around the centre line, well inside radius 4.
        assert!(ones > 12 && ones < tube / 2, "{ones} of {tube}");
        for (i, &v) in t.iter().enumerate() {
            if v != 0 {
                assert_eq!(label[i], v, "voxel {i} outside its class");
            }
            if v == 1 {
                let (y, x) = ((i / 20) % 20, i % 20);
                assert!(
                    y.abs_diff(6) + x.abs_diff(6) <= 3,
                    "voxel {i} far from the centre"
                );
            }
        }
        assert!(t.contains(&3));
        assert!(tubed_skeleton(&[0; 8], [2, 2, 2]).iter().all(|&v| v == 0));
    }
}
