//! `evaluate`: compare segmentations with reference ones. Arguments are parsed here; the work
//! belongs to `voxcache::evaluate`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use voxcache::config::exit::EXIT_STATUS_HELP;
use voxcache::config::location::local_path;
use voxcache::config::modes::evaluate::{check, EvaluateMode};
use voxcache::config::modes::Given;
use voxcache::config::Exit;
use voxcache::evaluate::best::{find_best, BestOptions};
use voxcache::evaluate::crossval::{cross_validate, find_folds, CrossValOptions};
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
///
/// Modes: PRED GT (not --out or --no-postprocessing), --cv RUN... (not --labels or
/// --dataset-json: the classes are the runs'), --best CONFIG... (neither, nor
/// --no-postprocessing). An option refused is named with its mode (exit 2).
#[derive(Parser, Debug)]
#[command(name = "evaluate", version, after_help = EXIT_STATUS_HELP)]
struct Cli {
    /// A segmentation (.nii, .nii.gz) or a folder of them (CASE.nii.gz, as predict writes).
    #[arg(required_unless_present_any = ["cv", "best"])]
    predictions: Option<PathBuf>,
    /// The reference segmentation, or a folder of them matched by case id (a dataset folder:
    /// its labelsTs/ or labelsTr/).
    #[arg(required_unless_present_any = ["cv", "best"])]
    reference: Option<PathBuf>,
    /// Cross-validation: score the fold runs' validation predictions together (fold run
    /// folders, or a folder holding them, as `train --fold 0,1,2,3,4 --out DIR` makes), decide
    /// nnU-Net's postprocessing on them and write the decision beside each fold's model.
    #[arg(long, value_name = "RUN", num_args = 1.., conflicts_with_all = ["predictions", "reference"])]
    cv: Option<Vec<PathBuf>>,
    /// Best configuration: one folder of fold runs per configuration (as `train --fold
    /// 0,1,2,3,4 --out DIR` makes); each is cross-validated, each pair ensembled from the folds'
    /// kept validation probabilities, all ranked by mean foreground Dice; prints the winner's
    /// postprocessing and its predict command.
    #[arg(long, value_name = "CONFIG", num_args = 1.., conflicts_with_all = ["predictions", "reference", "cv"])]
    best: Option<Vec<PathBuf>>,
    /// With --cv: the folder for its summary.json, postprocessing.json and postprocessed
    /// predictions [default: crossval/ beside the folds]. With --best: the folder for the
    /// ensembles and best.json [default: best/ beside the first configuration].
    #[arg(long, value_parser = local_path)]
    out: Option<PathBuf>,
    /// With --cv: score only; decide no postprocessing.
    #[arg(long)]
    no_postprocessing: bool,
    /// dataset.json naming the classes, regions and ignore label (default: one found in the
    /// reference folder or the folder above it; without one, every non-zero value is a class).
    /// Not with --cv or --best.
    #[arg(long)]
    dataset_json: Option<PathBuf>,
    /// Classes to measure: values, regions as 1+2+3, optionally named: `vessel=1,tumour=1+2`.
    /// Not with --cv or --best.
    #[arg(long)]
    labels: Option<String>,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long, value_parser = local_path)]
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
    let cmd = Cli::command();
    let matches = cmd.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = Given::of(&cmd, &matches);
    voxcache::config::exit::finish(real_main(cli, &given))
}

