//! A cascade's two stages on new inputs in one predict: the first stage's models (its folds),
//! then the second stage's with those segmentations as its last channels.

use super::postprocess::PostprocessingChoice;
use super::predict::{predict, PredictOptions, PredictReport};
use crate::error::Result;

/// A cascade on new inputs: the first stage's models, then the second stage's with those
/// segmentations; one stage in memory at a time. The report is the second stage's; a case the
/// first stage failed fails there too, naming the segmentation it lacks.
pub(crate) fn predict_chain(opts: &PredictOptions) -> Result<PredictReport> {
    let dir = opts
        .previous_stage
        .clone()
        .unwrap_or_else(|| opts.out.join("previous_stage"));
    let first = predict(&PredictOptions {
        models: opts.previous_models.clone(),
        previous_models: Vec::new(),
        previous_stage: None,
        postprocessing: PostprocessingChoice::Off,
        save_probabilities: false,
        out: dir.clone(),
        ..opts.clone()
    })?;
    if !opts.quiet {
        eprintln!(
            "first stage: {} predicted, {} already there, {} failed; {}",
            first.predicted,
            first.existing,
            first.failed,
            dir.display()
        );
    }
    predict(&PredictOptions {
        previous_models: Vec::new(),
        previous_stage: Some(dir),
        ..opts.clone()
    })
}
