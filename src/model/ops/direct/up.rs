//! The up path's transposed convolution (kernel = stride: each upsampled voxel is one tap of
//! one low-resolution voxel), one upsampled plane at a time. Alone it is the transposed
//! convolution; inside the decoder's first convolution ([`forward_up_pair`]) each worker
//! computes the upsampled planes its ring reads, so that inferring, the upsampled tensor of a
//! window (one first-level activation) is never built. Both sum in the same order, so the
//! two give the same values bit for bit.

use std::ops::Range;

use rayon::prelude::*;

use super::kernels::{madd, Kernel, PORTABLE_FUSED};
use super::Pass;
use crate::model::ops::geometry::ConvGeom;
use crate::model::ops::matmul::SharedOut;

/// A transposed convolution with kernel = stride, and the bias added after its sums.
#[derive(Clone, Copy, Debug)]
pub struct Upsampling<'a> {
    /// Low-resolution input, all samples (N, `low_ch`, D, H, W).
    pub low: &'a [f32],
    /// Channels of `low`.
    pub low_ch: usize,
    /// (D, H, W) of `low`.
    pub low_size: [usize; 3],
    /// (`low_ch`, `up_ch`, sd, sh, sw), PyTorch's layout.
    pub weight: &'a [f32],
    /// Channels of the upsampled tensor.
    pub up_ch: usize,
    /// The stride, which is also the kernel.
    pub stride: [usize; 3],
    /// Per upsampled channel (None: no bias).
    pub bias: Option<&'a [f32]>,
}

impl Upsampling<'_> {
    fn volume(&self) -> usize {
        self.low_size.iter().product()
    }

    /// (D, H, W) of the upsampled tensor.
    pub fn up_size(&self) -> [usize; 3] {
        [0, 1, 2].map(|a| self.low_size[a] * self.stride[a])
    }

    /// The weights laid out for [`Self::plane`]: per (depth tap, upsampled channel, source
    /// channel) the in-plane taps side by side. Laid out once per pass, not once per plane.
    fn planar_weights(&self) -> Vec<f32> {
        let [sd, sh, sw] = self.stride;
        let (in_plane, taps) = (sh * sw, sd * sh * sw);
        let mut out = Vec::with_capacity(self.weight.len());
        for a in 0..sd {
            for o in 0..self.up_ch {
                for j in 0..self.low_ch {
                    let at = (j * self.up_ch + o) * taps + a * in_plane;
                    out.extend_from_slice(&self.weight[at..at + in_plane]);
                }
            }
        }
        out
    }

    /// Upsampled plane `s` of channel `o` of sample `n` (`planar` from
    /// [`Self::planar_weights`]), a row of low-resolution positions at a time:
    /// `put(row, column, step, values)` places `values[x]` at column `column + step * x`.
    fn plane(&self, kernel: Kernel, planar: &[f32], n: usize, o: usize, s: usize, put: Put) {
        let [sd, sh, sw] = self.stride;
        let in_plane = sh * sw;
        let per_channel = self.low_ch * in_plane;
        let weights = &planar[((s % sd) * self.up_ch + o) * per_channel..][..per_channel];
        let rows = Rows {
            u: self,
            low: &self.low[n * self.low_ch * self.volume() + (s / sd) * low_plane(self)..],
            bias: self.bias.map(|b| b[o]),
        };
        match (kernel, in_plane) {
            // SAFETY: the CPU has the features these were compiled for (the kernel detected).
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, 4) if sw == 2 => unsafe { rows.pairs_avx512(weights, put) },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, _) => unsafe { plane_avx512(&rows, weights, put) },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2, _) => unsafe { plane_avx2(&rows, weights, put) },
            _ => plane_sums::<PORTABLE_FUSED>(&rows, weights, put),
        }
    }
}

/// Positions of one low-resolution plane.
fn low_plane(u: &Upsampling) -> usize {
    u.low_size[1] * u.low_size[2]
}

/// Where [`Upsampling::plane`] hands its rows.
type Put<'p> = &'p mut dyn FnMut(usize, usize, usize, &[f32]);

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn plane_avx512(rows: &Rows, weights: &[f32], put: Put) {
    plane_sums::<true>(rows, weights, put)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_avx2(rows: &Rows, weights: &[f32], put: Put) {
    plane_sums::<true>(rows, weights, put)
}

/// Low-resolution positions of one register tile (of a plane's positions in row order).
const ROW_TILE: usize = 64;

/// The sums of [`Upsampling::plane`]: per tile of [`ROW_TILE`] low-resolution positions,
/// every source channel times its weights for the plane's in-plane taps (four taps of a 2x2
/// stride share each load), in channel order, then the bias.
#[inline(always)]
fn plane_sums<const FUSED: bool>(rows: &Rows, weights: &[f32], put: Put) {
    let in_plane = rows.u.stride[1] * rows.u.stride[2];
    match in_plane {
        4 => rows.sums::<4, FUSED>(weights, 0, put),
        2 => rows.sums::<2, FUSED>(weights, 0, put),
        _ => {
            // Any other stride: one tap at a time.
            for t in 0..in_plane {
                let one: Vec<f32> = weights.iter().skip(t).step_by(in_plane).copied().collect();
                rows.sums::<1, FUSED>(&one, t, put);
            }
        }
    }
}

/// One low-resolution plane of every source channel, for one upsampled channel.
struct Rows<'a> {
    u: &'a Upsampling<'a>,
    /// Sample's channel 0 at the plane; channel `j` is `volume` further.
    low: &'a [f32],
    bias: Option<f32>,
}

