//! Multiplicative brightness, and contrast around the mean clipped to the patch's range.

use super::moments::Moments;

/// Every value times `f`.
#[inline(always)]
pub(super) fn brightness(c: &mut [f32], f: f32) {
    c.iter_mut().for_each(|v| *v *= f);
}

/// `(x - mean) * f + mean`, clipped to the values' original range.
#[inline(always)]
pub fn contrast(c: &mut [f32], f: f64) {
    if c.is_empty() {
        return;
    }
    let m = Moments::of(c);
    let (mean, (lo, hi)) = (m.sums.mean_std(c.len()).0, (m.lo, m.hi));
    // As `v * f + mean * (1 - f)` in f32: one multiply-add a voxel (in f64 it took two
    // conversions and twice the vectors: half the transform's time).
    let (a, b) = (f as f32, (mean - mean * f) as f32);
    for v in c.iter_mut() {
        let x = *v * a + b;
        // Compares and selects (`clamp` spends more on NaN, which a patch cannot hold).
        let x = if x < lo { lo } else { x };
        *v = if x > hi { hi } else { x };
    }
}
