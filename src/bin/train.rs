//! `train`: train a 3D U-Net on patches streamed from a voxcache cache.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use voxcache::cache::reader::CacheReader;
use voxcache::pipeline::load_pipeline;
use voxcache::sysinfo::human_bytes;
use voxcache::train::config::{OptimizerName, TrainConfig};
use voxcache::train::model::{Norm, Upsampling};
use voxcache::train::trainer::{run, RunOptions};

/// Train a 3D U-Net (candle) on patches memory-mapped from a cache built by `prep build-cache`.
///
/// Options come from the pipeline file's [train] table, then these flags. The run folder gets
/// checkpoints (every --checkpoint-every steps, at the end, on Ctrl-C, and the best by
/// validation Dice), metrics.jsonl and curves.png. Re-run with --resume after a crash.
#[derive(Parser, Debug)]
#[command(name = "train", version)]
struct Cli {
    /// Cache folder written by `prep build-cache`.
    #[arg(long, default_value = "cache")]
    cache_dir: PathBuf,
    /// Dataset in the cache (needed when it holds several).
    #[arg(long)]
    dataset: Option<String>,
    /// Pipeline (pipelines/NAME.toml or a path) whose [train] table gives the defaults.
    #[arg(long, default_value = "default")]
    pipeline: String,
    /// Run folder [default: runs/DATASET].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// cpu, cuda or cuda:N (cuda needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Optimizer steps.
    #[arg(long)]
    steps: Option<u64>,
    #[arg(long)]
    batch_size: Option<usize>,
    /// Patch size z,y,x in voxels.
    #[arg(long, value_parser = parse_zyx)]
    patch: Option<[usize; 3]>,
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, value_parser = ["adamw", "sgd"])]
    optimizer: Option<String>,
    /// Batches per optimizer step (gradient accumulation).
    #[arg(long)]
    accumulate: Option<usize>,
    /// Fraction of each batch centred on foreground.
    #[arg(long)]
    fg_fraction: Option<f64>,
    /// Channels of the first U-Net stage.
    #[arg(long)]
    base_channels: Option<usize>,
    /// Resolution stages of the U-Net.
    #[arg(long)]
    stages: Option<usize>,
    /// instance, or group:G.
    #[arg(long)]
    norm: Option<String>,
    /// transpose or nearest.
    #[arg(long)]
    upsampling: Option<String>,
    /// Turn data augmentation off.
    #[arg(long)]
    no_augment: bool,
    /// Share of cases held out for validation (0 = none).
    #[arg(long)]
    val_fraction: Option<f64>,
    #[arg(long)]
    val_every: Option<u64>,
    #[arg(long)]
    checkpoint_every: Option<u64>,
    #[arg(long)]
    log_every: Option<u64>,
    /// Loader threads.
    #[arg(long)]
    workers: Option<usize>,
    #[arg(long)]
    seed: Option<u64>,
    /// Compute threads (default: all cores).
    #[arg(short = 'j', long)]
    threads: Option<usize>,
    /// No progress bar (logs still go to metrics.jsonl).
    #[arg(long)]
    no_progress: bool,
}

fn parse_zyx(s: &str) -> Result<[usize; 3], String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{s:?}: {e}"))?;
    v.try_into()
        .map_err(|_| format!("{s:?}: expected three numbers z,y,x"))
}

