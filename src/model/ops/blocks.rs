//! Splitting a batch of grid rows into blocks, and running the blocks on rayon workers that
//! each own one reusable workspace (fresh large buffers cost page faults on every call).

use gemm::Parallelism;
use rayon::prelude::*;

/// Floats of column workspace per worker (1 MiB): blocks that stay in cache between the
/// gather and the matrix product. Measured on 2x32x32x64x64 3^3: 256 Ki floats beat 64 Ki, 1 Mi
/// and 4 Mi (the last is 1.5-2x slower in forward and input gradient).
const WORKSPACE_FLOATS: usize = 1 << 18;

/// One unit of work: sample `n`, grid rows `r0..r1`.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Sample of the batch.
    pub n: usize,
    /// First grid row.
    pub r0: usize,
    /// One past the last grid row.
    pub r1: usize,
}

/// Blocks of whole grid rows over all samples of a batch.
#[derive(Clone, Copy, Debug)]
pub struct BlockPlan {
    batch: usize,
    grid_rows: usize,
    rows_per_block: usize,
    /// Floats of workspace each block needs.
    pub workspace: usize,
}

impl BlockPlan {
    /// `col_rows` rows of column matrix per grid voxel, `row_len` voxels per grid row.
    pub fn new(batch: usize, grid_rows: usize, row_len: usize, col_rows: usize) -> Self {
        let per_row = (col_rows * row_len).max(1);
        let mut rows_per_block = (WORKSPACE_FLOATS / per_row).clamp(1, grid_rows.max(1));
        // Enough blocks to keep every worker busy.
        let want = 2 * rayon::current_num_threads();
        let blocks = batch * grid_rows.div_ceil(rows_per_block);
        if blocks < want {
            rows_per_block = (batch * grid_rows).div_ceil(want).div_ceil(batch).max(1);
            rows_per_block = rows_per_block.min(grid_rows.max(1));
        }
        Self {
            batch,
            grid_rows,
            rows_per_block,
            workspace: rows_per_block * per_row,
        }
    }

    /// Blocks in the plan.
    pub fn count(&self) -> usize {
        self.batch * self.grid_rows.div_ceil(self.rows_per_block)
    }

    /// Block `i` (samples in order, rows in order within a sample).
    pub fn block(&self, i: usize) -> Block {
        let per_sample = self.grid_rows.div_ceil(self.rows_per_block);
        let (n, b) = (i / per_sample, i % per_sample);
        let r0 = b * self.rows_per_block;
        Block {
            n,
            r0,
            r1: (r0 + self.rows_per_block).min(self.grid_rows),
        }
    }

    /// Runs `body(workspace, accumulator, block, gemm_parallelism)` over all blocks. Blocks are
    /// split across workers when there are enough of them; otherwise they run in order and the
    /// matrix products use the threads. Returns one accumulator per worker.
    pub fn run<A, I, F>(&self, init: I, body: F) -> Vec<A>
    where
        A: Send,
        I: Fn() -> A + Sync,
        F: Fn(&mut [f32], &mut A, Block, Parallelism) + Sync,
    {
        let threads = rayon::current_num_threads();
        let blocks = self.count();
        if threads > 1 && blocks >= threads {
            let per_worker = blocks.div_ceil(threads);
            (0..blocks.div_ceil(per_worker))
                .into_par_iter()
                .map(|w| {
                    let mut ws = vec![0f32; self.workspace];
                    let mut acc = init();
                    for i in w * per_worker..((w + 1) * per_worker).min(blocks) {
                        body(&mut ws, &mut acc, self.block(i), Parallelism::None);
                    }
                    acc
                })
                .collect()
        } else {
            let par = if threads > 1 {
                Parallelism::Rayon(threads)
            } else {
                Parallelism::None
            };
            let mut ws = vec![0f32; self.workspace];
            let mut acc = init();
            for i in 0..blocks {
                body(&mut ws, &mut acc, self.block(i), par);
            }
            vec![acc]
        }
    }
}
