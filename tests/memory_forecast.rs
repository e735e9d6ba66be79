//! The training step's memory forecast (`model::memory`, what `prep plan` and `train
//! --benchmark` print) against the heap this process really holds at the peak of a few
//! training steps, for plans of different shapes; and the prediction pass's (`UNet::infer`,
//! which keeps no graph) against its measured peak, which must not grow with the network's
//! depth. A counting allocator measures live bytes, which unlike RSS is the same on every
//! machine and allocator.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use candle_core::{Device, Tensor};
use common::fixtures::bundled_cache;
use voxcache::model::config::{Encoder, NetworkOptions, Norm, UNetConfig, Upsampling};
use voxcache::model::memory::inference_pass;
use voxcache::model::unet::UNet;
use voxcache::train::config::{OptimizerName, TrainConfig};
use voxcache::train::trainer::{run, RunOptions};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The counters are the process's: the tests take turns, or each would count the other's
/// allocations (the harness runs tests on parallel threads).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let now = LIVE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MIB: f64 = (1u64 << 20) as f64;

/// (forecast, measured) bytes of a few steps of `config` on the bundled cache.
fn measure(config: TrainConfig) -> (u64, u64, String) {
    let cache = bundled_cache("default", &[]);
    let run_dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        cache_dir: cache.to_path_buf(),
        run_dir: run_dir.path().to_path_buf(),
        resume: false,
        device: "cpu".into(),
        progress: false,
        config,
        halt_after: None,
        final_validation: true,
        benchmark: true,
        mapped_mib: None,
        blocks: Default::default(),
        batch_hashes: false,
    };
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let summary = run(&opts, &AtomicBool::new(false)).unwrap();
    let measured = (PEAK.load(Ordering::Relaxed) - base) as u64;
    let f = summary.forecast;
    (f.total(), measured, f.describe())
}

fn plan(patch: [usize; 3], batch: usize, features: Vec<usize>, encoder: Encoder) -> TrainConfig {
    let stages = features.len();
    TrainConfig {
        network: NetworkOptions {
            patch,
            stages,
            base_channels: features[0],
            max_channels: *features.iter().max().unwrap(),
            features,
            blocks: match encoder {
                Encoder::Plain => vec![],
                Encoder::Residual => (0..stages).map(|s| [1, 3, 4, 6][s.min(3)]).collect(),
            },
            decoder_blocks: match encoder {
                Encoder::Plain => vec![],
                Encoder::Residual => vec![1; stages - 1],
            },
            encoder,
            norm: Norm::Instance,
            ..NetworkOptions::default()
        },
        batch_size: batch,
        steps: 3,
        optimizer: OptimizerName::Sgd,
        val_every: 0,
        val_fraction: 0.0,
        checkpoint_every: 1000,
        log_every: 1,
        workers: 1,
        queue_depth: 2,
        ..TrainConfig::default()
    }
}

/// Three plans of different shapes (anisotropic and isotropic patches, plain and residual
/// encoders, batch 1 to 4): the forecast within 15% of the measured peak.
#[test]
fn forecast_is_within_15_percent_of_the_measured_peak() {
    let _turn = one_at_a_time();
    let plans = [
        plan([16, 64, 64], 4, vec![8, 16, 32, 64], Encoder::Plain),
        plan([32, 32, 32], 2, vec![16, 32, 64], Encoder::Plain),
        plan([16, 48, 48], 2, vec![8, 16, 32, 32], Encoder::Residual),
    ];
    let mut report = Vec::new();
    for p in plans {
        let what = format!(
            "{:?} x{} {:?} {}",
            p.network.patch, p.batch_size, p.network.features, p.network.encoder
        );
        let (forecast, measured, parts) = measure(p);
        let ratio = forecast as f64 / measured as f64;
        report.push((
            what,
            forecast as f64 / MIB,
            measured as f64 / MIB,
            ratio,
            parts,
        ));
    }
    for r in &report {
        eprintln!(
            "{}: forecast {:.1} MiB, measured {:.1} MiB ({:.2}); {}",
            r.0, r.1, r.2, r.3, r.4
        );
    }
    for r in &report {
        assert!(
            (0.85..=1.15).contains(&r.3),
            "{}: forecast / measured = {:.2}",
            r.0,
            r.3
        );
    }
}

