//! Patch-reading benchmark: random training patches (image and label) read from one or more
//! caches of the same cases (one per chunk layout), side by side on one core, alternating
//! caches within each round, beside two ceilings.
//!
//!   cargo run --release --example bench_patches -- CACHE [CACHE...] [--patch Z,Y,X]
//!       [--patches N] [--rounds R] [--cold] [--no-label]
//!
//! - each cache: `EntryReader::read_patch` of image (f32) and label (u16) boxes, whatever the
//!   layout (memory-mapped raw chunks, or compressed shards decoded inner chunk by inner chunk
//!   into the reader's decoded-chunk cache, or zarrs for anything else);
//! - `crop-ram`: the same boxes' rows copied out of volumes held in memory (f32 image, u8
//!   label widened to u16): what a loader holding every case in RAM does, the ceiling of any
//!   reader of the same bytes;
//! - `memcpy`: the patch's bytes copied in one piece from random places of a 256 MiB buffer.
//!
//! Every path reads the same boxes (cases and starts drawn from one seed per round, fully
//! inside the volume where it is large enough). Warm (default): an untimed first round reads
//! every chunk of every case once (into the page cache, each checked against its recorded hash
//! as a run's first epoch does), so the timed rounds are a run's steady state. `--cold`: before each cache's round its reader is dropped and
//! every file of the cache is evicted from the page cache (`posix_fadvise(DONTNEED)`, no root
//! needed), so the round reads from disk as a first epoch does. Prints a table and one JSON
//! line with the medians over rounds.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use serde_json::json;
use voxcache::cache::reader::{CacheReader, EntryReader};

#[derive(Parser)]
struct Args {
    /// Cache folders (prep build-cache --cache-dir), built from the same cases.
    #[arg(required = true)]
    caches: Vec<PathBuf>,
    /// Dataset name in the manifests (default: the first).
    #[arg(long)]
    dataset: Option<String>,
    /// Patch shape z,y,x.
    #[arg(long, default_value = "32,64,64")]
    patch: String,
    /// Patches per round and path.
    #[arg(long, default_value_t = 2000)]
    patches: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Evict each cache's files from the page cache before its round.
    #[arg(long)]
    cold: bool,
    /// Read the image only.
    #[arg(long)]
    no_label: bool,
    /// Only the caches: no crop-ram and memcpy rows (for profiling).
    #[arg(long)]
    no_ceilings: bool,
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

/// A start for a patch inside the volume where the volume is large enough.
fn random_start(rng: &mut Lcg, shape: [usize; 3], patch: [usize; 3]) -> [i64; 3] {
    [0, 1, 2].map(|a| rng.below(shape[a].saturating_sub(patch[a]) + 1) as i64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Every regular file under `dir` (bytes, paths).
fn files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            total += files(&e.path(), out)?;
        } else if t.is_file() {
            total += e.metadata()?.len();
            out.push(e.path());
        }
    }
    Ok(total)
}

