//! Convolutions computed straight from the input planes, with no column matrix.
//!
//! Each worker keeps, per source channel, the `kd` zero-padded planes that the current output
//! plane reads (a ring: one plane deeper pads one new plane per channel). The positions of an
//! output plane are numbered in the padded plane's row-major order (rows `wp` wide, the last
//! `kw - 1` of each row thrown away), so kernel tap (a, b, c) reads padded plane `a` at the fixed
//! offset `b * wp + c` from every position: contiguous loads and no index arithmetic per voxel.
//! A register tile of `CO` output channels x [`TILE`] positions sums every source channel and
//! tap before it is stored once. The input gradient of a stride-1 convolution is the same pass
//! over the output gradient with the weights transposed and flipped; the weight gradient sweeps
//! the plane (small planes several at a time, stacked) once per (source channel, tap row) with
//! the output gradient's rows (`weights.rs`). A strided pass keeps each padded plane as phase planes, so its taps are
//! contiguous runs too (see `Pass`); the up path's transposed convolution is computed a plane
//! at a time, alone or inside the decoder's first convolution (`up.rs`).
//!
//! f32: one kernel, written over plain arrays, compiled with AVX-512, with AVX2 and FMA (chosen
//! at run time) and for the build's own target ([`kernels`]). bf16 tensors on CPUs with
//! AVX512-BF16: products of bf16 values summed in f32 (`bf16.rs`; by AMX tiles where the CPU
//! has AMX-BF16, `amx.rs`), at any stride: a strided
//! input gradient runs as one stride-1 pass per stride phase (`phases.rs`). Each pass (into a
//! new buffer, written over its own source, computing the planes it reads) runs with either
//! (`kernels::Engine`), so inference holds the same tensors in both.

use std::ops::Range;

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod bf16;
mod in_place;
mod kernels;
mod phases;
mod products;
#[cfg(test)]
mod tests;
mod up;
mod values;
mod weights;

use super::columns::Planes;
use super::geometry::ConvGeom;
use super::matmul::SharedOut;
pub use in_place::forward_in_place;
use kernels::{Engine, Kernel, F32};
pub use products::{
    bf16_dot_products, forward_bf16, forward_bf16_products, grad_input_bf16,
    grad_input_bf16_products, grad_weight_bf16, grad_weight_bf16_products,
};
pub use up::{forward_up_pair, forward_up_pair_in_place, transpose, Upsampling};
use values::{interleave_scalar, store_row};
pub use values::{Cast, Operand, Output};
pub use weights::grad_weight;

/// Positions of one register tile (four AVX-512 vectors).
pub(crate) const TILE: usize = 64;
/// Output channels of one register tile: 6 x 4 accumulators and 4 inputs fill AVX-512's 32
/// registers.
pub(crate) const CO_MAX: usize = 6;
/// Bytes of L1 cache one chunk of source channels may fill: its packed weights and the rows
/// of its ring slots that consecutive tiles share. Half the L1 data cache of a Zen 4 (32 KiB),
/// a third of an Intel Xeon's or a Zen 5's (48 KiB). Sized by the weights alone (24 KiB),
/// 32->32 channels at 64 x 64 planes ran their passes 15-25% slower on an Intel Xeon.
const CHUNK_BYTES: usize = 16384;

/// Whether the direct pass computes this convolution and its input gradient: stride 1, and
/// padding below the kernel size (so the gradient's padding `k - 1 - p` exists).
pub fn applies(g: &ConvGeom) -> bool {
    g.stride == [1; 3] && reads_directly(g)
}

/// Whether the direct f32 pass computes this convolution's forward pass and weight gradient,
/// at any stride: padding below the kernel size on every axis, except a strided kernel equal
/// to its stride (the transposed convolution's gradients), which reads each voxel once: one
/// matrix product over its columns is faster there.
pub fn reads_directly(g: &ConvGeom) -> bool {
    (0..3).all(|a| g.padding[a] < g.kernel[a]) && !(g.is_non_overlapping() && g.stride != [1; 3])
}

