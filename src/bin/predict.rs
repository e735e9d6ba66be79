//! `predict`: segment new volumes with a model `train` made. Arguments are parsed here; the
//! work belongs to `voxcache::infer::predict`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser};
use voxcache::cache::s3::RemoteOptions;
use voxcache::config::exit::EXIT_STATUS_HELP;
use voxcache::config::location::{local_models, local_path};
use voxcache::config::modes::Given;
use voxcache::config::Exit;
use voxcache::infer::model_dir::Which;
use voxcache::infer::nnunet::{predict_nnunet, NnunetPredictOptions};
use voxcache::infer::postprocess::PostprocessingChoice;
use voxcache::infer::predict::{predict, PredictOptions, PredictOutcome, PredictReport};
use voxcache::util::sysinfo::human_bytes;

/// Segment NIfTI volumes with a trained model, in bounded memory, each written as CASE.nii.gz
/// in its input's own geometry (dims, pixdim, qform, sform and codes).
///
/// Each input is preprocessed as the model's training cache was (target spacing, normalization
/// with the training set's statistics), predicted with Gaussian-weighted sliding windows, and
/// its class probabilities resampled back to the input grid before the argmax.
#[derive(Parser, Debug)]
#[command(name = "predict", version, after_help = EXIT_STATUS_HELP)]
struct Cli {
    /// Run folder made by `train` (or one of its checkpoint folders, copied anywhere), local or
    /// uploaded as it is to s3://BUCKET/PREFIX. Give it several times for an ensemble
    /// (nnU-Net's five folds: --model fold_0 ... --model fold_4): the members' class
    /// probabilities are averaged, in one accumulator on disk.
    #[arg(long, required_unless_present_any = ["nnunet_model", "dataset"], conflicts_with_all = ["nnunet_model", "dataset"])]
    model: Vec<PathBuf>,
    /// A model trained by nnU-Net v2: its results folder TRAINER__PLANS__CONFIGURATION
    /// (plans.json, dataset.json, fold_K/checkpoint_final.pth), predicted as nnUNetv2_predict
    /// does (its preprocessing, window placement, mirroring, fold ensemble and export).
    #[arg(long, value_name = "DIR", conflicts_with = "dataset", value_parser = local_path)]
    nnunet_model: Option<PathBuf>,
    /// nnU-Net's spelling instead of --nnunet-model: the dataset (id or DatasetXXX_Name) under
    /// $nnUNet_results, with -c, -tr, -p.
    #[arg(short = 'd', long, value_name = "DATASET", requires = "configuration")]
    dataset: Option<String>,
    /// nnU-Net's configuration (3d_fullres, 3d_lowres, 2d), with -d.
    #[arg(short = 'c', long, value_name = "CONFIG")]
    configuration: Option<String>,
    /// nnU-Net's trainer (also -tr), with -d.
    #[arg(long, default_value = "nnUNetTrainer")]
    trainer: String,
    /// nnU-Net's plans identifier, with -d.
    #[arg(short = 'p', long, default_value = "nnUNetPlans")]
    plans: String,
    /// Folds of an nnU-Net model to ensemble (default: every fold_K present), e.g. 0,1,2,3,4
    /// or -f 0 1 2 3 4.
    #[arg(short = 'f', long, value_delimiter = ',')]
    folds: Option<Vec<String>>,
    /// Checkpoint file of each nnU-Net fold (also -chk).
    #[arg(long, default_value = "checkpoint_final.pth")]
    nnunet_checkpoint: String,
    /// The window step as a fraction of the patch (nnU-Net's -step_size); for models made by
    /// train, the same as --overlap 1-STEP.
    #[arg(long, default_value_t = 0.5)]
    step_size: f64,
    /// No test-time mirroring (nnU-Net's --disable_tta): nnU-Net models mirror by default,
    /// models made by train only with --mirror.
    #[arg(long)]
    disable_tta: bool,
    /// Postprocessing decision file to apply (default: the postprocessing.json that `evaluate
    /// --cv` wrote beside the models, if they carry one; for an nnU-Net model, the one in its
    /// crossval_results_folds_* folder, as nnUNetv2_apply_postprocessing would apply it).
    #[arg(long, value_name = "FILE", conflicts_with = "no_postprocessing")]
    postprocessing: Option<PathBuf>,
    /// Apply no postprocessing, even one recorded beside the models (for an nnU-Net model:
    /// nnUNetv2_predict's own output).
    #[arg(long)]
    no_postprocessing: bool,
    /// Models made by train: best (the best validation Dice, else the latest), latest, or a
    /// checkpoint folder (nnU-Net models: --nnunet-checkpoint).
    #[arg(long, default_value = "best")]
    checkpoint: String,
    /// NIfTI files (CASE_0000.nii.gz, CASE_0001... are one case's channels) or folders of them
    /// (an nnU-Net imagesTs/ or imagesTr/, or the folder holding one).
    #[arg(required_unless_present = "input")]
    inputs: Vec<PathBuf>,
    /// Input files or folder, nnU-Net's -i (the same as giving them as arguments).
    #[arg(short = 'i', long = "input", value_name = "PATH")]
    input: Vec<PathBuf>,
    /// Output folder.
    #[arg(value_parser = local_path, short = 'o', long)]
    out: PathBuf,
    /// cpu, cuda or cuda:N (cuda needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Overlap of neighbouring windows (0..1); for an nnU-Net model, its step size 1-OVERLAP.
    #[arg(long, default_value_t = 0.5)]
    overlap: f64,
    /// Test-time mirroring over the axes the model was trained to flip (8 passes); nnU-Net
    /// models mirror by default (--disable-tta turns it off).
    #[arg(long)]
    mirror: bool,
    /// Windows per forward pass. One, as nnU-Net predicts: each window's activations cost
    /// memory (about 0.4 GB a window at a 40x160x160 patch with 32 features). With mirroring,
    /// a batch's flipped copies join its pass where that pass is forecast under 256 MiB.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// The convolutions' arithmetic: f32, or bf16 (products in bfloat16, sums in f32; on the
    /// CPU with AVX512-BF16, elsewhere f32). Default: what the model was trained in (f32 for
    /// nnU-Net models, whose f32 output is nnU-Net's voxel for voxel).
    #[arg(long, value_name = "f32|bf16")]
    precision: Option<voxcache::format::training::network::Precision>,
    /// Models made by train: worker threads for preprocessing.
    #[arg(short = 'j', long, default_value_t = 2)]
    jobs: usize,
    /// Also write each case's class probabilities on its input grid: CASE.probabilities.zarr,
    /// a float16 Zarr v3 array (class, z, y, x) whose attributes name the classes. With an
    /// nnU-Net model, nnU-Net's own files instead: CASE.npz (float32) and CASE.pkl.
    #[arg(long)]
    save_probabilities: bool,
    /// Memory for the sliding window's accumulator, MiB: beyond it the slices are cut into
    /// bands along y, each swept on its own (the same probabilities; windows on band borders
    /// run twice).
    #[arg(long, default_value_t = 256)]
    window_memory_mib: usize,
    /// Models made by train: strict memory mode, as train's --mapped-mib: MiB of scratch-cache pages the maps may
    /// bring into the resident set before handing them back (default: no limit; they are page
    /// cache). For containers that bill page cache (docs/usage.md, "Memory").
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    mapped_mib: Option<u64>,
    /// A cascade's second stage (a model trained on a cache built with --previous-stage): the
    /// folder of the first stage's segmentations of the inputs (CASE.nii.gz), as predict with
    /// the 3d_lowres model writes them.
    #[arg(value_parser = local_path, long, value_name = "DIR")]
    previous_stage: Option<PathBuf>,
    /// A cascade's first stage (repeat for its folds): predicted first, into --previous-stage
    /// DIR or else OUT/previous_stage/, then the --model stage with those segmentations.
    #[arg(long, value_name = "RUN_DIR")]
    previous_model: Vec<PathBuf>,
    /// For models on S3: the server (default: AWS_ENDPOINT_URL, the profile's endpoint_url,
    /// else AWS itself).
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// For models on S3: the local folder they are brought into, each under BUCKET/PREFIX
    /// (default: ~/.cache/voxcache/s3). Only the checkpoint --checkpoint picks comes, and
    /// again only when it changed.
    #[arg(long, value_name = "DIR", value_parser = local_path)]
    local_cache: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Print only errors.
    #[arg(short, long)]
    quiet: bool,
}

