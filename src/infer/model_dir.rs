//! Opening a trained model for prediction: a run folder (its `run.json` and a checkpoint) or a
//! checkpoint folder copied on its own (which holds its own `run.json`): the network rebuilt
//! from the recorded options, its weights, and the preprocessing its inputs had.

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::error::{Error, Result};
use crate::format::run::{Preprocessing, RunRecord, RUN_FILE};
use crate::model::checkpoint::{Checkpointer, MODEL_FILE};
use crate::model::config::NetworkOptions;
use crate::model::unet::UNet;

/// Which checkpoint of a run folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Which {
    /// `checkpoints/best` (the best validation Dice), else the latest.
    Best,
    /// The newest complete checkpoint.
    Latest,
    /// This checkpoint folder.
    Path(PathBuf),
}

impl std::str::FromStr for Which {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "" => {
                return Err(Error::Config(
                    "--checkpoint: an empty path (give best, latest or a checkpoint folder)".into(),
                ))
            }
            "best" => Which::Best,
            "latest" => Which::Latest,
            p => Which::Path(PathBuf::from(p)),
        })
    }
}

/// A model ready to predict.
pub struct LoadedModel {
    /// The run's record: classes, channels, preprocessing, options.
    pub record: RunRecord,
    /// How inputs must be made (always present here).
    pub preprocessing: Preprocessing,
    /// The network options of the run (patch size, network shape).
    pub network: NetworkOptions,
    /// The network learnt mirrored patches (then test-time mirroring makes sense).
    pub trained_mirrored: bool,
    /// The network with the checkpoint's weights; `None` for an ensemble's later members, whose
    /// weights are loaded again case by case ([`LoadedModel::reload`]) so that memory holds
    /// one member's weights at a time.
    pub model: Option<UNet>,
    /// The checkpoint folder the weights came from.
    pub checkpoint: PathBuf,
    /// The run record read (`run.json`).
    pub record_path: PathBuf,
    /// blake3 of the weights file (part of each prediction's key).
    pub weights_hash: String,
}

/// Open `dir` (a run folder, or a checkpoint folder with its own `run.json`) on `device`.
pub fn load_model(dir: &Path, which: &Which, device: &Device) -> Result<LoadedModel> {
    let own_weights = dir.join(MODEL_FILE).is_file();
    let record_path = dir.join(RUN_FILE);
    let record = RunRecord::read(&record_path)?.ok_or_else(|| {
        Error::Config(format!(
            "{}: no {RUN_FILE}: not a run folder made by train (or a checkpoint folder copied from one)",
            dir.display()
        ))
    })?;
    let preprocessing = record.preprocessing.clone().ok_or_else(|| {
        Error::Config(format!(
            "{}: the run was made before voxcache recorded the preprocessing a model needs (target spacing, normalization statistics): train it again with this voxcache",
            record_path.display()
        ))
    })?;
    if let Some(n) = &preprocessing.params.nnunet {
        // Its inputs must be preprocessed by nnU-Net's code for those plans, which predict
        // applies to nnU-Net's own models only.
        return Err(Error::Config(format!(
            "{}: the model was trained on a cache of nnU-Net's preprocessing ({} configuration {}): predict does not preprocess new volumes that way for a voxcache model yet",
            record_path.display(),
            n.plans,
            n.configuration
        )));
    }
    let network: NetworkOptions = record.config.network();
    let ck_dir = match (which, own_weights) {
        (Which::Path(p), _) => p.clone(),
        (_, true) => dir.to_path_buf(),
        (Which::Best, false) if dir.join("checkpoints/best").join(MODEL_FILE).is_file() => {
            dir.join("checkpoints/best")
        }
        (Which::Best | Which::Latest, false) => {
            if !dir.join("checkpoints").is_dir() {
                return Err(Error::Config(format!(
                    "{}: the run has no checkpoints/ folder: nothing to predict with",
                    dir.display()
                )));
            }
            let latest = Checkpointer::read_only(dir)
                .latest(device)?
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{}: the run has no checkpoint to predict with",
                        dir.display()
                    ))
                })?;
            latest.dir
        }
    };
    let mirrored = record.config.augment && record.config.augmentation.mirrors();
    let model = with_weights(&record, &record_path, &network, &ck_dir, device)?;
    let weights = ck_dir.join(MODEL_FILE);
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(&weights).map_err(|e| Error::io(&weights, e))?)
        .map_err(|e| Error::io(&weights, e))?;
    Ok(LoadedModel {
        record,
        preprocessing,
        trained_mirrored: mirrored,
        network,
        model: Some(model),
        checkpoint: ck_dir,
        record_path,
        weights_hash: h.finalize().to_hex().to_string(),
    })
}

