//! `train`: train a 3D U-Net on patches streamed from a voxcache cache. Arguments are parsed
//! here; the options are resolved by `voxcache::config` and the run belongs to the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use voxcache::cache::s3::Fill;
use voxcache::config::location::local_path;
use voxcache::config::location::{local_for_reading, LocalView, S3Flags};

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use voxcache::config::exit::EXIT_STATUS_HELP;
use voxcache::config::modes::train::{check, TrainMode};
use voxcache::config::modes::Given;
use voxcache::config::run_dir::run_dir;
use voxcache::config::{train, Exit, TrainFlags};
use voxcache::format::training::FoldChoice;
use voxcache::train::benchmark::{benchmark, WARMUP_STEPS};
use voxcache::train::fold_validation::{validate_fold, FoldValidationOptions};
use voxcache::train::trainer::{per_class, run, RunOptions, RunSummary};
use voxcache::util::sysinfo::human_bytes;

/// Train a 3D U-Net (candle) on patches memory-mapped from a cache built by `prep build-cache`.
///
/// Options come from the pipeline's [train] table, then these flags. The run folder gets
/// checkpoints (every --checkpoint-every steps, at the end, on Ctrl-C, and the best by
/// validation Dice), metrics.jsonl and curves.png. Re-run with --resume after a crash.
///
/// Modes: a new run, or --resume (the same options, checked against the run's record);
/// --benchmark (no --out, --resume, --val-every, --checkpoint-every, --log-every or fold
/// validation options); --validate-only (only --fold, --dataset, --out, the cache and its S3
/// options, --device, -j, --no-progress, --validation-data and --validation-mirror). Without a
/// fold, --splits and the fold validation options are refused; with one, --val-fraction; with
/// --fold all, --splits and the fold validation options too. An option refused is named with
/// its mode (exit 2).
#[derive(Parser, Debug)]
#[command(name = "train", version, after_help = EXIT_STATUS_HELP)]
struct Cli {
    /// Cache written by `prep build-cache`: a folder, or s3://BUCKET/PREFIX (read through a
    /// local folder, --local-cache).
    #[arg(long, default_value = "cache")]
    cache_dir: PathBuf,
    #[command(flatten)]
    s3: S3Flags,
    /// Run folder [default: runs/DATASET, or runs/DATASET-2, -3... when taken]. Not with
    /// --benchmark.
    #[arg(long, value_parser = local_path)]
    out: Option<PathBuf>,
    /// Continue a run from its latest checkpoint: the one in --out, else the newest
    /// runs/DATASET*. Not with --benchmark or --validate-only.
    #[arg(long)]
    resume: bool,
    /// cpu, cuda or cuda:N (cuda needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    options: TrainFlags,
    /// Compute threads (default: all cores).
    #[arg(short = 'j', long)]
    threads: Option<usize>,
    /// No progress bar (logs still go to metrics.jsonl).
    #[arg(long)]
    no_progress: bool,
    /// Strict memory mode: MiB of cache pages the memory maps may bring into the resident set
    /// before the least recently used maps hand theirs back. Default: no limit; mapped pages
    /// are clean page cache the kernel reclaims under pressure. Use it where page cache is
    /// billed to the job (a container whose scheduler evicts on the working set, such as
    /// Kubernetes): see docs/usage.md, "Memory". Not with --validate-only.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    mapped_mib: Option<u64>,
    /// Time STEPS training steps (default 20, after 3 warm-up steps) of this configuration on
    /// this cache and device, print step time, patches/s, data wait and peak memory, and
    /// exit: no run folder is kept. One fold at most; not with --out, --resume, --val-every,
    /// --checkpoint-every, --log-every or the fold validation options.
    #[arg(long, value_name = "STEPS", num_args = 0..=1, default_missing_value = "20")]
    benchmark: Option<u64>,
    /// With --fold: where the dataset's files are, when not where the cache recorded them at
    /// build time (a fold ends by predicting its held-out cases from their own files).
    #[arg(long, value_name = "DIR")]
    validation_data: Option<PathBuf>,
    /// With --fold: test-time mirroring in the fold's final validation (nnU-Net's default;
    /// eight forward passes a window).
    #[arg(long)]
    validation_mirror: bool,
    /// With --fold: skip the fold's final validation in the held-out cases' own geometry
    /// (validation/, summary.json); --validate-only runs it later.
    #[arg(long)]
    no_fold_validation: bool,
    /// With --fold: train nothing; run the final validation of the fold runs already there
    /// (as nnU-Net's --val). Takes only --fold, --dataset, --out, --cache-dir and its S3
    /// options, --device, -j, --no-progress, --validation-data and --validation-mirror.
    #[arg(long, requires = "fold")]
    validate_only: bool,
    /// Write batch_hashes.jsonl in the run folder: one line per batch, its number and a BLAKE3
    /// hash of its image (f32) and label (u16) bytes, to check that another loader (the Python
    /// package's `PatchLoader.for_train`) gives this run's batches. Not with --benchmark or
    /// --validate-only.
    #[arg(long)]
    batch_hashes: bool,
}

