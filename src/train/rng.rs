//! A small, serializable random number generator.
//!
//! Training must be reproducible and resumable: every random draw of a step comes from a
//! generator seeded by `(run seed, step, purpose)`, so a resumed run draws exactly what the
//! uninterrupted run drew, whatever the number of loader threads. SplitMix64 is enough for
//! that: its whole state is one `u64` (trivial to checkpoint) and it passes BigCrush.

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

    pub fn from_state(state: u64) -> Self {
        Rng { state }
    }

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

    /// Add `std` times a standard normal draw to every value (Marsaglia's polar method: both
    /// draws of a pair used, no trigonometry; the noise of augmentation, a draw per voxel).
    pub fn add_normal(&mut self, values: &mut [f32], std: f64) {
        let mut pairs = values.chunks_mut(2);
        for pair in &mut pairs {
            let (a, b) = loop {
                let u = 2.0 * self.uniform() - 1.0;
                let v = 2.0 * self.uniform() - 1.0;
                let s = u * u + v * v;
                if s > 0.0 && s < 1.0 {
                    let k = (-2.0 * s.ln() / s).sqrt() * std;
                    break (u * k, v * k);
                }
            };
            pair[0] += a as f32;
            if let Some(second) = pair.get_mut(1) {
                *second += b as f32;
            }
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
}
