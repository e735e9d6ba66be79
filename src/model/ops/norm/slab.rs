//! One (sample, group) slab of the fused norm: its statistics, its output and its input
//! gradient. The loops are plain Rust, compiled once more with AVX-512 and once with AVX2
//! ([`wide`], chosen at run time): the crate is built for the baseline x86-64, where they ran
//! four lanes wide. Their sums are in a fixed order written in the code (eight f64 lanes), and
//! nothing is contracted into a fused multiply-add, so every build gives the same bits.

use half::bf16;

use super::NormGeom;
use crate::model::ops::direct::{Cast, Output};

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

/// Values per chunk of a slab pass: three f32 chunks stay in L1 whatever the slab's size
/// (a slab of nnU-Net's first level is megabytes), and a multiple of the eight f64 lanes, so
/// that every value falls in the lane it would in one sweep (the same bits).
const CHUNK: usize = 2048;

/// What a slab holds: f32 read as it lies, or bf16 widened a chunk at a time.
pub(super) trait Wide: Copy + Sync {
    /// `src` (at most [`CHUNK`] values) as f32: itself, or widened into `buf`.
    fn wide<'b>(src: &'b [Self], buf: &'b mut [f32; CHUNK]) -> &'b [f32];
}

impl Wide for f32 {
    #[inline(always)]
    fn wide<'b>(src: &'b [f32], _: &'b mut [f32; CHUNK]) -> &'b [f32] {
        src
    }
}

impl Wide for bf16 {
    #[inline(always)]
    fn wide<'b>(src: &'b [bf16], buf: &'b mut [f32; CHUNK]) -> &'b [f32] {
        let buf = &mut buf[..src.len()];
        bf16::cast_row(src, buf);
        buf
    }
}

/// Adds `f` of each value of `v` (whole rows of eight) into the eight f64 lanes, value `j`
/// into lane `j % 8`. One set of lanes a loop, kept in a local copy: LLVM vectorizes that into
/// one register of eight f64 lanes. Two sets in one loop, a conversion shared by two, or
/// lanes summed in place compiled to scalar conversions and two-lane sums (four times the
/// cost of a pass).
#[inline(always)]
fn add_lanes<T: Copy + Into<f64>>(lanes: &mut [f64; 8], v: &[T], f: impl Fn(f64) -> f64) {
    let mut acc = *lanes;
    for c in v.chunks_exact(8) {
        for (l, &v) in acc.iter_mut().zip(c) {
            *l += f(v.into());
        }
    }
    *lanes = acc;
}

