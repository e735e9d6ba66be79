//! A run folder's records: `run.json` (what the run is: dataset, classes, the options that
//! shape its weights, the split) and each checkpoint's `state.json` (where it stopped).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::dataset_json::LabelClass;
pub use super::labels::ClassInfo;
use super::labels::Labels;
use super::training::TrainConfig;
use crate::error::{Error, Result};
use crate::util::files::read_capped;

/// The run folder's identity file.
pub const RUN_FILE: &str = "run.json";
/// A checkpoint's training state file.
pub const STATE_FILE: &str = "state.json";

/// Which cases train and which validate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// Case ids trained on.
    pub train: Vec<String>,
    /// Case ids held out for validation.
    pub val: Vec<String>,
}

/// `run.json`: compared on `--resume`, so a run is never continued with other settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Dataset name in the cache.
    pub dataset: String,
    /// Output classes of the model, background included.
    pub num_classes: usize,
    /// What each output class stands for, in output order (empty in runs made before classes
    /// were recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassInfo>,
    /// Region-based training (nnU-Net's BraTS mode): one sigmoid output per region, each a set
    /// of label values, in dataset.json's order (empty: one softmax over `classes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<LabelClass>,
    /// The label value each region is written as, later regions over earlier ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions_class_order: Vec<u16>,
    /// The label value left out of loss and Dice, if the dataset has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_label: Option<u16>,
    /// The image channels the network takes, by name, in order (empty in runs made before
    /// channels were recorded: those took one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<String>,
    /// How the model's inputs were made: what predict applies to a new volume (absent in runs
    /// made before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprocessing: Option<Preprocessing>,
    /// The run's training options (records written before they were typed hold only those
    /// that shape the weights; the others read as their defaults).
    pub config: TrainConfig,
    /// Which cases train and which validate.
    pub split: Split,
}

/// The preprocessing a model was trained with, copied from its cache: a new volume must be
/// resampled, normalized and stored the same way before the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Preprocessing {
    /// The cache dataset's parameters: target spacing, each channel's normalization and the
    /// dataset statistics it uses, image dtype, chunking.
    pub params: super::params::OutputParams,
    /// The spatial unit the spacing is in ("mm", "um", "m", "unknown"), as the training
    /// inputs' headers said: an input in another unit is converted, not taken as the same
    /// numbers.
    pub unit: String,
}

/// What a checkpoint records besides the optimizer counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StateExtra {
    /// Dataset name in the cache.
    pub dataset: Option<String>,
    /// Output classes of the model, background included.
    pub num_classes: Option<usize>,
    /// The BLAKE3 hash (hex) of each file of the checkpoint folder written before this state,
    /// by file name: a file changed or damaged since is refused on load (absent in older
    /// states).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files: std::collections::BTreeMap<String, String>,
}

/// `state.json`: everything besides the tensors that a resumed run needs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TrainState {
    /// Training steps done: where the learning-rate schedule and a resumed run go on from.
    pub step: u64,
    /// Updates the optimizer applied (a non-finite gradient skips one); AdamW's bias
    /// correction counts these.
    pub optimizer_steps: u64,
    /// Seed of the run (weights, split, patches, augmentation).
    pub seed: u64,
    /// Best mean validation Dice so far; `None` until a validation gives one.
    pub best_metric: Option<f64>,
    /// The step that reached `best_metric`.
    pub best_step: Option<u64>,
    /// The whole training configuration.
    pub config: TrainConfig,
    /// Dataset and class count (absent in older states).
    #[serde(default)]
    pub extra: StateExtra,
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Train(format!("{}: not a valid {what}: {e}", path.display())))
}

fn pretty<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(v).unwrap_or_default()
}

/// The largest run or training-state record read (case lists of tens of thousands of cases).
const MAX_RECORD_BYTES: u64 = 64 << 20;

impl RunRecord {
    /// Whether `other` is the same run for `--resume`: equal in everything but the training
    /// options that do not shape the weights ([`TrainConfig::weight_shaping`]).
    pub fn same_run(&self, other: &RunRecord) -> bool {
        let rest = |r: &RunRecord| RunRecord {
            config: TrainConfig::default(),
            ..r.clone()
        };
        rest(self) == rest(other) && self.config.weight_shaping() == other.config.weight_shaping()
    }

