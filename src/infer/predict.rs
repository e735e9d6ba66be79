//! `predict`: segment new volumes with a trained model, out of core, and write each result in
//! its input's own geometry.
//!
//! The stages, each the same code as elsewhere: the inputs are preprocessed by the build
//! ([`crate::prep::cache_build::build_cache`] with the model's recorded parameters) into a scratch cache
//! removed at the end; the sliding window ([`super::sliding`]) makes each volume's class
//! probabilities final a slab at a time into scratch files ([`super::probs`]); the export
//! ([`super::export`]) resamples them back to the input's grid, takes the argmax and streams the
//! label NIfTI. Each output is written under a temporary name and renamed; beside it, a small
//! record of its key (input bytes, weights, parameters) lets a re-run skip it (one group of
//! inputs at a time: [`super::group`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::group::{predict_group, Job, Totals};
use super::model_dir::{load_models, LoadedModel, Which};
use super::postprocess::{self, PostprocessingChoice};
use crate::error::{Error, Result};
use crate::format::crossval::Postprocessing;
use crate::format::training::network::Precision;
use crate::format::OutputParams;
use crate::nifti_io;
use crate::prep::cache_build::previous;
use crate::prep::dataset::{self, CaseSource};

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct PredictOptions {
    /// Run folders made by `train` (or checkpoint folders copied from them): one model, or
    /// the members of an ensemble whose class probabilities are averaged (nnU-Net's five folds).
    pub models: Vec<PathBuf>,
    /// Which postprocessing the segmentations get.
    pub postprocessing: PostprocessingChoice,
    /// Which checkpoint.
    pub which: Which,
    /// NIfTI files, or folders of them (an nnU-Net `imagesTs/`, `CASE_0000` naming).
    pub inputs: Vec<PathBuf>,
    /// Cases already found (fold validation: the held-out cases' own files), predicted beside
    /// `inputs` under their own ids.
    pub cases: Vec<CaseSource>,
    /// Where the segmentations go (`CASE.nii.gz`).
    pub out: PathBuf,
    /// `cpu`, `cuda`, `cuda:N`.
    pub device: String,
    /// Overlap of neighbouring windows, 0..1.
    pub overlap: f64,
    /// Test-time mirroring over the axes the model was trained to flip.
    pub mirror: bool,
    /// Windows per forward pass.
    pub batch: usize,
    /// The convolutions' arithmetic for every model (`None`: each model's own, as trained).
    pub precision: Option<Precision>,
    /// Worker threads of the preprocessing.
    pub jobs: usize,
    /// Also write each case's class probabilities on its input grid (`CASE.probabilities.zarr`).
    pub save_probabilities: bool,
    /// About how many bytes the sliding window's slab may hold (the plane is cut into bands
    /// along y beyond it).
    pub window_memory: usize,
    /// Strict memory mode: MiB of scratch-cache pages the reader's maps may bring in before
    /// they are handed back (`ReaderOptions::mapped_resident_bytes`); `None`: the kernel's.
    pub mapped_mib: Option<u64>,
    /// Print only errors.
    pub quiet: bool,
    /// A cascade's second stage: the folder of the first stage's segmentations of the inputs
    /// (`CASE.nii.gz`), its last channels.
    pub previous_stage: Option<PathBuf>,
    /// A cascade's first stage (its folds): predicted first, without postprocessing (as
    /// nnU-Net's cascade takes it), into `previous_stage` or else `out/previous_stage/`.
    pub previous_models: Vec<PathBuf>,
}

/// How one case ended.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum PredictOutcome {
    /// Its segmentation was written.
    Predicted {
        /// The file.
        output: PathBuf,
        /// Seconds it took (preprocessing excluded).
        seconds: f64,
    },
    /// Its segmentation was already there for the same input, weights and parameters.
    Existing {
        /// The file.
        output: PathBuf,
    },
    /// It could not be read, preprocessed, predicted or written.
    Failed {
        /// Why, naming the file.
        error: String,
    },
}

/// One case's line.
#[derive(Clone, Debug, Serialize)]
pub struct PredictCase {
    /// Case id.
    pub id: String,
    /// How it ended.
    pub outcome: PredictOutcome,
}

