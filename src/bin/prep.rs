//! `prep`: build and inspect voxcache caches, and generate synthetic datasets.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use voxcache::build::{build_cache, BuildOptions, BuildReport, CaseOutcome};
use voxcache::dataset::DatasetSource;
use voxcache::pipeline::{load_pipeline, Compression, Settings};
use voxcache::synth;
use voxcache::sysinfo::human_bytes;

#[derive(Parser)]
#[command(
    name = "prep",
    version,
    about = "Build and inspect voxcache caches of NIfTI datasets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Resample and normalize a NIfTI dataset into a chunked, content-addressed Zarr v3 cache.
    BuildCache(Box<BuildArgs>),
    /// Generate a synthetic vessel dataset (nnU-Net layout).
    Synth(SynthArgs),
    /// Report on a dataset (fingerprint, target spacing, cost forecast) or a cache (entries,
    /// orphans, leftovers; --verify re-hashes every chunk). Never writes into the cache.
    Inspect(Box<InspectArgs>),
}

#[derive(Args)]
struct BuildArgs {
    /// Dataset folder (imagesTr/ + labelsTr/, nnU-Net style). Default: the bundled data/vessels.
    data: Option<PathBuf>,
    /// Image glob whose single '*' in the file name is the case id (instead of DATA).
    #[arg(long, conflicts_with = "data")]
    images: Option<String>,
    /// Label glob, paired with --images by case id.
    #[arg(long, requires = "images")]
    labels: Option<String>,
    /// Where the cache lives.
    #[arg(long, default_value = "cache")]
    cache_dir: PathBuf,
    /// Dataset name in the cache manifest (default: the data folder's name).
    #[arg(long)]
    name: Option<String>,
    /// Named pipeline (pipelines/NAME.toml) or a path to a .toml file; flags override it.
    #[arg(long)]
    pipeline: Option<String>,
    /// Target spacing: auto (median + anisotropy rule) or x,y,z in the files' units.
    #[arg(long)]
    spacing: Option<String>,
    /// zscore-nonzero (default), zscore, ct or none.
    #[arg(long)]
    normalization: Option<String>,
    /// float32 (default) or float16.
    #[arg(long)]
    image_dtype: Option<String>,
    /// Chunk shape z,y,x in voxels.
    #[arg(long)]
    chunk: Option<String>,
    /// Shard shape z,y,x (whole multiples of the chunk); omit for no sharding.
    #[arg(long)]
    shard: Option<String>,
    /// none (memory-mappable), zstd or blosc.
    #[arg(long)]
    compression: Option<String>,
    #[arg(long)]
    compression_level: Option<i32>,
    /// Foreground coordinates sampled per class for patch sampling.
    #[arg(long)]
    fg_samples: Option<usize>,
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', default_value_t = 0)]
    jobs: usize,
    /// Build only part I of N (0-based), e.g. one part per Slurm array task.
    #[arg(long, value_name = "I/N")]
    part: Option<String>,
    /// Print the plan without writing anything.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long, short = 'q')]
    quiet: bool,
}

#[derive(Args)]
struct SynthArgs {
    /// Output folder.
    #[arg(long, default_value = "synthetic")]
    out: PathBuf,
    /// small (the bundled dataset), minivess (70 volumes of 512x512x5..110, ~6 GB raw) or
    /// outlier (the single 512x512x61 volume at 4.97x4.97x5 um from the user story).
    #[arg(long, default_value = "small")]
    preset: String,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn parse_triple(s: &str, what: &str) -> Result<[usize; 3]> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("{what} {s:?}: expected three whole numbers z,y,x"))?;
    match v.as_slice() {
        [a, b, c] => Ok([*a, *b, *c]),
        _ => bail!("{what} {s:?}: expected three whole numbers z,y,x"),
    }
}

fn parse_part(s: &str) -> Result<(usize, usize)> {
    let (i, n) = s
        .split_once('/')
        .context("--part: expected I/N, e.g. 0/8")?;
    let (i, n): (usize, usize) = (i.parse()?, n.parse()?);
    if n == 0 || i >= n {
        bail!("--part {s}: need 0 <= I < N");
    }
    Ok((i, n))
}

