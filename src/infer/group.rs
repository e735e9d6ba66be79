//! Predicting one group of inputs (those sharing a spatial unit): preprocessed into a scratch
//! cache as the model's training cache was, then, case by case, the windows of every ensemble
//! member, the export to the input's grid, and the record that lets a rerun skip the case.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::crop::Crop;
use super::export::{slab_rows, write_segmentation, Export};
use super::model_dir::LoadedModel;
use super::postprocess;
use super::predict::{PredictCase, PredictOptions, PredictOutcome, TMP_INFIX};
use super::prob_zarr::ProbabilityZarr;
use super::probs::ProbWriter;
use super::sliding::{Flavour, Predictor};
use crate::cache::reader::{CacheReader, ReaderOptions};
use crate::error::{Error, Result};
use crate::format::crossval::Postprocessing;
use crate::format::labels::Labels;
use crate::format::probabilities::PROBABILITIES_SUFFIX;
use crate::format::training::network::Precision;
use crate::format::OutputParams;
use crate::nifti_io;
use crate::prep::cache_build::{build_cache, BuildOptions, BuildReport, CaseOutcome};
use crate::prep::dataset::{CaseSource, DatasetSource};

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

/// What the predicted cases add up to.
#[derive(Default)]
pub(super) struct Totals {
    pub(super) voxels: u64,
    pub(super) windows: u64,
    pub(super) window_seconds: f64,
}

/// What every group of a predict shares: the options, the ensemble, the postprocessing to
/// apply, the device.
pub(super) struct Job<'a> {
    pub(super) opts: &'a PredictOptions,
    pub(super) models: &'a [LoadedModel],
    pub(super) postprocessing: Option<&'a Postprocessing>,
    pub(super) device: &'a candle_core::Device,
}

/// Preprocess and predict the cases of one group, adding a line per case to `results`.
pub(super) fn predict_group(
    job: &Job,
    params: OutputParams,
    cases: Vec<CaseSource>,
    scratch: &Path,
    results: &mut Vec<PredictCase>,
    totals: &mut Totals,
) -> Result<()> {
    let Some((report, reader)) = preprocess(job.opts, &cases, params, scratch, results)? else {
        return Ok(());
    };
    let (opts, models, device) = (job.opts, job.models, job.device);
    let m = &models[0];
    let outputs = m.record.labels();
    let first = m
        .model
        .as_ref()
        .ok_or_else(|| Error::Config("the first model has no weights loaded".into()))?;
    // One bar over every window of the group's cases, within the crops kept for predicting.
    let mut crops = HashMap::new();
    let windows: usize = report
        .cases
        .iter()
        .filter(|r| !matches!(r.outcome, CaseOutcome::Failed { .. }))
        .filter_map(|r| Some((r, reader.open_entry("predict", &r.id).ok()?)))
        .map(|(r, e)| {
            let (crop, shape) = (Crop::of(&e, &outputs).ok(), e.shape_zyx());
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
    // Windows run, as the sliding window reports them.
    let ran = AtomicU64::new(0);
    let tick = |n: usize| {
        bar.inc(n as u64);
        ran.fetch_add(n as u64, Ordering::Relaxed);
    };
    let run = CaseRun {
        job,
        outputs: &outputs,
        reader: &reader,
        scratch,
        mirrored: !predictor(opts, device, m, first, None)
            .mirror_axes
            .is_empty(),
        tick: &tick,
        bar: &bar,
    };
    for r in report.cases {
        let Some(c) = cases.iter().find(|c| c.id == r.id) else {
            continue;
        };
        let outcome = match &r.outcome {
            CaseOutcome::Failed { error } => PredictOutcome::Failed {
                error: error.clone(),
            },
            _ => run.case(c, r.key.as_deref().unwrap_or_default(), &mut crops, totals),
        };
        results.push(PredictCase {
            id: r.id.clone(),
            outcome,
        });
    }
    bar.finish_and_clear();
    // Each --mirror flip is a window too.
    let passes = if run.mirrored { 8 } else { 1 };
    totals.windows += ran.load(Ordering::Relaxed) * passes;
    Ok(())
}

/// The group's inputs preprocessed into the scratch cache with the model's parameters: its
/// build report and a reader. `None` when no case could be preprocessed (each failure is then
/// the case's own line: the scratch cache has no manifest, and that is not the user's problem).
fn preprocess(
    opts: &PredictOptions,
    cases: &[CaseSource],
    params: OutputParams,
    scratch: &Path,
    results: &mut Vec<PredictCase>,
) -> Result<Option<(BuildReport, CacheReader)>> {
    let cache = scratch.join("cache");
    let report = build_cache(&BuildOptions {
        source: DatasetSource::Cases(cases.to_vec()),
        cache_dir: cache.clone(),
        remote: Default::default(),
        name: Some("predict".into()),
        settings: crate::prep::settings::Settings {
            input_ram_mib: 256,
            ..Default::default()
        },
        jobs: opts.jobs.max(1),
        dry_run: false,
        part: None,
        progress: !opts.quiet,
        quiet: true,
        fixed_params: Some(params),
        previous_stage: None,
        nnunet: None,
    })?;
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
        return Ok(None);
    }
    let reader = CacheReader::open_with(
        &cache,
        ReaderOptions {
            mapped_resident_bytes: opts.mapped_mib.map(|m| m.saturating_mul(1 << 20)),
            ..Default::default()
        },
    )?;
    Ok(Some((report, reader)))
}

/// What predicting one case of a group needs beyond the job.
struct CaseRun<'a> {
    job: &'a Job<'a>,
    outputs: &'a Labels,
    reader: &'a CacheReader,
    scratch: &'a Path,
    /// Windows are mirrored (the first model's setting stands for the ensemble's).
    mirrored: bool,
    tick: &'a (dyn Fn(usize) + Sync),
    bar: &'a ProgressBar,
}

