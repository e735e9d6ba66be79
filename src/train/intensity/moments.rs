//! One-pass sums of a channel's values in fixed lanes (mean, deviation, minimum and maximum),
//! the same bits in every vector build: what contrast and gamma measure before they map.

/// The lanes [`LaneSums`] and [`Moments`] keep: 32 independent sums vectorize into four
/// AVX2 accumulators, not one whose additions' latency would bound the loop. The same count in every build, so the same sums bit for bit.
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
pub(super) struct LaneSums {
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
    pub(super) fn of(c: &[f32]) -> Self {
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
    pub(super) fn mean_std(&self, n: usize) -> (f64, f64) {
        let n = n.max(1) as f64;
        let d = (self.s.iter().sum::<f64>() + self.tail.0) / n;
        let q = (self.q.iter().sum::<f64>() + self.tail.1) / n;
        (self.k as f64 + d, (q - d * d).max(0.0).sqrt())
    }
}

/// [`LaneSums`], minimum and maximum of the values in one pass.
pub(super) struct Moments {
    pub(super) sums: LaneSums,
    pub(super) lo: f32,
    pub(super) hi: f32,
}

impl Moments {
    #[inline(always)]
    pub(super) fn of(c: &[f32]) -> Self {
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