/// Drop the files' pages from the page cache (they must not be mapped by this process).
fn evict(paths: &[PathBuf]) {
    for p in paths {
        if let Ok(f) = std::fs::File::open(p) {
            use std::os::unix::io::AsRawFd;
            // SAFETY: a plain advisory call on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

struct Cache {
    dir: PathBuf,
    dataset: String,
    files: Vec<PathBuf>,
    bytes: u64,
    layout: String,
}

impl Cache {
    fn open(&self) -> anyhow::Result<Vec<EntryReader>> {
        let reader = CacheReader::open(&self.dir)?;
        let mut cases = reader.cases(&self.dataset)?;
        cases.sort_by(|a, b| a.case_id.cmp(&b.case_id));
        cases
            .iter()
            .map(|c| Ok(reader.open_entry(&self.dataset, &c.case_id)?))
            .collect()
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
    let label = !args.no_label;
    let out_bytes = n_el * if label { 6 } else { 4 };

    let mut caches = Vec::new();
    for dir in &args.caches {
        let reader = CacheReader::open(dir)?;
        let dataset = match &args.dataset {
            Some(d) => d.clone(),
            None => reader
                .datasets()
                .first()
                .map(|s| s.to_string())
                .ok_or_else(|| anyhow::anyhow!("{}: no datasets", dir.display()))?,
        };
        let mut paths = Vec::new();
        let bytes = files(&dir.join("entries"), &mut paths)?;
        let mut c = Cache {
            dir: dir.clone(),
            dataset,
            files: paths,
            bytes,
            layout: String::new(),
        };
        let e = c.open()?;
        anyhow::ensure!(!e.is_empty(), "{}: no cases", dir.display());
        let ch = e[0].chunk_zyx();
        c.layout = format!(
            "{} {}x{}x{}{}",
            e[0].image_dtype().name(),
            ch[0],
            ch[1],
            ch[2],
            if e[0].is_mapped() { " mapped" } else { "" }
        );
        caches.push(c);
    }
    // The cases and their shapes, from the first cache; the others must hold the same.
    let first = caches[0].open()?;
    let shapes: Vec<[usize; 3]> = first.iter().map(|e| e.shape_zyx()).collect();
    for c in &caches[1..] {
        let got: Vec<[usize; 3]> = c.open()?.iter().map(|e| e.shape_zyx()).collect();
        anyhow::ensure!(
            got == shapes,
            "{} holds other cases than {}",
            c.dir.display(),
            caches[0].dir.display()
        );
    }
    drop(first);

    // In-memory volumes for crop-ram: as large as the biggest case, capped at 256 MiB of f32.
    let ram_shape = {
        let big = *shapes
            .iter()
            .max_by_key(|s| s.iter().product::<usize>())
            .unwrap();
        let mut s = [
            big[0].max(patch[0]),
            big[1].max(patch[1]),
            big[2].max(patch[2]),
        ];
        while s.iter().product::<usize>() > (64 << 20) && s[0] > patch[0] {
            s[0] -= 1;
        }
        s
    };
    let ram_image = vec![1.0f32; ram_shape.iter().product()];
    let ram_label = vec![1u8; ram_shape.iter().product()];
    let src = vec![1u8; 256 << 20];
    let mut out = vec![0.0f32; n_el];
    let mut lab = vec![0u16; n_el];
    let mut flat = vec![0u8; out_bytes];

    let mut names: Vec<String> = caches
        .iter()
        .map(|c| c.dir.display().to_string())
        .chain(["crop-ram".to_string(), "memcpy".to_string()])
        .collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    // Warm: one reader per cache for the whole run, as a training run keeps its own (the
    // first check of each chunk against its recorded hash happens in the untimed round).
    let mut open: Vec<Vec<EntryReader>> = if args.cold {
        Vec::new()
    } else {
        caches
            .iter()
            .map(|c| c.open())
            .collect::<anyhow::Result<_>>()?
    };
    // Round 0 warms the page cache and the code (untimed) unless rounds are cold.
    let first_round = if args.cold { 1 } else { 0 };
    for round in first_round..=args.rounds {
        for (p, _) in names.iter().enumerate() {
            if args.no_ceilings && p >= caches.len() {
                continue;
            }
            let mut rng = Lcg(1000 + round as u64);
            let entries = match caches.get(p) {
                Some(c) if args.cold => {
                    evict(&c.files);
                    c.open()?
                }
                Some(_) => std::mem::take(&mut open[p]),
                None => Vec::new(),
            };
            if round == 0 {
                // Warm-up: every chunk of every case once (mapped, checked against its hash,
                // in the page cache), then the timed rounds see the steady state of a run.
                for (e, s) in entries.iter().zip(&shapes) {
                    for z in (0..s[0]).step_by(patch[0]) {
                        for y in (0..s[1]).step_by(patch[1]) {
                            for x in (0..s[2]).step_by(patch[2]) {
                                let at = [z as i64, y as i64, x as i64];
                                e.read_patch(at, patch, &mut out, label.then_some(&mut lab[..]))?;
                            }
                        }
                    }
                }
            }
            let t = Instant::now();
            for _ in 0..args.patches {
                let k = rng.below(shapes.len());
                let s = random_start(&mut rng, shapes[k], patch);
                if let Some(e) = entries.get(k) {
                    e.read_patch(s, patch, &mut out, label.then_some(&mut lab[..]))?;
                } else if p == caches.len() {
                    crop(
                        &ram_image, &ram_label, ram_shape, s, patch, &mut out, &mut lab,
                    );
                } else {
                    let at = rng.below(src.len() - out_bytes);
                    flat.copy_from_slice(&src[at..at + out_bytes]);
                    std::hint::black_box(&flat);
                }
                std::hint::black_box((&out, &lab));
            }
            let dt = t.elapsed().as_secs_f64();
            if !args.cold && p < caches.len() {
                open[p] = entries;
            }
            if round > 0 {
                rates[p].push(args.patches as f64 / dt);
            }
        }
    }

    println!(
        "{} cases; patch {}x{}x{} (z,y,x) {} = {} KiB out; {} patches x {} rounds, {}",
        shapes.len(),
        patch[0],
        patch[1],
        patch[2],
        if label {
            "f32 image + u16 label"
        } else {
            "f32 image"
        },
        out_bytes / 1024,
        args.patches,
        args.rounds,
        if args.cold {
            "cold (files evicted before each round)"
        } else {
            "warm page cache"
        }
    );
    println!(
        "{:<40} {:>22} {:>10} {:>10} {:>9} {:>10}",
        "path", "layout", "patches/s", "MB/s", "x memcpy", "disk MB"
    );
    let memcpy = median(rates[names.len() - 1].clone());
    if args.no_ceilings {
        names.truncate(caches.len());
    }
    let mut rows = Vec::new();
    for (p, name) in names.iter().enumerate() {
        let pps = median(rates[p].clone());
        let mbs = pps * out_bytes as f64 / 1e6;
        let (layout, disk) = caches
            .get(p)
            .map_or((String::new(), 0), |c| (c.layout.clone(), c.bytes));
        println!(
            "{name:<40} {layout:>22} {pps:>10.1} {mbs:>10.1} {:>8.2}x {:>10}",
            memcpy / pps,
            if disk > 0 {
                format!("{:.0}", disk as f64 / 1e6)
            } else {
                String::new()
            }
        );
        rows.push(json!({
            "path": name, "layout": layout, "bytes_on_disk": disk,
            "patches_per_s": (pps * 10.0).round() / 10.0,
            "rounds": rates[p].iter().map(|r| (r * 10.0).round() / 10.0).collect::<Vec<_>>(),
        }));
    }
    // The in-RAM volumes of crop-ram and the memcpy source are anonymous memory of their own.
    let ceilings = (ram_image.len() * 4 + ram_label.len() + src.len()) as u64;
    let mem = voxcache::util::sysinfo::MemoryUse::now().unwrap_or_default();
    println!(
        "now: {} (of the anonymous, {} MiB are the ceilings' buffers)",
        mem.describe(),
        ceilings >> 20
    );
    println!(
        "{}",
        json!({
            "bench": "patches", "cases": shapes.len(), "patch_zyx": patch, "label": label,
            "cold": args.cold, "patches_per_round": args.patches, "rounds": args.rounds,
            "paths": rows, "rss_anon": mem.anon, "rss_file": mem.file,
            "ceiling_buffers": ceilings,
        })
    );
    Ok(())
}

/// The box `start .. start + patch` of the in-memory volumes (wrapped into them), row by row.
fn crop(
    image: &[f32],
    label: &[u8],
    shape: [usize; 3],
    start: [i64; 3],
    patch: [usize; 3],
    out: &mut [f32],
    lab: &mut [u16],
) {
    let at = |a: usize| (start[a] as usize) % (shape[a] - patch[a] + 1);
    let (z0, y0, x0) = (at(0), at(1), at(2));
    let mut d = 0;
    for z in z0..z0 + patch[0] {
        for y in y0..y0 + patch[1] {
            let s = (z * shape[1] + y) * shape[2] + x0;
            out[d..d + patch[2]].copy_from_slice(&image[s..s + patch[2]]);
            for (o, &v) in lab[d..d + patch[2]].iter_mut().zip(&label[s..s + patch[2]]) {
                *o = v as u16;
            }
            d += patch[2];
        }
    }
}