// Large freed blocks kept for the next step's tensors of their size (see the allocator).
#[global_allocator]
static ALLOC: voxcache::util::alloc::KeepLarge = voxcache::util::alloc::KeepLarge;

fn main() -> ExitCode {
    voxcache::config::exit::quiet_on_closed_pipe();
    voxcache::model::device::default_cpu_threads();
    // Every step frees and allocates the same tensors: keep their pages (about 15% of a CPU
    // step went to page faults), for about 9% more peak memory.
    voxcache::util::sysinfo::reuse_freed_memory();
    let cmd = Cli::command();
    let matches = cmd.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = Given::of(&cmd, &matches);
    voxcache::config::exit::finish(real_main(cli, &given))
}

fn benchmark_main(opts: &RunOptions, steps: u64, stop: &AtomicBool) -> Result<Exit> {
    let c = &opts.config;
    eprintln!(
        "train --benchmark: {steps} steps after {WARMUP_STEPS} warm-up, batch {} x patch {:?} \
         ({} precision), cache {}, device {}",
        c.batch_size,
        c.network.patch,
        c.network.precision,
        opts.cache_dir.display(),
        opts.device
    );
    let r = benchmark(opts, steps, stop)?;
    let per_step = c.batch_size * c.accumulate;
    println!(
        "step time       {:.3} s median, {:.3} s slowest (first step {:.2} s)",
        r.step_s, r.max_step_s, r.first_step_s
    );
    println!("patches/s       {:.2} ({per_step} a step)", r.patches_per_s);
    println!(
        "data wait       {:.1}% of the step time{}",
        100.0 * r.data_wait_frac,
        if r.data_wait_frac > 0.05 {
            ": the loader is the bottleneck (more --workers, or fewer augmentations)"
        } else {
            ""
        }
    );
    let gpu = r.gpu_peak_mb.map_or(String::new(), |g| {
        format!(", GPU {:.0} MiB (peak our tensors held)", g)
    });
    match (r.peak_anon_mb, r.peak_file_mb) {
        (Some(a), Some(f)) => println!(
            "peak memory     {a:.0} MiB anonymous, {f:.0} MiB file-backed (mapped cache pages: page cache){gpu}"
        ),
        _ => println!("peak memory     RSS {:.0} MiB{gpu}", r.peak_rss_mb),
    }
    // The step's own memory: on the CPU the anonymous growth since the network was built.
    let measured = match (r.gpu_peak_mb, r.peak_anon_mb, r.base_anon_mb) {
        (Some(g), _, _) => format!("GPU peak {g:.0} MiB"),
        (None, Some(p), Some(b)) => format!("{:.0} MiB anonymous growth", p - b),
        _ => "not measured".into(),
    };
    println!("step memory     forecast {}", r.forecast.describe());
    println!("                measured {measured}");
    let total = r.forecast_s(c.steps);
    let total = match total {
        t if t < 120.0 => format!("{t:.0} s"),
        t if t < 7200.0 => format!("{:.0} min", t / 60.0),
        t => format!("{:.1} h", t / 3600.0),
    };
    println!(
        "a run of {} steps: about {total} of training steps (validation not included)",
        c.steps
    );
    Ok(Exit::Success)
}

