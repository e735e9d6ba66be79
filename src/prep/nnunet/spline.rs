//! nnU-Net's resampling along one axis, as scikit-image's `resize` (scipy's `zoom` with
//! `grid_mode`, mode `edge`) and scipy's `map_coordinates` compute it, and the rules that
//! pick the output shape and the separately resampled axis.
//!
//! A tensor-product spline is separable: resizing a volume with a cubic B-spline equals
//! resizing along each axis in turn (the prefilter and the interpolation are linear and act on
//! one axis each), so a volume is resampled a slice or a block of lines at a time, never whole.
//! scipy pads the input with 12 copies of its edge values before the cubic prefilter (mode
//! `nearest`); we do the same, so the boundary condition of the filter itself does not matter
//! (its influence falls as 0.268^12 = 1.4e-7 of a value at the real edge).

/// The pole of the cubic B-spline prefilter: sqrt(3) - 2.
const POLE: f64 = -0.267_949_192_431_122_7;
/// Edge copies scipy adds before prefiltering (mode `nearest`).
const PAD: usize = 12;

/// How one axis is resampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Cubic B-spline (order 3): skimage's resize of images.
    Cubic,
    /// Linear (order 1): skimage's resize of logits.
    Linear,
    /// Nearest (order 0, `floor(x + 0.5)`): the separately resampled axis.
    Nearest,
}

impl Kind {
    /// The kind of a spline order nnU-Net's plans name (0, 1 or 3; 2 is read as cubic's
    /// neighbour, which nnU-Net never plans).
    pub fn of_order(order: usize) -> Kind {
        match order {
            0 => Kind::Nearest,
            1 => Kind::Linear,
            _ => Kind::Cubic,
        }
    }
}

/// One axis's resampling from `n` to `m` samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Axis {
    /// Input samples.
    pub n: usize,
    /// Output samples.
    pub m: usize,
    /// How.
    pub kind: Kind,
}

impl Axis {
    /// Whether the output is the input (same length): nothing to compute.
    pub fn is_identity(&self) -> bool {
        self.n == self.m
    }

    /// Input coordinate of output sample `j` (edge-aligned grids, scipy's `grid_mode`).
    fn coordinate(&self, j: usize) -> f64 {
        let zoom = self.n as f64 / self.m as f64;
        (j as f64 + 0.5) * zoom - 0.5
    }

    /// Input index of output `j` for [`Kind::Nearest`] (scipy: `floor(x + 0.5)`, clamped).
    pub fn nearest(&self, j: usize) -> usize {
        let x = self.coordinate(j);
        ((x + 0.5).floor().max(0.0) as usize).min(self.n - 1)
    }

    /// Resample `input` (`n` rows of `w` values, row-major) along its rows into `out`
    /// (`m` rows of `w`): every column is one line along the axis.
    pub fn apply(&self, input: &[f64], w: usize, out: &mut Vec<f64>) {
        let (n, m) = (self.n, self.m);
        debug_assert_eq!(input.len(), n * w);
        out.clear();
        out.resize(m * w, 0.0);
        if self.is_identity() {
            out.copy_from_slice(input);
            return;
        }
        let row = |k: usize| &input[k * w..(k + 1) * w];
        match self.kind {
            Kind::Nearest => {
                for j in 0..m {
                    out[j * w..(j + 1) * w].copy_from_slice(row(self.nearest(j)));
                }
            }
            Kind::Linear => {
                let clamp = |i: i64| i.clamp(0, n as i64 - 1) as usize;
                for j in 0..m {
                    let x = self.coordinate(j);
                    let i0 = x.floor();
                    // scipy's weights: 1 - |knot - x|.
                    let w0 = 1.0 - (x - i0);
                    let w1 = 1.0 - (i0 + 1.0 - x);
                    let (a, b) = (row(clamp(i0 as i64)), row(clamp(i0 as i64 + 1)));
                    for ((o, &p), &q) in out[j * w..(j + 1) * w].iter_mut().zip(a).zip(b) {
                        *o = w0 * p + w1 * q;
                    }
                }
            }
            Kind::Cubic => {
                let c = prefiltered(input, n, w);
                let len = n + 2 * PAD;
                let clamp = |i: i64| i.clamp(0, len as i64 - 1) as usize;
                for j in 0..m {
                    let x = self.coordinate(j) + PAD as f64;
                    let f = x.floor();
                    let t = x - f;
                    let z = 1.0 - t;
                    let w0 = z * z * z / 6.0;
                    let w1 = (t * t * (t - 2.0) * 3.0 + 4.0) / 6.0;
                    let w2 = (z * z * (z - 2.0) * 3.0 + 4.0) / 6.0;
                    let w3 = 1.0 - w0 - w1 - w2;
                    let start = f as i64 - 1;
                    let o = &mut out[j * w..(j + 1) * w];
                    for (h, wt) in [w0, w1, w2, w3].into_iter().enumerate() {
                        let r = clamp(start + h as i64);
                        for (o, &v) in o.iter_mut().zip(&c[r * w..(r + 1) * w]) {
                            *o += wt * v;
                        }
                    }
                }
            }
        }
    }
}

