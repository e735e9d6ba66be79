//! The dataset report: per-case header facts and voxel statistics, the spacing distribution,
//! the target spacing `auto` chooses and why, and each case's output size at the target.
//! Its voxel statistics are read by `dataset_voxels`; its text form is drawn by `dataset_render`
//! (re-exported here).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;

use super::dataset_voxels::{read_voxels, VoxelFacts};
use super::{file_message, rel_message, rel_path, InspectOptions, Problem};
use crate::error::{Error, Result};
use crate::format::dataset_json::DatasetDescription;
use crate::format::labels::FileLabels;
use crate::format::ImageDtype;
use crate::nifti_io::{self, HeaderInfo};
use crate::prep::dataset::scan::{scan, ScannedCase};
use crate::prep::dataset::{discover, CaseSource, DatasetSource};
use crate::prep::plan::{decide_spacing, plan_scanned, CasePlan};
use crate::prep::plan::{percentile, SpacingDecision, OUTLIER_FACTOR};
use crate::prep::settings::SpacingChoice;

// The text rendering lives in `dataset_render`; its entry points keep their paths here.
pub use super::dataset_render::{
    render, render_decision, render_forecast, render_plan, ForecastRow,
};

/// What a case's image header says.
#[derive(Clone, Debug, Serialize)]
pub struct HeaderFacts {
    /// Voxels along (x, y, z).
    pub shape_xyz: [usize; 3],
    /// Spacing (x, y, z) in the file's units.
    pub spacing_xyz: [f64; 3],
    /// Spatial unit.
    pub unit: &'static str,
    /// Stored datatype name.
    pub datatype: &'static str,
    /// Axis codes of the affine, e.g. "RAS".
    pub orientation: String,
    /// qform_code as stored.
    pub qform_code: i16,
    /// sform_code as stored.
    pub sform_code: i16,
    /// Which transform the affine came from: "sform", "qform" or "pixdim".
    pub affine_source: &'static str,
}

impl HeaderFacts {
    fn of(h: &HeaderInfo) -> Self {
        HeaderFacts {
            shape_xyz: h.shape_xyz,
            spacing_xyz: h.spacing_xyz,
            unit: h.unit,
            datatype: h.datatype,
            orientation: h.affine.axis_codes(),
            qform_code: h.qform_code,
            sform_code: h.sform_code,
            affine_source: h.affine_source,
        }
    }
}

/// Intensity statistics over the finite voxels of an image.
#[derive(Clone, Debug, Serialize)]
pub struct IntensityFacts {
    /// Smallest finite voxel value.
    pub min: Option<f64>,
    /// Largest finite voxel value.
    pub max: Option<f64>,
    /// Mean of the finite voxels.
    pub mean: Option<f64>,
    /// NaN or infinite voxels.
    pub non_finite: u64,
}

/// An image channel after the first: its file and intensities.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelFacts {
    /// The channel's file.
    pub image: String,
    /// Its intensities, when voxels were read.
    pub intensity: Option<IntensityFacts>,
}

/// Everything found about one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseInfo {
    /// Case id, from the file names.
    pub id: String,
    /// The first channel's file (the only one of a one-channel image).
    pub image: String,
    /// Channels 1.. (`CASE_0001`...), each with its own intensities.
    pub other_channels: Vec<ChannelFacts>,
    /// The label file, if the case has one.
    pub label: Option<String>,
    /// The image header's facts (absent when it could not be read).
    pub header: Option<HeaderFacts>,
    /// The label's stored datatype.
    pub label_datatype: Option<&'static str>,
    /// Intensities of the first channel, when voxels were read.
    pub intensity: Option<IntensityFacts>,
    /// Voxels per label value, when voxels were read.
    pub label_values: Option<BTreeMap<String, u64>>,
    /// The case's output grid and cost at the target spacing: the planner's own plan.
    pub forecast: Option<CasePlan>,
}

/// How many cases share one spacing.
#[derive(Clone, Debug, Serialize)]
pub struct SpacingCount {
    /// Spacing (x, y, z).
    pub spacing_xyz: [f64; 3],
    /// Cases with exactly this spacing.
    pub count: usize,
}

/// Percentiles of one axis's spacing over the cases.
#[derive(Clone, Debug, Serialize)]
pub struct AxisStats {
    /// Smallest.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Largest.
    pub max: f64,
}

