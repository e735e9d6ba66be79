//! Resampling kernels that fill one output block from the input volume.
//!
//! A block is any box of the output grid (a chunk, a shard, or the whole volume); the value of
//! an output voxel never depends on which block it was computed in, so chunk-by-chunk output is
//! bit-identical to a whole-volume resample. Arrays are C order with axes (z, y, x).
//! Coordinates follow [`crate::geometry::source_coordinate`]; samples outside [0, n-1] clamp to
//! the edge voxel.

use crate::error::Result;
use crate::geometry::{source_coordinate, Block, VoxelRead};

/// Per output index along one axis: the two input neighbours and the weight of the upper one.
#[derive(Clone, Debug)]
pub(crate) struct LinearAxis {
    pub(crate) lo: Vec<u32>,
    pub(crate) hi: Vec<u32>,
    pub(crate) w: Vec<f32>,
    /// Output grid equals input grid on this axis.
    pub(crate) identity: bool,
}

impl LinearAxis {
    pub(crate) fn new(n: usize, m: usize) -> Self {
        let mut lo = Vec::with_capacity(m);
        let mut hi = Vec::with_capacity(m);
        let mut w = Vec::with_capacity(m);
        let last = (n - 1) as f64;
        for j in 0..m {
            let x = source_coordinate(j, n, m).clamp(0.0, last);
            let i0 = x.floor();
            let i1 = (i0 + 1.0).min(last);
            lo.push(i0 as u32);
            hi.push(i1 as u32);
            w.push((x - i0) as f32);
        }
        LinearAxis {
            lo,
            hi,
            w,
            identity: n == m,
        }
    }

    /// Input index range [first, last] needed for output indices [start, end).
    fn input_range(&self, start: usize, end: usize) -> (usize, usize) {
        if self.identity {
            return (start, end - 1);
        }
        (self.lo[start] as usize, self.hi[end - 1] as usize)
    }
}

/// Nearest input index per output index; ties go to the lower index.
pub(crate) fn nearest_axis(n: usize, m: usize) -> Vec<u32> {
    let last = (n - 1) as f64;
    (0..m)
        .map(|j| {
            let x = source_coordinate(j, n, m).clamp(0.0, last);
            (x - 0.5).ceil().max(0.0) as u32
        })
        .collect()
}

/// Linear interpolation of the whole grid, prepared once per volume.
pub struct LinearResampler {
    in_shape: [usize; 3],
    axes: [LinearAxis; 3],
}

#[inline]
fn lerp(a: f32, b: f32, w: f32) -> f32 {
    // a + (b - a) * w keeps constants exact (a == b gives a).
    a + (b - a) * w
}

impl LinearResampler {
    /// `in_shape` and `out_shape` are (z, y, x).
    pub fn new(in_shape: [usize; 3], out_shape: [usize; 3]) -> Self {
        let axes = [0, 1, 2].map(|a| LinearAxis::new(in_shape[a], out_shape[a]));
        LinearResampler { in_shape, axes }
    }

    /// Fill `out` (len = block.len(), C order over block.size) from `input` (C order over
    /// in_shape, whole in memory).
    pub fn fill(&self, input: &[f32], block: Block, out: &mut [f32]) {
        debug_assert_eq!(input.len(), self.in_shape.iter().product::<usize>());
        // Reading a slice of the right length cannot fail.
        let _ = self.fill_from(input, block, out);
    }