fn real_main(mut cli: Cli, given: &Given) -> Result<Exit> {
    let (mut config, plan) = train::resolve_planned(&cli.options)?;
    // One run per fold (`--fold 0,1,2,3,4`): each run's memory is released before the next.
    let folds = train::folds(&cli.options, &config);
    // An option the mode does not take is refused before anything is read.
    check(
        given,
        &TrainMode {
            validate_only: cli.validate_only,
            benchmark: cli.benchmark.is_some(),
            folds: &folds,
        },
    )?;
    let view = open_cache(&mut cli)?;
    if !cli.no_fold_validation && folds.iter().any(Option::is_some) {
        voxcache::train::fold_validation::check_validatable(
            &cli.cache_dir,
            config.dataset.as_deref(),
        )?;
    }
    set_threads(cli.threads)?;
    // Planned again on --resume: the plan depends only on the cache and the machine's memory
    // (--validate-only trains nothing: nothing to plan).
    if plan && !cli.validate_only {
        let text = voxcache::config::autoplan::plan_from_cache(
            &mut config,
            &cli.cache_dir,
            &cli.device,
            cli.mapped_mib,
            view.blocks(),
        )?;
        eprint!("{text}");
    }
    note_cgroup_limit(cli.mapped_mib);
    let stop = stop_on_ctrlc()?;

    let several = folds.len() > 1;
    for fold in folds {
        config.fold = fold;
        let run_dir = fold_run_dir(&cli, config.dataset.as_deref(), fold.map(|f| (f, several)))?;
        if cli.validate_only {
            fold_validation(&cli, &run_dir)?;
            continue;
        }
        let opts = RunOptions {
            cache_dir: cli.cache_dir.clone(),
            run_dir,
            resume: cli.resume,
            device: cli.device.clone(),
            progress: !cli.no_progress,
            config: config.clone(),
            halt_after: None,
            benchmark: false,
            // A fold run that validates only at the end does so once, in the fold validation
            // (predict's `--checkpoint best` then takes the final weights too).
            final_validation: !(fold.is_some() && !cli.no_fold_validation && config.val_every == 0),
            mapped_mib: cli.mapped_mib,
            blocks: view.blocks(),
            batch_hashes: cli.batch_hashes,
        };
        if let Some(steps) = cli.benchmark {
            return benchmark_main(&opts, steps.max(1), &stop);
        }
        eprintln!(
            "train: cache {}, run folder {}, device {}",
            opts.cache_dir.display(),
            opts.run_dir.display(),
            opts.device
        );
        let s = run(&opts, &stop)?;
        print_summary(&s);
        if s.interrupted {
            return Ok(Exit::Interrupted);
        }
        if fold.is_some() && !cli.no_fold_validation && s.val_cases > 0 {
            fold_validation(&cli, &s.run_dir)?;
        }
    }
    Ok(Exit::Success)
}

/// The cache's local folder, made `cli.cache_dir`: a cache on S3 is trained from its local
/// tier, fetched first where it lacks entries.
fn open_cache(cli: &mut Cli) -> Result<LocalView> {
    let view = local_for_reading(
        &cli.cache_dir,
        &cli.s3.options_for(&cli.cache_dir, true)?,
        false,
        Fill::OnRead { prefetch: true },
    )?;
    if let Some(line) = view.describe() {
        eprintln!("{line}");
    }
    cli.cache_dir = view.path.clone();
    Ok(view)
}

/// `-j`: the global compute thread pool's size (rayon's default, all cores, without it).
fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("setting the thread count")?;
    }
    Ok(())
}

/// Without --mapped-mib, point to it where a cgroup memory limit applies: page cache counts
/// toward the limit; the kernel reclaims it first, but some schedulers evict on it before that.
fn note_cgroup_limit(mapped_mib: Option<u64>) {
    if let (None, Some(limit)) = (mapped_mib, voxcache::util::sysinfo::cgroup_memory_limit()) {
        eprintln!(
            "note: a cgroup memory limit of {} applies; the cache's mapped pages count toward it \
             as page cache. If your platform evicts on the working set (Kubernetes), pass \
             --mapped-mib (docs/usage.md, \"Memory\").",
            human_bytes(limit)
        );
    }
}

