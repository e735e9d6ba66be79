//! A training session and its setup: the cases opened from the cache, the run folder's
//! identity, the model and optimizer (loaded from the latest checkpoint on `--resume`), the
//! loss objective, the metrics log, the loader's workers and the progress bar.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Var};
use indicatif::{ProgressBar, ProgressStyle};

use super::checkpoint::{check_resumable, remark_best_if_stale};
use super::run_dir::prepare_run_dir;
use super::{say, RunOptions};
use crate::error::{Error, Result};
use crate::format::run::{RunRecord, Split};
use crate::model::checkpoint::Checkpointer;
use crate::model::config::Precision;
use crate::model::device;
use crate::model::memory;
use crate::model::unet::UNet;
use crate::train::config::{OptimizerName, TrainConfig};
use crate::train::data::{open_data, Data};
use crate::train::loader::Loader;
use crate::train::loss::LossObjective;
use crate::train::metrics::MetricsLog;
use crate::train::optim::{Optimizer, OptimizerKind};
use crate::util::sysinfo;

/// Everything a run holds between its steps.
pub(super) struct Session<'a> {
    pub(super) opts: &'a RunOptions,
    pub(super) cfg: &'a TrainConfig,
    pub(super) dev: Device,
    pub(super) data: Data,
    pub(super) model: UNet,
    pub(super) params: Vec<(String, Var)>,
    pub(super) optimizer: Optimizer,
    pub(super) checkpointer: Checkpointer,
    pub(super) objective: LossObjective,
    pub(super) loader: Loader,
    pub(super) bar: ProgressBar,
    pub(super) log: MetricsLog,
    pub(super) metrics_path: PathBuf,
    /// The step the session starts at (0, or the resumed checkpoint's).
    pub(super) start_step: u64,
    /// The best validation Dice so far and its step.
    pub(super) best: Option<(f64, u64)>,
    /// When setup ended: the clock of the metrics' `elapsed_s` and the summary.
    pub(super) started: Instant,
    /// Samples the process's anonymous and file-backed memory from the session's start.
    pub(super) peak_memory: sysinfo::PeakMemory,
    /// Memory before the network was built (the base of the step's growth).
    pub(super) base_memory: Option<sysinfo::MemoryUse>,
    /// The step's memory as counted from the network's layers.
    pub(super) forecast: memory::StepMemory,
    /// `batch_hashes.jsonl`, when asked for.
    pub(super) hashes: Option<std::io::BufWriter<std::fs::File>>,
}

impl<'a> Session<'a> {
    /// Open the data, build the model and optimizer, record (or check) the run folder's
    /// identity, resume from its latest checkpoint when asked, open the metrics log and start
    /// the loader at the first step to take.
    pub(super) fn open(opts: &'a RunOptions) -> Result<Self> {
        let cfg = &opts.config;
        cfg.validate()?;
        let dev = device::select(&opts.device)?;
        let data = open_data(&opts.cache_dir, cfg, opts.mapped_mib, opts.blocks.clone())?;
        let base_memory = sysinfo::MemoryUse::now();
        let model =
            cfg.network()
                .build(data.channels.len(), data.classes.labels().heads(), &dev)?;
        let identity = identity(&data, cfg);
        prepare_run_dir(opts, &identity)?;

        let params = model.params();
        let mut optimizer = Optimizer::new(params.clone(), optimizer_kind(cfg))?;
        let objective = LossObjective::new(
            &cfg.loss,
            model.config(),
            &data.classes,
            cfg.network.patch,
            &dev,
        );
        // Every checkpoint carries the run's record: a checkpoint folder copied alone predicts.
        let checkpointer =
            Checkpointer::new(&opts.run_dir, cfg.keep_last)?.with_record(identity.to_json());
        let mut notices = Vec::new();
        let (start_step, best) = if opts.resume {
            resume(
                opts,
                &dev,
                &model,
                &mut optimizer,
                &checkpointer,
                &mut notices,
            )?
        } else {
            (0, None)
        };
        if data.val.is_empty() {
            notices.push("no validation cases (val_fraction 0 or a single labelled case): no validation Dice and no best checkpoint".into());
        }
        notices.push(network_notice(&data, &model));
        // bf16 training keeps bf16 activations on the CPU too (the ops compute in f32 inside).
        let shape = cfg.step_shape(dev.is_cpu());
        let bf16_cpu = dev.is_cpu() && shape.precision == Precision::Bf16;
        if bf16_cpu && !crate::model::ops::direct::bf16_dot_products() {
            notices.push(
                "precision bf16: this CPU's convolutions multiply bf16 values in f32, widened as \
                 they are read (it has no AVX512-BF16, its bf16 dot products are slower than \
                 its f32 FMAs, or VOXCACHE_SIMD or VOXCACHE_BF16 says so); activations are \
                 still kept in bf16"
                    .into(),
            );
        }
        let forecast = memory::training_step(model.config(), &shape);
        let metrics_path = opts.run_dir.join("metrics.jsonl");
        // A fresh run also truncates: a folder without checkpoints may hold an abandoned log.
        let log = MetricsLog::open(&metrics_path, Some(start_step))?;
        let first_batch = start_step * cfg.accumulate as u64;
        let loader = crate::train::batches::start_loader(cfg, &data, first_batch)?;

        let hashes = opts
            .batch_hashes
            .then(|| open_hashes(&opts.run_dir, first_batch))
            .transpose()?;
        let bar = progress_bar(opts, start_step);
        for n in notices {
            say(&bar, n);
        }
        if !data.unlabelled.is_empty() {
            say(
                &bar,
                format!(
                    "{} case(s) without a label skipped: {}",
                    data.unlabelled.len(),
                    data.unlabelled.join(", ")
                ),
            );
        }
        if start_step > 0 {
            say(&bar, format!("resumed from step {start_step}"));
        }
        Ok(Session {
            opts,
            cfg,
            dev,
            data,
            model,
            params,
            optimizer,
            checkpointer,
            objective,
            loader,
            bar,
            log,
            metrics_path,
            start_step,
            best,
            started: Instant::now(),
            peak_memory: sysinfo::PeakMemory::start(),
            base_memory,
            forecast,
            hashes,
        })
    }
}