/// `y = conv3d(x, w)` of a convolution the direct pass reads ([`reads_directly`]), the sources
/// of sample `n` given by `sample(n)` (one tensor's channels, or two side by side).
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
    let pass = Pass::forward(g);
    pass.run(kernel, sample, |o, i, t| forward_weight(g, w, o, i, t))
}

/// `dx` from `dy` of a stride-1 convolution ([`applies`]): the convolution of `dy` with `w`
/// transposed (Cin x Cout) and flipped, padded by `k - 1 - p`.
pub fn grad_input(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    grad_input_with(Kernel::detect(), g, dy, w)
}

/// [`grad_input`] with the given kernel, of f32 or bf16 tensors (widened as the ring is
/// filled), each sum stored once as an `O`.
fn grad_input_with<S: Cast<f32> + Sync, O: Output>(
    kernel: Kernel,
    g: &ConvGeom,
    dy: &[S],
    w: &[S],
) -> Vec<O> {
    let pass = Pass::input_gradient(g);
    let vo = g.output_voxels();
    let engine = F32::new(kernel, &pass, |o, i, t| {
        input_gradient_weight(g, w, o, i, t).cast()
    });
    pass.run_filled(&engine, |n, i, source, slot| {
        pass.fill_plane(&dy[(n * g.cout + i) * vo..][..vo], source, slot)
    })
}

