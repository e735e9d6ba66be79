//! What `evaluate` reports: per case and class the overlap and distance metrics, their means
//! over cases, and the table printed for people (JSON is the same structure, serialized).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::overlap::ClassCounts;
use super::surface::SurfaceDistances;
use crate::format::dataset_json::LabelClass;

/// One class of one case. Undefined values (a class absent from both files: Dice, IoU and
/// distances; absent from one: distances) are NaN or infinite here and `null` in JSON, and
/// `empty` says which side was empty.
#[derive(Clone, Debug, Serialize)]
pub struct ClassMetrics {
    /// The class's name ("vessel", or "label 2" when no dataset.json names it).
    pub class: String,
    /// Its label values (several for a region).
    pub values: Vec<u16>,
    /// 2 TP / (2 TP + FP + FN).
    pub dice: f64,
    /// TP / (TP + FP + FN).
    pub iou: f64,
    /// Centreline Dice: harmonic mean of the share of the prediction's skeleton inside the
    /// reference and of the reference's skeleton inside the prediction (NaN when not measured).
    pub cldice: f64,
    /// 95th-percentile Hausdorff distance, physical units.
    pub hd95: f64,
    /// Hausdorff distance (maximum), physical units.
    pub hd: f64,
    /// Average surface distance, both directions together, physical units.
    pub asd: f64,
    /// True positive voxels.
    pub tp: u64,
    /// False positive voxels.
    pub fp: u64,
    /// False negative voxels (`fn` in JSON, beside `tp` and `fp`).
    #[serde(rename = "fn")]
    pub fn_: u64,
    /// Voxels of the class in the prediction.
    pub pred_voxels: u64,
    /// Voxels of the class in the reference.
    pub ref_voxels: u64,
    /// The prediction's volume of the class, cubic units.
    pub pred_volume: f64,
    /// The reference's volume of the class, cubic units.
    pub ref_volume: f64,
    /// "both", "prediction" or "reference" when a side has none of the class.
    pub empty: Option<&'static str>,
}

impl ClassMetrics {
    /// The metrics of `class` from its counts and surface distances; `voxel_volume` in cubic
    /// units.
    pub fn new(
        class: &LabelClass,
        counts: &ClassCounts,
        distances: SurfaceDistances,
        voxel_volume: f64,
    ) -> ClassMetrics {
        let (tp, fp, fn_) = (counts.tp, counts.fp, counts.fn_);
        let ratio = |n: u64, d: u64| {
            if d == 0 {
                f64::NAN
            } else {
                n as f64 / d as f64
            }
        };
        let (pred, reference) = (tp + fp, tp + fn_);
        ClassMetrics {
            class: class.name.clone(),
            values: class.values.clone(),
            dice: ratio(2 * tp, 2 * tp + fp + fn_),
            iou: ratio(tp, tp + fp + fn_),
            cldice: f64::NAN,
            hd95: distances.hd95,
            hd: distances.hd,
            asd: distances.asd,
            tp,
            fp,
            fn_,
            pred_voxels: pred,
            ref_voxels: reference,
            pred_volume: pred as f64 * voxel_volume,
            ref_volume: reference as f64 * voxel_volume,
            empty: match (pred == 0, reference == 0) {
                (true, true) => Some("both"),
                (true, false) => Some("prediction"),
                (false, true) => Some("reference"),
                _ => None,
            },
        }
    }
}

/// How one case ended.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CaseOutcome {
    /// Measured.
    Evaluated {
        /// The spatial unit of the distances ("mm", "um", "m", or "unknown").
        unit: &'static str,
        /// One entry per class.
        classes: Vec<ClassMetrics>,
    },
    /// Its files could not be read or do not fit together.
    Failed {
        /// Why, naming the file.
        error: String,
    },
}

/// One case's line.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    /// Case id (the file name without its extension).
    pub id: String,
    /// The prediction.
    pub prediction: PathBuf,
    /// The reference segmentation, when one was found.
    pub reference: Option<PathBuf>,
    /// The result.
    #[serde(flatten)]
    pub outcome: CaseOutcome,
}

/// The means of one class's metrics over the cases where each is defined.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassMean {
    /// The class's name.
    pub class: String,
    /// Its label values.
    pub values: Vec<u16>,
    /// Mean Dice.
    pub dice: f64,
    /// Mean IoU.
    pub iou: f64,
    /// Mean clDice.
    pub cldice: f64,
    /// Mean HD95.
    pub hd95: f64,
    /// Mean HD.
    pub hd: f64,
    /// Mean ASD.
    pub asd: f64,
    /// Cases whose Dice is defined (the class in either file).
    pub cases_dice: usize,
    /// Cases whose distances are defined (the class in both files).
    pub cases_distance: usize,
}