fn main() -> ExitCode {
    voxcache::config::exit::quiet_on_closed_pipe();
    voxcache::model::device::default_cpu_threads();
    let args = join_folds(std::env::args_os().map(nnunet_spelling).collect());
    let cmd = Cli::command();
    let matches = cmd.clone().get_matches_from(args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = Given::of(&cmd, &matches);
    voxcache::config::exit::finish(real_main(cli, &given))
}

/// The options of one kind of model only: refused with the other (named, with what to give
/// instead), or taken as their equivalent where there is one (`--overlap` is nnU-Net's step
/// size 1 - overlap, `--mirror` its test-time mirroring, and the other way round).
fn check_modes(cli: &mut Cli, given: &Given, nnunet: bool) -> Result<()> {
    given.one_of("overlap", "step_size")?;
    given.one_of("mirror", "disable_tta")?;
    if nnunet {
        given.refuse(
            &[
                "checkpoint",
                "jobs",
                "mapped_mib",
                "s3_endpoint",
                "local_cache",
                "previous_stage",
                "previous_model",
            ],
            "nnU-Net models (--nnunet-model, -d)",
            |id| match id {
                "checkpoint" => Some("give --nnunet-checkpoint FILE (nnU-Net's -chk)".into()),
                "s3_endpoint" | "local_cache" => {
                    Some("nnU-Net results folders are read from a local folder".into())
                }
                "previous_stage" | "previous_model" => {
                    Some("nnU-Net's cascade (3d_cascade_fullres) is not supported yet".into())
                }
                _ => None,
            },
        )?;
        if cli.nnunet_model.is_some() {
            given.refuse(
                &["configuration", "trainer", "plans"],
                "nnU-Net models given as --nnunet-model DIR",
                |_| Some("it picks a results folder under $nnUNet_results with -d; --nnunet-model names the folder itself".into()),
            )?;
        }
        if given.has("overlap") {
            anyhow::ensure!(
                (0.0..1.0).contains(&cli.overlap),
                "--overlap {:?}: give the share of a window its neighbour overlaps, in [0, 1)",
                cli.overlap
            );
            cli.step_size = 1.0 - cli.overlap;
        }
    } else {
        let on_s3 = cli
            .model
            .iter()
            .chain(&cli.previous_model)
            .any(|m| m.to_string_lossy().starts_with("s3://"));
        if !on_s3 {
            given.refuse(
                &["s3_endpoint", "local_cache"],
                "local models made by train",
                |_| Some("it applies to models on S3 (--model s3://BUCKET/PREFIX)".into()),
            )?;
        }
        given.refuse(
            &[
                "folds",
                "nnunet_checkpoint",
                "configuration",
                "trainer",
                "plans",
            ],
            "models made by train (--model)",
            |id| match id {
                "folds" => Some("give each fold's run folder as its own --model".into()),
                "nnunet_checkpoint" => Some("give --checkpoint best|latest|FOLDER".into()),
                _ => Some("it names an nnU-Net results folder (with -d)".into()),
            },
        )?;
        if given.has("step_size") {
            anyhow::ensure!(
                cli.step_size > 0.0 && cli.step_size <= 1.0,
                "--step-size {:?}: give the window step as a share of the window, in (0, 1]",
                cli.step_size
            );
            cli.overlap = 1.0 - cli.step_size;
        }
        if given.has("disable_tta") {
            cli.mirror = false;
        }
    }
    Ok(())
}

/// nnU-Net's single-dash multi-letter flags (`-tr`, `-chk`, `-step_size`...) and underscore
/// spellings as ours.
fn nnunet_spelling(arg: std::ffi::OsString) -> std::ffi::OsString {
    let ours = match arg.to_str() {
        Some("-tr") => "--trainer",
        Some("-chk") => "--nnunet-checkpoint",
        Some("-step_size") => "--step-size",
        Some("-device") => "--device",
        Some("--disable_tta") => "--disable-tta",
        Some("--save_probabilities") => "--save-probabilities",
        _ => return arg,
    };
    ours.into()
}

/// nnU-Net's `-f 0 1 2` as `-f 0,1,2`: the fold numbers after -f/--folds joined into one value,
/// so that the inputs after them stay inputs.
fn join_folds(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let is_fold = |a: &std::ffi::OsString| {
        a.to_str().is_some_and(|s| {
            s == "all"
                || s.split(',')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        let folds = a == "-f" || a == "--folds";
        out.push(a);
        if folds {
            let mut joined: Vec<String> = Vec::new();
            while let Some(next) = it.peek() {
                if !is_fold(next) {
                    break;
                }
                joined.push(next.to_string_lossy().to_string());
                it.next();
            }
            if !joined.is_empty() {
                out.push(joined.join(",").into());
            }
        }
    }
    out
}

fn real_main(mut cli: Cli, given: &Given) -> Result<Exit> {
    cli.inputs.append(&mut cli.input);
    let nnunet = cli.nnunet_model.is_some() || cli.dataset.is_some();
    check_modes(&mut cli, given, nnunet)?;
    let bf16 = cli.precision == Some(voxcache::format::training::network::Precision::Bf16);
    if bf16 && cli.device == "cpu" && !voxcache::model::ops::direct::bf16_dot_products() {
        eprintln!(
            "note: precision bf16: this CPU's convolutions compute in f32 (it has no AVX512-BF16, \
             its bf16 dot products are slower than its f32 FMAs, or VOXCACHE_SIMD or \
             VOXCACHE_BF16 says so)"
        );
    }
    let nnunet_dir = match (&cli.nnunet_model, &cli.dataset) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(ds)) => Some(voxcache::infer::nnunet::model::results_dir_from_env(
            ds,
            cli.configuration.as_deref().unwrap_or("3d_fullres"),
            &cli.trainer,
            &cli.plans,
        )?),
        (None, None) => None,
    };
    if let Some(dir) = nnunet_dir {
        let flag = if cli.dataset.is_some() {
            "-d's results folder"
        } else {
            "--nnunet-model"
        };
        output_apart(&cli.out, &cli.inputs, &[(flag, dir.as_path())])?;
        let opts = NnunetPredictOptions {
            model: dir,
            folds: cli.folds,
            checkpoint: cli.nnunet_checkpoint,
            inputs: cli.inputs,
            out: cli.out,
            device: cli.device,
            step: cli.step_size,
            mirror: !cli.disable_tta,
            batch: cli.batch,
            precision: cli.precision,
            window_memory: cli.window_memory_mib << 20,
            postprocessing: postprocessing_choice(cli.postprocessing, cli.no_postprocessing),
            save_probabilities: cli.save_probabilities,
            quiet: cli.quiet,
        };
        let report = predict_nnunet(&opts)?;
        return Ok(print_report(&report, cli.json));
    }
    anyhow::ensure!(
        (0.0..1.0).contains(&cli.overlap),
        "--overlap {:?}: give the share of a window its neighbour overlaps, in [0, 1) (default 0.5)",
        cli.overlap
    );
    let which = cli.checkpoint.parse::<Which>()?;
    let remote = RemoteOptions {
        endpoint: cli.s3_endpoint,
        local: cli.local_cache,
        budget: None,
    };
    let (models, mut fetched) = local_models(&cli.model, &remote, &which)?;
    let (previous_models, more) = local_models(&cli.previous_model, &remote, &which)?;
    fetched.extend(more);
    let mut read: Vec<(&str, &std::path::Path)> = Vec::new();
    read.extend(
        cli.model
            .iter()
            .chain(&models)
            .map(|m| ("--model", m.as_path())),
    );
    read.extend(
        cli.previous_model
            .iter()
            .chain(&previous_models)
            .map(|m| ("--previous-model", m.as_path())),
    );
    // Without --previous-model, --previous-stage is read (with it, the first stage writes there).
    if let (Some(p), true) = (&cli.previous_stage, cli.previous_model.is_empty()) {
        read.push(("--previous-stage", p.as_path()));
    }
    output_apart(&cli.out, &cli.inputs, &read)?;
    if !cli.quiet {
        for line in fetched {
            eprintln!("{line}");
        }
    }
    let opts = PredictOptions {
        models,
        postprocessing: postprocessing_choice(cli.postprocessing, cli.no_postprocessing),
        which,
        inputs: cli.inputs,
        cases: Vec::new(),
        out: cli.out,
        device: cli.device,
        overlap: cli.overlap,
        mirror: cli.mirror,
        batch: cli.batch,
        precision: cli.precision,
        jobs: cli.jobs,
        save_probabilities: cli.save_probabilities,
        window_memory: cli.window_memory_mib << 20,
        mapped_mib: cli.mapped_mib,
        quiet: cli.quiet,
        previous_stage: cli.previous_stage,
        previous_models,
    };
    let report = predict(&opts)?;
    Ok(print_report(&report, cli.json))
}

/// Refuse an output folder that is, holds or is inside a model folder (`models`) or an input,
/// before anything is written.
fn output_apart(
    out: &std::path::Path,
    inputs: &[PathBuf],
    models: &[(&str, &std::path::Path)],
) -> Result<()> {
    let mut read = models.to_vec();
    read.extend(inputs.iter().map(|i| ("the input", i.as_path())));
    voxcache::util::paths::refuse_overlap("--out", out, &read)?;
    Ok(())
}

/// The postprocessing flags as one choice.
fn postprocessing_choice(file: Option<PathBuf>, off: bool) -> PostprocessingChoice {
    match (file, off) {
        (Some(f), _) => PostprocessingChoice::File(f),
        (None, true) => PostprocessingChoice::Off,
        (None, false) => PostprocessingChoice::Recorded,
    }
}

/// Print what a predict did; its exit status.
fn print_report(report: &PredictReport, json: bool) -> Exit {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
    } else {
        for c in &report.cases {
            if let PredictOutcome::Failed { error } = &c.outcome {
                // The error names the case or its file already.
                eprintln!("error: {error}");
            }
        }
        println!(
            "{} predicted, {} already there, {} failed; {:.1} Mvoxel/s; {:.1} windows/s; {:.1} s; peak memory {}",
            report.predicted,
            report.existing,
            report.failed,
            report.voxels as f64 / report.wall_seconds.max(1e-9) / 1e6,
            report.windows as f64 / report.window_seconds.max(1e-9),
            report.wall_seconds,
            match (report.peak_anon_bytes, report.peak_file_bytes) {
                (Some(anon), Some(file)) => format!(
                    "{} anonymous, {} file-backed",
                    human_bytes(anon),
                    human_bytes(file)
                ),
                _ => report
                    .peak_rss_bytes
                    .map(|b| format!("RSS {}", human_bytes(b)))
                    .unwrap_or_else(|| "?".into()),
            }
        );
    }
    Exit::unless_failed(report.failed > 0)
}
