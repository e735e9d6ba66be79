//! The training step's memory forecast (`model::memory`, what `prep plan` and `train
//! --benchmark` print) against the heap this process really holds at the peak of a few
//! training steps, for plans of different shapes. A counting allocator measures live bytes,
//! which unlike RSS is the same on every machine and allocator.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::fixtures::bundled_cache;
use voxcache::model::config::{Encoder, Norm};
use voxcache::train::config::{OptimizerName, TrainConfig};
use voxcache::train::trainer::{run, RunOptions};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

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
        patch,
        batch_size: batch,
        steps: 3,
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
    let plans = [
        plan([16, 64, 64], 4, vec![8, 16, 32, 64], Encoder::Plain),
        plan([32, 32, 32], 2, vec![16, 32, 64], Encoder::Plain),
        plan([16, 48, 48], 2, vec![8, 16, 32, 32], Encoder::Residual),
    ];
    let mut report = Vec::new();
    for p in plans {
        let what = format!(
            "{:?} x{} {:?} {}",
            p.patch, p.batch_size, p.features, p.encoder
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
