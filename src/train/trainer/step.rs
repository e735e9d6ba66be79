//! One optimizer step of a session (its batches through the network and the loss, gradients
//! summed over them, clipped and applied), and the metrics window the steps add to until the
//! next log line.

use std::io::Write;
use std::time::{Duration, Instant};

use candle_core::Tensor;

use super::say;
use super::setup::Session;
use crate::error::{Error, Result};
use crate::model::device;
use crate::train::batches::batch_hash;
use crate::train::loss::LossValue;
use crate::train::metrics::{Record, TrainRecord};
use crate::train::optim::poly_lr;
use crate::util::sysinfo;

const MIB: f64 = (1u64 << 20) as f64;

/// Running sums between two log lines.
#[derive(Default)]
pub(super) struct Window {
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

impl Window {
    /// One batch's loss, of `a` batches a step.
    fn add(&mut self, v: &LossValue, a: f64) {
        let [extra, main] = v.weighted();
        self.cldice += v.cldice / a;
        self.boundary += v.boundary / a;
        self.surface += v.surface / a;
        self.loss += extra / a;
        self.srec += v.skeleton_recall / a;
        self.loss += main / a;
        self.ce += v.ce / a;
        self.dice += v.dice / a;
    }
}

/// What the log lines of a session add up to: the open window, the patches and data wait of
/// the windows logged, the first and last logged mean loss.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) window: Window,
    /// Patches and data wait of the logged windows.
    pub(super) totals: (u64, Duration),
    pub(super) first_loss: Option<f64>,
    pub(super) last_loss: Option<f64>,
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

impl Session<'_> {
    /// Optimizer step `step + 1` (`step` steps are done): `accumulate` batches through the
    /// network and the loss, their gradients summed, clipped and applied at the step's
    /// learning rate, which is returned. A step whose gradient norm is not finite is skipped.
    pub(super) fn step(&mut self, step: u64, window: &mut Window) -> Result<f64> {
        let cfg = self.cfg;
        if window.started.is_none() {
            window.started = Some(Instant::now());
        }
        let (accumulate, patch) = (cfg.accumulate as u64, cfg.network.patch);
        let in_channels = self.data.channels.len();
        let mut grads: Option<Vec<Tensor>> = None;
        for _ in 0..accumulate {
            let (mut batch, waited) = self.loader.next()?;
            window.wait += waited;
            if let Some(out) = &mut self.hashes {
                let hash = batch_hash(&batch.image, &batch.label);
                writeln!(out, "{{\"batch\":{},\"hash\":\"{hash}\"}}", batch.step)
                    .and_then(|_| out.flush())
                    .map_err(|e| Error::io(self.opts.run_dir.join("batch_hashes.jsonl"), e))?;
            }
            let n = batch.batch_size;
            let x = Tensor::from_vec(
                std::mem::take(&mut batch.image),
                (n, in_channels, patch[0], patch[1], patch[2]),
                &self.dev,
            )?;
            let pass = self.model.train_pass(&x)?;
            let loss = self.objective.evaluate(pass.outputs(), batch)?;
            loss.ensure_finite(step)?;
            let g = pass.backward(&loss.total)?;
            add_grads(&mut grads, &self.params, &g, 1.0 / accumulate as f64)?;
            window.add(&loss, accumulate as f64);
            window.patches += n as u64;
        }
        let lr = poly_lr(cfg.lr, step, cfg.steps, cfg.poly_exponent);
        let grads = grads.ok_or_else(|| Error::Train("no gradients".into()))?;
        let clip = (cfg.clip_grad_norm > 0.0).then_some(cfg.clip_grad_norm);
        let norm = self.optimizer.step(&grads, lr, clip)?;
        if norm.is_finite() {
            window.grad_norm += norm;
        } else {
            say(
                &self.bar,
                format!("step {}: gradient norm {norm}: update skipped", step + 1),
            );
        }
        window.steps += 1;
        Ok(lr)
    }

    /// Append the window's means as the metrics line of `step` (learning rate `lr`), show them
    /// on the progress bar, and open the next window.
    pub(super) fn log_window(&mut self, step: u64, lr: f64, tally: &mut Tally) -> Result<()> {
        let (cfg, window) = (self.cfg, &tally.window);
        let secs = window
            .started
            .map_or(0.0, |t| t.elapsed().as_secs_f64())
            .max(1e-9);
        let k = window.steps.max(1) as f64;
        let gpu = device::gpu_memory(&self.dev);
        let peak = self.peak_memory.peak();
        let rec = TrainRecord {
            step,
            loss: window.loss / k,
            dice_loss: window.dice / k,
            ce_loss: window.ce / k,
            lr,
            grad_norm: window.grad_norm / k,
            patches_per_s: window.patches as f64 / secs,
            data_wait_frac: window.wait.as_secs_f64() / secs,
            peak_rss_mb: sysinfo::peak_rss_bytes().unwrap_or(0) as f64 / MIB,
            peak_anon_mb: peak.map(|m| m.anon as f64 / MIB),
            base_anon_mb: self.base_memory.map(|m| m.anon as f64 / MIB),
            peak_file_mb: peak.map(|m| m.file as f64 / MIB),
            elapsed_s: self.started.elapsed().as_secs_f64(),
            skeleton_recall_loss: (cfg.loss.skeleton_recall > 0.0).then(|| window.srec / k),
            cldice_loss: (cfg.loss.cldice > 0.0).then(|| window.cldice / k),
            boundary_loss: (cfg.loss.boundary > 0.0).then(|| window.boundary / k),
            surface_loss: (cfg.loss.surface > 0.0).then(|| window.surface / k),
            gpu_allocated_mb: gpu.map(|m| m.allocated as f64 / MIB),
            gpu_peak_mb: gpu.map(|m| m.peak_allocated as f64 / MIB),
        };
        // The peak restarts each interval: the log shows where memory went, not only its max.
        device::reset_gpu_peak(&self.dev);
        let gpu_note = rec
            .gpu_peak_mb
            .map_or(String::new(), |p| format!("  GPU peak {:.0} MiB", p));
        self.bar.set_message(format!(
            "loss {:.4}  {:.1} patches/s  data wait {:.1}%{gpu_note}",
            rec.loss,
            rec.patches_per_s,
            100.0 * rec.data_wait_frac
        ));
        tally.first_loss.get_or_insert(rec.loss);
        tally.last_loss = Some(rec.loss);
        tally.totals.0 += window.patches;
        tally.totals.1 += window.wait;
        self.log.append(&Record::Train(rec))?;
        tally.window = Window::default();
        Ok(())
    }
}
