//! Distance transforms of masks given as raw bytes, for `scripts/distance_check.py` to compare
//! with scipy's `distance_transform_edt`.
//!
//!   cargo run --example distance_map -- MASK.u8 Z,Y,X SZ,SY,SX OUT_PREFIX
//!
//! Reads one byte a voxel (non-zero = inside), (z, y, x) C order; writes OUT_PREFIX.dist.f64
//! (distance to the nearest inside voxel) and OUT_PREFIX.sdf.f32 (signed distance),
//! little-endian.

use voxcache::prep::derived::edt::{distance_to, signed_distance};

fn triple<T: std::str::FromStr>(s: &str) -> anyhow::Result<[T; 3]>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let v: Vec<T> = s.split(',').map(|p| p.parse()).collect::<Result<_, _>>()?;
    v.try_into()
        .map_err(|_| anyhow::anyhow!("{s}: give three comma-separated values"))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 5,
        "usage: distance_map MASK.u8 Z,Y,X SZ,SY,SX OUT_PREFIX"
    );
    let mask: Vec<bool> = std::fs::read(&args[1])?.iter().map(|&b| b != 0).collect();
    let shape: [usize; 3] = triple(&args[2])?;
    let spacing: [f64; 3] = triple(&args[3])?;
    anyhow::ensure!(mask.len() == shape.iter().product::<usize>(), "mask size");
    let d = distance_to(&mask, shape, spacing);
    std::fs::write(
        format!("{}.dist.f64", args[4]),
        d.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )?;
    let s = signed_distance(&mask, shape, spacing);
    std::fs::write(
        format!("{}.sdf.f32", args[4]),
        s.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )?;
    Ok(())
}
