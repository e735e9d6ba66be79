//! The training loop: cache -> loader -> U-Net -> Dice+CE -> optimizer, with validation,
//! checkpoints, metrics and progress.
//!
//! Reproducibility: the initial weights come from the seed, batch `s` is a pure function of
//! (seed, s) (see `sampler`/`loader`), and every update is deterministic on the CPU. So a run
//! resumed from its step-k checkpoint (weights, optimizer moments, step) continues exactly as the
//! uninterrupted run would have, which the tests check.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use indicatif::{ProgressBar, ProgressStyle};

use super::augment::AugmentConfig;
use super::config::{OptimizerName, TrainConfig};
use super::data::{open_data, Data};
use super::loader::{Loader, LoaderConfig};
use super::loss::LossObjective;
use super::metrics::{MetricsLog, Record, TrainRecord, ValRecord};
use super::optim::{poly_lr, Optimizer, OptimizerKind};
use super::plot;
use super::sampler::{Sampler, SamplerConfig};
use super::validate::{SlidingWindow, ValidationResult};
use crate::cache::layout::write_atomic;
use crate::cache::reader::EntryReader;
use crate::error::{Error, Result};
use crate::format::run::{RunRecord, Split, RUN_FILE};
use crate::model::checkpoint::{Checkpointer, StateExtra, TrainState};
use crate::model::device;
use crate::model::unet::UNet;
use crate::util::sysinfo;

const MIB: f64 = (1u64 << 20) as f64;

/// What one `train` invocation is asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub cache_dir: PathBuf,
    pub run_dir: PathBuf,
    pub resume: bool,
    pub device: String,
    pub progress: bool,
    pub config: TrainConfig,
    /// Testing aid: return right after this step, writing nothing more (as if killed).
    pub halt_after: Option<u64>,
    /// Timing only (`train --benchmark`): no validation, checkpoints or plots.
    pub benchmark: bool,
    /// MiB of cache pages the memory maps may bring in before the least recently used maps
    /// hand theirs back (`ReaderOptions::mapped_resident_bytes`); `None`: the reader's
    /// default, 128.
    pub mapped_mib: Option<u64>,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub dataset: String,
    pub start_step: u64,
    pub steps_done: u64,
    /// Mean loss of the first and last logged windows.
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub last_validation: Option<ValidationResult>,
    /// Names of the foreground classes, in the order of `dice_per_class`.
    pub class_names: Vec<String>,
    pub best_dice: Option<f64>,
    pub interrupted: bool,
    pub seconds: f64,
    pub data_wait_frac: f64,
    pub patches_per_s: f64,
    pub num_parameters: usize,
    pub train_cases: usize,
    pub val_cases: usize,
    pub peak_rss: Option<u64>,
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

/// "key: was X, now Y" for each differing part of two run identities.
fn identity_differences(old: &RunRecord, new: &RunRecord) -> Vec<String> {
    let mut out = Vec::new();
    let mut diff = |key: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{key} was {a}, now {b}"));
        }
    };
    diff("dataset", old.dataset.clone(), new.dataset.clone());
    diff(
        "classes",
        old.num_classes.to_string(),
        new.num_classes.to_string(),
    );
    if !old.classes.is_empty() {
        let values = |r: &RunRecord| {
            format!(
                "{:?}",
                r.classes.iter().map(|c| c.value).collect::<Vec<_>>()
            )
        };
        diff("class values", values(old), values(new));
        diff(
            "ignore label",
            format!("{:?}", old.ignore_label),
            format!("{:?}", new.ignore_label),
        );
    }
    if !old.channels.is_empty() {
        diff(
            "image channels",
            old.channels.join(", "),
            new.channels.join(", "),
        );
    }
    let empty = serde_json::Map::new();
    let (a, b) = (
        old.config.as_object().unwrap_or(&empty),
        new.config.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let show = |v: Option<&serde_json::Value>| v.map_or("unset".to_string(), |v| v.to_string());
        diff(k, show(a.get(k)), show(b.get(k)));
    }
    if old.split != new.split {
        out.push("the train/validation split differs".into());
    }
    out
}

