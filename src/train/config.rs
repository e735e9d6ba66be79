//! Training options: defaults, then the pipeline file's `[train]` table, then command-line flags
//! (merged by `config::train::resolve`).
//!
//! The merged [`TrainConfig`] is saved in the run folder; `--resume` refuses a config that
//! differs from it in anything that shapes the weights, because "resume gives the same weights
//! as an uninterrupted run" only holds for the same settings.

use serde::{Deserialize, Serialize};

use super::augment::AugmentConfig;
use crate::error::{Error, Result};
use crate::model::config::{Encoder, NetworkOptions, Norm, Precision, Upsampling};
use crate::model::memory::StepShape;
use crate::train::folds::FoldChoice;

/// Which optimizer, with nnU-Net-like defaults for each: `adamw` or `sgd`, the same in a
/// pipeline file and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum OptimizerName {
    /// AdamW (decoupled weight decay).
    Adamw,
    /// SGD with Nesterov momentum (nnU-Net's).
    Sgd,
}

impl OptimizerName {
    /// The spelling of pipeline files, flags and run records.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerName::Adamw => "adamw",
            OptimizerName::Sgd => "sgd",
        }
    }
}

impl std::str::FromStr for OptimizerName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [OptimizerName::Adamw, OptimizerName::Sgd]
            .into_iter()
            .find(|o| o.name() == s.trim())
            .ok_or_else(|| Error::Config(format!("optimizer {s:?}: give adamw or sgd")))
    }
}

crate::model::config::serde_as_string!(OptimizerName);

impl std::fmt::Display for OptimizerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Weights of the loss terms added to Dice + cross-entropy (the `[train.loss]` table); 0 = off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossWeights {
    /// Skeleton Recall (Kirchhoff et al. 2024; their weight: 1). Off by default, as in nnU-Net.
    pub skeleton_recall: f64,
    /// clDice (Shit et al. 2021): soft skeleton of the prediction against the label, the
    /// label's skeleton against the prediction.
    pub cldice: f64,
    /// Boundary loss (Kervadec et al. 2019): probabilities times the cached signed distance.
    pub boundary: f64,
    /// Surface (distance-weighted) loss: squared error weighted by the label's and the
    /// thresholded prediction's squared distances to their boundaries (Karimi and Salcudean).
    pub surface: f64,
}

impl Default for LossWeights {
    fn default() -> Self {
        LossWeights {
            skeleton_recall: 0.0,
            cldice: 0.0,
            boundary: 0.0,
            surface: 0.0,
        }
    }
}

impl LossWeights {
    /// Check that every weight is in 0..=100.
    pub fn validate(&self) -> Result<()> {
        for (name, w) in [
            ("skeleton_recall", self.skeleton_recall),
            ("cldice", self.cldice),
            ("boundary", self.boundary),
            ("surface", self.surface),
        ] {
            if !(w.is_finite() && (0.0..=100.0).contains(&w)) {
                return Err(Error::Config(format!(
                    "loss: {name} weight {w} must be between 0 and 100"
                )));
            }
        }
        Ok(())
    }

    /// Whether a term needs the cached signed distance maps.
    pub fn needs_distance(&self) -> bool {
        self.boundary > 0.0 || self.surface > 0.0
    }
}

