//! `train --benchmark`: a short run of the configured training on the real cache, loader and
//! device, to size a run before starting it (step time, patches/s, data wait, peak memory).
//!
//! It is the trainer itself with validation, checkpoints and plots off, logging every step
//! into a scratch run folder that is removed afterwards; the first steps (cuDNN's algorithm
//! choice, allocator growth, the loader filling its queue) are reported apart.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use super::metrics::{MetricsLog, Record, TrainRecord};
use super::trainer::{run, RunOptions};
use crate::error::{Error, Result};
use crate::model::memory::StepMemory;

/// Steps left out of the figures at the start of a benchmark.
pub const WARMUP_STEPS: u64 = 3;

/// What a benchmark measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchmarkReport {
    /// Steps measured (after the warm-up).
    pub steps: u64,
    /// Warm-up steps before the measured ones.
    pub warmup: u64,
    /// Median seconds per optimizer step, and the slowest measured step.
    pub step_s: f64,
    /// The slowest measured step, in seconds.
    pub max_step_s: f64,
    /// Patches per second over the measured steps.
    pub patches_per_s: f64,
    /// Share of the measured time spent waiting for the loader.
    pub data_wait_frac: f64,
    /// Peak resident memory of the process (VmHWM, MiB).
    pub peak_rss_mb: f64,
    /// Peak anonymous memory (RssAnon, MiB): what the OOM killer weighs.
    pub peak_anon_mb: Option<f64>,
    /// Anonymous memory before the network was built (MiB): the peak less this is the step's.
    pub base_anon_mb: Option<f64>,
    /// Peak file-backed resident memory (RssFile, MiB): mapped cache pages, reclaimable.
    pub peak_file_mb: Option<f64>,
    /// Peak GPU memory our tensors held, in MiB (on a GPU).
    pub gpu_peak_mb: Option<f64>,
    /// Seconds of the first (warm-up) step.
    pub first_step_s: f64,
    /// The step's memory counted from the network's layers.
    pub forecast: StepMemory,
}

impl BenchmarkReport {
    /// Seconds a run of `steps` steps would take at the measured rate, without validation.
    pub fn forecast_s(&self, steps: u64) -> f64 {
        self.step_s * steps as f64
    }
}

/// The report from per-step records (`log_every` = 1), the first `warmup` steps left out.
pub fn summarize(records: &[TrainRecord], warmup: u64) -> Result<BenchmarkReport> {
    let mut by_step: Vec<&TrainRecord> = records.iter().collect();
    by_step.sort_by_key(|r| r.step);
    if by_step.len() as u64 <= warmup {
        return Err(Error::Config(format!(
            "benchmark: {} logged steps, need more than the {warmup} warm-up steps",
            by_step.len()
        )));
    }
    // A step's duration is the time between consecutive records' ends.
    let mut durations = Vec::with_capacity(by_step.len());
    let mut prev = 0.0;
    for r in &by_step {
        durations.push((r.elapsed_s - prev).max(0.0));
        prev = r.elapsed_s;
    }
    let measured = &durations[warmup as usize..];
    let recs = &by_step[warmup as usize..];
    let total: f64 = measured.iter().sum::<f64>().max(1e-12);
    let mut sorted = measured.to_vec();
    sorted.sort_by(f64::total_cmp);
    let patches: f64 = recs
        .iter()
        .zip(measured)
        .map(|(r, d)| r.patches_per_s * d)
        .sum();
    let wait: f64 = recs
        .iter()
        .zip(measured)
        .map(|(r, d)| r.data_wait_frac * d)
        .sum();
    let gpu_peak_mb = by_step
        .iter()
        .filter_map(|r| r.gpu_peak_mb)
        .reduce(f64::max);
    Ok(BenchmarkReport {
        steps: measured.len() as u64,
        warmup,
        step_s: sorted[sorted.len() / 2],
        max_step_s: sorted[sorted.len() - 1],
        patches_per_s: patches / total,
        data_wait_frac: wait / total,
        peak_rss_mb: by_step.iter().map(|r| r.peak_rss_mb).fold(0.0, f64::max),
        peak_anon_mb: by_step
            .iter()
            .filter_map(|r| r.peak_anon_mb)
            .reduce(f64::max),
        base_anon_mb: by_step.iter().find_map(|r| r.base_anon_mb),
        peak_file_mb: by_step
            .iter()
            .filter_map(|r| r.peak_file_mb)
            .reduce(f64::max),
        gpu_peak_mb,
        first_step_s: durations[0],
        forecast: StepMemory::default(),
    })
}

/// Runs `steps` training steps (plus the warm-up) as `base` would, in a scratch run folder
/// under the system's temporary directory, and reports on them.
pub fn benchmark(base: &RunOptions, steps: u64, stop: &AtomicBool) -> Result<BenchmarkReport> {
    if base.resume {
        return Err(Error::Config(
            "--benchmark starts from fresh weights: drop --resume".into(),
        ));
    }
    let scratch = scratch_dir();
    let mut opts = base.clone();
    opts.run_dir = scratch.clone();
    opts.benchmark = true;
    opts.config.steps = steps + WARMUP_STEPS;
    opts.config.log_every = 1;
    let result = run(&opts, stop).and_then(|summary| {
        let records = MetricsLog::read_all(&scratch.join("metrics.jsonl"))?;
        let train: Vec<TrainRecord> = records
            .into_iter()
            .filter_map(|r| match r {
                Record::Train(t) => Some(t),
                Record::Val(_) => None,
            })
            .collect();
        let mut report = summarize(&train, WARMUP_STEPS)?;
        report.forecast = summary.forecast;
        Ok(report)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("voxcache-benchmark-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(step: u64, elapsed_s: f64, patches_per_s: f64, wait: f64) -> TrainRecord {
        TrainRecord {
            step,
            elapsed_s,
            patches_per_s,
            data_wait_frac: wait,
            peak_rss_mb: 100.0 + step as f64,
            gpu_peak_mb: Some(10.0 * step as f64),
            ..TrainRecord::default()
        }
    }

    #[test]
    fn warm_up_is_left_out_and_rates_are_time_weighted() {
        // Step 1 is slow (3 s), then steps of 1, 1, 2, 1 s with 2 patches each.
        let recs = vec![
            rec(1, 3.0, 2.0 / 3.0, 0.9),
            rec(2, 4.0, 2.0, 0.0),
            rec(3, 5.0, 2.0, 0.5),
            rec(4, 7.0, 1.0, 0.0),
            rec(5, 8.0, 2.0, 0.0),
        ];
        let r = summarize(&recs, 1).unwrap();
        assert_eq!((r.steps, r.warmup), (4, 1));
        assert_eq!(r.first_step_s, 3.0);
        assert_eq!(r.step_s, 1.0);
        assert_eq!(r.max_step_s, 2.0);
        assert!((r.patches_per_s - 8.0 / 5.0).abs() < 1e-12);
        assert!((r.data_wait_frac - 0.5 / 5.0).abs() < 1e-12);
        assert_eq!(r.peak_rss_mb, 105.0);
        assert_eq!(r.gpu_peak_mb, Some(50.0));
        assert_eq!(r.forecast_s(1000), 1000.0);
    }

    #[test]
    fn too_few_steps_is_an_error() {
        let recs = vec![rec(1, 1.0, 1.0, 0.0)];
        assert!(summarize(&recs, 3).is_err());
        let cpu = vec![TrainRecord::default(); 5];
        assert_eq!(summarize(&cpu, 1).unwrap().gpu_peak_mb, None);
    }
}
