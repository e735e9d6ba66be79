//! nnU-Net's `dataset.json` of a trained model: channels, and classes or regions in the file's
//! order (nnU-Net orders regions by it).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{bad, read_json};
use crate::error::Result;
use crate::format::dataset_json::{DatasetDescription, LabelClass};

/// What the network's outputs mean.
#[derive(Clone, Debug, PartialEq)]
pub enum Outputs {
    /// Softmax over classes; output k is label value `values[k]` (0 = background first).
    Classes {
        /// Label value of each output, ascending.
        values: Vec<u16>,
        /// Their names.
        names: Vec<String>,
    },
    /// One sigmoid per region; a voxel gets `order[k]` where region k passes 0.5, later
    /// regions written over earlier ones.
    Regions {
        /// The label value written for each region.
        order: Vec<u16>,
        /// The labels each region is made of.
        labels: Vec<Vec<u16>>,
        /// Their names.
        names: Vec<String>,
    },
}

impl Outputs {
    /// Network output channels.
    pub fn heads(&self) -> usize {
        match self {
            Outputs::Classes { values, .. } => values.len(),
            Outputs::Regions { order, .. } => order.len(),
        }
    }

    /// The label value of one voxel from its heads' probabilities (softmax or sigmoid): the
    /// class of the largest (the first of equal maxima, as argmax), or the last region in
    /// `order` whose probability passes 0.5 (background where none does).
    pub fn label(&self, p: &[f32]) -> u16 {
        let (mut best, mut label) = (f32::NEG_INFINITY, 0);
        for (head, &x) in p.iter().enumerate() {
            self.vote(head, x, &mut best, &mut label);
        }
        label
    }

    /// One head's say in a voxel's label, heads taken in output order: [`Self::label`]'s rule
    /// for callers that hold one head's probabilities at a time. Start with `best` at
    /// negative infinity and `label` 0.
    pub fn vote(&self, head: usize, p: f32, best: &mut f32, label: &mut u16) {
        match self {
            Outputs::Classes { values, .. } => {
                // Strictly greater: on a tie the lower class wins, as argmax does.
                if p > *best {
                    *best = p;
                    *label = values.get(head).copied().unwrap_or(0);
                }
            }
            Outputs::Regions { order, .. } => {
                if p > 0.5 {
                    *label = order.get(head).copied().unwrap_or(0);
                }
            }
        }
    }

    /// Whether the heads are sigmoids (regions) rather than a softmax (classes).
    pub fn is_regions(&self) -> bool {
        matches!(self, Outputs::Regions { .. })
    }

    /// The label values or value sets that are scored, background left out: each class, or
    /// each region's labels.
    pub fn scored(&self) -> Vec<(String, Vec<u16>)> {
        match self {
            Outputs::Classes { values, names } => values
                .iter()
                .zip(names)
                .filter(|(v, _)| **v != 0)
                .map(|(v, n)| (n.clone(), vec![*v]))
                .collect(),
            Outputs::Regions { labels, names, .. } => {
                names.iter().cloned().zip(labels.iter().cloned()).collect()
            }
        }
    }

    /// The largest label value written.
    pub fn max_value(&self) -> u16 {
        match self {
            Outputs::Classes { values, .. } => values.iter().copied().max().unwrap_or(0),
            Outputs::Regions { order, .. } => order.iter().copied().max().unwrap_or(0),
        }
    }
}

/// nnU-Net's `dataset.json` of a trained model.
#[derive(Clone, Debug, PartialEq)]
pub struct NnunetDataset {
    /// The file.
    pub path: PathBuf,
    /// Channel names by index.
    pub channels: Vec<String>,
    /// Classes or regions.
    pub outputs: Outputs,
    /// File ending of the images (`.nii.gz`).
    pub file_ending: String,
    /// The ignore label, if any (it is never predicted).
    pub ignore_label: Option<u16>,
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
        let outputs = if d.has_regions() {
            d.check_regions().map_err(|e| bad(path, e))?;
            // Regions: every label but background, in the file's order (nnU-Net's).
            let regions: Vec<&LabelClass> = d.labels.iter().filter(|c| c.values != [0]).collect();
            Outputs::Regions {
                order: d.regions_class_order.clone().unwrap_or_default(),
                names: regions.iter().map(|c| c.name.clone()).collect(),
                labels: regions.iter().map(|c| c.values.clone()).collect(),
            }
        } else {
            // A model's outputs are its label values 0, 1, 2... (nnU-Net refuses a dataset with
            // a gap, so its models never have one; ours map any values through run.json).
            if d.labels
                .iter()
                .enumerate()
                .any(|(i, c)| c.values != [i as u16])
            {
                let values: Vec<u16> = d.labels.iter().map(|c| c.values[0]).collect();
                return Err(bad(
                    path,
                    format!("label values {values:?} are not 0, 1, 2... (nnU-Net's requirement)"),
                ));
            }
            Outputs::Classes {
                values: d.labels.iter().map(|c| c.values[0]).collect(),
                names: d.labels.iter().map(|c| c.name.clone()).collect(),
            }
        };
        Ok(NnunetDataset {
            path: path.to_path_buf(),
            channels: d.channels,
            outputs,
            file_ending: d.file_ending.unwrap_or_else(|| ".nii.gz".to_string()),
            ignore_label: d.ignore_label,
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
        assert_eq!(ok.outputs.heads(), 2);
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
        assert!(r.outputs.is_regions());
        // A model's own: channel names, and classes without a gap.
        assert!(read(json!({"labels": {"background": 0}}))
            .unwrap_err()
            .contains("channel_names"));
        let e = read(json!({"channel_names": ch, "labels": {"background": 0, "a": 2}}));
        assert!(e.unwrap_err().contains("0, 1, 2"));
    }
}
