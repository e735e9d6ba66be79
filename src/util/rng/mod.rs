//! The random generators, one family. [`Rng`] (SplitMix64) is the small, serializable one
//! every draw of training comes from; [`xoshiro::Xoshiro`] draws the synthetic datasets (it
//! seeds itself through [`Rng`]); [`numpy::LegacyRandomState`] is numpy's MT19937, kept to
//! reproduce nnU-Net's folds.
//!
//! Training must be reproducible and resumable: every random draw of a step comes from a
//! generator seeded by `(run seed, step, purpose)`, so a resumed run draws exactly what the
//! uninterrupted run drew, whatever the number of loader threads. SplitMix64 is enough for
//! that: its whole state is one `u64` (trivial to checkpoint) and it passes BigCrush.

pub mod numpy;
pub mod xoshiro;

/// SplitMix64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

/// Mix one word into a hash (the SplitMix64 finalizer).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: mix(seed) }
    }

    /// A generator for one purpose: the same `(seed, parts)` always gives the same stream,
    /// and different parts give unrelated streams.
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut h = mix(seed ^ 0x9e37_79b9_7f4a_7c15);
        for &p in parts {
            h = mix(h ^ mix(p.wrapping_add(0x632b_e59b_d9b4_e019)));
        }
        Rng { state: h }
    }

    /// The whole state, for checkpoints.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// A generator resumed from [`Rng::state`].
    pub fn from_state(state: u64) -> Self {
        Rng { state }
    }

    /// The next 64 random bits (SplitMix64).
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [0, n); 0 when n == 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for sampling (bias < n / 2^64).
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform integer in [lo, hi] (inclusive); lo when hi < lo.
    pub fn int_in(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below((hi - lo) as u64 + 1) as i64
    }

    /// True with probability p.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// Standard normal (Box-Muller; one draw per call, the twin is dropped for simplicity).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Add `std` times a standard normal draw to every value: the noise of augmentation, a
    /// draw per voxel. One word from this generator keys a counter-based stream: value `i`'s
    /// draw depends only on the key and `i`, so blocks of values are computed side by side in
    /// vector registers (the sequential polar method here before took most of the noise
    /// transform's time). Box-Muller from two 24-bit uniforms: the radius is capped at 5.77
    /// standard deviations, which a normal draw passes once in about 125 million.
    #[inline(always)]
    pub fn add_normal(&mut self, values: &mut [f32], std: f64) {
        let key = self.next_u64();
        let (k0, k1) = (key as u32, (key >> 32) as u32);
        let std = std as f32;
        // Blocks of 32: draw pair j of a block goes to values j and j + 16 (contiguous halves,
        // so the loop over j is plain vector code: one AVX-512 vector or two AVX2 ones).
        const HALF: usize = 16;
        let mut blocks = values.chunks_exact_mut(2 * HALF);
        let mut pair = 0u32;
        for block in &mut blocks {
            let (lo, hi) = block.split_at_mut(HALF);
            for j in 0..HALF {
                let (a, b) = normal_pair(pair.wrapping_add(j as u32), k0, k1);
                lo[j] += a * std;
                hi[j] += b * std;
            }
            pair = pair.wrapping_add(HALF as u32);
        }
        for (j, v) in blocks.into_remainder().iter_mut().enumerate() {
            let (a, _) = normal_pair(pair.wrapping_add(j as u32), k0, k1);
            *v += a * std;
        }
    }

    /// Index drawn with probability proportional to `weights` (non-negative, not all zero);
    /// uniform when they sum to zero.
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        if weights.is_empty() || total <= 0.0 || !total.is_finite() {
            return self.below(weights.len() as u64) as usize;
        }
        let mut t = self.uniform() * total;
        for (i, &w) in weights.iter().enumerate() {
            if t < w {
                return i;
            }
            t -= w;
        }
        weights.len() - 1
    }
}

