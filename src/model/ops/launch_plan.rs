//! Launch sizes of the CUDA kernels (`cuda/kernels.cu`): plain arithmetic, compiled and tested
//! without a GPU so the index ranges the kernels rely on are checked on every CI run.

use candle_core::{bail, Result};

/// Threads per block; must equal `THREADS` in kernels.cu (the block reduction assumes it).
pub const THREADS: u32 = 256;
/// A reduction row is split into more blocks only while each thread still gets this many
/// elements: fewer blocks mean fewer partials, more mean more of the GPU busy.
const PER_THREAD: usize = 32;
/// At most this many blocks (partials) per row.
pub const MAX_PARTS: usize = 1024;
/// CUDA's limit on gridDim.y, which indexes the rows of a reduction.
pub const MAX_ROWS: usize = 65_535;
/// Grid-stride kernels never launch more blocks than this (each thread loops instead).
const MAX_BLOCKS: usize = 1 << 20;

/// Blocks per row for a two-level reduction over `rows` rows of `len` elements.
pub fn reduction_parts(len: usize, rows: usize) -> Result<u32> {
    if rows == 0 || rows > MAX_ROWS {
        bail!("CUDA reduction over {rows} rows: must be 1..={MAX_ROWS}");
    }
    let per_block = THREADS as usize * PER_THREAD;
    Ok(len.div_ceil(per_block).clamp(1, MAX_PARTS) as u32)
}

/// The `[begin, end)` of a row of `len` that block `part` of `parts` reduces; the same
/// arithmetic as `part_range` in kernels.cu. The parts cover the row exactly once.
pub fn part_range(len: usize, part: usize, parts: usize) -> (usize, usize) {
    let step = len.div_ceil(parts);
    let begin = (step * part).min(len);
    (begin, (step * part + step).min(len))
}

/// Blocks for a grid-stride kernel over `n` items (at least one).
pub fn grid_stride_blocks(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32
}

/// Blocks for a kernel with one thread per item (no loop).
pub fn one_per_item_blocks(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_row_exactly_once() {
        for len in [
            1usize, 2, 7, 255, 256, 8191, 8192, 8193, 100_000, 2_097_152, 33_554_433,
        ] {
            let parts = reduction_parts(len, 4).unwrap() as usize;
            assert!((1..=MAX_PARTS).contains(&parts));
            let mut next = 0;
            for p in 0..parts {
                let (b, e) = part_range(len, p, parts);
                assert!(b <= e && e <= len, "len {len} part {p}: {b}..{e}");
                if b < e {
                    assert_eq!(b, next, "len {len} part {p} leaves a gap or overlaps");
                    next = e;
                }
            }
            assert_eq!(next, len, "len {len}: parts end early");
            // Every thread of a block has work only when the row is long enough to need it.
            if parts > 1 {
                assert!(len.div_ceil(parts) >= THREADS as usize * PER_THREAD / 2);
            }
        }
    }

    #[test]
    fn part_range_handles_more_parts_than_elements() {
        for p in 0..8 {
            let (b, e) = part_range(3, p, 8);
            assert!(b <= e && e <= 3);
        }
    }

    #[test]
    fn rows_beyond_the_grid_limit_are_refused() {
        assert!(reduction_parts(10, MAX_ROWS).is_ok());
        assert!(reduction_parts(10, MAX_ROWS + 1).is_err());
        assert!(reduction_parts(10, 0).is_err());
    }

    #[test]
    fn grid_sizes_stay_within_limits() {
        assert_eq!(grid_stride_blocks(0), 1);
        assert_eq!(grid_stride_blocks(257), 2);
        assert_eq!(grid_stride_blocks(usize::MAX / 2), MAX_BLOCKS as u32);
        assert_eq!(one_per_item_blocks(256), 1);
        assert_eq!(one_per_item_blocks(257), 2);
    }

    #[test]
    fn threads_match_the_kernel_source() {
        let src = include_str!("cuda/kernels.cu");
        assert!(src.contains(&format!("#define THREADS {THREADS}")));
    }
}
