//! Percentiles and medians as numpy computes them, to the last bit: HD95 (evaluate), the
//! target spacing (prep, planner) and the preview's window all follow numpy's definitions.

/// `numpy.percentile(sorted, q)` (default `linear` method) of values sorted ascending: the
/// virtual index `(n - 1) * q / 100`, interpolated as numpy does (from the upper neighbour past
/// the middle, which can differ from `a + (b - a) * t` in the last bit). NaN for no values.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let vi = (n - 1) as f64 * (q / 100.0);
    let lo = (vi.floor() as usize).min(n - 1);
    let hi = (lo + 1).min(n - 1);
    let t = vi - vi.floor();
    let (a, b) = (sorted[lo], sorted[hi]);
    let d = b - a;
    if t >= 0.5 {
        b - d * (1.0 - t)
    } else {
        a + d * t
    }
}

/// [`percentile_sorted`] of values in any order.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, q)
}

/// `numpy.median`: the middle value, or `(a + b) / 2` of the two middle ones (which can differ
/// from `percentile(v, 50)` in the last bit). NaN for no values.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// numpy's sum of a float64 array (`np.sum`, `ndarray.sum`): the first element plus the
/// pairwise sum of the rest (blocks of 8 accumulators up to 128 values, halves beyond), so a
/// result computed by numpy can be reproduced to the last bit.
pub fn pairwise_sum(v: &[f64]) -> f64 {
    fn pairwise(a: &[f64]) -> f64 {
        let n = a.len();
        if n < 8 {
            a.iter().fold(0.0, |s, &x| s + x)
        } else if n <= 128 {
            let mut r = [0.0f64; 8];
            r.copy_from_slice(&a[..8]);
            let whole = n - n % 8;
            for i in (8..whole).step_by(8) {
                for j in 0..8 {
                    r[j] += a[i + j];
                }
            }
            let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
            for &x in &a[whole..] {
                res += x;
            }
            res
        } else {
            let mut n2 = n / 2;
            n2 -= n2 % 8;
            pairwise(&a[..n2]) + pairwise(&a[n2..])
        }
    }
    match v.split_first() {
        None => 0.0,
        Some((first, rest)) => first + pairwise(rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_values() {
        // numpy.percentile([1, 2, 3, 4], 95) = 3.85; ([1, 10], 10) = 1.9; median([1,2,3,10]) = 2.5.
        assert!((percentile(&[4.0, 1.0, 3.0, 2.0], 95.0) - 3.85).abs() < 1e-12);
        assert_eq!(percentile(&[1.0, 10.0], 10.0), 1.9);
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), 2.5);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(median(&[1.0, 2.0, 3.0, 10.0]), 2.5);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert!(median(&[]).is_nan());
    }
}