/// Every option of a training run. Field names are the `[train]` keys of a pipeline file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Dataset in the cache's manifest; may be omitted when the cache holds one.
    pub dataset: Option<String>,
    /// The planned configuration is a cascade's second stage after this one: its cache must
    /// hold that stage's segmentation (`prep build-cache --previous-stage`). Set by the
    /// configuration, not a `[train]` key.
    #[serde(skip)]
    pub previous_stage_of: Option<String>,
    /// Patch size (z, y, x) in voxels of the cached (resampled) volumes.
    pub patch: [usize; 3],
    /// Patches a batch.
    pub batch_size: usize,
    /// Optimizer steps of the run.
    pub steps: u64,
    /// Batches whose gradients are summed into one optimizer step.
    pub accumulate: usize,
    /// `adamw` or `sgd`.
    pub optimizer: OptimizerName,
    /// Initial learning rate (poly schedule down to 0 at `steps`).
    pub lr: f64,
    /// Weight decay (decoupled for AdamW, added to the gradient for SGD).
    pub weight_decay: f64,
    /// SGD momentum (Nesterov).
    pub momentum: f64,
    /// Exponent of the poly learning-rate schedule.
    pub poly_exponent: f64,
    /// Global gradient-norm clip (nnU-Net: 12); 0 disables.
    pub clip_grad_norm: f64,
    /// Fraction of each batch centred on a foreground voxel.
    pub fg_fraction: f64,
    /// Network: channels of the first stage, cap, number of resolution stages.
    pub base_channels: usize,
    /// Cap on the channels of any stage.
    pub max_channels: usize,
    /// Resolution stages of the U-Net.
    pub stages: usize,
    /// Normalization after each convolution.
    pub norm: Norm,
    /// How the decoder goes up a resolution.
    pub upsampling: Upsampling,
    /// `f32`, or `bf16` on a GPU (mixed precision; see [`Precision`]).
    pub precision: Precision,
    /// Extra 1x1x1 heads at the decoder's lower resolutions, trained against downsampled
    /// targets (nnU-Net's deep supervision).
    pub deep_supervision: bool,
    /// Strides (z, y, x) of stages 1.. (`stages - 1` entries). Empty: planned from `patch`
    /// (halve each axis while it stays at least 4 voxels).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub strides: Vec<[usize; 3]>,
    /// Kernel (z, y, x) of each stage. Empty: 3x3x3.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<[usize; 3]>,
    /// Channels of each stage. Empty: `base_channels` doubling up to `max_channels`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<usize>,
    /// Convolution blocks of each encoder stage. Empty: 2 each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<usize>,
    /// Convolution blocks of each decoder stage, full resolution first. Empty: 2 each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decoder_blocks: Vec<usize>,
    /// `plain` (nnU-Net's PlainConvUNet) or `residual` (its ResidualEncoderUNet).
    #[serde(skip_serializing_if = "Encoder::is_plain")]
    pub encoder: Encoder,
    /// How patch, batch and network were planned when no pipeline gave them (`train` on a
    /// cache alone): recorded in the run, not read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned: Option<String>,
    /// Augmentation on or off (`--no-augment`); what it does is `augmentation`.
    pub augment: bool,
    /// The `[train.augmentation]` table (nnU-Net v2's defaults).
    pub augmentation: AugmentConfig,
    /// The `[train.loss]` table: weights of the terms beside Dice + CE.
    pub loss: LossWeights,
    /// Fraction of cases held out for validation (at least one when there are two or more),
    /// when no `fold` is given.
    pub val_fraction: f64,
    /// Cross-validation fold: 0..4 of nnU-Net's five folds (or of `splits`), or `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fold: Option<FoldChoice>,
    /// nnU-Net's `splits_final.json` to take the fold from (default: the cache folder's, if it
    /// has one, else nnU-Net's folds made anew).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub splits: Option<std::path::PathBuf>,
    /// Validate every N optimizer steps (and at the end); 0 = only at the end.
    pub val_every: u64,
    /// Sliding-window overlap (fraction of the patch) during validation.
    pub val_overlap: f64,
    /// Measure centreline Dice (clDice) beside Dice in validation: both skeletons are thinned
    /// block by block, the prediction kept in a scratch file of the run folder meanwhile.
    pub val_cldice: bool,
    /// Checkpoint every N steps (and at the end and on Ctrl-C).
    pub checkpoint_every: u64,
    /// Checkpoints kept besides `best`.
    pub keep_last: usize,
    /// Print/log a metrics line every N steps.
    pub log_every: u64,
    /// Loader threads and batches prepared ahead.
    pub workers: usize,
    /// Batches built ahead of the step.
    pub queue_depth: usize,
    /// Seed of the weights, the split, the patches and the augmentation.
    pub seed: u64,
    /// Sampling weight of named training cases (default 1 each: every case is equally likely,
    /// whatever its size, as nnU-Net). 0 leaves a case out of training.
    pub case_weights: std::collections::BTreeMap<String, f64>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        // The network's defaults are the model's own.
        let net = NetworkOptions::default();
        TrainConfig {
            dataset: None,
            previous_stage_of: None,
            patch: net.patch,
            batch_size: 2,
            steps: 300,
            accumulate: 1,
            optimizer: OptimizerName::Adamw,
            lr: 3e-3,
            weight_decay: 1e-4,
            momentum: 0.99,
            poly_exponent: 0.9,
            clip_grad_norm: 12.0,
            fg_fraction: 1.0 / 3.0,
            base_channels: net.base_channels,
            max_channels: net.max_channels,
            stages: net.stages,
            norm: net.norm,
            upsampling: net.upsampling,
            precision: net.precision,
            deep_supervision: net.deep_supervision,
            strides: net.strides,
            kernels: net.kernels,
            features: net.features,
            blocks: net.blocks,
            decoder_blocks: net.decoder_blocks,
            encoder: net.encoder,
            planned: None,
            augment: true,
            augmentation: AugmentConfig::default(),
            loss: LossWeights::default(),
            val_fraction: 0.2,
            fold: None,
            splits: None,
            val_every: 100,
            val_overlap: 0.5,
            val_cldice: true,
            checkpoint_every: 50,
            keep_last: 2,
            log_every: 10,
            workers: 2,
            queue_depth: 4,
            seed: net.seed,
            case_weights: Default::default(),
        }
    }
}

/// Largest patch axis and volume we accept: beyond that a batch alone would not fit in memory.
pub const MAX_PATCH_AXIS: usize = 512;
/// Largest patch volume times batch size, in voxels.
pub const MAX_PATCH_VOXELS: usize = 1 << 24;

