//! Cross-validation: the folds' validation predictions (each fold's `validation/`, written in
//! the held-out cases' own geometry) scored together, one score for the configuration; then
//! nnU-Net's postprocessing rule decided on them: keep only the largest connected component of
//! the foreground, kept if the mean foreground Dice rises and no class's mean Dice falls; then,
//! with several classes, per class in turn, kept where that class's mean Dice rises. The
//! decision is written beside each fold's model, where `predict` finds it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::pairs::{CasePair, Pairs};
use super::report::EvaluationReport;
use super::{evaluate_pairs, ClassTable};
use crate::error::{Error, Result};
use crate::format::crossval::{
    Postprocessing, SummaryCases, CROSSVAL_DIR, POSTPROCESSING_FILE, SUMMARY_FILE, VALIDATION_DIR,
};
use crate::format::dataset_json::LabelClass;
use crate::format::run::{RunRecord, RUN_FILE};
use crate::infer::postprocess::{apply_file, Region};

/// What to cross-validate.
#[derive(Clone, Debug)]
pub struct CrossValOptions {
    /// Fold run folders, or folders holding them.
    pub runs: Vec<PathBuf>,
    /// Where the cross-validation's files go (default: `crossval/` beside the folds).
    pub out: Option<PathBuf>,
    /// Decide the postprocessing too.
    pub postprocessing: bool,
    /// Measure clDice in the final scores.
    pub cldice: bool,
    /// Cases measured at once.
    pub jobs: usize,
    /// Progress bars.
    pub progress: bool,
}

/// One configuration's cross-validation.
#[derive(Debug)]
pub struct CrossValidation {
    /// The fold runs, in the order found.
    pub folds: Vec<PathBuf>,
    /// The folder written.
    pub out: PathBuf,
    /// The folds' predictions scored together.
    pub report: EvaluationReport,
    /// The postprocessing decided (none when not asked for).
    pub postprocessing: Postprocessing,
    /// The scores with it applied (when it changes anything).
    pub postprocessed: Option<EvaluationReport>,
}

/// A run folder: it has a `run.json`.
fn is_run(dir: &Path) -> bool {
    dir.join(RUN_FILE).is_file()
}

/// The fold runs `paths` name: each a run folder, or a folder whose sub-folders are runs.
pub fn find_folds(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut folds = Vec::new();
    for p in paths {
        if is_run(p) {
            folds.push(p.clone());
            continue;
        }
        let rd = std::fs::read_dir(p).map_err(|e| Error::io(p, e))?;
        let mut found: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|d| is_run(d))
            .collect();
        found.sort();
        if found.is_empty() {
            return Err(Error::Config(format!(
                "{}: neither a run folder (no {RUN_FILE}) nor a folder of them",
                p.display()
            )));
        }
        folds.extend(found);
    }
    Ok(folds)
}

/// The classes of a run, as [`ClassTable`] rows (background left out).
pub fn run_classes(record: &RunRecord) -> Vec<LabelClass> {
    record.labels().foreground()
}

/// The folds' records (all of one dataset, classes and channels) and their validation cases
/// as pairs (no case twice).
pub fn gather(folds: &[PathBuf]) -> Result<(RunRecord, Pairs)> {
    let mut first: Option<(PathBuf, RunRecord)> = None;
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut pairs = Pairs::default();
    for run in folds {
        let path = run.join(RUN_FILE);
        let record = RunRecord::read(&path)?
            .ok_or_else(|| Error::Config(format!("{}: no run record", path.display())))?;
        if let Some((p0, r0)) = &first {
            let differs = if r0.dataset != record.dataset {
                Some("dataset")
            } else if run_classes(r0) != run_classes(&record)
                || r0.ignore_label != record.ignore_label
            {
                Some("classes")
            } else if r0.channels != record.channels {
                Some("channels")
            } else {
                None
            };
            if let Some(what) = differs {
                return Err(Error::Config(format!(
                    "{} and {}: runs of different {what} cannot be scored together",
                    p0.display(),
                    run.display()
                )));
            }
        }
        let summary = run.join(VALIDATION_DIR).join(SUMMARY_FILE);
        if !summary.is_file() {
            return Err(Error::Config(format!(
                "{}: no fold validation (train the fold to its end, or run `train --fold K \
                 --out {} --validate-only`)",
                summary.display(),
                run.display()
            )));
        }
        for c in SummaryCases::read(&summary)?.cases {
            if let Some(other) = seen.insert(c.id.clone(), run.clone()) {
                return Err(Error::Config(format!(
                    "case {} is validated in two folds ({} and {}): not one cross-validation",
                    c.id,
                    other.display(),
                    run.display()
                )));
            }
            let file = c
                .prediction
                .file_name()
                .map(|n| run.join(VALIDATION_DIR).join(n))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{}: case {} has no prediction file name",
                        summary.display(),
                        c.id
                    ))
                })?;
            pairs.pairs.push(CasePair {
                id: c.id,
                prediction: file,
                reference: c.reference,
            });
        }
        if first.is_none() {
            first = Some((run.clone(), record));
        }
    }
    let (_, record) = first.ok_or_else(|| Error::Config("no fold run to cross-validate".into()))?;
    pairs.pairs.sort_by(|a, b| a.id.cmp(&b.id));
    Ok((record, pairs))
}

