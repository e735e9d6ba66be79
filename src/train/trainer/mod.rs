//! The training loop: cache -> loader -> U-Net -> loss -> optimizer, with validation,
//! checkpoints, metrics and progress.
//!
//! Reproducibility: the initial weights come from the seed, batch `s` is a pure function of
//! (seed, s) (see `sampler`/`loader`), and every update is deterministic on the CPU. So a run
//! resumed from its step-k checkpoint (weights, optimizer moments, step) continues exactly as the
//! uninterrupted run would have, which the tests check.
//!
//! A run is a session: `setup` opens the data, builds the model, optimizer and loss, resumes
//! and starts the loader; `step` takes one optimizer step and logs the metrics window;
//! `validation` scores the validation cases; `checkpoint` saves (and, on resume, checks) the
//! checkpoints; `run_dir` records the run's identity. [`run`] is the loop over steps.

mod checkpoint;
mod run_dir;
mod setup;
mod step;
mod validation;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::Tensor;
use indicatif::ProgressBar;

use super::config::TrainConfig;
use super::validate::ValidationResult;
use crate::error::Result;
use crate::model::unet::UNet;
use crate::util::sysinfo;
use setup::Session;
use step::Tally;

/// What one `train` invocation is asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The cache folder `prep build-cache` wrote.
    pub cache_dir: PathBuf,
    /// The run folder: checkpoints, metrics, curves, the run's identity.
    pub run_dir: PathBuf,
    /// Continue from the run folder's latest checkpoint.
    pub resume: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Show a progress bar (else notices go to stderr).
    pub progress: bool,
    /// The training options.
    pub config: TrainConfig,
    /// Testing aid: return right after this step, writing nothing more (as if killed).
    pub halt_after: Option<u64>,
    /// Timing only (`train --benchmark`): no validation, checkpoints or plots.
    pub benchmark: bool,
    /// Validate after the last step (with `val_every` 0, the only validation). Off where a
    /// fold validation follows and scores the same final weights in the cases' own geometry.
    pub final_validation: bool,
    /// Strict mode: MiB of cache pages the memory maps may bring in before the least
    /// recently used maps hand theirs back (`ReaderOptions::mapped_resident_bytes`); `None`
    /// (the default): the pages are the kernel's to manage.
    pub mapped_mib: Option<u64>,
    /// Where a block file the cache folder lacks comes from (the local tier's bucket for a
    /// cache on S3; `Default`: a complete folder).
    pub blocks: crate::cache::store::Blocks,
    /// Write `batch_hashes.jsonl` in the run folder: each batch's
    /// [`batch_hash`](crate::train::batches::batch_hash), to check another loader against the
    /// trainer's.
    pub batch_hashes: bool,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct RunSummary {
    /// The run folder.
    pub run_dir: PathBuf,
    /// The dataset trained on.
    pub dataset: String,
    /// The step the run started at (0, or the resumed checkpoint's).
    pub start_step: u64,
    /// The steps done when it returned.
    pub steps_done: u64,
    /// Mean loss of the first logged window.
    pub first_loss: Option<f64>,
    /// Mean loss of the last logged window.
    pub last_loss: Option<f64>,
    /// The last validation's result.
    pub last_validation: Option<ValidationResult>,
    /// Names of the foreground classes, in the order of `dice_per_class`.
    pub class_names: Vec<String>,
    /// The best mean validation Dice.
    pub best_dice: Option<f64>,
    /// Stopped by Ctrl-C (a checkpoint written).
    pub interrupted: bool,
    /// Seconds from the end of setup.
    pub seconds: f64,
    /// Share of those seconds spent waiting for batches (logged windows).
    pub data_wait_frac: f64,
    /// Patches trained on a second (logged windows).
    pub patches_per_s: f64,
    /// The model's parameters.
    pub num_parameters: usize,
    /// Training cases.
    pub train_cases: usize,
    /// Validation cases.
    pub val_cases: usize,
    /// The process's peak resident memory (VmHWM), in bytes.
    pub peak_rss: Option<u64>,
    /// Peak anonymous and file-backed memory over the run (sampled).
    pub peak_memory: Option<sysinfo::MemoryUse>,
    /// The training step's memory counted from the network's layers.
    pub forecast: crate::model::memory::StepMemory,
}

