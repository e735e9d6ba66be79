//! Stride-1 convolutions computed straight from the input planes, with no column matrix.
//!
//! Each worker keeps, per source channel, the `kd` zero-padded planes that the current output
//! plane reads (a ring: one plane deeper pads one new plane per channel). The positions of an
//! output plane are numbered in the padded plane's row-major order (rows `wp` wide, the last
//! `kw - 1` of each row thrown away), so kernel tap (a, b, c) reads padded plane `a` at the fixed
//! offset `b * wp + c` from every position: contiguous loads and no index arithmetic per voxel.
//! A register tile of `CO` output channels x [`TILE`] positions sums every source channel and
//! tap before it is stored once. The input gradient of a stride-1 convolution is the same pass
//! over the output gradient with the weights transposed and flipped.
//!
//! One kernel, written over plain arrays, is compiled three times: with AVX-512, with AVX2 and
//! FMA (chosen at run time), and for the build's own target (every other CPU).

use std::ops::Range;

use rayon::prelude::*;

mod kernels;
#[cfg(test)]
mod tests;

use super::columns::Planes;
use super::geometry::ConvGeom;
use super::matmul::SharedOut;
#[cfg(target_arch = "x86_64")]
use kernels::grad_weight_plane;
use kernels::Kernel;

/// Positions of one register tile (four AVX-512 vectors).
pub(crate) const TILE: usize = 64;
/// Output channels of one register tile: 6 x 4 accumulators and 4 inputs fill AVX-512's 32
/// registers.
pub(crate) const CO_MAX: usize = 6;
/// Packed weights of one chunk of source channels, in floats: they stay in the L1 cache
/// while every tile of a plane reads them.
const CHUNK_WEIGHTS: usize = 6144;

/// Whether the direct pass computes this convolution and its input gradient: stride 1, and
/// padding below the kernel size (so the gradient's padding `k - 1 - p` exists).
pub fn applies(g: &ConvGeom) -> bool {
    g.stride == [1; 3] && (0..3).all(|a| g.padding[a] < g.kernel[a])
}

/// `y = conv3d(x, w)` of a stride-1 convolution ([`applies`]), the sources of sample `n` given
/// by `sample(n)` (one tensor's channels, or two side by side).
pub fn forward<'a>(
    g: &ConvGeom,
    sample: impl Fn(usize) -> Planes<'a> + Sync,
    w: &[f32],
) -> Vec<f32> {
    forward_with(Kernel::detect(), g, sample, w)
}

fn forward_with<'a>(
    kernel: Kernel,
    g: &ConvGeom,
    sample: impl Fn(usize) -> Planes<'a> + Sync,
    w: &[f32],
) -> Vec<f32> {
    let (taps, cin) = (g.taps(), g.cin);
    let pass = Pass::new(g.batch, cin, g.cout, g.input, g.kernel, g.padding);
    let packed = pass.pack(|o, i, t| w[(o * cin + i) * taps + t]);
    pass.run(kernel, sample, &packed)
}

/// `dx` from `dy` of a stride-1 convolution ([`applies`]): the convolution of `dy` with `w`
/// transposed (Cin x Cout) and flipped, padded by `k - 1 - p`.
pub fn grad_input(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    grad_input_with(Kernel::detect(), g, dy, w)
}

fn grad_input_with(kernel: Kernel, g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    let taps = g.taps();
    let cin = g.cin;
    let pad = [0, 1, 2].map(|a| g.kernel[a] - 1 - g.padding[a]);
    let pass = Pass::new(g.batch, g.cout, g.cin, g.output, g.kernel, pad);
    let packed = pass.pack(|o, i, t| w[(i * cin + o) * taps + (taps - 1 - t)]);
    let vo = g.output_voxels();
    pass.run(
        kernel,
        |n| Planes::one(&dy[n * g.cout * vo..][..g.cout * vo], vo),
        &packed,
    )
}

