//! Shapes of one 3D convolution, validated once, and the per-axis index maps that say which
//! source voxel each kernel tap reads. The forward pass, both gradients and the transposed
//! convolution are all "gather then matrix product" over these maps.

use candle_core::{bail, Result};

/// What a CPU convolution on f32 tensors multiplies in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Products {
    /// f32 products and sums.
    #[default]
    F32,
    /// Operands rounded to bf16, products and sums in f32 (oneDNN's "bf16 fpmath" mode),
    /// where the CPU has AVX512-BF16 and the direct kernels apply (also at a stride, in
    /// training too); f32 elsewhere.
    Bf16,
}

/// Everything needed to index one 3D convolution `y = conv3d(x, w)`, with `x` (N, Cin, D, H, W)
/// and `w` (Cout, Cin, kd, kh, kw).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeom {
    /// Samples.
    pub batch: usize,
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Input size (z, y, x).
    pub input: [usize; 3],
    /// Kernel size (z, y, x).
    pub kernel: [usize; 3],
    /// Zero padding on each side (z, y, x).
    pub padding: [usize; 3],
    /// Stride (z, y, x).
    pub stride: [usize; 3],
    /// Output size (z, y, x).
    pub output: [usize; 3],
    /// What the CPU passes multiply in (f32 tensors).
    pub products: Products,
}

impl ConvGeom {
    /// Checks the shapes of `x` and `w` against each other and derives the output size.
    pub fn new(
        x_dims: &[usize],
        w_dims: &[usize],
        padding: [usize; 3],
        stride: [usize; 3],
    ) -> Result<Self> {
        let (&[batch, cin, d, h, w], &[cout, wcin, kd, kh, kw]) = (x_dims, w_dims) else {
            bail!("conv3d: expected x (N, C, D, H, W) and w (Cout, Cin, kd, kh, kw), got {x_dims:?} and {w_dims:?}")
        };
        if cin != wcin {
            bail!("conv3d: x has {cin} channels but w expects {wcin}");
        }
        let (input, kernel) = ([d, h, w], [kd, kh, kw]);
        let mut output = [0; 3];
        for a in 0..3 {
            if stride[a] == 0 || kernel[a] == 0 {
                bail!("conv3d: stride {stride:?} and kernel {kernel:?} must be positive");
            }
            let padded = input[a] + 2 * padding[a];
            if padded < kernel[a] {
                bail!("conv3d: kernel {kernel:?} larger than padded input {input:?} + 2 * {padding:?}");
            }
            output[a] = (padded - kernel[a]) / stride[a] + 1;
        }
        if [batch, cin, cout].contains(&0) || input.contains(&0) {
            bail!("conv3d: empty tensor x {x_dims:?} / w {w_dims:?}");
        }
        Ok(Self {
            batch,
            cin,
            cout,
            input,
            kernel,
            padding,
            stride,
            output,
            products: Products::F32,
        })
    }

    /// Kernel taps (voxels of the kernel).
    #[inline]
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// Voxels of one input channel.
    #[inline]
    pub fn input_voxels(&self) -> usize {
        self.input.iter().product()
    }

    /// Voxels of one output channel.
    #[inline]
    pub fn output_voxels(&self) -> usize {
        self.output.iter().product()
    }

    /// Input tensor dims (n, cin, z, y, x).
    pub fn x_dims(&self) -> [usize; 5] {
        let [d, h, w] = self.input;
        [self.batch, self.cin, d, h, w]
    }

    /// Output tensor dims (n, cout, z, y, x).
    pub fn y_dims(&self) -> [usize; 5] {
        let [d, h, w] = self.output;
        [self.batch, self.cout, d, h, w]
    }

    /// Weight tensor dims (cout, cin, kz, ky, kx).
    pub fn w_dims(&self) -> [usize; 5] {
        let [kd, kh, kw] = self.kernel;
        [self.cout, self.cin, kd, kh, kw]
    }

