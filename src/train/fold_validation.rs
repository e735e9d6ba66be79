//! A fold's validation, as nnU-Net ends a fold: its held-out cases predicted at full resolution
//! by `predict`'s code from their own files (so in their own geometry), the class probabilities
//! kept (float16 Zarr, for ensembles), then scored against their label files into
//! `validation/summary.json`. The cross-validation score, the postprocessing decision and the
//! ensembles of configurations all start from this folder.
//!
//! The cases' files are found where the cache recorded its dataset at build time (or in the
//! folder given instead), and each is checked to be the file its cache entry was built from
//! (name and size), so a moved or changed dataset fails that case with a sentence, not a
//! wrong score.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cache::reader::CacheReader;
use crate::error::{Error, Result};
use crate::evaluate::pairs::{CasePair, Pairs};
use crate::evaluate::report::EvaluationReport;
use crate::evaluate::{evaluate_pairs, ClassTable};
use crate::format::crossval::{SUMMARY_FILE, VALIDATION_DIR};
use crate::format::entry::Sources;
use crate::format::run::{RunRecord, RUN_FILE};
use crate::infer::model_dir::Which;
use crate::infer::postprocess::PostprocessingChoice;
use crate::infer::predict::{predict, PredictOptions, PredictOutcome};
use crate::prep::cache_build::previous;
use crate::prep::dataset::{discover, origin::source_of, CaseSource, DatasetSource};

/// A case that could not be validated, and why.
pub type Failed = (String, String);

/// What to validate and with what.
#[derive(Clone, Debug)]
pub struct FoldValidationOptions {
    /// The fold's run folder (its `run.json` names the held-out cases).
    pub run_dir: PathBuf,
    /// The cache the run trained from.
    pub cache_dir: PathBuf,
    /// The dataset folder, when it is no longer where the cache recorded it.
    pub data: Option<PathBuf>,
    /// `cpu`, `cuda`, `cuda:N`.
    pub device: String,
    /// Test-time mirroring (nnU-Net's default; eight passes a window).
    pub mirror: bool,
    /// Measure clDice too.
    pub cldice: bool,
    /// Worker threads.
    pub jobs: usize,
    /// Print only errors.
    pub quiet: bool,
}

/// What a fold's validation did.
#[derive(Debug)]
pub struct FoldValidation {
    /// The scores (also in `validation/summary.json`).
    pub report: EvaluationReport,
    /// The summary file.
    pub summary: PathBuf,
    /// Held-out cases that could not be found, predicted or scored, with why.
    pub failed: Vec<Failed>,
}

/// Does `found` hold the same files the entry was built from (names and sizes)?
fn same_files(case: &CaseSource, sources: &Sources) -> std::result::Result<(), String> {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().to_string());
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    let mut pairs: Vec<(&Path, &crate::format::entry::SourceFile)> = Vec::new();
    let images: Vec<&PathBuf> = if case.packed {
        case.images.iter().take(1).collect()
    } else {
        case.images.iter().collect()
    };
    if images.len() != sources.images.len() {
        return Err(format!(
            "the cache entry was built from {} image file(s), the dataset folder has {}",
            sources.images.len(),
            images.len()
        ));
    }
    pairs.extend(images.iter().map(|p| p.as_path()).zip(&sources.images));
    match (&case.label, &sources.label) {
        (Some(l), Some(s)) => pairs.push((l, s)),
        (None, _) => return Err("no label file in the dataset folder".into()),
        (Some(_), None) => return Err("its cache entry was built without a label".into()),
    }
    for (path, recorded) in pairs {
        // A first stage's segmentation with its probabilities beside it: the entry was built
        // from those (and names them), as the fold validation's predict builds it again.
        let probabilities = crate::prep::cache_build::previous_probabilities::beside(path)
            .filter(|p| name(p).as_deref() == Some(recorded.file.as_str()));
        let (path, bytes) = match &probabilities {
            Some(p) => (p.as_path(), Some(crate::cache::layout::dir_bytes(p))),
            None => (path, size(path)),
        };
        if name(path).as_deref() != Some(recorded.file.as_str()) || bytes != Some(recorded.bytes) {
            return Err(format!(
                "{} is not the file its cache entry was built from ({}, {} bytes)",
                path.display(),
                recorded.file,
                recorded.bytes
            ));
        }
    }
    Ok(())
}

