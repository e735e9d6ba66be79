//! Patch-loading benchmark: random training patches read four ways, side by side, on one core.
//!
//!   cargo run --release --example bench_patches -- CACHE_DIR [--data NIFTI_DIR] [--patch Z,Y,X]
//!       [--patches N] [--nifti-patches M] [--rounds R]
//!
//! - `mmap`: `EntryReader::read_image` on the memory-mapped chunks (the trainer's path);
//!   `mmap+label` also reads the u16 label of the same box.
//! - `zarrs-chunks`: the same reader decoding through zarrs (`retrieve_chunk`) into its
//!   decoded-chunk cache, as for compressed caches.
//! - `zarrs-subset`: one `Array::retrieve_array_subset` per patch, no reader (a plain zarrs
//!   loader).
//! - `nifti`: what a loader without a cache does per patch: read the .nii.gz
//!   (`nifti_io::read_volume`) and crop (needs `--data`, the folder the cache was built from).
//! - `memcpy`: the same number of bytes copied from random places of a 256 MiB buffer.
//!
//! Each round reads the same random boxes (fully inside the volume where it is large enough)
//! on every path; the figures are medians over rounds. Files are in the page cache (one
//! untimed warm-up pass per path). Prints a table and one JSON line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use serde_json::{json, Value};
use voxcache::cache::reader::{CacheReader, EntryReader, ReaderOptions};
use zarrs::array::{Array, ArraySubset};
use zarrs::filesystem::FilesystemStore;

#[derive(Parser)]
struct Args {
    /// Cache folder (prep build-cache --cache-dir).
    cache: PathBuf,
    /// The dataset folder the cache was built from, for the NIfTI path.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Dataset name in the manifest (default: the first).
    #[arg(long)]
    dataset: Option<String>,
    /// Patch shape z,y,x.
    #[arg(long, default_value = "32,64,64")]
    patch: String,
    /// Patches per round on the cache and memcpy paths.
    #[arg(long, default_value_t = 2000)]
    patches: usize,
    /// Patches per round on the NIfTI path (each one reads a whole volume).
    #[arg(long, default_value_t = 8)]
    nifti_patches: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Only these paths (comma-separated), e.g. mmap,memcpy.
    #[arg(long)]
    paths: Option<String>,
}

struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n.max(1) as u64) as usize
    }
}

/// A random box start: fully inside where the axis is long enough, else centred-ish padding.
fn random_start(rng: &mut Lcg, shape: [usize; 3], patch: [usize; 3]) -> [i64; 3] {
    [0, 1, 2].map(|a| {
        if shape[a] >= patch[a] {
            rng.below(shape[a] - patch[a] + 1) as i64
        } else {
            -(rng.below(patch[a] - shape[a] + 1) as i64)
        }
    })
}

/// Copy the box out of a C-order (z, y, x) volume, zeros outside.
fn crop(vol: &[f32], shape: [usize; 3], start: [i64; 3], patch: [usize; 3], out: &mut [f32]) {
    out.fill(0.0);
    let lo = [0, 1, 2].map(|a| start[a].clamp(0, shape[a] as i64) as usize);
    let hi = [0, 1, 2].map(|a| (start[a] + patch[a] as i64).clamp(0, shape[a] as i64) as usize);
    if (0..3).any(|a| lo[a] >= hi[a]) {
        return;
    }
    let w = hi[2] - lo[2];
    for z in lo[0]..hi[0] {
        for y in lo[1]..hi[1] {
            let s = (z * shape[1] + y) * shape[2] + lo[2];
            let dz = (z as i64 - start[0]) as usize;
            let dy = (y as i64 - start[1]) as usize;
            let d = (dz * patch[1] + dy) * patch[2] + (lo[2] as i64 - start[2]) as usize;
            out[d..d + w].copy_from_slice(&vol[s..s + w]);
        }
    }
}

struct Case {
    mapped: EntryReader,
    decoded: EntryReader,
    array: Array<FilesystemStore>,
    shape: [usize; 3],
    nifti: Option<PathBuf>,
}

