//! `dataset.json` in the nnU-Net v2 layout, as `prep synth` writes it: the dataset's name,
//! channels, label names and case count, plus the generator's own record of each case.
//! (Reading users' nnU-Net and Medical Segmentation Decathlon files is for the dataset stage.)

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One generated case: its id and grid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SynthCaseRecord {
    /// Case id (the file name stem before `_0000`).
    pub id: String,
    /// Voxels along (x, y, z).
    pub shape_xyz: [usize; 3],
    /// Spacing (x, y, z) in micrometres.
    pub spacing_xyz: [f64; 3],
}

/// The file. Fields are in the order nnU-Net's own files use (and earlier versions wrote).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetJson {
    /// The dataset's name.
    pub name: String,
    /// A sentence about where the data comes from.
    pub description: String,
    /// Channel index ("0", "1"...) -> channel name (nnU-Net picks normalization by name).
    pub channel_names: BTreeMap<String, String>,
    /// Label name -> value in the label files.
    pub labels: BTreeMap<String, u16>,
    /// Cases in imagesTr/.
    #[serde(rename = "numTraining")]
    pub num_training: usize,
    /// Extension of every image and label file, e.g. ".nii.gz".
    pub file_ending: String,
    /// voxcache's extension: every case the generator made.
    pub cases: Vec<SynthCaseRecord>,
}

impl DatasetJson {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}
