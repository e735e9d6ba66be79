//! An nnU-Net results folder made ready to predict: its plans' configuration, its dataset's
//! labels or regions, and the chosen folds' checkpoints (each read and checked up front; their
//! weights come back one fold at a time while predicting).

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::error::{Error, Result};
use crate::format::nnunet::{
    NnunetDataset, Plans, ResultsFolder, CHECKPOINT_BEST, CHECKPOINT_FINAL,
};
use crate::model::config::UNetConfig;
use crate::model::nnunet::{unet_config, NnunetCheckpoint};
use crate::model::unet::UNet;

/// Configurations we reproduce (a cascade's second stage needs the first stage's
/// segmentations as input channels, which we do not make yet).
const SUPPORTED: &[&str] = &["3d_fullres", "3d_lowres", "2d"];

/// A results folder, read.
pub struct NnunetModel {
    /// The folder.
    pub folder: ResultsFolder,
    /// Its plans, resolved to the folder's configuration.
    pub plans: Plans,
    /// Its dataset.json.
    pub dataset: NnunetDataset,
    /// The folds used.
    pub folds: Vec<String>,
    /// Their checkpoint files.
    pub checkpoints: Vec<PathBuf>,
    /// Our network's shape.
    pub network: UNetConfig,
    /// Mirror axes (z, y, x) at test time, from the first fold's checkpoint (nnU-Net's rule).
    pub mirror_axes: Vec<usize>,
    /// The trainer that made the checkpoints.
    pub trainer: String,
    /// nnU-Net's image reader the model was trained with (`SimpleITKIO`, `NibabelIO`).
    pub reader: String,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl NnunetModel {
    /// Open `dir` with `folds` (`None`: every `fold_K` present) and checkpoint file `file`.
    pub fn open(dir: &Path, folds: Option<&[String]>, file: &str) -> Result<NnunetModel> {
        if file != CHECKPOINT_FINAL && file != CHECKPOINT_BEST && !file.ends_with(".pth") {
            return Err(bad(dir, format!("checkpoint {file:?}: give {CHECKPOINT_FINAL}, {CHECKPOINT_BEST} or another .pth file name in the fold folders")));
        }
        let folder = ResultsFolder::open(dir)?;
        let cfg = folder.configuration.as_str();
        if !SUPPORTED.contains(&cfg) {
            return Err(bad(dir, format!("configuration {cfg}: predicting it is not supported (only {}; a cascade's second stage needs its first stage's predictions as input, which is not reproduced yet)", SUPPORTED.join(", "))));
        }
        let plans = Plans::read(&dir.join("plans.json"), cfg)?;
        if plans.configuration.previous_stage.is_some() {
            return Err(bad(&plans.path, format!("configuration {cfg} is a cascade stage (previous_stage is set): not supported yet")));
        }
        let dataset = NnunetDataset::read(&dir.join("dataset.json"))?;
        if dataset.channels.len() != plans.channels() {
            return Err(bad(
                &dataset.path,
                format!(
                    "{} channels in channel_names but the plans normalize {}",
                    dataset.channels.len(),
                    plans.channels()
                ),
            ));
        }
        let folds: Vec<String> = match folds {
            Some(f) => f.to_vec(),
            None => folder.folds.clone(),
        };
        if folds.is_empty() {
            return Err(bad(dir, "no fold_K folder: nothing trained here"));
        }
        let reader = crate::format::nnunet::reader_of(&plans, dataset.reader.as_deref())?;
        if dataset.file_ending != ".nii.gz" && dataset.file_ending != ".nii" {
            return Err(bad(
                &dataset.path,
                format!(
                    "file_ending {}: only NIfTI images (.nii.gz, .nii) are read",
                    dataset.file_ending
                ),
            ));
        }
        let heads = dataset.labels.heads();
        let network = unet_config(&plans.configuration.architecture, plans.channels(), heads);
        network
            .validate()
            .map_err(|e| bad(&plans.path, format!("its network cannot be built: {e}")))?;
        let mut checkpoints = Vec::new();
        let mut mirror_axes = Vec::new();
        let mut trainer = folder.trainer.clone();
        for (i, f) in folds.iter().enumerate() {
            if !folder.folds.contains(f) {
                return Err(bad(
                    dir,
                    format!("no fold_{f} folder (found: {})", folder.folds.join(", ")),
                ));
            }
            let path = folder.checkpoint(f, file);
            // A path that exists but is no regular file (a directory, a FIFO, a link to a
            // device) is named as what it is when the checkpoint is opened.
            if std::fs::metadata(&path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
                return Err(bad(&path, "missing: this fold has not finished training (give --nnunet-checkpoint checkpoint_best.pth, or other --folds)"));
            }
            // Read and checked now; the weights are read again when this fold runs.
            let ck = NnunetCheckpoint::read(&path, &plans.configuration.architecture)?;
            if let Some(c) = &ck.configuration {
                if c != cfg {
                    return Err(bad(
                        &path,
                        format!("trained for configuration {c}, but the folder is {cfg}"),
                    ));
                }
            }
            // Shapes only: the network is allocated when the fold runs.
            ck.check_network(&network, &plans)?;
            if i == 0 {
                trainer = ck.trainer.clone();
                let planar = plans.configuration.architecture.dims == 2;
                mirror_axes = ck
                    .mirror_axes
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| if planar { a + 1 } else { a })
                    .filter(|&a| a < 3)
                    .collect();
            }
            checkpoints.push(path);
        }
        Ok(NnunetModel {
            folder,
            plans,
            dataset,
            folds,
            checkpoints,
            network,
            mirror_axes,
            trainer,
            reader,
        })
    }

    /// The network of fold number `k` (in `folds` order) on `dev`.
    pub fn fold_network(&self, k: usize, dev: &Device) -> Result<UNet> {
        let ck =
            NnunetCheckpoint::read(&self.checkpoints[k], &self.plans.configuration.architecture)?;
        ck.network(self.network.clone(), &self.plans, dev)
    }

    /// Whether the network is 2D (predicted slice by slice).
    pub fn planar(&self) -> bool {
        self.plans.configuration.architecture.dims == 2
    }

    /// The sliding window's patch (z, y, x): a 2D patch one slice deep.
    pub fn patch(&self) -> [usize; 3] {
        match self.plans.configuration.patch_size[..] {
            [y, x] => [1, y, x],
            [z, y, x] => [z, y, x],
            _ => [1, 1, 1],
        }
    }
}

/// `$nnUNet_results/DatasetXXX/TRAINER__PLANS__CONFIGURATION` from nnU-Net's own spelling.
pub fn results_dir_from_env(
    dataset: &str,
    configuration: &str,
    trainer: &str,
    plans: &str,
) -> Result<PathBuf> {
    // Set but empty is as good as unset: an empty path names no folder.
    let root = std::env::var_os("nnUNet_results")
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            Error::Config("-d/--dataset names a dataset under $nnUNet_results, which is empty or not set: set nnUNet_results to the folder holding nnU-Net's DatasetXXX_Name results folders, or give the results folder with --nnunet-model".into())
        })?;
    crate::format::nnunet::results_dir(Path::new(&root), dataset, trainer, plans, configuration)
}
