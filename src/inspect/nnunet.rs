//! `prep inspect --nnunet-model DIR [INPUT...]`: what an nnU-Net model expects (configuration,
//! spacing, patch, channels and their normalization, classes or regions, folds, mirroring,
//! network and parameter count) and, for given inputs, the forecast of predicting them: windows,
//! forward passes, scratch disk, memory and time (one forward pass timed here).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::Result;
use crate::infer::nnunet::budget::check_memory;
use crate::infer::nnunet::model::NnunetModel;
use crate::infer::sliding::{banded_rows, nnunet_starts, nnunet_window_count};
use crate::prep::dataset;
use crate::prep::nnunet::reader_spacing_zyx;
use crate::prep::nnunet::sizes::case_sizes;

/// One input's forecast (the crop to the nonzero region is not known before reading the
/// voxels: the forecast is for the whole image, an upper bound).
#[derive(Clone, Debug, Serialize)]
pub struct CaseForecast {
    /// Case id.
    pub id: String,
    /// The file's grid (z, y, x) and spacing.
    pub shape_zyx: [usize; 3],
    /// Spacing (z, y, x).
    pub spacing_zyx: [f64; 3],
    /// The network's grid (transposed, resampled).
    pub preprocessed_shape: [usize; 3],
    /// Sliding windows per fold (without mirroring).
    pub windows: usize,
    /// Forward passes in all (windows x mirror passes x folds).
    pub forward_passes: usize,
    /// Scratch disk used on the way, bytes.
    pub scratch_bytes: u64,
    /// Forecast seconds on this machine (forward passes x one timed pass).
    pub seconds: f64,
}

/// What `prep inspect --nnunet-model` reports.
#[derive(Clone, Debug, Serialize)]
pub struct NnunetModelReport {
    /// The results folder.
    pub folder: PathBuf,
    /// Trainer (from the first fold's checkpoint), plans and configuration.
    pub trainer: String,
    /// Plans identifier.
    pub plans: String,
    /// Configuration.
    pub configuration: String,
    /// The plans' dataset name.
    pub dataset: String,
    /// Network class, dimensions, stages and features.
    pub network: String,
    /// Trainable parameters of the network we build.
    pub parameters: u64,
    /// Patch, as the plans list it (z, y, x) or (y, x).
    pub patch_size: Vec<usize>,
    /// Target spacing, as the plans list it.
    pub spacing: Vec<f64>,
    /// Axis permutation applied first.
    pub transpose_forward: [usize; 3],
    /// Per channel: name, normalization, whether inside the nonzero mask.
    pub channels: Vec<(String, String, bool)>,
    /// "classes" or "regions".
    pub outputs: String,
    /// Class names with values, or regions with their labels and the value each writes.
    pub labels: Vec<String>,
    /// Folds used and their checkpoints.
    pub checkpoints: Vec<PathBuf>,
    /// Test-time mirror axes (z, y, x).
    pub mirror_axes: Vec<usize>,
    /// Image and logit resampling orders (in plane, separate axis).
    pub resampling: String,
    /// The cross-validation's postprocessing decision, if there is one.
    pub postprocessing: Option<PathBuf>,
    /// Memory of predicting (weights, one forward batch, the window slab), bytes.
    pub memory_bytes: u64,
    /// Seconds one forward pass of a window took here.
    pub seconds_per_pass: f64,
    /// Per input given.
    pub forecast: Vec<CaseForecast>,
}

