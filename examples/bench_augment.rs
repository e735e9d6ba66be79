//! Augmented patches per second through the trainer's loader with one worker thread (reads from
//! the memory-mapped cache, spatial transform, intensity transforms, mirroring), for
//! `scripts/bench_augment.sh`, which runs nnU-Net's augmentation beside it.
//!
//!   cargo run --release --example bench_augment -- CACHE_DIR Z,Y,X [BATCHES] [default|all|spatial|scale|intensity|none|crop|mix-intensity] [derived]
//!
//! `default` is nnU-Net's probabilities; `all` applies every transform to every patch. The
//! parts alone, as `scripts/bench_augment_nnunet.py --mode` times them on its side: `crop`
//! (no spatial or intensity transform, mirroring as in `default`), `spatial` (rotation and
//! scaling on every patch, mirroring as in `default`), `mix-intensity` (nnU-Net's intensity
//! probabilities, no spatial transform; its `intensity`). For profiling: `scale` (scaling
//! alone on every patch), `intensity` (every intensity transform on every patch), `none`.
//! `derived` also reads the label-derived arrays through the same maps (the signed distance of
//! each foreground class and the skeleton; a cache built with `--derived distance,skeleton`),
//! as training with the boundary, surface or skeleton losses does.
//! `MAPPED_MIB=M` sets the reader's strict-mode budget of mapped pages (the trainer's
//! `--mapped-mib`; default none). `BATCH_HASH=1` adds a hash of every batch's arrays (image,
//! label, distance maps, skeleton) to the line, to check that a change leaves the batches the
//! same bits (hashing is timed too: compare rates without it). Prints one JSON line.

use std::time::Instant;

use voxcache::cache::reader::{CacheReader, EntryReader, ReaderOptions};
use voxcache::train::augment::AugmentConfig;
use voxcache::train::intensity::IntensityConfig;
use voxcache::train::loader::{Loader, LoaderConfig};
use voxcache::train::sampler::{Sampler, SamplerConfig};
use voxcache::train::spatial::SpatialConfig;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: bench_augment CACHE_DIR Z,Y,X [BATCHES] [default|all|spatial|scale|intensity|none|crop|mix-intensity]"
    );
    // MAPPED_MIB: the reader's strict-mode budget of mapped pages (the trainer's
    // `--mapped-mib`); unset, none (the kernel's to manage).
    let mapped_mib: Option<u64> = std::env::var("MAPPED_MIB")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| v.parse())
        .transpose()?;
    let options = ReaderOptions {
        mapped_resident_bytes: mapped_mib.map(|mib| mib.saturating_mul(1 << 20)),
        ..ReaderOptions::default()
    };
    let reader = CacheReader::open_with(&args[1], options)?;
    let patch: Vec<usize> = args[2]
        .split(',')
        .map(|v| v.parse())
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(patch.len() == 3, "patch: give z,y,x");
    let patch = [patch[0], patch[1], patch[2]];
    let batches: u64 = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(50);
    let mode = args.get(4).map(String::as_str).unwrap_or("default");
    let derived = args.get(5).is_some_and(|a| a == "derived");
    let augment = match mode {
        "none" => AugmentConfig::none(),
        "all" => AugmentConfig::every(),
        // One part alone, every transform of it on every patch (for profiling).
        "spatial" => AugmentConfig {
            spatial: SpatialConfig::default().every(),
            intensity: IntensityConfig::none(),
            ..AugmentConfig::default()
        },
        // Scaling alone on every patch (the separable path).
        "scale" => AugmentConfig {
            spatial: SpatialConfig {
                rotation_prob: 0.0,
                ..SpatialConfig::default().every()
            },
            intensity: IntensityConfig::none(),
            ..AugmentConfig::default()
        },
        "intensity" => AugmentConfig {
            spatial: SpatialConfig::none(),
            intensity: IntensityConfig::default().every(),
            ..AugmentConfig::default()
        },
        "crop" => AugmentConfig {
            spatial: SpatialConfig::none(),
            intensity: IntensityConfig::none(),
            ..AugmentConfig::default()
        },
        "mix-intensity" => AugmentConfig {
            spatial: SpatialConfig::none(),
            ..AugmentConfig::default()
        },
        "default" => AugmentConfig::default(),
        other => anyhow::bail!(
            "unknown mode {other:?}: default, all, spatial, scale, intensity, none, crop or mix-intensity"
        ),
    };
    let dataset = reader
        .datasets()
        .first()
        .map(|s| s.to_string())
        .ok_or_else(|| anyhow::anyhow!("no dataset in the cache"))?;
    let entries: Vec<EntryReader> = reader
        .cases(&dataset)?
        .iter()
        .map(|c| reader.open_entry(&dataset, &c.case_id))
        .collect::<Result<_, _>>()?;
    // The one-time work of a cache's first read (mapping each chunk and checking its hash)
    // done before timing, as batchgeneratorsv2's side loads its cases into memory untimed:
    // every entry read once, a few planes at a time.
    for e in &entries {
        let s = e.shape_zyx();
        let planes = 4;
        let n = planes * s[1] * s[2];
        let (mut img, mut lab) = (vec![0f32; n * e.channels()], vec![0u16; n]);
        for z in (0..s[0]).step_by(planes) {
            e.read_patch(
                [z as i64, 0, 0],
                [planes, s[1], s[2]],
                &mut img,
                Some(&mut lab),
            )?;
        }
    }
    let distance = if derived {
        entries[0]
            .classes()
            .into_iter()
            .filter(|&c| c != 0)
            .collect()
    } else {
        Vec::new()
    };
    let batch = 2;
    let sampler = Sampler::new(&entries, Vec::new(), SamplerConfig::new(patch, batch, 7))?;
    let mut loader = Loader::start(
        entries,
        sampler,
        LoaderConfig {
            workers: 1,
            queue_depth: 2,
            augment,
            skeleton: false,
            centreline: derived,
            distance,
            cascade: None,
        },
        0,
    )?;
    // Warm-up: the worker's buffers.
    for _ in 0..3 {
        let (b, _) = loader.next()?;
        loader.recycle(b);
    }
    let hash = std::env::var("BATCH_HASH").is_ok_and(|v| v == "1");
    let mut hasher = blake3::Hasher::new();
    let t = Instant::now();
    for _ in 0..batches {
        let (b, _) = loader.next()?;
        if hash {
            hasher.update(&bytes_of(&b.image));
            hasher.update(&bytes_of(&b.label));
            hasher.update(&bytes_of(&b.distance));
            hasher.update(&bytes_of(&b.centreline));
        }
        loader.recycle(b);
    }
    let secs = t.elapsed().as_secs_f64();
    let mem = voxcache::util::sysinfo::MemoryUse::now().unwrap_or_default();
    println!(
        "{}",
        serde_json::json!({
            "tool": "voxcache",
            "rss_anon_mib": mem.anon >> 20,
            "rss_file_mib": mem.file >> 20,
            "mode": mode,
            "derived": derived,
            "mapped_mib": mapped_mib,
            "patch": patch,
            "patches": batches * batch as u64,
            "seconds": secs,
            "patches_per_s": (batches * batch as u64) as f64 / secs,
            "hash": hash.then(|| hasher.finalize().to_hex()[..16].to_string()),
        })
    );
    Ok(())
}

/// The bytes of a slice of plain numbers, little-endian (for the hash).
fn bytes_of<T: Le>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(std::mem::size_of_val(v));
    v.iter().for_each(|x| x.put(&mut out));
    out
}

trait Le {
    fn put(&self, out: &mut Vec<u8>);
}

impl Le for f32 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Le for u16 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
