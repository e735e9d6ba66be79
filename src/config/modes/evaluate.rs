//! `evaluate`'s modes and the options each refuses (exit 2, naming the option and the mode):
//!
//! - PRED GT (segmentations against references): `--out` and `--no-postprocessing` are refused
//!   (they go with `--cv` or `--best`);
//! - `--cv RUN...`: `--labels` and `--dataset-json` are refused (the classes are the fold runs'
//!   own, from their records);
//! - `--best CONFIG...`: the same, and `--no-postprocessing` (it decides the postprocessing of
//!   the winner).
//!
//! `--json`, `--summary`, `--no-cldice`, `-j` and `-q` apply to every mode.

use super::Given;
use crate::error::Result;

/// The mode of segmentations scored against references.
pub const PAIRS: &str = "evaluate PRED GT";
/// Cross-validation of fold runs.
pub const CV: &str = "evaluate --cv";
/// Ranking of configurations.
pub const BEST: &str = "evaluate --best";

/// Which mode the command line chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvaluateMode {
    /// PRED GT.
    Pairs,
    /// `--cv RUN...`.
    Cv,
    /// `--best CONFIG...`.
    Best,
}

/// Refuse the first option typed that `mode` does not take.
pub fn check(given: &Given, mode: EvaluateMode) -> Result<()> {
    let classes = |_: &str| {
        Some("the classes are the fold runs' own (their run.json records them)".to_string())
    };
    match mode {
        EvaluateMode::Pairs => given.refuse(&["out", "no_postprocessing"], PAIRS, |_| {
            Some("it goes with --cv or --best".into())
        }),
        EvaluateMode::Cv => given.refuse(&["labels", "dataset_json"], CV, classes),
        EvaluateMode::Best => {
            given.refuse(&["labels", "dataset_json"], BEST, classes)?;
            given.refuse(&["no_postprocessing"], BEST, |_| {
                Some("it decides the postprocessing of the best configuration".into())
            })
        }
    }
}
