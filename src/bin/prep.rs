//! `prep`: build and inspect voxcache caches, and generate synthetic datasets. Arguments are
//! parsed here; what they mean is resolved by `voxcache::config`, and the work and the report
//! formats belong to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use voxcache::cache::s3::Fill;
use voxcache::config::exit::EXIT_STATUS_HELP;
use voxcache::config::location::local_path;
use voxcache::config::location::{local_for_reading, S3Flags};
use voxcache::config::modes::Given;
use voxcache::config::settings::{cache_apart, dataset_source, resolve};
use voxcache::config::values::parse_part;
use voxcache::config::{Exit, PrepFlags};
use voxcache::inspect::dataset_report::render_plan;
use voxcache::prep::cache_build::{build_cache, BuildOptions, BuildReport, CaseOutcome};

use voxcache::synth;
use voxcache::util::sysinfo::human_bytes;

#[derive(Parser)]
#[command(
    name = "prep",
    version,
    about = "Build and inspect voxcache caches of NIfTI datasets",
    after_help = EXIT_STATUS_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Resample and normalize a NIfTI dataset into a chunked, content-addressed Zarr v3 cache.
    #[command(after_help = EXIT_STATUS_HELP)]
    BuildCache(Box<BuildArgs>),
    /// Generate a synthetic vessel dataset (nnU-Net layout).
    Synth(SynthArgs),
    /// Report on a dataset (fingerprint, target spacing, cost forecast) or a cache (entries,
    /// orphans, leftovers; --verify re-hashes every chunk). Never writes into the cache.
    #[command(after_help = EXIT_STATUS_HELP)]
    Inspect(Box<InspectArgs>),
    /// Plan the training of a dataset as nnU-Net's experiment planner does (spacing, patch,
    /// batch size and network per configuration) and write it as a pipeline file.
    #[command(after_help = EXIT_STATUS_HELP)]
    Plan(PlanArgs),
}

#[derive(Args)]
struct PlanArgs {
    /// Dataset folder (imagesTr/ + labelsTr/). Default: the bundled data/vessels.
    data: Option<PathBuf>,
    /// default (nnU-Net's plain U-Net, about 8 GB), resenc-m, resenc-l, resenc-xl (its
    /// residual-encoder presets for about 8, 24 and 40 GB).
    #[arg(long, default_value = "default")]
    preset: voxcache::planner::Preset,
    /// Write the plan as a pipeline file (pass it to build-cache and train with --pipeline).
    #[arg(value_parser = local_path, long, value_name = "FILE.toml")]
    out: Option<PathBuf>,
    /// Plan for a GPU of this much memory: nnU-Net's reference scaled to it, then each
    /// configuration shrunk until our forecast of its bf16 training step fits.
    #[arg(long, value_name = "GB", allow_negative_numbers = true)]
    gpu_memory_gb: Option<f64>,
}

