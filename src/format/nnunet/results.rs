//! The results folder `TRAINER__PLANS__CONFIGURATION` and where nnU-Net's spelling puts it.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::bad;
use crate::error::{Error, Result};

/// A results folder `TRAINER__PLANS__CONFIGURATION` and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct ResultsFolder {
    /// The folder.
    pub dir: PathBuf,
    /// The trainer's class name (from the folder's name).
    pub trainer: String,
    /// The plans' name (from the folder's name).
    pub plans_name: String,
    /// The configuration (from the folder's name).
    pub configuration: String,
    /// `fold_K` folders present (K a number, or `all`), sorted.
    pub folds: Vec<String>,
    /// A cross-validation postprocessing decision, if one is there.
    pub postprocessing: Option<PathBuf>,
}

impl ResultsFolder {
    /// Look at `dir`, naming what is missing.
    pub fn open(dir: &Path) -> Result<ResultsFolder> {
        if !dir.is_dir() {
            return Err(bad(
                dir,
                "not a folder: give nnU-Net's TRAINER__PLANS__CONFIGURATION results folder",
            ));
        }
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().to_string()))
            .unwrap_or_default();
        let parts: Vec<&str> = name.split("__").collect();
        let [trainer, plans_name, configuration] = parts[..] else {
            return Err(bad(dir, "the folder's name is not TRAINER__PLANS__CONFIGURATION, as nnU-Net names its results folders"));
        };
        for f in ["plans.json", "dataset.json"] {
            if !dir.join(f).is_file() {
                return Err(bad(
                    dir,
                    format!("no {f}: not a complete nnU-Net results folder"),
                ));
            }
        }
        let mut folds = Vec::new();
        let mut postprocessing: Vec<(String, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().to_string();
            if let Some(k) = n.strip_prefix("fold_") {
                if (k == "all" || k.parse::<u32>().is_ok()) && e.path().is_dir() {
                    folds.push(k.to_string());
                }
            } else if n.starts_with("crossval_results_folds_") {
                let p = e.path().join("postprocessing.json");
                if p.is_file() {
                    postprocessing.push((n, p));
                }
            }
        }
        // The five folds' decision (what nnU-Net's inference instructions name), else the
        // first by name.
        postprocessing.sort_by_key(|(n, _)| (n != "crossval_results_folds_0_1_2_3_4", n.clone()));
        let postprocessing = postprocessing.into_iter().next().map(|(_, p)| p);
        folds.sort_by_key(|k| (k.parse::<u32>().unwrap_or(u32::MAX), k.clone()));
        Ok(ResultsFolder {
            dir: dir.to_path_buf(),
            trainer: trainer.to_string(),
            plans_name: plans_name.to_string(),
            configuration: configuration.to_string(),
            folds,
            postprocessing,
        })
    }

    /// The checkpoint file of `fold`.
    pub fn checkpoint(&self, fold: &str, file: &str) -> PathBuf {
        self.dir.join(format!("fold_{fold}")).join(file)
    }
}

