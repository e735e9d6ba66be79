//! Low-resolution simulation: nearest neighbour down, linear back up, one axis at a time.

use super::scratch::{put_scratch, take_scratch};

/// Down to `round(n * zoom)` voxels per axis by nearest neighbour, then back up linearly
/// (half-voxel-centred, edges clamped), as nnU-Net's `SimulateLowResolutionTransform`.
#[inline(always)]
pub fn low_resolution(c: &mut [f32], size: [usize; 3], zoom: f64, in_plane: bool) {
    let small: [usize; 3] = std::array::from_fn(|a| {
        if in_plane && a == 0 {
            size[0]
        } else {
            ((size[a] as f64 * zoom).round() as usize).max(1)
        }
    });
    if small == size {
        return;
    }
    // Nearest source voxel of each small-grid voxel, per axis.
    let near: [Vec<usize>; 3] = std::array::from_fn(|a| {
        (0..small[a])
            .map(|j| {
                (((j as f64 + 0.5) * size[a] as f64 / small[a] as f64) as usize).min(size[a] - 1)
            })
            .collect()
    });
    // Linear weights of output voxel j on the small grid, per axis.
    let taps = |a: usize| -> Vec<(usize, usize, f32)> {
        (0..size[a])
            .map(|j| {
                let s = ((j as f64 + 0.5) * small[a] as f64 / size[a] as f64 - 0.5)
                    .clamp(0.0, (small[a] - 1) as f64);
                let i0 = s.floor() as usize;
                let i1 = (i0 + 1).min(small[a] - 1);
                (i0, i1, (s - i0 as f64) as f32)
            })
            .collect()
    };
    let (tz, ty) = (taps(0), taps(1));
    // x's taps straight into the full-resolution row: the small grid's voxel i of a row is
    // the row's voxel `near[2][i]`, so the small grid needs no pass of its own (a gather a
    // voxel: a quarter of this transform).
    let tx: Vec<(usize, usize, f32)> = taps(2)
        .into_iter()
        .map(|(i0, i1, f)| (near[2][i0], near[2][i1], f))
        .collect();
    let lerp = |a: f32, b: f32, f: f32| a + (b - a) * f;
    let plane = size[1] * size[2];
    let n_x = small[0] * small[1] * size[2];
    let n_y = small[0] * plane;
    let mut buf = take_scratch(n_x + n_y);
    {
        let (up_x, rest) = buf.split_at_mut(n_x);
        let up_y = &mut rest[..n_y];
        // Back up one axis at a time, x then y then z: the same lerps in the same order as
        // the trilinear formula (so the same values), each pass over whole rows or planes.
        let mut rows = up_x.chunks_exact_mut(size[2]);
        for &sz in &near[0] {
            for &sy in &near[1] {
                let row = &c[(sz * size[1] + sy) * size[2]..][..size[2]];
                let out = rows.next().expect("a row per small-grid row");
                for (o, &(i0, i1, f)) in out.iter_mut().zip(&tx) {
                    *o = lerp(row[i0], row[i1], f);
                }
            }
        }
        // With z kept (in-plane) every z weight is 0: the y pass's planes are the result,
        // written straight into `c` (a copy of the patch after it was a sixth of the time).
        let keep_z = small[0] == size[0];
        let y_out = if keep_z { &mut *c } else { &mut *up_y };
        for (src, dst) in up_x
            .chunks_exact(small[1] * size[2])
            .zip(y_out.chunks_exact_mut(plane))
        {
            for (out, &(i0, i1, f)) in dst.chunks_exact_mut(size[2]).zip(&ty) {
                let (a, b) = (
                    &src[i0 * size[2]..][..size[2]],
                    &src[i1 * size[2]..][..size[2]],
                );
                for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                    *o = lerp(a, b, f);
                }
            }
        }
        if !keep_z {
            for (out, &(i0, i1, f)) in c.chunks_exact_mut(plane).zip(&tz) {
                let (a, b) = (&up_y[i0 * plane..][..plane], &up_y[i1 * plane..][..plane]);
                for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                    *o = lerp(a, b, f);
                }
            }
        }
    }
    put_scratch(buf);
}
