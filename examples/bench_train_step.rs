//! Training-step benchmark: forward + backward + AdamW step of the U-Net on random data, the
//! same network and loss as scripts/torch_unet_step.py. Prints one JSON line.
//!
//! `cargo run --release --example bench_train_step -- [z,y,x] [batch] [base] [stages] [steps]
//!  [device] [max_channels] [precision] [encoder]` (device cpu, cuda or cuda:N; precision f32 or
//!  bf16; encoder plain or residual; on
//! a GPU the step is timed after the
//! device has finished it, and the peak GPU memory our tensors held is reported).

use std::time::Instant;

use candle_core::Tensor;
use voxcache::model::config::NetworkOptions;
use voxcache::model::device::{gpu_memory, reset_gpu_peak};
use voxcache::train::config::TrainConfig;
use voxcache::train::loss::{dice_ce, one_hot};
use voxcache::train::optim::{Optimizer, OptimizerKind};
use voxcache::util::rng::Rng;

// As `train` does.
#[global_allocator]
static ALLOC: voxcache::util::alloc::KeepLarge = voxcache::util::alloc::KeepLarge;

fn main() -> voxcache::Result<()> {
    voxcache::model::device::default_cpu_threads();
    // As `train` does.
    voxcache::util::sysinfo::reuse_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let patch: Vec<usize> = arg(0, "32,64,64")
        .split(',')
        .map(|v| v.parse().expect("z,y,x"))
        .collect();
    let patch = [patch[0], patch[1], patch[2]];
    let batch: usize = arg(1, "2").parse().expect("batch");
    let base: usize = arg(2, "16").parse().expect("base");
    let stages: usize = arg(3, "4").parse().expect("stages");
    let steps: usize = arg(4, "10").parse().expect("steps");
    let dev = voxcache::model::device::select(&arg(5, "cpu"))?;
    let max_channels: usize = arg(6, "128").parse().expect("max_channels");
    let precision: voxcache::model::config::Precision = arg(7, "f32").parse()?;
    let encoder = voxcache::format::training::network::Encoder::try_from(arg(8, "plain"))
        .map_err(|e| voxcache::Error::Train(e.to_string()))?;
    let cfg = TrainConfig {
        network: NetworkOptions {
            patch,
            base_channels: base,
            stages,
            max_channels,
            precision,
            encoder,
            // scripts/torch_unet_step.py's network has no deep-supervision heads, and this loss
            // reads only the full-resolution output: heads would get no gradient.
            deep_supervision: false,
            ..NetworkOptions::default()
        },
        batch_size: batch,
        ..TrainConfig::default()
    };
    let model = cfg.network().build(1, 2, &dev)?;
    let mut opt = Optimizer::new(
        model.params(),
        OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-4,
        },
    )?;
    let v: usize = patch.iter().product();
    let mut rng = Rng::new(0);
    let image: Vec<f32> = (0..batch * v).map(|_| rng.normal() as f32).collect();
    let label: Vec<u16> = (0..batch * v).map(|_| rng.chance(0.1) as u16).collect();
    let x = Tensor::from_vec(image, (batch, 1, patch[0], patch[1], patch[2]), &dev)?;
    let t = one_hot(&label, batch, 2, patch, &dev)?;
    let params = model.params();
    let peak = voxcache::util::sysinfo::PeakMemory::start();
    let mut times = Vec::new();
    let (mut fwd_t, mut bwd_t) = (Vec::new(), Vec::new());
    for i in 0..steps + 2 {
        if i == 2 {
            reset_gpu_peak(&dev);
        }
        dev.synchronize()?;
        let t0 = Instant::now();
        let pass = model.train_pass(&x)?;
        let loss = dice_ce(&pass.outputs()[0], &t)?;
        dev.synchronize()?;
        let t1 = Instant::now();
        let grads = pass.backward(&loss.total)?;
        let g: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| {
                grads
                    .get(p.as_tensor())
                    .cloned()
                    .ok_or(candle_core::Error::Msg("no grad".into()))
            })
            .collect::<candle_core::Result<_>>()?;
        dev.synchronize()?;
        let t2 = Instant::now();
        opt.step(&g, 1e-3, Some(12.0))?;
        dev.synchronize()?;
        if i >= 2 {
            times.push(t0.elapsed().as_secs_f64());
            fwd_t.push((t1 - t0).as_secs_f64());
            bwd_t.push((t2 - t1).as_secs_f64());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!(
        "{{\"impl\": \"{}\", \"device\": \"{}\", \"threads\": {}, \"patch_zyx\": {:?}, \"batch\": {batch}, \"params\": {}, \"median_step_s\": {:.4}, \"median_forward_s\": {:.4}, \"median_backward_s\": {:.4}, \"steps\": {}, \"peak_rss_mib\": {:.0}, \"peak_anon_mib\": {:.0}, \"peak_gpu_mib\": {:.0}}}",
        match precision {
            voxcache::model::config::Precision::F32 => "voxcache".to_string(),
            p => format!("voxcache {p}"),
        },
        voxcache::model::device::describe(&dev),
        rayon::current_num_threads(),
        patch,
        model.num_parameters(),
        median(&mut times.clone()),
        median(&mut fwd_t),
        median(&mut bwd_t),
        times.len(),
        voxcache::util::sysinfo::peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64,
        peak.peak().map_or(0.0, |m| m.anon as f64 / (1 << 20) as f64),
        gpu_memory(&dev).map_or(0.0, |m| m.peak_allocated as f64 / (1 << 20) as f64)
    );
    Ok(())
}