/// Cubic B-spline coefficients of `input` (`n` rows of `w`) padded with 12 edge rows each
/// side: `n + 24` rows. Causal then anti-causal recursion over rows, all columns at once.
fn prefiltered(input: &[f64], n: usize, w: usize) -> Vec<f64> {
    let len = n + 2 * PAD;
    let gain = (1.0 - POLE) * (1.0 - 1.0 / POLE);
    let mut c = vec![0.0f64; len * w];
    for k in 0..len {
        let src = k.saturating_sub(PAD).min(n - 1);
        for (d, &s) in c[k * w..(k + 1) * w]
            .iter_mut()
            .zip(&input[src * w..(src + 1) * w])
        {
            *d = s * gain;
        }
    }
    // Causal init: the sum of z^k c[k] over the line (mirror-symmetric boundary; the 12
    // constant rows make the choice immaterial), to where z^k no longer counts.
    let horizon = len.min(40);
    let mut init = vec![0.0f64; w];
    let mut zk = 1.0;
    for k in 0..horizon {
        for (a, &v) in init.iter_mut().zip(&c[k * w..(k + 1) * w]) {
            *a += zk * v;
        }
        zk *= POLE;
    }
    c[..w].copy_from_slice(&init);
    for k in 1..len {
        let (prev, cur) = c.split_at_mut(k * w);
        let prev = &prev[(k - 1) * w..];
        for (v, &p) in cur[..w].iter_mut().zip(prev) {
            *v += POLE * p;
        }
    }
    // Anti-causal init (mirror): z / (z^2 - 1) * (c[L-1] + z c[L-2]).
    let f = POLE / (POLE * POLE - 1.0);
    if len >= 2 {
        for i in 0..w {
            c[(len - 1) * w + i] = f * (c[(len - 1) * w + i] + POLE * c[(len - 2) * w + i]);
        }
    }
    for k in (0..len - 1).rev() {
        let (cur, next) = c.split_at_mut((k + 1) * w);
        let cur = &mut cur[k * w..];
        for (v, &q) in cur.iter_mut().zip(&next[..w]) {
            *v = POLE * (q - *v);
        }
    }
    c
}

/// The longest side a resampled grid may have (NIfTI-1's dimensions are 16-bit; this leaves
/// room for NIfTI-2 and keeps every offset exact).
pub const MAX_SIDE: f64 = (1u64 << 31) as f64;

/// nnU-Net's output shape: `int(round(old_spacing / new_spacing * old_shape))` per axis,
/// Python's round (half to even); `Err` with the axis and the value when a side is not a
/// finite number of at most [`MAX_SIDE`] voxels (no cast from a huge float).
pub fn new_shape(
    shape: [usize; 3],
    spacing: [f64; 3],
    target: [f64; 3],
) -> std::result::Result<[usize; 3], (usize, f64)> {
    let mut out = [0usize; 3];
    for a in 0..3 {
        let v = (spacing[a] / target[a] * shape[a] as f64).round_ties_even();
        if !(v.is_finite() && (0.0..=MAX_SIDE).contains(&v)) {
            return Err((a, v));
        }
        out[a] = v as usize;
    }
    Ok(out)
}

/// Whether a spacing is anisotropic enough for the separate axis (max / min over 3).
fn anisotropic(s: [f64; 3]) -> bool {
    let max = s.iter().copied().fold(f64::MIN, f64::max);
    let min = s.iter().copied().fold(f64::MAX, f64::min);
    max / min > 3.0
}

/// The one axis of largest spacing, if exactly one has it.
fn lowres_axis(s: [f64; 3]) -> Option<usize> {
    let max = s.iter().copied().fold(f64::MIN, f64::max);
    let axes: Vec<usize> = (0..3).filter(|&a| max / s[a] == 1.0).collect();
    match axes[..] {
        [a] => Some(a),
        _ => None,
    }
}

