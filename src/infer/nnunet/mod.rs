//! `predict --nnunet-model`: models trained by nnU-Net v2, run as they are, reproducing its
//! `nnUNetv2_predict` step by step and out of core: its preprocessing
//! ([`crate::prep::nnunet`]), its sliding window ([`super::sliding::Flavour::Nnunet`]: window
//! placement, Gaussian, float16 logits, mirroring), its fold ensemble (float16 sum, then mean)
//! and its export ([`export`]).
//!
//! - [`model`]: the results folder, its folds' checkpoints and the network.
//! - [`export`]: logits back to the input's grid and labels.
//! - [`budget`]: the window step and the memory of predicting, checked before anything is made.

pub mod budget;
pub mod export;
pub mod model;

use std::path::{Path, PathBuf};
use std::time::Instant;

use half::f16;

use super::postprocess::{apply_file, PostprocessingChoice};
use super::predict::{failed, input_cases, PredictCase, PredictOutcome, PredictReport};
use super::sliding::{Flavour, Predictor, Tile};
use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::format::nnunet::NnunetPostprocessing;
use crate::format::training::network::Precision;
use crate::geometry::components::Connectivity;
use crate::prep::dataset::CaseSource;
use crate::prep::nnunet::sizes::{case_sizes, check_case};
use crate::prep::nnunet::volume::Scratch;
use crate::prep::nnunet::{preprocess, reader_spacing_zyx, Preprocessed};
use model::NnunetModel;

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct NnunetPredictOptions {
    /// The results folder `TRAINER__PLANS__CONFIGURATION`.
    pub model: PathBuf,
    /// Folds to ensemble (`None`: every `fold_K` there).
    pub folds: Option<Vec<String>>,
    /// Checkpoint file name in each fold folder.
    pub checkpoint: String,
    /// NIfTI files or folders of them (`CASE_0000.nii.gz`...).
    pub inputs: Vec<PathBuf>,
    /// Output folder.
    pub out: PathBuf,
    /// `cpu`, `cuda`, `cuda:N`.
    pub device: String,
    /// nnU-Net's `-step_size` (0.5): the fraction of a patch between window starts.
    pub step: f64,
    /// Test-time mirroring over the checkpoint's axes (nnU-Net's default; `--disable_tta` off).
    pub mirror: bool,
    /// Windows per forward pass.
    pub batch: usize,
    /// The convolutions' arithmetic (`None`: f32, nnU-Net's own output).
    pub precision: Option<Precision>,
    /// About how many bytes the sliding window's slab may hold.
    pub window_memory: usize,
    /// Which postprocessing decision the segmentations get: `Recorded` is the one in the
    /// results folder's cross-validation folder (`postprocessing.json`), if there is one; a
    /// `File` is an nnU-Net `postprocessing.json`.
    pub postprocessing: PostprocessingChoice,
    /// Also write nnU-Net's `CASE.npz` (probabilities) and `CASE.pkl` (properties).
    pub save_probabilities: bool,
    /// Print only errors.
    pub quiet: bool,
}

/// A preprocessed volume read window by window.
struct Volume<'a> {
    id: &'a str,
    data: &'a Scratch<f32>,
}

impl PatchSource for Volume<'_> {
    fn name(&self) -> String {
        self.id.to_string()
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.data.zyx()
    }
    fn has_label(&self) -> bool {
        false
    }
    fn channels(&self) -> usize {
        self.data.shape[0]
    }
    fn classes(&self) -> Vec<u16> {
        Vec::new()
    }
    fn fg_coords(&self, _class: u16) -> Result<Vec<[u32; 3]>> {
        Ok(Vec::new())
    }
    fn read_image(&self, start: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        let shape = self.data.zyx();
        out.iter_mut().for_each(|v| *v = 0.0);
        let per = size.iter().product::<usize>();
        // The box's part inside the volume, per axis: (first voxel, offset in the box, length).
        let span = |a: usize| {
            let lo = start[a].max(0);
            let hi = (start[a] + size[a] as i64).min(shape[a] as i64);
            (
                lo as usize,
                (lo - start[a]) as usize,
                (hi - lo).max(0) as usize,
            )
        };
        let ((z0, oz, nz), (y0, oy, ny), (x0, ox, nx)) = (span(0), span(1), span(2));
        if nz == 0 || ny == 0 || nx == 0 {
            return Ok(());
        }
        for c in 0..self.data.shape[0] {
            for dz in 0..nz {
                for dy in 0..ny {
                    let at = c * per + ((oz + dz) * size[1] + oy + dy) * size[2] + ox;
                    self.data
                        .read_run(c, z0 + dz, y0 + dy, x0, &mut out[at..at + nx])?;
                }
            }
        }
        Ok(())
    }
    fn read_label(&self, _start: [i64; 3], _size: [usize; 3], _out: &mut [u16]) -> Result<()> {
        Err(Error::case(self.id, "a preprocessed input has no label"))
    }
}

