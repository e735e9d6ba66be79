//! `plans.json`, reduced to one configuration (its parent's fields filled in) and checked.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::{bad, read_json};
use crate::error::Result;
use crate::format::normalization::{Normalization, SchemeStatistics};

/// How nnU-Net resamples one kind of array (`resampling_fn_*` and its kwargs).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Resampling {
    /// Spline order in the plane (3 for images, 1 for logits).
    pub order: usize,
    /// Order along the low-resolution axis when it is resampled separately.
    #[serde(default)]
    pub order_z: usize,
    /// `None`: decided from the spacings (anisotropy over 3); `Some(b)`: forced.
    #[serde(default)]
    pub force_separate_z: Option<bool>,
}

/// One channel's foreground intensity statistics (CT normalization uses them).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct IntensityProperties {
    /// Mean of the foreground voxels.
    pub mean: f64,
    /// Standard deviation of the foreground voxels.
    pub std: f64,
    /// 0.5th percentile.
    pub percentile_00_5: f64,
    /// 99.5th percentile.
    pub percentile_99_5: f64,
}

/// The network of a configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Architecture {
    /// `PlainConvUNet` or `ResidualEncoderUNet` (the class name, without its module).
    pub class: String,
    /// Spatial dimensions of the convolutions: 2 or 3.
    pub dims: usize,
    /// Channels per stage.
    pub features: Vec<usize>,
    /// Kernel of each stage (2 or 3 numbers each).
    pub kernels: Vec<Vec<usize>>,
    /// Stride of each stage (the first is all ones).
    pub strides: Vec<Vec<usize>>,
    /// Convolutions (plain) or residual blocks (residual encoder) per encoder stage.
    pub encoder_blocks: Vec<usize>,
    /// Convolutions per decoder stage, deepest first (as nnU-Net lists them).
    pub decoder_convs: Vec<usize>,
}

/// One configuration (`3d_fullres`, `2d`, ...) with its parent's fields filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Configuration {
    /// Its name in the plans.
    pub name: String,
    /// Sliding-window size, (z, y, x) or (y, x) for 2d, in the transposed axis order.
    pub patch_size: Vec<usize>,
    /// Target spacing, as long as `patch_size`.
    pub spacing: Vec<f64>,
    /// Normalization scheme per channel, one of nnU-Net's five
    /// ([`Normalization::from_nnunet`]).
    pub normalization_schemes: Vec<Normalization>,
    /// Per channel: normalize inside the nonzero mask only.
    pub use_mask_for_norm: Vec<bool>,
    /// How images are resampled to the target spacing.
    pub resampling_data: Resampling,
    /// How logits are resampled back.
    pub resampling_probabilities: Resampling,
    /// How training segmentations are resampled (`None` when the plans lack it: a model's
    /// inference never needs it).
    pub resampling_seg: Option<Resampling>,
    /// The network.
    pub architecture: Architecture,
    /// Set for a cascade's second stage.
    pub previous_stage: Option<String>,
}

/// `plans.json`, reduced to one configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Plans {
    /// The file.
    pub path: PathBuf,
    /// `dataset_name`.
    pub dataset_name: String,
    /// `plans_name`.
    pub plans_name: String,
    /// `image_reader_writer` (how nnU-Net read the images).
    pub image_reader_writer: String,
    /// Axis permutation applied to (z, y, x) arrays before everything else.
    pub transpose_forward: [usize; 3],
    /// Its inverse.
    pub transpose_backward: [usize; 3],
    /// Per channel, by index.
    pub intensity_properties: Vec<Option<IntensityProperties>>,
    /// The configuration asked for.
    pub configuration: Configuration,
    /// Every configuration the plans hold (for messages).
    pub configuration_names: Vec<String>,
}