/// `$nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIGURATION` from nnU-Net's spelling:
/// `dataset` is the id (`4`, `004`) or the full name (`Dataset004_Hippocampus`).
pub fn results_dir(
    results: &Path,
    dataset: &str,
    trainer: &str,
    plans: &str,
    configuration: &str,
) -> Result<PathBuf> {
    let want: Option<u32> = dataset
        .strip_prefix("Dataset")
        .unwrap_or(dataset)
        .split('_')
        .next()
        .and_then(|s| s.parse().ok());
    let mut found: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(results)
        .map_err(|e| Error::io(results, e))?
        .flatten()
    {
        let n = e.file_name().to_string_lossy().to_string();
        let id = n
            .strip_prefix("Dataset")
            .and_then(|r| r.get(..3))
            .and_then(|s| s.parse::<u32>().ok());
        if n == dataset || (id.is_some() && id == want && !dataset.contains('_')) {
            found.push(e.path());
        }
    }
    found.sort();
    let d = match &found[..] {
        [one] => one.clone(),
        [] => {
            return Err(bad(
                results,
                format!("no dataset {dataset} in nnU-Net's results folder"),
            ))
        }
        many => {
            return Err(bad(
                results,
                format!(
                    "dataset {dataset} is ambiguous: {}",
                    many.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    };
    Ok(d.join(format!("{trainer}__{plans}__{configuration}")))
}

/// nnU-Net's postprocessing decision (`postprocessing.json` of a cross-validation folder): keep
/// only the largest connected component (26-connected, ties all kept) of each filter's voxels in
/// turn, the rest becoming background.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NnunetPostprocessing {
    /// The file.
    pub path: PathBuf,
    /// Per filter, the label values whose voxels form the mask (a label, a region, or the
    /// foreground's labels or regions together).
    pub filters: Vec<Vec<u16>>,
}

/// nnU-Net's only postprocessing function.
const KEEP_LARGEST: &str = "remove_all_but_largest_component_from_segmentation";

/// Largest postprocessing.json read: nnU-Net's are a few hundred bytes (one filter per label
/// or region, and the foreground's).
const MAX_POSTPROCESSING_BYTES: u64 = 1 << 20;

impl NnunetPostprocessing {
    /// Read `path` for a model that predicts the label values `predicted` (background left
    /// out), refusing functions and arguments nnU-Net's own code does not write, and labels
    /// the model never predicts.
    pub fn read(path: &Path, predicted: &[u16]) -> Result<NnunetPostprocessing> {
        if path.extension().is_some_and(|e| e == "pkl") {
            return Err(bad(
                path,
                "a pickle is not read: give the postprocessing.json nnU-Net writes beside it",
            ));
        }
        let bytes = crate::util::files::read_capped(path, MAX_POSTPROCESSING_BYTES)
            .map_err(|e| Error::io(path, e))?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| bad(path, format!("not valid JSON ({e})")))?;
        drop(bytes);
        let list = |key: &str| -> Result<Vec<Value>> {
            v.get(key)
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| {
                    bad(
                        path,
                        format!("no {key} list: not nnU-Net's postprocessing.json"),
                    )
                })
        };
        let fns = list("postprocessing_fns")?;
        let kwargs = list("postprocessing_kwargs")?;
        // One filter for the foreground, then one per label or region at most.
        if fns.len() > predicted.len() + 1 {
            return Err(bad(
                path,
                format!(
                    "{} postprocessing_fns for a model that predicts {} labels",
                    fns.len(),
                    predicted.len()
                ),
            ));
        }
        if fns.len() != kwargs.len() {
            return Err(bad(
                path,
                format!(
                    "{} postprocessing_fns but {} postprocessing_kwargs",
                    fns.len(),
                    kwargs.len()
                ),
            ));
        }
        let mut filters = Vec::new();
        for (i, (f, k)) in fns.iter().zip(&kwargs).enumerate() {
            if f.as_str() != Some(KEEP_LARGEST) {
                return Err(bad(
                    path,
                    format!("postprocessing_fns[{i}] is {f}: only {KEEP_LARGEST} is applied"),
                ));
            }
            let background = k.get("background_label").map_or(Some(0), Value::as_i64);
            if background != Some(0) {
                return Err(bad(
                    path,
                    format!(
                        "postprocessing_kwargs[{i}]: background_label other than 0 is not applied"
                    ),
                ));
            }
            let mut values = Vec::new();
            let target = k.get("labels_or_regions").ok_or_else(|| {
                bad(
                    path,
                    format!("postprocessing_kwargs[{i}] has no labels_or_regions"),
                )
            })?;
            // A label, a region (list of labels) or a list of either: the mask is the union.
            fn flatten(v: &Value, out: &mut Vec<u16>) -> bool {
                match v {
                    Value::Array(items) => items.iter().all(|x| flatten(x, out)),
                    _ => match v.as_u64().and_then(|n| u16::try_from(n).ok()) {
                        Some(n) if n > 0 => {
                            out.push(n);
                            true
                        }
                        _ => false,
                    },
                }
            }
            if !flatten(target, &mut values) || values.is_empty() {
                return Err(bad(path, format!("postprocessing_kwargs[{i}].labels_or_regions: give positive labels or lists of them")));
            }
            values.sort_unstable();
            values.dedup();
            if let Some(v) = values.iter().find(|v| !predicted.contains(v)) {
                return Err(bad(
                    path,
                    format!(
                        "postprocessing_kwargs[{i}].labels_or_regions: label {v} is not one the model predicts ({predicted:?})"
                    ),
                ));
            }
            filters.push(values);
        }
        Ok(NnunetPostprocessing {
            path: path.to_path_buf(),
            filters,
        })
    }
}