/// Spacing percentiles per axis.
#[derive(Clone, Debug, Serialize)]
pub struct PerAxis {
    /// Spacing along x.
    pub x: AxisStats,
    /// Spacing along y.
    pub y: AxisStats,
    /// Spacing along z.
    pub z: AxisStats,
}

/// The dataset's spacings and the target chosen from them.
#[derive(Clone, Debug, Serialize)]
pub struct SpacingReport {
    /// Distinct spacings, most common first (ties: smallest spacing first).
    pub distinct: Vec<SpacingCount>,
    /// Percentiles of the spacing along each axis.
    pub per_axis: PerAxis,
    /// The spatial units the headers use.
    pub units: Vec<&'static str>,
    /// What `--spacing auto` chooses.
    pub auto: Option<SpacingDecision>,
    /// What the forecast uses (`auto`, or the explicit spacing asked for).
    pub target: SpacingDecision,
}

/// Sums of the forecast over the cases.
#[derive(Clone, Debug, Serialize)]
pub struct ForecastTotals {
    /// Target spacing (x, y, z).
    pub target_xyz: [f64; 3],
    /// Element type of the cached image.
    pub image_dtype: ImageDtype,
    /// Cases planned.
    pub cases: usize,
    /// Bytes of the cached images and labels.
    pub out_bytes: u64,
    /// Sum over the cases of what a whole-volume resampler holds for each image, in float32.
    pub whole_volume_f32_bytes: u64,
    /// The same in float64.
    pub whole_volume_f64_bytes: u64,
    /// Cases whose output is an outlier.
    pub outliers: Vec<String>,
    /// Output size over the median from which a case is an outlier.
    pub outlier_factor: f64,
}

/// The dataset fingerprint and forecast of `prep inspect DATA`.
#[derive(Clone, Debug, Serialize)]
pub struct DatasetReport {
    /// Pipeline of the forecast's settings.
    pub pipeline: String,
    /// Element type of the cached image.
    pub image_dtype: ImageDtype,
    /// Whether voxels were read (else headers alone).
    pub voxels_read: bool,
    /// Cases found.
    pub n_cases: usize,
    /// Cases with a label.
    pub n_labelled: usize,
    /// Each case's facts.
    pub cases: Vec<CaseInfo>,
    /// The spacings found and the target chosen.
    pub spacing: Option<SpacingReport>,
    /// The forecast's totals.
    pub forecast: Option<ForecastTotals>,
    /// The folder's dataset.json (nnU-Net v2 or MSD), when it has one.
    pub dataset_json: Option<DatasetDescription>,
}

fn axis_stats(v: &[f64]) -> AxisStats {
    AxisStats {
        min: v.iter().cloned().fold(f64::INFINITY, f64::min),
        p10: percentile(v, 10.0),
        p50: percentile(v, 50.0),
        p90: percentile(v, 90.0),
        max: v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    }
}