    /// True when kernel == stride and no padding: every input voxel is read by exactly one
    /// (output voxel, tap) pair, the case of the transposed convolution on the up path.
    pub fn is_non_overlapping(&self) -> bool {
        self.kernel == self.stride && self.padding == [0; 3]
    }
}

/// For one tap of one axis: grid positions `q0 + j * qstep` read source index `s0 + j * sstep`
/// for `j < count`; every other grid position reads zero padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapRun {
    /// First grid position.
    pub q0: usize,
    /// Step between grid positions.
    pub qstep: usize,
    /// First source index.
    pub s0: usize,
    /// Step between source indices.
    pub sstep: usize,
    /// Positions in the run.
    pub count: usize,
}

impl TapRun {
    /// The output positions `o` for which tap `t` lands inside the input: 0 <= o*s + t - p < len.
    fn valid_outputs(input: usize, output: usize, t: usize, p: usize, s: usize) -> (usize, usize) {
        let lo = if t >= p { 0 } else { (p - t).div_ceil(s) }.min(output);
        let hi = if input + p > t {
            ((input - 1 + p - t) / s + 1).min(output)
        } else {
            0
        };
        (lo, hi.max(lo))
    }

    /// Forward pass: the grid is the output, the source the input (`o -> o*s + t - p`).
    fn forward(input: usize, output: usize, t: usize, p: usize, s: usize) -> Self {
        let (lo, hi) = Self::valid_outputs(input, output, t, p, s);
        Self {
            q0: lo,
            qstep: 1,
            s0: (lo * s + t).saturating_sub(p),
            sstep: s,
            count: hi - lo,
        }
    }

    /// Writes one grid row: `dst[q] = src[map(q)]`, zero where the tap falls into padding.
    #[inline]
    pub fn copy_row(&self, src: &[f32], dst: &mut [f32]) {
        if self.count == 0 {
            dst.fill(0.0);
        } else if self.qstep == 1 {
            let end = self.q0 + self.count;
            dst[..self.q0].fill(0.0);
            dst[end..].fill(0.0);
            let run = &mut dst[self.q0..end];
            if self.sstep == 1 {
                run.copy_from_slice(&src[self.s0..self.s0 + self.count]);
            } else {
                for (j, v) in run.iter_mut().enumerate() {
                    *v = src[self.s0 + j * self.sstep];
                }
            }
        } else {
            dst.fill(0.0);
            for j in 0..self.count {
                dst[self.q0 + j * self.qstep] = src[self.s0 + j * self.sstep];
            }
        }
    }
}

/// The index maps of one axis for all its taps, plus a lookup table `table[t * grid + q]`
/// (source index, or -1 for padding) for the two outer axes where a row is the unit of work.
#[derive(Clone, Debug)]
pub struct AxisMap {
    /// Grid positions along the axis.
    pub grid: usize,
    /// One run per tap.
    pub runs: Vec<TapRun>,
    /// `table[t * grid + q]`: source index of tap `t` at position `q`, -1 for padding.
    pub table: Vec<i64>,
}

impl AxisMap {
    fn from_runs(grid: usize, runs: Vec<TapRun>) -> Self {
        let mut table = vec![-1i64; grid * runs.len()];
        for (t, r) in runs.iter().enumerate() {
            for j in 0..r.count {
                table[t * grid + r.q0 + j * r.qstep] = (r.s0 + j * r.sstep) as i64;
            }
        }
        Self { grid, runs, table }
    }

    /// The maps of a forward convolution along `axis`.
    pub fn forward(g: &ConvGeom, axis: usize) -> Self {
        let (i, o, p, s) = (
            g.input[axis],
            g.output[axis],
            g.padding[axis],
            g.stride[axis],
        );
        let runs = (0..g.kernel[axis])
            .map(|t| TapRun::forward(i, o, t, p, s))
            .collect();
        Self::from_runs(o, runs)
    }

