//! The skeleton array, chunk by chunk: each write block's label plus a halo of label around
//! it is thinned ([`crate::prep::derived::thinning`]) and the block's part kept. Thinning peels a structure
//! one layer a round from every side, and where the halo cuts a structure it peels the cut too,
//! about as deep as the rounds the structure needs; so a block whose thinning needed a third of
//! its halo in rounds or more is thinned again with a halo twice as wide, up to [`MAX_HALO`].
//! Measured (`examples/skeleton_halo.rs`, differing voxels against the whole-volume skeleton):
//! thin preset 0 of 7565 (blocks 8x16x16); bundled vessels (radius up to ~5 voxels) 0 of 12090
//! with blocks 16x32x32 and 4 with 8x16x16, where fixed halos of 8 leave 44.
//! A block still over it (structures more than ~[`MAX_HALO`] voxels thick) is counted in the
//! entry's attributes: its skeleton can differ from a whole-volume one near its faces.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rayon::prelude::*;
use zarrs::array::Array;

use super::LabelBoxes;
use crate::cache::store::EntryStore;
use crate::cache::writer::{bytes_of, pad_block, short_hex};
use crate::error::{Error, Result};
use crate::format::entry::SkeletonInfo;
use crate::format::{Dtype, SKELETON_ARRAY};
use crate::prep::derived::thinning::skeletonize_counting;

/// The halo every block gets (voxels per side). Measured by `examples/skeleton_halo.rs` on
/// `prep synth --preset thin` (vessels one to three voxels across) with blocks of 8x16x16,
/// 16x32x32 and 32x32x32: 4 voxels leave 1 to 11 of 7565 skeleton voxels different from the
/// whole-volume skeleton, 6 and more none; 8 keeps a margin. Thicker structures widen it.
pub const BASE_HALO: usize = 8;
/// The widest halo a block is given.
pub const MAX_HALO: usize = 32;

/// Per block: the halo it got and whether its structures were thicker than that.
#[derive(Clone, Debug, Default)]
pub struct SkeletonStats {
    /// Skeleton voxels per class.
    pub voxels: BTreeMap<u16, u64>,
    /// The widest halo any block got.
    pub widest_halo: usize,
    /// Blocks whose thinning still needed more rounds than [`MAX_HALO`].
    pub over_halo: usize,
}

impl SkeletonStats {
    fn merge(&mut self, o: SkeletonStats) {
        for (c, n) in o.voxels {
            *self.voxels.entry(c).or_default() += n;
        }
        self.widest_halo = self.widest_halo.max(o.widest_halo);
        self.over_halo += o.over_halo;
    }

    /// The entry's record of it.
    pub fn info(&self) -> SkeletonInfo {
        SkeletonInfo {
            array: SKELETON_ARRAY.into(),
            voxels: self.voxels.clone(),
            halo_voxels: BASE_HALO,
            widest_halo_voxels: self.widest_halo,
            chunks_over_halo: self.over_halo,
        }
    }
}

/// The skeleton of the block `lo..hi` of a label volume of `shape`: per voxel the class whose
/// skeleton passes there, 0 elsewhere (C order, the block's size), with the halo it needed.
pub fn chunked_skeleton(
    label: &dyn LabelBoxes,
    shape: [usize; 3],
    lo: [usize; 3],
    hi: [usize; 3],
) -> Result<(Vec<u16>, SkeletonStats)> {
    chunked_skeleton_with(label, shape, lo, hi, BASE_HALO, MAX_HALO)
}