fn real_main(cli: Cli, given: &Given) -> Result<Exit> {
    let mode = match (&cli.cv, &cli.best) {
        (Some(_), _) => EvaluateMode::Cv,
        (None, Some(_)) => EvaluateMode::Best,
        (None, None) => EvaluateMode::Pairs,
    };
    check(given, mode)?;
    let labels = cli
        .labels
        .as_deref()
        .map(parse_labels)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--labels: {e}"))?;
    if let Some(runs) = cli.cv.clone() {
        return cv_main(&cli, runs);
    }
    if let Some(configs) = cli.best.clone() {
        return best_main(&cli, configs);
    }
    let (Some(predictions), Some(reference)) = (cli.predictions.clone(), cli.reference.clone())
    else {
        anyhow::bail!("give the predictions and the references (or --cv RUN...)");
    };
    if let Some(summary) = &cli.summary {
        let mut read = vec![
            ("the predictions", predictions.as_path()),
            ("the reference", reference.as_path()),
        ];
        read.extend(
            cli.dataset_json
                .iter()
                .map(|d| ("--dataset-json", d.as_path())),
        );
        voxcache::util::paths::refuse_overwrite("--summary", summary, &read)?;
    }
    let report = evaluate(&EvaluateOptions {
        predictions,
        reference,
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

/// Refuse `--out` or `--summary` over the fold runs they are computed from (their models and
/// validation predictions), before anything is written.
fn outputs_apart(cli: &Cli, folds: &[PathBuf]) -> Result<()> {
    let read: Vec<(&str, &std::path::Path)> = folds
        .iter()
        .map(|f| ("the fold run", f.as_path()))
        .collect();
    if let Some(out) = &cli.out {
        voxcache::util::paths::refuse_overlap("--out", out, &read)?;
    }
    if let Some(summary) = &cli.summary {
        voxcache::util::paths::refuse_overwrite("--summary", summary, &read)?;
    }
    Ok(())
}

/// `evaluate --cv`: one score for the folds, and the postprocessing decided on them.
fn cv_main(cli: &Cli, runs: Vec<PathBuf>) -> Result<Exit> {
    outputs_apart(cli, &find_folds(&runs)?)?;
    let cv = cross_validate(&CrossValOptions {
        runs,
        out: cli.out.clone(),
        postprocessing: !cli.no_postprocessing,
        cldice: !cli.no_cldice,
        jobs: cli.jobs,
        progress: !cli.quiet,
    })?;
    let json = serde_json::to_string_pretty(&cv.report)?;
    if let Some(path) = &cli.summary {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if cli.json {
        println!("{json}");
        return Ok(Exit::unless_failed(cv.report.failed > 0));
    }
    print!("{}", cv.report.table());
    println!(
        "cross-validation of {} folds: {} cases, mean foreground Dice {:.4}; {}",
        cv.folds.len(),
        cv.report.evaluated,
        cv.report.foreground_mean.dice,
        cv.out.display()
    );
    if !cli.no_postprocessing {
        let pp = &cv.postprocessing;
        let what = pp.describe().unwrap_or_else(|| {
            "none (keeping only the largest component did not raise the Dice)".to_string()
        });
        println!(
            "postprocessing: {what}; Dice {:.4} -> {:.4}; written beside each fold's model",
            pp.dice_before.unwrap_or(f64::NAN),
            pp.dice_after.unwrap_or(f64::NAN)
        );
    }
    Ok(Exit::unless_failed(cv.report.failed > 0))
}

/// `evaluate --best`: rank configurations and their ensembles by cross-validation.
fn best_main(cli: &Cli, configurations: Vec<PathBuf>) -> Result<Exit> {
    let mut folds = Vec::new();
    for c in &configurations {
        folds.extend(find_folds(std::slice::from_ref(c))?);
    }
    outputs_apart(cli, &folds)?;
    let out = cli.out.clone().unwrap_or_else(|| {
        configurations[0]
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("best")
    });
    let r = find_best(&BestOptions {
        configurations,
        out: out.clone(),
        cldice: !cli.no_cldice,
        jobs: cli.jobs,
        progress: !cli.quiet,
    })?;
    let json = serde_json::to_string_pretty(&r)?;
    if let Some(path) = &cli.summary {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if cli.json {
        println!("{json}");
        return Ok(Exit::Success);
    }
    println!(
        "{:<4} {:<40} {:>8} {:>8} {:>6}",
        "rank", "configuration", "Dice", "clDice", "cases"
    );
    for (k, c) in r.ranking.iter().enumerate() {
        println!(
            "{:<4} {:<40} {:>8.4} {:>8.4} {:>6}",
            k + 1,
            c.name,
            c.dice,
            c.cldice,
            c.cases
        );
    }
    for s in &r.skipped {
        println!("not ensembled: {s}");
    }
    let pp = &r.postprocessing;
    println!(
        "best: {}; postprocessing: {}; Dice after it {:.4}",
        r.ranking[0].name,
        pp.describe().unwrap_or_else(|| "none".to_string()),
        r.dice_postprocessed
    );
    println!("predict with: {}", r.predict_command);
    println!("written: {}", out.join("best.json").display());
    Ok(Exit::Success)
}
