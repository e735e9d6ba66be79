//! `evaluate`: compare segmentations with reference ones, case by case and class by class:
//! Dice, IoU, centreline Dice (clDice), 95th-percentile Hausdorff distance, average surface
//! distance (physical units from the headers) and volumes, then their means over cases.
//!
//! Stages: [`pairs`] matches each prediction with its reference and decides the classes;
//! [`overlap`] reads both files once, a slice at a time, counting voxels and collecting edge
//! voxels (and copying both into scratch files for clDice); [`surface`] measures the distances
//! between edges; [`crate::evaluate::centreline`] thins both scratch volumes block by block; [`report`]
//! holds the results and their table. Memory follows a slice, a few blocks and the surfaces,
//! never the volume; clDice's scratch costs 4 bytes a voxel of disk in the temporary folder
//! (`TMPDIR`) while a case is measured.

pub mod best;
pub mod centreline;
pub mod crossval;
pub mod overlap;
pub mod pairs;
pub mod report;
pub mod surface;

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::evaluate::centreline::scratch::ScratchLabels;
use crate::evaluate::centreline::{centreline_counts, ClassMask};
use crate::format::dataset_json::LabelClass;
use crate::nifti_io::read_header;
use crate::prep::dataset::scan::check_prediction;
pub use overlap::ClassTable;
use overlap::{measure_pair, PairScratch};
use pairs::CasePair;
use report::{CaseOutcome, CaseReport, ClassMetrics, EvaluationReport};
use surface::surface_distances;

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct EvaluateOptions {
    /// A segmentation file, or a folder of them (`CASE.nii.gz`, as `predict` writes).
    pub predictions: PathBuf,
    /// The reference segmentation file, or a folder of them (a dataset folder with
    /// `labelsTs/` or `labelsTr/` too).
    pub reference: PathBuf,
    /// The dataset.json naming the classes (found beside the reference when not given).
    pub dataset_json: Option<PathBuf>,
    /// Classes given on the command line (they win over any dataset.json).
    pub labels: Option<Vec<LabelClass>>,
    /// Measure clDice (thinning both segmentations; `--no-cldice` leaves it out).
    pub cldice: bool,
    /// Cases measured at once.
    pub jobs: usize,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
}

/// Measure every prediction against its reference. Errors of the job (no predictions, an
/// unreadable folder or dataset.json) are returned; a case's problem fails that case alone.
pub fn evaluate(opts: &EvaluateOptions) -> Result<EvaluationReport> {
    let found = pairs::pair_cases(&opts.predictions, &opts.reference)?;
    let table = pairs::class_table(opts)?;
    evaluate_pairs(found, &table, opts.cldice, opts.jobs, opts.progress)
}

/// Measure pairs already matched, with the classes of `table`: [`evaluate`]'s work, for
/// callers that know the pairs (fold validation, cross-validation).
pub fn evaluate_pairs(
    found: pairs::Pairs,
    table: &ClassTable,
    cldice: bool,
    jobs: usize,
    progress: bool,
) -> Result<EvaluationReport> {
    let started = Instant::now();
    let bar = progress_bar(progress, found.pairs.len() as u64);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.max(1))
        .build()
        .map_err(|e| Error::Config(format!("cannot start {jobs} threads: {e}")))?;
    let cases: Vec<CaseReport> = pool.install(|| {
        found
            .pairs
            .par_iter()
            .map(|pair| {
                let outcome = match evaluate_case(pair, table, cldice) {
                    Ok((unit, classes)) => CaseOutcome::Evaluated { unit, classes },
                    Err(e) => CaseOutcome::Failed {
                        error: e.to_string(),
                    },
                };
                bar.inc(1);
                CaseReport {
                    id: pair.id.clone(),
                    prediction: pair.prediction.clone(),
                    reference: pair.reference.clone(),
                    outcome,
                }
            })
            .collect()
    });
    bar.finish_and_clear();
    let mut units: Vec<&str> = cases
        .iter()
        .filter_map(|c| match &c.outcome {
            CaseOutcome::Evaluated { unit, .. } => Some(*unit),
            CaseOutcome::Failed { .. } => None,
        })
        .collect();
    units.dedup();
    let unit = match units.as_slice() {
        [] => "unknown".to_string(),
        [u] => u.to_string(),
        _ => "mixed".to_string(),
    };
    let cases = align_classes(cases);
    let (mean, foreground_mean) = report::means(&cases);
    let failed = cases
        .iter()
        .filter(|c| matches!(c.outcome, CaseOutcome::Failed { .. }))
        .count();
    Ok(EvaluationReport {
        unit,
        evaluated: cases.len() - failed,
        failed,
        cases,
        mean,
        foreground_mean,
        without_prediction: found.without_prediction,
        wall_seconds: started.elapsed().as_secs_f64(),
        peak_rss_bytes: crate::util::sysinfo::peak_rss_bytes(),
    })
}