    /// Fill `out` (len = block.len(), C order over block.size) from `input`, reading only the
    /// input rows the block needs. Separable: x pass, then y, then z.
    pub fn fill_from(
        &self,
        input: &(impl VoxelRead + ?Sized),
        block: Block,
        out: &mut [f32],
    ) -> Result<()> {
        let [_, ny, nx] = self.in_shape;
        debug_assert_eq!(out.len(), block.len());
        let [az, ay, ax] = &self.axes;
        let [bz, by, bx] = block.size;
        let [sz, sy, sx] = block.start;
        let (z0, z1) = az.input_range(sz, sz + bz);
        let (y0, y1) = ay.input_range(sy, sy + by);
        let (x0, x1) = ax.input_range(sx, sx + bx);
        let (rz, ry, rx) = (z1 - z0 + 1, y1 - y0 + 1, x1 - x0 + 1);

        let (xlo, xhi, xw) = (&ax.lo[sx..sx + bx], &ax.hi[sx..sx + bx], &ax.w[sx..sx + bx]);
        // An axis whose output grid equals its input grid (m == n) is a plain copy: every
        // weight is 0 there, and a copy is what interpolation at the sample points gives.
        // Pass 1: along x, for every needed (z, y) input row, read from x0 to x1 only.
        let mut t1 = vec![0.0f32; rz * ry * bx];
        let mut row = vec![0.0f32; rx];
        for iz in 0..rz {
            for iy in 0..ry {
                input.read(((z0 + iz) * ny + (y0 + iy)) * nx + x0, &mut row)?;
                let dst = &mut t1[(iz * ry + iy) * bx..][..bx];
                if ax.identity {
                    dst.copy_from_slice(&row[sx - x0..sx - x0 + bx]);
                    continue;
                }
                for j in 0..bx {
                    let (lo, hi) = (xlo[j] as usize - x0, xhi[j] as usize - x0);
                    dst[j] = lerp(row[lo], row[hi], xw[j]);
                }
            }
        }
        // Pass 2: along y.
        let t2 = if ay.identity {
            t1
        } else {
            let mut t2 = vec![0.0f32; rz * by * bx];
            for iz in 0..rz {
                for j in 0..by {
                    let (lo, hi, w) = (
                        ay.lo[sy + j] as usize - y0,
                        ay.hi[sy + j] as usize - y0,
                        ay.w[sy + j],
                    );
                    let a = &t1[(iz * ry + lo) * bx..][..bx];
                    let b = &t1[(iz * ry + hi) * bx..][..bx];
                    let dst = &mut t2[(iz * by + j) * bx..][..bx];
                    for k in 0..bx {
                        dst[k] = lerp(a[k], b[k], w);
                    }
                }
            }
            t2
        };
        // Pass 3: along z, straight into the output.
        let plane = by * bx;
        if az.identity {
            out.copy_from_slice(&t2[..bz * plane]);
            return Ok(());
        }
        for j in 0..bz {
            let (lo, hi, w) = (
                az.lo[sz + j] as usize - z0,
                az.hi[sz + j] as usize - z0,
                az.w[sz + j],
            );
            let a = &t2[lo * plane..][..plane];
            let b = &t2[hi * plane..][..plane];
            let dst = &mut out[j * plane..][..plane];
            for k in 0..plane {
                dst[k] = lerp(a[k], b[k], w);
            }
        }
        Ok(())
    }
}

/// Nearest-neighbour lookup of the whole grid, prepared once per volume (labels).
pub struct NearestResampler {
    in_shape: [usize; 3],
    out_nx: usize,
    axes: [Vec<u32>; 3],
}

impl NearestResampler {
    /// `in_shape` and `out_shape` are (z, y, x).
    pub fn new(in_shape: [usize; 3], out_shape: [usize; 3]) -> Self {
        let axes = [0, 1, 2].map(|a| nearest_axis(in_shape[a], out_shape[a]));
        NearestResampler {
            in_shape,
            out_nx: out_shape[2],
            axes,
        }
    }

    /// Fill `out` (len = block.len(), C order over block.size) from `input` (C order over
    /// in_shape, whole in memory) with the nearest input voxel; any element type.
    pub fn fill<T: Copy>(&self, input: &[T], block: Block, out: &mut [T]) {
        let [_, ny, nx] = self.in_shape;
        self.each_row(block, out, |iz, iy, xs, dst| {
            let row = &input[(iz * ny + iy) * nx..][..nx];
            match xs {
                None => dst.copy_from_slice(&row[block.start[2]..][..dst.len()]),
                Some(xs) => dst
                    .iter_mut()
                    .zip(xs)
                    .for_each(|(d, &ix)| *d = row[ix as usize]),
            }
        });
    }