fn prepare_run_dir(opts: &RunOptions, identity: &RunRecord) -> Result<()> {
    let dir = &opts.run_dir;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(RUN_FILE);
    match RunRecord::read(&path)? {
        Some(old) if opts.resume => {
            // A run recorded before its preprocessing was: compared without it, then
            // recorded.
            let recorded_before = old.preprocessing.is_none();
            let mut new = identity.clone();
            if recorded_before {
                new.preprocessing = None;
            }
            if old != new {
                return Err(Error::Train(format!(
                    "{}: --resume with settings that differ from the run's: {}; resume with the run's options or start a new --out",
                    path.display(),
                    identity_differences(&old, identity).join(", ")
                )));
            }
            if recorded_before {
                write_atomic(&path, &identity.to_json())?;
            }
            return Ok(());
        }
        Some(_) if dir.join("checkpoints").is_dir() => {
            return Err(Error::Train(format!(
                "{} already holds a run: pass --resume to continue it, or choose another --out",
                dir.display()
            )));
        }
        Some(_) | None => {}
    }
    write_atomic(&path, &identity.to_json())
}

/// Sum of per-parameter gradients over micro-batches (accumulation).
fn add_grads(
    acc: &mut Option<Vec<Tensor>>,
    params: &[(String, candle_core::Var)],
    grads: &candle_core::backprop::GradStore,
    scale: f64,
) -> Result<()> {
    let mut fresh = Vec::with_capacity(params.len());
    for (_, v) in params {
        let g = match grads.get(v.as_tensor()) {
            Some(g) => g.clone(),
            None => v.as_tensor().zeros_like()?,
        };
        fresh.push(if scale == 1.0 { g } else { (g * scale)? });
    }
    *acc = Some(match acc.take() {
        None => fresh,
        Some(old) => old
            .iter()
            .zip(&fresh)
            .map(|(a, b)| a.add(b))
            .collect::<candle_core::Result<Vec<_>>>()?,
    });
    Ok(())
}

/// Running sums between two log lines.
#[derive(Default)]
struct Window {
    steps: u64,
    loss: f64,
    ce: f64,
    dice: f64,
    srec: f64,
    cldice: f64,
    boundary: f64,
    surface: f64,
    grad_norm: f64,
    patches: u64,
    wait: Duration,
    started: Option<Instant>,
}

