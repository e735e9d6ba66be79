//! Planned configurations in a pipeline file: `[configurations.NAME]` tables (what
//! `prep plan` writes, one per configuration nnU-Net's planner makes) and the one that
//! `configuration = "NAME"` (or `--configuration NAME`) picks, applied over the cache's spacing
//! and the `[train]` table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::config::Encoder;
use crate::model::config::Precision;
use crate::nifti_io::f32_to_f64_decimal;
use crate::planner::memory::{fit_to_memory, step_memory, GPU_OVERHEAD};
use crate::planner::{
    plan_experiment, plan_experiment_scaled, ConfigurationPlan, DatasetFingerprint, Plans, Preset,
};
use crate::prep::settings::{Settings, SpacingChoice};
use crate::train::config::TrainConfig;

/// One planned configuration as a pipeline file spells it. Axes: spacing (x, y, z) in the
/// files' units as the cache's `spacing` key; patch, strides and kernels (z, y, x) as `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigurationTable {
    /// Target spacing (x, y, z) of the cache, in the files' units.
    pub spacing: [f64; 3],
    /// Patch (z, y, x).
    pub patch: [usize; 3],
    /// Patches a batch.
    pub batch_size: usize,
    /// Stride (z, y, x) of every stage, stage 0's all ones.
    pub strides: Vec<[usize; 3]>,
    /// Kernel (z, y, x) of every stage.
    pub kernels: Vec<[usize; 3]>,
    /// Channels of every stage.
    pub features: Vec<usize>,
    /// Blocks of every encoder stage.
    pub blocks: Vec<usize>,
    /// Blocks of every decoder stage, full resolution first.
    pub decoder_blocks: Vec<usize>,
    /// `plain` (nnU-Net's PlainConvUNet) or `residual` (its ResidualEncoderUNet).
    pub encoder: Encoder,
    /// nnU-Net's size estimate of the network at this patch (conv outputs at batch 1): what the
    /// plan was fitted to.
    #[serde(default)]
    pub size_estimate: u64,
    /// Our forecast of one training step's memory at this plan in bf16 (a GPU; the CUDA
    /// context not included), MiB: what `--gpu-memory-gb` checks. Information only.
    #[serde(default)]
    pub memory_bf16_mib: u64,
    /// The same in f32 (the CPU), MiB.
    #[serde(default)]
    pub memory_f32_mib: u64,
    /// A cascade's second stage: the configuration whose segmentations it takes as input
    /// channels (`3d_cascade_fullres` after `3d_lowres`); its cache is built with
    /// `--previous-stage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_stage: Option<String>,
}

impl ConfigurationTable {
    /// A plan, its axes put back in (z, y, x) order (`transpose`: the planner's order), its
    /// spacing in the files' unit (`mm_per_unit` millimetres a unit); an axis a 2D plan does
    /// not cover keeps `target` (z, y, x, mm), the full-resolution spacing.
    pub fn from_plan(
        c: &ConfigurationPlan,
        transpose: [usize; 3],
        target: [f64; 3],
        mm_per_unit: f64,
    ) -> Self {
        // A 2D plan covers the last two of the planner's axes; its first is one voxel deep.
        let offset = 3 - c.spacing.len();
        let zyx = |v: &[usize], fill: usize| -> [usize; 3] {
            let mut out = [fill; 3];
            for (i, &x) in v.iter().enumerate() {
                out[transpose[i + offset]] = x;
            }
            out
        };
        let mut spacing_zyx = target;
        for (i, &s) in c.spacing.iter().enumerate() {
            spacing_zyx[transpose[i + offset]] = s;
        }
        // Back in the files' unit, as the shortest decimal of its single-precision value:
        // the planner computes with header values widened exactly (0.9900000095), a person
        // reads and the cache is built at the 0.99 they typed.
        let unit = |mm: f64| f32_to_f64_decimal((mm / mm_per_unit) as f32);
        ConfigurationTable {
            spacing: [
                unit(spacing_zyx[2]),
                unit(spacing_zyx[1]),
                unit(spacing_zyx[0]),
            ],
            patch: zyx(&c.patch, 1),
            batch_size: c.batch_size,
            strides: c.strides.iter().map(|s| zyx(s, 1)).collect(),
            kernels: c.kernels.iter().map(|k| zyx(k, 1)).collect(),
            features: c.features.clone(),
            blocks: c.blocks.clone(),
            decoder_blocks: c.decoder_blocks.clone(),
            encoder: c.encoder,
            size_estimate: c.estimate,
            memory_bf16_mib: 0,
            memory_f32_mib: 0,
            previous_stage: None,
        }
    }

