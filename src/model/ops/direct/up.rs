//! The up path's transposed convolution (kernel = stride: each upsampled voxel is one tap of
//! one low-resolution voxel), one upsampled plane at a time. Alone it is the transposed
//! convolution; inside the decoder's first convolution ([`forward_up_pair`]) each worker
//! computes the upsampled planes its ring reads, so that inferring, the upsampled tensor of a
//! window (one first-level activation) is never built. Both sum in the same order, so the
//! two give the same values bit for bit.

use rayon::prelude::*;

use super::kernels::Kernel;
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

    /// Upsampled plane `s` of channel `o` of sample `n`, a row of low-resolution positions at
    /// a time: `put(row, column, values)` places `values[x]` at column `column + sw * x`.
    fn plane(&self, n: usize, o: usize, s: usize, put: &mut dyn FnMut(usize, usize, &[f32])) {
        match Kernel::detect() {
            // SAFETY: the CPU has the features these were compiled for (detected).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { plane_avx512(self, n, o, s, put) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { plane_avx2(self, n, o, s, put) },
            Kernel::Portable => plane_sums(self, n, o, s, put),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn plane_avx512(
    u: &Upsampling,
    n: usize,
    o: usize,
    s: usize,
    put: &mut dyn FnMut(usize, usize, &[f32]),
) {
    plane_sums(u, n, o, s, put)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_avx2(
    u: &Upsampling,
    n: usize,
    o: usize,
    s: usize,
    put: &mut dyn FnMut(usize, usize, &[f32]),
) {
    plane_sums(u, n, o, s, put)
}

/// Low-resolution positions of one register tile (of a plane's positions in row order).
const ROW_TILE: usize = 64;

/// The sums of [`Upsampling::plane`]: per tile of [`ROW_TILE`] low-resolution positions, every source channel times its weights for the plane's in-plane taps (four
/// taps of a 2x2 stride share each load), in channel order, then the bias.
#[inline(always)]
fn plane_sums(
    u: &Upsampling,
    n: usize,
    o: usize,
    s: usize,
    put: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let [sd, sh, sw] = u.stride;
    let taps = sd * sh * sw;
    let in_plane = sh * sw;
    // Weights per source channel, the plane's in-plane taps side by side.
    let first = (s % sd) * in_plane;
    let weights: Vec<f32> = (0..u.low_ch)
        .flat_map(|j| (0..in_plane).map(move |t| (j, t)))
        .map(|(j, t)| u.weight[(j * u.up_ch + o) * taps + first + t])
        .collect();
    let rows = Rows {
        u,
        low: &u.low[n * u.low_ch * u.volume() + (s / sd) * u.low_size[1] * u.low_size[2]..],
        bias: u.bias.map(|b| b[o]),
    };
    match in_plane {
        4 => rows.sums::<4>(&weights, 0, put),
        2 => rows.sums::<2>(&weights, 0, put),
        _ => {
            // Any other stride: one tap at a time.
            for t in 0..in_plane {
                let one: Vec<f32> = weights.iter().skip(t).step_by(in_plane).copied().collect();
                rows.sums::<1>(&one, t, put);
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
    fn sums<const T: usize>(
        &self,
        weights: &[f32],
        t0: usize,
        put: &mut dyn FnMut(usize, usize, &[f32]),
    ) {
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
                            *s = wv.mul_add(v, *s);
                        }
                    }
                } else {
                    for (a, &wv) in acc.iter_mut().zip(w) {
                        for (s, &v) in a.iter_mut().zip(run) {
                            *s = wv.mul_add(v, *s);
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
                // Back into rows.
                let mut p = p0;
                while p < p0 + len {
                    let (y, x) = (p / lw, p % lw);
                    let end = (p0 + len).min((y + 1) * lw);
                    put(y * sh + b, c + x * sw, &a[p - p0..end - p0]);
                    p = end;
                }
            }
        }
    }
}

/// The transposed convolution alone, into (N, `up_ch`) volumes of `size` (at least
/// [`Upsampling::up_size`]; voxels past it, which no tap reaches, stay zero).
pub fn transpose(u: &Upsampling, batch: usize, size: [usize; 3]) -> Vec<f32> {
    let [od, oh, ow] = size;
    let ud = u.up_size()[0];
    let sw = u.stride[2];
    let mut out = vec![0f32; batch * u.up_ch * od * oh * ow];
    let shared = SharedOut(out.as_mut_ptr());
    (0..batch * u.up_ch * ud).into_par_iter().for_each(|item| {
        let (n, o, s) = (item / (u.up_ch * ud), (item / ud) % u.up_ch, item % ud);
        let base = ((n * u.up_ch + o) * od + s) * oh * ow;
        u.plane(n, o, s, &mut |r, c, values| {
            for (x, &v) in values.iter().enumerate() {
                // SAFETY: item (n, o, s) alone writes plane s of channel o; inside `out`.
                unsafe { *shared.at(base + r * ow + c + x * sw) = v };
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
    let sw = up.stride[2];
    move |n, i, source, slot| {
        let Some(s) = source else {
            return slot.fill(0.0);
        };
        if i >= up.up_ch {
            let plane = skip_plane(n * skip_ch + i - up.up_ch, s);
            return pass.fill_plane(plane, Some(0), slot);
        }
        slot.fill(0.0);
        up.plane(n, i, s, &mut |r, c, values| {
            let at = (r + pass.pad[1]) * pass.wp + pass.pad[2] + c;
            for (x, &v) in values.iter().enumerate() {
                slot[at + x * sw] = v;
            }
        });
    }
}
