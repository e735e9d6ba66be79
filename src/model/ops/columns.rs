//! Blocks of a convolution's "column" matrix: one row per (source channel, kernel tap), one
//! column per grid voxel. Only a block of whole grid rows is ever built, so the workspace stays
//! bounded whatever the volume (a full im2col of a 32-channel 2x32x64x64 input is 0.9 GB): at
//! most one block of 256 Ki floats or one grid row per worker ([`super::blocks::BlockPlan`]).

use super::geometry::{AxisMap, ConvGeom};

/// One sample's source channels: the planes of one tensor, or of two side by side (a
/// decoder's upsampled tensor and its skip connection, whose concatenation is never built).
#[derive(Clone, Copy)]
pub struct Planes<'a> {
    first: &'a [f32],
    /// Channels of `first`; those after it are `second`'s.
    first_channels: usize,
    second: &'a [f32],
    /// Voxels of one channel.
    volume: usize,
}

impl<'a> Planes<'a> {
    /// The channels of `src` (channels x `volume`).
    pub fn one(src: &'a [f32], volume: usize) -> Self {
        Self {
            first: src,
            first_channels: src.len() / volume.max(1),
            second: &[],
            volume,
        }
    }

    /// The channels of `first`, then those of `second` (each channels x `volume`).
    pub fn two(first: &'a [f32], second: &'a [f32], volume: usize) -> Self {
        Self {
            second,
            ..Self::one(first, volume)
        }
    }

    /// Channel `c`'s plane.
    pub(super) fn channel(&self, c: usize) -> &'a [f32] {
        let (src, c) = match c.checked_sub(self.first_channels) {
            Some(k) => (self.second, k),
            None => (self.first, c),
        };
        &src[c * self.volume..(c + 1) * self.volume]
    }
}

/// How to build column blocks from one sample of a source volume.
pub struct ColumnGather {
    /// Source channels (rows are `channels * taps`).
    channels: usize,
    /// Source volume size (D, H, W).
    src: [usize; 3],
    /// Index maps of the grid axes (D, H, W) onto the source.
    maps: [AxisMap; 3],
}

impl ColumnGather {
    /// Columns of the forward pass: grid = output voxels, source = input `x`.
    pub fn forward(g: &ConvGeom) -> Self {
        Self {
            channels: g.cin,
            src: g.input,
            maps: [0, 1, 2].map(|a| AxisMap::forward(g, a)),
        }
    }

    /// Columns of the input gradient for one stride phase: grid = input voxels
    /// `r + j * stride`, source = output gradient. Also returns the kernel taps kept per axis.
    pub fn grad_input_phase(g: &ConvGeom, r: [usize; 3]) -> Option<(Self, [Vec<usize>; 3])> {
        let [d, h, w] = [0, 1, 2].map(|a| AxisMap::grad_input_phase(g, a, r[a]));
        let ((md, td), (mh, th), (mw, tw)) = (d?, h?, w?);
        let gather = Self {
            channels: g.cout,
            src: g.output,
            maps: [md, mh, mw],
        };
        Some((gather, [td, th, tw]))
    }

    fn taps(&self) -> [usize; 3] {
        [0, 1, 2].map(|a| self.maps[a].runs.len())
    }

    /// Rows of the column matrix, ordered (channel, td, th, tw) like a PyTorch weight.
    pub fn rows(&self) -> usize {
        self.channels * self.taps().iter().product::<usize>()
    }

    /// Grid rows (one per (d, h) position) and their length (W).
    pub fn grid_rows(&self) -> (usize, usize) {
        (self.maps[0].grid * self.maps[1].grid, self.maps[2].grid)
    }

    /// Length of the grid's depth axis.
    pub fn grid_rows_d(&self) -> usize {
        self.maps[0].grid
    }

    /// Fills `col` (rows() x ((r1 - r0) * row_len), row-major) with grid rows `r0..r1` read from
    /// `src`, one sample's channels (each D x H x W).
    pub fn fill(&self, src: Planes<'_>, r0: usize, r1: usize, col: &mut [f32]) {
        let [td_n, th_n, tw_n] = self.taps();
        let [_, sh_n, sw_n] = self.src;
        let grid_h = self.maps[1].grid;
        let row_len = self.maps[2].grid;
        let cols = (r1 - r0) * row_len;
        let mut rows = col[..self.rows() * cols].chunks_exact_mut(cols);
        for c in 0..self.channels {
            let channel = src.channel(c);
            for td in 0..td_n {
                for th in 0..th_n {
                    for tw in 0..tw_n {
                        let Some(dst_row) = rows.next() else { return };
                        let run = &self.maps[2].runs[tw];
                        for (r, dst) in (r0..r1).zip(dst_row.chunks_exact_mut(row_len)) {
                            let (qd, qh) = (r / grid_h, r % grid_h);
                            match (self.maps[0].source(td, qd), self.maps[1].source(th, qh)) {
                                (Some(sd), Some(sh)) => {
                                    let start = (sd * sh_n + sh) * sw_n;
                                    run.copy_row(&channel[start..start + sw_n], dst);
                                }
                                _ => dst.fill(0.0),
                            }
                        }
                    }
                }
            }
        }
    }
}
