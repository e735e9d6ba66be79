//! Export the U-Net's weights, a forward pass and one loss gradient for the PyTorch cross-check
//! (scripts/torch_crosscheck.py).
//!
//! `cargo run --release --example export_forward -- OUT_DIR [z,y,x] [base] [stages] [classes]`
//!
//! Writes OUT_DIR/weights.safetensors (every parameter by name), OUT_DIR/io.safetensors
//! ("input", "labels", "logits", "loss", "grad/<name>" for every parameter, "side/<i>": 1
//! where the i-th LeakyReLU's input is above 0) and prints the
//! network's configuration as one JSON line.
//!
//! The model's own initialization has zero biases and unit norm weights, which would leave the
//! mapping of those parameters untested; they get small seeded perturbations before the pass.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use voxcache::model::config::NetworkOptions;
use voxcache::train::config::TrainConfig;
use voxcache::train::loss::{dice_ce, one_hot};
use voxcache::util::rng::Rng;
use voxcache::Error;

fn main() -> voxcache::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        Error::Config("usage: export_forward OUT_DIR [z,y,x] [base] [stages] [classes]".to_string())
    };
    let out = PathBuf::from(args.first().ok_or_else(usage)?);
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let num = |s: &str| s.trim().parse::<usize>().map_err(|_| usage());
    let patch: Vec<usize> = arg(1, "16,48,48")
        .split(',')
        .map(num)
        .collect::<voxcache::Result<_>>()?;
    let patch: [usize; 3] = patch.try_into().map_err(|_| usage())?;
    let base = num(&arg(2, "8"))?;
    let stages = num(&arg(3, "4"))?;
    let classes = num(&arg(4, "2"))?;
    let batch = 2;

    let cfg = TrainConfig {
        network: NetworkOptions {
            patch,
            base_channels: base,
            stages,
            seed: 7,
            // scripts/torch_crosscheck.py builds the network without deep-supervision heads,
            // and this loss reads only the full-resolution output.
            deep_supervision: false,
            ..NetworkOptions::default()
        },
        batch_size: batch,
        ..TrainConfig::default()
    };
    let dev = Device::Cpu;
    let model = cfg.network().build(1, classes, &dev)?;
    let params = model.params();

    // Perturb biases and norm weights (initially 0 and 1) so their mapping is checked too.
    let mut prng = Rng::derive(cfg.network.seed, &[0xc0ffee]);
    for (_, var) in &params {
        if var.rank() == 1 {
            let vals: Vec<f32> = var
                .as_tensor()
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v + (0.1 * prng.normal()) as f32)
                .collect();
            var.set(&Tensor::from_vec(vals, var.dims(), &dev)?)?;
        }
    }

    let v: usize = patch.iter().product();
    let mut rng = Rng::derive(cfg.network.seed, &[0x1abe1]);
    let image: Vec<f32> = (0..batch * v).map(|_| rng.normal() as f32).collect();
    let labels: Vec<u16> = (0..batch * v)
        .map(|_| rng.below(classes as u64) as u16)
        .collect();
    let x = Tensor::from_vec(image, (batch, 1, patch[0], patch[1], patch[2]), &dev)?;
    let target = one_hot(&labels, batch, classes, patch, &dev)?;

    let (logits, activations) = model.forward_traced(&x)?;
    let loss = dice_ce(&logits, &target)?;
    let grads = loss.total.backward()?;

    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    let weights: HashMap<String, Tensor> = params
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&weights, out.join("weights.safetensors"))?;

    let mut io: HashMap<String, Tensor> = HashMap::new();
    io.insert("input".into(), x);
    io.insert(
        "labels".into(),
        Tensor::from_vec(
            labels.iter().map(|&l| l as u32).collect::<Vec<u32>>(),
            (batch, patch[0], patch[1], patch[2]),
            &dev,
        )?,
    );
    io.insert("logits".into(), logits);
    // Which side of 0 each LeakyReLU took (1 above): the reference takes the same sides, so a
    // float32 near tie there does not read as a gradient error.
    for (i, y) in activations.iter().enumerate() {
        io.insert(format!("side/{i}"), y.gt(0f32)?);
    }
    io.insert("loss".into(), loss.total.detach().reshape(1)?);
    for (name, var) in &params {
        let g = grads
            .get(var.as_tensor())
            .ok_or_else(|| Error::Train(format!("no gradient for {name}")))?;
        io.insert(format!("grad/{name}"), g.clone());
    }
    candle_core::safetensors::save(&io, out.join("io.safetensors"))?;

    println!(
        "{}",
        serde_json::json!({
            "patch_zyx": patch,
            "batch": batch,
            "in_channels": model.config().in_channels,
            "num_classes": classes,
            "base_channels": model.config().base_channels,
            "max_channels": model.config().max_channels,
            "stages": stages,
            "strides": model.config().strides,
            "norm": model.config().norm,
            "upsampling": model.config().upsampling,
            "params": model.num_parameters(),
            "loss": loss.ce + loss.dice_loss,
            "ce": loss.ce,
            "dice_loss": loss.dice_loss,
        })
    );
    Ok(())
}