fn run_plan(args: PlanArgs) -> Result<Exit> {
    let source = dataset_source(args.data, None, None)?;
    // The pipeline file goes beside the dataset, never over one of its files.
    if let (Some(out), voxcache::prep::dataset::DatasetSource::Folder(d)) = (&args.out, &source) {
        voxcache::util::paths::refuse_overwrite("--out", out, &[("the dataset folder", d)])?;
    }
    let name = match &source {
        voxcache::prep::dataset::DatasetSource::Folder(d) => d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "dataset".into()),
        _ => "dataset".into(),
    };
    let fp = voxcache::planner::fingerprint_dataset(&source)?;
    for n in &fp.notes {
        eprintln!("note: {n}");
    }
    let planned =
        voxcache::config::configurations::plan_dataset(&fp, args.preset, args.gpu_memory_gb)?;
    for n in &planned.notes {
        eprintln!("note: {n}");
    }
    println!(
        "{name}: {} labelled cases, preset {}",
        fp.fingerprint.num_training,
        args.preset.name()
    );
    print!(
        "{}",
        voxcache::config::configurations::describe(&planned.tables, &fp.unit)
    );
    if let Some(out) = args.out {
        let text = voxcache::config::configurations::plans_to_toml(&planned, &name, &fp.unit)?;
        std::fs::write(&out, text)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
        println!(
            "wrote {}: prep build-cache --pipeline {0} ..., then train --pipeline {0} ...",
            out.display()
        );
    }
    Ok(Exit::Success)
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
    /// Where the cache lives: a folder, or s3://BUCKET/PREFIX (credentials and endpoint from
    /// AWS_* variables or AWS_PROFILE, as every S3 tool takes them).
    #[arg(long, default_value = "cache")]
    cache_dir: PathBuf,
    #[command(flatten)]
    s3: S3Flags,
    /// Dataset name in the cache manifest (default: the data folder's name).
    #[arg(long)]
    name: Option<String>,
    /// A cascade's first stage: the folder of its segmentations of these cases (a 3d_lowres run
    /// folder, whose fold_K/validation/ hold them, or a predict --out folder); each foreground
    /// label becomes one more image channel.
    #[arg(value_parser = local_path, long, value_name = "DIR")]
    previous_stage: Option<PathBuf>,
    #[command(flatten)]
    settings: PrepFlags,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', default_value_t = 0)]
    jobs: usize,
    /// Build only part I of N (0-based), e.g. one part per Slurm array task. Not with
    /// --dry-run (it plans every case).
    #[arg(long, value_name = "I/N", value_parser = parse_part)]
    part: Option<(usize, usize)>,
    /// Print the plan (the table `prep inspect DATA` forecasts) without writing anything; with
    /// neither --part, -q, --s3-endpoint nor --local-cache.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress bar. Not with --dry-run.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Preprocess as nnU-Net does for this plans file (nnUNetPlans.json) and its
    /// --configuration (default 3d_fullres): its crop, normalization and resampling on its
    /// transposed grid, for training nnU-Net's network on this cache. Not with --pipeline,
    /// --spacing, --normalization, --previous-stage, --dry-run or an s3:// cache.
    #[arg(value_parser = local_path, long, value_name = "PLANS.json")]
    nnunet_plans: Option<PathBuf>,
}

#[derive(Args)]
struct SynthArgs {
    /// Output folder.
    #[arg(value_parser = local_path, long, default_value = "synthetic")]
    out: PathBuf,
    /// small (the bundled dataset), minivess (70 volumes of 512x512x5..110, ~6 GB raw),
    /// outlier (the single 512x512x61 volume at 4.97x4.97x5 um from the user story),
    /// multichannel (10 small cases of two channels, one named CT, labels 0-2 and ignore 3),
    /// thin (10 cases at 1 um of branching vessels one to three voxels across), ct-like (12
    /// cases of 512x512 at 0.62-0.98 and 30-90 slices of 2.5 or 5: mixed anisotropy, where
    /// nnU-Net plans 3d_lowres), mri-like (12 cases near 1 isotropic, 160-192 x 192-224 x
    /// 140-176), brats-like (12 cases of four contrasts and three nested tumour regions) or
    /// organs (12 cases of two organs wider than a small patch, classed by a small core: the
    /// cascade's case).
    #[arg(long, default_value = "small")]
    preset: synth::SynthPreset,
    #[arg(long, default_value_t = 7)]
    seed: u64,
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
    println!("layout {}", r.layout);
}

