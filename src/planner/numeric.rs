//! The statistics nnU-Net's planner takes, computed the way numpy and Python compute them, so
//! that a plan's spacings come out equal to the last bit (docs/nnunet-planner.md, section 2).

/// `numpy.percentile(values, q)` with numpy's default `linear` method: the virtual index
/// `(n - 1) * q / 100` and numpy's own interpolation (from the upper neighbour past the
/// middle). `None` for no values.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut v = values.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let vi = (n - 1) as f64 * (q / 100.0);
    let lo = (vi.floor() as usize).min(n - 1);
    let hi = (lo + 1).min(n - 1);
    let t = vi - vi.floor();
    let (a, b) = (v[lo], v[hi]);
    let d = b - a;
    Some(if t >= 0.5 {
        b - d * (1.0 - t)
    } else {
        a + d * t
    })
}

/// `numpy.median`: the middle value, or the mean `(a + b) / 2` of the two middle ones (which
/// can differ from `percentile(v, 50)` in the last bit: nnU-Net uses both).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Python's `round(x)` of a float: to the nearest integer, halves to even.
pub fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// The index of the largest value, the last one among equals (`numpy.argsort(v)[-1]`, which is
/// stable for short arrays).
pub fn argmax_last(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v >= values[best] {
            best = i;
        }
    }
    best
}

/// The index of the largest value, the first one among equals (`numpy.argmax`).
pub fn argmax_first(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_and_python_rules() {
        // numpy.percentile([1, 2, 3, 4], 50) = 2.5; [1, 10] at 10 -> 1.9.
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), Some(2.5));
        assert_eq!(percentile(&[1.0, 10.0], 10.0), Some(1.9));
        assert_eq!(percentile(&[5.0], 10.0), Some(5.0));
        assert_eq!(median(&[1.0, 2.0, 3.0, 10.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        for (x, want) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-0.5, -0.0),
            (2.4, 2.0),
            (2.6, 3.0),
        ] {
            assert_eq!(round_half_even(x), want, "{x}");
        }
        assert_eq!(argmax_last(&[0.5, 0.5, 0.5]), 2);
        assert_eq!(argmax_first(&[0.5, 0.7, 0.7]), 1);
    }
}