    /// Like [`Self::fill`], reading from `input` only the part of each needed row that the
    /// block's x range uses (labels arrive as f32 and are narrowed by the caller).
    pub fn fill_from(
        &self,
        input: &(impl VoxelRead + ?Sized),
        block: Block,
        out: &mut [f32],
    ) -> Result<()> {
        let [_, ny, nx] = self.in_shape;
        let bx = block.size[2];
        let xs = &self.axes[2][block.start[2]..block.start[2] + bx];
        let (x0, x1) = if bx == 0 {
            (0, 0)
        } else {
            (xs[0] as usize, xs[bx - 1] as usize)
        };
        let mut row = vec![0.0f32; x1 - x0 + 1];
        let mut result = Ok(());
        self.each_row(block, out, |iz, iy, xs, dst| {
            if result.is_err() {
                return;
            }
            result = input.read((iz * ny + iy) * nx + x0, &mut row);
            match xs {
                None => dst.copy_from_slice(&row[block.start[2] - x0..][..dst.len()]),
                Some(xs) => dst
                    .iter_mut()
                    .zip(xs)
                    .for_each(|(d, &ix)| *d = row[ix as usize - x0]),
            }
        });
        result
    }

    /// Call `f(iz, iy, xs, dst)` for every output row of the block: the input row (iz, iy) it
    /// comes from, the input x of each output x (`None`: the x grid is the input's), and the
    /// output row to fill.
    fn each_row<T>(
        &self,
        block: Block,
        out: &mut [T],
        mut f: impl FnMut(usize, usize, Option<&[u32]>, &mut [T]),
    ) {
        let [bz, by, bx] = block.size;
        let [sz, sy, sx] = block.start;
        let xs = &self.axes[2][sx..sx + bx];
        let x_identity = self.in_shape[2] == self.out_nx;
        if bx == 0 {
            return;
        }
        for (jz, out_plane) in out.chunks_exact_mut(by * bx).enumerate().take(bz) {
            let iz = self.axes[0][sz + jz] as usize;
            for (jy, dst) in out_plane.chunks_exact_mut(bx).enumerate() {
                let iy = self.axes[1][sy + jy] as usize;
                f(iz, iy, (!x_identity).then_some(xs), dst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::blocks;

    #[test]
    fn identity_grid_is_exact() {
        let shape = [3, 4, 5];
        let input: Vec<f32> = (0..60).map(|v| v as f32 * 1.7 - 3.0).collect();
        let r = LinearResampler::new(shape, shape);
        let mut out = vec![0.0; 60];
        r.fill(
            &input,
            Block {
                start: [0; 3],
                size: shape,
            },
            &mut out,
        );
        assert_eq!(out, input);
        let n = NearestResampler::new(shape, shape);
        let mut out2 = vec![0.0; 60];
        n.fill(
            &input,
            Block {
                start: [0; 3],
                size: shape,
            },
            &mut out2,
        );
        assert_eq!(out2, input);
    }

    #[test]
    fn nearest_ties_go_low() {
        // n=2 -> m=4: x = -0.25, 0.25, 0.75, 1.25 -> 0, 0, 1, 1
        assert_eq!(nearest_axis(2, 4), vec![0, 0, 1, 1]);
        // n=4 -> m=2: x = 0.5, 2.5: ties -> 0, 2
        assert_eq!(nearest_axis(4, 2), vec![0, 2]);
    }

    #[test]
    fn blocks_cover_the_grid_once() {
        let shape = [5, 7, 9];
        let bs = blocks(shape, [2, 3, 4]);
        let total: usize = bs.iter().map(|b| b.len()).sum();
        assert_eq!(total, 5 * 7 * 9);
        assert_eq!(bs.len(), 3 * 3 * 3);
    }
}
