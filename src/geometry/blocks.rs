//! Boxes of a voxel grid and reading voxels a run at a time: the units every stage streams.

use crate::error::Result;

/// Where a resampler reads its input: a volume in C order (z, y, x) read a run at a time, so
/// the input need not be in memory ([`crate::nifti_io::VoxelSource`] reads a scratch file).
pub trait VoxelRead: Sync {
    /// Fill `out` with the voxels at C-order positions `start..start + out.len()`.
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()>;
}

impl VoxelRead for [f32] {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self[start..start + out.len()]);
        Ok(())
    }
}

/// A box of the output grid: start and size per axis (z, y, x).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// First output voxel of the box (z, y, x).
    pub start: [usize; 3],
    /// Voxels along each axis (z, y, x).
    pub size: [usize; 3],
}

impl Block {
    /// Voxels in the box.
    pub fn len(&self) -> usize {
        self.size.iter().product()
    }

    /// Whether the box has a side of zero voxels.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Split a grid of `shape` into blocks of `block` (edge blocks are cut to the grid), C order.
pub fn blocks(shape: [usize; 3], block: [usize; 3]) -> Vec<Block> {
    let counts = [0, 1, 2].map(|a| shape[a].div_ceil(block[a]));
    let mut out = Vec::with_capacity(counts.iter().product());
    for cz in 0..counts[0] {
        for cy in 0..counts[1] {
            for cx in 0..counts[2] {
                let idx = [cz, cy, cx];
                let start = [0, 1, 2].map(|a| idx[a] * block[a]);
                let size = [0, 1, 2].map(|a| block[a].min(shape[a] - start[a]));
                out.push(Block { start, size });
            }
        }
    }
    out
}