    /// Set the cache's spacing and the network and batch of `[train]` to this configuration.
    pub fn apply(
        &self,
        name: &str,
        settings: &mut Settings,
        train: &mut TrainConfig,
    ) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("[configurations.{name}]: {m}")));
        if self.spacing.iter().any(|s| !s.is_finite() || *s <= 0.0) {
            return bad(format!(
                "spacing {:?}: three positive numbers (x, y, z)",
                self.spacing
            ));
        }
        let first = self.strides.first().copied();
        if first != Some([1, 1, 1]) {
            return bad(format!(
                "strides must list every stage, the first [1, 1, 1], got {:?}",
                self.strides
            ));
        }
        let stages = self.strides.len();
        for (key, got, want) in [
            ("kernels", self.kernels.len(), stages),
            ("features", self.features.len(), stages),
            ("blocks", self.blocks.len(), stages),
            ("decoder_blocks", self.decoder_blocks.len(), stages - 1),
        ] {
            if got != want {
                return bad(format!(
                    "{key} has {got} entries for {stages} stages (strides): give {want}"
                ));
            }
        }
        settings.spacing = SpacingChoice::Explicit(self.spacing);
        settings.previous_stage_of = self.previous_stage.clone();
        train.previous_stage_of = self.previous_stage.clone();
        train.network.patch = self.patch;
        train.batch_size = self.batch_size;
        train.network.stages = stages;
        train.network.strides = self.strides[1..].to_vec();
        train.network.kernels = self.kernels.clone();
        train.network.features = self.features.clone();
        train.network.max_channels = train
            .network
            .max_channels
            .max(self.features.iter().copied().max().unwrap_or(0));
        train.network.base_channels = self.features[0];
        train.network.blocks = self.blocks.clone();
        train.network.decoder_blocks = self.decoder_blocks.clone();
        train.network.encoder = self.encoder;
        train.validate().or_else(|e| bad(e.to_string()))?;
        // The network itself checks the patch against the strides when built; check here so
        // that a hand-edited plan is refused before any work.
        let total: [usize; 3] =
            std::array::from_fn(|a| self.strides.iter().map(|s| s[a]).product::<usize>());
        if (0..3).any(|a| !self.patch[a].is_multiple_of(total[a])) {
            return bad(format!(
                "patch {:?} (z, y, x) is not a multiple of the strides' product {total:?}",
                self.patch
            ));
        }
        Ok(())
    }
}

/// A pipeline file holding every configuration of `plans` (`configuration` picks the first
/// 3D one, else 2d), with the cache keys and a comment that says where it came from.
pub fn plans_to_toml(planned: &PlannedDataset, dataset: &str, unit: &str) -> Result<String> {
    let (plans, tables) = (&planned.plans, planned.tables.clone());
    let pick = if plans.fullres.is_some() {
        "3d_fullres"
    } else {
        "2d"
    };
    #[derive(Serialize)]
    struct File<'a> {
        description: String,
        normalization: &'a str,
        configuration: &'a str,
        configurations: BTreeMap<String, ConfigurationTable>,
    }
    let names: Vec<&str> = plans.configurations().iter().map(|(n, _)| *n).collect();
    let file = File {
        description: format!(
            "planned by prep plan for {dataset} (preset {}): {}",
            plans.preset.name(),
            names.join(", ")
        ),
        normalization: "zscore-nonzero",
        configuration: pick,
        configurations: tables,
    };
    let body = toml::to_string(&file).map_err(|e| Error::Config(format!("plan: {e}")))?;
    Ok(format!(
        "# nnU-Net's experiment planner on {dataset} (docs/usage.md, \"prep plan\"). Spacings are\n\
         # (x, y, z) in {unit}; patch, strides and kernels (z, y, x). `configuration` is the one\n\
         # build-cache and train use (--configuration NAME picks another); every key may be edited.\n\
         # A [train] table may be added for the other training options.\n{body}"
    ))
}

/// A dataset's plans as `prep plan` shows and writes them.
pub struct PlannedDataset {
    /// The planner's output.
    pub plans: Plans,
    /// Each configuration as a pipeline file spells it, with our memory forecast.
    pub tables: BTreeMap<String, ConfigurationTable>,
    /// What fitting the plans to a GPU changed.
    pub notes: Vec<String>,
}