/// One case: headers checked against each other, one pass, distances per class, then clDice.
fn evaluate_case(
    pair: &CasePair,
    table: &ClassTable,
    cldice: bool,
) -> Result<(&'static str, Vec<ClassMetrics>)> {
    let reference = pair.reference.as_ref().ok_or_else(|| {
        Error::case(
            &pair.id,
            format!(
                "no reference segmentation for prediction {}",
                pair.prediction.display()
            ),
        )
    })?;
    let r = read_header(reference)?;
    let p = in_unit_of(read_header(&pair.prediction)?, &r);
    check_prediction(&pair.id, &p, &r)?;
    if p.unit != r.unit && p.unit != "unknown" && r.unit != "unknown" {
        return Err(Error::case(
            &pair.id,
            format!(
                "prediction {} is in {} but reference {} in {}",
                p.path.display(),
                p.unit,
                r.path.display(),
                r.unit
            ),
        ));
    }
    let [nx, ny, nz] = r.shape_xyz;
    let shape_zyx = [nz, ny, nx];
    let scratch = if cldice {
        let dir = std::env::temp_dir();
        Some(PairScratch {
            pred: ScratchLabels::create(&dir, shape_zyx)?,
            reference: ScratchLabels::create(&dir, shape_zyx)?,
        })
    } else {
        None
    };
    let (table, counts) = measure_pair(
        &pair.prediction,
        reference,
        r.shape_xyz,
        table.clone(),
        scratch.as_ref(),
    )?;
    // The spacing every tool takes as the voxel size: the header's pixdim.
    let spacing = r.spacing_xyz;
    let voxel_volume = spacing.iter().product::<f64>();
    let mut classes = Vec::with_capacity(counts.len());
    for (k, (class, c)) in table.classes.iter().zip(&counts).enumerate() {
        let d = surface_distances(&c.pred_edges, &c.ref_edges, spacing);
        let mut m = ClassMetrics::new(class, c, d, voxel_volume);
        // A class in neither file has no skeleton (clDice NaN): skip its whole-volume
        // thinning, so a dataset.json of thousands of classes costs what its present ones do.
        let present = c.tp + c.fp + c.fn_ > 0;
        if let Some(s) = scratch.as_ref().filter(|_| present) {
            let member = |v: u16| table.member(k as u16, v);
            let mask = |labels| ClassMask {
                labels,
                member: &member,
            };
            m.cldice = centreline_counts(&mask(&s.pred), &mask(&s.reference), shape_zyx)?.cldice();
        }
        classes.push(m);
    }
    Ok((r.unit, classes))
}

/// The prediction's header in the reference's unit when both units are known and differ
/// (SimpleITK, hence nnU-Net, writes mm for an input in um): its affine and spacing scaled, so
/// the same grid in other units is the same grid.
fn in_unit_of(
    mut p: crate::nifti_io::HeaderInfo,
    r: &crate::nifti_io::HeaderInfo,
) -> crate::nifti_io::HeaderInfo {
    use crate::nifti_io::unit_in_mm;
    if let (Some(a), Some(b)) = (unit_in_mm(p.unit), unit_in_mm(r.unit)) {
        if p.unit != r.unit {
            let f = a / b;
            for row in p.affine.0.iter_mut().take(3) {
                for v in row.iter_mut() {
                    *v *= f;
                }
            }
            p.spacing_xyz = p.spacing_xyz.map(|s| s * f);
            p.unit = r.unit;
        }
    }
    p
}

/// When classes were discovered case by case, give every case a row for every class any case
/// has (absent from both files: undefined), in value order.
fn align_classes(mut cases: Vec<CaseReport>) -> Vec<CaseReport> {
    let mut all: Vec<(Vec<u16>, String)> = Vec::new();
    for c in &cases {
        if let CaseOutcome::Evaluated { classes, .. } = &c.outcome {
            for m in classes {
                if !all.iter().any(|(v, _)| *v == m.values) {
                    all.push((m.values.clone(), m.class.clone()));
                }
            }
        }
    }
    all.sort();
    for c in &mut cases {
        if let CaseOutcome::Evaluated { classes, .. } = &mut c.outcome {
            let mut aligned = Vec::with_capacity(all.len());
            for (values, name) in &all {
                let m = match classes.iter().position(|m| m.values == *values) {
                    Some(i) => classes[i].clone(),
                    None => ClassMetrics::new(
                        &LabelClass {
                            name: name.clone(),
                            values: values.clone(),
                        },
                        &overlap::ClassCounts::default(),
                        surface::SurfaceDistances::UNDEFINED,
                        0.0,
                    ),
                };
                aligned.push(m);
            }
            *classes = aligned;
        }
    }
    cases
}

fn progress_bar(enabled: bool, cases: u64) -> indicatif::ProgressBar {
    crate::util::progress::bar(
        enabled,
        cases,
        "evaluate [{bar:24}] {pos}/{len} cases eta {eta}",
        |s| s,
    )
}