    /// Input gradient, one phase `r` of the stride: the grid is the input positions
    /// `z = r + j * s`, and only the taps `t` with `z + p - t` divisible by `s` reach an output
    /// (`o = j + (r + p - t) / s`), so each phase is a stride-1 correlation with fewer taps.
    /// Returns the map over `j` and the original indices of the taps kept; None when the phase
    /// is empty or no tap reaches it (its input gradient is zero).
    pub fn grad_input_phase(g: &ConvGeom, axis: usize, r: usize) -> Option<(Self, Vec<usize>)> {
        let (i, o, p, s) = (
            g.input[axis],
            g.output[axis],
            g.padding[axis],
            g.stride[axis],
        );
        let grid = if r < i { (i - r).div_ceil(s) } else { 0 };
        let (mut runs, mut taps) = (vec![], vec![]);
        for t in 0..g.kernel[axis] {
            let shift = r as i64 + p as i64 - t as i64;
            if grid == 0 || shift.rem_euclid(s as i64) != 0 {
                continue;
            }
            let c = shift.div_euclid(s as i64);
            let lo = (-c).clamp(0, grid as i64);
            let hi = (o as i64 - c).clamp(lo, grid as i64);
            runs.push(TapRun {
                q0: lo as usize,
                qstep: 1,
                s0: (lo + c).max(0) as usize,
                sstep: 1,
                count: (hi - lo) as usize,
            });
            taps.push(t);
        }
        (!taps.is_empty()).then(|| (Self::from_runs(grid, runs), taps))
    }

    /// Source index of grid position `q` for tap `t`, None in the padding.
    #[inline]
    pub fn source(&self, t: usize, q: usize) -> Option<usize> {
        usize::try_from(self.table[t * self.grid + q]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(input: usize, k: usize, p: usize, s: usize) -> ConvGeom {
        ConvGeom::new(&[1, 1, input, 1, 1], &[1, 1, k, 1, 1], [p, 0, 0], [s, 1, 1]).unwrap()
    }

    /// The table must agree with the definition `src = o*s + t - p` inside the input.
    #[test]
    fn forward_and_inverse_maps_match_definition() {
        for (input, k, p, s) in [
            (7, 3, 1, 1),
            (7, 3, 1, 2),
            (8, 3, 0, 2),
            (5, 1, 0, 1),
            (6, 2, 0, 2),
            (4, 5, 2, 3),
            (9, 1, 0, 2),
            (9, 3, 2, 3),
        ] {
            let g = geom(input, k, p, s);
            let fwd = AxisMap::forward(&g, 0);
            // Every (tap, input, output) triple inside the input, from the definition.
            let mut pairs = vec![];
            for t in 0..k {
                for o in 0..g.output[0] {
                    let z = (o * s + t) as i64 - p as i64;
                    let expect = (0..input as i64).contains(&z).then_some(z as usize);
                    assert_eq!(fwd.source(t, o), expect, "{input} {k} {p} {s} t={t} o={o}");
                    if let Some(z) = expect {
                        pairs.push((t, z, o));
                    }
                }
            }
            // The stride phases of the inverse map must list exactly the same triples.
            let mut inverse = vec![];
            for r in 0..s {
                let Some((map, taps)) = AxisMap::grad_input_phase(&g, 0, r) else {
                    continue;
                };
                for (i, &t) in taps.iter().enumerate() {
                    for j in 0..map.grid {
                        if let Some(o) = map.source(i, j) {
                            inverse.push((t, r + j * s, o));
                        }
                    }
                }
            }
            inverse.sort();
            assert_eq!(inverse, pairs, "{input} {k} {p} {s}");
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(ConvGeom::new(&[1, 2, 4, 4, 4], &[1, 3, 3, 3, 3], [1; 3], [1; 3]).is_err());
        assert!(ConvGeom::new(&[1, 2, 4, 4], &[1, 2, 3, 3, 3], [1; 3], [1; 3]).is_err());
        assert!(ConvGeom::new(&[1, 2, 1, 4, 4], &[1, 2, 3, 3, 3], [0; 3], [1; 3]).is_err());
        assert!(ConvGeom::new(&[1, 2, 4, 4, 4], &[1, 2, 3, 3, 3], [1; 3], [0, 1, 1]).is_err());
    }
}
