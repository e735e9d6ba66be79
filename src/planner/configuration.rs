//! One configuration's plan (patch, batch, topology) at a given spacing and median shape, by
//! nnU-Net's loop: start from a patch of 256^3 voxels (2D: 2048^2) with the same extent in mm
//! on every axis, clipped to the median shape; shrink the axis largest relative to the median
//! shape until the network's size estimate fits the preset's reference; the batch fills what
//! is left (docs/nnunet-planner.md, sections 4 to 6).

use super::numeric::{argmax_last, round_half_even};
use super::topology::{pool_and_conv, Topology};
use crate::model::config::Encoder;

/// A planner preset: nnU-Net's default planner or one of its residual-encoder presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// nnU-Net's `ExperimentPlanner` (plain U-Net, about 8 GB).
    Default,
    /// `nnUNetPlannerResEncM` (about 9-11 GB).
    ResEncM,
    /// `nnUNetPlannerResEncL` (about 24 GB).
    ResEncL,
    /// `nnUNetPlannerResEncXL` (about 40 GB).
    ResEncXL,
}

/// The fixed numbers of a preset (docs/nnunet-planner.md, section 6).
pub(crate) struct PresetValues {
    pub(crate) encoder: Encoder,
    /// The network-size reference for 3D and 2D plans (a count of conv outputs, not bytes).
    pub(crate) reference_3d: f64,
    pub(crate) reference_2d: f64,
    /// Largest share of the dataset's voxels one batch may cover.
    pub(crate) max_dataset_covered: f64,
    /// Whether the shrink loop tests `estimate / ref_batch * 2 > reference` (the default
    /// planner) or `estimate > reference`.
    pub(crate) default_loop: bool,
}

impl Preset {
    /// The preset's numbers.
    pub(crate) fn values(self) -> PresetValues {
        let resenc = |reference_3d: f64, reference_2d: f64| PresetValues {
            encoder: Encoder::Residual,
            reference_3d,
            reference_2d,
            max_dataset_covered: 1.0,
            default_loop: false,
        };
        match self {
            Preset::Default => PresetValues {
                encoder: Encoder::Plain,
                reference_3d: 560e6,
                reference_2d: 85e6,
                max_dataset_covered: 0.05,
                default_loop: true,
            },
            Preset::ResEncM => resenc(680e6, 135e6),
            Preset::ResEncL => resenc(2100e6, 380e6),
            Preset::ResEncXL => resenc(3600e6, 560e6),
        }
    }

    /// `default`, `resenc-m`, `resenc-l`, `resenc-xl`.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Default => "default",
            Preset::ResEncM => "resenc-m",
            Preset::ResEncL => "resenc-l",
            Preset::ResEncXL => "resenc-xl",
        }
    }

    /// Encoder blocks of stage `s`: 2 (plain); 1, 3, 4, 6, 6... (residual).
    pub fn encoder_blocks(self, s: usize) -> usize {
        match self.values().encoder {
            Encoder::Plain => 2,
            Encoder::Residual => [1, 3, 4].get(s).copied().unwrap_or(6),
        }
    }

    /// The GPU memory (GB) nnU-Net sized the preset's reference for; `--gpu-memory-gb G`
    /// scales the reference by G / this, as nnU-Net's `-gpu_memory_target`.
    pub fn memory_gb(self) -> f64 {
        match self {
            Preset::Default | Preset::ResEncM => 8.0,
            Preset::ResEncL => 24.0,
            Preset::ResEncXL => 40.0,
        }
    }

    /// Decoder blocks of every decoder stage: 2 (plain), 1 (residual).
    pub fn decoder_blocks(self) -> usize {
        match self.values().encoder {
            Encoder::Plain => 2,
            Encoder::Residual => 1,
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        Ok(match s.trim() {
            "default" => Preset::Default,
            "resenc-m" => Preset::ResEncM,
            "resenc-l" => Preset::ResEncL,
            "resenc-xl" => Preset::ResEncXL,
            _ => {
                return Err(crate::Error::Config(format!(
                    "preset {s:?}: choose default, resenc-m, resenc-l or resenc-xl"
                )))
            }
        })
    }
}