/// What a predict run did.
#[derive(Clone, Debug, Serialize)]
pub struct PredictReport {
    /// The checkpoints used (one per ensemble member).
    pub checkpoints: Vec<PathBuf>,
    /// The postprocessing applied, if any.
    pub postprocessing: Option<Postprocessing>,
    /// An nnU-Net model's postprocessing applied, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nnunet_postprocessing: Option<crate::format::nnunet::NnunetPostprocessing>,
    /// Per case, sorted by id.
    pub cases: Vec<PredictCase>,
    /// Cases written, skipped as existing, failed.
    pub predicted: usize,
    /// Cases whose output was already there.
    pub existing: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Voxels of the model's grid predicted.
    pub voxels: u64,
    /// Sliding windows run (each `--mirror` flip counts as one; windows on band borders run
    /// twice and count twice).
    pub windows: u64,
    /// Seconds spent in the sliding window (reading windows, forward passes, accumulating).
    pub window_seconds: f64,
    /// Wall time.
    pub wall_seconds: f64,
    /// Peak resident memory of the process (VmHWM).
    pub peak_rss_bytes: Option<u64>,
    /// Peak anonymous memory (RssAnon, sampled): what the OOM killer weighs.
    pub peak_anon_bytes: Option<u64>,
    /// Peak file-backed resident memory (RssFile, sampled): mapped pages, reclaimable.
    pub peak_file_bytes: Option<u64>,
}

/// A failed case's line.
pub(crate) fn failed(id: &str, e: &Error) -> PredictCase {
    PredictCase {
        id: id.to_string(),
        outcome: PredictOutcome::Failed {
            error: e.to_string(),
        },
    }
}

/// The cases of `inputs` (files, or folders of them) of `channels` channels; what cannot be a
/// case (a missing path, a lone channel) goes to `results` as a failure, named.
pub(crate) fn input_cases(
    inputs: &[PathBuf],
    channels: usize,
    results: &mut Vec<PredictCase>,
) -> Result<Vec<CaseSource>> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let (found, problems) = dataset::image_files(input)?;
            files.extend(found);
            results.extend(problems.iter().map(|p| failed(&p.id, &p.error)));
        } else if input.is_file() {
            files.push(input.clone());
        } else {
            let e = Error::io(input, std::io::Error::from(std::io::ErrorKind::NotFound));
            results.push(failed(&input.display().to_string(), &e));
        }
    }
    let found = dataset::cases_from_files(files, channels);
    results.extend(found.problems.iter().map(|p| failed(&p.id, &p.error)));
    Ok(found.cases)
}

/// Name start of a predict's scratch folder in `--out` (then `HOST.PID`).
const SCRATCH_PREFIX: &str = ".voxcache-predict.";
/// Between an output's name and `HOST.PID` while it is written.
pub(super) const TMP_INFIX: &str = ".tmp.";

/// Remove from `out` the scratch folders and half-written outputs of predicts on this host whose
/// process is gone (a kill or a crash); returns what was removed. Others' are left alone: the
/// folder may be shared between machines.
fn sweep_stale(out: &Path) -> Vec<PathBuf> {
    let me = crate::util::sysinfo::hostname();
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(out) else {
        return removed;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let owner = name
            .strip_prefix(SCRATCH_PREFIX)
            .or_else(|| name.split_once(TMP_INFIX).map(|(_, rest)| rest));
        let Some((host, pid)) = owner.and_then(|o| o.rsplit_once('.')) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if host == me && pid != std::process::id() && !crate::util::sysinfo::pid_alive(pid) {
            let p = e.path();
            let gone = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            if gone.is_ok() {
                removed.push(p);
            }
        }
    }
    removed
}

