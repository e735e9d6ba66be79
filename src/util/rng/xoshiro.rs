//! The synthetic datasets' generator (no libm: bit-identical on every platform): seed mixing,
//! xoshiro256++ seeded through SplitMix64 (this family's [`super::Rng`]), Gaussians by polar
//! Box-Muller, and a hand-written logarithm. Its long period and 256-bit state suit drawing
//! whole volumes; the trainer's per-purpose streams use the one-word [`super::Rng`].

/// One SplitMix64 step: the value [`super::Rng::next_u64`] gives from `state`.
fn splitmix64(state: &mut u64) -> u64 {
    let mut r = super::Rng::from_state(*state);
    let v = r.next_u64();
    *state = r.state();
    v
}

/// Combine two 64-bit values into a well-mixed seed.
pub fn mix(a: u64, b: u64) -> u64 {
    let mut s = a ^ b.rotate_left(32);
    splitmix64(&mut s) ^ b
}

/// FNV-1a hash, to derive a case seed from its id.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// xoshiro256++ seeded through splitmix64.
pub struct Xoshiro {
    s: [u64; 4],
    spare: Option<f64>,
}

impl Xoshiro {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Xoshiro {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Xoshiro { s, spare: None }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in lo..=hi.
    pub fn range_usize(&mut self, lo: usize, hi: usize) -> usize {
        let span = (hi - lo) as u64 + 1;
        lo + ((self.next_u64() as u128 * span as u128) >> 64) as usize
    }

    /// Shuffle `items` in place (Fisher-Yates, from the last item down).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range_usize(0, i);
            items.swap(i, j);
        }
    }

    /// Two independent standard normal values (polar Box-Muller).
    pub fn gaussian_pair(&mut self) -> (f64, f64) {
        loop {
            let u = 2.0 * self.uniform() - 1.0;
            let v = 2.0 * self.uniform() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let f = (-2.0 * ln(s) / s).sqrt();
                return (u * f, v * f);
            }
        }
    }

    /// One standard normal value (the pair's second is kept for the next call).
    pub fn gaussian(&mut self) -> f64 {
        if let Some(g) = self.spare.take() {
            return g;
        }
        let (a, b) = self.gaussian_pair();
        self.spare = Some(b);
        a
    }

    /// A direction uniform on the sphere (three Gaussians, normalized; redrawn when too short).
    pub fn unit_vector(&mut self) -> [f64; 3] {
        loop {
            let v = [self.gaussian(), self.gaussian(), self.gaussian()];
            let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
            if n > 1e-12 {
                return [v[0] / n, v[1] / n, v[2] / n];
            }
        }
    }
}

/// Natural logarithm of a positive normal number, from IEEE basic operations only (so results
/// do not depend on the platform's libm). Relative error below 1e-14.
fn ln(x: f64) -> f64 {
    debug_assert!(x.is_normal() && x > 0.0);
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.172.
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let series = 1.0
        + t2 * (1.0 / 3.0
            + t2 * (1.0 / 5.0
                + t2 * (1.0 / 7.0
                    + t2 * (1.0 / 9.0
                        + t2 * (1.0 / 11.0 + t2 * (1.0 / 13.0 + t2 * (1.0 / 15.0 + t2 / 17.0)))))));
    2.0 * t * series + e as f64 * std::f64::consts::LN_2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_std() {
        for &x in &[
            1e-300, 1e-16, 0.001, 0.3, 0.7, 1.0, 1.5, 2.0, 10.0, 123456.789,
        ] {
            let (a, b) = (ln(x), x.ln());
            assert!((a - b).abs() <= 1e-13 * b.abs().max(1.0), "{x}: {a} vs {b}");
        }
    }

    #[test]
    fn gaussian_moments() {
        let mut rng = Xoshiro::new(7);
        let n = 200_000;
        let (mut s1, mut s2) = (0.0, 0.0);
        for _ in 0..n {
            let g = rng.gaussian();
            s1 += g;
            s2 += g * g;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn range_usize_is_inclusive() {
        let mut rng = Xoshiro::new(1);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            seen[rng.range_usize(5, 8) - 5] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
