//! The input gradient of a strided convolution as stride-1 passes, one per stride phase.
//!
//! Along an axis with stride `s`, padding `p` and kernel `k`, the input voxels `r + s * j` of
//! phase `r` are reached only by the taps `t = (r + p) % s + s * m`, and tap `m` reads the
//! output gradient at `j + (r + p) / s - m`: consecutive outputs for consecutive `j`. So the
//! phase's gradient is a stride-1 pass over `dy` with those taps, flipped, padded so that it
//! yields exactly the phase's voxels; its planes are then spread into `dx`. Every tap belongs
//! to one phase: the passes multiply as much as the forward pass, never by inserted zeros.

use rayon::prelude::*;

use super::{Output, Pass};
use crate::model::ops::geometry::ConvGeom;

/// `dx` of `g` from the result `part(phase)` of each phase's pass (batch, cin, phase voxels);
/// None where a phase would need negative padding.
pub(super) fn by_phases<O: Output>(
    g: &ConvGeom,
    part: impl Fn(&Phase) -> Vec<O>,
) -> Option<Vec<O>> {
    let phases = phases(g)?;
    let mut dx = vec![O::default(); g.batch * g.cin * g.input_voxels()];
    let mut rest = &phases[..];
    while let [phase, tail @ ..] = rest {
        // At a stride of 2 along x, phases come in pairs (even, then odd columns of the same
        // rows): written together, a row at a time, the stores vectorize and each line of
        // `dx` is written once. One phase at a time, every other value: a tenth of the pass.
        if let [odd, tail @ ..] = tail {
            if g.stride[2] == 2 && phase.r[2] == 0 && odd.r == [phase.r[0], phase.r[1], 1] {
                Phase::spread_pair(g, (phase, &part(phase)), (odd, &part(odd)), &mut dx);
                rest = tail;
                continue;
            }
        }
        phase.spread(g, &part(phase), &mut dx);
        rest = tail;
    }
    Some(dx)
}

/// One phase of one axis: the kernel taps its pass reads, in the pass's order, and its padding.
struct AxisPhase {
    taps: Vec<usize>,
    pad: [usize; 2],
}

/// Phase `r` of axis `a`: None where no tap or no voxel falls in it (its gradient is zero);
/// Err where the pass would need negative padding (a padding of at least the stride beyond
/// the last tap: the caller takes another path).
fn axis_phase(g: &ConvGeom, a: usize, r: usize) -> Result<Option<AxisPhase>, ()> {
    let (n_in, n_out) = (g.input[a], g.output[a]);
    let (k, p, s) = (g.kernel[a], g.padding[a], g.stride[a]);
    let voxels = match r < n_in {
        true => (n_in - r).div_ceil(s),
        false => 0,
    };
    let mut taps: Vec<usize> = ((r + p) % s..k).step_by(s).collect();
    if taps.is_empty() || voxels == 0 {
        return Ok(None);
    }
    taps.reverse();
    let (m, c) = (taps.len(), (r + p) / s);
    // Output j of the pass reads padded position j + u, that is dy at j + c - (m - 1) + u.
    let front = (m - 1).checked_sub(c).ok_or(())?;
    let back = (voxels + c).checked_sub(n_out).ok_or(())?;
    Ok(Some(AxisPhase {
        taps,
        pad: [front, back],
    }))
}

/// One stride phase's pass over the output gradient.
pub(super) struct Phase {
    /// The phase: its voxels are `r + stride * j` on each axis.
    r: [usize; 3],
    pub(super) pass: Pass,
    /// The convolution's tap index of each of the pass's taps.
    taps: Vec<usize>,
}

impl Phase {
    /// The convolution's weight for the pass's destination `o` (an input channel), source `i`
    /// (an output channel) and tap `t`.
    pub(super) fn weight<T: Copy>(&self, g: &ConvGeom, w: &[T], o: usize, i: usize, t: usize) -> T {
        w[(i * g.cin + o) * g.taps() + self.taps[t]]
    }