/// Train (or resume) a run. `stop` is polled after every step (Ctrl-C): a checkpoint is written
/// and the run returns with `interrupted`.
pub fn run(opts: &RunOptions, stop: &AtomicBool) -> Result<RunSummary> {
    let cfg = &opts.config;
    cfg.validate()?;
    let dev = device::select(&opts.device)?;
    let data = open_data(&opts.cache_dir, cfg, opts.mapped_mib)?;
    let in_channels = data.channels.len();
    let model = cfg.network().build(in_channels, data.num_classes, &dev)?;
    let split = Split {
        train: data.train.iter().map(|c| c.0.clone()).collect(),
        val: data.val.iter().map(|c| c.0.clone()).collect(),
    };
    let identity = RunRecord {
        dataset: data.dataset.clone(),
        num_classes: data.num_classes,
        classes: data.classes.classes().to_vec(),
        ignore_label: data.classes.ignore(),
        channels: data.channels.clone(),
        preprocessing: Some(data.preprocessing.clone()),
        config: cfg.weight_shaping(),
        split,
    };
    prepare_run_dir(opts, &identity)?;

    let params = model.params();
    let mut optimizer = Optimizer::new(params.clone(), optimizer_kind(cfg))?;
    let objective = LossObjective::new(&cfg.loss, model.config(), &data.classes, cfg.patch, &dev);
    // Every checkpoint carries the run's record: a checkpoint folder copied alone predicts.
    let checkpointer =
        Checkpointer::new(&opts.run_dir, cfg.keep_last)?.with_record(identity.to_json());
    let mut start_step = 0u64;
    let mut best: Option<(f64, u64)> = None;
    let mut notices = Vec::new();
    if opts.resume {
        match checkpointer.latest(&dev)? {
            Some(ck) => {
                for s in &ck.skipped {
                    notices.push(format!("warning: checkpoint skipped: {s}"));
                }
                check_resumable(&ck, cfg)?;
                let at = |e: Error| Error::Train(format!("{}: {e}", ck.dir.display()));
                model.load(&ck.model).map_err(at)?;
                optimizer
                    .load_state(&ck.optimizer, ck.state.optimizer_steps)
                    .map_err(at)?;
                start_step = ck.state.step;
                best = ck.state.best_metric.zip(ck.state.best_step);
                if let Some((_, b)) = best {
                    remark_best_if_stale(&checkpointer, &opts.run_dir, b)?;
                }
            }
            None => notices.push(format!(
                "--resume: no complete checkpoint in {}, starting at step 0",
                opts.run_dir.display()
            )),
        }
    }
    if data.val.is_empty() {
        notices.push("no validation cases (val_fraction 0 or a single labelled case): no validation Dice and no best checkpoint".into());
    }
    let names: Vec<String> = data
        .classes
        .classes()
        .iter()
        .map(|c| format!("{} ({})", c.name, c.value))
        .collect();
    notices.push(format!(
        "U-Net: {} image channel{} ({}), {} stages, strides {:?}, {} parameters, {} classes: {}{}",
        in_channels,
        if in_channels == 1 { "" } else { "s" },
        data.channels.join(", "),
        model.config().strides.len() + 1,
        model.config().strides,
        model.num_parameters(),
        data.num_classes,
        names.join(", "),
        data.classes
            .ignore()
            .map(|i| format!("; label {i} ignored"))
            .unwrap_or_default()
    ));
    let metrics_path = opts.run_dir.join("metrics.jsonl");
    // A fresh run also truncates: a folder without checkpoints may hold an abandoned log.
    let mut log = MetricsLog::open(&metrics_path, Some(start_step))?;

    let accumulate = cfg.accumulate as u64;
    let train_entries: Vec<EntryReader> = data.train.iter().map(|c| c.1.clone()).collect();
    let weights: Vec<f64> = data
        .train
        .iter()
        .map(|(id, _)| cfg.case_weights.get(id).copied().unwrap_or(1.0))
        .collect();
    let sampler = Sampler::new(
        &train_entries,
        weights,
        SamplerConfig {
            patch_zyx: cfg.patch,
            batch_size: cfg.batch_size,
            fg_fraction: cfg.fg_fraction,
            seed: cfg.seed,
            skip_class: data.classes.ignore(),
        },
    )?;
    let augment = if cfg.augment {
        cfg.augmentation.clone()
    } else {
        AugmentConfig::none()
    };
    let mut loader = Loader::start(
        train_entries,
        sampler,
        LoaderConfig {
            workers: cfg.workers,
            queue_depth: cfg.queue_depth,
            augment,
            skeleton: cfg.loss.skeleton_recall > 0.0,
            centreline: cfg.loss.cldice > 0.0,
            distance: if cfg.loss.needs_distance() {
                data.classes.classes()[1..]
                    .iter()
                    .map(|c| c.value)
                    .collect()
            } else {
                Vec::new()
            },
        },
        start_step * accumulate,
    )?;

    let bar = if opts.progress {
        let b = ProgressBar::new(cfg.steps);
        b.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30.cyan/blue}] {pos}/{len} steps {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_position(start_step);
        b
    } else {
        ProgressBar::hidden()
    };
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

    let run_started = Instant::now();
    let mut window = Window::default();
    let mut totals = (0u64, Duration::ZERO); // patches, wait
    let (mut first_loss, mut last_loss) = (None, None);
    let mut last_validation = None;
    let mut interrupted = false;
    let mut halted = false;
    let clip = (cfg.clip_grad_norm > 0.0).then_some(cfg.clip_grad_norm);
    let patch = cfg.patch;
    let mut step = start_step;

    while step < cfg.steps {
        if window.started.is_none() {
            window.started = Some(Instant::now());
        }
        let mut grads: Option<Vec<Tensor>> = None;
        for _ in 0..accumulate {
            let (mut batch, waited) = loader.next()?;
            window.wait += waited;
            let n = batch.batch_size;
            let x = Tensor::from_vec(
                std::mem::take(&mut batch.image),
                (n, in_channels, patch[0], patch[1], patch[2]),
                &dev,
            )?;
            let outputs = model.forward_all(&x)?;
            let loss = objective.evaluate(&outputs, batch)?;
            loss.ensure_finite(step)?;
            let [extra, main] = loss.weighted();
            let a = accumulate as f64;
            window.cldice += loss.cldice / a;
            window.boundary += loss.boundary / a;
            window.surface += loss.surface / a;
            window.loss += extra / a;
            let g = loss.total.backward()?;
            add_grads(&mut grads, &params, &g, 1.0 / accumulate as f64)?;
            window.srec += loss.skeleton_recall / a;
            window.loss += main / a;
            window.ce += loss.ce / a;
            window.dice += loss.dice / a;
            window.patches += n as u64;
        }
        let lr = poly_lr(cfg.lr, step, cfg.steps, cfg.poly_exponent);
        let grads = grads.ok_or_else(|| Error::Train("no gradients".into()))?;
        let norm = optimizer.step(&grads, lr, clip)?;
        if norm.is_finite() {
            window.grad_norm += norm;
        } else {
            say(
                &bar,
                format!("step {}: gradient norm {norm}: update skipped", step + 1),
            );
        }
        window.steps += 1;
        step += 1;
        bar.set_position(step);

        let last = step == cfg.steps;
        if step.is_multiple_of(cfg.log_every.max(1)) || last {
            let secs = window
                .started
                .map_or(0.0, |t| t.elapsed().as_secs_f64())
                .max(1e-9);
            let k = window.steps.max(1) as f64;
            let gpu = device::gpu_memory(&dev);
            let rec = TrainRecord {
                step,
                loss: window.loss / k,
                dice_loss: window.dice / k,
                ce_loss: window.ce / k,
                lr,
                grad_norm: window.grad_norm / k,
                patches_per_s: window.patches as f64 / secs,
                data_wait_frac: window.wait.as_secs_f64() / secs,
                peak_rss_mb: sysinfo::peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64,
                elapsed_s: run_started.elapsed().as_secs_f64(),
                skeleton_recall_loss: (cfg.loss.skeleton_recall > 0.0).then(|| window.srec / k),
                cldice_loss: (cfg.loss.cldice > 0.0).then(|| window.cldice / k),
                boundary_loss: (cfg.loss.boundary > 0.0).then(|| window.boundary / k),
                surface_loss: (cfg.loss.surface > 0.0).then(|| window.surface / k),
                gpu_allocated_mb: gpu.map(|m| m.allocated as f64 / MIB),
                gpu_peak_mb: gpu.map(|m| m.peak_allocated as f64 / MIB),
            };
            // The peak restarts each interval: the log shows where memory went, not only its max.
            device::reset_gpu_peak(&dev);
            let gpu_note = rec
                .gpu_peak_mb
                .map_or(String::new(), |p| format!("  GPU peak {:.0} MiB", p));
            bar.set_message(format!(
                "loss {:.4}  {:.1} patches/s  data wait {:.1}%{gpu_note}",
                rec.loss,
                rec.patches_per_s,
                100.0 * rec.data_wait_frac
            ));
            first_loss.get_or_insert(rec.loss);
            last_loss = Some(rec.loss);
            totals.0 += window.patches;
            totals.1 += window.wait;
            log.append(&Record::Train(rec))?;
            window = Window::default();
        }

        let due_val = !opts.benchmark
            && !data.val.is_empty()
            && (last || (cfg.val_every > 0 && step.is_multiple_of(cfg.val_every)));
        let mut improved = false;
        if due_val {
            let t = Instant::now();
            bar.set_message("validating");
            let v = SlidingWindow {
                model: &model,
                device: &dev,
                patch,
                overlap: cfg.val_overlap,
                batch: cfg.batch_size,
                classes: &data.classes,
                cldice_scratch: cfg.val_cldice.then_some(opts.run_dir.as_path()),
            }
            .run(&data.val)?;
            log.append(&Record::Val(ValRecord {
                step,
                dice_per_class: v.dice_per_class.clone(),
                mean_dice: v.mean_dice,
                dice_per_case: v.dice_per_case.clone(),
                cldice_per_class: v.cldice_per_class.clone(),
                mean_cldice: cfg.val_cldice.then_some(v.mean_cldice),
                seconds: t.elapsed().as_secs_f64(),
            }))?;
            let cldice = if cfg.val_cldice {
                format!(
                    ", clDice {:.4} ({})",
                    v.mean_cldice,
                    per_class(&data.classes.foreground_names(), &v.cldice_per_class)
                )
            } else {
                String::new()
            };
            say(
                &bar,
                format!(
                    "step {step}: validation Dice {:.4} ({}){cldice} in {:.1} s",
                    v.mean_dice,
                    per_class(&data.classes.foreground_names(), &v.dice_per_class),
                    t.elapsed().as_secs_f64()
                ),
            );
            if v.mean_dice.is_finite() && best.is_none_or(|(b, _)| v.mean_dice > b) {
                best = Some((v.mean_dice, step));
                improved = true;
            }
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
            let named: Vec<(String, Tensor)> = params
                .iter()
                .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
                .collect();
            let state = TrainState {
                step,
                optimizer_steps: optimizer.steps_taken(),
                seed: cfg.seed,
                best_metric: best.map(|b| b.0),
                best_step: best.map(|b| b.1),
                config: serde_json::to_value(cfg).unwrap_or_default(),
                extra: StateExtra {
                    dataset: Some(data.dataset.clone()),
                    num_classes: Some(data.num_classes),
                },
            };
            let saved = checkpointer.save(&named, &optimizer.state_tensors()?, &state)?;
            if improved {
                checkpointer.mark_best(&saved)?;
            }
        }
        if !opts.benchmark && (due_val || last || interrupted) {
            write_plot(&metrics_path, &opts.run_dir.join("curves.png"));
        }
        if interrupted {
            say(
                &bar,
                format!("interrupted: checkpoint of step {step} written; `--resume` continues"),
            );
            break;
        }
    }
    if halted {
        bar.abandon();
    } else {
        bar.finish();
    }
    Ok(summary(
        opts,
        &data,
        &model,
        start_step,
        step,
        first_loss,
        last_loss,
        last_validation,
        best,
        interrupted,
        run_started,
        totals,
    ))
}

