//! One (sample, group) slab of the fused norm: its statistics, its output and its input
//! gradient. The loops are plain Rust, compiled once more with AVX-512 and once with AVX2
//! ([`wide`], chosen at run time): the crate is built for the baseline x86-64, where they ran
//! four lanes wide. Their sums are in a fixed order written in the code (eight f64 lanes), and
//! nothing is contracted into a fused multiply-add, so every build gives the same bits.

use super::NormGeom;

/// What one slab's passes need: its channels' weights and biases from channel `c0` on.
#[derive(Clone, Copy)]
pub(super) struct Slab<'a> {
    pub(super) w: &'a [f32],
    pub(super) b: &'a [f32],
    /// The slab's first channel.
    pub(super) c0: usize,
    /// Voxels per channel.
    pub(super) voxels: usize,
    /// Channels of the slab (one group).
    pub(super) channels: usize,
    pub(super) eps: f64,
    pub(super) slope: f32,
}

impl<'a> Slab<'a> {
    /// Slab `i` (sample `i / groups`, group `i % groups`) of `g`.
    pub(super) fn of(
        g: &NormGeom,
        i: usize,
        (w, b): (&'a [f32], &'a [f32]),
        eps: f64,
        slope: f32,
    ) -> Self {
        let channels = g.channels_per_group();
        Self {
            w,
            b,
            c0: (i % g.groups) * channels,
            voxels: g.voxels,
            channels,
            eps,
            slope,
        }
    }

    /// Per-channel affine map of the normalized value: z = x * scale + shift.
    #[inline(always)]
    fn affine(&self, k: usize, (mean, rstd): (f32, f32)) -> (f32, f32) {
        let c = self.c0 + k;
        let scale = self.w[c] * rstd;
        (scale, self.b[c] - mean * scale)
    }
}

/// Mean and 1/sqrt(var + eps) of one slab, accumulated in f64.
///
/// Sums are taken about the slab's first value (shifted data) so a large common offset does
/// not cancel catastrophically in E[x^2] - E[x]^2; eight fixed lanes let the compiler
/// vectorize while keeping the summation order fixed.
#[inline(always)]
fn stats(x: &[f32], eps: f64) -> (f32, f32) {
    let Some(&first) = x.first() else {
        return (0.0, 0.0);
    };
    let k = first as f64;
    let (mut s, mut q) = ([0f64; 8], [0f64; 8]);
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            let v = c[l] as f64 - k;
            s[l] += v;
            q[l] += v * v;
        }
    }
    let (mut sum, mut sq) = (s.iter().sum::<f64>(), q.iter().sum::<f64>());
    for &v in tail {
        let v = v as f64 - k;
        sum += v;
        sq += v * v;
    }
    let m = x.len() as f64;
    let shifted_mean = sum / m;
    let var = (sq / m - shifted_mean * shifted_mean).max(0.0);
    ((k + shifted_mean) as f32, (1.0 / (var + eps).sqrt()) as f32)
}

/// LeakyReLU derivative factor at pre-activation z (forward uses `z > 0` too).
#[inline(always)]
fn act_slope(z: f32, slope: f32) -> f32 {
    if z > 0.0 {
        1.0
    } else {
        slope
    }
}

/// The slab's output: `src` (None: `dst` itself) normalized, scaled, shifted and activated
/// into `dst`.
#[inline(always)]
fn normalize(s: &Slab, src: Option<&[f32]>, dst: &mut [f32]) {
    let st = stats(src.unwrap_or(dst), s.eps);
    for (k, row) in dst.chunks_mut(s.voxels).enumerate() {
        let (scale, shift) = s.affine(k, st);
        let act = |v: f32| {
            let z = v * scale + shift;
            z * act_slope(z, s.slope)
        };
        match src {
            Some(x) => {
                let x = &x[k * s.voxels..][..row.len()];
                row.iter_mut().zip(x).for_each(|(o, &v)| *o = act(v));
            }
            None => row.iter_mut().for_each(|v| *v = act(*v)),
        }
    }
}

/// Sums over one channel of dz and dz * xhat, in f64 with fixed lanes (see [`stats`]).
#[inline(always)]
fn channel_sums(
    x: &[f32],
    dy: &[f32],
    (scale, shift): (f32, f32),
    (mean, rstd): (f32, f32),
    slope: f32,
) -> (f64, f64) {
    let (mut s, mut q) = ([0f64; 8], [0f64; 8]);
    let term = |v: f32, d: f32| {
        let dz = d * act_slope(v * scale + shift, slope);
        (dz as f64, (dz * ((v - mean) * rstd)) as f64)
    };
    let (xc, dc) = (x.chunks_exact(8), dy.chunks_exact(8));
    let (xt, dt) = (xc.remainder(), dc.remainder());
    for (xv, dv) in xc.zip(dc) {
        for l in 0..8 {
            let (a, b) = term(xv[l], dv[l]);
            s[l] += a;
            q[l] += b;
        }
    }
    let (mut sum, mut sum_x) = (s.iter().sum::<f64>(), q.iter().sum::<f64>());
    for (&v, &d) in xt.iter().zip(dt) {
        let (a, b) = term(v, d);
        sum += a;
        sum_x += b;
    }
    (sum, sum_x)
}

