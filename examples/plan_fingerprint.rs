//! Our planner on an nnU-Net fingerprint, for the cross-check against nnU-Net's planner
//! (scripts/planner_check.py, which runs the numpy reference beside it):
//!
//!   cargo run --example plan_fingerprint -- dataset_fingerprint.json dataset.json PRESET
//!
//! PRESET: default, resenc-m, resenc-l, resenc-xl. Reads `spacings` and `shapes_after_crop`
//! (z, y, x) of the fingerprint, `labels` and `numTraining` of dataset.json; prints one JSON
//! object: `transpose_forward` and, per configuration, the planner's axis order's spacing,
//! median shape, patch, batch size, strides, kernels, features and blocks.

use serde_json::{json, Value};
use voxcache::planner::{plan_experiment, Fingerprint, Preset};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        args.len() == 3,
        "usage: plan_fingerprint dataset_fingerprint.json dataset.json PRESET"
    );
    let read = |p: &str| -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&std::fs::read_to_string(p)?)?)
    };
    let (fp, dj) = (read(&args[0])?, read(&args[1])?);
    let three = |v: &Value| -> anyhow::Result<[f64; 3]> {
        let a = v.as_array().filter(|a| a.len() == 3);
        let a = a.ok_or_else(|| anyhow::anyhow!("not three numbers: {v}"))?;
        let mut out = [0.0; 3];
        for (o, x) in out.iter_mut().zip(a) {
            *o = x
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("not a number: {x}"))?;
        }
        Ok(out)
    };
    let list = |key: &str| -> anyhow::Result<Vec<[f64; 3]>> {
        fp[key]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("{}: no {key}", args[0]))?
            .iter()
            .map(three)
            .collect()
    };
    let fingerprint = Fingerprint {
        spacings: list("spacings")?,
        shapes: list("shapes_after_crop")?
            .into_iter()
            .map(|s| s.map(|x| x as usize))
            .collect(),
        num_classes: dj["labels"].as_object().map_or(0, |l| l.len()),
        num_training: dj["numTraining"].as_u64().unwrap_or(0) as usize,
    };
    let preset: Preset = args[2].parse()?;
    let plans = plan_experiment(&fingerprint, preset)?;
    let mut configurations = serde_json::Map::new();
    for (name, c) in plans.configurations() {
        configurations.insert(
            name.to_string(),
            json!({
                "spacing": c.spacing, "median_shape": c.median_shape, "patch_size": c.patch,
                "batch_size": c.batch_size, "strides": c.strides, "kernel_sizes": c.kernels,
                "features_per_stage": c.features, "blocks": c.blocks,
                "decoder_blocks": c.decoder_blocks,
            }),
        );
    }
    println!(
        "{}",
        json!({"transpose_forward": plans.transpose, "configurations": configurations})
    );
    Ok(())
}