/// A line for the person watching: above the progress bar, or on stderr when it is hidden.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Refuse a checkpoint whose state does not fit this run (a step past its end, more optimizer
/// steps than steps) or whose tensors are not finite, naming the file.
fn check_resumable(ck: &crate::model::checkpoint::Checkpoint, cfg: &TrainConfig) -> Result<()> {
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
fn remark_best_if_stale(ck: &Checkpointer, run_dir: &Path, best_step: u64) -> Result<()> {
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

#[allow(clippy::too_many_arguments)]
fn summary(
    opts: &RunOptions,
    data: &Data,
    model: &UNet,
    start_step: u64,
    step: u64,
    first_loss: Option<f64>,
    last_loss: Option<f64>,
    last_validation: Option<ValidationResult>,
    best: Option<(f64, u64)>,
    interrupted: bool,
    started: Instant,
    totals: (u64, Duration),
) -> RunSummary {
    let secs = started.elapsed().as_secs_f64();
    RunSummary {
        run_dir: opts.run_dir.clone(),
        dataset: data.dataset.clone(),
        start_step,
        steps_done: step,
        first_loss,
        last_loss,
        last_validation,
        class_names: data.classes.foreground_names(),
        best_dice: best.map(|b| b.0),
        interrupted,
        seconds: secs,
        data_wait_frac: totals.1.as_secs_f64() / secs.max(1e-9),
        patches_per_s: totals.0 as f64 / secs.max(1e-9),
        num_parameters: model.num_parameters(),
        train_cases: data.train.len(),
        val_cases: data.val.len(),
        peak_rss: sysinfo::peak_rss_bytes(),
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
