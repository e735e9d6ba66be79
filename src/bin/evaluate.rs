//! `evaluate`: compare segmentations with reference ones. Arguments are parsed here; the work
//! belongs to `voxcache::evaluate`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use voxcache::config::exit::EXIT_STATUS_HELP;
use voxcache::config::Exit;
use voxcache::evaluate::pairs::parse_labels;
use voxcache::evaluate::report::CaseOutcome;
use voxcache::evaluate::{evaluate, EvaluateOptions};
use voxcache::util::sysinfo::human_bytes;

/// Compare segmentations with references: per case and class Dice, IoU, centreline Dice
/// (clDice), 95th-percentile Hausdorff distance (HD95), average surface distance (ASD) and
/// volumes, in the headers' physical units, then the mean over cases.
///
/// clDice (Shit et al. 2021) is the harmonic mean of the share of the prediction's skeleton
/// inside the reference and of the reference's skeleton inside the prediction; a broken thin
/// vessel lowers it much more than Dice. Skeletons: the 3-D thinning the cache stores
/// (`--derived skeleton`), block by block.
///
/// Distances follow MONAI's HausdorffDistanceMetric and SurfaceDistanceMetric (symmetric):
/// between the centres of edge voxels (voxels with a 6-neighbour outside the class), scaled by
/// the header's pixdim; HD95 is the larger of the two directed 95th percentiles, ASD the mean of
/// both directions' distances. A class absent from both files has no Dice ("-", null in JSON);
/// absent from one, Dice 0 and infinite distances ("inf", null in JSON). Means are over the
/// cases where a value is defined.
#[derive(Parser, Debug)]
#[command(name = "evaluate", version, after_help = EXIT_STATUS_HELP)]
struct Cli {
    /// A segmentation (.nii, .nii.gz) or a folder of them (CASE.nii.gz, as predict writes).
    predictions: PathBuf,
    /// The reference segmentation, or a folder of them matched by case id (a dataset folder:
    /// its labelsTs/ or labelsTr/).
    reference: PathBuf,
    /// dataset.json naming the classes, regions and ignore label (default: one found in the
    /// reference folder or the folder above it; without one, every non-zero value is a class).
    #[arg(long)]
    dataset_json: Option<PathBuf>,
    /// Classes to measure: values, regions as 1+2+3, optionally named: `vessel=1,tumour=1+2`.
    #[arg(long)]
    labels: Option<String>,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Leave out centreline Dice (clDice), which thins both segmentations to their skeletons
    /// and keeps both in the temporary folder (TMPDIR, 4 bytes a voxel) while a case is measured.
    #[arg(long)]
    no_cldice: bool,
    /// Cases measured at once.
    #[arg(short = 'j', long, default_value_t = 2)]
    jobs: usize,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

fn main() -> ExitCode {
    voxcache::config::exit::quiet_on_closed_pipe();
    let cli = Cli::parse();
    voxcache::config::exit::finish(real_main(cli))
}

fn real_main(cli: Cli) -> Result<Exit> {
    let labels = cli
        .labels
        .as_deref()
        .map(parse_labels)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--labels: {e}"))?;
    let report = evaluate(&EvaluateOptions {
        predictions: cli.predictions,
        reference: cli.reference,
        dataset_json: cli.dataset_json,
        labels,
        cldice: !cli.no_cldice,
        jobs: cli.jobs,
        progress: !cli.quiet,
    })?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &cli.summary {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    for c in &report.cases {
        if let CaseOutcome::Failed { error } = &c.outcome {
            // The error names the case or the file already.
            eprintln!("error: {error}");
        }
    }
    if cli.json {
        println!("{json}");
    } else {
        print!("{}", report.table());
        if !report.without_prediction.is_empty() {
            println!(
                "{} reference cases have no prediction (not measured): {}",
                report.without_prediction.len(),
                report.without_prediction.join(", ")
            );
        }
        println!(
            "{} evaluated, {} failed; {:.1} s; peak RSS {}",
            report.evaluated,
            report.failed,
            report.wall_seconds,
            report
                .peak_rss_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "?".into())
        );
    }
    Ok(Exit::unless_failed(report.failed > 0))
}
