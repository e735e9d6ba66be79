//! A fuzzer for the NIfTI-1 header parser, the plan and the whole-file reader, on stable Rust
//! (no cargo-fuzz, no nightly): mutated headers fed to the function `tests/fuzz_corpus.rs`
//! replays, each under `catch_unwind`.
//!
//!   cargo run --release --example fuzz_headers -- --iterations 1000000 [--seed N] [--corpus DIR]
//!   cargo run --example fuzz_headers -- --iterations 1000000   # dev profile: overflow checks on
//!   cargo run --release --example fuzz_headers -- --write-handmade tests/fuzz_corpus
//!
//! The seeds are valid files made in code (every supported datatype, both byte orders, plain
//! and gzip, sform/qform variants) plus every file in the corpus folder (default
//! `tests/fuzz_corpus`). Each iteration mutates one (interesting values at the header's
//! numeric fields, bit flips, byte sets, splices, truncation, gzip wrapping and damage) and
//! runs it through `header_fuzz::Target::run`. A panic saves the input as
//! `CORPUS/crash-<blake3 prefix>.nii(.gz)` and is reported once per place; the exit status is
//! 1 if anything panicked. The release profile does not check integer overflow: run the dev
//! profile too (the crate and its dependencies are optimized there as well).

#[path = "../tests/header_fuzz/mod.rs"]
mod header_fuzz;
#[path = "../tests/common/nii.rs"]
#[allow(dead_code, unreachable_pub)] // the tests' writer; the fuzzer uses a part of it
mod nii;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Parser;

use header_fuzz::mutate::{mutate, Rng};
use header_fuzz::{seeds, Target};

#[derive(Parser)]
#[command(about = "Fuzz the NIfTI-1 header parser, the plan and the reader")]
struct Args {
    /// Inputs to run (the seeds as they are first, then mutations).
    #[arg(long, default_value_t = 100_000)]
    iterations: u64,
    /// Seed of the mutation stream (the same seed runs the same inputs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder of extra seeds, where crashing inputs are saved.
    #[arg(long, default_value = "tests/fuzz_corpus")]
    corpus: PathBuf,
    /// Write the hand-made hostile inputs into this folder and exit.
    #[arg(long)]
    write_handmade: Option<PathBuf>,
}

/// The last panic's place and message, set by the panic hook (on whichever thread panicked).
static LAST_PANIC: Mutex<Option<(String, String)>> = Mutex::new(None);

fn record_panics() {
    std::panic::set_hook(Box::new(|info| {
        let place = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "unknown place".into());
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some((place, message));
    }));
}

/// Every regular file in `dir` (none if it does not exist), sorted.
fn corpus_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| Some((e.path(), std::fs::read(e.path()).ok()?)))
        .collect();
    out.sort();
    out
}

/// Save a crashing input as `crash-<hash>.nii` or `.nii.gz` (by its first bytes).
fn save_crash(dir: &Path, input: &[u8]) -> std::io::Result<PathBuf> {
    let hash = blake3::hash(input).to_hex();
    let ext = if input.starts_with(&[0x1f, 0x8b]) {
        "nii.gz"
    } else {
        "nii"
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("crash-{}.{ext}", &hash[..16]));
    std::fs::write(&path, input)?;
    Ok(path)
}

#[derive(Default)]
struct Counts {
    runs: u64,
    accepted: u64,
    decoded: u64,
    crashes: u64,
    disagreements: BTreeMap<String, u64>,
    /// Panic place -> (times, message, saved input).
    panics: BTreeMap<String, (u64, String, PathBuf)>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.write_handmade {
        std::fs::create_dir_all(dir)?;
        for (name, bytes) in seeds::handmade() {
            std::fs::write(dir.join(name), bytes)?;
        }
        println!(
            "wrote {} inputs into {}",
            seeds::handmade().len(),
            dir.display()
        );
        return Ok(());
    }
    let mut pool = seeds::seeds();
    let made = pool.len();
    pool.extend(corpus_files(&args.corpus).into_iter().map(|(_, b)| b));
    println!(
        "seeds: {made} made in code + {} from {}; mutation seed {}",
        pool.len() - made,
        args.corpus.display(),
        args.seed
    );
    record_panics();
    let target = Target::new();
    let mut rng = Rng::new(args.seed);
    let mut c = Counts::default();
    let start = Instant::now();
    let mut last_report = start;
    for i in 0..args.iterations {
        let input = if (i as usize) < pool.len() {
            pool[i as usize].clone()
        } else {
            let seed = &pool[rng.below(pool.len())];
            let other = &pool[rng.below(pool.len())];
            mutate(&mut rng, seed, other)
        };
        c.runs += 1;
        match catch_unwind(AssertUnwindSafe(|| target.run(&input))) {
            Ok(o) => {
                c.accepted += o.accepted as u64;
                c.decoded += o.decoded as u64;
                if let Some(e) = o.disagreement {
                    // The message without the numbers, so one kind counts once.
                    let kind: String = e.chars().filter(|ch| !ch.is_ascii_digit()).collect();
                    *c.disagreements.entry(kind).or_default() += 1;
                }
            }
            Err(_) => {
                c.crashes += 1;
                let (place, message) = LAST_PANIC
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_default();
                let entry = c.panics.entry(place.clone());
                let first = matches!(entry, std::collections::btree_map::Entry::Vacant(_));
                let saved = if first {
                    save_crash(&args.corpus, &input)?
                } else {
                    PathBuf::new()
                };
                let e = entry.or_insert((0, message.clone(), saved.clone()));
                e.0 += 1;
                if first {
                    println!(
                        "PANIC at {place}: {message}\n  input saved as {}",
                        saved.display()
                    );
                }
            }
        }
        if i % 4096 == 0 && last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            let s = start.elapsed().as_secs_f64();
            eprintln!(
                "... {} runs, {:.0}/s, {} crashes",
                c.runs,
                c.runs as f64 / s,
                c.crashes
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} executions in {secs:.1} s: {:.0} execs/s",
        c.runs,
        c.runs as f64 / secs
    );
    println!(
        "header accepted {} (planned), refused {}; whole file decoded {}, refused {}",
        c.accepted,
        c.runs - c.accepted,
        c.decoded,
        c.accepted - c.decoded
    );
    for (kind, n) in &c.disagreements {
        println!("accepted header, complete file, reader refused ({n}x): {kind}");
    }
    println!("panics: {} inputs at {} places", c.crashes, c.panics.len());
    for (place, (n, message, saved)) in &c.panics {
        println!("  {place} ({n}x): {message} [{}]", saved.display());
    }
    if c.crashes > 0 {
        std::process::exit(1);
    }
    Ok(())
}