/// Plan a dataset with nnU-Net's planner; with `gpu_memory_gb`, its reference scaled to that
/// memory (nnU-Net's `-gpu_memory_target`) and then each configuration shrunk until our own
/// forecast of its bf16 training step fits (planner::memory::fit_to_memory).
pub fn plan_dataset(
    fp: &DatasetFingerprint,
    preset: Preset,
    gpu_memory_gb: Option<f64>,
) -> Result<PlannedDataset> {
    let (channels, classes) = (fp.channels, fp.fingerprint.num_classes);
    let (plans, notes) = match gpu_memory_gb {
        None => (plan_experiment(&fp.fingerprint, preset)?, vec![]),
        Some(g) => {
            if !(g.is_finite() && g > 0.0 && g <= 4096.0) {
                return Err(Error::Config(format!(
                    "--gpu-memory-gb {g}: give the GPU's memory in GB, above 0 and at most 4096"
                )));
            }
            let mut plans =
                plan_experiment_scaled(&fp.fingerprint, preset, g / preset.memory_gb())?;
            let bytes = (g * (1u64 << 30) as f64) as u64;
            let notes = fit_to_memory(
                &mut plans,
                bytes,
                (channels, classes),
                Precision::Bf16,
                GPU_OVERHEAD,
            )
            .map_err(|e| Error::Config(format!("--gpu-memory-gb {g}: {e}")))?;
            (plans, notes)
        }
    };
    let mib = |b: u64| b.div_ceil(1 << 20);
    let mut tables: BTreeMap<String, ConfigurationTable> = plans
        .configurations()
        .into_iter()
        .map(|(n, c)| {
            let mut t = ConfigurationTable::from_plan(
                c,
                plans.transpose,
                plans.target_spacing,
                fp.mm_per_unit,
            );
            t.memory_bf16_mib = mib(step_memory(c, channels, classes, Precision::Bf16).total());
            t.memory_f32_mib = mib(step_memory(c, channels, classes, Precision::F32).total());
            (n.to_string(), t)
        })
        .collect();
    // nnU-Net's cascade where it plans 3d_lowres: 3d_fullres again, taking the lowres stage's
    // segmentation as one more input channel a foreground label.
    if let (Some(full), Some(_)) = (&plans.fullres, &plans.lowres) {
        if let Some(mut t) = tables.get("3d_fullres").cloned() {
            let inputs = channels + classes.saturating_sub(1);
            t.memory_bf16_mib = mib(step_memory(full, inputs, classes, Precision::Bf16).total());
            t.memory_f32_mib = mib(step_memory(full, inputs, classes, Precision::F32).total());
            t.previous_stage = Some("3d_lowres".into());
            tables.insert("3d_cascade_fullres".into(), t);
        }
    }
    Ok(PlannedDataset {
        plans,
        tables,
        notes,
    })
}

/// The plan in a few lines per configuration, for the terminal.
pub fn describe(tables: &BTreeMap<String, ConfigurationTable>, unit: &str) -> String {
    let zyx = |v: [usize; 3]| format!("{}x{}x{}", v[0], v[1], v[2]);
    let mut out = String::new();
    for (name, t) in tables {
        let [x, y, z] = t.spacing;
        out.push_str(&format!(
            "{name}: spacing {x:.4}x{y:.4}x{z:.4} {unit} (x,y,z), patch {} (z,y,x), batch {}, {} stages, {} encoder\n",
            zyx(t.patch),
            t.batch_size,
            t.strides.len(),
            t.encoder
        ));
        let list = |v: &[[usize; 3]]| v.iter().map(|s| zyx(*s)).collect::<Vec<_>>().join(" ");
        out.push_str(&format!("  strides  {}\n", list(&t.strides)));
        out.push_str(&format!("  kernels  {}\n", list(&t.kernels)));
        out.push_str(&format!(
            "  features {:?}, blocks {:?}, decoder blocks {:?}; nnU-Net's size estimate {:.1} M\n",
            t.features,
            t.blocks,
            t.decoder_blocks,
            t.size_estimate as f64 / 1e6
        ));
        if t.memory_bf16_mib > 0 {
            out.push_str(&format!(
                "  training step {:.1} GiB in bf16 on a GPU (+ about 1 GiB CUDA context), {:.1} GiB in f32 on the CPU\n",
                t.memory_bf16_mib as f64 / 1024.0,
                t.memory_f32_mib as f64 / 1024.0
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::Fingerprint;

    /// Cases far larger than the full-resolution patch: nnU-Net plans 3d_lowres, and the cascade
    /// is 3d_fullres again after it, its forecast counting the previous stage's channels.
    #[test]
    fn a_lowres_plan_brings_the_cascade() {
        let fp = DatasetFingerprint {
            fingerprint: Fingerprint {
                spacings: vec![[2.5, 0.7, 0.7]; 10],
                shapes: vec![[200, 512, 512]; 10],
                num_classes: 3,
                num_training: 10,
            },
            unit: "mm".into(),
            mm_per_unit: 1.0,
            channels: 1,
            notes: Vec::new(),
        };
        let planned = plan_dataset(&fp, Preset::Default, None).unwrap();
        assert!(planned.tables.contains_key("3d_lowres"));
        let full = &planned.tables["3d_fullres"];
        let cascade = &planned.tables["3d_cascade_fullres"];
        assert_eq!(cascade.previous_stage.as_deref(), Some("3d_lowres"));
        assert_eq!(full.previous_stage, None);
        assert_eq!((cascade.patch, cascade.spacing), (full.patch, full.spacing));
        assert!(cascade.memory_f32_mib > full.memory_f32_mib);
        let text = plans_to_toml(&planned, "big", "mm").unwrap();
        assert!(text.contains("[configurations.3d_cascade_fullres]"));
        assert!(text.contains("previous_stage = \"3d_lowres\""));
    }
}
