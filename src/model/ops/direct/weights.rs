//! The weight gradient of the direct convolution: per (sample, group of channel blocks), the
//! sweep of each source plane against the output gradient's rows, summed in sample order.

use std::ops::Range;

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::kernels::{grad_weight_plane, Kernel};
use super::{applies, block, block_count, Cast, Pass, Workspace};
use crate::model::ops::columns::Planes;
use crate::model::ops::geometry::ConvGeom;
use crate::model::ops::matmul::SharedOut;

/// `dw` from `x` and `dy` of a stride-1 convolution ([`applies`]) whose kernel is 1 to 3 wide,
/// on CPUs with AVX-512 (None otherwise: the column path computes it; at a stride the sweep
/// ran slower than the columns in a whole training step).
pub fn grad_weight(g: &ConvGeom, x: &[f32], dy: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if matches!(Kernel::detect(), Kernel::Avx512) && (1..=3).contains(&g.kernel[2]) && applies(g) {
        let pass = Pass::forward(g);
        let vi = g.input_voxels();
        let dw = pass.weight_items(pass.plane, |ws, n, blocks, mine| {
            let src = Planes::one(&x[n * g.cin * vi..][..g.cin * vi], vi);
            for z in 0..pass.dst[0] {
                ws.ring.load(&pass, z, g.cin, |i, s, slot| {
                    pass.fill_plane(src.channel(i), s, slot)
                });
                for (o0, co, out) in pass.weight_blocks(blocks.clone(), mine) {
                    pass.load_rows(&mut ws.rows, dy, n, o0..o0 + co, z);
                    // SAFETY: AVX-512 was detected; the ring holds this plane, rows co rows.
                    unsafe { grad_weight_plane(&pass, ws, co, out) };
                }
            }
        });
        return Some(dw);
    }
    let _ = (g, x, dy);
    None
}

impl Pass {
    /// The weight gradient: `body(workspace, n, blocks, gradient of those blocks' channels)`
    /// per item (sample, group of blocks). One gradient per sample, summed in sample order at
    /// the end, so the result does not depend on how items fall on workers.
    pub(super) fn weight_items<T: Copy + Default + Send>(
        &self,
        slot: usize,
        body: impl Fn(&mut Workspace<T>, usize, Range<usize>, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let per_channel = self.src_ch * self.taps();
        let len = self.dst_ch * per_channel;
        let mut parts = vec![0f32; self.batch * len];
        let shared = SharedOut(parts.as_mut_ptr());
        let blocks = block_count(self.dst_ch);
        // Each item pads its sample's whole input once: few items, one per worker at least.
        let groups = rayon::current_num_threads()
            .div_ceil(self.batch)
            .min(blocks);
        (0..self.batch * groups).into_par_iter().for_each_init(
            || Workspace::new(self, slot),
            |ws, item| {
                let (n, group) = (item / groups, item % groups);
                let (b0, b1) = (group * blocks / groups, (group + 1) * blocks / groups);
                let (o0, o1) = (block(self.dst_ch, b0).0, block(self.dst_ch, b1).0);
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

    /// The blocks `blocks` of an item's gradient `mine` (which starts at the first block):
    /// (first channel, width, that block's part).
    pub(super) fn weight_blocks<'m>(
        &self,
        blocks: Range<usize>,
        mine: &'m mut [f32],
    ) -> Vec<(usize, usize, &'m mut [f32])> {
        let per_channel = self.src_ch * self.taps();
        let mut rest = mine;
        let mut parts = Vec::with_capacity(blocks.len());
        for k in blocks {
            let (o0, co) = block(self.dst_ch, k);
            let (part, tail) = rest.split_at_mut(co * per_channel);
            parts.push((o0, co, part));
            rest = tail;
        }
        parts
    }

    /// `dy`'s planes `z` of sample `n`, channels `chans`, into `rows` in padded-row order
    /// (`q_pad` apart), zero in the thrown-away columns and past the last row (so those
    /// positions add nothing).
    pub(super) fn load_rows<S: Cast<T>, T: Copy + Default>(
        &self,
        rows: &mut [T],
        dy: &[S],
        n: usize,
        chans: Range<usize>,
        z: usize,
    ) {
        let [dd, dh, dw] = self.dst;
        for (k, o) in chans.enumerate() {
            let dst = &mut rows[k * self.q_pad..][..self.q_pad];
            dst.fill(T::default());
            let plane = &dy[((n * self.dst_ch + o) * dd + z) * dh * dw..][..dh * dw];
            for (r, src) in plane.chunks_exact(dw).enumerate() {
                S::cast_row(src, &mut dst[r * self.wp..][..dw]);
            }
        }
    }
}