/// A network of `features.len()` stages at `patch`, nnU-Net's strides for it (1x2x2 first).
fn network(
    patch: [usize; 3],
    features: Vec<usize>,
    encoder: Encoder,
    up: Upsampling,
) -> UNetConfig {
    let stages = features.len();
    let residual = encoder == Encoder::Residual;
    UNetConfig {
        in_channels: 1,
        num_classes: 3,
        base_channels: features[0],
        max_channels: *features.iter().max().unwrap(),
        strides: UNetConfig::plan_strides(patch, stages, 4),
        norm: Norm::Instance,
        upsampling: up,
        deep_supervision: false,
        kernels: vec![],
        features,
        blocks: if residual {
            (0..stages).map(|s| [1, 3, 4, 6][s.min(3)]).collect()
        } else {
            vec![]
        },
        decoder_blocks: vec![],
        encoder,
    }
}

/// Peak live heap bytes of one prediction pass of `batch` windows beyond the network and its
/// input (a first pass warms the threads' own buffers up).
fn measure_pass(net: &UNet, patch: [usize; 3], batch: usize) -> u64 {
    let x = Tensor::randn(
        0f32,
        1.0,
        (batch, 1, patch[0], patch[1], patch[2]),
        &Device::Cpu,
    )
    .unwrap();
    drop(net.infer(&x).unwrap());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let y = net.infer(&x).unwrap();
    let measured = (PEAK.load(Ordering::Relaxed) - base) as u64;
    drop(y);
    measured
}

/// The prediction pass's forecast (activations, logits and scratch) within 15% of the measured
/// peak for plain and residual encoders and both upsamplings, and the peak of a deep network
/// within 10% of a shallow one's at the same patch and widths: the pass holds the skip
/// connections and one layer, not every activation (which would double it here).
#[test]
fn prediction_pass_forecast_holds_and_its_peak_does_not_grow_with_depth() {
    let _turn = one_at_a_time();
    let patch = [16, 64, 64];
    let workers = rayon::current_num_threads();
    let cases = [
        (vec![16, 32], Encoder::Plain, Upsampling::Transpose, 2),
        (
            vec![16, 32, 64, 64, 64],
            Encoder::Plain,
            Upsampling::Transpose,
            2,
        ),
        (vec![16, 32, 64], Encoder::Plain, Upsampling::Nearest, 1),
        (
            vec![16, 32, 64, 64],
            Encoder::Residual,
            Upsampling::Transpose,
            1,
        ),
    ];
    let mut peaks = Vec::new();
    for (features, encoder, up, batch) in cases {
        let cfg = network(patch, features.clone(), encoder, up);
        let net = UNet::new(cfg.clone(), 3, &Device::Cpu).unwrap();
        let measured = measure_pass(&net, patch, batch);
        let f = inference_pass(&cfg, patch, batch, workers);
        let forecast = f.activations + f.workspace;
        let ratio = forecast as f64 / measured as f64;
        eprintln!(
            "{features:?} {encoder} {up:?} x{batch}: forecast {:.1} MiB, measured {:.1} MiB ({ratio:.2}); {}",
            forecast as f64 / MIB,
            measured as f64 / MIB,
            f.describe()
        );
        assert!(
            (0.85..=1.15).contains(&ratio),
            "{features:?} {encoder} {up:?}: forecast / measured = {ratio:.2}"
        );
        peaks.push(measured);
    }
    let (shallow, deep) = (peaks[0] as f64, peaks[1] as f64);
    assert!(
        deep <= 1.1 * shallow,
        "5 stages peak at {:.1} MiB, 2 stages at {:.1} MiB: the pass holds more than the skips and one layer",
        deep / MIB,
        shallow / MIB
    );
}
