//! Targets of the deep-supervision outputs: the label patch taken down to each lower
//! resolution.
//!
//! nnU-Net takes every `stride`-th voxel (nearest). A vessel one voxel across then vanishes
//! from half the coarse voxels it crosses, and its coarse target breaks where the vessel does
//! not (nnU-Net issue #1226). We pool instead: a coarse voxel is foreground if any of the fine
//! voxels it covers is, taking the foreground class most of them hold (ties to the lower
//! class); background only if no fine voxel is foreground; ignored only if all are ignored.
//! Thin structures keep their shape and connections at every level; thick ones grow by at most
//! one coarse voxel at their boundary, which the full-resolution output (weighted most) does
//! not see.

use crate::train::classes::IGNORE;

/// Downsample `n` label patches of `size` (z, y, x) by `factor` per axis (each axis a multiple
/// of it, as the network's strides make sure). Returns the labels and their size.
pub fn downsample_labels(
    labels: &[u16],
    n: usize,
    size: [usize; 3],
    factor: [usize; 3],
) -> (Vec<u16>, [usize; 3]) {
    let out_size: [usize; 3] = std::array::from_fn(|a| size[a] / factor[a].max(1));
    let v: usize = size.iter().product();
    let ov: usize = out_size.iter().product();
    let mut out = Vec::with_capacity(n * ov);
    let mut counts: Vec<(u16, u32)> = Vec::new();
    for b in 0..n {
        let patch = &labels[b * v..(b + 1) * v];
        for z in 0..out_size[0] {
            for y in 0..out_size[1] {
                for x in 0..out_size[2] {
                    counts.clear();
                    let mut background = false;
                    for dz in 0..factor[0] {
                        for dy in 0..factor[1] {
                            let row = ((z * factor[0] + dz) * size[1] + y * factor[1] + dy)
                                * size[2]
                                + x * factor[2];
                            for &l in &patch[row..row + factor[2]] {
                                match l {
                                    0 => background = true,
                                    IGNORE => {}
                                    c => match counts.iter_mut().find(|e| e.0 == c) {
                                        Some(e) => e.1 += 1,
                                        None => counts.push((c, 1)),
                                    },
                                }
                            }
                        }
                    }
                    let pick = counts
                        .iter()
                        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                        .map(|e| e.0);
                    out.push(match (pick, background) {
                        (Some(c), _) => c,
                        (None, true) => 0,
                        (None, false) => IGNORE,
                    });
                }
            }
        }
    }
    (out, out_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_lines_survive_and_classes_are_kept() {
        // One-voxel diagonal line of class 1 in a 4x8x8 patch: every coarse voxel it crosses
        // stays foreground at (2, 2, 2).
        let size = [4, 8, 8];
        let mut l = vec![0u16; 256];
        for i in 0..8 {
            l[((i / 2) * 8 + i) * 8 + i] = 1;
        }
        let (d, s) = downsample_labels(&l, 1, size, [2, 2, 2]);
        assert_eq!(s, [2, 4, 4]);
        for i in 0..4 {
            assert_eq!(d[((i / 2) * 4 + i) * 4 + i], 1, "coarse voxel {i}");
        }
        assert_eq!(d.iter().filter(|&&v| v == 1).count(), 4);
        // Nearest (every second voxel) would keep none of the odd-index voxels.
        // Majority among foreground classes, ties to the lower; ignore only when all ignored.
        let block = |vals: [u16; 8]| downsample_labels(&vals, 1, [2, 2, 2], [2, 2, 2]).0[0];
        assert_eq!(block([0, 2, 2, 3, 0, 0, 0, 0]), 2);
        assert_eq!(block([0, 3, 2, 0, 0, 0, 0, 0]), 2);
        assert_eq!(block([0, 0, 0, IGNORE, 0, 0, 0, 0]), 0);
        assert_eq!(block([IGNORE; 8]), IGNORE);
        assert_eq!(block([IGNORE, 4, IGNORE, IGNORE, 0, 0, 0, 0]), 4);
        // Two patches, anisotropic factor.
        let two: Vec<u16> = (0..2 * 16).map(|i| (i / 16) as u16 * 5).collect();
        let (d, s) = downsample_labels(&two, 2, [1, 4, 4], [1, 2, 2]);
        assert_eq!(s, [1, 2, 2]);
        assert_eq!(d, vec![0, 0, 0, 0, 5, 5, 5, 5]);
    }
}