/// The slab's input gradient into `dx` from `x` and `dy`, and per channel the partial sums of
/// dz and dz * xhat (the bias and weight gradients) into `part`.
#[inline(always)]
fn gradient(s: &Slab, (x, dy): (&[f32], &[f32]), dx: &mut [f32], part: &mut [(f64, f64)]) {
    let st @ (mean, rstd) = stats(x, s.eps);
    let rows = || x.chunks(s.voxels).zip(dy.chunks(s.voxels));
    // Group sums of dxhat = w * dz and of dxhat * xhat.
    let (mut a, mut bsum) = (0f64, 0f64);
    for (k, ((xc, dc), p)) in rows().zip(part.iter_mut()).enumerate() {
        *p = channel_sums(xc, dc, s.affine(k, st), st, s.slope);
        a += s.w[s.c0 + k] as f64 * p.0;
        bsum += s.w[s.c0 + k] as f64 * p.1;
    }
    let m = (s.channels * s.voxels) as f64;
    let (a, bsum) = ((a / m) as f32, (bsum / m) as f32);
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    for (k, (o, (xc, dc))) in dx.chunks_mut(s.voxels).zip(rows()).enumerate() {
        let (scale, shift) = s.affine(k, st);
        let wc = s.w[s.c0 + k];
        for ((o, &v), &d) in o.iter_mut().zip(xc).zip(dc) {
            let dxhat = wc * d * act_slope(v * scale + shift, s.slope);
            let xhat = (v - mean) * rstd;
            *o = rstd * (dxhat - a - xhat * bsum);
        }
    }
}

/// The slab passes at the widest vectors this CPU has.
pub(super) mod wide {
    use super::Slab;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(in crate::model::ops::norm) enum Width {
        #[cfg(target_arch = "x86_64")]
        Avx512,
        #[cfg(target_arch = "x86_64")]
        Avx2,
        Baseline,
    }

    impl Width {
        pub(in crate::model::ops::norm) fn detect() -> Self {
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx512f") {
                    return Self::Avx512;
                }
                if is_x86_feature_detected!("avx2") {
                    return Self::Avx2;
                }
            }
            Self::Baseline
        }
    }

    /// Declares `$name` running the slab pass `$body` at a given [`Width`], and at the
    /// detected one.
    macro_rules! widths {
        ($name:ident, $at:ident, $body:path, ($($arg:ident: $ty:ty),*)) => {
            pub(in crate::model::ops::norm) fn $name($($arg: $ty),*) {
                $at(Width::detect(), $($arg),*)
            }

            pub(in crate::model::ops::norm) fn $at(width: Width, $($arg: $ty),*) {
                #[cfg(target_arch = "x86_64")]
                {
                    #[target_feature(enable = "avx512f")]
                    unsafe fn avx512($($arg: $ty),*) {
                        $body($($arg),*)
                    }
                    #[target_feature(enable = "avx2")]
                    unsafe fn avx2($($arg: $ty),*) {
                        $body($($arg),*)
                    }
                    match width {
                        // SAFETY: the CPU has the features (Width::detect).
                        Width::Avx512 => return unsafe { avx512($($arg),*) },
                        // SAFETY: as above.
                        Width::Avx2 => return unsafe { avx2($($arg),*) },
                        Width::Baseline => {}
                    }
                }
                let _ = width;
                $body($($arg),*)
            }
        };
    }

    widths!(normalize, normalize_at, super::normalize, (s: &Slab, src: Option<&[f32]>, dst: &mut [f32]));
    widths!(gradient, gradient_at, super::gradient, (s: &Slab, xd: (&[f32], &[f32]), dx: &mut [f32], part: &mut [(f64, f64)]));
}

#[cfg(test)]
mod tests {
    use super::wide::{gradient_at, normalize_at, Width};
    use super::Slab;
    use crate::util::rng::Rng;

    /// Every vector width gives the baseline's bits, written over the input or not, for
    /// channel lengths off the vectors' (the tails) and a large common offset.
    #[test]
    fn every_width_gives_the_same_bits() {
        let mut widths = vec![Width::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                widths.push(Width::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                widths.push(Width::Avx512);
            }
        }
        let mut rng = Rng::new(3);
        for (channels, voxels, offset) in [(1, 1000, 0.0), (3, 77, 100.0), (2, 4096, -3.0)] {
            let n = channels * voxels;
            let mut draw = |scale: f64, at: f64| -> Vec<f32> {
                (0..n).map(|_| (at + scale * rng.normal()) as f32).collect()
            };
            let (x, dy) = (draw(1.0, offset), draw(1.0, 0.0));
            let (w, b) = (draw(0.5, 1.0), draw(0.5, 0.0));
            let slab = Slab {
                w: &w,
                b: &b,
                c0: 0,
                voxels,
                channels,
                eps: 1e-5,
                slope: 0.01,
            };
            let run = |width: Width| {
                let mut y = vec![0f32; n];
                normalize_at(width, &slab, Some(&x), &mut y);
                let mut own = x.clone();
                normalize_at(width, &slab, None, &mut own);
                assert!(own == y, "{width:?}: in place differs");
                let (mut dx, mut part) = (vec![0f32; n], vec![(0f64, 0f64); channels]);
                gradient_at(width, &slab, (&x, &dy), &mut dx, &mut part);
                (y, dx, part)
            };
            let want = run(Width::Baseline);
            for &width in &widths {
                assert!(run(width) == want, "{width:?}, {channels}x{voxels}");
            }
        }
    }
}