fn run_build(args: BuildArgs, given: &Given) -> Result<Exit> {
    // An option the build does not take is refused before anything is read.
    let on_s3 = matches!(
        voxcache::remote::Location::parse(&args.cache_dir)?,
        voxcache::remote::Location::S3(_)
    );
    voxcache::config::modes::build::check(given, args.dry_run, args.nnunet_plans.is_some(), on_s3)?;
    let remote = args.s3.options_for(&args.cache_dir, false)?;
    // With nnU-Net's plans, --configuration names one of its configurations.
    let mut flags = args.settings.clone();
    let nnunet = voxcache::config::modes::build::nnunet_source(args.nnunet_plans, &mut flags);
    let settings = resolve(&flags)?;
    let source = dataset_source(args.data, args.images, args.labels)?;
    if !args.dry_run {
        cache_apart(&args.cache_dir, &source, args.previous_stage.as_deref())?;
    }
    let opts = BuildOptions {
        source,
        cache_dir: args.cache_dir,
        remote,
        name: args.name,
        settings,
        jobs: args.jobs,
        dry_run: args.dry_run,
        part: args.part,
        progress: !args.quiet && !args.json,
        quiet: args.quiet,
        fixed_params: None,
        previous_stage: args.previous_stage,
        nnunet,
    };
    let report = build_cache(&opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.dry_run {
        println!("layout {}", report.layout);
        if let Some(d) = &report.decision {
            print!("{}", render_plan(d, &report.plans, report.image_dtype));
        }
    } else {
        print_summary(&report);
    }
    Ok(Exit::unless_failed(report.failed > 0))
}

fn run_synth(args: SynthArgs) -> Result<Exit> {
    let specs = synth::preset_cases(args.preset, args.seed);
    let total = specs.len();
    synth::write_dataset_as(
        &args.out,
        &specs,
        args.seed,
        args.preset.layout(),
        |i, s| {
            eprintln!(
                "[{}/{total}] {} {:?} at {:?}",
                i + 1,
                s.id,
                s.shape_xyz,
                s.spacing_xyz
            );
        },
    )?;
    println!("wrote {total} cases to {}", args.out.display());
    Ok(Exit::Success)
}

#[derive(Args)]
struct InspectArgs {
    /// A dataset folder (imagesTr/ or .nii(.gz) files) or a cache folder (manifest.json, entries/);
    /// with --nnunet-model, inputs (files or folders) to forecast predicting.
    #[arg(required_unless_present = "nnunet_model")]
    path: Option<PathBuf>,
    /// More inputs to forecast, with --nnunet-model.
    #[arg(requires = "nnunet_model")]
    more: Vec<PathBuf>,
    /// An nnU-Net v2 results folder (TRAINER__PLANS__CONFIGURATION): what the model expects
    /// and, for the inputs given, the forecast of predicting them.
    #[arg(long, value_name = "DIR")]
    nnunet_model: Option<PathBuf>,
    /// The checkpoint file of each fold, with --nnunet-model.
    #[arg(long, default_value = "checkpoint_final.pth")]
    nnunet_checkpoint: String,
    /// The cache options of build-cache: the dataset forecast is of the build they would make
    /// (--spacing x,y,z asks "what if").
    #[command(flatten)]
    settings: PrepFlags,
    #[command(flatten)]
    s3: S3Flags,
    /// Print the report as one JSON document (shape documented in voxcache::inspect).
    #[arg(long)]
    json: bool,
    /// Cache: re-hash every chunk against the checksums in its entry's attributes; exit 1 on any corrupt or missing.
    #[arg(long)]
    verify: bool,
    /// Dataset: read headers only (no intensity or label statistics).
    #[arg(long)]
    headers_only: bool,
    /// Cases read at once (each streams its files: a few MiB each, whatever their size).
    #[arg(long, short = 'j', default_value_t = 2)]
    jobs: usize,
    /// Draw this case's three middle slices with its label overlay (needs --out).
    #[arg(long, value_name = "CASE", requires = "out")]
    preview: Option<String>,
    /// PNG file for --preview.
    #[arg(value_parser = local_path, long, value_name = "FILE.png", requires = "preview")]
    out: Option<PathBuf>,
    /// The image channel --preview draws (CASE_0001 is channel 1).
    #[arg(long, default_value_t = 0, requires = "preview")]
    channel: usize,
}

/// Exit 0: no problem is an error; 1: some problem is (or --verify found damage); 2: cannot inspect.
fn run_inspect(args: InspectArgs, given: &Given) -> Result<Exit> {
    use voxcache::inspect;
    inspect_modes(&args, given)?;
    // S3 options apply to a cache on S3 only (not a dataset, a local cache or an nnU-Net model).
    let remote = args.s3.options_for(
        match (&args.nnunet_model, &args.path) {
            (None, Some(p)) => p.as_path(),
            _ => std::path::Path::new(""),
        },
        true,
    )?;
    if let Some(dir) = &args.nnunet_model {
        let inputs: Vec<PathBuf> = args.path.iter().chain(&args.more).cloned().collect();
        let report =
            inspect::nnunet::inspect_nnunet(dir, &args.nnunet_checkpoint, &inputs, 256 << 20)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.to_text());
        }
        return Ok(Exit::Success);
    }
    // A cache on S3 is read from its local tier; --verify downloads it afresh.
    let view = local_for_reading(
        &args.path.clone().unwrap_or_default(),
        &remote,
        args.verify,
        Fill::Whole,
    )?;
    if let Some(line) = view.describe() {
        eprintln!("{line}");
    }
    let path = view.path.clone();
    if let (Some(case), Some(out)) = (&args.preview, &args.out) {
        // The picture goes beside a dataset's inputs, never over one of them, and never into
        // a cache (inspect does not write there).
        let read = [("the inspected folder", path.as_path())];
        if path.join("manifest.json").is_file() {
            voxcache::util::paths::refuse_overlap("--out", out, &read)?;
        } else {
            voxcache::util::paths::refuse_overwrite("--out", out, &read)?;
        }
        let info = inspect::write_preview(&path, case, args.channel, out)?;
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
        return Ok(Exit::Success);
    }
    let opts = inspect::InspectOptions {
        settings: resolve(&args.settings)?,
        verify: args.verify,
        read_voxels: !args.headers_only,
        jobs: args.jobs,
        ..inspect::InspectOptions::new(&path)
    };
    let mut report = inspect::inspect(&opts)?;
    // A cache on S3 is named by its URL (the local tier it was read through is on stderr).
    if let Some((url, _)) = &view.fetched {
        report.path = url.clone();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(Exit::unless_failed(report.errors > 0))
}