impl TrainConfig {
    /// The options that shape the network (what prediction reads back from the run's record).
    pub fn network(&self) -> NetworkOptions {
        NetworkOptions {
            patch: self.patch,
            base_channels: self.base_channels,
            max_channels: self.max_channels,
            stages: self.stages,
            norm: self.norm,
            upsampling: self.upsampling,
            precision: self.precision,
            deep_supervision: self.deep_supervision,
            strides: self.strides.clone(),
            kernels: self.kernels.clone(),
            features: self.features.clone(),
            blocks: self.blocks.clone(),
            decoder_blocks: self.decoder_blocks.clone(),
            encoder: self.encoder,
            seed: self.seed,
        }
    }

    /// What shapes a training step's memory besides the network (see [`crate::model::memory`]).
    pub fn step_shape(&self) -> StepShape {
        StepShape {
            patch: self.patch,
            batch: self.batch_size,
            precision: self.precision,
            moments: match self.optimizer {
                OptimizerName::Adamw => 2,
                OptimizerName::Sgd if self.momentum > 0.0 => 1,
                OptimizerName::Sgd => 0,
            },
            // The queue, one batch in the making per worker, and the one being trained on.
            data_batches: self.queue_depth + self.workers + 1,
            workers: rayon::current_num_threads(),
        }
    }

    /// Check every option's range and that they fit together.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        let p = self.patch;
        if p.contains(&0) || p.iter().any(|&a| a > MAX_PATCH_AXIS) {
            return bad(format!(
                "patch {p:?} (z, y, x): each axis must be 1..={MAX_PATCH_AXIS}"
            ));
        }
        let voxels = p
            .iter()
            .product::<usize>()
            .saturating_mul(self.batch_size.max(1));
        if voxels > MAX_PATCH_VOXELS {
            return bad(format!(
                "patch {p:?} x batch {} = {voxels} voxels: more than the {MAX_PATCH_VOXELS} allowed (activations would need tens of GB); use a smaller patch or batch",
                self.batch_size
            ));
        }
        if self.batch_size == 0 || self.accumulate == 0 {
            return bad("batch_size and accumulate must be at least 1".into());
        }
        if self.steps == 0 {
            return bad("steps must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("lr must be a positive number, got {}", self.lr));
        }
        if !(0.0..=1.0).contains(&self.fg_fraction) {
            return bad(format!(
                "fg_fraction must be in 0..=1, got {}",
                self.fg_fraction
            ));
        }
        if !(0.0..1.0).contains(&self.val_fraction) {
            return bad(format!(
                "val_fraction must be in 0..1, got {}",
                self.val_fraction
            ));
        }
        if !(0.0..0.95).contains(&self.val_overlap) {
            return bad(format!(
                "val_overlap must be in 0..0.95, got {}",
                self.val_overlap
            ));
        }
        if self.stages == 0 || self.stages > 8 {
            return bad(format!("stages must be 1..=8, got {}", self.stages));
        }
        if !(self.poly_exponent.is_finite() && self.poly_exponent >= 0.0) {
            return bad(format!(
                "poly_exponent must be >= 0, got {}",
                self.poly_exponent
            ));
        }
        if !(self.clip_grad_norm.is_finite() && self.clip_grad_norm >= 0.0) {
            return bad(format!(
                "clip_grad_norm must be >= 0 (0 = off), got {}",
                self.clip_grad_norm
            ));
        }
        self.augmentation.validate()?;
        self.loss.validate()?;
        if self.keep_last == 0 {
            return bad("keep_last must be at least 1".into());
        }
        if self.workers == 0 || self.queue_depth == 0 {
            return bad("workers and queue_depth must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.momentum)
            || self.weight_decay.is_nan()
            || self.weight_decay < 0.0
        {
            return bad("momentum must be in 0..1 and weight_decay >= 0".into());
        }
        Ok(())
    }

    /// Settings whose change would change the weights; `--resume` requires them equal.
    /// Logging, checkpoint cadence, worker count and validation cadence may change.
    pub fn weight_shaping(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            // The dataset is compared resolved (RunIdentity::dataset), not as typed.
            for k in [
                "dataset",
                "val_every",
                "checkpoint_every",
                "keep_last",
                "log_every",
                "workers",
                "queue_depth",
                "val_overlap",
                "val_cldice",
            ] {
                o.remove(k);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_overrides_defaults_and_unknown_keys_are_errors() {
        let c: TrainConfig =
            toml::from_str("patch = [8, 32, 32]\noptimizer = \"sgd\"\nnorm = \"group:4\"").unwrap();
        assert_eq!(c.patch, [8, 32, 32]);
        assert_eq!(c.optimizer, OptimizerName::Sgd);
        assert_eq!(c.norm, Norm::Group(4));
        assert_eq!(c.batch_size, TrainConfig::default().batch_size);
        let e = toml::from_str::<TrainConfig>("pach = [8, 32, 32]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pach"), "{e}");
        let e = toml::from_str::<TrainConfig>("optimizer = \"adam\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("adamw or sgd"), "{e}");
    }

    #[test]
    fn oversized_patches_are_refused() {
        let c = TrainConfig {
            patch: [256, 512, 512],
            ..TrainConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("voxels"));
        let c = TrainConfig {
            patch: [0, 32, 32],
            ..TrainConfig::default()
        };
        assert!(c.validate().is_err());
        TrainConfig::default().validate().unwrap();
    }
}
