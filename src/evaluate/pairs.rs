//! Which prediction goes with which reference, and which classes are measured.
//!
//! Cases are matched by id (the file name without `.nii`/`.nii.gz`), as `predict` names its
//! outputs after the input cases. A reference folder may be a dataset folder: of itself, its
//! `labelsTs/` and `labelsTr/`, the one holding most of the predictions' ids is used. Classes
//! come from `--labels`, else from the dataset.json given or found beside the references
//! (nnU-Net's classes and regions, its ignore label), else every non-zero value met.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::overlap::ClassTable;
use super::EvaluateOptions;
use crate::error::{Error, Result};
use crate::format::dataset_json::{DatasetDescription, LabelClass};
use crate::format::labels::FileLabels;
use crate::prep::dataset::{nifti_files, strip_nifti_ext};

/// A prediction and its reference (`None`: none was found, an error of that case).
#[derive(Clone, Debug)]
pub struct CasePair {
    /// Case id.
    pub id: String,
    /// The prediction file.
    pub prediction: PathBuf,
    /// The reference file.
    pub reference: Option<PathBuf>,
}

/// The pairs, and the reference cases no prediction has.
#[derive(Clone, Debug, Default)]
pub struct Pairs {
    /// One per prediction, sorted by id.
    pub pairs: Vec<CasePair>,
    /// Reference ids without a prediction (reported, not measured).
    pub without_prediction: Vec<String>,
}

fn case_id(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    strip_nifti_ext(name).map(str::to_string)
}

/// The NIfTI files of a folder by case id.
fn by_id(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let (files, _) = nifti_files(dir)?;
    Ok(files
        .into_iter()
        .filter_map(|f| case_id(&f).map(|id| (id, f)))
        .collect())
}

/// Match the predictions (a file or folder) with the references (a file or folder).
pub fn pair_cases(predictions: &Path, reference: &Path) -> Result<Pairs> {
    let meta = |p: &Path| std::fs::metadata(p).map_err(|e| Error::io(p, e));
    let predicted: BTreeMap<String, PathBuf> = if meta(predictions)?.is_dir() {
        by_id(predictions)?
    } else {
        let id = case_id(predictions)
            .ok_or_else(|| Error::nifti(predictions, "not a NIfTI file name (.nii or .nii.gz)"))?;
        BTreeMap::from([(id, predictions.to_path_buf())])
    };
    if predicted.is_empty() {
        return Err(Error::Dataset(format!(
            "{}: no NIfTI files (.nii, .nii.gz) to evaluate",
            predictions.display()
        )));
    }
    if !meta(reference)?.is_dir() {
        // One reference file: it goes with the one prediction, whatever their names.
        if predicted.len() != 1 {
            return Err(Error::Dataset(format!(
                "{} is one file but {} holds {} predictions: give a folder of references",
                reference.display(),
                predictions.display(),
                predicted.len()
            )));
        }
        let pairs = predicted
            .into_iter()
            .map(|(id, prediction)| CasePair {
                id,
                prediction,
                reference: Some(reference.to_path_buf()),
            })
            .collect();
        return Ok(Pairs {
            pairs,
            without_prediction: Vec::new(),
        });
    }
    let mut best: Option<BTreeMap<String, PathBuf>> = None;
    for dir in [reference.join("labelsTs"), reference.join("labelsTr")]
        .into_iter()
        .filter(|d| d.is_dir())
        .chain([reference.to_path_buf()])
    {
        let refs = by_id(&dir)?;
        let hits = |m: &BTreeMap<String, PathBuf>| {
            predicted.keys().filter(|id| m.contains_key(*id)).count()
        };
        if best.as_ref().is_none_or(|b| hits(&refs) > hits(b)) {
            best = Some(refs);
        }
    }
    let refs = best.unwrap_or_default();
    let without_prediction = refs
        .keys()
        .filter(|id| !predicted.contains_key(*id))
        .cloned()
        .collect();
    let pairs = predicted
        .into_iter()
        .map(|(id, prediction)| CasePair {
            reference: refs.get(&id).cloned(),
            id,
            prediction,
        })
        .collect();
    Ok(Pairs {
        pairs,
        without_prediction,
    })
}

/// The dataset.json that describes the references: the one given, else one in the reference
/// folder or the folder above it (nnU-Net's `labelsTr/../dataset.json`).
fn description(opts: &EvaluateOptions) -> Result<Option<DatasetDescription>> {
    if let Some(path) = &opts.dataset_json {
        return DatasetDescription::read(path).map(Some);
    }
    let start = if opts.reference.is_dir() {
        Some(opts.reference.as_path())
    } else {
        opts.reference.parent()
    };
    let found = start
        .into_iter()
        .flat_map(|d| [Some(d), d.parent()])
        .flatten()
        .map(|d| d.join("dataset.json"))
        .find(|p| p.symlink_metadata().is_ok());
    found.map(|p| DatasetDescription::read(&p)).transpose()
}

/// The classes to measure (background excluded) and the ignore label: `--labels` (each a
/// class or a region, checked when parsed), else what the dataset.json scores
/// ([`FileLabels`]), else every value met.
pub fn class_table(opts: &EvaluateOptions) -> Result<ClassTable> {
    let scored = description(opts)?.map(|d| {
        let l = FileLabels::of(&d);
        (l.scored().to_vec(), l.ignore())
    });
    let ignore = scored.as_ref().and_then(|s| s.1);
    Ok(match (&opts.labels, scored) {
        (Some(c), _) => ClassTable::fixed(
            c.iter().filter(|c| c.values != [0]).cloned().collect(),
            ignore,
        ),
        (None, Some((classes, _))) => ClassTable::fixed(classes, ignore),
        (None, None) => ClassTable::discovered(ignore),
    })
}

/// Parse `--labels`: comma-separated values, a region as values joined by `+`, each optionally
/// named `name=`: `1,2`, `vessel=1`, `tumour=1+2+3`.
pub fn parse_labels(text: &str) -> std::result::Result<Vec<LabelClass>, String> {
    let labels = parse_label_list(text)?;
    crate::format::dataset_json::check_region_labels(labels.iter().filter(|c| c.values.len() > 1))?;
    Ok(labels)
}

/// `--labels` split into classes, unchecked.
fn parse_label_list(text: &str) -> std::result::Result<Vec<LabelClass>, String> {
    text.split(',')
        .map(|item| {
            let (name, values) = match item.split_once('=') {
                Some((n, v)) => (Some(n.trim().to_string()), v),
                None => (None, item),
            };
            let values: Vec<u16> = values
                .split('+')
                .map(|v| {
                    v.trim()
                        .parse::<u16>()
                        .map_err(|_| format!("{v:?} is not a label value (0..65535)"))
                })
                .collect::<std::result::Result<_, _>>()?;
            let name = name.unwrap_or_else(|| {
                let v: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                format!("label {}", v.join("+"))
            });
            Ok(LabelClass { name, values })
        })
        .collect()
}