/// Features start at 32 and double up to 320 (3D) or 512 (2D).
pub const BASE_FEATURES: usize = 32;

/// The plan of one configuration, axes in the planner's order (the coarsest axis first).
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigurationPlan {
    /// Target spacing per axis.
    pub spacing: Vec<f64>,
    /// Median shape of the cases at that spacing (may hold halves).
    pub median_shape: Vec<f64>,
    /// Patch per axis.
    pub patch: Vec<usize>,
    /// Patches a batch.
    pub batch_size: usize,
    /// Stride of each stage (stage 0's all ones).
    pub strides: Vec<Vec<usize>>,
    /// Kernel of each stage.
    pub kernels: Vec<Vec<usize>>,
    /// Channels of each stage.
    pub features: Vec<usize>,
    /// Blocks of each encoder stage.
    pub blocks: Vec<usize>,
    /// Blocks of each decoder stage.
    pub decoder_blocks: Vec<usize>,
    /// How the encoder is built.
    pub encoder: Encoder,
    /// nnU-Net's network-size estimate of the plan (conv outputs at batch 1).
    pub estimate: u64,
}

/// nnU-Net's size estimate (`compute_conv_feature_map_size` with deep supervision off): the
/// output elements of every convolution, transposed convolution and the segmentation head at
/// batch 1 (docs/nnunet-planner.md, section 5).
pub(crate) fn size_estimate(
    preset: Preset,
    patch: &[usize],
    strides: &[Vec<usize>],
    features: &[usize],
    num_classes: usize,
) -> u64 {
    let n = strides.len();
    let mut sizes: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut cur = patch.to_vec();
    for s in strides {
        cur = cur.iter().zip(s).map(|(c, k)| c / k).collect();
        sizes.push(cur.clone());
    }
    let vol = |v: &[usize]| v.iter().map(|&x| x as u64).product::<u64>();
    let mut out = 0u64;
    match preset.values().encoder {
        Encoder::Plain => {
            for s in 0..n {
                out += preset.encoder_blocks(s) as u64 * features[s] as u64 * vol(&sizes[s]);
            }
        }
        Encoder::Residual => {
            // The stem: one conv at full resolution.
            out += features[0] as u64 * vol(patch);
            let (mut cin, mut prev) = (features[0], patch.to_vec());
            for s in 0..n {
                let v = features[s] as u64 * vol(&sizes[s]);
                out += 2 * v * preset.encoder_blocks(s) as u64;
                // The first block's skip projection where the stride or the channels change.
                if cin != features[s] || prev != sizes[s] {
                    out += v;
                }
                (cin, prev) = (features[s], sizes[s].clone());
            }
        }
    }
    for j in 0..n.saturating_sub(1) {
        let l = n - 2 - j;
        let v = vol(&sizes[l]);
        out += (preset.decoder_blocks() as u64 + 1) * features[l] as u64 * v;
        if j == n - 2 {
            out += num_classes as u64 * v;
        }
    }
    out
}

/// What the plan of one configuration needs beyond its spacing and median shape.
pub(crate) struct Budget {
    pub(crate) preset: Preset,
    /// Label values, background included.
    pub(crate) num_classes: usize,
    /// Voxels of the dataset at this configuration's spacing (median shape x cases).
    pub(crate) dataset_voxels: f64,
    /// The preset's reference is multiplied by this (a GPU memory other than the preset's).
    pub(crate) reference_scale: f64,
}

/// Channels of each of `stages` stages: 32 doubling up to 320 (3D) or 512 (2D).
pub(crate) fn stage_features(dim: usize, stages: usize) -> Vec<usize> {
    let max_features = if dim == 2 { 512 } else { 320 };
    (0..stages)
        .map(|i| (BASE_FEATURES << i.min(20)).min(max_features))
        .collect()
}

