//! nnU-Net's intensity augmentations of one patch, in its order: Gaussian noise, Gaussian blur,
//! multiplicative brightness, contrast, low-resolution simulation, inverted gamma, gamma.
//!
//! Probabilities and ranges are nnU-Net v2's defaults (`nnUNetTrainer.get_training_transforms`
//! with batchgeneratorsv2's transforms): each transform is applied to a patch with its
//! probability, then to each channel with its per-channel probability, with a draw of its own
//! per channel (nnU-Net's `synchronize_channels=False`) except the noise variance, which
//! channels share. Ranges marked "either side of 1" are drawn as nnU-Net's `BGContrast`: half
//! the time below 1, half the time above, so a factor is as likely to shrink as to grow.

use serde::{Deserialize, Serialize};

use std::cell::Cell;

use crate::error::{Error, Result};
use crate::util::rng::Rng;
#[cfg(target_arch = "x86_64")]
use crate::util::simd::Simd;

thread_local! {
    /// Working memory of blur and low resolution, kept per thread (a loader worker's): a
    /// patch-sized buffer allocated per call came fresh from the kernel each time and its
    /// page faults cost as much as the transform.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// This thread's scratch buffer, at least `len` long (contents unspecified); hand it back with
/// [`put_scratch`]. (A function taking a closure instead left the closure out of the AVX2
/// build.)
#[inline(always)]
fn take_scratch(len: usize) -> Vec<f32> {
    let mut buf = SCRATCH.take();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    buf
}

#[inline(always)]
fn put_scratch(buf: Vec<f32>) {
    SCRATCH.set(buf);
}

/// The intensity part of the augmentation options (`[train.augmentation.intensity]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntensityConfig {
    /// Gaussian noise: probability, and the range its variance is drawn from.
    pub noise_prob: f64,
    pub noise_variance: [f64; 2],
    /// Gaussian blur: probability, per-channel probability, sigma range in voxels (one draw
    /// per axis).
    pub blur_prob: f64,
    pub blur_channel_prob: f64,
    pub blur_sigma: [f64; 2],
    /// Multiplicative brightness: probability and factor range (either side of 1).
    pub brightness_prob: f64,
    pub brightness_range: [f64; 2],
    /// Contrast around the mean, clipped to the patch's range: probability, factor range
    /// (either side of 1).
    pub contrast_prob: f64,
    pub contrast_range: [f64; 2],
    /// Low resolution: probability, per-channel probability, zoom range (down by nearest, back
    /// up linearly; z untouched for in-plane patches).
    pub lowres_prob: f64,
    pub lowres_channel_prob: f64,
    pub lowres_zoom: [f64; 2],
    /// Gamma with the mean and standard deviation kept: probability of the inverted variant
    /// (applied to the negated image), of the plain one, and the gamma range (either side of 1).
    pub inverted_gamma_prob: f64,
    pub gamma_prob: f64,
    pub gamma_range: [f64; 2],
}

impl Default for IntensityConfig {
    fn default() -> Self {
        IntensityConfig {
            noise_prob: 0.1,
            noise_variance: [0.0, 0.1],
            blur_prob: 0.2,
            blur_channel_prob: 0.5,
            blur_sigma: [0.5, 1.0],
            brightness_prob: 0.15,
            brightness_range: [0.75, 1.25],
            contrast_prob: 0.15,
            contrast_range: [0.75, 1.25],
            lowres_prob: 0.25,
            lowres_channel_prob: 0.5,
            lowres_zoom: [0.5, 1.0],
            inverted_gamma_prob: 0.1,
            gamma_prob: 0.3,
            gamma_range: [0.7, 1.5],
        }
    }
}

impl IntensityConfig {
    /// Nothing applied.
    pub fn none() -> Self {
        IntensityConfig {
            noise_prob: 0.0,
            blur_prob: 0.0,
            brightness_prob: 0.0,
            contrast_prob: 0.0,
            lowres_prob: 0.0,
            inverted_gamma_prob: 0.0,
            gamma_prob: 0.0,
            ..IntensityConfig::default()
        }
    }

    /// Every transform on every patch and channel, ranges as configured: for benchmarks.
    pub fn every(&self) -> Self {
        IntensityConfig {
            noise_prob: 1.0,
            blur_prob: 1.0,
            blur_channel_prob: 1.0,
            brightness_prob: 1.0,
            contrast_prob: 1.0,
            lowres_prob: 1.0,
            lowres_channel_prob: 1.0,
            inverted_gamma_prob: 1.0,
            gamma_prob: 1.0,
            ..self.clone()
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("augmentation.intensity: {m}")));
        for (name, p) in [
            ("noise_prob", self.noise_prob),
            ("blur_prob", self.blur_prob),
            ("blur_channel_prob", self.blur_channel_prob),
            ("brightness_prob", self.brightness_prob),
            ("contrast_prob", self.contrast_prob),
            ("lowres_prob", self.lowres_prob),
            ("lowres_channel_prob", self.lowres_channel_prob),
            ("inverted_gamma_prob", self.inverted_gamma_prob),
            ("gamma_prob", self.gamma_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(format!("{name} {p} is not between 0 and 1"));
            }
        }
        for (name, [lo, hi], min, max) in [
            ("noise_variance", self.noise_variance, 0.0, 10.0),
            ("blur_sigma", self.blur_sigma, 0.0, 8.0),
            ("brightness_range", self.brightness_range, 1e-3, 10.0),
            ("contrast_range", self.contrast_range, 1e-3, 10.0),
            ("lowres_zoom", self.lowres_zoom, 0.05, 1.0),
            ("gamma_range", self.gamma_range, 1e-2, 10.0),
        ] {
            if !(lo.is_finite() && hi.is_finite() && min <= lo && lo <= hi && hi <= max) {
                return bad(format!(
                    "{name} [{lo}, {hi}] must be ordered and within {min}..{max}"
                ));
            }
        }
        Ok(())
    }
}

/// Apply the intensity transforms to `image` (channels one after the other, each `size_zyx`
/// voxels in C order). `in_plane` keeps the low-resolution simulation off the z axis.
pub fn apply(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    #[cfg(target_arch = "x86_64")]
    match crate::util::simd::best() {
        // SAFETY: the CPU has these features (`simd::best` checked them).
        Simd::Avx512 => return unsafe { apply_avx512(image, size_zyx, in_plane, cfg, rng) },
        Simd::Avx2 => return unsafe { apply_avx2(image, size_zyx, in_plane, cfg, rng) },
        Simd::Portable => {}
    }
    apply_body::<false>(image, size_zyx, in_plane, cfg, rng);
}

