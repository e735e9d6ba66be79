//! The arithmetic nnU-Net's planner does the way numpy and Python do it, so that a plan's
//! spacings come out equal to the last bit (docs/nnunet-planner.md, section 2): percentile and
//! median (numpy's, from [`crate::util::stats`]), rounding and argmax.

pub use crate::util::stats::{median, percentile};

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
