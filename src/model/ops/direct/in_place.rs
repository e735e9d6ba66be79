//! Passes written over their own input, for inference: an output plane replaces its source
//! plane once no worker reads that plane any more, so a convolution with as many outputs as
//! inputs needs no second tensor.

use rayon::prelude::*;

use super::kernels::Engine;
use super::{applies, block, block_count, Pass, Workspace};
use crate::model::ops::geometry::ConvGeom;
use crate::model::ops::matmul::SharedOut;

/// `y = conv3d(x, w)` written over `x` (N, C, D, H, W) itself, for a convolution of
/// [`applies`] with as many outputs as inputs and its output the input's size: each plane is
/// overwritten once no worker reads it any more, so the pass needs no second tensor.
///
/// # Safety
/// `x` points at the convolution's input, which nothing else reads or writes during the call.
pub unsafe fn forward_in_place(g: &ConvGeom, x: *mut f32, w: &[f32]) {
    let pass = Pass::forward(g);
    assert!(
        pass.dst == pass.src && g.cin == g.cout && applies(g),
        "{g:?}"
    );
    let plane = g.input[1] * g.input[2];
    let (vi, src) = (g.input_voxels(), SharedOut(x));
    let fill = |n: usize, i: usize, s: Option<usize>, slot: &mut [f32]| {
        let Some(s) = s else {
            return slot.fill(0.0);
        };
        // SAFETY: the ring loads plane s before any item overwrites it (run_in_place).
        let data =
            unsafe { std::slice::from_raw_parts(src.at((n * g.cin + i) * vi + s * plane), plane) };
        pass.fill_plane(data, Some(0), slot)
    };
    pass.forward_over(g, w, fill, src)
}

impl Pass {
    /// [`Self::run_filled`] written over its source: `dst` holds `dst_ch` channels per sample
    /// in the destination's shape, which `fill` reads. Items split depth only, one per worker
    /// a sample. An item writes a plane once its ring holds every source plane that plane
    /// reaches, except at its edges: the planes its neighbours still read (the first
    /// `kd - 1 - pd`, the last `pd`) are kept aside and written when every item is done.
    ///
    /// # Safety
    /// `dst` points at `batch * dst_ch * D*H*W` floats that nothing but this pass (and `fill`,
    /// reading the planes the ring loads) touches during the call; the pass is stride 1 with
    /// the destination's size equal to the source's.
    pub(super) unsafe fn run_in_place<E: Engine>(
        &self,
        engine: &E,
        fill: impl Fn(usize, usize, Option<usize>, &mut [E::Elem]) + Sync,
        dst: SharedOut,
    ) {
        let [dd, dh, dw] = self.dst;
        let plane = dh * dw;
        let parts = rayon::current_num_threads().clamp(1, dd);
        let (below, above) = (self.kernel[0] - 1 - self.pad[0], self.pad[0]);
        let units = engine.units(self);
        let width = engine.width(self);
        let blocks = block_count(self.dst_ch, width);
        let aside: Vec<Vec<(usize, usize, Vec<f32>)>> = (0..self.batch * parts)
            .into_par_iter()
            .map_init(
                || Workspace::new(self, engine.slot(self)),
                |ws, item| {
                    let (n, k) = (item / parts, item % parts);
                    let (z0, z1) = (k * dd / parts, (k + 1) * dd / parts);
                    let mut kept = Vec::new();
                    ws.ring.reset();
                    for z in z0..z1 {
                        let edge = (k > 0 && z < z0 + below) || (k + 1 < parts && z + above >= z1);
                        let mut held = vec![0f32; if edge { self.dst_ch * plane } else { 0 }];
                        ws.ring
                            .load(self, z, units, |u, s, slot| fill(n, u, s, slot));
                        for (o0, co) in (0..blocks).map(|b| block(self.dst_ch, width, b)) {
                            engine.block(self, ws, o0, co);
                            let first = ((n * self.dst_ch + o0) * dd + z) * plane;
                            self.store(&ws.out, n, o0..o0 + co, z, |at, row| {
                                if edge {
                                    // Channel o0 + j's plane z sits j * dd planes on.
                                    let (j, r) =
                                        ((at - first) / (dd * plane), (at - first) % (dd * plane));
                                    held[(o0 + j) * plane + r..][..row.len()].copy_from_slice(row);
                                } else {
                                    // SAFETY: the ring holds every source plane this item
                                    // still reads at or below z; no other item reads plane z.
                                    unsafe {
                                        std::ptr::copy_nonoverlapping(
                                            row.as_ptr(),
                                            dst.at(at),
                                            row.len(),
                                        )
                                    }
                                }
                            });
                        }
                        if edge {
                            kept.push((n, z, held));
                        }
                    }
                    kept
                },
            )
            .collect();
        for (n, z, held) in aside.into_iter().flatten() {
            for (o, values) in held.chunks_exact(plane).enumerate() {
                let at = ((n * self.dst_ch + o) * dd + z) * plane;
                // SAFETY: every item is done; the plane lies inside `dst`.
                unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), dst.at(at), plane) };
            }
        }
    }
}