/// [`apply`] compiled for AVX2: the element-wise loops (gamma's power, blur, contrast) run 8
/// lanes wide instead of SSE's 4. Same results bit for bit: the operations and their order are
/// the same, only more of them per instruction (no fused multiply-add is enabled).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn apply_avx2(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    apply_body::<false>(image, size_zyx, in_plane, cfg, rng);
}

/// [`apply`] compiled for AVX-512: 16 lanes, and 32 vector registers (gamma 0.41 -> 0.24 ms,
/// contrast 0.10 -> 0.06 ms per 32x96x96 patch against AVX2). Same results bit for bit, as
/// for [`apply_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512dq")]
unsafe fn apply_avx512(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    apply_body::<true>(image, size_zyx, in_plane, cfg, rng);
}

/// The transforms; `W512`: called from [`apply_avx512`] (gamma's table read by permutes).
#[inline(always)]
fn apply_body<const W512: bool>(
    image: &mut [f32],
    size_zyx: [usize; 3],
    in_plane: bool,
    cfg: &IntensityConfig,
    rng: &mut Rng,
) {
    let n: usize = size_zyx.iter().product();
    if rng.chance(cfg.noise_prob) {
        let var = rng.range(cfg.noise_variance[0], cfg.noise_variance[1]);
        let std = var.sqrt();
        if std > 0.0 {
            rng.add_normal(image, std);
        }
    }
    if rng.chance(cfg.blur_prob) {
        for c in image.chunks_exact_mut(n) {
            if rng.chance(cfg.blur_channel_prob) {
                let sigma = [0, 1, 2].map(|_| rng.range(cfg.blur_sigma[0], cfg.blur_sigma[1]));
                gaussian_blur_in::<W512>(c, size_zyx, sigma);
            }
        }
    }
    if rng.chance(cfg.brightness_prob) {
        for c in image.chunks_exact_mut(n) {
            let f = either_side_of_one(cfg.brightness_range, rng) as f32;
            c.iter_mut().for_each(|v| *v *= f);
        }
    }
    if rng.chance(cfg.contrast_prob) {
        for c in image.chunks_exact_mut(n) {
            let f = either_side_of_one(cfg.contrast_range, rng);
            contrast(c, f);
        }
    }
    if rng.chance(cfg.lowres_prob) {
        for c in image.chunks_exact_mut(n) {
            if rng.chance(cfg.lowres_channel_prob) {
                let zoom = rng.range(cfg.lowres_zoom[0], cfg.lowres_zoom[1]);
                low_resolution_in::<W512>(c, size_zyx, zoom, in_plane);
            }
        }
    }
    for (p, invert) in [(cfg.inverted_gamma_prob, true), (cfg.gamma_prob, false)] {
        if rng.chance(p) {
            for c in image.chunks_exact_mut(n) {
                let g = either_side_of_one(cfg.gamma_range, rng);
                gamma_in::<W512>(c, g, invert);
            }
        }
    }
}