fn spacing_report(
    ok: &[&ScannedCase],
    choice: SpacingChoice,
    problems: &mut Vec<Problem>,
) -> Result<Option<SpacingReport>> {
    if ok.is_empty() {
        return Ok(None);
    }
    let spacings: Vec<[f64; 3]> = ok.iter().map(|s| s.image.spacing_xyz).collect();
    let mut counts: BTreeMap<[u64; 3], usize> = BTreeMap::new();
    for s in &spacings {
        *counts.entry(s.map(f64::to_bits)).or_default() += 1;
    }
    let mut distinct: Vec<SpacingCount> = counts
        .into_iter()
        .map(|(k, count)| SpacingCount {
            spacing_xyz: k.map(f64::from_bits),
            count,
        })
        .collect();
    distinct.sort_by(|a, b| {
        b.count.cmp(&a.count).then_with(|| {
            (0..3)
                .map(|i| a.spacing_xyz[i].total_cmp(&b.spacing_xyz[i]))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
    });
    let axis = |a: usize| axis_stats(&spacings.iter().map(|s| s[a]).collect::<Vec<_>>());
    let mut units: Vec<&'static str> = ok.iter().map(|s| s.image.unit).collect();
    units.sort_unstable();
    units.dedup();
    if units.len() > 1 {
        problems.push(Problem::warning(
            "mixed-units",
            format!(
                "the images' spatial units differ ({}): spacings are compared as plain numbers",
                units.join(", ")
            ),
        ));
    }
    let auto = decide_spacing(SpacingChoice::Auto, ok).ok();
    let target = match (choice, &auto) {
        (SpacingChoice::Auto, Some(a)) => a.clone(),
        _ => decide_spacing(choice, ok)?,
    };
    Ok(Some(SpacingReport {
        distinct,
        per_axis: PerAxis {
            x: axis(0),
            y: axis(1),
            z: axis(2),
        },
        units,
        auto,
        target,
    }))
}

/// A case's header reads: the image's, and the label's when it has one.
type CaseHeaders = (Result<HeaderInfo>, Option<Result<HeaderInfo>>);

/// Read headers (and voxels unless told not to), then plan every readable case.
pub fn build(opts: &InspectOptions) -> Result<(DatasetReport, Vec<Problem>)> {
    let root = opts.path.as_path();
    let settings = &opts.settings;
    let found = discover(&DatasetSource::Folder(root.to_path_buf()))?;
    let cases = found.cases;
    let description = found.description;
    let label_values = description.as_ref().map(|d| FileLabels::of(d).values());
    let mut problems: Vec<Problem> = found
        .problems
        .into_iter()
        .map(|p| {
            let msg = super::rel_message(root, &p.error.to_string());
            Problem::error("unreadable", msg).case(p.id)
        })
        .collect();

    // Header facts per file; scan() adds the image/label pair checks.
    let headers: Vec<CaseHeaders> = cases
        .par_iter()
        .map(|c| {
            (
                nifti_io::read_frame_header(c.image(), c.channel(0).1),
                c.label.as_ref().map(|l| nifti_io::read_header(l)),
            )
        })
        .collect();
    let scanned = scan(&cases);
    let voxels = voxel_facts(opts, &cases, &headers, label_values.as_ref())?;

    let mut infos = Vec::new();
    for ((c, (ih, lh)), mut vf) in cases.iter().zip(headers).zip(voxels) {
        header_problems(root, c, &ih, &lh, &mut problems);
        problems.append(&mut vf.problems);
        infos.push(case_info(root, c, &ih, &lh, vf));
    }
    let ok = plannable(root, &scanned, &mut problems);

    let spacing = spacing_report(&ok, settings.spacing, &mut problems)?;
    let forecast = spacing
        .as_ref()
        .map(|sp| forecast_cases(&ok, sp.target.target_xyz, opts, &mut infos, &mut problems));

    let report = DatasetReport {
        pipeline: settings.pipeline.clone(),
        image_dtype: settings.image_dtype,
        voxels_read: opts.read_voxels,
        n_cases: infos.len(),
        n_labelled: infos.iter().filter(|i| i.label.is_some()).count(),
        cases: infos,
        spacing,
        forecast,
        dataset_json: description,
    };
    Ok((report, problems))
}

/// Each case's voxel facts, read `opts.jobs` cases at a time (empty with `--headers-only`).
fn voxel_facts(
    opts: &InspectOptions,
    cases: &[CaseSource],
    headers: &[CaseHeaders],
    label_values: Option<&BTreeSet<u16>>,
) -> Result<Vec<VoxelFacts>> {
    let root = opts.path.as_path();
    let jobs = if opts.jobs == 0 { 2 } else { opts.jobs };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Error::Config(format!("cannot start {jobs} worker threads: {e}")))?;
    Ok(if opts.read_voxels {
        pool.install(|| {
            cases
                .par_iter()
                .zip(headers.par_iter())
                .with_max_len(1)
                .map(|(c, (ih, lh))| {
                    let label_ok = lh.as_ref().is_some_and(|r| r.is_ok());
                    read_voxels(root, c, ih.is_ok(), label_ok, label_values)
                })
                .collect()
        })
    } else {
        cases.iter().map(|_| VoxelFacts::default()).collect()
    })
}

/// What a case's headers show: unreadable files, a missing label, a passed-over sform.
fn header_problems(
    root: &Path,
    c: &CaseSource,
    ih: &Result<HeaderInfo>,
    lh: &Option<Result<HeaderInfo>>,
    problems: &mut Vec<Problem>,
) {
    if let Err(e) = ih {
        problems.push(
            Problem::error("unreadable", file_message(root, c.image(), &e.to_string()))
                .case(&c.id)
                .path(rel_path(root, c.image())),
        );
    }
    match (lh, &c.label) {
        (Some(Err(e)), Some(l)) => problems.push(
            Problem::error("unreadable", file_message(root, l, &e.to_string()))
                .case(&c.id)
                .path(rel_path(root, l)),
        ),
        (None, _) => problems.push(
            Problem::warning("missing-label", "no label file for this image")
                .case(&c.id)
                .path(rel_path(root, c.image())),
        ),
        _ => {}
    }
    let found = [ih.as_ref().ok(), lh.as_ref().and_then(|r| r.as_ref().ok())];
    for h in found.into_iter().flatten() {
        if let Some(w) = &h.affine_warning {
            problems.push(
                Problem::warning("geometry", w.clone())
                    .case(&c.id)
                    .path(rel_path(root, &h.path)),
            );
        }
    }
}

/// A case's facts from its files, headers and voxels; its forecast comes after planning.
fn case_info(
    root: &Path,
    c: &CaseSource,
    ih: &Result<HeaderInfo>,
    lh: &Option<Result<HeaderInfo>>,
    vf: VoxelFacts,
) -> CaseInfo {
    CaseInfo {
        id: c.id.clone(),
        image: rel_path(root, c.image()),
        other_channels: c.images[1..]
            .iter()
            .enumerate()
            .map(|(k, p)| ChannelFacts {
                image: rel_path(root, p),
                intensity: vf.other_intensity.get(k).cloned().flatten(),
            })
            .collect(),
        label: c.label.as_ref().map(|l| rel_path(root, l)),
        header: ih.as_ref().ok().map(HeaderFacts::of),
        label_datatype: lh
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .map(|h| h.datatype),
        intensity: vf.intensity,
        label_values: vf.label_values,
        forecast: None,
    }
}

/// The cases that can be planned; image and label on different grids are a problem, and so is
/// having none.
fn plannable<'a>(
    root: &Path,
    scanned: &'a [(CaseSource, Result<ScannedCase>)],
    problems: &mut Vec<Problem>,
) -> Vec<&'a ScannedCase> {
    let mut ok: Vec<&ScannedCase> = Vec::new();
    for (c, r) in scanned {
        match r {
            Ok(s) => ok.push(s),
            Err(e @ Error::Case { .. }) => problems.push(
                Problem::error("mismatch", rel_message(root, &e.to_string()))
                    .case(&c.id)
                    .path(rel_path(root, c.label.as_deref().unwrap_or(c.image()))),
            ),
            // Unreadable files are already reported by `header_problems`, each by its own name.
            Err(_) => {}
        }
    }
    if ok.is_empty() {
        problems.push(Problem::error(
            "no-cases",
            "no case has a readable image (and matching label): nothing to plan",
        ));
    }
    ok
}