/// `dw` from `x` and `dy` of a stride-1 convolution ([`applies`]) whose kernel is 1 or 3 wide
/// (None otherwise): per block of output channels, every (input channel, tap) is one sweep of
/// the output plane that multiplies `dy`'s rows by the padded input shifted by the tap. Each
/// weight is summed over samples, planes and positions in one fixed order by one worker.
pub fn grad_weight(g: &ConvGeom, x: &[f32], dy: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if matches!(Kernel::detect(), Kernel::Avx512) && [1, 3].contains(&g.kernel[2]) {
        let pass = Pass::new(g.batch, g.cin, g.cout, g.input, g.kernel, g.padding);
        return Some(pass.run_grad_weight(x, dy));
    }
    let _ = (g, x, dy);
    None
}

/// Blocks of at most [`CO_MAX`] destination channels, as even as can be (32 channels are
/// 6, 6, 5, 5, 5, 5: a last block of 2 would load as much as it multiplies).
fn block_count(channels: usize) -> usize {
    channels.div_ceil(CO_MAX)
}

/// Block `k` of [`block_count`]: its first channel and width (`k == count` gives the end).
fn block(channels: usize, k: usize) -> (usize, usize) {
    let count = block_count(channels);
    let (base, extra) = (channels / count, channels % count);
    (k * base + k.min(extra), base + usize::from(k < extra))
}

/// One stride-1 pass: `dst[n, o] = sum over (i, t) of weight(o, i, t) * src[n, i] at tap t`.
struct Pass {
    batch: usize,
    src_ch: usize,
    dst_ch: usize,
    /// Source size (D, H, W).
    src: [usize; 3],
    kernel: [usize; 3],
    pad: [usize; 3],
    /// Destination size (D, H, W).
    dst: [usize; 3],
    /// Padded row length.
    wp: usize,
    /// Floats of one padded plane's slot, with the slack the last tile reads past its end.
    plane: usize,
    /// Positions of one output plane in padded-row order, rounded up to whole tiles.
    q_pad: usize,
    /// Source channels per weight chunk.
    chunk: usize,
}

impl Pass {
    fn new(
        batch: usize,
        src_ch: usize,
        dst_ch: usize,
        src: [usize; 3],
        kernel: [usize; 3],
        pad: [usize; 3],
    ) -> Self {
        let [hp, wp] = [1, 2].map(|a| src[a] + 2 * pad[a]);
        let dst = [0, 1, 2].map(|a| src[a] + 2 * pad[a] + 1 - kernel[a]);
        let taps: usize = kernel.iter().product();
        // Tile reads reach `q_pad - 1 + (kh - 1) * wp + kw - 1 < hp * wp + TILE + kw`.
        let plane = (hp * wp + kernel[2] + TILE).next_multiple_of(16);
        let q_pad = (dst[1] * wp).next_multiple_of(TILE);
        let chunks = (src_ch * taps * CO_MAX).div_ceil(CHUNK_WEIGHTS).max(1);
        Self {
            batch,
            src_ch,
            dst_ch,
            src,
            kernel,
            pad,
            dst,
            wp,
            plane,
            q_pad,
            chunk: src_ch.div_ceil(chunks),
        }
    }

    /// The weights `weight(o, i, t)` per block of [`CO_MAX`] destination channels `o0..`, laid
    /// out (source channel, tap, channel of the block).
    fn pack(&self, weight: impl Fn(usize, usize, usize) -> f32) -> Vec<f32> {
        let (taps, src_ch) = (self.taps(), self.src_ch);
        let mut packed = Vec::with_capacity(self.dst_ch * src_ch * taps);
        for (o0, co) in (0..block_count(self.dst_ch)).map(|b| block(self.dst_ch, b)) {
            for i in 0..src_ch {
                for t in 0..taps {
                    packed.extend((o0..o0 + co).map(|o| weight(o, i, t)));
                }
            }
        }
        packed
    }

    fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// The whole pass; each output value is summed by one worker in one fixed order, so the
    /// result does not depend on the thread count.
    fn run<'a>(
        &self,
        kernel: Kernel,
        sample: impl Fn(usize) -> Planes<'a> + Sync,
        packed: &[f32],
    ) -> Vec<f32> {
        let [dd, dh, dw] = self.dst;
        let mut out = vec![0f32; self.batch * self.dst_ch * dd * dh * dw];
        let shared = SharedOut(out.as_mut_ptr());
        let blocks = block_count(self.dst_ch);
        let planes = self.batch * dd;
        let want = 4 * rayon::current_num_threads();
        let groups = if planes >= want {
            1
        } else {
            want.div_ceil(planes).min(blocks)
        };
        let depth = (planes * groups).div_ceil(want).clamp(1, dd);
        let per_sample = groups * dd.div_ceil(depth);
        (0..self.batch * per_sample).into_par_iter().for_each_init(
            || Workspace::new(self),
            |ws, item| {
                let (n, rest) = (item / per_sample, item % per_sample);
                let (group, z0) = (rest % groups, (rest / groups) * depth);
                let blocks = group * blocks / groups..(group + 1) * blocks / groups;
                ws.held.fill(usize::MAX);
                let src = sample(n);
                for z in z0..(z0 + depth).min(dd) {
                    ws.load_planes(self, &src, z);
                    for (o0, co) in blocks.clone().map(|b| block(self.dst_ch, b)) {
                        kernel.block(self, ws, packed, o0, co);
                        // SAFETY: item (n, group, z range) alone writes these channels' planes.
                        unsafe { self.store(ws, shared, n, o0..o0 + co, z) };
                    }
                }
            },
        );
        out
    }

    /// Copies the valid columns of the tile buffer's planes into `out` at (n, o0.., z).
    ///
    /// # Safety
    /// `out` holds the whole destination, and no other worker writes these planes.
    unsafe fn store(
        &self,
        ws: &Workspace,
        out: SharedOut,
        n: usize,
        chans: Range<usize>,
        z: usize,
    ) {
        let [dd, dh, dw] = self.dst;
        for (k, o) in chans.enumerate() {
            let buf = &ws.out[k * self.q_pad..];
            let base = ((n * self.dst_ch + o) * dd + z) * dh * dw;
            for r in 0..dh {
                let src = &buf[r * self.wp..][..dw];
                std::ptr::copy_nonoverlapping(src.as_ptr(), out.at(base + r * dw), dw);
            }
        }
    }
}