/// The bundled dataset, found next to the working folder or next to the crate.
fn default_data() -> PathBuf {
    let local = PathBuf::from("data/vessels");
    if local.is_dir() {
        return local;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels")
}

fn settings_from(args: &BuildArgs) -> Result<Settings> {
    let mut s = Settings::default();
    if let Some(p) = &args.pipeline {
        let (name, file) = load_pipeline(p)?;
        s.apply_file(&name, &file)?;
    } else if let Ok((name, file)) = load_pipeline("default") {
        s.apply_file(&name, &file)?;
    }
    if let Some(v) = &args.spacing {
        s.spacing = v.parse()?;
    }
    if let Some(v) = &args.normalization {
        s.normalization = v.parse()?;
    }
    if let Some(v) = &args.image_dtype {
        s.image_dtype = v.parse()?;
    }
    if let Some(v) = &args.chunk {
        s.chunk_zyx = parse_triple(v, "--chunk")?;
    }
    if let Some(v) = &args.shard {
        s.shard_zyx = if v == "none" {
            None
        } else {
            Some(parse_triple(v, "--shard")?)
        };
    }
    if let Some(c) = &args.compression {
        s.compression = Compression::parse(c, args.compression_level)?;
    } else if let Some(l) = args.compression_level {
        s.compression = Compression::parse(s.compression.name(), Some(l))?;
    }
    if let Some(v) = args.fg_samples {
        s.fg_samples = v;
    }
    if let Some(v) = args.seed {
        s.seed = v;
    }
    s.validate()?;
    Ok(s)
}

fn fmt3<T: std::fmt::Display>(v: &[T; 3]) -> String {
    format!("{}x{}x{}", v[0], v[1], v[2])
}

fn fmt_spacing(v: &[f64; 3]) -> String {
    format!("{:.4}x{:.4}x{:.4}", v[0], v[1], v[2])
}

fn print_plan(r: &BuildReport) {
    if let Some(d) = &r.decision {
        println!(
            "target spacing (x,y,z) {} ({}: {})",
            fmt_spacing(&d.target_xyz),
            d.rule,
            d.reason
        );
    }
    println!(
        "{:<20} {:>13} {:>20} {:>15} {:>10} {:>10} {:>10}  flag",
        "case", "input", "spacing", "output", "cached", "whole f32", "whole f64"
    );
    let mut total = (0u64, 0u64, 0u64);
    for p in &r.plans {
        total.0 += p.out_bytes;
        total.1 += p.whole_volume_f32_bytes;
        total.2 += p.whole_volume_f64_bytes;
        println!(
            "{:<20} {:>13} {:>20} {:>15} {:>10} {:>10} {:>10}  {}",
            p.id,
            fmt3(&p.in_shape_xyz),
            fmt_spacing(&p.in_spacing_xyz),
            fmt3(&p.out_shape_xyz),
            human_bytes(p.out_bytes),
            human_bytes(p.whole_volume_f32_bytes),
            human_bytes(p.whole_volume_f64_bytes),
            voxcache::plan::outlier_flag(p.outlier, p.size_factor)
        );
    }
    println!(
        "{:<20} {:>13} {:>20} {:>15} {:>10} {:>10} {:>10}",
        format!("total ({})", r.plans.len()),
        "",
        "",
        "",
        human_bytes(total.0),
        human_bytes(total.1),
        human_bytes(total.2)
    );
}

fn print_summary(r: &BuildReport) {
    for c in &r.cases {
        if let CaseOutcome::Failed { error } = &c.outcome {
            eprintln!("failed {}: {error}", c.id);
        }
        if c.outcome == CaseOutcome::Skipped {
            eprintln!("skipped {}", c.id);
        }
    }
    let rate = if r.wall_seconds > 0.0 {
        r.voxels_built as f64 / r.wall_seconds / 1e6
    } else {
        0.0
    };
    println!(
        "{} -> {}: {} built, {} cached, {} failed; {} written; {:.1} s; {:.1} Mvoxel/s; peak RSS {}",
        r.dataset,
        r.cache_dir.display(),
        r.built,
        r.cached,
        r.failed,
        human_bytes(r.bytes_written),
        r.wall_seconds,
        rate,
        r.peak_rss_bytes.map(human_bytes).unwrap_or_else(|| "n/a".into())
    );
}

fn run_build(args: BuildArgs) -> Result<ExitCode> {
    let settings = settings_from(&args)?;
    let source = match (&args.images, &args.data) {
        (Some(images), _) => DatasetSource::Globs {
            images: images.clone(),
            labels: args.labels.clone(),
        },
        (None, Some(d)) => DatasetSource::Folder(d.clone()),
        (None, None) => DatasetSource::Folder(default_data()),
    };
    let opts = BuildOptions {
        source,
        cache_dir: args.cache_dir.clone(),
        name: args.name.clone(),
        settings,
        jobs: args.jobs,
        dry_run: args.dry_run,
        part: args.part.as_deref().map(parse_part).transpose()?,
        progress: !args.quiet && !args.json,
        quiet: args.quiet,
    };
    let report = build_cache(&opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.dry_run {
        print_plan(&report);
    } else {
        print_summary(&report);
    }
    Ok(if report.failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn run_synth(args: SynthArgs) -> Result<ExitCode> {
    let preset: synth::SynthPreset = args.preset.parse()?;
    let specs = synth::preset_cases(preset, args.seed);
    let total = specs.len();
    synth::write_dataset(&args.out, &specs, args.seed, |i, s| {
        eprintln!(
            "[{}/{total}] {} {:?} at {:?}",
            i + 1,
            s.id,
            s.shape_xyz,
            s.spacing_xyz
        );
    })?;
    println!("wrote {total} cases to {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
struct InspectArgs {
    /// A dataset folder (imagesTr/ or .nii(.gz) files) or a cache folder (manifest.json, entries/).
    path: PathBuf,
    /// Target spacing for the forecast: auto (default) or x,y,z ("what if").
    #[arg(long)]
    spacing: Option<String>,
    /// Pipeline whose spacing and image dtype the forecast uses (default: default).
    #[arg(long)]
    pipeline: Option<String>,
    /// Print the report as one JSON document (shape documented in voxcache::inspect).
    #[arg(long)]
    json: bool,
    /// Cache: re-hash every chunk against voxcache_chunks.json; exit 1 on any corrupt or missing.
    #[arg(long)]
    verify: bool,
    /// Dataset: read headers only (no intensity or label statistics).
    #[arg(long)]
    headers_only: bool,
    /// Cases read at once (each holds about one volume in memory).
    #[arg(long, short = 'j', default_value_t = 2)]
    jobs: usize,
    /// Draw this case's three middle slices with its label overlay (needs --out).
    #[arg(long, value_name = "CASE", requires = "out")]
    preview: Option<String>,
    /// PNG file for --preview.
    #[arg(long, value_name = "FILE.png", requires = "preview")]
    out: Option<PathBuf>,
}

/// Exit 0: no problem is an error; 1: some problem is (or --verify found damage); 2: cannot inspect.
fn run_inspect(args: InspectArgs) -> Result<ExitCode> {
    use voxcache::inspect;
    if let (Some(case), Some(out)) = (&args.preview, &args.out) {
        let info = inspect::write_preview(&args.path, case, out)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&info)?);
        } else {
            println!(
                "wrote {} ({}x{} px from the {}, slices z,y,x = {:?}, {:.4} per pixel)",
                out.display(),
                info.width,
                info.height,
                info.source,
                info.slices_zyx,
                info.pixel_size
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let opts = inspect::InspectOptions {
        settings: inspect::settings_for(args.pipeline.as_deref(), args.spacing.as_deref())?,
        verify: args.verify,
        read_voxels: !args.headers_only,
        jobs: args.jobs,
        ..inspect::InspectOptions::new(&args.path)
    };
    let report = inspect::inspect(&opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(ExitCode::from(u8::from(report.errors > 0)))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::BuildCache(a) => run_build(*a),
        Command::Synth(a) => run_synth(a),
        Command::Inspect(a) => run_inspect(*a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
