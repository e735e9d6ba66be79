//! nnU-Net's `dataset.json` of a trained model: channels, and classes or regions in the file's
//! order (nnU-Net orders regions by it).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{bad, read_json};
use crate::error::Result;
use crate::format::dataset_json::{check_region_labels, LabelClass};

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
    /// Read a results folder's `dataset.json`.
    pub fn read(path: &Path) -> Result<NnunetDataset> {
        let v = read_json(path)?;
        let ch = v
            .get("channel_names")
            .or_else(|| v.get("modality"))
            .and_then(Value::as_object)
            .ok_or_else(|| bad(path, "no channel_names"))?;
        let mut chans: Vec<(usize, String)> = Vec::new();
        for (k, n) in ch {
            let i = k.parse::<usize>().map_err(|_| {
                bad(
                    path,
                    format!("channel_names key {k:?} is not a channel index"),
                )
            })?;
            chans.push((i, n.as_str().unwrap_or("").to_string()));
        }
        chans.sort();
        if chans.iter().enumerate().any(|(i, (k, _))| i != *k) {
            return Err(bad(
                path,
                "channel_names must number the channels 0, 1, 2... without gaps",
            ));
        }
        let labels = v
            .get("labels")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(path, "no labels"))?;
        let value = |name: &str, x: &Value| -> Result<u16> {
            x.as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        path,
                        format!("label {name:?}: {x} is not a label value 0..65535"),
                    )
                })
        };
        let mut ignore_label = None;
        let mut entries: Vec<(String, Vec<u16>)> = Vec::new();
        for (name, x) in labels {
            if name == "ignore" {
                ignore_label = Some(value(name, x)?);
                continue;
            }
            let vals = match x {
                Value::Array(a) => a
                    .iter()
                    .map(|e| value(name, e))
                    .collect::<Result<Vec<_>>>()?,
                _ => vec![value(name, x)?],
            };
            if vals.is_empty() {
                return Err(bad(path, format!("label {name:?} lists no label values")));
            }
            entries.push((name.clone(), vals));
        }
        let order: Option<Vec<u16>> = match v.get("regions_class_order") {
            None | Some(Value::Null) => None,
            Some(o) => Some(
                serde_json::from_value(o.clone())
                    .map_err(|e| bad(path, format!("regions_class_order: {e}")))?,
            ),
        };
        let region_based = entries.iter().any(|(_, v)| v.len() > 1) || order.is_some();
        let outputs = if region_based {
            // Regions: every label but background, in the file's order (nnU-Net's).
            let regions: Vec<(String, Vec<u16>)> =
                entries.into_iter().filter(|(_, v)| v != &[0]).collect();
            let order = order.ok_or_else(|| {
                bad(
                    path,
                    "labels are regions (lists) but regions_class_order is missing",
                )
            })?;
            if order.len() != regions.len() {
                return Err(bad(
                    path,
                    format!(
                        "regions_class_order has {} entries for {} regions",
                        order.len(),
                        regions.len()
                    ),
                ));
            }
            let classes: Vec<LabelClass> = regions
                .iter()
                .map(|(name, values)| LabelClass {
                    name: name.clone(),
                    values: values.clone(),
                })
                .collect();
            check_region_labels(&classes).map_err(|e| bad(path, e))?;
            Outputs::Regions {
                order,
                names: regions.iter().map(|(n, _)| n.clone()).collect(),
                labels: regions.into_iter().map(|(_, v)| v).collect(),
            }
        } else {
            let mut classes: Vec<(u16, String)> =
                entries.into_iter().map(|(n, v)| (v[0], n)).collect();
            classes.sort();
            let values: Vec<u16> = classes.iter().map(|c| c.0).collect();
            // nnU-Net requires consecutive labels from 0.
            if values.iter().enumerate().any(|(i, &v)| usize::from(v) != i) {
                return Err(bad(
                    path,
                    format!("label values {values:?} are not 0, 1, 2... (nnU-Net's requirement)"),
                ));
            }
            Outputs::Classes {
                values,
                names: classes.into_iter().map(|c| c.1).collect(),
            }
        };
        if outputs.heads() < 1 {
            return Err(bad(path, "no labels to predict"));
        }
        Ok(NnunetDataset {
            path: path.to_path_buf(),
            channels: chans.into_iter().map(|c| c.1).collect(),
            outputs,
            file_ending: v
                .get("file_ending")
                .and_then(Value::as_str)
                .unwrap_or(".nii.gz")
                .to_string(),
            ignore_label,
            reader: v
                .get("overwrite_image_reader_writer")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}
