//! Checkpoints of a session: written after a step (weights, optimizer moments, state), and
//! the checks and repairs of the latest one before a run resumes from it; the PNG curves
//! drawn beside them.

use std::path::Path;

use candle_core::Tensor;

use super::setup::Session;
use crate::error::{Error, Result};
use crate::model::checkpoint::{Checkpointer, StateExtra, TrainState};
use crate::train::config::TrainConfig;
use crate::train::metrics::MetricsLog;
use crate::train::plot;

impl Session<'_> {
    /// Save the weights, optimizer state and training state of `step`; `improved`: the step's
    /// validation was the best so far, so `best/` becomes this checkpoint.
    pub(super) fn checkpoint(&self, step: u64, improved: bool) -> Result<()> {
        let cfg = self.cfg;
        let named: Vec<(String, Tensor)> = self
            .params
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let state = TrainState {
            step,
            optimizer_steps: self.optimizer.steps_taken(),
            seed: cfg.network.seed,
            best_metric: self.best.map(|b| b.0),
            best_step: self.best.map(|b| b.1),
            config: cfg.clone(),
            extra: StateExtra {
                dataset: Some(self.data.dataset.clone()),
                num_classes: Some(self.data.num_classes),
                ..Default::default()
            },
        };
        let saved = self
            .checkpointer
            .save(&named, &self.optimizer.state_tensors()?, &state)?;
        if improved {
            self.checkpointer.mark_best(&saved)?;
        }
        Ok(())
    }

    /// Redraw `curves.png` from the metrics log.
    pub(super) fn plot(&self) {
        write_plot(&self.metrics_path, &self.opts.run_dir.join("curves.png"));
    }
}

/// Refuse a checkpoint whose state does not fit this run (a step past its end, more optimizer
/// steps than steps) or whose tensors are not finite, naming the file.
pub(super) fn check_resumable(
    ck: &crate::model::checkpoint::Checkpoint,
    cfg: &TrainConfig,
) -> Result<()> {
    let state = &ck.state;
    let state_file = ck.dir.join(crate::model::checkpoint::STATE_FILE);
    if state.step > cfg.steps || state.optimizer_steps > state.step {
        return Err(Error::Train(format!(
            "{}: step {} with {} optimizer steps does not fit a run of {} steps: the state does not belong to this run",
            state_file.display(),
            state.step,
            state.optimizer_steps,
            cfg.steps
        )));
    }
    for (file, tensors) in [
        (crate::model::checkpoint::MODEL_FILE, &ck.model),
        (crate::model::checkpoint::OPTIMIZER_FILE, &ck.optimizer),
    ] {
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        for name in names {
            let t = &tensors[name];
            let finite = t
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .all(|v| v.is_finite());
            if !finite {
                return Err(Error::Train(format!(
                    "{}: tensor {name} holds NaN or infinite values: the checkpoint is damaged",
                    ck.dir.join(file).display()
                )));
            }
        }
    }
    Ok(())
}

/// A kill between saving a checkpoint and marking it best leaves `best/` behind the state's
/// `best_step`; put it right on resume.
pub(super) fn remark_best_if_stale(
    ck: &Checkpointer,
    run_dir: &Path,
    best_step: u64,
) -> Result<()> {
    let best_state = run_dir.join("checkpoints/best/state.json");
    let current = TrainState::read(&best_state).ok().map(|s| s.step);
    let saved = run_dir
        .join("checkpoints")
        .join(crate::model::checkpoint::step_dir_name(best_step));
    if current != Some(best_step) && saved.join("state.json").is_file() {
        ck.mark_best(&saved)?;
    }
    Ok(())
}

/// The PNG curves are a convenience: failing to draw them never fails a run.
fn write_plot(metrics: &Path, png: &Path) {
    if let Ok(records) = MetricsLog::read_all(metrics) {
        if let Err(e) = plot::plot_curves(&records, png) {
            eprintln!("warning: could not draw {}: {e}", png.display());
        }
    }
}