    /// Writes the pass's result `part` (batch, cin, phase voxels) into the phase's voxels of
    /// `dx` (batch, cin, input voxels).
    fn spread<O: Copy + Send + Sync>(&self, g: &ConvGeom, part: &[O], dx: &mut [O]) {
        let [_, h, w] = g.input;
        let [sd, sh, sw] = g.stride;
        let [jd, jh, jw] = self.pass.dst;
        let [rd, rh, rw] = self.r;
        let vp = jd * jh * jw;
        dx.par_chunks_mut(g.input_voxels())
            .zip(part.par_chunks(vp))
            .for_each(|(plane, src)| {
                for (z, slab) in src.chunks_exact(jh * jw).enumerate() {
                    for (y, row) in slab.chunks_exact(jw).enumerate() {
                        let at = ((rd + sd * z) * h + rh + sh * y) * w + rw;
                        for (x, &v) in row.iter().enumerate() {
                            plane[at + sw * x] = v;
                        }
                    }
                }
            });
    }
}

impl Phase {
    /// [`Phase::spread`] of the even (`a`) and odd (`b`) columns of the same rows at a stride
    /// of 2 along x, a row at a time.
    fn spread_pair<O: Copy + Send + Sync>(
        g: &ConvGeom,
        (even, a): (&Phase, &[O]),
        (odd, b): (&Phase, &[O]),
        dx: &mut [O],
    ) {
        let [_, h, w] = g.input;
        let [sd, sh, _] = g.stride;
        let [jd, jh, ja] = even.pass.dst;
        let jb = odd.pass.dst[2];
        let [rd, rh, _] = even.r;
        debug_assert!(ja == w.div_ceil(2) && jb == w / 2 && odd.pass.dst[..2] == [jd, jh]);
        dx.par_chunks_mut(g.input_voxels())
            .zip(a.par_chunks(jd * jh * ja).zip(b.par_chunks(jd * jh * jb)))
            .for_each(|(plane, (a, b))| {
                for z in 0..jd {
                    for y in 0..jh {
                        let at = ((rd + sd * z) * h + rh + sh * y) * w;
                        let row = &mut plane[at..at + w];
                        let (ra, rb) =
                            (&a[(z * jh + y) * ja..][..ja], &b[(z * jh + y) * jb..][..jb]);
                        for ((pair, &u), &v) in row.chunks_exact_mut(2).zip(ra).zip(rb) {
                            pair[0] = u;
                            pair[1] = v;
                        }
                        if ja > jb {
                            row[w - 1] = ra[jb];
                        }
                    }
                }
            });
    }
}

/// The passes of `g`'s input gradient, one per stride phase that some tap reaches (the other
/// voxels' gradient is zero); None where a phase would need negative padding.
fn phases(g: &ConvGeom) -> Option<Vec<Phase>> {
    let mut axes: [Vec<(usize, AxisPhase)>; 3] = Default::default();
    for (a, list) in axes.iter_mut().enumerate() {
        for r in 0..g.stride[a] {
            if let Some(phase) = axis_phase(g, a, r).ok()? {
                list.push((r, phase));
            }
        }
    }
    let [kh, kw] = [g.kernel[1], g.kernel[2]];
    let mut out = vec![];
    for (rd, d) in &axes[0] {
        for (rh, h) in &axes[1] {
            for (rw, w) in &axes[2] {
                let kernel = [d.taps.len(), h.taps.len(), w.taps.len()];
                let front = [d.pad[0], h.pad[0], w.pad[0]];
                let back = [d.pad[1], h.pad[1], w.pad[1]];
                let pass = Pass::padded(
                    g.batch,
                    [g.cout, g.cin],
                    g.output,
                    kernel,
                    [front, back],
                    [1; 3],
                );
                let taps = d
                    .taps
                    .iter()
                    .flat_map(|&td| {
                        h.taps.iter().flat_map(move |&th| {
                            w.taps.iter().map(move |&tw| (td * kh + th) * kw + tw)
                        })
                    })
                    .collect();
                out.push(Phase {
                    r: [*rd, *rh, *rw],
                    pass,
                    taps,
                });
            }
        }
    }
    Some(out)
}
