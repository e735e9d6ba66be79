//! The weight gradient of the direct convolution: per (sample, group of channel blocks), the
//! sweep of each source plane against the output gradient's rows, summed in sample order.

use std::ops::Range;

use rayon::prelude::*;

use super::kernels::Kernel;
#[cfg(target_arch = "x86_64")]
use super::kernels::{grad_weight_plane_avx2, grad_weight_plane_avx512};
use super::{block, block_count, reads_directly, Cast, Pass, Workspace, CO_MAX};
use crate::model::ops::geometry::ConvGeom;
use crate::model::ops::matmul::SharedOut;

/// `dw` from `x` and `dy` of a convolution the direct pass reads ([`reads_directly`], any
/// stride) whose kernel is 1 to 3 wide, on CPUs with AVX2 or AVX-512 (None otherwise: the
/// column path computes it).
pub fn grad_weight(g: &ConvGeom, x: &[f32], dy: &[f32]) -> Option<Vec<f32>> {
    grad_weight_with(Kernel::detect(), g, x, dy)
}

/// [`grad_weight`] with the given kernel (tests compare them).
pub(super) fn grad_weight_with<S: Cast<f32> + Sync>(
    kernel: Kernel,
    g: &ConvGeom,
    x: &[S],
    dy: &[S],
) -> Option<Vec<f32>> {
    if matches!(kernel, Kernel::Portable) || !(1..=3).contains(&g.kernel[2]) || !reads_directly(g) {
        return None;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, dy);
    #[cfg(target_arch = "x86_64")]
    let pass = Pass::forward(g);
    #[cfg(target_arch = "x86_64")]
    let vi = g.input_voxels();
    #[cfg(target_arch = "x86_64")]
    let fill = |n: usize, i: usize, s: Option<usize>, slot: &mut [f32]| {
        pass.fill_plane(&x[(n * g.cin + i) * vi..][..vi], s, slot)
    };
    match kernel {
        // SAFETY (both): the CPU has the features (detected); the sweep holds what the pass
        // reads.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => Some(pass.weight_sweeps(
            (g.cin, CO_MAX),
            fill,
            dy,
            |sweep, co, out| unsafe { grad_weight_plane_avx512(&pass, sweep, co, out) },
        )),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => Some(pass.weight_sweeps(
            (g.cin, CO_MAX),
            fill,
            dy,
            |sweep, co, out| unsafe { grad_weight_plane_avx2(&pass, sweep, co, out) },
        )),
        Kernel::Portable => None,
    }
}

/// Bytes of one output gradient row a weight-gradient sweep should cover at least before its
/// sums are reduced across lanes (4,096 bf16 positions, 2,048 f32): smaller output planes are
/// swept several at a time (`bench_ops --passes`: 4 KiB and 8 KiB against the ring alone,
/// 8 KiB the fastest at 16x32x32 and 8x16x16).
const SWEEP_MIN_BYTES: usize = 8192;

/// One sweep of the weight gradient: per (source unit, depth tap a), where the planes that tap
/// reads begin (`planes[u * kd + a]`, each `len` positions and the taps' offsets readable),
/// per in-plane tap (b, c) where it reads from a position (`offsets`), and `len` positions of
/// the output gradient per channel of the block (`rows`, `len` apart; zero wherever no output
/// lies).
pub(super) struct Sweep<'a, T> {
    pub(super) planes: &'a [*const T],
    pub(super) offsets: &'a [usize],
    pub(super) rows: &'a [T],
    pub(super) len: usize,
}

