//! The importance maps a sliding window weighs its windows' scores by: ours (a Gaussian of
//! peak 1) and nnU-Net's (its float16 values, for its models voxel for voxel).

/// scipy's 1D Gaussian kernel of `sigma`, truncated at 4 sigma (`_gaussian_kernel1d`).
fn gaussian_kernel(sigma: f64) -> Vec<f64> {
    let radius = (4.0 * sigma + 0.5) as i64;
    let c2 = -0.5 / (sigma * sigma);
    let phi: Vec<f64> = (-radius..=radius)
        .map(|x| {
            let x = x as f64;
            (x * (x * c2)).exp()
        })
        .collect();
    let sum = crate::util::stats::pairwise_sum(&phi);
    phi.into_iter().map(|v| v / sum).collect()
}

/// nnU-Net's importance map of `patch` (2 or 3 axes, C order): a delta at `n // 2` filtered by
/// scipy's Gaussian (sigma patch / 8, constant mode), scaled to a peak of 10, cast to float16,
/// zeros raised to the smallest nonzero value; returned as f32 (exactly the float16 values).
pub fn nnunet_gaussian(patch: &[usize]) -> Vec<f32> {
    let axes: Vec<Vec<f64>> = patch
        .iter()
        .map(|&n| {
            let k = gaussian_kernel(n as f64 / 8.0);
            let r = (k.len() / 2) as i64;
            let c = (n / 2) as i64;
            (0..n as i64)
                .map(|i| {
                    k.get((i - c + r) as usize)
                        .copied()
                        .filter(|_| (i - c).abs() <= r)
                        .unwrap_or(0.0)
                })
                .collect()
        })
        .collect();
    let total: usize = patch.iter().product();
    let mut g = vec![1.0f64; total];
    // Filtered axis by axis, so each value is the product in axis order.
    let mut stride = total;
    for (a, w) in axes.iter().enumerate() {
        stride /= patch[a];
        for (i, v) in g.iter_mut().enumerate() {
            *v *= w[(i / stride) % patch[a]];
        }
    }
    let peak = g.iter().copied().fold(0.0, f64::max) / 10.0;
    // torch casts float64 to float16 through float32 (two roundings).
    let h: Vec<half::f16> = g
        .iter()
        .map(|v| half::f16::from_f32((v / peak) as f32))
        .collect();
    let min = h
        .iter()
        .filter(|v| f32::from(**v) != 0.0)
        .map(|v| f32::from(*v))
        .fold(f32::INFINITY, f32::min);
    h.into_iter()
        .map(|v| {
            if f32::from(v) == 0.0 {
                min
            } else {
                f32::from(v)
            }
        })
        .collect()
}

/// Round to the nearest float16 (nnU-Net's accumulators).
pub(super) fn f16_round(v: f32) -> f32 {
    f32::from(half::f16::from_f32(v))
}

/// Gaussian importance map of a patch (C order), peak 1, minimum clamped above zero.
pub fn gaussian_map(patch: [usize; 3]) -> Vec<f32> {
    let axis = |n: usize| -> Vec<f64> {
        let sigma = n as f64 / 8.0;
        let c = (n as f64 - 1.0) / 2.0;
        (0..n)
            .map(|i| {
                let d = i as f64 - c;
                (-d * d / (2.0 * sigma * sigma)).exp()
            })
            .collect()
    };
    let (gz, gy, gx) = (axis(patch[0]), axis(patch[1]), axis(patch[2]));
    let mut out = Vec::with_capacity(patch.iter().product());
    for z in &gz {
        for y in &gy {
            for x in &gx {
                out.push((z * y * x).max(1e-3) as f32);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::gaussian_map;

    #[test]
    fn gaussian_peaks_in_the_middle() {
        let g = gaussian_map([4, 8, 8]);
        let at = |z: usize, y: usize, x: usize| g[(z * 8 + y) * 8 + x];
        assert!(at(1, 3, 3) > at(0, 0, 0));
        assert!(g.iter().all(|&v| v > 0.0 && v <= 1.0));
        assert_eq!(at(1, 3, 4), at(2, 4, 3));
    }
}
