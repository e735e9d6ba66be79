//! Open a run's data from the cache: pick the dataset, skip unlabelled cases, count the classes
//! (at most [`MAX_CLASSES`]), check the case weights and split the cases into train/validation.

use std::path::Path;

use super::classes::ClassMap;
use super::config::TrainConfig;
use super::folds::{fold_split, read_splits, SPLITS_FILE};
use super::split::{split_cases, Split};
use crate::cache::reader::{CacheReader, EntryReader, ReaderOptions};
use crate::error::{Error, Result};

/// Everything opened from the cache for a run.
pub(crate) struct Data {
    pub(crate) dataset: String,
    pub(crate) train: Vec<(String, EntryReader)>,
    pub(crate) val: Vec<(String, EntryReader)>,
    pub(crate) num_classes: usize,
    /// Image channel names, in the order the network takes them.
    pub(crate) channels: Vec<String>,
    /// How the cache made the model's inputs (for predict).
    pub(crate) preprocessing: crate::format::run::Preprocessing,
    /// Label-file values to output classes (names, ignore label).
    pub(crate) classes: ClassMap,
    /// Cases skipped for having no label.
    pub(crate) unlabelled: Vec<String>,
}

impl Data {
    /// How many of the image channels, at the end, are a cascade's previous-stage
    /// segmentation (one a label; `prep build-cache --previous-stage`).
    pub(crate) fn previous_stage_channels(&self) -> usize {
        crate::prep::cache_build::previous::indicator_values(&self.preprocessing.params).len()
    }
}

/// The run's cases: a cross-validation fold when `fold` is given (from `splits`, else the
/// cache folder's splits_final.json, else nnU-Net's folds), else the seeded fraction split.
fn choose_split(cache_dir: &Path, cfg: &TrainConfig, ids: &[String]) -> Result<Split> {
    let Some(fold) = cfg.fold else {
        return Ok(split_cases(ids, cfg.val_fraction, cfg.network.seed));
    };
    let beside = cache_dir.join(SPLITS_FILE);
    // A splits file beside the cache that is there but not a regular file (a link to a device,
    // a folder) is refused rather than passed over for nnU-Net's default folds.
    let file = match &cfg.splits {
        Some(p) => Some(p.clone()),
        None => std::fs::symlink_metadata(&beside).is_ok().then_some(beside),
    };
    let splits = match &file {
        Some(p) => Some((p.as_path(), read_splits(p)?)),
        None => None,
    };
    fold_split(ids, fold, splits)
}