/// Run predict.
pub fn predict(opts: &PredictOptions) -> Result<PredictReport> {
    if !opts.previous_models.is_empty() {
        return super::cascade::predict_chain(opts);
    }
    let started = Instant::now();
    let peak = crate::util::sysinfo::PeakMemory::start();
    let device = crate::model::device::select(&opts.device)?;
    let mut models = load_models(&opts.models, &opts.which, &device)?;
    if let Some(p) = opts.precision {
        for m in &mut models {
            m.set_precision(p);
        }
    }
    let m = &models[0];
    let postprocessing = postprocess::chosen(&opts.postprocessing, &opts.models, &models)?;
    let channels = m.record.channels.len().max(1);
    std::fs::create_dir_all(&opts.out).map_err(|e| Error::io(&opts.out, e))?;
    let probe = opts
        .out
        .join(format!(".voxcache-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| Error::io(&opts.out, e))?;
    let _ = std::fs::remove_file(&probe);

    let mut results: Vec<PredictCase> = Vec::new();
    let fail = failed;
    // A cascade's second stage takes the first stage's segmentations as its last channels.
    let indicators = previous::indicator_values(&m.preprocessing.params);
    let found = input_cases(&opts.inputs, channels - indicators.len(), &mut results)?;
    let (mut found, problems) = previous::for_model(
        &opts.models[0],
        &indicators,
        opts.previous_stage.as_deref(),
        found,
    )?;
    results.extend(problems.iter().map(|p| fail(&p.id, &p.error)));
    found.extend(opts.cases.iter().cloned());
    // Nothing to predict is an error, not a success with 0 cases.
    if found.is_empty() && results.is_empty() {
        let named: Vec<String> = opts
            .inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        return Err(Error::Dataset(format!(
            "no NIfTI image (.nii, .nii.gz) in {}: nothing to predict",
            named.join(", ")
        )));
    }
    // Group by spatial unit: an input in other units than the model's gets the target spacing
    // converted to its units (and a warning naming both).
    let mut groups: std::collections::BTreeMap<String, Vec<CaseSource>> = Default::default();
    for c in found {
        if c.images.len() != channels {
            let e = Error::case(
                &c.id,
                format!(
                    "{} image channel{} but the model takes {channels} ({})",
                    c.images.len(),
                    if c.images.len() == 1 { "" } else { "s" },
                    m.record.channels.join(", ")
                ),
            );
            results.push(fail(&c.id, &e));
            continue;
        }
        let (path, frame) = c.channel(0);
        match nifti_io::read_frame_header(path, frame) {
            Ok(h) => groups.entry(h.unit.to_string()).or_default().push(c),
            Err(e) => results.push(fail(&c.id, &e)),
        }
    }
    for p in sweep_stale(&opts.out) {
        if !opts.quiet {
            eprintln!("removed what an interrupted predict left: {}", p.display());
        }
    }
    let scratch = opts.out.join(format!(
        "{SCRATCH_PREFIX}{}.{}",
        crate::util::sysinfo::hostname(),
        std::process::id()
    ));
    let job = Job {
        opts,
        models: &models,
        postprocessing: postprocessing.as_ref(),
        device: &device,
    };
    let run = (|| -> Result<Totals> {
        let mut totals = Totals::default();
        for (unit, cases) in groups {
            let params = params_for_unit(m, &unit, opts.quiet);
            predict_group(&job, params, cases, &scratch, &mut results, &mut totals)?;
        }
        Ok(totals)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    let totals = run?;
    results.sort_by(|a, b| a.id.cmp(&b.id));
    let count = |f: fn(&PredictOutcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    Ok(PredictReport {
        checkpoints: models.iter().map(|m| m.checkpoint.clone()).collect(),
        postprocessing,
        nnunet_postprocessing: None,
        predicted: count(|o| matches!(o, PredictOutcome::Predicted { .. })),
        existing: count(|o| matches!(o, PredictOutcome::Existing { .. })),
        failed: count(|o| matches!(o, PredictOutcome::Failed { .. })),
        cases: results,
        voxels: totals.voxels,
        windows: totals.windows,
        window_seconds: totals.window_seconds,
        wall_seconds: started.elapsed().as_secs_f64(),
        peak_rss_bytes: crate::util::sysinfo::peak_rss_bytes(),
        peak_anon_bytes: peak.peak().map(|m| m.anon),
        peak_file_bytes: peak.peak().map(|m| m.file),
    })
}

/// The model's parameters for inputs in `unit`: its target spacing converted when the units
/// differ and both are known (with a warning naming both); as recorded otherwise.
fn params_for_unit(m: &LoadedModel, unit: &str, quiet: bool) -> OutputParams {
    let mut p = m.preprocessing.params.clone();
    // The scratch cache is read once, window by window: uncompressed chunks whatever the
    // training cache's layout (the image's element type stays: it is what the model saw).
    p.compression = crate::format::Compression::None;
    p.shard_zyx = None;
    p.chunk_zyx = [32, 128, 128];
    let model = m.preprocessing.unit.as_str();
    if unit != model {
        if let (Some(a), Some(b)) = (
            crate::nifti_io::unit_in_mm(model),
            crate::nifti_io::unit_in_mm(unit),
        ) {
            let f = a / b;
            p.target_spacing_xyz = p.target_spacing_xyz.map(|s| s * f);
            if !quiet {
                eprintln!(
                    "warning: inputs in {unit} for a model trained in {model}: its spacing {:?} {model} is {:?} {unit}",
                    m.preprocessing.params.target_spacing_xyz, p.target_spacing_xyz
                );
            }
        } else if !quiet {
            eprintln!(
                "warning: inputs in {unit} for a model trained in {model}: one unit is unknown, so the numbers are taken as they are"
            );
        }
    }
    p
}
