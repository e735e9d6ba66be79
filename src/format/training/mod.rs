//! The training options a run is given and records: defaults, then the pipeline file's
//! `[train]` table, then command-line flags (merged by `config::train::resolve`). The network's
//! options are [`network::NetworkOptions`] and the augmentation's
//! [`augmentation::AugmentConfig`], flattened into the same table (pipeline files and run
//! records spell every key at the top level, as before).
//!
//! The merged [`TrainConfig`] is saved in the run's record (run.json); `--resume` refuses a
//! config that differs from it in anything that shapes the weights, because "resume gives the
//! same weights as an uninterrupted run" only holds for the same settings.

pub mod augmentation;
pub mod network;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use augmentation::AugmentConfig;
use network::NetworkOptions;

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

network::serde_as_string!(OptimizerName);

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
#[serde(default)]
pub struct TrainConfig {
    /// Dataset in the cache's manifest; may be omitted when the cache holds one.
    pub dataset: Option<String>,
    /// The planned configuration is a cascade's second stage after this one: its cache must
    /// hold that stage's segmentation (`prep build-cache --previous-stage`). Set by the
    /// configuration, not a `[train]` key.
    #[serde(skip)]
    pub previous_stage_of: Option<String>,
    /// What shapes the network: patch, stages, features, norm, ... and the seed of the
    /// weights (also the split's, the patches' and the augmentation's).
    #[serde(flatten)]
    pub network: NetworkOptions,
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
    /// Sampling weight of named training cases (default 1 each: every case is equally likely,
    /// whatever its size, as nnU-Net). 0 leaves a case out of training.
    pub case_weights: std::collections::BTreeMap<String, f64>,
    /// Keys no option has: a pipeline's `[train]` table is refused for them ([`Self::validate`]);
    /// a run record from another version is read without them.
    #[serde(flatten, skip_serializing)]
    pub unknown_keys: UnknownKeys,
}
impl Default for TrainConfig {
    fn default() -> Self {
        // The network's defaults are the model's own.
        let net = NetworkOptions::default();
        TrainConfig {
            dataset: None,
            previous_stage_of: None,
            network: net,
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
            case_weights: Default::default(),
            unknown_keys: UnknownKeys::default(),
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
        self.network.clone()
    }

    /// Check every option's range and that they fit together.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if let Some(k) = self.unknown_keys.0.iter().next() {
            return bad(format!(
                "unknown key `{k}` in [train] (see docs/usage.md for the keys; a [train.augmentation] or [train.loss] key goes in that table)"
            ));
        }
        let p = self.network.patch;
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
        if self.network.stages == 0 || self.network.stages > 8 {
            return bad(format!("stages must be 1..=8, got {}", self.network.stages));
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

/// The keys of a table that no option has, kept so that a pipeline can be refused for them
/// while a run record written by another version still reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnknownKeys(pub BTreeSet<String>);

impl<'de> Deserialize<'de> for UnknownKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let rest: std::collections::BTreeMap<String, serde::de::IgnoredAny> =
            Deserialize::deserialize(d)?;
        Ok(UnknownKeys(rest.into_keys().collect()))
    }
}

/// Which fold a run trains: one of the splits, or every case (`all`, no validation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldChoice {
    /// Fold K: its `train` cases train, its `val` cases validate.
    Index(usize),
    /// Every labelled case trains; none validates (nnU-Net's `all`).
    All,
}

impl std::str::FromStr for FoldChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "all" => Ok(FoldChoice::All),
            t => t.parse().map(FoldChoice::Index).map_err(|_| {
                Error::Config(format!("fold {s:?}: give a fold number (0..4) or all"))
            }),
        }
    }
}

impl std::fmt::Display for FoldChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FoldChoice::Index(k) => write!(f, "{k}"),
            FoldChoice::All => f.write_str("all"),
        }
    }
}

/// A pipeline writes `fold = 0` or `fold = "all"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum FoldSpelling {
    Index(usize),
    Text(String),
}

impl Serialize for FoldChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            FoldChoice::Index(k) => s.serialize_u64(*k as u64),
            FoldChoice::All => s.serialize_str("all"),
        }
    }
}

impl<'de> Deserialize<'de> for FoldChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match FoldSpelling::deserialize(d)? {
            FoldSpelling::Index(k) => Ok(FoldChoice::Index(k)),
            FoldSpelling::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}