/// `dx` from `dy` of a strided convolution the direct pass reads ([`reads_directly`]), one
/// stride-1 pass per stride phase; None where a phase would need negative padding (padding at
/// the stride beyond the last tap).
pub fn grad_input_strided(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Option<Vec<f32>> {
    grad_input_strided_with(Kernel::detect(), g, dy, w)
}

/// [`grad_input_strided`] of f32 or bf16 tensors, as [`grad_input_with`].
fn grad_input_strided_with<S: Cast<f32> + Sync, O: Output>(
    kernel: Kernel,
    g: &ConvGeom,
    dy: &[S],
    w: &[S],
) -> Option<Vec<O>> {
    let vo = g.output_voxels();
    phases::by_phases(g, |phase| {
        let pass = &phase.pass;
        let engine = F32::new(kernel, pass, |o, i, t| phase.weight(g, w, o, i, t).cast());
        pass.run_filled(&engine, |n, i, source, slot| {
            pass.fill_plane(&dy[(n * g.cout + i) * vo..][..vo], source, slot)
        })
    })
}

/// Bytes of one worker's buffers in a direct pass over `src_ch` channels of `size` (its ring
/// of padded planes, one block's sums and rows): what a memory forecast counts per worker.
pub fn worker_bytes(
    src_ch: usize,
    size: [usize; 3],
    kernel: [usize; 3],
    padding: [usize; 3],
    stride: [usize; 3],
) -> u64 {
    let p = Pass::new(1, [src_ch, 1], size, kernel, padding, stride);
    // One block's sums (the widest an engine takes at this plane) and rows.
    let sums = (TILE_OUT_FLOATS.min(32 * p.q_pad)).max(CO_MAX * p.q_pad);
    4 * (src_ch * kernel[0] * p.plane + sums + CO_MAX * p.q_pad) as u64
}

/// The forward pass's weight of destination `o`, source `i`, tap `t`.
fn forward_weight<T: Copy>(g: &ConvGeom, w: &[T], o: usize, i: usize, t: usize) -> T {
    w[(o * g.cin + i) * g.taps() + t]
}

/// The input gradient's weight: `w` transposed and flipped.
fn input_gradient_weight<T: Copy>(g: &ConvGeom, w: &[T], o: usize, i: usize, t: usize) -> T {
    let taps = g.taps();
    w[(i * g.cin + o) * taps + (taps - 1 - t)]
}

impl Pass {
    /// `g`'s forward pass (this pass) with weights `w`, its ring filled by the f32 fill
    /// `fill`, into a new buffer, multiplying in what `g.products` asks for on this CPU.
    fn forward_filled(
        &self,
        g: &ConvGeom,
        w: &[f32],
        fill: impl Fn(usize, usize, Option<usize>, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if let Some(engine) = products::dot_engine(self, g, w) {
            return self.run_filled(&engine, self.paired(&fill));
        }
        let engine = F32::new(Kernel::detect(), self, |o, i, t| {
            forward_weight(g, w, o, i, t)
        });
        self.run_filled(&engine, fill)
    }

    /// [`Self::forward_filled`] written over its source `dst` ([`Self::run_in_place`]).
    ///
    /// # Safety
    /// As [`Self::run_in_place`].
    unsafe fn forward_over(
        &self,
        g: &ConvGeom,
        w: &[f32],
        fill: impl Fn(usize, usize, Option<usize>, &mut [f32]) + Sync,
        dst: SharedOut,
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Some(engine) = products::dot_engine(self, g, w) {
            return self.run_in_place(&engine, self.paired(&fill), dst);
        }
        let engine = F32::new(Kernel::detect(), self, |o, i, t| {
            forward_weight(g, w, o, i, t)
        });
        self.run_in_place(&engine, fill, dst)
    }
}

/// Floats of one block's sums that an engine with blocks wider than [`CO_MAX`] may keep per
/// worker (8 MiB): wider blocks at larger planes fall back to [`CO_MAX`] channels, so that a
/// worker's buffers stay what the memory forecast counts.
const TILE_OUT_FLOATS: usize = 1 << 21;

/// Blocks of at most `width` destination channels, as even as can be (32 channels at width 6
/// are 6, 6, 5, 5, 5, 5: a last block of 2 would load as much as it multiplies).
fn block_count(channels: usize, width: usize) -> usize {
    channels.div_ceil(width)
}

/// Block `k` of [`block_count`]: its first channel and width (`k == count` gives the end).
fn block(channels: usize, width: usize, k: usize) -> (usize, usize) {
    let count = block_count(channels, width);
    let (base, extra) = (channels / count, channels % count);
    (k * base + k.min(extra), base + usize::from(k < extra))
}

/// One pass: `dst[n, o] = sum over (i, t) of weight(o, i, t) * src[n, i] at tap t`.
///
/// With an in-plane stride (sh, sw) a padded plane is kept as `sh x sw` phase planes (phase
/// (r, s) holds the padded values at rows `r + sh * j`, columns `s + sw * k`), so that tap
/// (b, c) still reads one contiguous run: phase (b % sh, c % sw) from (b / sh, c / sw) on.
/// Stride 1 is the single phase.
struct Pass {
    batch: usize,
    src_ch: usize,
    dst_ch: usize,
    /// Source size (D, H, W).
    src: [usize; 3],
    kernel: [usize; 3],
    /// Zeros before the source on each axis (as many after it, unless made by
    /// [`Pass::padded`]).
    pad: [usize; 3],
    stride: [usize; 3],
    /// Destination size (D, H, W).
    dst: [usize; 3],
    /// Row length of a phase plane: destination rows lie `wp` positions apart.
    wp: usize,
    /// Elements of one phase plane.
    phase: usize,
    /// Per in-plane tap (b, c), row-major: where it reads in a slot, from a position.
    offsets: Vec<usize>,
    /// Elements of one padded plane's slot, with the slack the last tile reads past its end.
    plane: usize,
    /// Positions of one output plane in padded-row order, rounded up to whole tiles.
    q_pad: usize,
}

impl Pass {
    fn new(
        batch: usize,
        chans: [usize; 2],
        src: [usize; 3],
        kernel: [usize; 3],
        pad: [usize; 3],
        stride: [usize; 3],
    ) -> Self {
        Self::padded(batch, chans, src, kernel, [pad, pad], stride)
    }

    /// [`Self::new`] with `pad` zeros before the source on each axis and `back` after it.
    fn padded(
        batch: usize,
        [src_ch, dst_ch]: [usize; 2],
        src: [usize; 3],
        kernel: [usize; 3],
        [pad, back]: [[usize; 3]; 2],
        stride: [usize; 3],
    ) -> Self {
        let padded = [0, 1, 2].map(|a| src[a] + pad[a] + back[a]);
        let [hp, wp] = [padded[1], padded[2]];
        let dst = [0, 1, 2].map(|a| (padded[a] - kernel[a]) / stride[a] + 1);
        let [sh, sw] = [stride[1], stride[2]];
        let (hq, wq) = (hp.div_ceil(sh), wp.div_ceil(sw));
        let phase = hq * wq;
        let offsets = (0..kernel[1])
            .flat_map(|b| {
                (0..kernel[2])
                    .map(move |c| ((b % sh) * sw + c % sw) * phase + (b / sh) * wq + c / sw)
            })
            .collect();
        // Tile reads reach `q_pad - 1 + offset < sh * sw * phase + TILE + kw`: the last
        // phase's rows past the destination's (`dst_h + (kh - 1) / sh <= hq`).
        let plane = (sh * sw * phase + kernel[2] + TILE).next_multiple_of(32);
        Self {
            batch,
            src_ch,
            dst_ch,
            src,
            kernel,
            pad,
            stride,
            dst,
            wp: wq,
            phase,
            offsets,
            plane,
            q_pad: (dst[1] * wq).next_multiple_of(TILE),
        }
    }

    /// The convolution itself (source `x`, destination `y`).
    fn forward(g: &ConvGeom) -> Self {
        let pass = Self::new(
            g.batch,
            [g.cin, g.cout],
            g.input,
            g.kernel,
            g.padding,
            g.stride,
        );
        debug_assert_eq!(pass.dst, g.output);
        pass
    }

    /// Its input gradient (source `dy`, destination `dx`) at stride 1.
    fn input_gradient(g: &ConvGeom) -> Self {
        let pad = [0, 1, 2].map(|a| g.kernel[a] - 1 - g.padding[a]);
        Self::new(g.batch, [g.cout, g.cin], g.output, g.kernel, pad, [1; 3])
    }

    fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// Runs `body(workspace, n, blocks, planes)` over items that split the destination by
    /// sample, depth and block of channels (enough items for every worker). Each destination
    /// value belongs to one item and is summed in one fixed order, whatever the thread count.
    fn plane_items<T: Copy + Default + Send>(
        &self,
        slot: usize,
        width: usize,
        body: impl Fn(&mut Workspace<T>, usize, Range<usize>, Range<usize>) + Sync,
    ) {
        let dd = self.dst[0];
        let blocks = block_count(self.dst_ch, width);
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
            || Workspace::new(self, slot),
            |ws, item| {
                let (n, rest) = (item / per_sample, item % per_sample);
                let (group, z0) = (rest % groups, (rest / groups) * depth);
                ws.ring.reset();
                let mine = group * blocks / groups..(group + 1) * blocks / groups;
                body(ws, n, mine, z0..(z0 + depth).min(dd));
            },
        );
    }

    /// The f32 pass over the sources `sample(n)` with weights `weight(o, i, t)`.
    fn run<'a>(
        &self,
        kernel: Kernel,
        sample: impl Fn(usize) -> Planes<'a> + Sync,
        weight: impl Fn(usize, usize, usize) -> f32,
    ) -> Vec<f32> {
        self.run_filled(&F32::new(kernel, self, weight), |n, i, source, slot| {
            self.fill_plane(sample(n).channel(i), source, slot)
        })
    }

    /// The pass of `engine` whose ring slots `fill(n, unit, source plane or None, slot)`
    /// fills, each sum stored once as an `O`.
    fn run_filled<E: Engine, O: Output>(
        &self,
        engine: &E,
        fill: impl Fn(usize, usize, Option<usize>, &mut [E::Elem]) + Sync,
    ) -> Vec<O> {
        self.run_biased(engine, fill, None)
    }

    /// [`Self::run_filled`] with `bias[o]` added to destination channel `o`'s sums before they
    /// are stored (rounded once where `O` is bf16).
    fn run_biased<E: Engine, O: Output>(
        &self,
        engine: &E,
        fill: impl Fn(usize, usize, Option<usize>, &mut [E::Elem]) + Sync,
        bias: Option<&[f32]>,
    ) -> Vec<O> {
        let mut out =
            vec![O::default(); self.batch * self.dst_ch * self.dst.iter().product::<usize>()];
        let shared = SharedOut(out.as_mut_ptr());
        let (units, width) = (engine.units(self), engine.width(self));
        self.plane_items(engine.slot(self), width, |ws, n, blocks, planes| {
            for z in planes {
                ws.ring
                    .load(self, z, units, |u, s, slot| fill(n, u, s, slot));
                for (o0, co) in blocks.clone().map(|b| block(self.dst_ch, width, b)) {
                    engine.block(self, ws, o0, co);
                    if let Some(b) = bias {
                        for (k, plane) in ws.out.chunks_mut(self.q_pad).take(co).enumerate() {
                            plane.iter_mut().for_each(|v| *v += b[o0 + k]);
                        }
                    }
                    self.store(&ws.out, n, o0..o0 + co, z, |at, row| {
                        // SAFETY: this item alone writes these channels' planes z.
                        unsafe { store_row(shared.at(at), row) }
                    });
                }
            }
        });
        out
    }

    /// Hands `put(offset, row)` the valid columns of the accumulated planes of channels
    /// `chans` (each `q_pad` apart in `buf`), each row with its offset in the destination.
    fn store(
        &self,
        buf: &[f32],
        n: usize,
        chans: Range<usize>,
        z: usize,
        mut put: impl FnMut(usize, &[f32]),
    ) {
        let [dd, dh, dw] = self.dst;
        for (k, o) in chans.enumerate() {
            let base = ((n * self.dst_ch + o) * dd + z) * dh * dw;
            for r in 0..dh {
                put(base + r * dw, &buf[k * self.q_pad + r * self.wp..][..dw]);
            }
        }
    }

    /// Source plane `source` (None: a padding plane) of one channel into a ring slot, zero
    /// padded, each value cast to the slot's type.
    fn fill_plane<S: Cast<T>, T: Copy + Default>(
        &self,
        channel: &[S],
        source: Option<usize>,
        slot: &mut [T],
    ) {
        let [_, sh, sw] = self.src;
        let Some(s) = source else {
            slot.fill(T::default());
            return;
        };
        if self.stride[1..] != [1, 1] {
            return self.fill_phases(&channel[s * sh * sw..][..sh * sw], slot);
        }
        // Zero only what no row covers: the padding around the rows and the slack.
        let mut start = self.pad[1] * self.wp + self.pad[2];
        slot[..start].fill(T::default());
        for r in 0..sh {
            S::cast_row(
                &channel[(s * sh + r) * sw..][..sw],
                &mut slot[start..start + sw],
            );
            let next = if r + 1 < sh {
                start + self.wp
            } else {
                slot.len()
            };
            slot[start + sw..next].fill(T::default());
            start = next;
        }
    }

    /// One source plane into the phase planes of a strided pass (see [`Pass`]).
    fn fill_phases<S: Cast<T>, T: Copy + Default>(&self, plane: &[S], slot: &mut [T]) {
        let [_, h, w] = self.src;
        let [_, sh, sw] = self.stride;
        slot.fill(T::default());
        for (r, row) in plane.chunks_exact(w).enumerate() {
            let pr = r + self.pad[1];
            let base = (pr % sh) * sw * self.phase + (pr / sh) * self.wp;
            if sw == 2 {
                self.split_row(row, &mut slot[base..]);
                continue;
            }
            // Columns of one phase land side by side: the row's values `sw` apart.
            for s in 0..sw {
                let first = (s + sw - self.pad[2] % sw) % sw;
                let at = base + s * self.phase + (first + self.pad[2]) / sw;
                let dst = &mut slot[at..];
                for (d, &v) in dst.iter_mut().zip(row[first.min(w)..].iter().step_by(sw)) {
                    *d = v.cast();
                }
            }
        }
        debug_assert!(h * w == plane.len());
    }

    /// One row into its two phase planes at an in-plane stride of 2 (from `dst` on): column
    /// `c` into phase `(c + pad) % 2` at `(c + pad) / 2`. Cast a piece at a time, then split
    /// into even and odd columns by a loop the compiler vectorizes (one strided value at a
    /// time, the fill took as long as the strided forward pass's products).
    fn split_row<S: Cast<T>, T: Copy + Default>(&self, row: &[S], dst: &mut [T]) {
        const PIECE: usize = 256;
        let p = self.pad[2];
        let (lo, hi) = dst.split_at_mut(self.phase);
        // Even columns: phase p % 2 from p / 2 on; odd ones: the other phase from (p + 1) / 2.
        let (even, odd) = match p % 2 {
            0 => (&mut lo[p / 2..], &mut hi[p.div_ceil(2)..]),
            _ => (&mut hi[p / 2..], &mut lo[p.div_ceil(2)..]),
        };
        let mut buf = [T::default(); PIECE];
        for (k, piece) in row.chunks(PIECE).enumerate() {
            let b = &mut buf[..piece.len()];
            S::cast_row(piece, b);
            let at = k * PIECE / 2;
            let pairs = b.chunks_exact(2);
            if let [last] = pairs.remainder() {
                even[at + b.len() / 2] = *last;
            }
            let (e, o) = (&mut even[at..], &mut odd[at..]);
            for ((e, o), pair) in e.iter_mut().zip(o.iter_mut()).zip(pairs) {
                *e = pair[0];
                *o = pair[1];
            }
        }
    }
}