/// Add a tile of one fold's logits into the accumulator (the first fold writes), in float16.
fn accumulate(acc: &Scratch<f16>, first: bool, t: Tile, vals: &[f32]) -> Result<()> {
    let heads = acc.shape[0];
    let nx = acc.shape[3];
    let mut row = vec![f16::ZERO; nx];
    let mut old = vec![f16::ZERO; nx];
    for dz in 0..t.rows {
        for dy in 0..t.height {
            let base = (dz * t.height + dy) * nx * heads;
            for c in 0..heads {
                for (x, r) in row.iter_mut().enumerate() {
                    *r = f16::from_f32(vals[base + x * heads + c]);
                }
                if !first {
                    acc.read_run(c, t.z0 + dz, t.y0 + dy, 0, &mut old)?;
                    for (r, o) in row.iter_mut().zip(&old) {
                        *r = f16::from_f32(f32::from(*r) + f32::from(*o));
                    }
                }
                acc.write_run(c, t.z0 + dz, t.y0 + dy, 0, &row)?;
            }
        }
    }
    Ok(())
}

/// Run an nnU-Net model over the inputs.
pub fn predict_nnunet(opts: &NnunetPredictOptions) -> Result<PredictReport> {
    let started = Instant::now();
    let peak = crate::util::sysinfo::PeakMemory::start();
    let device = crate::model::device::select(&opts.device)?;
    // Nothing is written into what the command reads: a results folder's own plans.json would
    // be truncated by the copy below.
    let mut read: Vec<(&str, &Path)> = vec![("the model folder", opts.model.as_path())];
    read.extend(opts.inputs.iter().map(|i| ("the input", i.as_path())));
    crate::util::paths::refuse_overlap("--out", &opts.out, &read)?;
    budget::check_step(opts.step, None)?;
    let model = NnunetModel::open(&opts.model, opts.folds.as_deref(), &opts.checkpoint)?;
    budget::check_step(opts.step, Some(model.patch()))?;
    budget::check_memory(&model, opts.batch, opts.window_memory)?;
    let postprocessing = postprocessing(&model, &opts.postprocessing)?;
    if let (Some(pp), false) = (&postprocessing, opts.quiet) {
        let sets: Vec<String> = pp.filters.iter().map(|f| format!("{f:?}")).collect();
        eprintln!(
            "postprocessing ({}): keep the largest component of labels {}",
            pp.path.display(),
            sets.join(", then of ")
        );
    }
    std::fs::create_dir_all(&opts.out).map_err(|e| Error::io(&opts.out, e))?;
    // As nnUNetv2_predict does: its ensembling and postprocessing tools read these beside the
    // predictions.
    for f in ["dataset.json", "plans.json"] {
        let to = opts.out.join(f);
        std::fs::copy(model.folder.dir.join(f), &to).map_err(|e| Error::io(&to, e))?;
    }
    let channels = model.plans.channels();
    let mut results: Vec<PredictCase> = Vec::new();
    let cases = input_cases(&opts.inputs, channels, &mut results)?;
    if cases.is_empty() && results.is_empty() {
        return Err(Error::Dataset(
            "no NIfTI image (.nii, .nii.gz) in the inputs: nothing to predict".into(),
        ));
    }
    let scratch = opts.out.join(format!(
        ".voxcache-predict.{}.{}",
        crate::util::sysinfo::hostname(),
        std::process::id()
    ));
    let (mut voxels, mut windows, mut window_seconds) = (0u64, 0u64, 0f64);
    for case in &cases {
        let t = Instant::now();
        let output = opts.out.join(format!("{}.nii.gz", case.id));
        let one = predict_case(
            opts,
            &model,
            &device,
            case,
            &scratch,
            &output,
            postprocessing.as_ref(),
        );
        let _ = std::fs::remove_dir_all(&scratch);
        match one {
            Ok((v, w, s)) => {
                voxels += v;
                windows += w;
                window_seconds += s;
                if !opts.quiet {
                    eprintln!("{}: {}", case.id, output.display());
                }
                results.push(PredictCase {
                    id: case.id.clone(),
                    outcome: PredictOutcome::Predicted {
                        output,
                        seconds: t.elapsed().as_secs_f64(),
                    },
                });
            }
            Err(e) => results.push(failed(&case.id, &e)),
        }
    }
    results.sort_by(|a, b| a.id.cmp(&b.id));
    let count = |f: fn(&PredictOutcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    Ok(PredictReport {
        checkpoints: model.checkpoints.clone(),
        postprocessing: None,
        nnunet_postprocessing: postprocessing,
        predicted: count(|o| matches!(o, PredictOutcome::Predicted { .. })),
        existing: 0,
        failed: count(|o| matches!(o, PredictOutcome::Failed { .. })),
        cases: results,
        voxels,
        windows,
        window_seconds,
        wall_seconds: started.elapsed().as_secs_f64(),
        peak_rss_bytes: crate::util::sysinfo::peak_rss_bytes(),
        peak_anon_bytes: peak.peak().map(|m| m.anon),
        peak_file_bytes: peak.peak().map(|m| m.file),
    })
}

/// The postprocessing asked for, checked against the model's labels.
fn postprocessing(
    model: &NnunetModel,
    choice: &PostprocessingChoice,
) -> Result<Option<NnunetPostprocessing>> {
    // The label values the segmentations hold (a region model writes its order's values;
    // nnU-Net's region filters name the regions' labels).
    let predicted = model.dataset.labels.segmentation_values();
    Ok(match choice {
        PostprocessingChoice::Off => None,
        PostprocessingChoice::Recorded => model
            .folder
            .postprocessing
            .as_deref()
            .map(|p| NnunetPostprocessing::read(p, &predicted))
            .transpose()?,
        PostprocessingChoice::File(p) => Some(NnunetPostprocessing::read(p, &predicted)?),
    })
}

/// Preprocess, predict every fold and export one case; (voxels, windows, window seconds).
fn predict_case(
    opts: &NnunetPredictOptions,
    model: &NnunetModel,
    device: &candle_core::Device,
    case: &CaseSource,
    scratch: &Path,
    output: &Path,
    pp: Option<&NnunetPostprocessing>,
) -> Result<(u64, u64, f64)> {
    std::fs::create_dir_all(scratch).map_err(|e| Error::io(scratch, e))?;
    // Sized from the header before a voxel is read or a scratch file made.
    let (first, frame) = case.channel(0);
    let h = crate::nifti_io::read_frame_header(first, frame)?;
    let spacing_zyx = reader_spacing_zyx(&h, &model.reader);
    let heads = model.dataset.labels.heads();
    let sizes = case_sizes(
        &model.plans,
        first,
        crate::geometry::zyx(h.shape_xyz),
        spacing_zyx,
        heads,
    )?;
    check_case(&model.plans, first, spacing_zyx, &sizes, scratch)?;
    let Preprocessed { data, geometry, .. } =
        preprocess(case, &model.plans, &model.reader, scratch)?;
    let shape = data.zyx();
    let logits: Scratch<f16> = Scratch::new(scratch, [heads, shape[0], shape[1], shape[2]])?;
    let source = Volume {
        id: &case.id,
        data: &data,
    };
    let ran = std::sync::atomic::AtomicU64::new(0);
    let tick = |n: usize| {
        ran.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    };
    let sliding = Instant::now();
    for k in 0..model.checkpoints.len() {
        let mut net = model.fold_network(k, device)?;
        if let Some(p) = opts.precision {
            net.set_precision(p);
        }
        let predictor = Predictor {
            model: &net,
            device,
            patch: model.patch(),
            overlap: 1.0 - opts.step,
            batch: opts.batch.max(1),
            mirror_axes: if opts.mirror {
                model.mirror_axes.clone()
            } else {
                Vec::new()
            },
            on_windows: Some(&tick),
            flavour: Flavour::Nnunet {
                planar: model.planar(),
            },
        };
        predictor.predict_tiled(&source, opts.window_memory, &mut |t, vals| {
            accumulate(&logits, k == 0, t, vals)
        })?;
    }
    let window_seconds = sliding.elapsed().as_secs_f64();
    drop(data);
    let (path, _) = case.channel(0);
    // Everything is written under temporary names and renamed once complete.
    let hidden = |p: &Path| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        p.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
    };
    let npz = output.with_file_name(format!("{}.npz", case.id));
    let pkl = output.with_file_name(format!("{}.pkl", case.id));
    let mut finals = vec![output.to_path_buf()];
    if opts.save_probabilities {
        finals.extend([npz.clone(), pkl.clone()]);
    }
    let temps: Vec<PathBuf> = finals.iter().map(|p| hidden(p)).collect();
    let probs = opts.save_probabilities.then(|| export::ProbabilityFiles {
        npz: &temps[1],
        pkl: &temps[2],
    });
    let written = export::export(
        model,
        logits,
        model.checkpoints.len(),
        &geometry,
        path,
        &temps[0],
        probs,
        scratch,
    )
    .and_then(|()| match pp {
        Some(pp) => apply_file(&temps[0], &temps[0], &pp.filters, Connectivity::Full),
        None => Ok(()),
    })
    .and_then(|()| {
        finals
            .iter()
            .zip(&temps)
            .rev()
            .try_for_each(|(f, t)| std::fs::rename(t, f).map_err(|e| Error::io(f, e)))
    });
    if written.is_err() {
        temps.iter().for_each(|t| {
            let _ = std::fs::remove_file(t);
        });
    }
    written?;
    let passes = 1u64
        << if opts.mirror {
            model.mirror_axes.len()
        } else {
            0
        };
    Ok((
        shape.iter().map(|&v| v as u64).product(),
        ran.load(std::sync::atomic::Ordering::Relaxed) * passes,
        window_seconds,
    ))
}
