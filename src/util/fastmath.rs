//! Branch-free `2^y`, `exp`, `log2` and a quarter-turn `sin`/`cos` in f32 for element-wise
//! loops the compiler should vectorize (libm's functions go one value at a time): gamma
//! augmentation, Gaussian noise, the fused surface loss.

use std::f32::consts::{LN_2, LOG2_E};

/// `2^y` for `y` up to 127; below -126 it returns `2^-126` (no subnormals). `2^n` for the
/// nearest integer `n` from the exponent bits, `2^(y - n)` by the Taylor series of `e^g`,
/// `g = (y - n) ln 2` in [-0.35, 0.35], to degree 6 (remainder under 1.2e-7; relative error
/// under 4e-7 on the whole range), evaluated in Estrin's order: a short dependency chain, so a
/// vectorized loop keeps several values in flight.
#[inline(always)]
pub fn exp2(y: f32) -> f32 {
    // A compare and select (one instruction), where `f32::max` spends three on NaN
    // handling; NaN still gives -126, as `max` would.
    let y = if y > -126.0 { y } else { -126.0 };
    // round(y) without float-to-int conversions, which Rust saturates (one value at a time:
    // they stopped the loops around this from vectorizing) and without libm: adding
    // 1.5 * 2^23 rounds y to the nearest integer, held in the low mantissa bits.
    const ROUNDER: f32 = 12_582_912.0;
    let t = y + ROUNDER;
    let n = t - ROUNDER;
    let n_int = t.to_bits() as i32 - ROUNDER.to_bits() as i32;
    let g = (y - n) * LN_2;
    let g2 = g * g;
    let low = (1.0 + g) + g2 * (0.5 + g * (1.0 / 6.0));
    let high = (1.0 / 24.0 + g * (1.0 / 120.0)) + g2 * (1.0 / 720.0);
    let p = low + (g2 * g2) * high;
    p * f32::from_bits(((n_int + 127) as u32) << 23)
}

/// `e^x` for `x` up to about 88 (softmax calls it with `x <= 0`); relative error under 5e-6,
/// most of it the rounding of `x log2 e` at large `|x|`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * LOG2_E)
}

/// `log2 x` for finite `x > 0` (no subnormals): `x = 2^e * m` with the mantissa `m` in
/// [0.7, 1.4) (so that it is near 1), then `log2 m` through `t = (m - 1) / (m + 1)` in
/// [-0.18, 0.17] as `2 / ln 2 * atanh t`, an odd series to `t^7` (absolute error under 1e-7
/// before the sum's rounding), in Estrin's order.
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    // Moving the mantissa's range down by 0x3f33_0000 (about 0.7) makes the exponent field
    // of the difference the exponent that leaves m in [0.7, 1.4).
    const OFF: u32 = 0x3f33_0000;
    let bits = x.to_bits();
    let d = bits.wrapping_sub(OFF);
    let e = (d as i32) >> 23;
    let m = f32::from_bits(bits.wrapping_sub(d & 0xff80_0000));
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let low = 2.885_39 + t2 * 0.961_796_7;
    let high = 0.577_078 + t2 * 0.412_198_6;
    let log2m = t * (low + (t2 * t2) * high);
    e as f32 + log2m
}

/// `(sin, cos)` of `2 pi * turn / 2^24` for `turn` below 2^24 (a 24-bit fraction of a turn):
/// the quadrant from its top two bits, the angle within it centred on pi/4 so that short
/// Taylor series suffice (absolute error under 5e-7), the quadrant's symmetry by selects.
#[inline(always)]
pub fn sin_cos_turn(turn: u32) -> (f32, f32) {
    use std::f32::consts::{FRAC_1_SQRT_2, FRAC_PI_2, FRAC_PI_4};
    let quadrant = (turn >> 22) & 3;
    let within = (turn & 0x3f_ffff) as i32 as f32 * (1.0 / 4_194_304.0);
    let x = within * FRAC_PI_2 - FRAC_PI_4;
    let x2 = x * x;
    // The series' coefficients as constants (dividing by 6, 20, ... was five vector
    // divisions a value, most of the Gaussian noise transform's time).
    let s = x * (1.0 - x2 * (1.0 / 6.0 - x2 * (1.0 / 120.0 - x2 * (1.0 / 5040.0))));
    let c = 1.0 - x2 * (0.5 - x2 * (1.0 / 24.0 - x2 * (1.0 / 720.0 - x2 * (1.0 / 40320.0))));
    // sin and cos of (x + pi/4), the angle within the quadrant.
    let (sq, cq) = ((s + c) * FRAC_1_SQRT_2, (c - s) * FRAC_1_SQRT_2);
    // Whole quarter turns: (sin, cos) -> (cos, -sin) per quarter.
    let (a, b) = if quadrant & 1 == 1 {
        (cq, sq)
    } else {
        (sq, cq)
    };
    let sin = if quadrant & 2 == 2 { -a } else { a };
    let cos = if (quadrant ^ (quadrant >> 1)) & 1 == 1 {
        -b
    } else {
        b
    };
    (sin, cos)
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

    #[test]
    fn log2_and_sin_cos_match_libm() {
        for k in 1..=100_000u32 {
            let x = k as f32 / 100_000.0 * 3.0;
            let (a, b) = (log2(x) as f64, (x as f64).log2());
            // The mantissa's part to 3e-7, then the sum's rounding (half an ulp of the result).
            assert!(
                (a - b).abs() < 3e-7 + b.abs() * 6e-8,
                "log2 {x}: {a} vs {b}"
            );
        }
        assert_eq!(log2(1.0), 0.0);
        // Every exponent, mantissas across [1, 2) (the range split at 0.7 moves them).
        for e in -125..=127 {
            for k in 0..64 {
                let x = 2f32.powi(e) * (1.0 + k as f32 / 64.0);
                let (a, b) = (log2(x) as f64, (x as f64).log2());
                assert!(
                    (a - b).abs() < 3e-7 + b.abs() * 6e-8,
                    "log2 {x}: {a} vs {b}"
                );
            }
        }
        assert!((log2(2f32.powi(-24)) + 24.0).abs() < 1e-6);
        for turn in (0..1u32 << 24).step_by(97) {
            let angle = std::f64::consts::TAU * turn as f64 / (1u64 << 24) as f64;
            let (s, c) = sin_cos_turn(turn);
            assert!((s as f64 - angle.sin()).abs() < 5e-7, "sin at {turn}");
            assert!((c as f64 - angle.cos()).abs() < 5e-7, "cos at {turn}");
        }
    }
}