/// One worker's buffers: the ring of padded source planes, one block's accumulated output
/// planes, and one block's rows of the output gradient (weight gradient).
struct Workspace<T> {
    ring: Ring<T>,
    /// [`CO_MAX`] planes of f32 sums in padded-row order, `q_pad` apart.
    out: Vec<f32>,
    /// [`CO_MAX`] rows of the output gradient in padded-row order, a sweep's length apart.
    rows: Vec<T>,
    /// The weight gradient's stacked planes of small sources (`weights::weight_sweeps`).
    stack: Vec<T>,
}

impl<T: Copy + Default> Workspace<T> {
    /// Buffers for a pass whose ring slots hold `slot` elements.
    fn new(p: &Pass, slot: usize) -> Self {
        Self {
            ring: Ring::new(p.kernel[0], slot),
            out: vec![0f32; CO_MAX * p.q_pad],
            rows: vec![T::default(); CO_MAX * p.q_pad],
            stack: Vec::new(),
        }
    }
}

/// Per source unit (a channel, or a pair of them), the `kd` padded planes the current output
/// plane reads, in slots that are reused as the plane moves deeper.
struct Ring<T> {
    data: Vec<T>,
    /// Elements of one slot.
    slot: usize,
    /// The padded depth index each slot holds (`usize::MAX`: none yet).
    held: Vec<usize>,
    /// Slot of kernel depth tap `a` for the current output plane.
    order: Vec<usize>,
}