/// `prep inspect`'s options of one kind of path only (a dataset, a cache, an nnU-Net model),
/// refused with the others, naming the option and the kind.
fn inspect_modes(args: &InspectArgs, given: &Given) -> Result<()> {
    // The build options (spacing, chunk, normalization...): what a dataset would be built with.
    let build_flags: Vec<String> = PrepFlags::augment_args(clap::Command::new("prep"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let build: Vec<&str> = build_flags.iter().map(String::as_str).collect();
    if args.nnunet_model.is_some() {
        let mut ids = vec![
            "verify",
            "headers_only",
            "preview",
            "out",
            "channel",
            "jobs",
        ];
        ids.extend(&build);
        given.refuse(&ids, "prep inspect --nnunet-model", |_| None)?;
        return Ok(());
    }
    given.refuse(
        &["nnunet_checkpoint"],
        "prep inspect of a dataset or a cache",
        |_| Some("it goes with --nnunet-model".into()),
    )?;
    let path = args.path.clone().unwrap_or_default();
    // The kind inspect itself will see; a path of neither kind fails there, naming it.
    let kind = if path.to_string_lossy().starts_with("s3://") {
        Some(voxcache::inspect::Kind::Cache)
    } else {
        voxcache::inspect::detect(&path).ok()
    };
    if kind == Some(voxcache::inspect::Kind::Cache) {
        let mut ids = vec!["headers_only"];
        ids.extend(&build);
        given.refuse(&ids, "a cache", |_| {
            Some("it is an option of a dataset's forecast (inspect the dataset folder)".into())
        })?;
    } else if kind == Some(voxcache::inspect::Kind::Dataset) {
        given.refuse(&["verify"], "a dataset", |_| {
            Some("it checks a built cache (give the cache folder)".into())
        })?;
    }
    Ok(())
}

fn main() -> ExitCode {
    voxcache::config::exit::quiet_on_closed_pipe();
    let cmd = Cli::command();
    let matches = cmd.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // What was typed of the subcommand's own options.
    let given = match matches.subcommand() {
        Some((name, sub)) => cmd
            .find_subcommand(name)
            .map(|c| Given::of(c, sub))
            .unwrap_or_default(),
        None => Given::default(),
    };
    let result = match cli.command {
        Command::BuildCache(a) => run_build(*a, &given),
        Command::Synth(a) => run_synth(a),
        Command::Inspect(a) => run_inspect(*a, &given),
        Command::Plan(a) => run_plan(a),
    };
    voxcache::config::exit::finish(result)
}
