//! `train`'s modes and the options each refuses (exit 2, naming the option and the mode):
//!
//! - `--validate-only` trains nothing: it takes `--fold`, `--dataset`, `--out`, the cache and its
//!   S3 options, `--device`, `-j`, `--no-progress`, `--validation-data` and
//!   `--validation-mirror`; every training option (the pipeline, the network, the schedule,
//!   `--splits`...), `--resume`, `--benchmark`, `--no-fold-validation`, `--mapped-mib` and
//!   `--batch-hashes` are refused. With `--fold all` (no held-out case) it is refused itself.
//! - `--benchmark` times fresh weights in a scratch folder: `--resume`, `--out`, `--val-every`,
//!   `--checkpoint-every`, `--log-every`, `--batch-hashes` and the fold-validation options are
//!   refused, as is a list of several folds (it times one run).
//! - Without a fold (neither `--fold` nor the pipeline's `fold`): `--splits` and the
//!   fold-validation options are refused. With one: `--val-fraction` (the fold holds out its own
//!   cases); with `--fold all` only, `--splits`, `--val-every` and the fold-validation options
//!   (every case trains, none is held out).
//!
//! `--resume` takes every option a new run takes (it refuses, naming them, settings that differ
//! from the run's record: [`crate::train::trainer`]). The S3 options are refused for a cache in
//! a local folder by [`crate::config::location::S3Flags::options_for`].

use clap::Args;

use super::Given;
use crate::config::TrainFlags;
use crate::error::{Error, Result};
use crate::train::folds::FoldChoice;

/// The mode `--validate-only` names in its refusals.
pub const VALIDATE_ONLY: &str = "train --validate-only";
/// The mode `--benchmark` names.
pub const BENCHMARK: &str = "train --benchmark";
/// A run on the fraction split.
pub const NO_FOLD: &str = "a run without --fold";
/// A cross-validation fold's run.
pub const FOLD: &str = "a --fold run";
/// `--fold all`: every case trains, none is held out.
pub const FOLD_ALL: &str = "--fold all";

/// The options of a fold's final validation.
const FOLD_VALIDATION: [&str; 3] = ["validation_data", "validation_mirror", "no_fold_validation"];

/// What the command line chose.
#[derive(Clone, Debug)]
pub struct TrainMode<'a> {
    /// `--validate-only`.
    pub validate_only: bool,
    /// `--benchmark`.
    pub benchmark: bool,
    /// The runs to make, as [`crate::config::train::folds`] lists them (`[None]`: one run on
    /// the fraction split).
    pub folds: &'a [Option<FoldChoice>],
}

/// The clap ids of the training options ([`TrainFlags`]): what the run is trained with.
fn training_options() -> Vec<String> {
    TrainFlags::augment_args(clap::Command::new("train"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect()
}

/// Refuse the first option typed that `mode` does not take.
pub fn check(given: &Given, mode: &TrainMode) -> Result<()> {
    let fold = mode.folds.iter().any(Option::is_some);
    let all = fold
        && mode
            .folds
            .iter()
            .all(|f| matches!(f, Some(FoldChoice::All)));
    if mode.validate_only {
        let training = training_options();
        let mut ids: Vec<&str> = training
            .iter()
            .map(String::as_str)
            .filter(|id| !["dataset", "fold"].contains(id))
            .collect();
        ids.extend([
            "resume",
            "benchmark",
            "no_fold_validation",
            "mapped_mib",
            "batch_hashes",
        ]);
        given.refuse(&ids, VALIDATE_ONLY, |id| {
            Some(
                match id {
                    "resume" | "benchmark" | "batch_hashes" => "it trains nothing; it validates the fold runs already there",
                    "no_fold_validation" => "it runs only the fold validation",
                    "mapped_mib" => "the fold validation predicts from the cases' own files, not the cache's maps",
                    _ => "it trains nothing; it validates the fold runs already there, with the options they were trained with",
                }
                .into(),
            )
        })?;
        if all {
            given.refuse(&["validate_only"], FOLD_ALL, |_| {
                Some("it holds out no case, so there is nothing to validate".into())
            })?;
        }
        return Ok(());
    }
    if mode.benchmark {
        let mut ids = vec![
            "resume",
            "out",
            "val_every",
            "checkpoint_every",
            "log_every",
            "batch_hashes",
        ];
        ids.extend(FOLD_VALIDATION);
        given.refuse(&ids, BENCHMARK, |id| {
            Some(
                match id {
                    "resume" => "it times fresh weights",
                    "out" | "batch_hashes" => "it keeps no run folder",
                    "val_every" | "checkpoint_every" => {
                        "it neither validates nor writes checkpoints"
                    }
                    "log_every" => "it logs every step",
                    _ => "it validates nothing",
                }
                .into(),
            )
        })?;
        if mode.folds.len() > 1 {
            return Err(Error::Config(format!(
                "{} with {} folds does not apply to {BENCHMARK}: it times one run; give one fold",
                given.spelling("fold"),
                mode.folds.len()
            )));
        }
    }
    if !fold {
        let mut ids = vec!["splits"];
        ids.extend(FOLD_VALIDATION);
        return given.refuse(&ids, NO_FOLD, |_| {
            Some("it goes with --fold K (or a pipeline's fold)".into())
        });
    }
    given.refuse(&["val_fraction"], FOLD, |_| {
        Some("the fold holds out its own validation cases".into())
    })?;
    if all {
        let mut ids = vec!["splits", "val_every"];
        ids.extend(FOLD_VALIDATION);
        given.refuse(&ids, FOLD_ALL, |id| {
            Some(
                match id {
                    "splits" => "every case trains, so no split is taken",
                    _ => "it holds out no case, so there is nothing to validate",
                }
                .into(),
            )
        })?;
    }
    Ok(())
}