impl<T: Copy + Default> Ring<T> {
    fn new(kd: usize, slot: usize) -> Self {
        Self {
            data: Vec::new(),
            slot,
            held: vec![usize::MAX; kd],
            order: vec![0; kd],
        }
    }

    /// Forgets what the slots hold (a new sample or a new range of planes).
    fn reset(&mut self) {
        self.held.fill(usize::MAX);
    }

    /// Makes room for `units` units, zero where nothing filled them yet (the tile engine's
    /// units past the last pair stay zero).
    fn reserve(&mut self, units: usize) {
        let need = units * self.held.len() * self.slot;
        if self.data.len() < need {
            self.data.resize(need, T::default());
        }
    }

    /// Unit `u`'s slot `s`.
    fn at(&self, u: usize, s: usize) -> &[T] {
        &self.data[(u * self.held.len() + s) * self.slot..][..self.slot]
    }

    /// Makes the ring hold the padded planes `z..z + kd` of `units` units that output plane
    /// `z` reads, calling `fill(unit, source plane or None for padding, slot)` for new ones.
    fn load(
        &mut self,
        p: &Pass,
        z: usize,
        units: usize,
        mut fill: impl FnMut(usize, Option<usize>, &mut [T]),
    ) {
        self.reserve(units);
        let kd = self.held.len();
        for a in 0..kd {
            let depth = z * p.stride[0] + a;
            let slot = depth % kd;
            self.order[a] = slot;
            if self.held[slot] == depth {
                continue;
            }
            self.held[slot] = depth;
            let source = depth.checked_sub(p.pad[0]).filter(|&s| s < p.src[0]);
            for u in 0..units {
                let at = (u * kd + slot) * self.slot;
                fill(u, source, &mut self.data[at..at + self.slot]);
            }
        }
    }
}