/// nnU-Net's `BGContrast` draw: below 1 half the time (when the range reaches below 1), else
/// at or above 1.
fn either_side_of_one([lo, hi]: [f64; 2], rng: &mut Rng) -> f64 {
    if rng.chance(0.5) && lo < 1.0 {
        rng.range(lo, hi.min(1.0))
    } else {
        rng.range(lo.max(1.0), hi.max(1.0))
    }
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

/// Gamma on the values rescaled to 0..1, then the original mean and standard deviation put
/// back; `invert` applies it to the negated values (brightening the dark end instead).
#[inline(always)]
pub fn gamma(c: &mut [f32], g: f64, invert: bool) {
    gamma_in::<false>(c, g, invert);
}

/// [`gamma`]; `W512`: the CPU has AVX-512 (F, DQ) and the caller is compiled for it.
#[inline(always)]
fn gamma_in<const W512: bool>(c: &mut [f32], g: f64, invert: bool) {
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
struct PowFit {
    /// `2^(-k g)` for k = 0..=127, 0 where that is below f32's normal range (so no product
    /// is subnormal: those are slow on some CPUs, and zero there is within the error).
    scale: [f32; 128],
    /// Coefficients in powers of `m - 1.5`.
    coef: [f32; 7],
}

impl PowFit {
    const MAX_G: f64 = 4.0;

    fn new(g: f64) -> Option<Self> {
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
    fn at(&self, x: f32) -> f32 {
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
    unsafe fn map_avx512(
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
fn pow_unit(x: f32, g: f32) -> f32 {
    if x <= 0.0 {
        return 0.0;
    }
    crate::util::fastmath::exp2(g * crate::util::fastmath::log2(x))
}

/// The lanes [`LaneSums`] and [`Moments`] keep: 32 independent sums vectorize into two
/// AVX-512 accumulators (four AVX2 ones), not one whose additions' latency would bound the
/// loop. The same count in every build, so the same sums bit for bit.
const LANES: usize = 32;

/// Blocks of [`LANES`] values that [`LaneSums`] sums in f32 before adding those partial sums
/// into its f64 ones: summing every value in f64 (two conversions and twice the vectors) was
/// half of gamma's time. Eight terms of an f32 sum are within about 5e-7 of theirs, and the
/// values are taken about a centre near their mean, so the mean and deviation keep six digits
/// or more.
const FLUSH: usize = 8;

/// Sums of `v - k` and `(v - k)^2` in [`LANES`] lanes, about a centre `k` near the data's
/// mean ([`LaneSums::centre`]: the variance as `E[d^2] - E[d]^2` loses the digits that
/// `(k - mean)^2 / var` takes; one pass where the mean first, then the squares, took two): in
/// f32 over groups of up to [`FLUSH`] blocks, then in f64 ([`LaneSums::add_group`]); values
/// past the last whole block in f64.
struct LaneSums {
    k: f32,
    s: [f64; LANES],
    q: [f64; LANES],
    tail: (f64, f64),
}

impl LaneSums {
    #[inline(always)]
    fn new(c: &[f32]) -> Self {
        Self::about(Self::centre(c.len(), |i| c[i]))
    }

    /// The mean of [`LANES`] values spread evenly over `n` (`at(i)` the value at `i`): a
    /// centre for the sums near the mean of the whole, wherever in it the outliers lie (the
    /// first value, a corner of the patch, could be one: its distance from the mean was
    /// squared into the error).
    #[inline(always)]
    fn centre(n: usize, at: impl Fn(usize) -> f32) -> f32 {
        let m = n.min(LANES);
        let sum: f64 = (0..m).map(|i| at(i * n / m.max(1)) as f64).sum();
        (sum / m.max(1) as f64) as f32
    }

    #[inline(always)]
    fn about(k: f32) -> Self {
        LaneSums {
            k,
            s: [0.0; LANES],
            q: [0.0; LANES],
            tail: (0.0, 0.0),
        }
    }

    #[inline(always)]
    fn of(c: &[f32]) -> Self {
        let mut sums = LaneSums::new(c);
        sums.add_all(c, |_, _| {});
        sums
    }

    /// Add every value of `c`, calling `each(lane, v)` on each too (lane 0 past the last
    /// whole block): groups of [`FLUSH`] blocks of [`LANES`], a last group of the whole
    /// blocks left, then the values past them one by one.
    #[inline(always)]
    fn add_all(&mut self, c: &[f32], mut each: impl FnMut(usize, f32)) {
        let mut groups = c.chunks_exact(LANES * FLUSH);
        for g in &mut groups {
            self.add_group(g, &mut each);
        }
        let rest = groups.remainder();
        let whole = rest.len() / LANES * LANES;
        if whole > 0 {
            self.add_group(&rest[..whole], &mut each);
        }
        for &v in &rest[whole..] {
            self.add_one(v);
            each(0, v);
        }
    }

    /// A group of whole blocks (at most [`FLUSH`]): lane i sums element i of each block in
    /// f32, in order from 0, then adds that sum to its f64 one.
    #[inline(always)]
    fn add_group(&mut self, g: &[f32], each: &mut impl FnMut(usize, f32)) {
        let (mut ps, mut pq) = ([0f32; LANES], [0f32; LANES]);
        for b in g.chunks_exact(LANES) {
            for (i, ((s, q), &v)) in ps.iter_mut().zip(pq.iter_mut()).zip(b).enumerate() {
                let d = v - self.k;
                *s += d;
                *q += d * d;
                each(i, v);
            }
        }
        self.flush(&ps, &pq);
    }

    #[inline(always)]
    fn flush(&mut self, ps: &[f32; LANES], pq: &[f32; LANES]) {
        for j in 0..LANES {
            self.s[j] += ps[j] as f64;
            self.q[j] += pq[j] as f64;
        }
    }

    #[inline(always)]
    fn add_one(&mut self, v: f32) {
        let d = v as f64 - self.k as f64;
        self.tail.0 += d;
        self.tail.1 += d * d;
    }

    /// Mean and (population) standard deviation of the `n` values added.
    #[inline(always)]
    fn mean_std(&self, n: usize) -> (f64, f64) {
        let n = n.max(1) as f64;
        let d = (self.s.iter().sum::<f64>() + self.tail.0) / n;
        let q = (self.q.iter().sum::<f64>() + self.tail.1) / n;
        (self.k as f64 + d, (q - d * d).max(0.0).sqrt())
    }
}

/// [`LaneSums`], minimum and maximum of the values in one pass.
struct Moments {
    sums: LaneSums,
    lo: f32,
    hi: f32,
}

impl Moments {
    #[inline(always)]
    fn of(c: &[f32]) -> Self {
        let mut sums = LaneSums::new(c);
        let (mut lo, mut hi) = ([f32::INFINITY; LANES], [f32::NEG_INFINITY; LANES]);
        sums.add_all(c, |i, v| {
            // Compares and selects (`f32::min` spends more on NaN, which a patch cannot hold).
            lo[i] = if v < lo[i] { v } else { lo[i] };
            hi[i] = if v > hi[i] { v } else { hi[i] };
        });
        let lo = lo.iter().fold(f32::INFINITY, |a, &b| a.min(b));
        let hi = hi.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        Moments { sums, lo, hi }
    }
}

/// Separable Gaussian blur with per-axis sigma (voxels), kernels cut at 4 sigma, the edges
/// mirrored (scipy's `gaussian_filter` defaults).
#[inline(always)]
pub fn gaussian_blur(c: &mut [f32], size: [usize; 3], sigma: [f64; 3]) {
    gaussian_blur_in::<false>(c, size, sigma);
}

/// [`gaussian_blur`]; `W512`: the CPU has AVX-512 and the caller is compiled for it.
#[inline(always)]
fn gaussian_blur_in<const W512: bool>(c: &mut [f32], size: [usize; 3], sigma: [f64; 3]) {
    let n: usize = size.iter().product();
    let active = |axis: usize| sigma[axis] > 0.0 && size[axis] >= 2;
    // The volume (the z and y passes write there and back) and one padded line (x pass).
    let pad = size[2] + 2 * (4.0 * sigma[2] + 0.5) as usize + 1;
    let mut buf = take_scratch(n + pad);
    let (tmp, line) = buf.split_at_mut(n);
    // Whether the values are in `tmp` (each plane pass moves them across: no copies).
    let mut in_tmp = false;
    for axis in (0..2).filter(|&a| active(a)) {
        let kernel = gaussian_kernel(sigma[axis]);
        if in_tmp {
            blur_planes::<W512>(tmp, c, size, axis, &kernel);
        } else {
            blur_planes::<W512>(c, tmp, size, axis, &kernel);
        }
        in_tmp = !in_tmp;
    }
    if active(2) {
        let from = in_tmp.then_some(&*tmp);
        blur_lines::<W512>(from, c, line, size[2], &gaussian_kernel(sigma[2]));
    } else if in_tmp {
        c.copy_from_slice(tmp);
    }
    put_scratch(buf);
}

/// The z (`axis` 0) or y (1) pass of [`gaussian_blur`] from `src` into `dst`: whole rows
/// (planes) at a time, contiguous and vectorizable.
#[inline(always)]
fn blur_planes<const W512: bool>(
    src: &[f32],
    dst: &mut [f32],
    size: [usize; 3],
    axis: usize,
    kernel: &[f32],
) {
    let len = size[axis];
    let stride: usize = size[axis + 1..].iter().product();
    let r = kernel.len() / 2;
    // Source index of each tap position (-r .. len + r), reflected into the line.
    let source: Vec<usize> = (0..len + 2 * r)
        .map(|p| reflect(p as i64 - r as i64, len))
        .collect();
    // Rows r .. len - r read no mirrored row: tap k of output t is source t + (k - r) rows,
    // so they are one call over consecutive rows (one per row was a call per 128 voxels in
    // the y pass); the 2r rows at the ends one by one.
    let inner = r..len.saturating_sub(r).max(r);
    for (block, src) in dst
        .chunks_exact_mut(len * stride)
        .zip(src.chunks_exact(len * stride))
    {
        if !inner.is_empty() {
            let out = &mut block[inner.start * stride..inner.end * stride];
            taps_into::<W512>(out, kernel, |k| &src[k * stride..]);
        }
        for i in (0..len).filter(|i| !inner.contains(i)) {
            let out = &mut block[i * stride..][..stride];
            taps_into::<W512>(out, kernel, |k| &src[source[i + k] * stride..]);
        }
    }
}
/// The x pass of [`gaussian_blur`]: each line of `len` from `src` (or with `None`, from
/// `dst` itself) padded by reflection into `pad`, then the taps summed over it into `dst`'s
/// line. The line's own values copied whole, only the 2r mirrored ends one by one (a copy
/// through an index table, voxel by voxel, was most of this pass).
#[inline(always)]
fn blur_lines<const W512: bool>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    pad: &mut [f32],
    len: usize,
    kernel: &[f32],
) {
    let r = kernel.len() / 2;
    let source: Vec<usize> = (0..len + 2 * r)
        .map(|p| reflect(p as i64 - r as i64, len))
        .collect();
    let pad = &mut pad[..len + 2 * r];
    for (i, line) in dst.chunks_exact_mut(len).enumerate() {
        match src {
            Some(s) => pad[r..r + len].copy_from_slice(&s[i * len..][..len]),
            None => pad[r..r + len].copy_from_slice(line),
        }
        for p in (0..r).chain(r + len..len + 2 * r) {
            pad[p] = pad[r + source[p]];
        }
        taps_into::<W512>(line, kernel, |k| &pad[k..]);
    }
}

/// The most taps [`taps_into`] holds its rows for at once: a kernel of sigma up to 8 (the
/// configuration's limit) cut at 4 sigma.
const MAX_TAPS: usize = 65;

/// `out[t] = sum over k of kernel[k] * row(k)[t]` for a symmetric kernel of odd length
/// 2r + 1, as `kernel[r] * row(r)[t]` plus, for j from 1 to r in turn,
/// `kernel[r + j] * (row(r - j)[t] + row(r + j)[t])` (each pair of taps the kernel weighs
/// alike summed first: r + 1 multiplies where there were 2r + 1). Blocks of 64 outputs are
/// summed in registers over every tap before one store (adding each tap to the whole output
/// instead stored and reloaded the output once per tap); each tap's row is looked up once per
/// call, not once per block. With AVX-512 (`W512`), blocks of 128 first: eight of its 32
/// registers per block, half the per-tap row lookups (blur 0.214 -> 0.196 ms on 16x128x128;
/// AVX2's 16 registers would spill).
#[inline(always)]
fn taps_into<'a, const W512: bool>(
    out: &mut [f32],
    kernel: &[f32],
    row: impl Fn(usize) -> &'a [f32],
) {
    const BLOCK: usize = 64;
    let len = out.len();
    if kernel.len() > MAX_TAPS {
        // Wider than any configuration allows: the same sums, a tap at a time.
        let r = kernel.len() / 2;
        for (o, v) in out.iter_mut().zip(&row(r)[..len]) {
            *o = kernel[r] * v;
        }
        for j in 1..=r {
            let (a, b) = (&row(r - j)[..len], &row(r + j)[..len]);
            for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
                *o += kernel[r + j] * (x + y);
            }
        }
        return;
    }
    // Uninitialized past the kernel's length: setting all 65 entries (a kilobyte) was a
    // third of the x pass, which calls this once per line.
    let mut rows = [std::mem::MaybeUninit::<&[f32]>::uninit(); MAX_TAPS];
    for (k, r) in rows.iter_mut().enumerate().take(kernel.len()) {
        r.write(&row(k)[..len]);
    }
    // SAFETY: the first `kernel.len()` entries were written just above, and
    // `MaybeUninit<T>` has the layout of `T`.
    let rows: &[&[f32]] = unsafe { std::slice::from_raw_parts(rows.as_ptr().cast(), kernel.len()) };
    // Blocks of 128 (AVX-512), of 64, then one of 32 (rows of 96 are common), then the rest.
    let wide = if W512 {
        len / (2 * BLOCK) * (2 * BLOCK)
    } else {
        0
    };
    sum_blocks::<{ 2 * BLOCK }>(&mut out[..wide], 0, kernel, rows);
    let full = wide + (len - wide) / BLOCK * BLOCK;
    sum_blocks::<BLOCK>(&mut out[wide..full], wide, kernel, rows);
    let half = full + (len - full) / (BLOCK / 2) * (BLOCK / 2);
    sum_blocks::<{ BLOCK / 2 }>(&mut out[full..half], full, kernel, rows);
    let r = kernel.len() / 2;
    let rest = &mut out[half..];
    for (o, v) in rest.iter_mut().zip(&rows[r][half..]) {
        *o = kernel[r] * v;
    }
    for j in 1..=r {
        let (a, b) = (&rows[r - j][half..], &rows[r + j][half..]);
        for ((o, x), y) in rest.iter_mut().zip(a).zip(b) {
            *o += kernel[r + j] * (x + y);
        }
    }
}

/// [`taps_into`]'s blocks of `B` outputs (`out` starts at output `from`; its length a
/// multiple of `B`), each summed in registers over every tap.
#[inline(always)]
fn sum_blocks<const B: usize>(out: &mut [f32], from: usize, kernel: &[f32], rows: &[&[f32]]) {
    let r = kernel.len() / 2;
    for (b, o) in out.chunks_exact_mut(B).enumerate() {
        let at = from + b * B;
        let mut acc = [0f32; B];
        let centre = &rows[r][at..][..B];
        for t in 0..B {
            acc[t] = kernel[r] * centre[t];
        }
        for j in 1..=r {
            let (x, y, w) = (
                &rows[r - j][at..][..B],
                &rows[r + j][at..][..B],
                kernel[r + j],
            );
            for t in 0..B {
                acc[t] += w * (x[t] + y[t]);
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// Position `p` of a line of `n` mirrored into it (d c b a | a b c d | d c b a).
fn reflect(mut p: i64, n: usize) -> usize {
    let n = n as i64;
    loop {
        if p < 0 {
            p = -p - 1;
        } else if p >= n {
            p = 2 * n - p - 1;
        } else {
            return p as usize;
        }
    }
}

/// Symmetric bit for bit (`x` and `-x` give the same square), as [`taps_into`] needs.
fn gaussian_kernel(sigma: f64) -> Vec<f32> {
    let r = (4.0 * sigma + 0.5) as i64;
    let w: Vec<f64> = (-r..=r)
        .map(|x| (-0.5 * (x as f64 / sigma).powi(2)).exp())
        .collect();
    let s: f64 = w.iter().sum();
    w.iter().map(|v| (v / s) as f32).collect()
}

/// The x pass of [`low_resolution`] 16 outputs at a time: their two taps lie within 32
/// voxels of the row from the block's first (for zooms from about 1/2: neighbouring outputs
/// read the same or the next small-grid voxel), so two loads and two permutes fetch them
/// where 32 scalar loads did (the gathers were most of this transform). The same lerps, so
/// the same bits; blocks whose taps spread wider, and the row's last few outputs, one by one.
#[cfg(target_arch = "x86_64")]
struct XBlocks {
    /// Per block of 16 outputs; `None` for blocks read voxel by voxel.
    blocks: Vec<Option<XBlock>>,
}

/// A block of [`XBlocks`]: the first voxel it reads, its taps' offsets from it, the fractions.
#[cfg(target_arch = "x86_64")]
type XBlock = (usize, [i32; 16], [i32; 16], [f32; 16]);

#[cfg(target_arch = "x86_64")]
impl XBlocks {
    fn new(tx: &[(usize, usize, f32)]) -> Self {
        let blocks = tx
            .chunks_exact(16)
            .map(|b| {
                let w0 = b.iter().map(|t| t.0.min(t.1)).min()?;
                let far = b.iter().map(|t| t.0.max(t.1)).max()?;
                (far - w0 < 32 && w0 + 32 <= tx.len()).then(|| {
                    (
                        w0,
                        std::array::from_fn(|k| (b[k].0 - w0) as i32),
                        std::array::from_fn(|k| (b[k].1 - w0) as i32),
                        std::array::from_fn(|k| b[k].2),
                    )
                })
            })
            .collect();
        XBlocks { blocks }
    }

    /// `out[j] = lerp(row[tx[j].0], row[tx[j].1], tx[j].2)` for every j.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F.
    #[target_feature(enable = "avx512f")]
    unsafe fn lerp_row(&self, row: &[f32], out: &mut [f32], tx: &[(usize, usize, f32)]) {
        use std::arch::x86_64::*;
        let lerp = |a: f32, b: f32, f: f32| a + (b - a) * f;
        for (k, b) in self.blocks.iter().enumerate() {
            let o = &mut out[16 * k..16 * k + 16];
            match b {
                Some((w0, i0, i1, f)) => {
                    let win = &row[*w0..*w0 + 32];
                    let (lo, hi) = (
                        _mm512_loadu_ps(win.as_ptr()),
                        _mm512_loadu_ps(win.as_ptr().add(16)),
                    );
                    let a = _mm512_permutex2var_ps(lo, _mm512_loadu_si512(i0.as_ptr().cast()), hi);
                    let b = _mm512_permutex2var_ps(lo, _mm512_loadu_si512(i1.as_ptr().cast()), hi);
                    let f = _mm512_loadu_ps(f.as_ptr());
                    let v = _mm512_add_ps(a, _mm512_mul_ps(_mm512_sub_ps(b, a), f));
                    _mm512_storeu_ps(o.as_mut_ptr(), v);
                }
                None => {
                    for (o, &(i0, i1, f)) in o.iter_mut().zip(&tx[16 * k..]) {
                        *o = lerp(row[i0], row[i1], f);
                    }
                }
            }
        }
        let done = self.blocks.len() * 16;
        for (o, &(i0, i1, f)) in out[done..].iter_mut().zip(&tx[done..]) {
            *o = lerp(row[i0], row[i1], f);
        }
    }
}

/// Down to `round(n * zoom)` voxels per axis by nearest neighbour, then back up linearly
/// (half-voxel-centred, edges clamped), as nnU-Net's `SimulateLowResolutionTransform`.
#[inline(always)]
pub fn low_resolution(c: &mut [f32], size: [usize; 3], zoom: f64, in_plane: bool) {
    low_resolution_in::<false>(c, size, zoom, in_plane);
}

/// [`low_resolution`]; `W512`: the CPU has AVX-512 F and the caller is compiled for it (the x
/// pass by permutes, [`XBlocks`]).
#[inline(always)]
fn low_resolution_in<const W512: bool>(c: &mut [f32], size: [usize; 3], zoom: f64, in_plane: bool) {
    let small: [usize; 3] = std::array::from_fn(|a| {
        if in_plane && a == 0 {
            size[0]
        } else {
            ((size[a] as f64 * zoom).round() as usize).max(1)
        }
    });
    if small == size {
        return;
    }
    // Nearest source voxel of each small-grid voxel, per axis.
    let near: [Vec<usize>; 3] = std::array::from_fn(|a| {
        (0..small[a])
            .map(|j| {
                (((j as f64 + 0.5) * size[a] as f64 / small[a] as f64) as usize).min(size[a] - 1)
            })
            .collect()
    });
    // Linear weights of output voxel j on the small grid, per axis.
    let taps = |a: usize| -> Vec<(usize, usize, f32)> {
        (0..size[a])
            .map(|j| {
                let s = ((j as f64 + 0.5) * small[a] as f64 / size[a] as f64 - 0.5)
                    .clamp(0.0, (small[a] - 1) as f64);
                let i0 = s.floor() as usize;
                let i1 = (i0 + 1).min(small[a] - 1);
                (i0, i1, (s - i0 as f64) as f32)
            })
            .collect()
    };
    let (tz, ty) = (taps(0), taps(1));
    // x's taps straight into the full-resolution row: the small grid's voxel i of a row is
    // the row's voxel `near[2][i]`, so the small grid needs no pass of its own (a gather a
    // voxel: a quarter of this transform).
    let tx: Vec<(usize, usize, f32)> = taps(2)
        .into_iter()
        .map(|(i0, i1, f)| (near[2][i0], near[2][i1], f))
        .collect();
    let lerp = |a: f32, b: f32, f: f32| a + (b - a) * f;
    let plane = size[1] * size[2];
    let n_x = small[0] * small[1] * size[2];
    let n_y = small[0] * plane;
    let mut buf = take_scratch(n_x + n_y);
    {
        let (up_x, rest) = buf.split_at_mut(n_x);
        let up_y = &mut rest[..n_y];
        // Back up one axis at a time, x then y then z: the same lerps in the same order as
        // the trilinear formula (so the same values), each pass over whole rows or planes.
        let mut rows = up_x.chunks_exact_mut(size[2]);
        #[cfg(target_arch = "x86_64")]
        let blocks = W512.then(|| XBlocks::new(&tx));
        for &sz in &near[0] {
            for &sy in &near[1] {
                let row = &c[(sz * size[1] + sy) * size[2]..][..size[2]];
                let out = rows.next().expect("a row per small-grid row");
                #[cfg(target_arch = "x86_64")]
                if let Some(b) = &blocks {
                    // SAFETY: the caller's `W512`: the CPU has AVX-512 F.
                    unsafe { b.lerp_row(row, out, &tx) };
                    continue;
                }
                for (o, &(i0, i1, f)) in out.iter_mut().zip(&tx) {
                    *o = lerp(row[i0], row[i1], f);
                }
            }
        }
        // With z kept (in-plane) every z weight is 0: the y pass's planes are the result,
        // written straight into `c` (a copy of the patch after it was a sixth of the time).
        let keep_z = small[0] == size[0];
        let y_out = if keep_z { &mut *c } else { &mut *up_y };
        for (src, dst) in up_x
            .chunks_exact(small[1] * size[2])
            .zip(y_out.chunks_exact_mut(plane))
        {
            for (out, &(i0, i1, f)) in dst.chunks_exact_mut(size[2]).zip(&ty) {
                let (a, b) = (
                    &src[i0 * size[2]..][..size[2]],
                    &src[i1 * size[2]..][..size[2]],
                );
                for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                    *o = lerp(a, b, f);
                }
            }
        }
        if !keep_z {
            for (out, &(i0, i1, f)) in c.chunks_exact_mut(plane).zip(&tz) {
                let (a, b) = (&up_y[i0 * plane..][..plane], &up_y[i1 * plane..][..plane]);
                for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                    *o = lerp(a, b, f);
                }
            }
        }
    }
    put_scratch(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn min_max(c: &[f32]) -> (f32, f32) {
        c.iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            })
    }

    /// Two passes in f64, the textbook way (the transforms sum in one).
    fn mean_std(c: &[f32]) -> (f64, f64) {
        let n = c.len() as f64;
        let mean = c.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = c.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    }

    #[test]
    fn one_pass_moments_equal_two_pass_ones() {
        // Within 1e-6 of the deviation (f32 partial sums of eight terms, see FLUSH): lengths
        // with and without a partial group of blocks and values past them, data far from 0,
        // a first value (the sums' centre) far from the rest, and a patch's worth.
        let mut rng = Rng::new(9);
        let cases = [
            (1usize, 0.0f32, 0.0f32),
            (31, 3.0, 0.0),
            (1000, 1e4, 0.0),
            (4099, -250.0, 0.0),
            (4099, 0.0, 40.0),
            (16 * 128 * 128 + 77, 2.0, 0.0),
            (16 * 128 * 128, 0.0, -1e4),
        ];
        for (n, offset, first) in cases {
            let mut c: Vec<f32> = (0..n).map(|_| offset + rng.normal() as f32).collect();
            c[0] += first;
            let m = Moments::of(&c);
            let ((mean, std), (want_m, want_s)) = (m.sums.mean_std(n), mean_std(&c));
            assert!(
                (mean - want_m).abs() <= 1e-6 * want_s.max(1e-3),
                "{n}: {mean} {want_m}"
            );
            assert!(
                (std - want_s).abs() <= 1e-6 * want_s.max(1e-3),
                "{n}: {std} {want_s}"
            );
            assert_eq!((m.lo, m.hi), min_max(&c));
            assert_eq!(LaneSums::of(&c).mean_std(n), m.sums.mean_std(n));
        }
    }

    #[test]
    fn the_fitted_power_matches_powf() {
        for g in [0.01f64, 0.1, 0.7, 0.9, 1.0, 1.2, 1.5, 2.5, 3.0, 3.7, 4.0] {
            let fit = PowFit::new(g).expect("within the fit's range");
            let mut worst = 0f32;
            for k in 0..=20_000 {
                // Values across the unit interval and down to f32's smallest normal one (a
                // patch's values rescaled to 0..1 are 0 or far above it), and 1 itself.
                for x in [k as f32 / 20_000.0, (k as f32 / 20_000.0 * -126.0).exp2()] {
                    let (a, b) = (fit.at(x), (x as f64).powf(g) as f32);
                    let err = (a - b).abs() / b.max(f32::MIN_POSITIVE);
                    // Where the table's power of two would be subnormal it is 0: results
                    // below 2^g times f32's smallest normal value may be 0.
                    let tiny = (g + 1.0).exp2() as f32 * f32::MIN_POSITIVE;
                    if b >= tiny {
                        worst = worst.max(err);
                    } else {
                        assert!(a < tiny, "{x}^{g}: {a} vs {b}");
                    }
                }
            }
            assert!(worst < 1e-6, "g {g}: relative error {worst}");
        }
        assert_eq!(PowFit::new(0.7).map(|f| f.at(0.0)), Some(0.0));
        assert!(PowFit::new(4.5).is_none() && PowFit::new(0.0).is_none());
    }

    fn ramp(size: [usize; 3]) -> Vec<f32> {
        let n: usize = size.iter().product();
        (0..n)
            .map(|i| ((i * 37) % 101) as f32 * 0.1 - 3.0)
            .collect()
    }

    #[test]
    fn none_changes_nothing_and_defaults_are_valid() {
        let size = [4, 6, 6];
        let img = ramp(size);
        for seed in 0..50 {
            let mut a = img.clone();
            apply(
                &mut a,
                size,
                false,
                &IntensityConfig::none(),
                &mut Rng::new(seed),
            );
            assert_eq!(a, img);
        }
        IntensityConfig::default().validate().unwrap();
        let bad = IntensityConfig {
            gamma_range: [1.5, 0.7],
            ..IntensityConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn blur_keeps_constants_and_the_sum_and_matches_a_direct_sum() {
        let size = [5, 7, 9];
        let mut flat = vec![2.5f32; 5 * 63];
        gaussian_blur(&mut flat, size, [0.7, 1.0, 0.5]);
        assert!(flat.iter().all(|v| (v - 2.5).abs() < 1e-5));
        // One axis against a direct reflected sum.
        let mut img = ramp([1, 1, 9]);
        let orig = img.clone();
        gaussian_blur(&mut img, [1, 1, 9], [0.0, 0.0, 0.8]);
        let k = gaussian_kernel(0.8);
        let r = (k.len() / 2) as i64;
        for i in 0..9i64 {
            let want: f32 = (0..k.len() as i64)
                .map(|q| {
                    let mut j = i + q - r;
                    if j < 0 {
                        j = -j - 1;
                    }
                    if j >= 9 {
                        j = 17 - j;
                    }
                    k[q as usize] * orig[j as usize]
                })
                .sum();
            assert!((img[i as usize] - want).abs() < 1e-5);
        }
    }

    #[test]
    fn blur_equals_the_separable_sum_bit_for_bit() {
        for sigma in [[0.9, 0.6, 1.0], [0.4, 2.0, 8.5]] {
            blur_equals_the_separable_sum(sigma);
        }
    }

    /// Rows of a block of 64 outputs, one of 32 and a remainder (x), of one block of 32 and a
    /// remainder (y); the second sigma set has more taps along x than the rows held at once.
    fn blur_equals_the_separable_sum(sigma: [f64; 3]) {
        let size = [5, 38, 101];
        let mut img = ramp(size);
        for (i, v) in img.iter_mut().enumerate() {
            *v += ((i * 7919) % 17) as f32 * 0.21;
        }
        let mut want = img.clone();
        for axis in 0..3 {
            let k = gaussian_kernel(sigma[axis]);
            let r = (k.len() / 2) as i64;
            let stride: usize = size[axis + 1..].iter().product();
            let before = want.clone();
            for (p, out) in want.iter_mut().enumerate() {
                let i = (p / stride % size[axis]) as i64;
                let line_start = p - i as usize * stride;
                // The centre tap, then each pair of taps the kernel weighs alike.
                let v = |q: i64| before[line_start + reflect(i + q, size[axis]) * stride];
                let mut s = k[r as usize] * v(0);
                for j in 1..=r {
                    s += k[(r + j) as usize] * (v(-j) + v(j));
                }
                *out = s;
            }
        }
        gaussian_blur(&mut img, size, sigma);
        assert_eq!(img, want);
    }

    #[test]
    fn contrast_and_gamma_keep_what_they_promise() {
        let size = [3, 8, 8];
        let img = ramp(size);
        let (lo, hi) = min_max(&img);
        let mut c = img.clone();
        contrast(&mut c, 1.4);
        let (lo2, hi2) = min_max(&c);
        assert!(lo2 >= lo && hi2 <= hi);
        let (m0, s0) = mean_std(&img);
        for invert in [false, true] {
            let mut g = img.clone();
            gamma(&mut g, 0.7, invert);
            let (m, s) = mean_std(&g);
            assert!((m - m0).abs() < 1e-4 && (s - s0).abs() < 1e-4, "{m} {s}");
            assert_ne!(g, img);
            // Monotone: the order of values is kept.
            let mut idx: Vec<usize> = (0..img.len()).collect();
            idx.sort_by(|&a, &b| img[a].total_cmp(&img[b]));
            assert!(idx.windows(2).all(|w| g[w[0]] <= g[w[1]] + 1e-5));
        }
    }

    #[test]
    fn low_resolution_keeps_constants_and_the_z_axis_of_in_plane_patches() {
        let size = [4, 10, 10];
        let mut flat = vec![-1.25f32; 400];
        low_resolution(&mut flat, size, 0.5, false);
        assert!(flat.iter().all(|&v| v == -1.25));
        // Values constant in-plane, varying in z: in-plane low resolution keeps them.
        let mut layers: Vec<f32> = (0..400).map(|i| (i / 100) as f32).collect();
        let orig = layers.clone();
        low_resolution(&mut layers, size, 0.5, true);
        assert_eq!(layers, orig);
        let mut img = ramp(size);
        let before = img.clone();
        low_resolution(&mut img, size, 0.5, false);
        assert_ne!(img, before);
    }

    /// Low resolution voxel by voxel: nearest down, then the trilinear formula at each
    /// output voxel (half-voxel-centred, clamped).
    fn low_resolution_direct(c: &[f32], size: [usize; 3], small: [usize; 3]) -> Vec<f32> {
        let near = |a: usize, j: usize| {
            (((j as f64 + 0.5) * size[a] as f64 / small[a] as f64) as usize).min(size[a] - 1)
        };
        let low = |z: usize, y: usize, x: usize| {
            c[(near(0, z) * size[1] + near(1, y)) * size[2] + near(2, x)]
        };
        let tap = |a: usize, j: usize| {
            let s = ((j as f64 + 0.5) * small[a] as f64 / size[a] as f64 - 0.5)
                .clamp(0.0, (small[a] - 1) as f64);
            let i0 = s.floor() as usize;
            (i0, (i0 + 1).min(small[a] - 1), (s - i0 as f64) as f32)
        };
        let lerp = |a: f32, b: f32, f: f32| a + (b - a) * f;
        let mut out = Vec::with_capacity(c.len());
        for z in 0..size[0] {
            let (z0, z1, fz) = tap(0, z);
            for y in 0..size[1] {
                let (y0, y1, fy) = tap(1, y);
                for x in 0..size[2] {
                    let (x0, x1, fx) = tap(2, x);
                    let plane = |zz| {
                        lerp(
                            lerp(low(zz, y0, x0), low(zz, y0, x1), fx),
                            lerp(low(zz, y1, x0), low(zz, y1, x1), fx),
                            fy,
                        )
                    };
                    out.push(lerp(plane(z0), plane(z1), fz));
                }
            }
        }
        out
    }

    #[test]
    fn low_resolution_by_axes_equals_the_voxel_by_voxel_formula() {
        for (size, zoom, in_plane) in [
            ([7, 12, 9], 0.5, false),
            ([7, 12, 9], 0.73, false),
            ([5, 16, 16], 0.6, true),
            ([1, 3, 2], 0.5, false),
        ] {
            let mut img = ramp(size);
            for (i, v) in img.iter_mut().enumerate() {
                *v += ((i * 7919) % 13) as f32 * 0.37;
            }
            let small: [usize; 3] = std::array::from_fn(|a| {
                if in_plane && a == 0 {
                    size[0]
                } else {
                    ((size[a] as f64 * zoom).round() as usize).max(1)
                }
            });
            let want = low_resolution_direct(&img, size, small);
            low_resolution(&mut img, size, zoom, in_plane);
            assert_eq!(img, want, "{size:?} at {zoom}");
        }
    }

    #[test]
    fn the_polynomial_power_matches_powf() {
        for g in [0.7f32, 0.9, 1.0, 1.2, 1.5, 3.0] {
            for k in 0..=10_000 {
                let x = k as f32 / 10_000.0;
                let (a, b) = (pow_unit(x, g), x.powf(g));
                assert!(
                    (a - b).abs() <= 4e-6 * b.max(1e-30) + 1e-30,
                    "{x}^{g}: {a} vs {b}"
                );
            }
        }
        assert_eq!(pow_unit(0.0, 0.7), 0.0);
    }

    #[test]
    fn the_vector_builds_give_the_same_bits() {
        #[cfg(target_arch = "x86_64")]
        {
            let simd = crate::util::simd::detected();
            let cfg = IntensityConfig::default().every();
            for seed in 0..12 {
                // (An odd size too: the 16-lane loops' tails; long rows: the low-resolution
                // x pass by permutes, and its blocks past the row's end.)
                let size = match seed {
                    0..4 => [6, 20, 24],
                    4..8 => [5, 13, 17],
                    8..10 => [4, 10, 100],
                    _ => [3, 7, 133],
                };
                let in_plane = seed % 2 == 0;
                let mut a = ramp(size);
                apply_body::<false>(&mut a, size, in_plane, &cfg, &mut Rng::new(seed));
                if simd >= Simd::Avx2 {
                    let mut b = ramp(size);
                    // SAFETY: AVX2 is present (checked above).
                    unsafe { apply_avx2(&mut b, size, in_plane, &cfg, &mut Rng::new(seed)) };
                    assert_eq!(a, b, "AVX2, seed {seed}");
                }
                if simd >= Simd::Avx512 {
                    let mut b = ramp(size);
                    // SAFETY: AVX-512 F/VL/BW/DQ are present (checked above).
                    unsafe { apply_avx512(&mut b, size, in_plane, &cfg, &mut Rng::new(seed)) };
                    assert_eq!(a, b, "AVX-512, seed {seed}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gammas_table_reads_agree_over_every_exponent() {
        // Values from 1 down to below f32's normal range: every entry of the power's table,
        // read by the AVX-512 permutes and by the portable index, the same bits (before the
        // mean and deviation are put back, which would hide the smallest); both signs and a
        // range of g; and through the whole transform.
        if crate::util::simd::detected() < Simd::Avx512 {
            return;
        }
        let mut values: Vec<f32> = (0..150).map(|e| (-(e as f32) * 0.93).exp2()).collect();
        values.extend([0.0, 1.0, 0.37, 3e-39, -0.0, -0.5]);
        #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512dq")]
        unsafe fn wide(c: &mut [f32], g: f64, invert: bool) {
            gamma_in::<true>(c, g, invert);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for g in [0.7, 1.0, 1.3, 2.9, 4.0] {
            let fit = PowFit::new(g).expect("within range");
            for sign in [1.0f32, -1.0] {
                // (x = sign * v / range: every exponent down to the table's end.)
                let (lo, range) = (0.0, 1.5);
                let values: Vec<f32> = values.iter().map(|v| sign * v).collect();
                let mut a = values.clone();
                for v in &mut a {
                    let x = (sign * *v - lo) * (1.0 / range);
                    *v = sign * (fit.at(if x > 0.0 { x } else { 0.0 }) * range + lo);
                }
                let mut b = values.clone();
                // SAFETY: AVX-512 checked above.
                let sums = unsafe { fit.map_avx512(&mut b, sign, lo, 1.0 / range, range) };
                assert_eq!(bits(&a), bits(&b), "g {g}, sign {sign}");
                // The sums taken as the values are stored: those of a pass after.
                let n = b.len();
                assert_eq!(sums.mean_std(n), LaneSums::of(&b).mean_std(n));
                assert_eq!(sums.s, LaneSums::of(&b).s);
                // Shorter than one block of lanes: the remainder alone.
                let mut short = values[..20].to_vec();
                let sums = unsafe { fit.map_avx512(&mut short, sign, lo, 1.0 / range, range) };
                assert_eq!(bits(&a[..20]), bits(&short));
                assert_eq!(sums.mean_std(20), LaneSums::of(&short).mean_std(20));
            }
            for invert in [false, true] {
                let mut a = values.clone();
                gamma(&mut a, g, invert);
                let mut b = values.clone();
                // SAFETY: AVX-512 checked above.
                unsafe { wide(&mut b, g, invert) };
                assert_eq!(bits(&a), bits(&b), "g {g}, inverted {invert}");
            }
        }
    }

    #[test]
    fn either_side_of_one_is_balanced() {
        let mut rng = Rng::new(4);
        let draws: Vec<f64> = (0..4000)
            .map(|_| either_side_of_one([0.75, 1.25], &mut rng))
            .collect();
        let below = draws.iter().filter(|&&v| v < 1.0).count();
        assert!((1800..2200).contains(&below), "{below}");
        assert!(draws.iter().all(|v| (0.75..=1.25).contains(v)));
    }
}