/// The axis nnU-Net resamples separately (at `order_z`) between these spacings, if any:
/// forced by the plans, else the coarse axis of whichever spacing is anisotropic (the current
/// one first); none when two or three axes share the largest spacing.
pub fn separate_axis(force: Option<bool>, current: [f64; 3], new: [f64; 3]) -> Option<usize> {
    match force {
        Some(true) => lowres_axis(current),
        Some(false) => None,
        None if anisotropic(current) => lowres_axis(current),
        None if anisotropic(new) => lowres_axis(new),
        None => None,
    }
}

/// The per-axis resampling of a volume from `from` to `to` (z, y, x) with `order` in the plane
/// and `order_z` along the separate axis `sep`.
pub fn axes(
    from: [usize; 3],
    to: [usize; 3],
    order: usize,
    order_z: usize,
    sep: Option<usize>,
) -> [Axis; 3] {
    std::array::from_fn(|a| Axis {
        n: from[a],
        m: to[a],
        kind: if sep == Some(a) {
            Kind::of_order(order_z)
        } else {
            Kind::of_order(order)
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubic_reproduces_its_samples_and_polynomials() {
        // Same length: the interpolating spline returns the samples.
        let v: Vec<f64> = (0..20).map(|i| ((i * 7) % 5) as f64 - 1.5).collect();
        let ax = Axis {
            n: 20,
            m: 20,
            kind: Kind::Cubic,
        };
        let mut out = Vec::new();
        ax.apply(&v, 1, &mut out);
        assert_eq!(out, v);
        // A cubic spline reproduces a linear ramp exactly away from the edges.
        let ramp: Vec<f64> = (0..40).map(|i| 2.0 * i as f64 + 1.0).collect();
        let ax = Axis {
            n: 40,
            m: 97,
            kind: Kind::Cubic,
        };
        ax.apply(&ramp, 1, &mut out);
        // Away from the constant edge padding (its influence decays as 0.268^distance).
        for (j, got) in out.iter().enumerate().take(72).skip(25) {
            let x = ax.coordinate(j);
            assert!(
                (got - (2.0 * x + 1.0)).abs() < 1e-6,
                "{j}: {} vs {}",
                got,
                2.0 * x + 1.0
            );
        }
    }

    #[test]
    fn columns_are_independent_lines() {
        let w = 3;
        let n = 9;
        let input: Vec<f64> = (0..n * w).map(|i| ((i * 13) % 11) as f64).collect();
        for kind in [Kind::Cubic, Kind::Linear, Kind::Nearest] {
            let ax = Axis { n, m: 14, kind };
            let mut all = Vec::new();
            ax.apply(&input, w, &mut all);
            for c in 0..w {
                let line: Vec<f64> = (0..n).map(|k| input[k * w + c]).collect();
                let mut one = Vec::new();
                ax.apply(&line, 1, &mut one);
                for j in 0..14 {
                    assert!((one[j] - all[j * w + c]).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn shapes_and_separate_axis_follow_nnunet() {
        // 2.5 rounds to 2 (half to even), 3.5 to 4.
        assert_eq!(
            new_shape([5, 7, 10], [1.0, 1.0, 1.0], [2.0, 2.0, 1.0]),
            Ok([2, 4, 10])
        );
        assert_eq!(
            new_shape([5, 7, 10], [1e30, 1.0, 1.0], [1.0; 3])
                .unwrap_err()
                .0,
            0
        );
        assert!(new_shape([5, 7, 10], [1.0; 3], [1.0, 1e-300, 1.0]).is_err());
        assert_eq!(
            separate_axis(None, [3.0, 0.7, 0.7], [1.0, 1.0, 1.0]),
            Some(0)
        );
        assert_eq!(separate_axis(None, [1.0, 1.0, 1.0], [2.0, 2.0, 0.5]), None);
        assert_eq!(
            separate_axis(None, [1.0, 1.0, 1.0], [0.5, 2.0, 0.6]),
            Some(1)
        );
        assert_eq!(separate_axis(None, [4.0, 4.0, 1.0], [1.0; 3]), None);
        assert_eq!(separate_axis(Some(false), [5.0, 1.0, 1.0], [1.0; 3]), None);
        let ax = Axis {
            n: 10,
            m: 4,
            kind: Kind::Nearest,
        };
        // (j + 0.5) * 2.5 - 0.5 = 0.75, 3.25, 5.75, 8.25 -> 1, 3, 6, 8.
        assert_eq!(
            (0..4).map(|j| ax.nearest(j)).collect::<Vec<_>>(),
            vec![1, 3, 6, 8]
        );
    }
}