impl CaseRun<'_> {
    /// Case `c` (its scratch entry's content key `key`): skipped when its output and record
    /// say it was made from the same entry, weights and settings; else predicted and written.
    fn case(
        &self,
        c: &CaseSource,
        key: &str,
        crops: &mut HashMap<String, Crop>,
        totals: &mut Totals,
    ) -> PredictOutcome {
        let opts = self.job.opts;
        let output = opts.out.join(format!("{}.nii.gz", c.id));
        let record = self.record(key);
        let record_path = opts.out.join(format!(".{}.voxcache.json", c.id));
        let same = std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<OutputRecord>(&b).ok())
            .is_some_and(|old| {
                old.key == record.key && file_hash(&output).is_some_and(|h| h == old.output_blake3)
            });
        let prob_path = opts.out.join(format!("{}{PROBABILITIES_SUFFIX}", c.id));
        if same && output.is_file() && (!opts.save_probabilities || prob_path.is_dir()) {
            return PredictOutcome::Existing { output };
        }
        let t = Instant::now();
        self.bar.set_message(c.id.clone());
        let one = (|| -> Result<u64> {
            let (probs, shape) = self.windows(c, crops, totals)?;
            self.write(c, probs, shape, record, &record_path, &output)?;
            Ok(shape.iter().map(|&v| v as u64).product())
        })();
        match one {
            Ok(n) => {
                totals.voxels += n;
                if !opts.quiet {
                    self.bar
                        .suspend(|| eprintln!("{}: {}", c.id, output.display()));
                }
                PredictOutcome::Predicted {
                    output,
                    seconds: t.elapsed().as_secs_f64(),
                }
            }
            Err(e) => PredictOutcome::Failed {
                error: e.to_string(),
            },
        }
    }

    /// The record of an output made from the entry `key` with this job's models and settings.
    fn record(&self, key: &str) -> OutputRecord {
        let (opts, models) = (self.job.opts, self.job.models);
        OutputRecord {
            key: format!(
                "{}-{}-{}-{}-{}",
                key,
                // A member predicted in bf16 is another prediction (f32 keeps the key it had).
                models
                    .iter()
                    .map(|m| match m.network.precision {
                        Precision::F32 => m.weights_hash.clone(),
                        p => format!("{}@{p}", m.weights_hash),
                    })
                    .collect::<Vec<_>>()
                    .join("+"),
                opts.overlap,
                self.mirrored,
                self.job
                    .postprocessing
                    .map_or("none".into(), Postprocessing::key)
            ),
            checkpoint: models
                .iter()
                .map(|m| m.checkpoint.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            output_blake3: String::new(),
        }
    }

    /// Every ensemble member's windows over the case (within its crop), averaged: the
    /// probabilities on the cached grid, and that grid's shape.
    fn windows(
        &self,
        c: &CaseSource,
        crops: &mut HashMap<String, Crop>,
        totals: &mut Totals,
    ) -> Result<(ProbWriter, [usize; 3])> {
        let (opts, device) = (self.job.opts, self.job.device);
        let entry = self.reader.open_entry("predict", &c.id)?;
        let shape = entry.shape_zyx();
        let mut probs = ProbWriter::ensemble(
            self.outputs.heads(),
            shape,
            self.scratch,
            self.job.models.len(),
        )?;
        let crop =
            (crops.remove(&c.id).map(Ok)).unwrap_or_else(|| Crop::of(&entry, self.outputs))?;
        let sliding = Instant::now();
        for (k, member) in self.job.models.iter().enumerate() {
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
            let p = predictor(opts, device, member, net, Some(self.tick));
            crop.predict(&p, &entry, opts.window_memory, &mut probs)?;
        }
        totals.window_seconds += sliding.elapsed().as_secs_f64();
        Ok((probs, shape))
    }

    /// The segmentation (and probabilities, when asked) on the input's grid, postprocessed,
    /// then its record, then the segmentation renamed into place: one under its final name
    /// has both. A kill before the rename leaves a record that matches no output: redone.
    fn write(
        &self,
        c: &CaseSource,
        probs: ProbWriter,
        shape: [usize; 3],
        record: OutputRecord,
        record_path: &Path,
        output: &Path,
    ) -> Result<()> {
        let opts = self.job.opts;
        let probs = probs.finish()?;
        let (path, frame) = c.channel(0);
        let h = nifti_io::read_frame_header(path, frame)?;
        let owner = format!(
            "{}.{}",
            crate::util::sysinfo::hostname(),
            std::process::id()
        );
        let tmp = opts.out.join(format!(".{}.nii.gz{TMP_INFIX}{owner}", c.id));
        let prob_tmp: PathBuf = opts
            .out
            .join(format!(".{}{PROBABILITIES_SUFFIX}{TMP_INFIX}{owner}", c.id));
        let prob_path = opts.out.join(format!("{}{PROBABILITIES_SUFFIX}", c.id));
        let input_shape = crate::geometry::zyx(h.shape_xyz);
        let written = (|| -> Result<()> {
            let prob_out = match opts.save_probabilities {
                true => Some(ProbabilityZarr::create(
                    &prob_tmp,
                    &h,
                    self.outputs,
                    slab_rows(input_shape),
                )?),
                false => None,
            };
            write_segmentation(
                &Export {
                    probs: &probs,
                    model_shape_zyx: shape,
                    input_shape_zyx: input_shape,
                    outputs: self.outputs,
                    input: path,
                    probabilities: prob_out.as_ref(),
                },
                &tmp,
            )?;
            if let Some(pp) = self.job.postprocessing.filter(|p| !p.is_none()) {
                let regions = postprocess::regions(pp, &self.outputs.foreground_values());
                postprocess::apply_file(&tmp, &tmp, &regions, postprocess::connectivity(pp))?;
            }
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
                .and_then(|()| std::fs::rename(&rec_tmp, record_path))
                .map_err(|e| Error::io(record_path, e))?;
            std::fs::rename(&tmp, output).map_err(|e| Error::io(output, e))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_dir_all(&prob_tmp);
        }
        written
    }
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
