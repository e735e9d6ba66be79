//! numpy's legacy `RandomState` to the bit, as far as cross-validation splits need it: the
//! Mersenne Twister (MT19937) seeded from one integer, and `shuffle` of a 1-D array. nnU-Net
//! makes its five folds with scikit-learn's `KFold(shuffle=True, random_state=12345)`, which
//! shuffles the case indices with `RandomState(12345)`; this reproduces those folds.

/// MT19937 with numpy's integer seeding (`mt19937_seed`) and its bounded draw.
pub struct LegacyRandomState {
    key: [u32; 624],
    pos: usize,
}

impl LegacyRandomState {
    /// `numpy.random.RandomState(seed)` for an integer seed.
    pub fn new(seed: u32) -> Self {
        let mut key = [0u32; 624];
        let mut s = seed;
        for (pos, k) in key.iter_mut().enumerate() {
            *k = s;
            s = 1_812_433_253u32
                .wrapping_mul(s ^ (s >> 30))
                .wrapping_add(pos as u32 + 1);
        }
        LegacyRandomState { key, pos: 624 }
    }

    fn regenerate(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX: u32 = 0x9908_b0df;
        for i in 0..624 {
            let y = (self.key[i] & UPPER) | (self.key[(i + 1) % 624] & LOWER);
            let mag = if y & 1 == 1 { MATRIX } else { 0 };
            self.key[i] = self.key[(i + 397) % 624] ^ (y >> 1) ^ mag;
        }
        self.pos = 0;
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.pos == 624 {
            self.regenerate();
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32() as u64;
        (hi << 32) | self.next_u32() as u64
    }

    /// A uniform integer in 0..=max: masked draws, rejected above `max` (numpy's legacy
    /// `random_interval`).
    pub fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for s in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> s;
        }
        loop {
            let v = if max <= u32::MAX as u64 {
                (self.next_u32() as u64) & mask
            } else {
                self.next_u64() & mask
            };
            if v <= max {
                return v;
            }
        }
    }

    /// `RandomState.shuffle` of a 1-D array: Fisher-Yates from the end.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.interval(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// numpy 2.4: `np.random.RandomState(12345).randint(0, 2**32, 3, dtype=np.uint64)` draws
    /// these three words, and the reference MT19937 (init_genrand(5489)) starts 3499211612.
    #[test]
    fn matches_the_reference_generator() {
        assert_eq!(LegacyRandomState::new(5489).next_u32(), 3_499_211_612);
        let mut r = LegacyRandomState::new(12345);
        let first: Vec<u32> = (0..3).map(|_| r.next_u32()).collect();
        assert_eq!(first, vec![3_992_670_690, 3_823_185_381, 1_358_822_685]);
        // `a = np.arange(10); np.random.RandomState(12345).shuffle(a)`
        let mut a: Vec<u32> = (0..10).collect();
        LegacyRandomState::new(12345).shuffle(&mut a);
        assert_eq!(a, vec![0, 7, 3, 9, 6, 4, 1, 8, 5, 2]);
    }
}
