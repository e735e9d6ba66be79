//! The Skeleton Recall loss's target: each foreground class's skeleton, thickened into a thin
//! tube and kept inside the class (Kirchhoff et al., 2024).
//!
//! Computed per augmented label patch in the loader's threads, as their data loader does; the
//! skeleton of the whole volume, cached beside the label and sampled through the same spatial
//! map, is the next step (issue 13).

use crate::skeleton::skeletonize;

/// Per voxel the label value whose tubed skeleton covers it, 0 elsewhere: for every non-zero
/// value, the skeleton of its voxels, dilated twice by the 6-neighbour cross, then cut back to
/// the value's own voxels.
pub fn tubed_skeleton(label: &[u16], size: [usize; 3]) -> Vec<u16> {
    let mut out = vec![0u16; label.len()];
    let mut values: Vec<u16> = label.iter().copied().filter(|&v| v != 0).collect();
    values.sort_unstable();
    values.dedup();
    for v in values {
        let mask: Vec<bool> = label.iter().map(|&l| l == v).collect();
        let mut tube = skeletonize(&mask, size);
        for _ in 0..2 {
            tube = dilate_cross(&tube, size);
        }
        for ((o, &t), &m) in out.iter_mut().zip(&tube).zip(&mask) {
            if t && m {
                *o = v;
            }
        }
    }
    out
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