impl Pass {
    /// The weight gradient, items being groups of [`CO_MAX`]-channel blocks of `dy`.
    #[cfg(target_arch = "x86_64")]
    fn run_grad_weight(&self, x: &[f32], dy: &[f32]) -> Vec<f32> {
        let taps = self.taps();
        let (vi, vo) = (
            self.src.iter().product::<usize>(),
            self.dst.iter().product::<usize>(),
        );
        let len = self.dst_ch * self.src_ch * taps;
        // One gradient per sample, summed in sample order at the end: the result does not
        // depend on how the items fall on workers.
        let mut parts = vec![0f32; self.batch * len];
        let shared = SharedOut(parts.as_mut_ptr());
        let blocks = block_count(self.dst_ch);
        // Each item pads its sample's whole input once: few items, one per worker at least.
        let groups = rayon::current_num_threads()
            .div_ceil(self.batch)
            .min(blocks);
        (0..self.batch * groups).into_par_iter().for_each_init(
            || Workspace::new(self),
            |ws, item| {
                let (n, group) = (item / groups, item % groups);
                let (b0, b1) = (group * blocks / groups, (group + 1) * blocks / groups);
                let (o0, o1) = (block(self.dst_ch, b0).0, block(self.dst_ch, b1).0);
                // SAFETY: item (n, group) alone writes sample n's gradients of channels o0..o1.
                let mine = unsafe {
                    let at = n * len + o0 * self.src_ch * taps;
                    std::slice::from_raw_parts_mut(shared.at(at), (o1 - o0) * self.src_ch * taps)
                };
                ws.held.fill(usize::MAX);
                let src = Planes::one(&x[n * self.src_ch * vi..][..self.src_ch * vi], vi);
                let grad = &dy[n * self.dst_ch * vo..][..self.dst_ch * vo];
                for z in 0..self.dst[0] {
                    ws.load_planes(self, &src, z);
                    for (b, co) in (b0..b1).map(|k| block(self.dst_ch, k)) {
                        self.load_rows(ws, grad, b..b + co, z);
                        let out = &mut mine[(b - o0) * self.src_ch * taps..];
                        // SAFETY: AVX-512 was detected; ws holds this plane and co rows.
                        unsafe { grad_weight_plane(self, ws, co, out) };
                    }
                }
            },
        );
        let mut parts = parts.chunks_exact(len);
        let mut dw = parts.next().map(<[f32]>::to_vec).unwrap_or_default();
        for part in parts {
            dw.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
        dw
    }

    #[cfg(target_arch = "x86_64")]
    /// `dy`'s planes `z` of channels `chans` into `ws.out` in padded-row order, zero in the
    /// thrown-away columns and past the last row (so those positions add nothing).
    fn load_rows(&self, ws: &mut Workspace, dy: &[f32], chans: std::ops::Range<usize>, z: usize) {
        let [dd, dh, dw] = self.dst;
        for (k, o) in chans.enumerate() {
            let rows = &mut ws.out[k * self.q_pad..][..self.q_pad];
            rows.fill(0.0);
            let plane = &dy[(o * dd + z) * dh * dw..][..dh * dw];
            for (r, src) in plane.chunks_exact(dw).enumerate() {
                rows[r * self.wp..][..dw].copy_from_slice(src);
            }
        }
    }
}

/// One worker's buffers: the ring of padded source planes and one block's output planes.
struct Workspace {
    /// Slot `s` of channel `i` at `(i * kd + s) * plane`.
    ring: Vec<f32>,
    /// The padded depth index each slot holds (`usize::MAX`: none yet).
    held: Vec<usize>,
    /// Slot of kernel depth tap `a` for the current output plane.
    order: Vec<usize>,
    /// [`CO_MAX`] output planes in padded-row order, `q_pad` floats apart.
    out: Vec<f32>,
}

impl Workspace {
    fn new(p: &Pass) -> Self {
        let kd = p.kernel[0];
        Self {
            ring: vec![0f32; p.src_ch * kd * p.plane],
            held: vec![usize::MAX; kd],
            order: vec![0; kd],
            out: vec![0f32; CO_MAX * p.q_pad],
        }
    }

    /// Makes the ring hold the padded planes `z..z + kd` that output plane `z` reads.
    fn load_planes(&mut self, p: &Pass, src: &Planes<'_>, z: usize) {
        let [kd, _, _] = p.kernel;
        let [sd, sh, sw] = p.src;
        for a in 0..kd {
            let (depth, slot) = (z + a, (z + a) % kd);
            self.order[a] = slot;
            if self.held[slot] == depth {
                continue;
            }
            self.held[slot] = depth;
            let source = depth.checked_sub(p.pad[0]).filter(|&s| s < sd);
            for i in 0..p.src_ch {
                let dst = &mut self.ring[(i * kd + slot) * p.plane..][..p.plane];
                let Some(s) = source else {
                    dst.fill(0.0);
                    continue;
                };
                // Zero only what no row covers: the padding around the rows and the slack.
                let channel = src.channel(i);
                let mut start = p.pad[1] * p.wp + p.pad[2];
                dst[..start].fill(0.0);
                for r in 0..sh {
                    let from = &channel[(s * sh + r) * sw..][..sw];
                    dst[start..start + sw].copy_from_slice(from);
                    let next = if r + 1 < sh { start + p.wp } else { p.plane };
                    dst[start + sw..next].fill(0.0);
                    start = next;
                }
            }
        }
    }
}
