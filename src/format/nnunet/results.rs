//! The results folder `TRAINER__PLANS__CONFIGURATION` and where nnU-Net's spelling puts it.

use std::path::{Path, PathBuf};

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
        let mut postprocessing = None;
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
                if p.is_file() && postprocessing.is_none() {
                    postprocessing = Some(p);
                }
            }
        }
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