/// Plan every case at the target: each case's forecast into its facts, the sums, and the
/// cases over the size limits.
fn forecast_cases(
    ok: &[&ScannedCase],
    target_xyz: [f64; 3],
    opts: &InspectOptions,
    infos: &mut [CaseInfo],
    problems: &mut Vec<Problem>,
) -> ForecastTotals {
    let settings = &opts.settings;
    let plans = plan_scanned(ok, target_xyz, settings.image_dtype);
    let mut totals = ForecastTotals {
        target_xyz,
        image_dtype: settings.image_dtype,
        cases: plans.len(),
        out_bytes: 0,
        whole_volume_f32_bytes: 0,
        whole_volume_f64_bytes: 0,
        outliers: Vec::new(),
        outlier_factor: OUTLIER_FACTOR,
    };
    for p in plans {
        // Saturating: one absurd header must not wrap the totals around.
        totals.out_bytes = totals.out_bytes.saturating_add(p.out_bytes);
        totals.whole_volume_f32_bytes = totals
            .whole_volume_f32_bytes
            .saturating_add(p.whole_volume_f32_bytes);
        totals.whole_volume_f64_bytes = totals
            .whole_volume_f64_bytes
            .saturating_add(p.whole_volume_f64_bytes);
        if let Some(why) = p.size_problem(settings.max_case_gib) {
            // The image's header holds the spacing and the dimensions to fix: name it.
            let image = infos.iter().find(|i| i.id == p.id).map(|i| i.image.clone());
            let problem = Problem::error("too-large", why).case(&p.id);
            problems.push(match image {
                Some(f) => problem.path(f),
                None => problem,
            });
        }
        if p.outlier {
            totals.outliers.push(p.id.clone());
        }
        if let Some(info) = infos.iter_mut().find(|i| i.id == p.id) {
            info.forecast = Some(p.clone());
        }
    }
    totals
}
