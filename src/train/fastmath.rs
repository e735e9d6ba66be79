//! Branch-free `2^y` and `exp` in f32 for element-wise loops the compiler should vectorize
//! (libm's `exp`/`powf` go one value at a time): gamma augmentation, the fused surface loss.

use std::f32::consts::{LN_2, LOG2_E};

/// `2^y` for `y` up to 127; below -126 it returns `2^-126` times the fraction's power (no
/// subnormals). `2^floor(y)` from the exponent bits, `2^frac` by its Taylor series in
/// `frac * ln 2` (relative error under 4e-7 on the whole range).
#[inline(always)]
pub fn exp2(y: f32) -> f32 {
    let y = y.max(-126.0);
    // floor without libm's floorf (a call per value that stops vectorization).
    let tr = y as i32;
    let fl = (tr - (y < tr as f32) as i32) as f32;
    let f = (y - fl) * LN_2;
    let p = 1.0
        + f * (1.0
            + f * (0.5
                + f * (1.0 / 6.0
                    + f * (1.0 / 24.0
                        + f * (1.0 / 120.0
                            + f * (1.0 / 720.0 + f * (1.0 / 5040.0 + f / 40320.0)))))));
    p * f32::from_bits(((fl as i32 + 127) as u32) << 23)
}

/// `e^x` for `x` up to about 88 (softmax calls it with `x <= 0`); relative error under 5e-6,
/// most of it the rounding of `x log2 e` at large `|x|`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * LOG2_E)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0f64;
        for k in 0..=200_000 {
            let x = -87.0 + k as f32 * (87.0 + 80.0) / 200_000.0;
            let (a, b) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 5e-6, "relative error {worst}");
        for k in 0..=10_000 {
            let y = -126.0 + k as f32 * 253.0 / 10_000.0;
            let (a, b) = (exp2(y) as f64, 2f64.powf(y as f64));
            assert!(((a - b) / b).abs() < 1e-6, "2^{y}: {a} vs {b}");
        }
        assert_eq!(exp(0.0), 1.0);
    }
}
