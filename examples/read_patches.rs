//! Patch-read benchmark for choosing the cache's chunk layout: random training-sized patches
//! read through zarrs (the path the trainer takes for compressed caches), beside a plain memcpy
//! of the same number of bytes.
//!
//!   cargo run --release --example read_patches -- CACHE_DIR [PATCHES] [Z,Y,X]
//!
//! Prints one JSON line: patches/s and MB/s (median of 5 rounds).

use std::sync::Arc;
use std::time::Instant;

use zarrs::array::{Array, ArraySubset};
use zarrs::filesystem::FilesystemStore;

fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let cache = std::path::PathBuf::from(args.get(1).map(String::as_str).unwrap_or("cache"));
    let n: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let patch: Vec<u64> = args
        .get(3)
        .map(String::as_str)
        .unwrap_or("32,128,128")
        .split(',')
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    let mut arrays = Vec::new();
    for shard in std::fs::read_dir(cache.join("entries"))? {
        for e in std::fs::read_dir(shard?.path())? {
            let store = Arc::new(FilesystemStore::new(e?.path())?);
            arrays.push(Array::open(store, "/image")?);
        }
    }
    anyhow::ensure!(!arrays.is_empty(), "no entries under {}", cache.display());
    let elem = if arrays[0].data_type().to_string().contains("16") {
        2
    } else {
        4
    };
    let mut rounds = Vec::new();
    let mut rng = 42u64;
    let mut bytes = 0usize;
    for _ in 0..5 {
        let t = Instant::now();
        bytes = 0;
        for _ in 0..n {
            let a = &arrays[lcg(&mut rng) as usize % arrays.len()];
            let shape = a.shape().to_vec();
            let ranges: Vec<std::ops::Range<u64>> = (0..3)
                .map(|d| {
                    let p = patch[d].min(shape[d]);
                    let start = lcg(&mut rng) % (shape[d] - p + 1);
                    start..start + p
                })
                .collect();
            let subset = ArraySubset::new_with_ranges(&ranges);
            let got: Vec<u8> = a
                .retrieve_array_subset::<zarrs::array::ArrayBytes>(&subset)?
                .into_fixed()?
                .to_vec();
            bytes += got.len();
            std::hint::black_box(&got);
        }
        rounds.push(t.elapsed().as_secs_f64());
    }
    rounds.sort_by(f64::total_cmp);
    let med = rounds[2];
    // The same bytes copied from memory: the floor any reader can hope for.
    let src = vec![1u8; bytes / n.max(1)];
    let t = Instant::now();
    for _ in 0..n {
        let dst = src.clone();
        std::hint::black_box(&dst);
    }
    let memcpy = t.elapsed().as_secs_f64();
    println!(
        "{{\"cache\": {:?}, \"patches\": {n}, \"patch_zyx\": {:?}, \"element_bytes\": {elem}, \"zarrs_patches_per_s\": {:.1}, \"zarrs_mb_per_s\": {:.1}, \"memcpy_mb_per_s\": {:.1}}}",
        cache.display().to_string(),
        patch,
        n as f64 / med,
        bytes as f64 / med / 1e6,
        bytes as f64 / memcpy / 1e6
    );
    Ok(())
}