/// The flag a first Ctrl-C sets (the run finishes its step and writes a checkpoint); a second
/// one exits at once, without a checkpoint.
fn stop_on_ctrlc() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let presses = Arc::new(AtomicUsize::new(0));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || {
            if presses.fetch_add(1, Ordering::SeqCst) > 0 {
                eprintln!("\nsecond Ctrl-C: exiting without a checkpoint");
                std::process::exit(Exit::Interrupted.code().into());
            }
            eprintln!(
                "\nCtrl-C: finishing this step and writing a checkpoint (Ctrl-C again to abort)"
            );
            stop.store(true, Ordering::SeqCst);
        })
        .context("installing the Ctrl-C handler")?;
    }
    Ok(stop)
}

/// The fold's run folder, refused where it overlaps a folder the run reads (the cache, the
/// validation data). `fold`: the fold and whether there are several.
fn fold_run_dir(
    cli: &Cli,
    dataset: Option<&str>,
    fold: Option<(FoldChoice, bool)>,
) -> Result<PathBuf> {
    let run_dir = run_dir(
        cli.out.as_deref(),
        dataset,
        &cli.cache_dir,
        cli.resume || cli.validate_only,
        fold,
    )?;
    let mut read = vec![("--cache-dir", cli.cache_dir.as_path())];
    read.extend(
        cli.validation_data
            .iter()
            .map(|d| ("--validation-data", d.as_path())),
    );
    let flag = if cli.out.is_some() {
        "--out"
    } else {
        "the run folder"
    };
    voxcache::util::paths::refuse_overlap(flag, &run_dir, &read)?;
    Ok(run_dir)
}

/// A finished (or interrupted) run's summary on stdout: cases, speed, loss, validation,
/// memory and where its files are.
fn print_summary(s: &RunSummary) {
    println!(
        "dataset {}: {} train / {} validation cases, U-Net with {} parameters",
        s.dataset, s.train_cases, s.val_cases, s.num_parameters
    );
    println!(
        "steps {}..{} in {:.1} s: {:.1} patches/s, waiting for data {:.1}% of the time",
        s.start_step,
        s.steps_done,
        s.seconds,
        s.patches_per_s,
        100.0 * s.data_wait_frac
    );
    if let (Some(a), Some(b)) = (s.first_loss, s.last_loss) {
        println!("loss {a:.4} (first log window) -> {b:.4} (last)");
    }
    if let Some(v) = &s.last_validation {
        println!(
            "validation Dice {:.4} ({}); best {:.4}",
            v.mean_dice,
            per_class(&s.class_names, &v.dice_per_class),
            s.best_dice.unwrap_or(f64::NAN)
        );
        if !v.cldice_per_class.is_empty() {
            println!(
                "validation clDice {:.4} ({})",
                v.mean_cldice,
                per_class(&s.class_names, &v.cldice_per_class)
            );
        }
    }
    match (s.peak_memory, s.peak_rss) {
        (Some(m), _) => println!(
            "peak memory {} (mapped cache pages: page cache)",
            m.describe()
        ),
        (None, Some(p)) => println!("peak memory {}", human_bytes(p)),
        (None, None) => {}
    }
    println!(
        "run folder {}: checkpoints/, metrics.jsonl, curves.png",
        s.run_dir.display()
    );
}

/// A fold's final validation: its held-out cases predicted in their own geometry and scored.
fn fold_validation(cli: &Cli, run_dir: &std::path::Path) -> Result<()> {
    let v = validate_fold(&FoldValidationOptions {
        run_dir: run_dir.to_path_buf(),
        cache_dir: cli.cache_dir.clone(),
        data: cli.validation_data.clone(),
        device: cli.device.clone(),
        mirror: cli.validation_mirror,
        cldice: true,
        jobs: cli.threads.unwrap_or(2).max(1),
        quiet: cli.no_progress,
    })?;
    for (id, why) in &v.failed {
        eprintln!("error: fold validation, case {id}: {why}");
    }
    let m = &v.report.foreground_mean;
    println!(
        "fold validation ({} cases in their own geometry): Dice {:.4}, clDice {:.4}, HD95 {:.2} {}; {}",
        v.report.evaluated,
        m.dice,
        m.cldice,
        m.hd95,
        v.report.unit,
        v.summary.display()
    );
    Ok(())
}