/// The whole evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct EvaluationReport {
    /// The spatial unit of every distance ("mixed" if the cases disagree).
    pub unit: String,
    /// Per case.
    pub cases: Vec<CaseReport>,
    /// Per class, the mean over cases.
    pub mean: Vec<ClassMean>,
    /// The mean over classes of the class means (nnU-Net's "foreground mean").
    pub foreground_mean: ClassMean,
    /// Cases measured.
    pub evaluated: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Reference cases with no prediction (not measured).
    pub without_prediction: Vec<String>,
    /// Seconds.
    pub wall_seconds: f64,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: Option<u64>,
}

/// Mean of the finite values, and how many there were.
fn finite_mean(values: impl Iterator<Item = f64>) -> (f64, usize) {
    let (sum, n) = values
        .filter(|v| v.is_finite())
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (if n == 0 { f64::NAN } else { sum / n as f64 }, n)
}

/// Per class (by label values, in value order) the means over the evaluated cases; then the
/// mean of those means.
pub fn means(cases: &[CaseReport]) -> (Vec<ClassMean>, ClassMean) {
    let mut by_class: BTreeMap<Vec<u16>, Vec<&ClassMetrics>> = BTreeMap::new();
    for c in cases {
        if let CaseOutcome::Evaluated { classes, .. } = &c.outcome {
            for m in classes {
                by_class.entry(m.values.clone()).or_default().push(m);
            }
        }
    }
    let means: Vec<ClassMean> = by_class
        .into_iter()
        .map(|(values, ms)| {
            let mean = |f: fn(&ClassMetrics) -> f64| finite_mean(ms.iter().map(|m| f(m)));
            let (dice, cases_dice) = mean(|m| m.dice);
            let (hd95, cases_distance) = mean(|m| m.hd95);
            ClassMean {
                class: ms[0].class.clone(),
                values,
                dice,
                iou: mean(|m| m.iou).0,
                cldice: mean(|m| m.cldice).0,
                hd95,
                hd: mean(|m| m.hd).0,
                asd: mean(|m| m.asd).0,
                cases_dice,
                cases_distance,
            }
        })
        .collect();
    let over = |f: fn(&ClassMean) -> f64| finite_mean(means.iter().map(f)).0;
    let foreground = ClassMean {
        class: "foreground mean".into(),
        values: Vec::new(),
        dice: over(|m| m.dice),
        iou: over(|m| m.iou),
        cldice: over(|m| m.cldice),
        hd95: over(|m| m.hd95),
        hd: over(|m| m.hd),
        asd: over(|m| m.asd),
        cases_dice: means.iter().map(|m| m.cases_dice).min().unwrap_or(0),
        cases_distance: means.iter().map(|m| m.cases_distance).min().unwrap_or(0),
    };
    (means, foreground)
}

fn number(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.is_infinite() {
        "inf".into()
    } else {
        format!("{v:.decimals$}")
    }
}

impl EvaluationReport {
    /// The table people read: a row per case and class, then the means.
    pub fn table(&self) -> String {
        // "HD95 mm"; no unit where the headers give none.
        let u = match self.unit.as_str() {
            "unknown" => String::new(),
            unit => format!(" {unit}"),
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<20} {:<16} {:>7} {:>7} {:>7} {:>10} {:>10} {:>12} {:>12}",
            "case",
            "class",
            "Dice",
            "IoU",
            "clDice",
            format!("HD95{u}"),
            format!("ASD{u}"),
            format!("pred vol{u}3"),
            format!("ref vol{u}3"),
        );
        for c in &self.cases {
            let CaseOutcome::Evaluated { classes, .. } = &c.outcome else {
                let _ = writeln!(out, "{:<20} failed (see the error above)", c.id);
                continue;
            };
            for m in classes {
                let _ = writeln!(
                    out,
                    "{:<20} {:<16} {:>7} {:>7} {:>7} {:>10} {:>10} {:>12} {:>12}",
                    c.id,
                    m.class,
                    number(m.dice, 4),
                    number(m.iou, 4),
                    number(m.cldice, 4),
                    number(m.hd95, 3),
                    number(m.asd, 3),
                    number(m.pred_volume, 1),
                    number(m.ref_volume, 1),
                );
            }
        }
        let rows = self.mean.iter().chain(
            // The overall mean only adds something when there are several classes.
            (self.mean.len() > 1).then_some(&self.foreground_mean),
        );
        for m in rows {
            let _ = writeln!(
                out,
                "{:<20} {:<16} {:>7} {:>7} {:>7} {:>10} {:>10}",
                format!("mean of {}", m.cases_dice),
                m.class,
                number(m.dice, 4),
                number(m.iou, 4),
                number(m.cldice, 4),
                number(m.hd95, 3),
                number(m.asd, 3),
            );
        }
        out
    }
}
