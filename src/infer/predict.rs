//! `predict`: segment new volumes with a trained model, out of core, and write each result in
//! its input's own geometry.
//!
//! The stages, each the same code as elsewhere: the inputs are preprocessed by the build
//! ([`crate::prep::cache_build::build_cache`] with the model's recorded parameters) into a scratch cache
//! removed at the end; the sliding window ([`super::sliding`]) makes each volume's class
//! probabilities final a slab at a time into scratch files ([`super::probs`]); the export
//! ([`super::export`]) resamples them back to the input's grid, takes the argmax and streams the
//! label NIfTI. Each output is written under a temporary name and renamed; beside it, a small
//! record of its key (input bytes, weights, parameters) lets a re-run skip it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::export::{slab_rows, write_segmentation, Export};
use super::model_dir::{load_models, LoadedModel, Which};
use super::postprocess::{self, PostprocessingChoice};
use super::prob_zarr::ProbabilityZarr;
use super::probs::ProbWriter;
use super::sliding::{Flavour, Predictor};
use crate::cache::reader::CacheReader;
use crate::error::{Error, Result};
use crate::format::crossval::Postprocessing;
use crate::format::probabilities::PROBABILITIES_SUFFIX;
use crate::format::OutputParams;
use crate::nifti_io;
use crate::prep::cache_build::{build_cache, previous, BuildOptions, CaseOutcome};
use crate::prep::dataset::{self, CaseSource, DatasetSource};

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

/// The record kept beside an output: what it was made from.
#[derive(Serialize, Deserialize, PartialEq)]
struct OutputRecord {
    key: String,
    checkpoint: String,
    /// blake3 of the segmentation written: a file damaged since is predicted again.
    #[serde(default)]
    output_blake3: String,
}