impl Pass {
    /// The weight gradient: `body(workspace, n, blocks, gradient of those blocks' channels)`
    /// per item (sample, group of blocks). One gradient per sample, summed in sample order at
    /// the end, so the result does not depend on how items fall on workers.
    pub(super) fn weight_items<T: Copy + Default + Send>(
        &self,
        slot: usize,
        width: usize,
        body: impl Fn(&mut Workspace<T>, usize, Range<usize>, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let per_channel = self.src_ch * self.taps();
        let len = self.dst_ch * per_channel;
        let mut parts = vec![0f32; self.batch * len];
        let shared = SharedOut(parts.as_mut_ptr());
        let blocks = block_count(self.dst_ch, width);
        // Each item pads its sample's whole input once: few items, one per worker at least.
        let groups = rayon::current_num_threads()
            .div_ceil(self.batch)
            .min(blocks);
        (0..self.batch * groups).into_par_iter().for_each_init(
            || Workspace::new(self, slot),
            |ws, item| {
                let (n, group) = (item / groups, item % groups);
                let (b0, b1) = (group * blocks / groups, (group + 1) * blocks / groups);
                let (o0, o1) = (
                    block(self.dst_ch, width, b0).0,
                    block(self.dst_ch, width, b1).0,
                );
                // SAFETY: item (n, group) alone writes sample n's gradients of channels o0..o1.
                let mine = unsafe {
                    let at = shared.at(n * len + o0 * per_channel);
                    std::slice::from_raw_parts_mut(at, (o1 - o0) * per_channel)
                };
                ws.ring.reset();
                body(ws, n, b0..b1, mine);
            },
        );
        let mut parts = parts.chunks_exact(len);
        let mut dw = parts.next().map(<[f32]>::to_vec).unwrap_or_default();
        for part in parts {
            dw.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
        dw
    }

    /// The blocks `blocks` (at most `width` channels) of an item's gradient `mine` (which
    /// starts at the first block): (first channel, width, that block's part).
    pub(super) fn weight_blocks<'m>(
        &self,
        width: usize,
        blocks: Range<usize>,
        mine: &'m mut [f32],
    ) -> Vec<(usize, usize, &'m mut [f32])> {
        let per_channel = self.src_ch * self.taps();
        let mut rest = mine;
        let mut parts = Vec::with_capacity(blocks.len());
        for k in blocks {
            let (o0, co) = block(self.dst_ch, width, k);
            let (part, tail) = rest.split_at_mut(co * per_channel);
            parts.push((o0, co, part));
            rest = tail;
        }
        parts
    }

    /// The weight gradient over the sources that `fill(n, unit, source plane or None, slot)`
    /// pads, and `dy`: `kernel(sweep, co, that block's gradient)` per block of at most `width`
    /// channels and group of output planes. Planes of at least [`SWEEP_MIN_BYTES`] of rows are swept one at a
    /// time from the ring (each source plane padded once); smaller ones several at a time,
    /// stacked (each depth phase's planes one after the other, so that every tap still reads
    /// one contiguous run), for fewer reductions across lanes and no rounding of each plane
    /// to whole vectors.
    pub(super) fn weight_sweeps<S: Cast<T> + Sync, T: Copy + Default + Send>(
        &self,
        (units, width): (usize, usize),
        fill: impl Fn(usize, usize, Option<usize>, &mut [T]) + Sync,
        dy: &[S],
        kernel: impl Fn(&Sweep<T>, usize, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let (dd, kd, sz) = (self.dst[0], self.kernel[0], self.stride[0]);
        // One stacked plane: the phase planes of one padded source plane.
        let plane = self.stride[1] * self.stride[2] * self.phase;
        let least = SWEEP_MIN_BYTES / std::mem::size_of::<T>();
        let groups = (dd * plane).div_ceil(least).max(1);
        let zn = match plane >= least {
            true => 1,
            false => dd.div_ceil(groups),
        };
        self.weight_items(self.plane, width, |ws, n, blocks, mine| {
            let mut planes = vec![std::ptr::null(); units * kd];
            if zn == 1 {
                for z in 0..dd {
                    ws.ring
                        .load(self, z, units, |u, s, slot| fill(n, u, s, slot));
                    for u in 0..units {
                        for a in 0..kd {
                            planes[u * kd + a] = ws.ring.at(u, ws.ring.order[a]).as_ptr();
                        }
                    }
                    for (o0, co, out) in self.weight_blocks(width, blocks.clone(), mine) {
                        let chans = o0..o0 + co;
                        let at = self.load_rows(&mut ws.rows, dy, n, chans, (z, 1, 0), self.q_pad);
                        let sweep = Sweep {
                            planes: &planes,
                            offsets: &self.offsets,
                            rows: &ws.rows[at..],
                            len: self.q_pad,
                        };
                        kernel(&sweep, co, out);
                    }
                }
                return;
            }
            // Per unit: `sz` depth phases of `per_phase` planes each, then slack. With an
            // in-plane stride each phase plane of those planes gets a region of its own
            // (`split`), so that the output planes lie one phase plane apart in the sweep, not a
            // whole padded plane: stacked whole, three quarters of a stride-2 sweep were zeros.
            let per_phase = zn + (kd - 1) / sz;
            let depths = sz * per_phase;
            let phases = self.stride[1] * self.stride[2];
            let (region, dist) = match phases > 1 {
                true => (depths * self.phase, self.phase),
                false => (0, plane),
            };
            let unit = match phases > 1 {
                true => phases * region + self.plane + 64,
                false => depths * plane + plane + 64,
            };
            let offsets = match phases > 1 {
                true => self.region_offsets(region),
                false => self.offsets.clone(),
            };
            ws.stack.resize(units * unit, T::default());
            let mut whole = vec![T::default(); if phases > 1 { plane } else { 0 }];
            for z0 in (0..dd).step_by(zn) {
                let zs = zn.min(dd - z0);
                for u in 0..units {
                    for j in 0..depths {
                        let depth = (z0 + j % per_phase) * sz + j / per_phase;
                        let source = depth.checked_sub(self.pad[0]).filter(|&s| s < self.src[0]);
                        let stack = &mut ws.stack[u * unit..][..unit];
                        if phases == 1 {
                            fill(n, u, source, &mut stack[j * plane..][..plane]);
                            continue;
                        }
                        fill(n, u, source, &mut whole);
                        for (f, part) in whole.chunks_exact(self.phase).take(phases).enumerate() {
                            stack[f * region + j * dist..][..dist].copy_from_slice(part);
                        }
                    }
                    for a in 0..kd {
                        let at = u * unit + ((a % sz) * per_phase + a / sz) * dist;
                        planes[u * kd + a] = ws.stack[at..].as_ptr();
                    }
                }
                let len = ((zs - 1) * dist + self.dst[1] * self.wp).next_multiple_of(32);
                for (o0, co, out) in self.weight_blocks(width, blocks.clone(), mine) {
                    let chans = o0..o0 + co;
                    let at = self.load_rows(&mut ws.rows, dy, n, chans, (z0, zs, dist), len);
                    let sweep = Sweep {
                        planes: &planes,
                        offsets: &offsets,
                        rows: &ws.rows[at..],
                        len,
                    };
                    kernel(&sweep, co, out);
                }
            }
        })
    }

    /// Where in-plane tap (b, c) reads from a position when each phase plane has a region of
    /// `region` elements (the split stack of [`Pass::weight_sweeps`]).
    fn region_offsets(&self, region: usize) -> Vec<usize> {
        let [_, kh, kw] = self.kernel;
        let [sh, sw] = [self.stride[1], self.stride[2]];
        (0..kh)
            .flat_map(|b| {
                (0..kw)
                    .map(move |c| ((b % sh) * sw + c % sw) * region + (b / sh) * self.wp + c / sw)
            })
            .collect()
    }

    /// `dy`'s planes `z0..z0 + zs` (`at = (z0, zs, plane distance)`) of sample `n`, channels
    /// `chans`, into `rows` from the returned index on, in padded-row order, `len` apart per
    /// channel: zero in the thrown-away columns, between planes and past the last row (so
    /// those positions add nothing). The first row starts on a 64-byte boundary, so that every
    /// vector load of a row (`len` is a multiple of 32) stays within one cache line: split
    /// there (two loads in three of the sweep), an Intel Xeon's f32 weight gradient took 1.2x
    /// the time.
    pub(super) fn load_rows<S: Cast<T>, T: Copy + Default>(
        &self,
        rows: &mut Vec<T>,
        dy: &[S],
        n: usize,
        chans: Range<usize>,
        (z0, zs, dist): (usize, usize, usize),
        len: usize,
    ) -> usize {
        let [dd, dh, dw] = self.dst;
        let slack = 64 / size_of::<T>();
        rows.resize(chans.len() * len + slack, T::default());
        let start = rows.as_ptr().align_offset(64).min(slack);
        let aligned = &mut rows[start..];
        for (k, o) in chans.enumerate() {
            let dst = &mut aligned[k * len..][..len];
            dst.fill(T::default());
            for zl in 0..zs {
                let at = ((n * self.dst_ch + o) * dd + z0 + zl) * dh * dw;
                for (r, src) in dy[at..][..dh * dw].chunks_exact(dw).enumerate() {
                    S::cast_row(src, &mut dst[zl * dist + r * self.wp..][..dw]);
                }
            }
        }
        start
    }
}

/// The sixteen lanes of a weight-gradient kernel's `CO x KW` accumulators, kept between the
/// segments of a sweep (one per tap row).
#[cfg(target_arch = "x86_64")]
pub(super) type Kept<const CO: usize, const KW: usize> = [[[f32; 16]; KW]; CO];

/// The bf16 weight-gradient kernel's kept lanes (the f32 kernels keep theirs at each vector
/// width: `sweep_kernel!`). Loaded and stored by loops short enough to unroll, so that the
/// accumulators stay registers through the sweep (an indexed loop over them made them a stack
/// array that the sweep reloaded).
#[cfg(target_arch = "x86_64")]
pub(super) mod sums {
    use std::arch::x86_64::*;

    use super::Kept;

    /// The accumulators from their kept lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::model::ops::direct) fn load<const CO: usize, const KW: usize>(
        kept: &Kept<CO, KW>,
    ) -> [[__m512; KW]; CO] {
        let mut acc = [[_mm512_setzero_ps(); KW]; CO];
        for k in 0..CO {
            for c in 0..KW {
                // SAFETY: sixteen f32 lanes.
                acc[k][c] = unsafe { _mm512_loadu_ps(kept[k][c].as_ptr()) };
            }
        }
        acc
    }

    /// The accumulators into their kept lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::model::ops::direct) fn store<const CO: usize, const KW: usize>(
        kept: &mut Kept<CO, KW>,
        acc: &[[__m512; KW]; CO],
    ) {
        for k in 0..CO {
            for c in 0..KW {
                // SAFETY: sixteen f32 lanes.
                unsafe { _mm512_storeu_ps(kept[k][c].as_mut_ptr(), acc[k][c]) };
            }
        }
    }

    /// Adds source channel `i`'s sums, each summed across its lanes, to `dw` (channel of the
    /// block, source channel, tap), `lanes` holding one entry per tap row.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::model::ops::direct) fn add<const CO: usize, const KW: usize>(
        lanes: &[Kept<CO, KW>],
        (i, src_ch, taps): (usize, usize, usize),
        dw: &mut [f32],
    ) {
        for (ab, kept) in lanes.iter().enumerate() {
            for (k, row) in kept.iter().enumerate() {
                let at = (k * src_ch + i) * taps + ab * KW;
                for (d, l) in dw[at..at + KW].iter_mut().zip(row) {
                    // SAFETY: sixteen f32 lanes.
                    *d += _mm512_reduce_add_ps(unsafe { _mm512_loadu_ps(l.as_ptr()) });
                }
            }
        }
    }
}