/// Train (or resume) a run. `stop` is polled after every step (Ctrl-C): a checkpoint is written
/// and the run returns with `interrupted`.
pub fn run(opts: &RunOptions, stop: &AtomicBool) -> Result<RunSummary> {
    let cfg = &opts.config;
    let mut s = Session::open(opts)?;
    let mut tally = Tally::default();
    let mut last_validation = None;
    let (mut interrupted, mut halted) = (false, false);
    let mut step = s.start_step;
    while step < cfg.steps {
        let lr = s.step(step, &mut tally.window)?;
        step += 1;
        s.bar.set_position(step);
        let last = step == cfg.steps;
        if step.is_multiple_of(cfg.log_every.max(1)) || last {
            s.log_window(step, lr, &mut tally)?;
        }
        let due_val = !opts.benchmark
            && !s.data.val.is_empty()
            && ((last && opts.final_validation)
                || (cfg.val_every > 0 && step.is_multiple_of(cfg.val_every)));
        let mut improved = false;
        if due_val {
            let (v, best) = s.validate(step)?;
            improved = best;
            last_validation = Some(v);
        }
        if opts.halt_after == Some(step) {
            // Testing aid: stop as a kill would, with nothing more written.
            halted = true;
            break;
        }
        interrupted = stop.load(Ordering::SeqCst);
        let due_ckpt = !opts.benchmark
            && (last
                || interrupted
                || improved
                || (cfg.checkpoint_every > 0 && step.is_multiple_of(cfg.checkpoint_every)));
        if due_ckpt {
            s.checkpoint(step, improved)?;
        }
        if !opts.benchmark && (due_val || last || interrupted) {
            s.plot();
        }
        if interrupted {
            say(
                &s.bar,
                format!("interrupted: checkpoint of step {step} written; `--resume` continues"),
            );
            break;
        }
    }
    if halted {
        s.bar.abandon();
    } else {
        s.bar.finish();
    }
    Ok(s.summary(step, &tally, last_validation, interrupted))
}

/// A line for the person watching: above the progress bar, or on stderr when it is hidden.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

impl Session<'_> {
    /// What the session did, after `step` steps.
    fn summary(
        &self,
        step: u64,
        tally: &Tally,
        last_validation: Option<ValidationResult>,
        interrupted: bool,
    ) -> RunSummary {
        let (data, totals) = (&self.data, tally.totals);
        let secs = self.started.elapsed().as_secs_f64();
        RunSummary {
            run_dir: self.opts.run_dir.clone(),
            dataset: data.dataset.clone(),
            start_step: self.start_step,
            steps_done: step,
            first_loss: tally.first_loss,
            last_loss: tally.last_loss,
            last_validation,
            class_names: data.classes.scored_names(),
            best_dice: self.best.map(|b| b.0),
            interrupted,
            seconds: secs,
            data_wait_frac: totals.1.as_secs_f64() / secs.max(1e-9),
            patches_per_s: totals.0 as f64 / secs.max(1e-9),
            num_parameters: self.model.num_parameters(),
            train_cases: data.train.len(),
            val_cases: data.val.len(),
            peak_rss: sysinfo::peak_rss_bytes(),
            peak_memory: self.peak_memory.peak(),
            forecast: self.forecast,
        }
    }
}

/// "vessel 0.7620, wall 0.5000": foreground Dice by class name ("-" where the class was in
/// neither label nor prediction).
pub fn per_class(names: &[String], dice: &[f64]) -> String {
    names
        .iter()
        .zip(dice)
        .map(|(c, d)| {
            if d.is_finite() {
                format!("{c} {d:.4}")
            } else {
                format!("{c} -")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Named tensors of a model's parameters (for tests and tools).
pub fn model_tensors(model: &UNet) -> HashMap<String, Tensor> {
    model
        .params()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect()
}
