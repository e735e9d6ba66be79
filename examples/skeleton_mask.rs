//! Skeletons of masks given as raw bytes, for `scripts/skeleton_check.py` to compare with
//! scikit-image's `skeletonize`.
//!
//!   cargo run --example skeleton_mask -- MASK.u8 Z,Y,X OUT.u8
//!
//! One byte a voxel (non-zero = inside), (z, y, x) C order, in and out.

use voxcache::prep::derived::thinning::skeletonize;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: skeleton_mask MASK.u8 Z,Y,X OUT.u8");
    let mask: Vec<bool> = std::fs::read(&args[1])?.iter().map(|&b| b != 0).collect();
    let shape: Vec<usize> = args[2]
        .split(',')
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(shape.len() == 3, "shape: give z,y,x");
    let shape = [shape[0], shape[1], shape[2]];
    anyhow::ensure!(mask.len() == shape.iter().product::<usize>(), "mask size");
    let sk = skeletonize(&mask, shape);
    std::fs::write(&args[3], sk.iter().map(|&b| b as u8).collect::<Vec<_>>())?;
    Ok(())
}