/// Inspect `dir` (every fold, `checkpoint`) and forecast predicting `inputs`.
pub fn inspect_nnunet(
    dir: &Path,
    checkpoint: &str,
    inputs: &[PathBuf],
    window_memory: usize,
) -> Result<NnunetModelReport> {
    let m = NnunetModel::open(dir, None, checkpoint)?;
    let cfg = &m.plans.configuration;
    let a = &cfg.architecture;
    let patch = m.patch();
    let heads = m.dataset.labels.heads();
    // The forecast first: a patch no machine here could hold is refused before the timed pass
    // allocates it.
    // One window a pass, predict's default.
    let memory_bytes = check_memory(&m, 1, window_memory)?;
    let dev = candle_core::Device::Cpu;
    let net = m.fold_network(0, &dev)?;
    let t = Instant::now();
    let x = candle_core::Tensor::zeros(
        (1, m.plans.channels(), patch[0], patch[1], patch[2]),
        candle_core::DType::F32,
        &dev,
    )?;
    net.infer(&x)?;
    let seconds_per_pass = t.elapsed().as_secs_f64();
    let passes = (1usize << m.mirror_axes.len()) * m.checkpoints.len();
    let mut forecast = Vec::new();
    let mut files = Vec::new();
    for i in inputs {
        if i.is_dir() {
            files.extend(dataset::image_files(i)?.0);
        } else {
            files.push(i.clone());
        }
    }
    for case in dataset::cases_from_files(files, m.plans.channels()).cases {
        let h = crate::nifti_io::read_header(case.image())?;
        let shape_zyx = crate::geometry::zyx(h.shape_xyz);
        let spacing_zyx = reader_spacing_zyx(&h, &m.reader);
        let sizes = case_sizes(&m.plans, case.image(), shape_zyx, spacing_zyx, heads)?;
        let new = sizes.new_shape;
        // Counted, not placed: a huge grid has too many starts to list.
        let starts = |a: usize| {
            if m.planar() && a == 0 {
                new[0]
            } else {
                nnunet_window_count(new[a].max(patch[a]), patch[a], 0.5)
            }
        };
        // Rows along y as predict's bands run them under `window_memory` (a window on a band
        // border runs once for each band); nnU-Net pads an axis shorter than the patch.
        let rows_y = if new[1] <= patch[1] {
            1
        } else {
            let ys = nnunet_starts(new[1], patch[1], 0.5);
            banded_rows(&ys, new, patch, heads, window_memory)
        };
        let windows = starts(0).saturating_mul(rows_y).saturating_mul(starts(2));
        let scratch_bytes = sizes.scratch_bytes;
        forecast.push(CaseForecast {
            id: case.id.clone(),
            shape_zyx,
            spacing_zyx,
            preprocessed_shape: new,
            windows,
            forward_passes: windows.saturating_mul(passes),
            scratch_bytes,
            seconds: windows.saturating_mul(passes) as f64 * seconds_per_pass,
        });
    }
    let l = &m.dataset.labels;
    let (outputs, labels) = match l.is_regions() {
        false => (
            "classes",
            l.classes()
                .iter()
                .map(|c| format!("{} {}", c.value, c.name))
                .collect(),
        ),
        true => (
            "regions",
            l.regions()
                .iter()
                .zip(l.regions_class_order())
                .map(|(r, o)| format!("{} = labels {:?}, written as {o}", r.name, r.values))
                .collect(),
        ),
    };
    let (rd, rp) = (&cfg.resampling_data, &cfg.resampling_probabilities);
    Ok(NnunetModelReport {
        folder: dir.to_path_buf(),
        trainer: m.trainer.clone(),
        plans: m.folder.plans_name.clone(),
        configuration: cfg.name.clone(),
        dataset: m.plans.dataset_name.clone(),
        network: format!(
            "{} {}D, {} stages, features {:?}, strides {:?}",
            a.class,
            a.dims,
            a.features.len(),
            a.features,
            a.strides
        ),
        parameters: net.num_parameters() as u64,
        patch_size: cfg.patch_size.clone(),
        spacing: cfg.spacing.clone(),
        transpose_forward: m.plans.transpose_forward,
        channels: m
            .dataset
            .channels
            .iter()
            .zip(&cfg.normalization_schemes)
            .zip(&cfg.use_mask_for_norm)
            .map(|((n, s), k)| (n.clone(), s.nnunet_name().unwrap_or(s.name()).into(), *k))
            .collect(),
        outputs: outputs.into(),
        labels,
        checkpoints: m.checkpoints.clone(),
        mirror_axes: m.mirror_axes.clone(),
        resampling: format!(
            "images order {} (separate axis order {}), logits order {} (separate axis order {})",
            rd.order, rd.order_z, rp.order, rp.order_z
        ),
        postprocessing: m.folder.postprocessing.clone(),
        memory_bytes,
        seconds_per_pass,
        forecast,
    })
}

impl NnunetModelReport {
    /// The report as text.
    pub fn to_text(&self) -> String {
        let mib = |b: u64| format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64);
        let mut s = String::new();
        let mut line = |k: &str, v: String| s.push_str(&format!("{k:<18} {v}\n"));
        line("nnU-Net model", self.folder.display().to_string());
        line("dataset", self.dataset.clone());
        line("trainer", self.trainer.clone());
        line("plans", format!("{} / {}", self.plans, self.configuration));
        line(
            "network",
            format!("{} ({} parameters)", self.network, self.parameters),
        );
        line(
            "patch",
            format!(
                "{:?} at spacing {:?}, transpose_forward {:?}",
                self.patch_size, self.spacing, self.transpose_forward
            ),
        );
        for (i, (n, norm, mask)) in self.channels.iter().enumerate() {
            line(
                &format!("channel {i}"),
                format!(
                    "{n}: {norm}{}",
                    if *mask {
                        " inside the nonzero mask"
                    } else {
                        ""
                    }
                ),
            );
        }
        line(&self.outputs, self.labels.join("; "));
        line(
            "folds",
            self.checkpoints
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        );
        line(
            "mirroring",
            format!("axes (z, y, x) {:?}", self.mirror_axes),
        );
        line("resampling", self.resampling.clone());
        line(
            "postprocessing",
            self.postprocessing
                .as_ref()
                .map_or("none found".into(), |p| p.display().to_string()),
        );
        line(
            "memory",
            format!(
                "about {} (weights, one forward batch, the window slab)",
                mib(self.memory_bytes)
            ),
        );
        line(
            "one forward pass",
            format!("{:.2} s here", self.seconds_per_pass),
        );
        for f in &self.forecast {
            line(&format!("input {}", f.id), format!("{:?} at {:?} -> {:?}: {} windows, {} forward passes, about {:.0} s, {} scratch", f.shape_zyx, f.spacing_zyx, f.preprocessed_shape, f.windows, f.forward_passes, f.seconds, mib(f.scratch_bytes)));
        }
        s
    }
}