impl Rows<'_> {
    /// `T` in-plane taps from tap `t0` on (row-major over (sh, sw)), `weights[j * T + t]`.
    #[inline(always)]
    fn sums<const T: usize, const FUSED: bool>(&self, weights: &[f32], t0: usize, put: Put) {
        let [_, lh, lw] = self.u.low_size;
        let [_, sh, sw] = self.u.stride;
        let volume = self.u.volume();
        // The plane's positions as one run (rows side by side), a tile at a time.
        for p0 in (0..lh * lw).step_by(ROW_TILE) {
            let len = ROW_TILE.min(lh * lw - p0);
            let mut acc = [[0f32; ROW_TILE]; T];
            for (j, w) in weights.chunks_exact(T).enumerate() {
                let run = &self.low[j * volume + p0..][..len];
                if let Ok(run) = <&[f32; ROW_TILE]>::try_from(run) {
                    for (a, &wv) in acc.iter_mut().zip(w) {
                        for (s, &v) in a.iter_mut().zip(run) {
                            *s = madd::<FUSED>(wv, v, *s);
                        }
                    }
                } else {
                    for (a, &wv) in acc.iter_mut().zip(w) {
                        for (s, &v) in a.iter_mut().zip(run) {
                            *s = madd::<FUSED>(wv, v, *s);
                        }
                    }
                }
            }
            for (k, a) in acc.iter_mut().enumerate() {
                let (b, c) = ((t0 + k) / sw, (t0 + k) % sw);
                let a = &mut a[..len];
                if let Some(bias) = self.bias {
                    a.iter_mut().for_each(|v| *v += bias);
                }
                self.rows_of(p0, len, |y, x, range| {
                    put(y * sh + b, c + x * sw, sw, &a[range])
                });
            }
        }
    }

    /// The rows a tile of `len` positions from `p0` spans: `each(row, first column, the
    /// tile's positions in that row)`.
    #[inline(always)]
    fn rows_of(&self, p0: usize, len: usize, mut each: impl FnMut(usize, usize, Range<usize>)) {
        let lw = self.u.low_size[2];
        let mut p = p0;
        while p < p0 + len {
            let (y, x) = (p / lw, p % lw);
            let end = (p0 + len).min((y + 1) * lw);
            each(y, x, p - p0..end - p0);
            p = end;
        }
    }

    /// [`Self::sums`] of the four taps of a 2x2 in-plane stride with AVX-512: the tile's
    /// sixteen accumulators in registers (the portable form kept them on the stack and took
    /// scalar tails, which small planes are all of), tails masked, and each tap row's two
    /// columns interleaved, so that every upsampled row is handed whole. The same products
    /// and sums in the same order, so the same bits.
    ///
    /// # Safety
    /// The CPU has AVX-512F and FMA; `weights` holds four per source channel.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn pairs_avx512(&self, weights: &[f32], put: Put) {
        use std::arch::x86_64::*;
        const V: usize = ROW_TILE / 16;
        let [_, lh, lw] = self.u.low_size;
        let sh = self.u.stride[1];
        let volume = self.u.volume();
        let positions = lh * lw;
        let low = self.low.as_ptr();
        let bias = _mm512_set1_ps(self.bias.unwrap_or(0.0));
        // Lane k of the low half: (a, c) lane k / 2 of a if k is even, else of c.
        let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        let mut pairs = [[0f32; 2 * ROW_TILE]; 2];
        for p0 in (0..positions).step_by(ROW_TILE) {
            let len = ROW_TILE.min(positions - p0);
            let masks: [__mmask16; V] = std::array::from_fn(|r| {
                let left = len.saturating_sub(16 * r).min(16);
                ((1u32 << left) - 1) as __mmask16
            });
            let mut acc = [[_mm512_setzero_ps(); V]; 4];
            for j in 0..self.u.low_ch {
                let run = low.wrapping_add(j * volume + p0);
                // Masked lanes are not read.
                let x: [__m512; V] = std::array::from_fn(|r| {
                    _mm512_maskz_loadu_ps(masks[r], run.wrapping_add(16 * r))
                });
                for (t, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*weights.get_unchecked(j * 4 + t));
                    for (a, &x) in acc.iter_mut().zip(&x) {
                        *a = _mm512_fmadd_ps(w, x, *a);
                    }
                }
            }
            for (b, pair) in pairs.iter_mut().enumerate() {
                for (r, (&a, &c)) in acc[2 * b].iter().zip(&acc[2 * b + 1]).enumerate() {
                    let (mut a, mut c) = (a, c);
                    if self.bias.is_some() {
                        a = _mm512_add_ps(a, bias);
                        c = _mm512_add_ps(c, bias);
                    }
                    let at = pair.as_mut_ptr().add(32 * r);
                    _mm512_storeu_ps(at, _mm512_permutex2var_ps(a, lo, c));
                    _mm512_storeu_ps(at.add(16), _mm512_permutex2var_ps(a, hi, c));
                }
                self.rows_of(p0, len, |y, x, range| {
                    put(y * sh + b, 2 * x, 1, &pair[2 * range.start..2 * range.end])
                });
            }
        }
    }
}

