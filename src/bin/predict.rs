//! `predict`: segment new volumes with a model `train` made. Arguments are parsed here; the
//! work belongs to `voxcache::infer::predict`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use voxcache::config::exit::EXIT_STATUS_HELP;
use voxcache::config::Exit;
use voxcache::infer::model_dir::Which;
use voxcache::infer::postprocess::PostprocessingChoice;
use voxcache::infer::predict::{predict, PredictOptions, PredictOutcome};
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
    /// Run folder made by `train` (or one of its checkpoint folders, copied anywhere). Give it
    /// several times for an ensemble (nnU-Net's five folds: --model fold_0 ... --model fold_4):
    /// the members' class probabilities are averaged, in one accumulator on disk.
    #[arg(long, required = true)]
    model: Vec<PathBuf>,
    /// Postprocessing decision file to apply (default: the postprocessing.json that `evaluate
    /// --cv` wrote beside the models, if they carry one).
    #[arg(long, value_name = "FILE", conflicts_with = "no_postprocessing")]
    postprocessing: Option<PathBuf>,
    /// Apply no postprocessing, even one recorded beside the models.
    #[arg(long)]
    no_postprocessing: bool,
    /// best (the best validation Dice, else the latest), latest, or a checkpoint folder.
    #[arg(long, default_value = "best")]
    checkpoint: String,
    /// NIfTI files (CASE_0000.nii.gz, CASE_0001... are one case's channels) or folders of them
    /// (an nnU-Net imagesTs/ or imagesTr/, or the folder holding one).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// cpu, cuda or cuda:N (cuda needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Overlap of neighbouring windows (0..1).
    #[arg(long, default_value_t = 0.5)]
    overlap: f64,
    /// Test-time mirroring over the axes the model was trained to flip (8 passes).
    #[arg(long)]
    mirror: bool,
    /// Windows per forward pass.
    #[arg(long, default_value_t = 2)]
    batch: usize,
    /// Worker threads for preprocessing.
    #[arg(short = 'j', long, default_value_t = 2)]
    jobs: usize,
    /// Also write each case's class probabilities on its input grid: CASE.probabilities.zarr,
    /// a float16 Zarr v3 array (class, z, y, x) whose attributes name the classes.
    #[arg(long)]
    save_probabilities: bool,
    /// Memory for the sliding window's accumulator, MiB: beyond it the slices are cut into
    /// bands along y, each swept on its own (the same probabilities; windows on band borders
    /// run twice).
    #[arg(long, default_value_t = 256)]
    window_memory_mib: usize,
    /// Strict memory mode, as train's --mapped-mib: MiB of scratch-cache pages the maps may
    /// bring into the resident set before handing them back (default: no limit; they are page
    /// cache). For containers that bill page cache (docs/usage.md, "Memory").
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    mapped_mib: Option<u64>,
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
    let cli = Cli::parse();
    voxcache::config::exit::finish(real_main(cli))
}

fn real_main(cli: Cli) -> Result<Exit> {
    let opts = PredictOptions {
        models: cli.model,
        postprocessing: match (cli.postprocessing, cli.no_postprocessing) {
            (Some(f), _) => PostprocessingChoice::File(f),
            (None, true) => PostprocessingChoice::Off,
            (None, false) => PostprocessingChoice::Recorded,
        },
        which: cli.checkpoint.parse::<Which>()?,
        inputs: cli.inputs,
        cases: Vec::new(),
        out: cli.out,
        device: cli.device,
        overlap: cli.overlap,
        mirror: cli.mirror,
        batch: cli.batch,
        jobs: cli.jobs,
        save_probabilities: cli.save_probabilities,
        window_memory: cli.window_memory_mib << 20,
        mapped_mib: cli.mapped_mib,
        quiet: cli.quiet,
    };
    let report = predict(&opts)?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
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
    Ok(Exit::unless_failed(report.failed > 0))
}