/// Mean and 1/sqrt(var + eps) of one slab, accumulated in f64.
///
/// Sums are taken about the slab's first value (shifted data) so a large common offset does
/// not cancel catastrophically in E[x^2] - E[x]^2; eight fixed lanes let the compiler
/// vectorize while keeping the summation order fixed.
#[inline(always)]
fn stats<S: Wide>(x: &[S], eps: f64) -> (f32, f32) {
    let Some(first) = x.first() else {
        return (0.0, 0.0);
    };
    let mut buf = [0f32; CHUNK];
    let k = S::wide(std::slice::from_ref(first), &mut buf)[0] as f64;
    let (mut s, mut q) = ([0f64; 8], [0f64; 8]);
    let (mut sum, mut sq) = (0f64, 0f64);
    for part in x.chunks(CHUNK) {
        let v = S::wide(part, &mut buf);
        let (rows, tail) = v.split_at(v.len() - v.len() % 8);
        add_lanes(&mut s, rows, |v| v - k);
        add_lanes(&mut q, rows, |v| (v - k) * (v - k));
        // Only the last part has a tail: summed after the lanes, as one sweep does.
        if !tail.is_empty() {
            (sum, sq) = (s.iter().sum::<f64>(), q.iter().sum::<f64>());
            s = [0.0; 8];
            q = [0.0; 8];
            for &v in tail {
                let v = v as f64 - k;
                sum += v;
                sq += v * v;
            }
        }
    }
    sum += s.iter().sum::<f64>();
    sq += q.iter().sum::<f64>();
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

/// `dst[j] = act(src[j] * scale + shift)`.
#[inline(always)]
fn activate(src: &[f32], dst: &mut [f32], (scale, shift): (f32, f32), slope: f32) {
    for (o, &v) in dst.iter_mut().zip(src) {
        let z = v * scale + shift;
        *o = z * act_slope(z, slope);
    }
}

/// The slab's output: `src` normalized, scaled, shifted and activated into `dst`, a chunk at
/// a time.
#[inline(always)]
fn normalize<S: Wide, O: Output>(s: &Slab, src: &[S], dst: &mut [O]) {
    let st = stats(src, s.eps);
    let (mut buf, mut out) = ([0f32; CHUNK], [0f32; CHUNK]);
    for (k, (row, x)) in dst
        .chunks_mut(s.voxels)
        .zip(src.chunks(s.voxels))
        .enumerate()
    {
        for (o, x) in row.chunks_mut(CHUNK).zip(x.chunks(CHUNK)) {
            let out = &mut out[..o.len()];
            activate(S::wide(x, &mut buf), out, s.affine(k, st), s.slope);
            O::of_sums(out, o);
        }
    }
}

/// [`normalize`] of f32 values written over them.
#[inline(always)]
fn normalize_in_place(s: &Slab, data: &mut [f32]) {
    let st = stats(data, s.eps);
    let mut buf = [0f32; CHUNK];
    for (k, row) in data.chunks_mut(s.voxels).enumerate() {
        for o in row.chunks_mut(CHUNK) {
            let src = &mut buf[..o.len()];
            src.copy_from_slice(o);
            activate(src, o, s.affine(k, st), s.slope);
        }
    }
}

/// Sums over one channel of dz and dz * xhat, in f64 with fixed lanes (see [`stats`]).
#[inline(always)]
fn channel_sums<S: Wide>(
    x: &[S],
    dy: &[S],
    (scale, shift): (f32, f32),
    (mean, rstd): (f32, f32),
    slope: f32,
) -> (f64, f64) {
    let (mut s, mut q) = ([0f64; 8], [0f64; 8]);
    let (mut sum, mut sum_x) = (0f64, 0f64);
    let (mut xb, mut db) = ([0f32; CHUNK], [0f32; CHUNK]);
    // The terms as f64: summed from f32 buffers, the second set of lanes compiled scalar.
    let (mut dz, mut dzx) = ([0f64; CHUNK], [0f64; CHUNK]);
    for (xp, dp) in x.chunks(CHUNK).zip(dy.chunks(CHUNK)) {
        let (xv, dv) = (S::wide(xp, &mut xb), S::wide(dp, &mut db));
        // The terms first (one vector loop), then each summed in its own lanes.
        let (dz, dzx) = (&mut dz[..xv.len()], &mut dzx[..xv.len()]);
        for (((a, b), &v), &d) in dz.iter_mut().zip(dzx.iter_mut()).zip(xv).zip(dv) {
            let z = d * act_slope(v * scale + shift, slope);
            *a = z as f64;
            *b = (z * ((v - mean) * rstd)) as f64;
        }
        let rows = xv.len() - xv.len() % 8;
        add_lanes(&mut s, &dz[..rows], |v| v);
        add_lanes(&mut q, &dzx[..rows], |v| v);
        // Only the last part has a tail (see `stats`).
        if rows < xv.len() {
            (sum, sum_x) = (s.iter().sum::<f64>(), q.iter().sum::<f64>());
            s = [0.0; 8];
            q = [0.0; 8];
            for (&a, &b) in dz[rows..].iter().zip(&dzx[rows..]) {
                sum += a;
                sum_x += b;
            }
        }
    }
    (sum + s.iter().sum::<f64>(), sum_x + q.iter().sum::<f64>())
}

/// The slab's input gradient into `dx` from `x` and `dy`, and per channel the partial sums of
/// dz and dz * xhat (the bias and weight gradients) into `part`; a chunk at a time.
#[inline(always)]
fn gradient<S: Wide, O: Output>(
    s: &Slab,
    (x, dy): (&[S], &[S]),
    dx: &mut [O],
    part: &mut [(f64, f64)],
) {
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
    let (mut xb, mut db, mut out) = ([0f32; CHUNK], [0f32; CHUNK], [0f32; CHUNK]);
    for (k, (o, (xc, dc))) in dx.chunks_mut(s.voxels).zip(rows()).enumerate() {
        let (scale, shift) = s.affine(k, st);
        let wc = s.w[s.c0 + k];
        for (o, (xp, dp)) in o
            .chunks_mut(CHUNK)
            .zip(xc.chunks(CHUNK).zip(dc.chunks(CHUNK)))
        {
            let out = &mut out[..o.len()];
            let (xv, dv) = (S::wide(xp, &mut xb), S::wide(dp, &mut db));
            for ((o, &v), &d) in out.iter_mut().zip(xv).zip(dv) {
                let dxhat = wc * d * act_slope(v * scale + shift, s.slope);
                let xhat = (v - mean) * rstd;
                *o = rstd * (dxhat - a - xhat * bsum);
            }
            O::of_sums(out, o);
        }
    }
}

/// The slab passes at the widest vectors this CPU has.
pub(super) mod wide {
    use half::bf16;

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
                use crate::util::simd::{allows, Cap};
                if allows(Cap::Avx512) && is_x86_feature_detected!("avx512f") {
                    return Self::Avx512;
                }
                if allows(Cap::Avx2) && is_x86_feature_detected!("avx2") {
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

    widths!(normalize, normalize_at, super::normalize::<f32, f32>, (s: &Slab, src: &[f32], dst: &mut [f32]));
    widths!(normalize_bf16, normalize_bf16_at, super::normalize::<bf16, bf16>, (s: &Slab, src: &[bf16], dst: &mut [bf16]));
    widths!(normalize_in_place, normalize_in_place_at, super::normalize_in_place, (s: &Slab, data: &mut [f32]));
    widths!(gradient, gradient_at, super::gradient::<f32, f32>, (s: &Slab, xd: (&[f32], &[f32]), dx: &mut [f32], part: &mut [(f64, f64)]));
    widths!(gradient_bf16, gradient_bf16_at, super::gradient::<bf16, bf16>, (s: &Slab, xd: (&[bf16], &[bf16]), dx: &mut [bf16], part: &mut [(f64, f64)]));
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::wide::{
        gradient_at, gradient_bf16_at, normalize_at, normalize_bf16_at, normalize_in_place_at,
        Width,
    };
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
        let to_bf16 = |v: &[f32]| v.iter().map(|&f| bf16::from_f32(f)).collect::<Vec<_>>();
        let widen = |v: &[bf16]| v.iter().map(|b| b.to_f32()).collect::<Vec<_>>();
        // Slabs shorter than a chunk, over several chunks with a tail (5000 = 2 * 2048 + 904),
        // channels of odd lengths.
        for (channels, voxels, offset) in [
            (1, 1000, 0.0),
            (3, 77, 100.0),
            (2, 4096, -3.0),
            (2, 5003, 1.0),
        ] {
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
                normalize_at(width, &slab, &x, &mut y);
                let mut own = x.clone();
                normalize_in_place_at(width, &slab, &mut own);
                assert!(own == y, "{width:?}: in place differs");
                let (mut dx, mut part) = (vec![0f32; n], vec![(0f64, 0f64); channels]);
                gradient_at(width, &slab, (&x, &dy), &mut dx, &mut part);
                // bf16 values: the f32 passes' bits on the widened values, rounded once.
                let (xb, dyb) = (to_bf16(&x), to_bf16(&dy));
                let (xw, dyw) = (widen(&xb), widen(&dyb));
                let mut yb = vec![bf16::ZERO; n];
                normalize_bf16_at(width, &slab, &xb, &mut yb);
                let mut yw = vec![0f32; n];
                normalize_at(width, &slab, &xw, &mut yw);
                assert!(yb == to_bf16(&yw), "{width:?}: bf16 output");
                let (mut dxb, mut pb) = (vec![bf16::ZERO; n], vec![(0f64, 0f64); channels]);
                gradient_bf16_at(width, &slab, (&xb, &dyb), &mut dxb, &mut pb);
                let (mut dxw, mut pw) = (vec![0f32; n], vec![(0f64, 0f64); channels]);
                gradient_at(width, &slab, (&xw, &dyw), &mut dxw, &mut pw);
                assert!(dxb == to_bf16(&dxw) && pb == pw, "{width:?}: bf16 gradient");
                (y, dx, part)
            };
            let want = run(Width::Baseline);
            for &width in &widths {
                assert!(run(width) == want, "{width:?}, {channels}x{voxels}");
            }
        }
    }
}