fn config_from(cli: &Cli) -> Result<TrainConfig> {
    let (stem, file) = load_pipeline(&cli.pipeline)?;
    let mut c = TrainConfig::from_table(file.train.as_ref(), &format!("pipeline {stem}"))?;
    macro_rules! set {
        ($($f:ident),*) => { $( if let Some(v) = cli.$f.clone() { c.$f = v; } )* };
    }
    set!(
        steps,
        batch_size,
        patch,
        lr,
        accumulate,
        fg_fraction,
        base_channels,
        stages,
        val_fraction,
        val_every,
        checkpoint_every,
        log_every,
        workers,
        seed
    );
    if cli.dataset.is_some() {
        c.dataset = cli.dataset.clone();
    }
    if let Some(o) = &cli.optimizer {
        c.optimizer = if o == "sgd" {
            OptimizerName::Sgd
        } else {
            OptimizerName::Adamw
        };
    }
    if let Some(n) = &cli.norm {
        c.norm = match n.as_str() {
            "instance" => Norm::Instance,
            g => match g.strip_prefix("group:").and_then(|n| n.parse().ok()) {
                Some(groups) => Norm::Group(groups),
                None => anyhow::bail!("--norm {n:?}: expected instance or group:G"),
            },
        };
    }
    if let Some(u) = &cli.upsampling {
        c.upsampling = match u.as_str() {
            "transpose" => Upsampling::Transpose,
            "nearest" => Upsampling::Nearest,
            _ => anyhow::bail!("--upsampling {u:?}: expected transpose or nearest"),
        };
    }
    if cli.no_augment {
        c.augment = false;
    }
    c.validate()?;
    Ok(c)
}

/// `runs/NAME`, `runs/NAME-2`, ...: a new run takes the first free folder, `--resume` the
/// newest existing one, so running the README command twice starts a second run instead of
/// failing or overwriting the first.
fn default_run_dir(root: &std::path::Path, name: &str, resume: bool) -> PathBuf {
    let candidate = |i: usize| {
        if i == 1 {
            root.join(name)
        } else {
            root.join(format!("{name}-{i}"))
        }
    };
    let mut i = 1;
    while candidate(i).exists() {
        i += 1;
    }
    if resume && i > 1 {
        candidate(i - 1)
    } else {
        candidate(i)
    }
}

fn main() -> ExitCode {
    voxcache::train::device::default_cpu_threads();
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> Result<ExitCode> {
    if let Some(n) = cli.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("setting the thread count")?;
    }
    let config = config_from(&cli)?;
    let run_dir = match &cli.out {
        Some(p) => p.clone(),
        None => {
            let name = match &config.dataset {
                Some(d) => d.clone(),
                None => CacheReader::open(&cli.cache_dir)?
                    .datasets()
                    .first()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "run".into()),
            };
            default_run_dir(&PathBuf::from("runs"), &name, cli.resume)
        }
    };

    let stop = Arc::new(AtomicBool::new(false));
    let presses = Arc::new(AtomicUsize::new(0));
    {
        let (stop, presses) = (stop.clone(), presses.clone());
        ctrlc::set_handler(move || {
            if presses.fetch_add(1, Ordering::SeqCst) > 0 {
                eprintln!("\nsecond Ctrl-C: exiting without a checkpoint");
                std::process::exit(130);
            }
            eprintln!(
                "\nCtrl-C: finishing this step and writing a checkpoint (Ctrl-C again to abort)"
            );
            stop.store(true, Ordering::SeqCst);
        })
        .context("installing the Ctrl-C handler")?;
    }

    let opts = RunOptions {
        cache_dir: cli.cache_dir.clone(),
        run_dir,
        resume: cli.resume,
        device: cli.device.clone(),
        progress: !cli.no_progress,
        config,
        halt_after: None,
    };
    eprintln!(
        "train: cache {}, run folder {}, device {}",
        opts.cache_dir.display(),
        opts.run_dir.display(),
        opts.device
    );
    let s = run(&opts, &stop)?;
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
            "validation Dice {:.4} (per class {:?}); best {:.4}",
            v.mean_dice,
            v.dice_per_class,
            s.best_dice.unwrap_or(f64::NAN)
        );
    }
    if let Some(p) = s.peak_rss {
        println!("peak memory {}", human_bytes(p));
    }
    println!(
        "run folder {}: checkpoints/, metrics.jsonl, curves.png",
        s.run_dir.display()
    );
    Ok(if s.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}