/// A 32-bit hash of a counter under a 64-bit key (two rounds of xor-shift-multiply, the
/// second keyed again): uniform enough for noise, and only 32-bit lanes, which AVX2 multiplies
/// eight at a time.
#[inline(always)]
fn hash32(i: u32, k0: u32, k1: u32) -> u32 {
    let mut x = i ^ k0;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = (x ^ k1).wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Draw pair `i` of the stream keyed by `(k0, k1)`: two independent standard normals by
/// Box-Muller on 24-bit uniforms (radius from `u1` in (0, 1], angle from `u2`).
#[inline(always)]
fn normal_pair(i: u32, k0: u32, k1: u32) -> (f32, f32) {
    use crate::util::fastmath::{log2, sin_cos_turn};
    let h1 = hash32(i.wrapping_mul(2), k0, k1);
    let h2 = hash32(i.wrapping_mul(2) | 1, k0, k1);
    let u1 = ((h1 >> 8) as i32 + 1) as f32 * (1.0 / 16_777_216.0);
    let r = (-2.0 * std::f32::consts::LN_2 * log2(u1)).max(0.0).sqrt();
    let (s, c) = sin_cos_turn(h2 >> 8);
    (r * c, r * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::derive(7, &[1, 2]).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::derive(7, &[1, 2]).next_u64(),
            Rng::derive(7, &[2, 1]).next_u64()
        );
        let mut r = Rng::new(1);
        r.next_u64();
        let mut s = Rng::from_state(r.state());
        assert_eq!(r.next_u64(), s.next_u64());
    }

    #[test]
    fn draws_have_the_right_moments() {
        let mut r = Rng::new(3);
        let n = 200_000;
        let (mut s, mut s2, mut u) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            let x = r.normal();
            s += x;
            s2 += x * x;
            u += r.uniform();
        }
        let n = n as f64;
        assert!((s / n).abs() < 0.01);
        assert!((s2 / n - 1.0).abs() < 0.02);
        assert!((u / n - 0.5).abs() < 0.005);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[r.weighted(&[1.0, 0.0, 2.0])] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((counts[2] as f64 / counts[0] as f64 - 2.0).abs() < 0.1);
    }

    /// Standard normal CDF through erf's Abramowitz-Stegun 7.1.26 (error under 1.5e-7).
    fn phi(x: f64) -> f64 {
        let z = x.abs() / std::f64::consts::SQRT_2;
        let t = 1.0 / (1.0 + 0.327_591_1 * z);
        let poly = t
            * (0.254_829_592
                + t * (-0.284_496_736
                    + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        let erf = 1.0 - poly * (-z * z).exp();
        0.5 * (1.0 + if x < 0.0 { -erf } else { erf })
    }

    #[test]
    fn added_noise_is_normal_independent_and_reproducible() {
        let n = 1_000_003; // not a multiple of the 16-value blocks
        let mut v = vec![0f32; n];
        let mut r = Rng::new(5);
        r.add_normal(&mut v, 2.0);
        let mut again = vec![0f32; n];
        Rng::new(5).add_normal(&mut again, 2.0);
        assert_eq!(v, again);
        let z: Vec<f64> = v.iter().map(|&x| x as f64 / 2.0).collect();
        let m = n as f64;
        let mean = z.iter().sum::<f64>() / m;
        let var = z.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / m;
        let kurt = z.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / m / (var * var);
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((var - 1.0).abs() < 0.005, "variance {var}");
        assert!((kurt - 3.0).abs() < 0.03, "kurtosis {kurt}");
        // The empirical CDF against the normal one (Kolmogorov-Smirnov at many points: the
        // 1e-3 bound is over twice the 99.9% critical value for a million draws).
        let mut sorted = z.clone();
        sorted.sort_by(f64::total_cmp);
        let worst = (1..200)
            .map(|k| {
                let x = -5.0 + k as f64 * 0.05;
                let below = sorted.partition_point(|&v| v < x) as f64 / m;
                (below - phi(x)).abs()
            })
            .fold(0.0, f64::max);
        assert!(worst < 2e-3, "largest CDF gap {worst}");
        // Neighbours, both halves of a block and the draws of another key are uncorrelated.
        let corr = |a: &[f64], b: &[f64]| {
            a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / a.len() as f64
        };
        assert!(corr(&z[..n - 1], &z[1..]).abs() < 0.005);
        assert!(corr(&z[..n - 8], &z[8..]).abs() < 0.005);
        let mut other = vec![0f32; n];
        r.add_normal(&mut other, 1.0);
        let other: Vec<f64> = other.iter().map(|&x| x as f64).collect();
        assert!(corr(&z, &other).abs() < 0.005);
        assert!(z.iter().all(|x| x.abs() < 6.0));
    }
}
