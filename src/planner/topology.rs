//! The network's topology from the spacing and the patch, by nnU-Net's rule
//! (docs/nnunet-planner.md, section 3): pool the axes within 2x of the finest spacing while
//! they stay at least 8 voxels (a lone axis: 12); 1x3x3-like kernels on an axis at least 2x
//! coarser than the finest until pooling has brought it within 2x; then pad the patch up to a
//! multiple of the total stride.

/// The smallest edge of a feature map: an axis is pooled only while it has at least twice this.
pub const MIN_FEATURE_EDGE: f64 = 4.0;

/// Stages, strides, kernels and the padded patch of one plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// Poolings per axis.
    pub pools: Vec<u32>,
    /// Stride of each stage (stage 0's is all ones).
    pub strides: Vec<Vec<usize>>,
    /// Kernel of each stage (the bottleneck's all threes).
    pub kernels: Vec<Vec<usize>>,
    /// The patch, padded up to a multiple of `divisor` on each axis.
    pub patch: Vec<usize>,
    /// The total stride per axis (2^pools).
    pub divisor: Vec<usize>,
}

/// `patch` (may hold halves: median shapes can) rounded up to a multiple of `div` per axis,
/// as nnU-Net pads (truncating the float after).
fn pad(patch: &[f64], div: &[usize]) -> Vec<usize> {
    patch
        .iter()
        .zip(div)
        .map(|(&s, &d)| {
            let d = d as f64;
            let r = s % d;
            let up = if r == 0.0 { s } else { s + d - r };
            up as usize
        })
        .collect()
}

/// nnU-Net's `get_pool_and_conv_props` for `spacing` and `patch` (same number of axes).
pub fn pool_and_conv(spacing: &[f64], patch: &[f64]) -> Topology {
    let dim = spacing.len();
    let mut sp = spacing.to_vec();
    let mut sz = patch.to_vec();
    let mut strides = vec![vec![1; dim]];
    let mut kernels = Vec::new();
    let mut pools = vec![0u32; dim];
    let mut kernel = vec![1usize; dim];
    loop {
        let mut valid: Vec<usize> = (0..dim)
            .filter(|&i| sz[i] >= 2.0 * MIN_FEATURE_EDGE)
            .collect();
        if valid.is_empty() {
            break;
        }
        let finest = valid.iter().map(|&i| sp[i]).fold(f64::INFINITY, f64::min);
        valid.retain(|&i| sp[i] / finest < 2.0);
        if valid.len() == 1 && sz[valid[0]] < 3.0 * MIN_FEATURE_EDGE {
            break;
        }
        if valid.is_empty() {
            break;
        }
        let finest_all = sp.iter().copied().fold(f64::INFINITY, f64::min);
        for d in 0..dim {
            if kernel[d] != 3 && sp[d] / finest_all < 2.0 {
                kernel[d] = 3;
            }
        }
        let mut stride = vec![1; dim];
        for &v in &valid {
            stride[v] = 2;
            pools[v] += 1;
            sp[v] *= 2.0;
            sz[v] = (sz[v] / 2.0).ceil();
        }
        strides.push(stride);
        kernels.push(kernel.clone());
    }
    kernels.push(vec![3; dim]);
    let divisor: Vec<usize> = pools.iter().map(|&p| 1usize << p).collect();
    Topology {
        patch: pad(patch, &divisor),
        pools,
        strides,
        kernels,
        divisor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anisotropic_spacing_pools_in_plane_first_with_flat_kernels() {
        // nnU-Net's plan of the bundled vessels (z 2.9 um, in-plane 0.99): patch 20x64x64.
        let t = pool_and_conv(&[0.0029, 0.00099, 0.00099], &[19.0, 58.0, 57.0]);
        assert_eq!(t.patch, vec![20, 64, 64]);
        assert_eq!(
            t.strides,
            vec![
                vec![1, 1, 1],
                vec![1, 2, 2],
                vec![2, 2, 2],
                vec![2, 2, 2],
                vec![1, 2, 2]
            ]
        );
        assert_eq!(t.kernels[0], vec![1, 3, 3]);
        assert_eq!(t.kernels[1..], vec![vec![3, 3, 3]; 4][..]);
        assert_eq!(t.divisor, vec![4, 16, 16]);
        // Halves pad up; exact multiples stay.
        assert_eq!(pad(&[57.5, 64.0], &[16, 16]), vec![64, 64]);
    }
}
