//! Open a run's data from the cache: pick the dataset, skip unlabelled cases, count the classes
//! (at most [`MAX_CLASSES`]), check the case weights and split the cases into train/validation.

use std::path::Path;

use super::classes::ClassMap;
use super::config::TrainConfig;
use super::folds::{fold_split, read_splits, SPLITS_FILE};
use super::split::{split_cases, Split};
use crate::cache::reader::{CacheReader, CaseInfo, EntryReader, ReaderOptions};
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

/// A dataset's cases as opened entries, by case id.
type Entries = Vec<(String, EntryReader)>;

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
    let dataset = pick_dataset(&reader, cache_dir, cfg)?;
    let cases = reader.cases(&dataset)?;
    if cases.is_empty() {
        return Err(Error::cache(
            cache_dir,
            format!("dataset {dataset:?} has no cases"),
        ));
    }
    let Labelled {
        labelled,
        unlabelled,
        present,
    } = open_labelled(&reader, &dataset, &cases)?;
    // Before anything reads the first labelled case.
    if labelled.is_empty() {
        return Err(Error::cache(
            cache_dir,
            format!("dataset {dataset:?}: none of its {} cases has a label; training needs labelled cases", cases.len()),
        ));
    }
    let channels = reader.dataset(&dataset)?.channels.clone();
    check_channels(&labelled, &dataset, &channels)?;
    let unit = shared_unit(&labelled)?;
    let preprocessing = crate::format::run::Preprocessing {
        params: reader.dataset(&dataset)?.params.clone(),
        unit,
    };
    check_previous_stage(cache_dir, cfg, &dataset, &preprocessing)?;
    let described = reader.dataset(&dataset)?.dataset_json.as_ref();
    let classes = ClassMap::new(&present, described, &format!("dataset {dataset:?}"))?;
    if classes.labels().is_regions() {
        check_region_losses(cfg, &dataset)?;
    }
    let num_classes = classes.len();
    let ids: Vec<String> = labelled.iter().map(|c| c.0.clone()).collect();
    let split = choose_split(cache_dir, cfg, &ids)?;
    check_case_weights(cfg, &split, &labelled, &dataset)?;
    let (train, val) = split_entries(labelled, &split);
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

/// The dataset to train on: the configured one (checked to exist), else the cache's only one.
fn pick_dataset(reader: &CacheReader, cache_dir: &Path, cfg: &TrainConfig) -> Result<String> {
    let names = reader.datasets();
    Ok(match (&cfg.dataset, names.as_slice()) {
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
    })
}

/// A dataset's cases sorted into those with a label and those without.
struct Labelled {
    labelled: Entries,
    unlabelled: Vec<String>,
    /// The label values the labelled cases hold, background included.
    present: std::collections::BTreeSet<u16>,
}

/// Open every case's entry; cases without a label (test cases) are skipped, as they cannot be
/// trained or validated on.
fn open_labelled(reader: &CacheReader, dataset: &str, cases: &[CaseInfo]) -> Result<Labelled> {
    let mut present = std::collections::BTreeSet::from([0u16]);
    let mut labelled: Entries = Vec::with_capacity(cases.len());
    let mut unlabelled = Vec::new();
    for c in cases {
        let e = reader.open_entry(dataset, &c.case_id)?;
        if e.label_dtype().is_none() {
            unlabelled.push(c.case_id.clone());
            continue;
        }
        present.extend(e.classes());
        labelled.push((c.case_id.clone(), e));
    }
    Ok(Labelled {
        labelled,
        unlabelled,
        present,
    })
}

/// Every entry has as many image channels as its dataset names.
fn check_channels(labelled: &Entries, dataset: &str, channels: &[String]) -> Result<()> {
    for (id, e) in labelled {
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
    Ok(())
}

/// The spacing's unit, which every case must share (a mix would train on mismatched scales).
fn shared_unit(labelled: &Entries) -> Result<String> {
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
    Ok(unit)
}

/// A cascade's second stage needs a cache built with the previous stage's segmentation.
fn check_previous_stage(
    cache_dir: &Path,
    cfg: &TrainConfig,
    dataset: &str,
    preprocessing: &crate::format::run::Preprocessing,
) -> Result<()> {
    if let Some(first) = &cfg.previous_stage_of {
        if crate::prep::cache_build::previous::indicator_values(&preprocessing.params).is_empty() {
            return Err(Error::cache(
                cache_dir,
                format!("dataset {dataset:?}: the configuration is a cascade's second stage after {first}, but the cache holds no previous stage's segmentation: build it with prep build-cache --previous-stage (the {first} run folder)"),
            ));
        }
    }
    Ok(())
}

/// A dataset trained on regions takes none of the losses defined for classes only.
fn check_region_losses(cfg: &TrainConfig, dataset: &str) -> Result<()> {
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
    Ok(())
}

/// Case weights name labelled training cases and are finite and not negative.
fn check_case_weights(
    cfg: &TrainConfig,
    split: &Split,
    labelled: &Entries,
    dataset: &str,
) -> Result<()> {
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
    Ok(())
}

/// The labelled entries split into (train, validation) by `split`, in case order.
fn split_entries(labelled: Entries, split: &Split) -> (Entries, Entries) {
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (id, e) in labelled {
        if split.val.contains(&id) {
            val.push((id, e));
        } else {
            train.push((id, e));
        }
    }
    (train, val)
}
