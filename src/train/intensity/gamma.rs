//! Gamma with the mean and standard deviation kept, and the power it is made of: a table
//! and a polynomial fitted per gamma ([`PowFit`]), or series past its range ([`pow_unit`]).

use super::moments::{LaneSums, Moments};
#[cfg(target_arch = "x86_64")]
use super::moments::{FLUSH, LANES};

/// Gamma on the values rescaled to 0..1, then the original mean and standard deviation put
/// back; `invert` applies it to the negated values (brightening the dark end instead).
#[inline(always)]
pub fn gamma(c: &mut [f32], g: f64, invert: bool) {
    gamma_in::<false>(c, g, invert);
}

/// [`gamma`]; `W512`: the CPU has AVX-512 (F, DQ) and the caller is compiled for it.
#[inline(always)]
pub(super) fn gamma_in<const W512: bool>(c: &mut [f32], g: f64, invert: bool) {
    if c.is_empty() {
        return;
    }
    let sign = if invert { -1.0 } else { 1.0 };
    let m = Moments::of(c);
    let (mean, std) = m.sums.mean_std(c.len());
    let (lo, hi) = if invert { (-m.hi, -m.lo) } else { (m.lo, m.hi) };
    let range = (hi - lo) as f64 + 1e-7;
    // The power is most of this transform's cost: a table and a polynomial fitted for this g
    // ([`PowFit`]), or series (`pow_unit`) past its range, loops the compiler vectorizes,
    // where libm's powf goes a voxel at a time.
    let (g, lo, range, sign) = (g as f32, lo, range as f32, sign as f32);
    let inv_range = 1.0 / range;
    // Clamped at 0 by a compare and select (`f32::max` spends more on NaN, which a patch
    // cannot hold: the loader refuses non-finite values).
    let unit = |v: f32| {
        let x = (sign * v - lo) * inv_range;
        if x > 0.0 {
            x
        } else {
            0.0
        }
    };
    let sums = match PowFit::new(g as f64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 (the caller's `W512`).
        Some(fit) if W512 => unsafe { fit.map_avx512(c, sign, lo, inv_range, range) },
        Some(fit) => {
            c.iter_mut()
                .for_each(|v| *v = sign * (fit.at(unit(*v)) * range + lo));
            LaneSums::of(c)
        }
        None => {
            c.iter_mut()
                .for_each(|v| *v = sign * (pow_unit(unit(*v), g) * range + lo));
            LaneSums::of(c)
        }
    };
    // Back to the original mean and deviation: one multiply-add a voxel (a division a voxel
    // in f64 was a fifth of the transform).
    let (m2, s2) = sums.mean_std(c.len());
    let a = std / (s2 + 1e-8);
    let (a, b) = (a as f32, (mean - m2 * a) as f32);
    for v in c.iter_mut() {
        *v = *v * a + b;
    }
}

/// `x^g` for `x` 0 or normal in 0..=1 and one `g` (up to [`PowFit::MAX_G`]) as `2^(e g) m^g`
/// with `x = 2^e m`, `m` in [1, 2): the first from a table over the exponent, the second from
/// a polynomial fitted to `m^g` for this `g` (degree 6 through Chebyshev nodes: relative
/// error under 1e-6 for g up to 4; past that the f32 evaluation of its larger coefficients
/// loses more, and [`pow_unit`] is used). Half the operations of [`pow_unit`] and no division
/// (gamma 0.187 -> 0.160 ms per 16x128x128 patch); the table read is exact, so every vector
/// build gives the same bits. Fitting costs a few microseconds a patch.
pub(super) struct PowFit {
    /// `2^(-k g)` for k = 0..=127, 0 where that is below f32's normal range (so no product
    /// is subnormal: those are slow on some CPUs, and zero there is within the error).
    scale: [f32; 128],
    /// Coefficients in powers of `m - 1.5`.
    coef: [f32; 7],
}

impl PowFit {
    const MAX_G: f64 = 4.0;

    pub(super) fn new(g: f64) -> Option<Self> {
        if !(g > 0.0 && g <= Self::MAX_G) {
            return None;
        }
        let scale = std::array::from_fn(|k| {
            let v = (-(k as f64) * g).exp2();
            if v < f32::MIN_POSITIVE as f64 {
                0.0
            } else {
                v as f32
            }
        });
        // Interpolation at the 7 Chebyshev nodes of [-0.5, 0.5]: a Vandermonde system,
        // solved by Gaussian elimination with partial pivoting (well conditioned here).
        const D: usize = 7;
        let mut a = [[0f64; D + 1]; D];
        for (j, row) in a.iter_mut().enumerate() {
            let s = 0.5 * ((2 * j + 1) as f64 * std::f64::consts::PI / (2 * D) as f64).cos();
            for (i, v) in row.iter_mut().take(D).enumerate() {
                *v = s.powi(i as i32);
            }
            row[D] = (1.5 + s).powf(g);
        }
        for col in 0..D {
            let pivot = (col..D)
                .max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))
                .unwrap_or(col);
            a.swap(col, pivot);
            let pivot_row = a[col];
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / pivot_row[col];
                    for (v, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                        *v -= f * p;
                    }
                }
            }
        }
        let coef = std::array::from_fn(|i| (a[i][D] / a[i][i]) as f32);
        Some(PowFit { scale, coef })
    }

    #[inline(always)]
    pub(super) fn at(&self, x: f32) -> f32 {
        let bits = x.to_bits();
        // x below 2: its biased exponent is at most 127, k = -e.
        let k = (127 - (bits >> 23) as i32).clamp(0, 127) as usize;
        let s = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000) - 1.5;
        let c = &self.coef;
        // Estrin's order: a short dependency chain.
        let s2 = s * s;
        let s4 = s2 * s2;
        let p = ((c[0] + c[1] * s) + s2 * (c[2] + c[3] * s)) + s4 * ((c[4] + c[5] * s) + s2 * c[6]);
        let r = p * self.scale[k];
        if x > 0.0 {
            r
        } else {
            0.0
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl PowFit {
    /// `v = sign * (at(unit(v)) * range + lo)` over `c` as [`gamma`] maps it, 16 lanes at a
    /// time, returning the [`LaneSums`] of the result (summed as the values are stored: the
    /// separate pass over the patch was a sixth of gamma's time). The same operations in the
    /// same order, so the same bits; the table read by one two-register permute when every
    /// positive lane's exponent is within its first 32 entries (values above 2^-32 of the
    /// range: all but the rarest vectors), else by four permutes and two blends (a gather
    /// was an eighth of the intensity transforms' time).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and DQ.
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn map_avx512(
        &self,
        c: &mut [f32],
        sign: f32,
        lo: f32,
        inv_range: f32,
        range: f32,
    ) -> LaneSums {
        use std::arch::x86_64::*;
        let scalar = |v: f32| {
            let x = (sign * v - lo) * inv_range;
            sign * (self.at(if x > 0.0 { x } else { 0.0 }) * range + lo)
        };
        // The sums about the centre `LaneSums::of` would take of the results.
        let mut sums = LaneSums::about(LaneSums::centre(c.len(), |i| scalar(c[i])));
        let t: [__m512; 8] =
            std::array::from_fn(|i| _mm512_loadu_ps(self.scale[16 * i..].as_ptr()));
        let k = self.coef.map(|v| _mm512_set1_ps(v));
        let (sign_v, lo_v, inv_v, range_v) = (
            _mm512_set1_ps(sign),
            _mm512_set1_ps(lo),
            _mm512_set1_ps(inv_range),
            _mm512_set1_ps(range),
        );
        let zero = _mm512_setzero_ps();
        let (add, mul) = (_mm512_add_ps, _mm512_mul_ps);
        let map = |v: __m512| {
            let x = mul(_mm512_sub_ps(mul(sign_v, v), lo_v), inv_v);
            let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, zero);
            // A lane that is not positive gives 0 at the end whatever it reads here.
            let bits = _mm512_castps_si512(x);
            let idx = _mm512_sub_epi32(_mm512_set1_epi32(127), _mm512_srli_epi32::<23>(bits));
            let m = _mm512_or_si512(
                _mm512_and_si512(bits, _mm512_set1_epi32(0x007f_ffff)),
                _mm512_set1_epi32(0x3f80_0000),
            );
            let s = _mm512_sub_ps(_mm512_castsi512_ps(m), _mm512_set1_ps(1.5));
            let s2 = mul(s, s);
            let s4 = mul(s2, s2);
            let p = add(
                add(add(k[0], mul(k[1], s)), mul(s2, add(k[2], mul(k[3], s)))),
                mul(s4, add(add(k[4], mul(k[5], s)), mul(s2, k[6]))),
            );
            // scale[idx]. Positive lanes have idx in 0..=127; past 31 is rare.
            let far = _mm512_mask_cmpgt_epu32_mask(positive, idx, _mm512_set1_epi32(31));
            let scale = if far == 0 {
                _mm512_permutex2var_ps(t[0], idx, t[1])
            } else {
                // Each permute picks from 32 entries by idx's low 5 bits; bits 5 and 6 pick
                // among the four (idx clamped as `at` clamps it).
                let idx = _mm512_max_epi32(
                    _mm512_min_epi32(idx, _mm512_set1_epi32(127)),
                    _mm512_setzero_si512(),
                );
                let r0 = _mm512_permutex2var_ps(t[0], idx, t[1]);
                let r1 = _mm512_permutex2var_ps(t[2], idx, t[3]);
                let r2 = _mm512_permutex2var_ps(t[4], idx, t[5]);
                let r3 = _mm512_permutex2var_ps(t[6], idx, t[7]);
                let b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
                let b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
                _mm512_mask_blend_ps(
                    b6,
                    _mm512_mask_blend_ps(b5, r0, r1),
                    _mm512_mask_blend_ps(b5, r2, r3),
                )
            };
            let r = _mm512_maskz_mul_ps(positive, p, scale);
            mul(sign_v, add(mul(r, range_v), lo_v))
        };
        // LaneSums' grouping: f32 sums of lanes 0..16 and 16..32 over each group of blocks,
        // added into four vectors of its f64 sums (lanes 8i .. 8i + 8); the same additions.
        let kv = _mm512_set1_ps(sums.k);
        let mut acc_s = [_mm512_setzero_pd(); 4];
        let mut acc_q = [_mm512_setzero_pd(); 4];
        let mut group = |g: &mut [f32]| {
            let (mut ps, mut pq) = ([_mm512_setzero_ps(); 2], [_mm512_setzero_ps(); 2]);
            for b in g.chunks_exact_mut(LANES) {
                for h in 0..2 {
                    let out = map(_mm512_loadu_ps(b[16 * h..].as_ptr()));
                    _mm512_storeu_ps(b[16 * h..].as_mut_ptr(), out);
                    let d = _mm512_sub_ps(out, kv);
                    ps[h] = add(ps[h], d);
                    pq[h] = add(pq[h], mul(d, d));
                }
            }
            for h in 0..2 {
                for (j, (s, q)) in [
                    (_mm512_castps512_ps256(ps[h]), _mm512_castps512_ps256(pq[h])),
                    (
                        _mm512_extractf32x8_ps::<1>(ps[h]),
                        _mm512_extractf32x8_ps::<1>(pq[h]),
                    ),
                ]
                .into_iter()
                .enumerate()
                {
                    let a = 2 * h + j;
                    acc_s[a] = _mm512_add_pd(acc_s[a], _mm512_cvtps_pd(s));
                    acc_q[a] = _mm512_add_pd(acc_q[a], _mm512_cvtps_pd(q));
                }
            }
        };
        let mut groups = c.chunks_exact_mut(LANES * FLUSH);
        for g in &mut groups {
            group(g);
        }
        let rest = groups.into_remainder();
        let whole = rest.len() / LANES * LANES;
        if whole > 0 {
            group(&mut rest[..whole]);
        }
        for a in 0..4 {
            _mm512_storeu_pd(sums.s[8 * a..].as_mut_ptr(), acc_s[a]);
            _mm512_storeu_pd(sums.q[8 * a..].as_mut_ptr(), acc_q[a]);
        }
        for v in &mut rest[whole..] {
            *v = scalar(*v);
            sums.add_one(*v);
        }
        sums
    }
}

/// `x^g` for `x` in 0..=1 and `g` > 0 as `2^(g * log2 x)`, both halves by bit manipulation and
/// short polynomials (branch-free, so loops over it vectorize).
#[inline(always)]
pub(super) fn pow_unit(x: f32, g: f32) -> f32 {
    if x <= 0.0 {
        return 0.0;
    }
    crate::util::fastmath::exp2(g * crate::util::fastmath::log2(x))
}