/// The transposed convolution alone, into (N, `up_ch`) volumes of `size` (at least
/// [`Upsampling::up_size`]; voxels past it, which no tap reaches, stay zero).
pub fn transpose(u: &Upsampling, batch: usize, size: [usize; 3]) -> Vec<f32> {
    transpose_with(Kernel::detect(), u, batch, size)
}

/// [`transpose`] with the given kernel (tests compare them).
pub(super) fn transpose_with(
    kernel: Kernel,
    u: &Upsampling,
    batch: usize,
    size: [usize; 3],
) -> Vec<f32> {
    let [od, oh, ow] = size;
    let ud = u.up_size()[0];
    let planar = u.planar_weights();
    let mut out = vec![0f32; batch * u.up_ch * od * oh * ow];
    let shared = SharedOut(out.as_mut_ptr());
    (0..batch * u.up_ch * ud).into_par_iter().for_each(|item| {
        let (n, o, s) = (item / (u.up_ch * ud), (item / ud) % u.up_ch, item % ud);
        let base = ((n * u.up_ch + o) * od + s) * oh * ow;
        u.plane(kernel, &planar, n, o, s, &mut |r, c, step, values| {
            for (x, &v) in values.iter().enumerate() {
                // SAFETY: item (n, o, s) alone writes plane s of channel o; inside `out`.
                unsafe { *shared.at(base + r * ow + c + x * step) = v };
            }
        });
    });
    out
}

/// The decoder's first convolution inferring, `g` over the channels of the upsampled tensor
/// (`up`'s, never built) then those of `skip` (N, Cs, D, H, W): the values of
/// `conv3d(cat([transpose(up) + bias, skip]), w)` bit for bit, for a convolution of
/// [`super::applies`].
pub fn forward_up_pair(g: &ConvGeom, up: &Upsampling, skip: &[f32], w: &[f32]) -> Vec<f32> {
    let pass = Pass::forward(g);
    let plane = g.input[1] * g.input[2];
    let skip_plane = |c: usize, s: usize| &skip[c * g.input_voxels() + s * plane..][..plane];
    let fill = up_fill(&pass, g, up, skip_plane);
    pass.forward_filled(g, w, fill)
}

/// [`forward_up_pair`] written over `skip` itself, where the convolution has as many outputs
/// as the skip has channels (a U-Net decoder's first convolution): no output tensor is made.
///
/// # Safety
/// `skip` points at the skip's (N, Cs, D, H, W) floats, Cs = `g.cout`, which nothing else
/// reads or writes during the call.
pub unsafe fn forward_up_pair_in_place(g: &ConvGeom, up: &Upsampling, skip: *mut f32, w: &[f32]) {
    let pass = Pass::forward(g);
    let fits = pass.dst == pass.src && g.cout + up.up_ch == g.cin && super::applies(g);
    assert!(fits, "{g:?}");
    let plane = g.input[1] * g.input[2];
    let src = SharedOut(skip);
    let skip_plane = |c: usize, s: usize| {
        // SAFETY: the ring loads plane s before any item overwrites it (run_in_place).
        unsafe { std::slice::from_raw_parts(src.at(c * g.input_voxels() + s * plane), plane) }
    };
    let fill = up_fill(&pass, g, up, skip_plane);
    pass.forward_over(g, w, fill, src)
}

/// The ring's fill of the decoder's first convolution: upsampled planes computed from `up`,
/// then the skip's planes (`skip_plane(sample channel, plane)`, sample channel `n * Cs + c`).
fn up_fill<'a, 'p>(
    pass: &'a Pass,
    g: &'a ConvGeom,
    up: &'a Upsampling<'a>,
    skip_plane: impl Fn(usize, usize) -> &'p [f32] + Sync + 'a,
) -> impl Fn(usize, usize, Option<usize>, &mut [f32]) + Sync + 'a {
    let skip_ch = g.cin - up.up_ch;
    let (kernel, planar) = (Kernel::detect(), up.planar_weights());
    move |n, i, source, slot| {
        let Some(s) = source else {
            return slot.fill(0.0);
        };
        if i >= up.up_ch {
            let plane = skip_plane(n * skip_ch + i - up.up_ch, s);
            return pass.fill_plane(plane, Some(0), slot);
        }
        slot.fill(0.0);
        up.plane(kernel, &planar, n, i, s, &mut |r, c, step, values| {
            let at = (r + pass.pad[1]) * pass.wp + pass.pad[2] + c;
            match step {
                1 => slot[at..at + values.len()].copy_from_slice(values),
                _ => values
                    .iter()
                    .enumerate()
                    .for_each(|(x, &v)| slot[at + x * step] = v),
            }
        });
    }
}