/// [`chunked_skeleton`] starting from a halo of `base` and widening up to `max` (the halo
/// measurement of `examples/skeleton_halo.rs` varies them).
pub fn chunked_skeleton_with(
    label: &dyn LabelBoxes,
    shape: [usize; 3],
    lo: [usize; 3],
    hi: [usize; 3],
    base: usize,
    max: usize,
) -> Result<(Vec<u16>, SkeletonStats)> {
    let size = [0, 1, 2].map(|a| hi[a] - lo[a]);
    let mut halo = base;
    loop {
        let rlo = [0, 1, 2].map(|a| lo[a].saturating_sub(halo));
        let rhi = [0, 1, 2].map(|a| (hi[a] + halo).min(shape[a]));
        let rsize = [0, 1, 2].map(|a| rhi[a] - rlo[a]);
        let region = label.read(rlo, rhi)?;
        let mut classes: Vec<u16> = region.iter().copied().filter(|&v| v != 0).collect();
        classes.sort_unstable();
        classes.dedup();
        let mut out = vec![0u16; size.iter().product()];
        let mut stats = SkeletonStats {
            widest_halo: halo,
            ..SkeletonStats::default()
        };
        let mut rounds = 0;
        for &c in &classes {
            let mask: Vec<bool> = region.iter().map(|&v| v == c).collect();
            let (sk, r) = skeletonize_counting(&mask, rsize);
            rounds = rounds.max(r);
            let mut n = 0u64;
            for z in 0..size[0] {
                for y in 0..size[1] {
                    let src = ((z + lo[0] - rlo[0]) * rsize[1] + y + lo[1] - rlo[1]) * rsize[2]
                        + lo[2]
                        - rlo[2];
                    let dst = (z * size[1] + y) * size[2];
                    for x in 0..size[2] {
                        if sk[src + x] {
                            out[dst + x] = c;
                            n += 1;
                        }
                    }
                }
            }
            if n > 0 {
                stats.voxels.insert(c, n);
            }
        }
        // The whole volume is inside the region: nothing was cut.
        let uncut = (0..3).all(|a| rlo[a] == 0 && rhi[a] == shape[a]);
        if uncut || 3 * rounds < halo {
            return Ok((out, stats));
        }
        if halo >= max {
            stats.over_halo = 1;
            return Ok((out, stats));
        }
        halo = (halo * 2).max(1).min(max);
    }
}

/// Block `i` (C order) of the grid of `block` over `shape`: its grid index and its voxel
/// range `lo..hi` (edge blocks cut to the volume).
pub fn block_bounds(
    shape: [usize; 3],
    block: [usize; 3],
    i: usize,
) -> ([usize; 3], [usize; 3], [usize; 3]) {
    let grid = [0, 1, 2].map(|a| shape[a].div_ceil(block[a]));
    let b = [
        i / (grid[1] * grid[2]),
        (i / grid[2]) % grid[1],
        i % grid[2],
    ];
    let lo = [0, 1, 2].map(|a| b[a] * block[a]);
    let hi = [0, 1, 2].map(|a| (lo[a] + block[a]).min(shape[a]));
    (b, lo, hi)
}

/// Write the skeleton array block by block (in parallel); returns each block's checksum and
/// the totals.
pub(super) fn write_skeleton(
    label: &dyn LabelBoxes,
    arr: &Array<EntryStore>,
    path: &Path,
    shape: [usize; 3],
    block: [usize; 3],
    dtype: Dtype,
) -> Result<(BTreeMap<String, String>, SkeletonStats)> {
    let grid = [0, 1, 2].map(|a| shape[a].div_ceil(block[a]));
    let sums = Mutex::new(BTreeMap::new());
    let total = Mutex::new(SkeletonStats::default());
    (0..grid.iter().product::<usize>())
        .into_par_iter()
        .try_for_each(|i| -> Result<()> {
            let (b, lo, hi) = block_bounds(shape, block, i);
            let size = [0, 1, 2].map(|a| hi[a] - lo[a]);
            let (sk, stats) = chunked_skeleton(label, shape, lo, hi)?;
            let idx = b.map(|v| v as u64);
            let e = |e| Error::zarr(path, e);
            let hash = match dtype {
                Dtype::Uint8 => {
                    let v: Vec<u8> = sk.iter().map(|&c| c as u8).collect();
                    let v = pad_block(v, size, block, 0u8);
                    arr.store_chunk(&idx, v.as_slice()).map_err(e)?;
                    blake3::hash(&v)
                }
                _ => {
                    let v = pad_block(sk, size, block, 0u16);
                    arr.store_chunk(&idx, v.as_slice()).map_err(e)?;
                    blake3::hash(bytes_of(&v))
                }
            };
            let name = format!("{}.{}.{}", b[0], b[1], b[2]);
            sums.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name, short_hex(&hash));
            total.lock().unwrap_or_else(|p| p.into_inner()).merge(stats);
            Ok(())
        })?;
    Ok((
        sums.into_inner().unwrap_or_else(|p| p.into_inner()),
        total.into_inner().unwrap_or_else(|p| p.into_inner()),
    ))
}
