//! The best configuration, as nnU-Net's find_best_configuration: each configuration (a folder
//! of fold runs) cross-validated, each pair of configurations ensembled from the folds' kept
//! validation probabilities (no prediction again: the mean of both configurations' class
//! probabilities per case, then the argmax), ranked by mean foreground Dice; the winner's
//! postprocessing decided on its cross-validation predictions, and the `predict` command
//! that reproduces it on new volumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::crossval::{
    cross_validate, decide_postprocessing, find_folds, gather, run_classes, write_json,
    CrossValOptions,
};
use super::pairs::{CasePair, Pairs};
use super::{evaluate_pairs, ClassTable};
use crate::cache::probabilities::ProbabilityReader;
use crate::error::{Error, Result};
use crate::format::crossval::{Postprocessing, SUMMARY_FILE, VALIDATION_DIR};
use crate::format::probabilities::PROBABILITIES_SUFFIX;
use crate::format::run::RunRecord;
use crate::nifti_io::{LabelType, LabelWriter};

/// What to compare.
#[derive(Clone, Debug)]
pub struct BestOptions {
    /// One folder of fold runs per configuration.
    pub configurations: Vec<PathBuf>,
    /// Where the ensembles' files and `best.json` go.
    pub out: PathBuf,
    /// Measure clDice in the scores.
    pub cldice: bool,
    /// Cases measured at once.
    pub jobs: usize,
    /// Progress bars.
    pub progress: bool,
}

/// One candidate: a configuration, or an ensemble of two.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// "3d_fullres", or "3d_fullres + 2d".
    pub name: String,
    /// Its configuration folders.
    pub configurations: Vec<PathBuf>,
    /// Cross-validation mean foreground Dice (before postprocessing).
    pub dice: f64,
    /// Cross-validation mean foreground clDice (NaN when not measured).
    pub cldice: f64,
    /// Cases scored.
    pub cases: usize,
    /// Where its cross-validation files are.
    pub folder: PathBuf,
}

/// The comparison.
#[derive(Clone, Debug, Serialize)]
pub struct BestReport {
    /// Best first.
    pub ranking: Vec<Candidate>,
    /// The winner's postprocessing, decided on its cross-validation predictions.
    pub postprocessing: Postprocessing,
    /// Its mean foreground Dice after postprocessing.
    pub dice_postprocessed: f64,
    /// The command that predicts new volumes as the winner: its fold models as one ensemble
    /// and its postprocessing.
    pub predict_command: String,
    /// Pairs of configurations not ensembled, and why.
    pub skipped: Vec<String>,
}

/// A configuration's name: its folder's.
fn name_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| dir.display().to_string())
}

/// Each case's fold run (the one that validated it).
fn fold_of_cases(folds: &[PathBuf]) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    for run in folds {
        let (_, pairs) = gather(std::slice::from_ref(run))?;
        for p in pairs.pairs {
            out.insert(p.id, run.clone());
        }
    }
    Ok(out)
}

/// The mean of two configurations' kept validation probabilities of a case, its labels (argmax,
/// or regions over 0.5 in order) written as a segmentation in the cases' own geometry (`template`'s header).
fn ensemble_case(a: &Path, b: &Path, template: &Path, out: &Path) -> Result<()> {
    let (ra, rb) = (ProbabilityReader::open(a)?, ProbabilityReader::open(b)?);
    if ra.shape != rb.shape || !ra.attrs.labels().same_outputs(&rb.attrs.labels()) {
        return Err(Error::Config(format!(
            "{} and {}: probabilities of different shapes or classes ({:?} {:?} vs {:?} {:?})",
            a.display(),
            b.display(),
            ra.shape,
            ra.attrs.values,
            rb.shape,
            rb.attrs.values
        )));
    }
    let [heads, nz, ny, nx] = ra.shape;
    let outputs = ra.attrs.labels();
    let max = outputs.max_value();
    let mut w = LabelWriter::create(
        out,
        template,
        (nz * ny * nx) as u64,
        LabelType::for_max(max),
    )?;
    let rows = ra.rows.max(1);
    for z0 in (0..nz).step_by(rows) {
        let n = rows.min(nz - z0) * ny * nx;
        let mut best = vec![f32::NEG_INFINITY; n];
        let mut label = vec![0u16; n];
        for c in 0..heads {
            let (pa, pb) = (ra.read_slab(c, z0, rows)?, rb.read_slab(c, z0, rows)?);
            for i in 0..n {
                outputs.vote(c, 0.5 * (pa[i] + pb[i]), &mut best[i], &mut label[i]);
            }
        }
        w.write(&label)?;
    }
    w.finish()
}

/// Ensemble configurations `a` and `b` over their validation cases into `dir`.
fn ensemble(a: &[PathBuf], b: &[PathBuf], pairs_a: &Pairs, dir: &Path) -> Result<Pairs> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let (fa, fb) = (fold_of_cases(a)?, fold_of_cases(b)?);
    let mut out = Pairs::default();
    for p in &pairs_a.pairs {
        let (Some(ra), Some(rb)) = (fa.get(&p.id), fb.get(&p.id)) else {
            return Err(Error::Config(format!(
                "case {} is validated in one configuration only",
                p.id
            )));
        };
        let probs = |run: &Path| {
            run.join(VALIDATION_DIR)
                .join(format!("{}{PROBABILITIES_SUFFIX}", p.id))
        };
        let file = dir.join(format!("{}.nii.gz", p.id));
        ensemble_case(&probs(ra), &probs(rb), &p.prediction, &file)?;
        out.pairs.push(CasePair {
            id: p.id.clone(),
            prediction: file,
            reference: p.reference.clone(),
        });
    }
    Ok(out)
}

