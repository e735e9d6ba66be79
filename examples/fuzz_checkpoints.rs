//! A fuzzer for the reader of nnU-Net checkpoints (the zip archive torch.save writes, its
//! pickle, the state dict's tensors, the shapes against the plans' network), on stable Rust (no
//! cargo-fuzz, no nightly): mutated checkpoints fed to the function
//! `tests/checkpoint_corpus.rs` replays, each under `catch_unwind` and a counting allocator.
//!
//!   cargo run --release --example fuzz_checkpoints -- --iterations 1000000 [--seed N] [--corpus DIR]
//!   cargo run --release --example fuzz_checkpoints -- --write-handmade tests/checkpoint_corpus
//!
//! Seeds: the nnU-Net fixtures' checkpoints, the ct3d weights rewritten by the tests' writer,
//! and every file in the corpus folder (default `tests/checkpoint_corpus`), each run once;
//! then each iteration mutates one of them (the zip's bytes, its entries, the pickle's opcodes:
//! see `tests/checkpoint_fuzz/mutate.rs`), leaving out those whose pickle inflates past 1 MiB
//! (a hundred times slower to run than a fixture). Findings: a panic, a refusal that does not name the
//! input, or a peak of live memory over 256 MiB for one input; each saves the input as
//! `CORPUS/crash-<blake3 prefix>.pth`, reported once per place. A single allocation over 1 GiB
//! aborts the process after writing the input to `CORPUS/crash-allocation.pth`. Exit status 1
//! if anything was found.

#[path = "../tests/checkpoint_fuzz/mod.rs"]
mod checkpoint_fuzz;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Parser;

use checkpoint_fuzz::mutate::{mutate, Rng};
use checkpoint_fuzz::{alloc, seeds, Target, MAX_PEAK};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

#[derive(Parser)]
#[command(about = "Fuzz the reader of nnU-Net checkpoints")]
struct Args {
    /// Inputs to run (the seeds as they are first, then mutations).
    #[arg(long, default_value_t = 100_000)]
    iterations: u64,
    /// Seed of the mutation stream (the same seed runs the same inputs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder of extra seeds, where findings are saved.
    #[arg(long, default_value = "tests/checkpoint_corpus")]
    corpus: PathBuf,
    /// Write the hand-made hostile checkpoints into this folder and exit.
    #[arg(long)]
    write_handmade: Option<PathBuf>,
}

/// The last panic's place and message, set by the panic hook.
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
fn corpus_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| Some((e.path(), std::fs::read(e.path()).ok()?)))
        .collect();
    out.sort();
    out.into_iter().map(|(_, b)| b).collect()
}

fn save(dir: &Path, input: &[u8]) -> std::io::Result<PathBuf> {
    let hash = blake3::hash(input).to_hex();
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("crash-{}.pth", &hash[..16]));
    std::fs::write(&path, input)?;
    Ok(path)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.write_handmade {
        std::fs::create_dir_all(dir)?;
        let made = seeds::handmade();
        for (name, bytes) in &made {
            std::fs::write(dir.join(name), bytes)?;
        }
        println!("wrote {} inputs into {}", made.len(), dir.display());
        return Ok(());
    }
    let mut pool = seeds::seeds();
    let made = pool.len();
    pool.extend(corpus_files(&args.corpus));
    println!(
        "seeds: {made} made in code + {} from {}; mutation seed {}",
        pool.len() - made,
        args.corpus.display(),
        args.seed
    );
    std::fs::create_dir_all(&args.corpus)?;
    let pending = args.corpus.join("crash-allocation.pth");
    alloc::dump_to(&pending)?;
    alloc::CAP.store(1 << 30, std::sync::atomic::Ordering::Relaxed);
    record_panics();
    let target = Target::new();
    let parents: Vec<usize> = (0..pool.len())
        .filter(|&i| seeds::mutable(&pool[i]))
        .collect();
    let mut rng = Rng::new(args.seed);
    let (mut read, mut accepted) = (0u64, 0u64);
    let mut largest = 0usize;
    // Place (or "memory") -> (times, message, saved input).
    let mut findings: BTreeMap<String, (u64, String, PathBuf)> = BTreeMap::new();
    let start = Instant::now();
    let mut last_report = start;
    for i in 0..args.iterations {
        let input = if (i as usize) < pool.len() {
            pool[i as usize].clone()
        } else {
            let seed = &pool[parents[rng.below(parents.len())]];
            let other = &pool[parents[rng.below(parents.len())]];
            mutate(&mut rng, seed, other)
        };
        alloc::running(&input);
        let base = alloc::start();
        let outcome = catch_unwind(AssertUnwindSafe(|| target.run(&input)));
        let peak = alloc::peak_since(base);
        largest = largest.max(peak);
        let finding = match outcome {
            Ok(o) => {
                read += o.read as u64;
                accepted += o.accepted as u64;
                (peak > MAX_PEAK).then(|| {
                    (
                        "memory".to_string(),
                        format!("{} MiB live for one input", peak >> 20),
                    )
                })
            }
            Err(_) => Some(
                LAST_PANIC
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_default(),
            ),
        };
        if let Some((place, message)) = finding {
            let first = !findings.contains_key(&place);
            let saved = if first {
                save(&args.corpus, &input)?
            } else {
                PathBuf::new()
            };
            let e = findings
                .entry(place.clone())
                .or_insert((0, message.clone(), saved.clone()));
            e.0 += 1;
            if first {
                println!(
                    "FOUND at {place}: {message}\n  input saved as {}",
                    saved.display()
                );
            }
        }
        if i % 1024 == 0 && last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            let s = start.elapsed().as_secs_f64();
            eprintln!(
                "... {} runs, {:.0}/s, {} findings",
                i + 1,
                (i + 1) as f64 / s,
                findings.len()
            );
        }
    }
    let _ = std::fs::remove_file(&pending);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} executions in {secs:.1} s: {:.0} execs/s",
        args.iterations,
        args.iterations as f64 / secs
    );
    println!(
        "archive and pickle read {read}, weights accepted {accepted}, refused {}; largest peak of one input {:.1} MiB (bound {} MiB)",
        args.iterations - accepted,
        largest as f64 / (1 << 20) as f64,
        MAX_PEAK >> 20
    );
    println!("findings: {} places", findings.len());
    for (place, (n, message, saved)) in &findings {
        println!("  {place} ({n}x): {message} [{}]", saved.display());
    }
    if !findings.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