/// The held-out cases' own files, checked against their entries; failures by case.
fn locate(
    opts: &FoldValidationOptions,
    reader: &CacheReader,
    dataset: &str,
    ids: &[String],
) -> Result<(Vec<CaseSource>, Vec<Failed>)> {
    let source = match &opts.data {
        Some(dir) => DatasetSource::Folder(dir.clone()),
        None => reader
            .dataset(dataset)?
            .origin
            .as_ref()
            .and_then(source_of)
            .ok_or_else(|| {
                Error::Train(format!(
                    "{}: dataset {dataset:?} records no dataset folder (built before it was \
                     recorded): pass the folder it was built from with --validation-data",
                    reader.root().display()
                ))
            })?,
    };
    let mut found = discover(&source)?;
    let (mut cases, mut failed) = (Vec::new(), Vec::new());
    // A cascade's second stage: its cases take the first stage's segmentations again.
    let recorded = reader.dataset(dataset)?;
    let values = previous::indicator_values(&recorded.params);
    if !values.is_empty() {
        let dir = recorded
            .origin
            .as_ref()
            .and_then(|o| o.previous_stage.clone())
            .ok_or_else(|| {
                Error::Train(format!(
                    "{}: dataset {dataset:?} has previous-stage channels but records no previous-stage folder: build it again with --previous-stage",
                    reader.root().display()
                ))
            })?;
        let (kept, problems) = previous::attach(&dir, found.cases, &values)?;
        found.cases = kept;
        failed.extend(
            problems
                .into_iter()
                .filter(|p| ids.contains(&p.id))
                .map(|p| (p.id, p.error.to_string())),
        );
    }
    let by_id: BTreeMap<&str, &CaseSource> =
        found.cases.iter().map(|c| (c.id.as_str(), c)).collect();
    for id in ids {
        let checked = (|| -> std::result::Result<CaseSource, String> {
            let case = by_id
                .get(id.as_str())
                .ok_or_else(|| "not found in the dataset folder".to_string())?;
            let entry = reader.open_entry(dataset, id).map_err(|e| e.to_string())?;
            same_files(case, entry.sources())?;
            Ok((*case).clone())
        })();
        match checked {
            Ok(c) => cases.push(c),
            Err(why) => failed.push((id.clone(), why)),
        }
    }
    Ok((cases, failed))
}

/// Refuse, before a fold is trained, a fold validation this cache cannot have: a cache of
/// nnU-Net's preprocessing (its held-out cases would need nnU-Net's preprocessing in predict).
/// `dataset`: the one trained on (`None`: every dataset of the cache).
pub fn check_validatable(cache_dir: &Path, dataset: Option<&str>) -> Result<()> {
    let reader = CacheReader::open(cache_dir)?;
    let names: Vec<String> = match dataset {
        Some(d) => vec![d.to_string()],
        None => reader.datasets().into_iter().map(str::to_string).collect(),
    };
    for name in names {
        if let Ok(d) = reader.dataset(&name) {
            if let Some(n) = &d.params.nnunet {
                return Err(Error::Config(format!(
                    "{}: dataset {name:?} holds nnU-Net's preprocessing ({} configuration {}): a fold's validation in the cases' own geometry is not available for it yet; train with --no-fold-validation (validation on cached patches still runs)",
                    cache_dir.display(),
                    n.plans,
                    n.configuration
                )));
            }
        }
    }
    Ok(())
}

/// Predict and score the run's held-out cases into `RUN/validation/`.
pub fn validate_fold(opts: &FoldValidationOptions) -> Result<FoldValidation> {
    let record_path = opts.run_dir.join(RUN_FILE);
    let record = RunRecord::read(&record_path)?.ok_or_else(|| {
        Error::Train(format!(
            "{}: no run record: not a run folder",
            record_path.display()
        ))
    })?;
    if record.split.val.is_empty() {
        return Err(Error::Train(format!(
            "{}: the run holds out no case: nothing to validate",
            record_path.display()
        )));
    }
    let reader = CacheReader::open(&opts.cache_dir)?;
    let (cases, mut failed) = locate(opts, &reader, &record.dataset, &record.split.val)?;
    drop(reader);
    let out = opts.run_dir.join(VALIDATION_DIR);
    let labels: BTreeMap<String, PathBuf> = cases
        .iter()
        .filter_map(|c| Some((c.id.clone(), std::path::absolute(c.label.as_ref()?).ok()?)))
        .collect();
    let mut pairs = Pairs::default();
    if !cases.is_empty() {
        let predicted = predict(&PredictOptions {
            models: vec![opts.run_dir.clone()],
            // Validation scores the raw predictions: postprocessing is decided from them.
            postprocessing: PostprocessingChoice::Off,
            // nnU-Net validates the final weights, not the best patch-Dice checkpoint.
            which: Which::Latest,
            inputs: Vec::new(),
            cases,
            out: out.clone(),
            device: opts.device.clone(),
            overlap: 0.5,
            mirror: opts.mirror,
            batch: 1,
            precision: None,
            jobs: opts.jobs,
            save_probabilities: true,
            window_memory: 256 << 20,
            mapped_mib: None,
            quiet: opts.quiet,
            // The cases carry the previous stage's channels already.
            previous_stage: None,
            previous_models: Vec::new(),
        })?;
        for c in predicted.cases {
            match c.outcome {
                PredictOutcome::Predicted { output, .. } | PredictOutcome::Existing { output } => {
                    pairs.pairs.push(CasePair {
                        reference: labels.get(&c.id).cloned(),
                        id: c.id,
                        prediction: output,
                    })
                }
                PredictOutcome::Failed { error } => failed.push((c.id, error)),
            }
        }
    }
    let report = evaluate_pairs(
        pairs,
        &ClassTable::of_labels(&record.labels()),
        opts.cldice,
        opts.jobs,
        !opts.quiet,
    )?;
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    let summary = out.join(SUMMARY_FILE);
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| Error::Train(format!("the validation report does not serialize: {e}")))?;
    std::fs::write(&summary, format!("{json}\n")).map_err(|e| Error::io(&summary, e))?;
    failed.sort();
    Ok(FoldValidation {
        report,
        summary,
        failed,
    })
}