fn source_image(entry: &Path, data: &Path) -> anyhow::Result<PathBuf> {
    let meta: Value = serde_json::from_slice(&std::fs::read(entry.join("zarr.json"))?)?;
    let file = meta
        .pointer("/attributes/voxcache/source/image/file")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("{}: no source image recorded", entry.display()))?;
    for p in [data.join("imagesTr").join(file), data.join(file)] {
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!("{file} not found under {}", data.display())
}

/// Median of per-round rates.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let patch: Vec<usize> = args
        .patch
        .split(',')
        .map(|p| p.trim().parse())
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(patch.len() == 3, "--patch takes z,y,x");
    let patch = [patch[0], patch[1], patch[2]];
    let n_el: usize = patch.iter().product();
    let bytes = n_el * 4;

    let mapped = CacheReader::open(&args.cache)?;
    let decoded = CacheReader::open_with(
        &args.cache,
        ReaderOptions {
            mmap: false,
            ..ReaderOptions::default()
        },
    )?;
    let dataset = match &args.dataset {
        Some(d) => d.clone(),
        None => mapped
            .datasets()
            .first()
            .map(|s| s.to_string())
            .ok_or_else(|| anyhow::anyhow!("{}: no datasets", args.cache.display()))?,
    };
    let mut cases = Vec::new();
    for c in mapped.cases(&dataset)? {
        let store = Arc::new(FilesystemStore::new(&c.entry_dir)?);
        cases.push(Case {
            mapped: mapped.open_entry(&dataset, &c.case_id)?,
            decoded: decoded.open_entry(&dataset, &c.case_id)?,
            array: Array::open(store, "/image")?,
            shape: c.shape_zyx,
            nifti: match &args.data {
                Some(d) => Some(source_image(&c.entry_dir, d)?),
                None => None,
            },
        });
    }
    anyhow::ensure!(!cases.is_empty(), "dataset {dataset} has no cases");
    anyhow::ensure!(
        cases[0].mapped.is_mapped(),
        "the cache is compressed: the mmap path needs --compression none"
    );
    let voxels: usize = cases
        .iter()
        .map(|c| c.shape.iter().product::<usize>())
        .sum();

    let mut out = vec![0.0f32; n_el];
    let mut lab = vec![0u16; n_el];
    let src = vec![1.0f32; (256 << 20) / 4];
    let paths = [
        "mmap",
        "mmap+label",
        "zarrs-chunks",
        "zarrs-subset",
        "nifti",
        "memcpy",
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];

    // Round 0 is the untimed warm-up.
    for round in 0..=args.rounds {
        for (p, path) in paths.iter().enumerate() {
            if let Some(only) = &args.paths {
                if !only.split(',').any(|o| o.trim() == *path) {
                    continue;
                }
            }
            let mut rng = Lcg(1000 + round as u64);
            let count = if *path == "nifti" {
                if args.data.is_none() {
                    continue;
                }
                if round == 0 {
                    1
                } else {
                    args.nifti_patches
                }
            } else {
                args.patches
            };
            let t = Instant::now();
            for _ in 0..count {
                let c = &cases[rng.below(cases.len())];
                match *path {
                    "mmap" => {
                        let s = random_start(&mut rng, c.shape, patch);
                        c.mapped.read_image(s, patch, &mut out)?;
                    }
                    "mmap+label" => {
                        let s = random_start(&mut rng, c.shape, patch);
                        c.mapped.read_patch(s, patch, &mut out, Some(&mut lab))?;
                    }
                    "zarrs-chunks" => {
                        let s = random_start(&mut rng, c.shape, patch);
                        c.decoded.read_image(s, patch, &mut out)?;
                    }
                    "zarrs-subset" => {
                        let s = random_start(&mut rng, c.shape, patch);
                        let lo = [0, 1, 2].map(|a| s[a].max(0) as u64);
                        let hi = [0, 1, 2]
                            .map(|a| (s[a] + patch[a] as i64).min(c.shape[a] as i64) as u64);
                        let mut ranges = vec![lo[0]..hi[0], lo[1]..hi[1], lo[2]..hi[2]];
                        // Images are stored channel first (c, z, y, x): the first channel.
                        if c.array.shape().len() == 4 {
                            ranges.insert(0, 0..1);
                        }
                        let subset = ArraySubset::new_with_ranges(&ranges);
                        let got: Vec<f32> = c.array.retrieve_array_subset(&subset)?;
                        let shape = [0, 1, 2].map(|a| (hi[a] - lo[a]) as usize);
                        let rel = [0, 1, 2].map(|a| s[a] - lo[a] as i64);
                        crop(&got, shape, rel, patch, &mut out);
                    }
                    "nifti" => {
                        let file = c.nifti.as_ref().expect("nifti path");
                        let vol = voxcache::nifti_io::read_volume(file)?;
                        let [x, y, z] = vol.header.shape_xyz;
                        let shape = [z, y, x];
                        let s = random_start(&mut rng, shape, patch);
                        crop(&vol.data, shape, s, patch, &mut out);
                    }
                    _ => {
                        let at = rng.below(src.len() - n_el);
                        out.copy_from_slice(&src[at..at + n_el]);
                    }
                }
                std::hint::black_box(&out);
            }
            let dt = t.elapsed().as_secs_f64();
            if round > 0 {
                rates[p].push(count as f64 / dt);
            }
        }
    }

    println!(
        "cache {}  dataset {dataset}  {} cases, {:.1} M voxels  patch {}x{}x{} (z,y,x) f32 = {} KiB  {} patches x {} rounds (nifti: {})",
        args.cache.display(),
        cases.len(),
        voxels as f64 / 1e6,
        patch[0],
        patch[1],
        patch[2],
        bytes / 1024,
        args.patches,
        args.rounds,
        args.nifti_patches
    );
    println!("{:<14} {:>12} {:>10}", "path", "patches/s", "MB/s");
    let mut figures = serde_json::Map::new();
    for (p, path) in paths.iter().enumerate() {
        if rates[p].is_empty() {
            continue;
        }
        let pps = median(rates[p].clone());
        let per_patch = if *path == "mmap+label" {
            n_el * 6
        } else {
            bytes
        };
        let mbs = pps * per_patch as f64 / 1e6;
        println!("{path:<14} {pps:>12.1} {mbs:>10.1}");
        figures.insert(
            path.to_string(),
            json!({"patches_per_s": (pps * 10.0).round() / 10.0, "mb_per_s": (mbs * 10.0).round() / 10.0, "rounds": rates[p].iter().map(|r| (r * 10.0).round() / 10.0).collect::<Vec<_>>()}),
        );
    }
    let rate = |name: &str| {
        figures
            .get(name)
            .and_then(|v| v["patches_per_s"].as_f64())
            .unwrap_or(f64::NAN)
    };
    let mmap_over_nifti = rate("mmap") / rate("nifti");
    let memcpy_over_mmap = rate("memcpy") / rate("mmap");
    println!(
        "mmap / nifti = {mmap_over_nifti:.0}x (target >= 20x); memcpy / mmap = {memcpy_over_mmap:.2}x (target <= 3x); mmap / zarrs-chunks = {:.1}x; mmap / zarrs-subset = {:.1}x",
        rate("mmap") / rate("zarrs-chunks"),
        rate("mmap") / rate("zarrs-subset"),
    );
    let line = json!({
        "bench": "patches",
        "cache": args.cache.display().to_string(),
        "dataset": dataset,
        "cases": cases.len(),
        "voxels": voxels,
        "patch_zyx": patch,
        "patch_bytes": bytes,
        "patches_per_round": args.patches,
        "nifti_patches_per_round": args.nifti_patches,
        "rounds": args.rounds,
        "paths": figures,
        "mmap_over_nifti": (mmap_over_nifti * 100.0).round() / 100.0,
        "memcpy_over_mmap": (memcpy_over_mmap * 1000.0).round() / 1000.0,
        "decoded_cache_bytes": ReaderOptions::default().decoded_cache_bytes,
    });
    println!("{line}");
    Ok(())
}