/// `mapped_mib`: the reader's strict-mode budget of mapped pages (`None`: the kernel's);
/// `blocks`: where a block file the folder lacks comes from.
pub(crate) fn open_data(
    cache_dir: &Path,
    cfg: &TrainConfig,
    mapped_mib: Option<u64>,
    blocks: crate::cache::store::Blocks,
) -> Result<Data> {
    let options = ReaderOptions {
        mapped_resident_bytes: mapped_mib.map(|mib| mib.saturating_mul(1 << 20)),
        blocks,
        ..ReaderOptions::default()
    };
    let reader = CacheReader::open_with(cache_dir, options)?;
    let names = reader.datasets();
    let dataset = match (&cfg.dataset, names.as_slice()) {
        (Some(name), _) => {
            reader.dataset(name)?;
            name.clone()
        }
        (None, []) => {
            return Err(Error::cache(
                cache_dir,
                "the cache has no datasets (build one with prep build-cache)",
            ))
        }
        (None, [one]) => one.to_string(),
        (None, many) => {
            return Err(Error::Config(format!(
                "the cache holds several datasets ({}): choose one with --dataset",
                many.join(", ")
            )))
        }
    };
    let cases = reader.cases(&dataset)?;
    if cases.is_empty() {
        return Err(Error::cache(
            cache_dir,
            format!("dataset {dataset:?} has no cases"),
        ));
    }
    // Cases without a label (test cases) are skipped; they cannot be trained or validated on.
    let mut present = std::collections::BTreeSet::from([0u16]);
    let mut labelled: Vec<(String, EntryReader)> = Vec::with_capacity(cases.len());
    let mut unlabelled = Vec::new();
    for c in &cases {
        let e = reader.open_entry(&dataset, &c.case_id)?;
        if e.label_dtype().is_none() {
            unlabelled.push(c.case_id.clone());
            continue;
        }
        present.extend(e.classes());
        labelled.push((c.case_id.clone(), e));
    }
    let channels = reader.dataset(&dataset)?.channels.clone();
    for (id, e) in &labelled {
        if e.channels() != channels.len() {
            return Err(Error::case(
                id,
                format!(
                    "the entry has {} image channels but dataset {dataset:?} has {} ({})",
                    e.channels(),
                    channels.len(),
                    channels.join(", ")
                ),
            ));
        }
    }
    // The spacing's unit, which every case must share (a mix would train on mismatched scales).
    let unit = labelled[0].1.unit().to_string();
    if let Some((id, e)) = labelled.iter().find(|(_, e)| e.unit() != unit) {
        return Err(Error::case(
            id,
            format!(
                "its spacing is in {} but case {} is in {unit}: every case of a dataset must share the unit (fix the headers' xyzt_units)",
                e.unit(),
                labelled[0].0
            ),
        ));
    }
    let preprocessing = crate::format::run::Preprocessing {
        params: reader.dataset(&dataset)?.params.clone(),
        unit,
    };
    if let Some(first) = &cfg.previous_stage_of {
        if crate::prep::cache_build::previous::indicator_values(&preprocessing.params).is_empty() {
            return Err(Error::cache(
                cache_dir,
                format!("dataset {dataset:?}: the configuration is a cascade's second stage after {first}, but the cache holds no previous stage's segmentation: build it with prep build-cache --previous-stage (the {first} run folder)"),
            ));
        }
    }
    let described = reader.dataset(&dataset)?.dataset_json.as_ref();
    let classes = ClassMap::new(&present, described, &format!("dataset {dataset:?}"))?;
    if classes.labels().is_regions() {
        let w = &cfg.loss;
        let on: Vec<&str> = [
            ("skeleton recall", w.skeleton_recall),
            ("clDice", w.cldice),
            ("boundary", w.boundary),
            ("surface", w.surface),
        ]
        .into_iter()
        .filter(|(_, w)| *w > 0.0)
        .map(|(n, _)| n)
        .collect();
        if !on.is_empty() {
            return Err(Error::Config(format!(
                "dataset {dataset:?} is trained on regions (sigmoid outputs, BCE + Dice); the {} loss is defined for classes only: leave it off",
                on.join(", ")
            )));
        }
    }
    let num_classes = classes.len();
    if labelled.is_empty() {
        return Err(Error::cache(
            cache_dir,
            format!("dataset {dataset:?}: none of its {} cases has a label; training needs labelled cases", cases.len()),
        ));
    }
    let ids: Vec<String> = labelled.iter().map(|c| c.0.clone()).collect();
    let split = choose_split(cache_dir, cfg, &ids)?;
    for (id, w) in &cfg.case_weights {
        if split.val.contains(id) {
            return Err(Error::Config(format!(
                "case_weights: {id:?} is a validation case (weights apply to training cases)"
            )));
        }
        if !labelled.iter().any(|(c, _)| c == id) {
            return Err(Error::Config(format!(
                "case_weights: {id:?} is not a labelled case of dataset {dataset:?}"
            )));
        }
        if !(w.is_finite() && *w >= 0.0) {
            return Err(Error::Config(format!(
                "case_weights: {id:?} has weight {w}; weights must be finite and >= 0"
            )));
        }
    }
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (id, e) in labelled {
        if split.val.contains(&id) {
            val.push((id, e));
        } else {
            train.push((id, e));
        }
    }
    Ok(Data {
        dataset,
        train,
        val,
        num_classes,
        channels,
        preprocessing,
        classes,
        unlabelled,
    })
}