/// blake3 of a file, hex; `None` when it cannot be read.
fn file_hash(path: &Path) -> Option<String> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path).ok()?).ok()?;
    Some(h.finalize().to_hex().to_string())
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
const TMP_INFIX: &str = ".tmp.";

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
    let models = load_models(&opts.models, &opts.which, &device)?;
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
    let run = (|| -> Result<Totals> {
        let mut totals = Totals::default();
        for (unit, cases) in groups {
            let params = params_for_unit(m, &unit, opts.quiet);
            predict_group(
                opts,
                &models,
                postprocessing.as_ref(),
                &device,
                params,
                cases,
                &scratch,
                &mut results,
                &mut totals,
            )?;
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

/// What the predicted cases add up to.
#[derive(Default)]
struct Totals {
    voxels: u64,
    windows: u64,
    window_seconds: f64,
}

/// Preprocess and predict the cases of one unit.
#[allow(clippy::too_many_arguments)] // the job's parts, passed down once
fn predict_group(
    opts: &PredictOptions,
    models: &[LoadedModel],
    postprocessing: Option<&Postprocessing>,
    device: &candle_core::Device,
    params: OutputParams,
    cases: Vec<CaseSource>,
    scratch: &Path,
    results: &mut Vec<PredictCase>,
    totals: &mut Totals,
) -> Result<()> {
    let settings = crate::prep::settings::Settings {
        input_ram_mib: 256,
        ..Default::default()
    };
    let cache = scratch.join("cache");
    let report = build_cache(&BuildOptions {
        source: DatasetSource::Cases(cases.clone()),
        cache_dir: cache.clone(),
        remote: Default::default(),
        name: Some("predict".into()),
        settings,
        jobs: opts.jobs.max(1),
        dry_run: false,
        part: None,
        progress: !opts.quiet,
        quiet: true,
        fixed_params: Some(params),
        previous_stage: None,
    })?;
    // No case preprocessed: each failure is the case's own (the scratch cache has no
    // manifest to open, and that is not the user's problem).
    if report
        .cases
        .iter()
        .all(|r| matches!(r.outcome, CaseOutcome::Failed { .. }))
    {
        for r in report.cases {
            if let CaseOutcome::Failed { error } = r.outcome {
                results.push(PredictCase {
                    id: r.id,
                    outcome: PredictOutcome::Failed { error },
                });
            }
        }
        return Ok(());
    }
    let reader = CacheReader::open_with(
        &cache,
        crate::cache::reader::ReaderOptions {
            mapped_resident_bytes: opts.mapped_mib.map(|m| m.saturating_mul(1 << 20)),
            ..Default::default()
        },
    )?;
    let m = &models[0];
    let outputs = m.record.labels();
    let first = m
        .model
        .as_ref()
        .ok_or_else(|| Error::Config("the first model has no weights loaded".into()))?;
    // One bar over every window of the group's cases, within the crops kept for predicting.
    let mut crops = std::collections::HashMap::new();
    let windows: usize = report
        .cases
        .iter()
        .filter(|r| !matches!(r.outcome, CaseOutcome::Failed { .. }))
        .filter_map(|r| Some((r, reader.open_entry("predict", &r.id).ok()?)))
        .map(|(r, e)| {
            let (crop, shape) = (super::crop::Crop::of(&e, &outputs).ok(), e.shape_zyx());
            let extent = crop.as_ref().map_or(shape, |c| c.extent(shape));
            crops.extend(crop.map(|c| (r.id.clone(), c)));
            models
                .iter()
                .map(|member| {
                    predictor(opts, device, member, first, None)
                        .window_count(extent, opts.window_memory)
                })
                .sum::<usize>()
        })
        .sum();
    let bar = window_bar(!opts.quiet, windows as u64);
    // Windows run, as the sliding window reports them (band borders run twice).
    let ran = std::sync::atomic::AtomicU64::new(0);
    let tick = |n: usize| {
        bar.inc(n as u64);
        ran.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    };
    let mirrored = !predictor(opts, device, m, first, None)
        .mirror_axes
        .is_empty();
    for r in report.cases {
        let Some(c) = cases.iter().find(|c| c.id == r.id) else {
            continue;
        };
        if let CaseOutcome::Failed { error } = &r.outcome {
            results.push(PredictCase {
                id: r.id.clone(),
                outcome: PredictOutcome::Failed {
                    error: error.clone(),
                },
            });
            continue;
        }
        let output = opts.out.join(format!("{}.nii.gz", c.id));
        let record = OutputRecord {
            key: format!(
                "{}-{}-{}-{}-{}",
                r.key.clone().unwrap_or_default(),
                models
                    .iter()
                    .map(|m| m.weights_hash.as_str())
                    .collect::<Vec<_>>()
                    .join("+"),
                opts.overlap,
                mirrored,
                postprocessing.map_or("none".into(), Postprocessing::key)
            ),
            checkpoint: models
                .iter()
                .map(|m| m.checkpoint.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            output_blake3: String::new(),
        };
        let record_path = opts.out.join(format!(".{}.voxcache.json", c.id));
        let same = std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<OutputRecord>(&b).ok())
            .is_some_and(|old| {
                old.key == record.key && file_hash(&output).is_some_and(|h| h == old.output_blake3)
            });
        let prob_path = opts.out.join(format!("{}{PROBABILITIES_SUFFIX}", c.id));
        if same && output.is_file() && (!opts.save_probabilities || prob_path.is_dir()) {
            results.push(PredictCase {
                id: c.id.clone(),
                outcome: PredictOutcome::Existing { output },
            });
            continue;
        }
        let t = Instant::now();
        bar.set_message(c.id.clone());
        let one = (|| -> Result<u64> {
            let entry = reader.open_entry("predict", &c.id)?;
            let shape = entry.shape_zyx();
            let mut probs = ProbWriter::ensemble(outputs.heads(), shape, scratch, models.len())?;
            let crop = (crops.remove(&c.id).map(Ok))
                .unwrap_or_else(|| super::crop::Crop::of(&entry, &outputs))?;
            let sliding = Instant::now();
            for (k, member) in models.iter().enumerate() {
                if k > 0 {
                    probs.next_member()?;
                }
                let reloaded;
                let net = match &member.model {
                    Some(n) => n,
                    None => {
                        reloaded = member.reload(device)?;
                        &reloaded
                    }
                };
                let p = predictor(opts, device, member, net, Some(&tick));
                crop.predict(&p, &entry, opts.window_memory, &mut probs)?;
            }
            totals.window_seconds += sliding.elapsed().as_secs_f64();

            let probs = probs.finish()?;
            let (path, frame) = c.channel(0);
            let h = nifti_io::read_frame_header(path, frame)?;
            let owner = format!(
                "{}.{}",
                crate::util::sysinfo::hostname(),
                std::process::id()
            );
            let tmp = opts.out.join(format!(".{}.nii.gz{TMP_INFIX}{owner}", c.id));
            let prob_tmp = opts
                .out
                .join(format!(".{}{PROBABILITIES_SUFFIX}{TMP_INFIX}{owner}", c.id));
            let input_shape = crate::geometry::zyx(h.shape_xyz);
            let written = (|| -> Result<()> {
                let prob_out = match opts.save_probabilities {
                    true => Some(ProbabilityZarr::create(
                        &prob_tmp,
                        &h,
                        &outputs,
                        slab_rows(input_shape),
                    )?),
                    false => None,
                };
                write_segmentation(
                    &Export {
                        probs: &probs,
                        model_shape_zyx: shape,
                        input_shape_zyx: input_shape,
                        outputs: &outputs,
                        input: path,
                        probabilities: prob_out.as_ref(),
                    },
                    &tmp,
                )?;
                if let Some(pp) = postprocessing.filter(|p| !p.is_none()) {
                    let regions = postprocess::regions(pp, &outputs.foreground_values());
                    postprocess::apply_file(&tmp, &tmp, &regions, postprocess::connectivity(pp))?;
                }
                // Probabilities first, then the record (of the bytes about to be renamed
                // into place), then the segmentation: one under its final name has both. A
                // kill before the rename leaves a record that matches no output: redone.
                if let Some(p) = prob_out {
                    p.finish(&prob_path)?;
                }
                let rec_tmp = record_path.with_extension("json.tmp");
                let record = OutputRecord {
                    output_blake3: file_hash(&tmp).unwrap_or_default(),
                    ..record
                };
                let bytes = serde_json::to_vec(&record).unwrap_or_default();
                std::fs::write(&rec_tmp, bytes)
                    .and_then(|()| std::fs::rename(&rec_tmp, &record_path))
                    .map_err(|e| Error::io(&record_path, e))?;
                std::fs::rename(&tmp, &output).map_err(|e| Error::io(&output, e))
            })();
            if let Err(e) = written {
                let _ = std::fs::remove_file(&tmp);
                let _ = std::fs::remove_dir_all(&prob_tmp);
                return Err(e);
            }
            Ok(shape.iter().map(|&v| v as u64).product())
        })();
        match one {
            Ok(n) => {
                totals.voxels += n;
                if !opts.quiet {
                    bar.suspend(|| eprintln!("{}: {}", c.id, output.display()));
                }
                results.push(PredictCase {
                    id: c.id.clone(),
                    outcome: PredictOutcome::Predicted {
                        output,
                        seconds: t.elapsed().as_secs_f64(),
                    },
                });
            }
            Err(e) => {
                results.push(PredictCase {
                    id: c.id.clone(),
                    outcome: PredictOutcome::Failed {
                        error: e.to_string(),
                    },
                });
            }
        }
    }
    bar.finish_and_clear();
    // Each --mirror flip is a window too.
    let passes = if mirrored { 8 } else { 1 };
    totals.windows += ran.load(std::sync::atomic::Ordering::Relaxed) * passes;
    Ok(())
}

/// The sliding window of one model (an ensemble member) with `net`, its weights.
fn predictor<'a>(
    opts: &PredictOptions,
    device: &'a candle_core::Device,
    member: &LoadedModel,
    net: &'a crate::model::unet::UNet,
    on_windows: Option<&'a (dyn Fn(usize) + Sync)>,
) -> Predictor<'a> {
    Predictor {
        model: net,
        device,
        patch: member.network.patch,
        overlap: opts.overlap,
        batch: opts.batch.max(1),
        mirror_axes: if opts.mirror && member.trained_mirrored {
            vec![0, 1, 2]
        } else {
            Vec::new()
        },
        on_windows,
        flavour: Flavour::ours(member.record.labels().is_regions()),
    }
}

/// The windows bar (on a terminal, unless quiet): windows done of all, windows a second.
fn window_bar(enabled: bool, windows: u64) -> ProgressBar {
    crate::util::progress::bar(
        enabled,
        windows,
        "predict [{bar:24}] {pos}/{len} windows {rate} eta {eta} {msg}",
        |s| {
            s.with_key(
                "rate",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.1} windows/s", s.per_sec());
                },
            )
        },
    )
}
