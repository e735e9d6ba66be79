//! Our networks against dynamic-network-architectures 0.4.4, the package nnU-Net 2.8.1 builds
//! its networks with. `scripts/resenc_check.py` (run where PyTorch is installed) wrote the
//! files under tests/fixtures/network_crosscheck: dna's outputs for a small residual-encoder
//! U-Net with random weights under our names, and dna's parameter counts for every stored
//! nnU-Net plan (plain and residual).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use serde_json::Value;
use voxcache::model::config::{Encoder, Norm, UNetConfig, Upsampling};
use voxcache::model::unet::UNet;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/network_crosscheck")
}

fn read_json(path: PathBuf) -> Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Same weights, same input: our logits at every supervised level equal dna's within 1e-4
/// of the largest logit, and every dna parameter but the lowest seg layer has one of ours.
#[test]
fn residual_encoder_unet_matches_dna() {
    let meta = read_json(fixtures().join("resenc_small.json"));
    let config: UNetConfig = serde_json::from_value(meta["config"].clone()).unwrap();
    assert_eq!(config.encoder, Encoder::Residual);
    let mut tensors =
        candle_core::safetensors::load(fixtures().join("resenc_small.safetensors"), &Device::Cpu)
            .unwrap();
    let x = tensors.remove("input").unwrap();
    let mut outputs: Vec<Tensor> = (0..)
        .map_while(|i| tensors.remove(&format!("logits.{i}")))
        .collect();
    let net = UNet::new(config, 0, &Device::Cpu).unwrap();
    assert_eq!(
        net.num_parameters() as u64,
        meta["parameters"].as_u64().unwrap()
    );
    net.load(&tensors).unwrap();
    let ours = net.forward_all(&x).unwrap();
    // dna also computes the lowest decoder level's output, which nnU-Net weights 0.
    assert_eq!(ours.len() + 1, outputs.len());
    outputs.truncate(ours.len());
    for (level, (a, b)) in ours.iter().zip(&outputs).enumerate() {
        assert_eq!(a.dims(), b.dims(), "level {level}");
        let largest_abs = |t: &Tensor| {
            t.abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        let largest = largest_abs(b);
        let diff = largest_abs(&(a - b).unwrap());
        assert!(
            diff <= 1e-4 * largest,
            "level {level}: largest difference {diff}, largest logit {largest}"
        );
    }
}

/// nnU-Net's plan's network (arch_kwargs) in our spelling: 2D plans as one-voxel-deep 3D.
fn config_of(arch: &Value) -> UNetConfig {
    let k = &arch["arch_kwargs"];
    let zyx = |v: &Value| -> Vec<[usize; 3]> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let s: Vec<usize> = serde_json::from_value(s.clone()).unwrap();
                match s[..] {
                    [y, x] => [1, y, x],
                    [z, y, x] => [z, y, x],
                    _ => panic!("{s:?}"),
                }
            })
            .collect()
    };
    let list = |key: &str| -> Vec<usize> { serde_json::from_value(k[key].clone()).unwrap() };
    let residual = arch["network_class_name"]
        .as_str()
        .unwrap()
        .ends_with("ResidualEncoderUNet");
    let features = list("features_per_stage");
    let mut decoder_blocks = list("n_conv_per_stage_decoder");
    decoder_blocks.reverse(); // dna lists them from the deepest; we from full resolution
    UNetConfig {
        in_channels: 1,
        num_classes: 2,
        base_channels: features[0],
        max_channels: *features.iter().max().unwrap(),
        strides: zyx(&k["strides"])[1..].to_vec(),
        norm: Norm::Instance,
        upsampling: Upsampling::Transpose,
        deep_supervision: true,
        kernels: zyx(&k["kernel_sizes"]),
        features,
        blocks: list(if residual {
            "n_blocks_per_stage"
        } else {
            "n_conv_per_stage"
        }),
        decoder_blocks,
        encoder: if residual {
            Encoder::Residual
        } else {
            Encoder::Plain
        },
    }
}

/// Every configuration of the stored plans (4 presets, 2 datasets, 2d / 3d_fullres /
/// 3d_lowres) builds a network with dna's parameter count less its unused lowest seg layer.
#[test]
fn planned_networks_have_dnas_parameter_counts() {
    let counts = read_json(fixtures().join("parameter_counts.json"));
    let plans_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/nnunet_plans");
    let mut built: HashMap<String, usize> = HashMap::new();
    let mut seen = BTreeSet::new();
    for row in counts.as_array().unwrap() {
        let plans = read_json(plans_dir.join(row["plans"].as_str().unwrap()));
        let name = row["configuration"].as_str().unwrap();
        let config = config_of(&plans["configurations"][name]["architecture"]);
        let key = serde_json::to_string(&config).unwrap();
        // Presets share networks (M, L and XL differ in patch and batch, often not in shape):
        // each one is built once.
        let ours = *built.entry(key).or_insert_with(|| {
            UNet::new(config.clone(), 0, &Device::Cpu)
                .unwrap()
                .num_parameters()
        });
        let want =
            row["dna_parameters"].as_u64().unwrap() - row["lowest_seg_layer"].as_u64().unwrap();
        assert_eq!(ours as u64, want, "{} {name}", row["plans"]);
        seen.insert(config.encoder.name());
    }
    assert_eq!(seen.len(), 2, "both encoders were checked");
}
