//! A run folder's records: `run.json` (what the run is: dataset, classes, the options that
//! shape its weights, the split) and each checkpoint's `state.json` (where it stopped).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The run folder's identity file.
pub const RUN_FILE: &str = "run.json";
/// A checkpoint's training state file.
pub const STATE_FILE: &str = "state.json";

/// Which cases train and which validate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Split {
    pub train: Vec<String>,
    pub val: Vec<String>,
}

/// `run.json`: compared on `--resume`, so a run is never continued with other settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub dataset: String,
    pub num_classes: usize,
    /// The training options that shape the weights (`TrainConfig::weight_shaping`).
    pub config: serde_json::Value,
    pub split: Split,
}

/// What a checkpoint records besides the optimizer counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StateExtra {
    pub dataset: Option<String>,
    pub num_classes: Option<usize>,
}

/// `state.json`: everything besides the tensors that a resumed run needs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TrainState {
    pub step: u64,
    pub optimizer_steps: u64,
    pub seed: u64,
    pub best_metric: Option<f64>,
    pub best_step: Option<u64>,
    /// The whole training configuration (`TrainConfig`).
    pub config: serde_json::Value,
    #[serde(default)]
    pub extra: StateExtra,
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Train(format!("{}: not a valid {what}: {e}", path.display())))
}

fn pretty<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(v).unwrap_or_default()
}

impl RunRecord {
    /// Read `path`; `Ok(None)` when there is no such file.
    pub fn read(path: &Path) -> Result<Option<RunRecord>> {
        match std::fs::read(path) {
            Ok(b) => parse(path, &b, "run record").map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        pretty(self)
    }
}

impl TrainState {
    pub fn read(path: &Path) -> Result<TrainState> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        parse(path, &bytes, "training state")
    }

    pub fn to_json(&self) -> Vec<u8> {
        pretty(self)
    }
}