fn permutation(path: &Path, key: &str, v: Option<&Value>) -> Result<[usize; 3]> {
    let p: Vec<usize> = v
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .ok_or_else(|| bad(path, format!("{key} is missing or not a list of axes")))?;
    let mut sorted = p.clone();
    sorted.sort_unstable();
    if sorted != [0, 1, 2] {
        return Err(bad(
            path,
            format!("{key} {p:?} is not a permutation of 0, 1, 2"),
        ));
    }
    Ok([p[0], p[1], p[2]])
}

/// The configuration `name`, with the fields of the one it inherits from (one level or more).
fn resolved(path: &Path, all: &serde_json::Map<String, Value>, name: &str) -> Result<Value> {
    let mut chain = vec![name.to_string()];
    let mut merged = serde_json::Map::new();
    let mut cur = name.to_string();
    loop {
        let c = all.get(&cur).and_then(Value::as_object).ok_or_else(|| {
            bad(
                path,
                format!(
                    "configuration {cur:?} is not in the plans (they have {})",
                    all.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        for (k, v) in c {
            merged.entry(k.clone()).or_insert_with(|| v.clone());
        }
        match c.get("inherits_from").and_then(Value::as_str) {
            Some(parent) if chain.iter().any(|n| n == parent) => {
                return Err(bad(
                    path,
                    format!("configurations inherit in a loop: {chain:?}"),
                ))
            }
            Some(parent) => {
                chain.push(parent.to_string());
                cur = parent.to_string();
            }
            None => break,
        }
    }
    Ok(Value::Object(merged))
}

fn field<T: serde::de::DeserializeOwned>(
    path: &Path,
    c: &Value,
    cfg: &str,
    key: &str,
) -> Result<T> {
    let v = c
        .get(key)
        .ok_or_else(|| bad(path, format!("configuration {cfg}: {key} is missing")))?;
    serde_json::from_value(v.clone())
        .map_err(|e| bad(path, format!("configuration {cfg}: {key}: {e}")))
}

fn architecture(path: &Path, c: &Value, cfg: &str) -> Result<Architecture> {
    let arch = c
        .get("architecture")
        .ok_or_else(|| bad(path, format!("configuration {cfg}: no architecture (plans of nnU-Net before 2.4 are not read: re-plan with nnU-Net 2.4 or later)")))?;
    let full: String = field(path, arch, cfg, "network_class_name")?;
    let class = full.rsplit('.').next().unwrap_or(&full).to_string();
    let k = arch.get("arch_kwargs").ok_or_else(|| {
        bad(
            path,
            format!("configuration {cfg}: architecture has no arch_kwargs"),
        )
    })?;
    let text = |key: &str| k.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let conv = text("conv_op");
    let dims = if conv.ends_with("Conv3d") {
        3
    } else if conv.ends_with("Conv2d") {
        2
    } else {
        return Err(bad(
            path,
            format!(
                "configuration {cfg}: conv_op {conv:?}: only Conv2d and Conv3d networks are read"
            ),
        ));
    };
    let norm = text("norm_op");
    if !norm.ends_with(&format!("InstanceNorm{dims}d")) {
        return Err(bad(path, format!("configuration {cfg}: norm_op {norm:?}: only instance norm (nnU-Net's default) is reproduced")));
    }
    let affine = k["norm_op_kwargs"]["affine"].as_bool().unwrap_or(false);
    let eps = k["norm_op_kwargs"]["eps"].as_f64().unwrap_or(0.0);
    if !affine || (eps - 1e-5).abs() > 1e-12 {
        return Err(bad(path, format!("configuration {cfg}: norm_op_kwargs {}: only affine instance norm with eps 1e-5 is reproduced", k["norm_op_kwargs"])));
    }
    let nonlin = text("nonlin");
    let slope = k["nonlin_kwargs"]["negative_slope"]
        .as_f64()
        .unwrap_or(0.01);
    if !nonlin.ends_with("LeakyReLU") || (slope - 0.01).abs() > 1e-12 {
        return Err(bad(
            path,
            format!(
                "configuration {cfg}: nonlin {nonlin:?} {}: only LeakyReLU 0.01 is reproduced",
                k["nonlin_kwargs"]
            ),
        ));
    }
    if !k["dropout_op"].is_null() {
        return Err(bad(
            path,
            format!(
                "configuration {cfg}: dropout_op {}: networks with dropout are not read",
                k["dropout_op"]
            ),
        ));
    }
    if k.get("conv_bias").and_then(Value::as_bool) != Some(true) {
        return Err(bad(
            path,
            format!("configuration {cfg}: conv_bias must be true (nnU-Net's default)"),
        ));
    }
    let (blocks_key, residual) = match class.as_str() {
        "PlainConvUNet" => ("n_conv_per_stage", false),
        "ResidualEncoderUNet" => ("n_blocks_per_stage", true),
        other => return Err(bad(path, format!("configuration {cfg}: network {other}: only PlainConvUNet and ResidualEncoderUNet are read"))),
    };
    let _ = residual;
    let list = |key: &str| -> Result<Value> {
        k.get(key).cloned().ok_or_else(|| {
            bad(
                path,
                format!("configuration {cfg}: arch_kwargs.{key} is missing"),
            )
        })
    };
    let parse = |key: &str| -> Result<Vec<usize>> {
        serde_json::from_value(list(key)?)
            .map_err(|e| bad(path, format!("configuration {cfg}: arch_kwargs.{key}: {e}")))
    };
    let nested = |key: &str| -> Result<Vec<Vec<usize>>> {
        serde_json::from_value(list(key)?)
            .map_err(|e| bad(path, format!("configuration {cfg}: arch_kwargs.{key}: {e}")))
    };
    let stages: usize = serde_json::from_value(list("n_stages")?).map_err(|e| {
        bad(
            path,
            format!("configuration {cfg}: arch_kwargs.n_stages: {e}"),
        )
    })?;
    let a = Architecture {
        class,
        dims,
        features: parse("features_per_stage")?,
        kernels: nested("kernel_sizes")?,
        strides: nested("strides")?,
        encoder_blocks: parse(blocks_key)?,
        decoder_convs: parse("n_conv_per_stage_decoder")?,
    };
    let ok = stages >= 2
        && a.features.len() == stages
        && a.kernels.len() == stages
        && a.strides.len() == stages
        && a.encoder_blocks.len() == stages
        && a.decoder_convs.len() == stages - 1
        && a.kernels
            .iter()
            .chain(&a.strides)
            .all(|v| v.len() == dims && v.iter().all(|&x| x > 0))
        && a.features.iter().all(|&f| f > 0)
        && a.encoder_blocks
            .iter()
            .chain(&a.decoder_convs)
            .all(|&b| b > 0)
        && a.kernels.iter().all(|v| v.iter().all(|&x| x % 2 == 1))
        && a.strides[0].iter().all(|&s| s == 1);
    if !ok {
        return Err(bad(path, format!("configuration {cfg}: arch_kwargs do not describe a {stages}-stage {dims}D U-Net (lists of n_stages entries, odd kernels, a first stride of ones)")));
    }
    Ok(a)
}

/// The most voxels a patch may have: 1024^3, 64 times nnU-Net's planned 256^3 and
/// beyond any memory a forecast allows; a bound that keeps the size arithmetic exact.
const MAX_PATCH_VOXELS: u64 = 1 << 30;

/// The configuration's patch and spacing, each field named in errors
/// (`configurations.CFG.patch_size`): one entry per network axis, a finite positive spacing, a
/// patch side divisible by the product of the strides along its axis (what nnU-Net's planner
/// guarantees: each pooling halves a whole number of voxels, and the decoder's skips meet), and
/// a patch of at most [`MAX_PATCH_VOXELS`].
fn check_sizes(
    path: &Path,
    cfg: &str,
    arch: &Architecture,
    patch: &[usize],
    spacing: &[f64],
) -> Result<()> {
    let dims = arch.dims;
    let field = |f: &str| format!("configurations.{cfg}.{f}");
    if patch.len() != dims || patch.contains(&0) {
        return Err(bad(
            path,
            format!(
                "{} {patch:?}: give {dims} positive sides (a {dims}D network)",
                field("patch_size")
            ),
        ));
    }
    if spacing.len() != dims || spacing.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return Err(bad(
            path,
            format!(
                "{} {spacing:?}: give {dims} finite positive spacings",
                field("spacing")
            ),
        ));
    }
    for (a, &side) in patch.iter().enumerate() {
        let product = arch
            .strides
            .iter()
            .try_fold(1usize, |p, s| p.checked_mul(s[a]))
            .unwrap_or(usize::MAX);
        if side % product != 0 {
            return Err(bad(
                path,
                format!(
                    "{} {patch:?}: side {side} (axis {a}) is not divisible by {product}, the product of the strides along it (architecture.arch_kwargs.strides {:?}); the network cannot pool and join it back",
                    field("patch_size"),
                    arch.strides
                ),
            ));
        }
    }
    let voxels = patch
        .iter()
        .try_fold(1u64, |v, &s| v.checked_mul(s as u64))
        .unwrap_or(u64::MAX);
    if voxels > MAX_PATCH_VOXELS {
        return Err(bad(
            path,
            format!(
                "{} {patch:?}: {voxels} voxels a window, over the {MAX_PATCH_VOXELS} any machine here could predict",
                field("patch_size")
            ),
        ));
    }
    Ok(())
}

impl Plans {
    /// Read `plans.json` and resolve `configuration` in it.
    pub fn read(path: &Path, configuration: &str) -> Result<Plans> {
        let v = read_json(path)?;
        let all = v
            .get("configurations")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(path, "no configurations: not an nnU-Net v2 plans file"))?;
        let c = resolved(path, all, configuration)?;
        let cfg = configuration;
        let arch = architecture(path, &c, cfg)?;
        let patch_size: Vec<usize> = field(path, &c, cfg, "patch_size")?;
        let spacing: Vec<f64> = field(path, &c, cfg, "spacing")?;
        let scheme_names: Vec<String> = field(path, &c, cfg, "normalization_schemes")?;
        let use_mask_for_norm: Vec<bool> = field(path, &c, cfg, "use_mask_for_norm")?;
        for (key, fun) in [
            ("resampling_fn_data", "resample_data_or_seg_to_shape"),
            (
                "resampling_fn_probabilities",
                "resample_data_or_seg_to_shape",
            ),
        ] {
            let f: String = field(path, &c, cfg, key)?;
            if f != fun {
                return Err(bad(
                    path,
                    format!("configuration {cfg}: {key} {f:?}: only nnU-Net's {fun} is reproduced"),
                ));
            }
        }
        let resampling_data: Resampling = field(path, &c, cfg, "resampling_fn_data_kwargs")?;
        let resampling_probabilities: Resampling =
            field(path, &c, cfg, "resampling_fn_probabilities_kwargs")?;
        if resampling_data.order > 3
            || resampling_probabilities.order > 3
            || resampling_data.order_z > 1
            || resampling_probabilities.order_z > 1
        {
            return Err(bad(path, format!("configuration {cfg}: resampling orders above 3 (in plane) or 1 (separate axis) are not reproduced")));
        }
        let resampling_seg = match c.get("resampling_fn_seg") {
            None => None,
            Some(_) => {
                let f: String = field(path, &c, cfg, "resampling_fn_seg")?;
                if f != "resample_data_or_seg_to_shape" {
                    return Err(bad(path, format!("configuration {cfg}: resampling_fn_seg {f:?}: only nnU-Net's resample_data_or_seg_to_shape is reproduced")));
                }
                let r: Resampling = field(path, &c, cfg, "resampling_fn_seg_kwargs")?;
                if r.order > 3 || r.order_z > 1 {
                    return Err(bad(path, format!("configuration {cfg}: segmentation resampling orders above 3 (in plane) or 1 (separate axis) are not reproduced")));
                }
                Some(r)
            }
        };
        check_sizes(path, cfg, &arch, &patch_size, &spacing)?;
        if scheme_names.is_empty() || scheme_names.len() != use_mask_for_norm.len() {
            return Err(bad(path, format!("configuration {cfg}: normalization_schemes and use_mask_for_norm must name each channel once")));
        }
        let normalization_schemes = scheme_names
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Normalization::from_nnunet(s).ok_or_else(|| {
                    bad(
                        path,
                        format!(
                            "configuration {cfg}: channel {i}: normalization {s:?} is not one nnU-Net ships ({})",
                            Normalization::nnunet_names()
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut intensity_properties = vec![None; normalization_schemes.len()];
        if let Some(props) = v
            .get("foreground_intensity_properties_per_channel")
            .and_then(Value::as_object)
        {
            for (k, p) in props {
                if let Ok(i) = k.parse::<usize>() {
                    if i < intensity_properties.len() {
                        intensity_properties[i] = serde_json::from_value(p.clone()).ok();
                    }
                }
            }
        }
        for (i, s) in normalization_schemes.iter().enumerate() {
            if s.statistics() == SchemeStatistics::DatasetForeground
                && intensity_properties[i].is_none()
            {
                return Err(bad(path, format!("channel {i} is CT-normalized but foreground_intensity_properties_per_channel has no mean, std and percentiles for it")));
            }
        }
        let text = |key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_string();
        Ok(Plans {
            path: path.to_path_buf(),
            dataset_name: text("dataset_name"),
            plans_name: text("plans_name"),
            image_reader_writer: text("image_reader_writer"),
            transpose_forward: permutation(path, "transpose_forward", v.get("transpose_forward"))?,
            transpose_backward: permutation(
                path,
                "transpose_backward",
                v.get("transpose_backward"),
            )?,
            intensity_properties,
            configuration: Configuration {
                name: configuration.to_string(),
                patch_size,
                spacing,
                normalization_schemes,
                use_mask_for_norm,
                resampling_data,
                resampling_probabilities,
                resampling_seg,
                architecture: arch,
                previous_stage: c
                    .get("previous_stage")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
            configuration_names: all.keys().cloned().collect(),
        })
    }

    /// Image channels the model takes.
    pub fn channels(&self) -> usize {
        self.configuration.normalization_schemes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ct3d fixture's plans with 3d_fullres's `normalization_schemes` set to `schemes`
    /// (one channel each, no mask), written in `dir`.
    fn plans_with(dir: &Path, schemes: &[&str]) -> PathBuf {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "tests/fixtures/nnunet_models/ct3d/nnUNetTrainer__nnUNetPlans__3d_fullres/plans.json",
        );
        let mut v: Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
        let c = &mut v["configurations"]["3d_fullres"];
        c["normalization_schemes"] = serde_json::json!(schemes);
        c["use_mask_for_norm"] = serde_json::json!(vec![false; schemes.len()]);
        let path = dir.join("plans.json");
        std::fs::write(&path, v.to_string()).unwrap();
        path
    }

    #[test]
    fn schemes_are_read_typed_and_an_unknown_one_is_refused_naming_file_and_channel() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "CTNormalization",
            "ZScoreNormalization",
            "NoNormalization",
            "RescaleTo01Normalization",
            "RGBTo01Normalization",
        ];
        let path = plans_with(dir.path(), &names);
        let p = Plans::read(&path, "3d_fullres").unwrap();
        let read: Vec<_> = p
            .configuration
            .normalization_schemes
            .iter()
            .map(|s| s.nnunet_name().unwrap())
            .collect();
        assert_eq!(read, names);
        let path = plans_with(dir.path(), &["CTNormalization", "MyNormalization"]);
        let e = Plans::read(&path, "3d_fullres").unwrap_err().to_string();
        for part in [
            path.display().to_string().as_str(),
            "channel 1",
            "\"MyNormalization\"",
            "RGBTo01Normalization",
        ] {
            assert!(e.contains(part), "{part} not in {e}");
        }
    }
}