/// nnU-Net's shrink step: the axis largest relative to the median shape loses the divisor the
/// smaller patch would have. None when that axis cannot shrink.
pub(crate) fn shrink(topo: &Topology, spacing: &[f64], median_shape: &[f64]) -> Option<Topology> {
    let ratios: Vec<f64> = topo
        .patch
        .iter()
        .zip(median_shape)
        .map(|(&p, &m)| p as f64 / m)
        .collect();
    let ax = argmax_last(&ratios);
    let mut patch: Vec<f64> = topo.patch.iter().map(|&p| p as f64).collect();
    // The step is the divisor the smaller patch would have.
    let mut smaller = patch.clone();
    smaller[ax] -= topo.divisor[ax] as f64;
    let div = pool_and_conv(spacing, &smaller).divisor;
    patch[ax] -= div[ax] as f64;
    if patch[ax] < 1.0 {
        return None;
    }
    Some(pool_and_conv(spacing, &patch))
}

/// `plan` with another topology (a smaller patch): stages, features, blocks and estimate
/// follow it.
pub(crate) fn with_topology(
    plan: &ConfigurationPlan,
    topo: Topology,
    preset: Preset,
    num_classes: usize,
) -> ConfigurationPlan {
    let stages = topo.strides.len();
    let features = stage_features(plan.spacing.len(), stages);
    ConfigurationPlan {
        estimate: size_estimate(preset, &topo.patch, &topo.strides, &features, num_classes),
        features,
        blocks: (0..stages).map(|s| preset.encoder_blocks(s)).collect(),
        decoder_blocks: vec![preset.decoder_blocks(); stages - 1],
        patch: topo.patch,
        strides: topo.strides,
        kernels: topo.kernels,
        ..plan.clone()
    }
}

/// Plan one configuration (2 or 3 axes).
pub(crate) fn plan_configuration(
    spacing: &[f64],
    median_shape: &[f64],
    budget: &Budget,
) -> ConfigurationPlan {
    let dim = spacing.len();
    let preset = budget.preset;
    let v = preset.values();
    let features = |stages: usize| stage_features(dim, stages);
    let inv: Vec<f64> = spacing.iter().map(|s| 1.0 / s).collect();
    let prod_inv = inv.iter().product::<f64>();
    let scale = if dim == 3 {
        (256f64.powi(3) / prod_inv).powf(1.0 / 3.0)
    } else {
        (2048f64.powi(2) / prod_inv).powf(1.0 / 2.0)
    };
    let initial: Vec<f64> = inv
        .iter()
        .zip(median_shape)
        .map(|(i, &m)| round_half_even(i * scale).min(m))
        .collect();
    let mut topo: Topology = pool_and_conv(spacing, &initial);
    let estimate = |t: &Topology| {
        size_estimate(
            preset,
            &t.patch,
            &t.strides,
            &features(t.strides.len()),
            budget.num_classes,
        )
    };
    let mut est = estimate(&topo);
    let reference = budget.reference_scale
        * if dim == 2 {
            v.reference_2d
        } else {
            v.reference_3d
        };
    let ref_batch = if dim == 2 { 12.0 } else { 2.0 };
    let too_big = |e: u64| {
        if v.default_loop {
            e as f64 / ref_batch * 2.0 > reference
        } else {
            e as f64 > reference
        }
    };
    while too_big(est) {
        // Nothing smaller fits: keep the last plan (nnU-Net would loop forever).
        let Some(t) = shrink(&topo, spacing, median_shape) else {
            break;
        };
        topo = t;
        est = estimate(&topo);
    }
    let patch_voxels = topo.patch.iter().map(|&p| p as f64).product::<f64>();
    let by_memory = round_half_even(reference / est.max(1) as f64 * ref_batch);
    let by_dataset = round_half_even(budget.dataset_voxels * v.max_dataset_covered / patch_voxels);
    let batch_size = by_memory.min(by_dataset).max(2.0) as usize;
    let stages = topo.strides.len();
    ConfigurationPlan {
        spacing: spacing.to_vec(),
        median_shape: median_shape.to_vec(),
        batch_size,
        features: features(stages),
        blocks: (0..stages).map(|s| preset.encoder_blocks(s)).collect(),
        decoder_blocks: vec![preset.decoder_blocks(); stages - 1],
        encoder: v.encoder,
        estimate: est,
        patch: topo.patch,
        strides: topo.strides,
        kernels: topo.kernels,
    }
}