/// The run folder's `batch_hashes.jsonl`, its lines from batch `first_batch` on dropped (a
/// resumed run trains them again and writes them anew; a fresh run starts it empty).
fn open_hashes(
    run_dir: &std::path::Path,
    first_batch: u64,
) -> Result<std::io::BufWriter<std::fs::File>> {
    let path = run_dir.join("batch_hashes.jsonl");
    let kept: String = match std::fs::read_to_string(&path) {
        Ok(text) if first_batch > 0 => text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["batch"].as_u64())
                    .is_some_and(|b| b < first_batch)
            })
            .map(|l| format!("{l}\n"))
            .collect(),
        _ => String::new(),
    };
    std::fs::write(&path, kept).map_err(|e| Error::io(&path, e))?;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    Ok(std::io::BufWriter::new(file))
}

/// What the run folder records of the run: data, classes, channels, preprocessing, the options
/// that shape the weights, and the split.
fn identity(data: &Data, cfg: &TrainConfig) -> RunRecord {
    let split = Split {
        train: data.train.iter().map(|c| c.0.clone()).collect(),
        val: data.val.iter().map(|c| c.0.clone()).collect(),
    };
    RunRecord {
        dataset: data.dataset.clone(),
        num_classes: data.num_classes,
        classes: data.classes.classes().to_vec(),
        regions: data.classes.labels().regions().to_vec(),
        regions_class_order: data.classes.labels().regions_class_order().to_vec(),
        ignore_label: data.classes.labels().ignore(),
        channels: data.channels.clone(),
        preprocessing: Some(data.preprocessing.clone()),
        config: cfg.clone(),
        split,
    }
}

fn optimizer_kind(cfg: &TrainConfig) -> OptimizerKind {
    match cfg.optimizer {
        OptimizerName::Adamw => OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: cfg.weight_decay,
        },
        OptimizerName::Sgd => OptimizerKind::Sgd {
            momentum: cfg.momentum,
            nesterov: true,
            weight_decay: cfg.weight_decay,
        },
    }
}

/// Load the latest complete checkpoint of the run folder into `model` and `optimizer` (after
/// checking it fits this run), and return its step and best validation; step 0 with a notice
/// when there is none.
fn resume(
    opts: &RunOptions,
    dev: &Device,
    model: &UNet,
    optimizer: &mut Optimizer,
    checkpointer: &Checkpointer,
    notices: &mut Vec<String>,
) -> Result<(u64, Option<(f64, u64)>)> {
    let Some(ck) = checkpointer.latest(dev)? else {
        notices.push(format!(
            "--resume: no complete checkpoint in {}, starting at step 0",
            opts.run_dir.display()
        ));
        return Ok((0, None));
    };
    for s in &ck.skipped {
        notices.push(format!("warning: checkpoint skipped: {s}"));
    }
    check_resumable(&ck, &opts.config)?;
    let at = |e: Error| Error::Train(format!("{}: {e}", ck.dir.display()));
    model.load(&ck.model).map_err(at)?;
    optimizer
        .load_state(&ck.optimizer, ck.state.optimizer_steps)
        .map_err(at)?;
    let best = ck.state.best_metric.zip(ck.state.best_step);
    if let Some((_, b)) = best {
        remark_best_if_stale(checkpointer, &opts.run_dir, b)?;
    }
    Ok((ck.state.step, best))
}

/// "U-Net: 1 image channel (CT), 5 stages, ...": the network and the classes it learns.
fn network_notice(data: &Data, model: &UNet) -> String {
    let in_channels = data.channels.len();
    let names: Vec<String> = match data.classes.labels().regions() {
        [] => data
            .classes
            .classes()
            .iter()
            .map(|c| format!("{} ({})", c.name, c.value))
            .collect(),
        regions => regions.iter().map(|r| r.to_string()).collect(),
    };
    let what = match data.classes.labels().is_regions() {
        false => "classes",
        true => "sigmoid regions",
    };
    format!(
        "U-Net: {} image channel{} ({}), {} stages, strides {:?}, {} parameters, {} {what}: {}{}",
        in_channels,
        if in_channels == 1 { "" } else { "s" },
        data.channels.join(", "),
        model.config().strides.len() + 1,
        model.config().strides,
        model.num_parameters(),
        data.classes.labels().heads(),
        names.join(", "),
        data.classes
            .labels()
            .ignore()
            .map(|i| format!("; label {i} ignored"))
            .unwrap_or_default()
    )
}

/// The steps' progress bar, hidden without `progress`.
fn progress_bar(opts: &RunOptions, start_step: u64) -> ProgressBar {
    if !opts.progress {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(opts.config.steps);
    b.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30.cyan/blue}] {pos}/{len} steps {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    b.set_position(start_step);
    b
}
