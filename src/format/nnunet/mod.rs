//! nnU-Net v2's results folder, read as nnU-Net writes it: `plans.json` (one configuration,
//! resolved through `inherits_from`), `dataset.json` (labels or regions, channel names, file
//! ending) and the folds' checkpoints. Only what inference needs is typed; every field used is
//! checked here, so the later stages see values that make sense, and a bad file is named.
//!
//! - [`plans`]: `plans.json`, one configuration resolved.
//! - [`dataset`]: `dataset.json`: channels, classes or regions.
//! - [`results`]: the results folder and its folds.
//! - [`output`]: the probability files nnU-Net writes beside a segmentation.
//! - [`pickle`]: the pickle inside a checkpoint, read within bounds, nothing run.
//! - [`torch_archive`]: a checkpoint's zip archive: its pickle and its tensors' bytes.

mod dataset;
pub mod output;
pub mod pickle;
mod plans;
mod results;
pub mod torch_archive;

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

pub use dataset::NnunetDataset;
pub use plans::{Architecture, Configuration, IntensityProperties, Plans, Resampling};
pub use results::{results_dir, NnunetPostprocessing, ResultsFolder};

/// The checkpoint nnU-Net writes at the end of training.
pub const CHECKPOINT_FINAL: &str = "checkpoint_final.pth";
/// The checkpoint with the best moving-average pseudo Dice.
pub const CHECKPOINT_BEST: &str = "checkpoint_best.pth";

/// Largest file read as JSON (plans of many configurations are tens of kB).
const MAX_JSON_BYTES: u64 = 64 << 20;

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Read a JSON file (a regular file of bounded size: [`crate::util::files::read_capped`]),
/// naming it on any failure.
fn read_json(path: &Path) -> Result<Value> {
    let bytes =
        crate::util::files::read_capped(path, MAX_JSON_BYTES).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => bad(path, e.to_string()),
            _ => Error::io(path, e),
        })?;
    serde_json::from_slice(&bytes).map_err(|e| bad(path, format!("not valid JSON: {e}")))
}

/// nnU-Net's image readers whose arrays are reproduced from NIfTI files (the voxels in (z, y, x)
/// order as stored); those that reorient first (`...WithReorient`) or read other formats are not.
pub const READERS: &[&str] = &["SimpleITKIO", "NibabelIO"];

/// The reader nnU-Net uses for a dataset: dataset.json's `overwrite_image_reader_writer` when it
/// names one (`dataset_reader`), else the plans'; refused unless one of [`READERS`].
pub fn reader_of(plans: &Plans, dataset_reader: Option<&str>) -> Result<String> {
    let reader = dataset_reader
        .unwrap_or(&plans.image_reader_writer)
        .to_string();
    if !READERS.contains(&reader.as_str()) {
        return Err(bad(
            &plans.path,
            format!(
                "image reader {reader}: only {} are reproduced (NIfTI voxels as stored)",
                READERS.join(" and ")
            ),
        ));
    }
    Ok(reader)
}