/// The default output folder: `crossval/` in the folder holding the first fold.
fn default_out(opts: &CrossValOptions, folds: &[PathBuf]) -> PathBuf {
    let given_parent = opts.runs.len() == 1 && !is_run(&opts.runs[0]);
    if given_parent {
        return opts.runs[0].join(CROSSVAL_DIR);
    }
    folds[0]
        .parent()
        .unwrap_or(Path::new("."))
        .join(CROSSVAL_DIR)
}

/// Score the folds together and decide the postprocessing.
pub fn cross_validate(opts: &CrossValOptions) -> Result<CrossValidation> {
    let folds = find_folds(&opts.runs)?;
    let (record, pairs) = gather(&folds)?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| default_out(opts, &folds));
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    let table = ClassTable::of_labels(&record.labels());
    let report = evaluate_pairs(pairs.clone(), &table, opts.cldice, opts.jobs, opts.progress)?;
    write_json(&out.join(SUMMARY_FILE), &report)?;
    let mut cv = CrossValidation {
        folds,
        out,
        report,
        postprocessing: Postprocessing {
            connectivity: "full".into(),
            ..Default::default()
        },
        postprocessed: None,
    };
    if opts.postprocessing {
        let (decision, after) =
            decide_postprocessing(&pairs, &table, &cv.report, &cv.out, opts.cldice, opts.jobs)?;
        for run in &cv.folds {
            decision.write(&run.join(POSTPROCESSING_FILE))?;
        }
        cv.postprocessing = decision;
        cv.postprocessed = after;
    }
    Ok(cv)
}

pub(crate) fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<()> {
    let json = serde_json::to_string_pretty(v)
        .map_err(|e| Error::Config(format!("{}: does not serialize: {e}", path.display())))?;
    std::fs::write(path, format!("{json}\n")).map_err(|e| Error::io(path, e))
}

/// The pairs' predictions filtered into `dir`, each keeping the largest component of
/// `regions` in turn.
fn filtered(pairs: &Pairs, dir: &Path, regions: &[Region]) -> Result<Pairs> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut out = pairs.clone();
    for p in &mut out.pairs {
        let name = p.prediction.file_name().unwrap_or_default();
        let to = dir.join(name);
        apply_file(
            &p.prediction,
            &to,
            regions,
            crate::geometry::components::Connectivity::Full,
        )?;
        p.prediction = to;
    }
    Ok(out)
}

/// A class's mean Dice in a report (NaN when absent).
fn class_dice(r: &EvaluationReport, values: &[u16]) -> f64 {
    r.mean
        .iter()
        .find(|m| m.values == values)
        .map_or(f64::NAN, |m| m.dice)
}

/// nnU-Net's rule on cross-validation predictions `pairs` whose scores are `baseline` (Dice
/// only, as nnU-Net decides): the decision, written to `out/postprocessing.json`, and the
/// scores with it applied (predictions in `out/postprocessed/`) when it changes anything.
pub fn decide_postprocessing(
    pairs: &Pairs,
    table: &ClassTable,
    baseline: &EvaluationReport,
    out: &Path,
    cldice: bool,
    jobs: usize,
) -> Result<(Postprocessing, Option<EvaluationReport>)> {
    let mut decision = Postprocessing {
        connectivity: "full".into(),
        ..Default::default()
    };
    let values: Vec<u16> = table
        .classes
        .iter()
        .flat_map(|c| c.values.clone())
        .collect();
    let scratch = out.join(".postprocessing");
    let _ = std::fs::remove_dir_all(&scratch);
    let score = |p: Pairs| evaluate_pairs(p, table, false, jobs, false);
    let mut accepted: Vec<Region> = Vec::new();
    let mut best = baseline.clone();
    if !values.is_empty() {
        // The foreground as a whole: kept if its mean rises and no class falls.
        let r = score(filtered(
            pairs,
            &scratch.join("foreground"),
            std::slice::from_ref(&values),
        )?)?;
        let rises = r.foreground_mean.dice > best.foreground_mean.dice;
        let one_falls = table
            .classes
            .iter()
            .any(|c| class_dice(&r, &c.values) < class_dice(&best, &c.values));
        if rises && !one_falls {
            decision.foreground = true;
            accepted.push(values.clone());
            best = r;
        }
    }
    // Then each class in turn, on top of what was kept.
    if table.classes.len() > 1 {
        for c in &table.classes {
            let mut regions = accepted.clone();
            regions.push(c.values.clone());
            let name: Vec<String> = c.values.iter().map(|v| v.to_string()).collect();
            let dir = scratch.join(format!("class_{}", name.join("+")));
            let r = score(filtered(pairs, &dir, &regions)?)?;
            if class_dice(&r, &c.values) > class_dice(&best, &c.values) {
                match c.values.as_slice() {
                    [one] => decision.classes.push(*one),
                    // A region's filter: its labels together, as nnU-Net filters regions.
                    many => decision.regions.push(many.to_vec()),
                }
                accepted = regions;
                best = r;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    decision.dice_before = Some(baseline.foreground_mean.dice);
    decision.dice_after = Some(best.foreground_mean.dice);
    decision.decided_in = Some(std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf()));
    let mut after = None;
    if !accepted.is_empty() {
        let dir = out.join("postprocessed");
        let _ = std::fs::remove_dir_all(&dir);
        let done = filtered(pairs, &dir, &accepted)?;
        let r = evaluate_pairs(done, table, cldice, jobs, false)?;
        write_json(&dir.join(SUMMARY_FILE), &r)?;
        after = Some(r);
    }
    decision.write(&out.join(POSTPROCESSING_FILE))?;
    Ok((decision, after))
}