/// The recorded network with the weights of checkpoint folder `ck_dir`.
fn with_weights(
    record: &RunRecord,
    record_path: &Path,
    network: &NetworkOptions,
    ck_dir: &Path,
    device: &Device,
) -> Result<UNet> {
    let ck = Checkpointer::load(ck_dir, device)?;
    let channels = record.channels.len().max(1);
    // Prediction uses the full-resolution head alone: deep-supervision heads stay unused.
    let bare = NetworkOptions {
        deep_supervision: false,
        ..network.clone()
    };
    let model = bare
        .build(channels, record.labels().heads(), device)
        .map_err(|e| Error::Config(format!("{}: config: {e}", record_path.display())))?;
    let weights = ck_dir.join(MODEL_FILE);
    model.load(&ck.model).map_err(|e| {
        Error::Train(format!(
            "{}: the weights do not fit the recorded network: {e}",
            weights.display()
        ))
    })?;
    // NaN or infinite weights predict one class everywhere: refuse them, naming the tensor.
    for (name, v) in model.params() {
        let bad = non_finite(v.as_tensor()).unwrap_or(usize::MAX);
        if bad > 0 {
            return Err(Error::Train(format!(
                "{}: tensor {name} holds NaN or infinite values",
                weights.display()
            )));
        }
    }
    Ok(model)
}

/// How many of a tensor's values are NaN or infinite, value by value: a sum of magnitudes
/// would overflow on large finite weights and refuse them.
fn non_finite(t: &candle_core::Tensor) -> candle_core::Result<usize> {
    let values = t
        .flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?;
    Ok(values.iter().filter(|v| !v.is_finite()).count())
}

impl LoadedModel {
    /// Predict with the convolutions' arithmetic `p` instead of the one trained with (the
    /// network, and its copies loaded again for an ensemble's later members).
    pub fn set_precision(&mut self, p: crate::format::training::network::Precision) {
        self.network.precision = p;
        if let Some(m) = &mut self.model {
            m.set_precision(p);
        }
    }

    /// The network with its weights, loaded again from the checkpoint it was opened from.
    pub fn reload(&self, device: &Device) -> Result<UNet> {
        with_weights(
            &self.record,
            &self.record_path,
            &self.network,
            &self.checkpoint,
            device,
        )
    }
}

/// The members of an ensemble: each opened as [`load_model`] does, all checked, before any
/// work, to output the same classes from the same channels and preprocessing (a member that
/// differs is named beside the first).
pub fn load_models(dirs: &[PathBuf], which: &Which, device: &Device) -> Result<Vec<LoadedModel>> {
    let mut models: Vec<LoadedModel> = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let m = load_model(dir, which, device)?;
        if let Some(first) = models.first() {
            let (a, b) = (&first.record, &m.record);
            let differs = if !a.labels().same_outputs(&b.labels()) {
                Some(format!(
                    "outputs ({} vs {})",
                    a.labels().describe(),
                    b.labels().describe()
                ))
            } else if a.channels != b.channels {
                Some(format!("channels ({:?} vs {:?})", a.channels, b.channels))
            } else if first.preprocessing != m.preprocessing {
                Some(
                    "preprocessing (target spacing, normalization or its statistics): members \
                     of one ensemble must read the same preprocessed volume"
                        .to_string(),
                )
            } else {
                None
            };
            if let Some(what) = differs {
                return Err(Error::Config(format!(
                    "{} and {}: the ensemble's models differ in {what}",
                    dirs[0].display(),
                    dir.display()
                )));
            }
        }
        models.push(m);
        if models.len() > 1 {
            // Checked: its weights come back case by case, one member's at a time.
            if let Some(last) = models.last_mut() {
                last.model = None;
            }
        }
    }
    if models.is_empty() {
        return Err(Error::Config("no model given".into()));
    }
    Ok(models)
}

#[cfg(test)]
mod tests {
    use super::non_finite;
    use candle_core::{Device, Tensor};

    #[test]
    fn large_finite_weights_are_finite_and_nan_is_not() {
        let big = Tensor::new(&[3.0e38f32, 3.0e38, -3.0e38, 1.0], &Device::Cpu).unwrap();
        assert_eq!(non_finite(&big).unwrap(), 0);
        let bad = Tensor::new(&[1.0f32, f32::NAN, f32::INFINITY], &Device::Cpu).unwrap();
        assert_eq!(non_finite(&bad).unwrap(), 2);
    }
}
