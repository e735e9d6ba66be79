//! nnU-Net's `dataset.json` of a trained model: channels, and classes or regions in the file's
//! order (nnU-Net orders regions by it).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{bad, read_json};
use crate::error::Result;
use crate::format::dataset_json::DatasetDescription;
use crate::format::labels::Labels;

/// nnU-Net's `dataset.json` of a trained model.
#[derive(Clone, Debug, PartialEq)]
pub struct NnunetDataset {
    /// The file.
    pub path: PathBuf,
    /// Channel names by index.
    pub channels: Vec<String>,
    /// Classes or regions, and the ignore label (never predicted).
    pub labels: Labels,
    /// File ending of the images (`.nii.gz`).
    pub file_ending: String,
    /// `overwrite_image_reader_writer`, when the dataset names its reader itself.
    pub reader: Option<String>,
}

impl NnunetDataset {
    /// Read a results folder's `dataset.json`: the rules of every dataset.json
    /// ([`DatasetDescription`]), and what a model's must have besides: channel names, and
    /// class values without a gap.
    pub fn read(path: &Path) -> Result<NnunetDataset> {
        let v = read_json(path)?;
        let d = DatasetDescription::from_value(&v).map_err(|e| bad(path, e))?;
        if d.channels.is_empty() {
            return Err(bad(path, "no channel_names"));
        }
        // A model's outputs are its label values 0, 1, 2... (nnU-Net refuses a dataset with a
        // gap, so its models never have one; ours map any values through run.json).
        if !d.has_regions()
            && d.labels
                .iter()
                .enumerate()
                .any(|(i, c)| c.values != [i as u16])
        {
            let values: Vec<u16> = d.labels.iter().flat_map(|c| c.values.clone()).collect();
            return Err(bad(
                path,
                format!("label values {values:?} are not 0, 1, 2... (nnU-Net's requirement)"),
            ));
        }
        // Regions: every label but background, in the file's order (nnU-Net's).
        let labels = Labels::from_description(&d).map_err(|e| bad(path, e))?;
        Ok(NnunetDataset {
            path: path.to_path_buf(),
            channels: d.channels,
            labels,
            file_ending: d.file_ending.unwrap_or_else(|| ".nii.gz".to_string()),
            reader: v
                .get("overwrite_image_reader_writer")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: serde_json::Value) -> std::result::Result<NnunetDataset, String> {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("dataset.json");
        std::fs::write(&p, v.to_string()).unwrap();
        NnunetDataset::read(&p).map_err(|e| e.to_string())
    }

    /// A model's dataset.json meets every rule of a dataset's (one reader), and a model's own.
    #[test]
    fn a_models_dataset_json_has_the_rules_of_every_dataset_json() {
        let ch = json!({"0": "CT"});
        let ok =
            read(json!({"channel_names": ch, "labels": {"background": 0, "liver": 1}})).unwrap();
        assert_eq!(ok.labels.heads(), 2);
        // The dataset reader's rules: the ignore label above every class, no doubled value.
        let e =
            read(json!({"channel_names": ch, "labels": {"background": 0, "a": 2, "ignore": 1}}));
        assert!(e.unwrap_err().contains("ignore label"));
        let e = read(json!({"channel_names": ch, "labels": {"background": 0, "a": 1, "b": 1}}));
        assert!(e.unwrap_err().contains("twice"));
        // Regions: an order that would not write each label back as itself.
        let e = read(json!({"channel_names": ch,
            "labels": {"background": 0, "whole": [1, 2], "core": [2]},
            "regions_class_order": [2, 1]}));
        assert!(e.unwrap_err().contains("disagree"));
        let r = read(json!({"channel_names": ch,
            "labels": {"background": 0, "whole": [1, 2], "core": [2]},
            "regions_class_order": [1, 2]}))
        .unwrap();
        assert!(r.labels.is_regions());
        // A model's own: channel names, and classes without a gap.
        assert!(read(json!({"labels": {"background": 0}}))
            .unwrap_err()
            .contains("channel_names"));
        let e = read(json!({"channel_names": ch, "labels": {"background": 0, "a": 2}}));
        assert!(e.unwrap_err().contains("0, 1, 2"));
    }
}