/// The predict command for a candidate.
fn predict_command(c: &Candidate, folds: &[PathBuf], pp: Option<&Path>) -> String {
    let mut cmd = String::from("predict");
    for f in folds {
        cmd.push_str(&format!(" --model {}", f.display()));
    }
    if c.configurations.len() > 1 {
        if let Some(p) = pp {
            cmd.push_str(&format!(" --postprocessing {}", p.display()));
        }
    }
    cmd.push_str(" INPUT... --out OUTPUT");
    cmd
}

/// Compare the configurations and their pairwise ensembles.
pub fn find_best(opts: &BestOptions) -> Result<BestReport> {
    if opts.configurations.is_empty() {
        return Err(Error::Config("no configuration to compare".into()));
    }
    std::fs::create_dir_all(&opts.out).map_err(|e| Error::io(&opts.out, e))?;
    struct Config {
        dir: PathBuf,
        folds: Vec<PathBuf>,
        pairs: Pairs,
        record: RunRecord,
    }
    let mut configs = Vec::new();
    let mut ranking = Vec::new();
    for dir in &opts.configurations {
        let cv = cross_validate(&CrossValOptions {
            runs: vec![dir.clone()],
            out: None,
            postprocessing: true,
            cldice: opts.cldice,
            jobs: opts.jobs,
            progress: opts.progress,
        })?;
        let (record, pairs) = gather(&cv.folds)?;
        ranking.push(Candidate {
            name: name_of(dir),
            configurations: vec![dir.clone()],
            dice: cv.report.foreground_mean.dice,
            cldice: cv.report.foreground_mean.cldice,
            cases: cv.report.evaluated,
            folder: cv.out.clone(),
        });
        configs.push(Config {
            dir: dir.clone(),
            folds: cv.folds,
            pairs,
            record,
        });
    }
    let mut skipped = Vec::new();
    let mut ensembles: BTreeMap<usize, (Pairs, ClassTable)> = BTreeMap::new();
    for i in 0..configs.len() {
        for j in i + 1..configs.len() {
            let (a, b) = (&configs[i], &configs[j]);
            let name = format!("{} + {}", name_of(&a.dir), name_of(&b.dir));
            let same_cases = a.pairs.pairs.iter().map(|p| &p.id).eq(b
                .pairs
                .pairs
                .iter()
                .map(|p| &p.id));
            if run_classes(&a.record) != run_classes(&b.record) || !same_cases {
                skipped.push(format!("{name}: different classes or validation cases"));
                continue;
            }
            if a.record.preprocessing != b.record.preprocessing {
                skipped.push(format!(
                    "{name}: different preprocessing, so predict cannot run them as one ensemble"
                ));
                continue;
            }
            let folder = opts
                .out
                .join(format!("ensemble_{}+{}", name_of(&a.dir), name_of(&b.dir)));
            let pairs = ensemble(&a.folds, &b.folds, &a.pairs, &folder)?;
            let table = ClassTable::of_labels(&a.record.labels());
            let r = evaluate_pairs(pairs.clone(), &table, opts.cldice, opts.jobs, opts.progress)?;
            write_json(&folder.join(SUMMARY_FILE), &r)?;
            ensembles.insert(ranking.len(), (pairs, table));
            ranking.push(Candidate {
                name,
                configurations: vec![a.dir.clone(), b.dir.clone()],
                dice: r.foreground_mean.dice,
                cldice: r.foreground_mean.cldice,
                cases: r.evaluated,
                folder,
            });
        }
    }
    // Best first; a NaN score last.
    let mut order: Vec<usize> = (0..ranking.len()).collect();
    order.sort_by(|&x, &y| {
        let (a, b) = (ranking[x].dice, ranking[y].dice);
        b.partial_cmp(&a)
            .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
    });
    let winner = order[0];
    // The winner's postprocessing: a configuration's was decided by its cross-validation; an
    // ensemble's is decided now on its ensembled predictions.
    let (postprocessing, dice_after, pp_file) = match ensembles.remove(&winner) {
        Some((pairs, table)) => {
            let c = &ranking[winner];
            let baseline = evaluate_pairs(pairs.clone(), &table, false, opts.jobs, false)?;
            let (d, after) =
                decide_postprocessing(&pairs, &table, &baseline, &c.folder, false, opts.jobs)?;
            let dice = after.map_or(c.dice, |r| r.foreground_mean.dice);
            let file = c.folder.join(crate::format::crossval::POSTPROCESSING_FILE);
            (d, dice, Some(file))
        }
        None => {
            let c = &ranking[winner];
            let file = c.folder.join(crate::format::crossval::POSTPROCESSING_FILE);
            let d = Postprocessing::read(&file)?.unwrap_or_default();
            let dice = d.dice_after.unwrap_or(c.dice);
            (d, dice, Some(file))
        }
    };
    let folds: Vec<PathBuf> = ranking[winner]
        .configurations
        .iter()
        .map(|d| find_folds(std::slice::from_ref(d)))
        .collect::<Result<Vec<_>>>()?
        .concat();
    let predict_command = predict_command(&ranking[winner], &folds, pp_file.as_deref());
    let ranking: Vec<Candidate> = order.into_iter().map(|i| ranking[i].clone()).collect();
    let report = BestReport {
        ranking,
        postprocessing,
        dice_postprocessed: dice_after,
        predict_command,
        skipped,
    };
    write_json(&opts.out.join("best.json"), &report)?;
    Ok(report)
}