    /// Read `path`; `Ok(None)` when there is no such file.
    pub fn read(path: &Path) -> Result<Option<RunRecord>> {
        match read_capped(path, MAX_RECORD_BYTES) {
            Ok(b) => {
                let r: RunRecord = parse(path, &b, "run record")?;
                r.check(path)?;
                Ok(Some(r))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Pretty JSON, as written to `run.json`.
    pub fn to_json(&self) -> Vec<u8> {
        pretty(self)
    }

    /// What training and prediction rely on, each failure naming the file and the field: 2 to
    /// [`MAX_RECORD_CLASSES`] classes, as many class records (distinct values) when listed, an
    /// ignore label that is no class, channels matching the preprocessing, and preprocessing
    /// parameters a reader can use.
    pub fn check(&self, path: &Path) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("{}: {m}", path.display())));
        if !(2..=MAX_RECORD_CLASSES).contains(&self.num_classes) {
            return bad(format!(
                "num_classes {}: a model outputs background and 1 to {} classes",
                self.num_classes,
                MAX_RECORD_CLASSES - 1
            ));
        }
        if !self.classes.is_empty() {
            if self.classes.len() != self.num_classes {
                return bad(format!(
                    "classes lists {} classes but num_classes is {}",
                    self.classes.len(),
                    self.num_classes
                ));
            }
            if let Err(e) = Labels::of_classes(self.classes.clone(), self.ignore_label) {
                return bad(e);
            }
        }
        if !self.regions.is_empty() {
            let (regions, order) = (self.regions.clone(), self.regions_class_order.clone());
            if let Err(e) = Labels::of_regions(regions, order, self.ignore_label) {
                return bad(e);
            }
            let values: Vec<u16> = self.classes.iter().map(|c| c.value).collect();
            let known = |v: &u16| *v != 0 && values.contains(v);
            if let Some(r) = self
                .regions
                .iter()
                .find(|r| r.values.is_empty() || !r.values.iter().all(known))
            {
                return bad(format!(
                    "region {r}: its labels must be non-empty and among the classes {values:?} (not 0)"
                ));
            }
            if let Some(v) = self.regions_class_order.iter().find(|v| !known(v)) {
                return bad(format!(
                    "regions_class_order: {v} is not a foreground class of {values:?}"
                ));
            }
        }
        if let Some(p) = &self.preprocessing {
            p.params.check(path, "preprocessing.params")?;
            let want = self.channels.len().max(1);
            if p.params.channels.len() != want {
                return bad(format!(
                    "preprocessing.params has {} channels but the run takes {want}",
                    p.params.channels.len()
                ));
            }
        }
        Ok(())
    }
}

impl RunRecord {
    /// What the network's outputs stand for: a softmax over the classes, or one sigmoid per
    /// region; and the ignore label. Runs made before classes were recorded: values 0..n.
    pub fn labels(&self) -> Labels {
        if !self.regions.is_empty() {
            return Labels::unchecked_regions(
                self.regions.clone(),
                self.regions_class_order.clone(),
                self.ignore_label,
            );
        }
        match self.classes.is_empty() {
            true => Labels::consecutive(self.num_classes, self.ignore_label),
            false => Labels::unchecked_classes(self.classes.clone(), self.ignore_label),
        }
    }
}

/// The most output classes a run record may declare.
pub const MAX_RECORD_CLASSES: usize = 4096;

impl TrainState {
    /// Read and parse `path`.
    pub fn read(path: &Path) -> Result<TrainState> {
        let bytes = read_capped(path, MAX_RECORD_BYTES).map_err(|e| Error::io(path, e))?;
        parse(path, &bytes, "training state")
    }

    /// Pretty JSON, as written to `state.json`.
    pub fn to_json(&self) -> Vec<u8> {
        pretty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::training::network::Norm;

    /// A run.json written before the training options were typed (only those that shape the
    /// weights, as a JSON object), kept as a fixture.
    const BEFORE: &str = include_str!("../../tests/fixtures/records/run.json");

    #[test]
    fn a_record_from_before_the_typed_options_still_reads() {
        let r: RunRecord = serde_json::from_str(BEFORE).unwrap();
        let c = &r.config;
        assert_eq!(c.network.patch, [16, 48, 48]);
        assert_eq!(c.network.norm, Norm::Instance);
        assert_eq!((c.network.stages, c.network.seed), (4, 1234));
        assert!(c.augment && c.augmentation.mirrors());
        assert_eq!((c.steps, c.fg_fraction), (20, 0.333));
        assert!(c.unknown_keys.0.is_empty(), "{:?}", c.unknown_keys);
        // Keys it did not record read as their defaults.
        assert_eq!(c.val_every, TrainConfig::default().val_every);
        // Written again, it reads back the same, and the options sit at the top level of
        // `config`, as before.
        let again: RunRecord = serde_json::from_slice(&pretty(&r)).unwrap();
        assert_eq!(again, r);
        let v: serde_json::Value = serde_json::from_slice(&pretty(&r)).unwrap();
        assert_eq!(v["config"]["patch"], serde_json::json!([16, 48, 48]));
        assert_eq!(v["config"]["augmentation"]["mirror_prob"], 0.5);
        assert!(v["config"].get("network").is_none() && v["config"].get("unknown_keys").is_none());
    }

    #[test]
    fn resume_compares_only_what_shapes_the_weights() {
        let r: RunRecord = serde_json::from_str(BEFORE).unwrap();
        let mut other = r.clone();
        other.config.val_every = 7;
        other.config.workers = 9;
        assert!(r.same_run(&other));
        other.config.lr *= 2.0;
        assert!(!r.same_run(&other));
        let mut other = r.clone();
        other.config.network.features = vec![8, 16, 32, 64];
        assert!(!r.same_run(&other));
        // A key of another version's record is kept out of the comparison and the rewrite.
        let mut v: serde_json::Value = serde_json::from_str(BEFORE).unwrap();
        v["config"]["from_a_later_version"] = 3.into();
        let later: RunRecord = serde_json::from_value(v).unwrap();
        assert!(later.config.unknown_keys.0.contains("from_a_later_version"));
        assert!(!String::from_utf8(pretty(&later))
            .unwrap()
            .contains("from_a_later"));
    }
}
