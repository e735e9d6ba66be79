//! `dataset.json`: as `prep synth` writes it (nnU-Net v2 layout: the dataset's name, channels,
//! label names and case count, plus the generator's own record of each case), and as users'
//! nnU-Net v2 and Medical Segmentation Decathlon datasets hold it ([`DatasetDescription`]).

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
    /// Label name -> value in the label files, or -> the values of a region, in file order.
    pub labels: serde_json::Map<String, serde_json::Value>,
    /// The label each region is written as (region datasets only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions_class_order: Option<Vec<u16>>,
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

/// What a `dataset.json` says, read from either layout voxcache meets: nnU-Net v2
/// (`channel_names`, `labels` name -> value or region list, `file_ending`, `numTraining`) or the
/// Medical Segmentation Decathlon's (`modality`, `labels` value -> name, `training` pairs,
/// `test`). Everything voxcache does not use is ignored; what it uses is checked. The one
/// reader of the file: a dataset's and a trained nnU-Net model's
/// ([`super::nnunet::NnunetDataset`]) go through the same rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetDescription {
    /// "nnU-Net v2" or "Medical Segmentation Decathlon".
    pub layout: String,
    /// The dataset's name, if given.
    pub name: Option<String>,
    /// Channel names in channel order (`_0000`, `_0001`...): nnU-Net picks normalization by them.
    pub channels: Vec<String>,
    /// Label classes in value order. A region (nnU-Net) lists several values.
    pub labels: Vec<LabelClass>,
    /// nnU-Net's `ignore` label: voxels of this value are not annotated.
    pub ignore_label: Option<u16>,
    /// Extension of every image and label file, e.g. ".nii.gz" (nnU-Net).
    pub file_ending: Option<String>,
    /// Training cases the file counts.
    pub num_training: Option<usize>,
    /// nnU-Net's `regions_class_order` of a region dataset: the label value each region (the
    /// classes after background, in `labels` order) is written as when a segmentation is made
    /// from region outputs, later regions over earlier ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions_class_order: Option<Vec<u16>>,
    /// MSD: (image, label) paths of the training cases, relative to the dataset folder (not
    /// kept in the manifest: thousands of cases would swell it).
    #[serde(skip)]
    pub training: Vec<(String, String)>,
}

/// One label class of a dataset.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LabelClass {
    /// Its name ("background", "liver"...).
    pub name: String,
    /// The label-file values it stands for: one, or several for an nnU-Net region.
    pub values: Vec<u16>,
}

impl std::fmt::Display for LabelClass {
    /// "vessel 1", or "tumour 1+2+3" for a region.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v: Vec<String> = self.values.iter().map(|v| v.to_string()).collect();
        write!(f, "{} {}", self.name, v.join("+"))
    }
}

impl DatasetDescription {
    /// Whether any class is a region (several values, as BraTS's whole tumour).
    pub fn has_regions(&self) -> bool {
        self.labels.iter().any(|c| c.values.len() > 1)
    }

    /// Read and check `path`; the error names the file and the field.
    pub fn read(path: &std::path::Path) -> crate::error::Result<Self> {
        let bad = |m: String| crate::error::Error::Dataset(format!("{}: {m}", path.display()));
        let bytes = crate::util::files::read_capped(path, 256 << 20)
            .map_err(|e| crate::error::Error::io(path, e))?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        Self::from_value(&v).map_err(bad)
    }

    /// The checks of [`Self::read`], on parsed JSON.
    pub fn from_value(v: &serde_json::Value) -> std::result::Result<Self, String> {
        let obj = v.as_object().ok_or("the top level is not a JSON object")?;
        let msd = obj.contains_key("modality") || obj.contains_key("training");
        let channels_field = if msd { "modality" } else { "channel_names" };
        let channels = match obj.get(channels_field) {
            None => Vec::new(),
            Some(c) => indexed_names(c).map_err(|e| format!("{channels_field}: {e}"))?,
        };
        if obj.contains_key(channels_field) && channels.is_empty() {
            return Err(format!(
                "{channels_field} is empty: name each image channel ({{\"0\": \"CT\"}})"
            ));
        }
        let labels_v = obj.get("labels").ok_or("no \"labels\"")?;
        let labels_o = labels_v.as_object().ok_or("\"labels\" is not an object")?;
        let mut labels = Vec::new();
        let mut ignore_label = None;
        for (k, val) in labels_o {
            // MSD writes value -> name; nnU-Net v2 name -> value (or a list: a region).
            let (name, values) = match val {
                serde_json::Value::String(name) => {
                    let value = k.parse::<u16>().map_err(|_| {
                        format!("labels: key {k:?} is not a label value (0..65535)")
                    })?;
                    (name.clone(), vec![value])
                }
                serde_json::Value::Array(a) if a.is_empty() => {
                    return Err(format!("labels: region {k:?} lists no label value"))
                }
                serde_json::Value::Array(a) => (
                    k.clone(),
                    a.iter()
                        .map(label_value)
                        .collect::<std::result::Result<_, _>>()?,
                ),
                other => (k.clone(), vec![label_value(other)?]),
            };
            if name == "ignore" {
                if values.len() != 1 {
                    return Err("labels: \"ignore\" must be one value".into());
                }
                ignore_label = Some(values[0]);
                continue;
            }
            labels.push(LabelClass { name, values });
        }
        // More classes than any network here outputs: refused before anything is sized by it.
        if labels.len() > MAX_LABELS {
            return Err(format!(
                "labels: {} classes (at most {MAX_LABELS})",
                labels.len()
            ));
        }
        let regions = labels.iter().any(|c| c.values.len() > 1);
        if regions {
            check_region_labels(labels.iter().filter(|c| c.values != [0]))?;
        }
        // Regions keep the file's order (regions_class_order follows it); classes go by value.
        if regions {
            labels.sort_by_key(|c| c.values != [0]);
        } else {
            labels.sort_by_key(|c| c.values.clone());
        }
        let regions_class_order = match obj.get("regions_class_order") {
            None => None,
            Some(v) => Some(
                v.as_array()
                    .ok_or("\"regions_class_order\" is not a list of label values")?
                    .iter()
                    .map(label_value)
                    .collect::<std::result::Result<Vec<u16>, String>>()
                    .map_err(|e| format!("regions_class_order: {e}"))?,
            ),
        };
        let mut seen = std::collections::BTreeSet::new();
        for c in &labels {
            // A region may reuse its members' values; a plain class may not repeat one.
            if c.values.len() == 1 && !seen.insert(c.values[0]) {
                return Err(format!("labels: value {} is given twice", c.values[0]));
            }
        }
        if !labels.iter().any(|c| c.values == [0]) {
            return Err("labels: no background class with value 0".into());
        }
        if let Some(i) = ignore_label {
            if labels.iter().any(|c| c.values.iter().any(|&v| v >= i)) {
                return Err(format!(
                    "labels: the ignore label ({i}) must be above every class value"
                ));
            }
        }
        let file_ending = match obj.get("file_ending") {
            None => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("\"file_ending\" is not a string".into()),
        };
        let num_training = match obj.get("numTraining") {
            None => None,
            Some(n) => Some(n.as_u64().ok_or("\"numTraining\" is not a whole number")? as usize),
        };
        let mut training = Vec::new();
        if let Some(t) = obj.get("training") {
            let items = t.as_array().ok_or("\"training\" is not a list")?;
            for (i, it) in items.iter().enumerate() {
                let field = |k: &str| {
                    it.get(k)
                        .and_then(|s| s.as_str())
                        .map(str::to_string)
                        .ok_or(format!("training[{i}] has no \"{k}\" path"))
                };
                training.push((field("image")?, field("label")?));
            }
        }
        Ok(DatasetDescription {
            layout: if msd {
                "Medical Segmentation Decathlon"
            } else {
                "nnU-Net v2"
            }
            .to_string(),
            name: obj.get("name").and_then(|n| n.as_str()).map(str::to_string),
            channels,
            labels,
            ignore_label,
            file_ending,
            num_training,
            regions_class_order,
            training,
        })
    }
}

impl DatasetDescription {
    /// For a region dataset, what training and prediction need beyond what scoring does: see
    /// [`check_regions`]. A dataset without regions passes.
    pub fn check_regions(&self) -> std::result::Result<(), String> {
        match self.has_regions() {
            true => check_regions(&self.labels, self.regions_class_order.as_deref()),
            false => Ok(()),
        }
    }
}

/// The regions of a region dataset (`labels`, background first) against `regions_class_order`:
/// one order value per region, no region holding background, and every label value written
/// back as itself (the last region holding it, in order, is written as it), so a segmentation
/// made from the regions is the label map they came from.
fn check_regions(labels: &[LabelClass], order: Option<&[u16]>) -> std::result::Result<(), String> {
    let regions: Vec<&LabelClass> = labels.iter().filter(|c| c.values != [0]).collect();
    let names: Vec<String> = regions.iter().map(|c| c.to_string()).collect();
    let Some(order) = order else {
        return Err(format!(
            "labels define regions ({}) but there is no regions_class_order: give the label value each region is written as, in the regions' order",
            names.join(", ")
        ));
    };
    if order.len() != regions.len() {
        return Err(format!(
            "regions_class_order has {} values for {} regions ({})",
            order.len(),
            regions.len(),
            names.join(", ")
        ));
    }
    check_region_labels(regions.iter().copied())?;
    let values: std::collections::BTreeSet<u16> = regions
        .iter()
        .flat_map(|c| c.values.iter().copied())
        .collect();
    for v in values {
        let last = (0..regions.len())
            .rev()
            .find(|&i| regions[i].values.contains(&v));
        if let Some(i) = last.filter(|&i| order[i] != v) {
            return Err(format!(
                "regions and regions_class_order disagree: label {v} would be written back as {} (region {} is the last holding it, and regions_class_order gives it {}); order the regions so that each label's last region is written as that label",
                order[i], regions[i], order[i]
            ));
        }
    }
    Ok(())
}

/// The one check of regions that every command makes wherever regions come from (a
/// dataset.json, `evaluate --labels`, a run record, an nnU-Net model's dataset.json): each
/// region lists at least one label and none holds 0, the background (a region holding it
/// covers every voxel, and its Dice would be 1 in every case).
pub fn check_region_labels<'a>(
    regions: impl IntoIterator<Item = &'a LabelClass>,
) -> std::result::Result<(), String> {
    for r in regions {
        if r.values.is_empty() {
            return Err(format!("labels: region {:?} lists no label value", r.name));
        }
        if r.values.contains(&0) {
            return Err(format!(
                "labels: region {r} holds 0, the background: a region is a set of foreground labels (nnU-Net's regions never hold 0)"
            ));
        }
    }
    Ok(())
}

/// The most classes a dataset.json may declare (a network's head beyond it is not built).
pub const MAX_LABELS: usize = 4096;

/// A label value: a whole number from 0 to 65535.
fn label_value(v: &serde_json::Value) -> std::result::Result<u16, String> {
    v.as_u64()
        .and_then(|n| u16::try_from(n).ok())
        .ok_or(format!("labels: {v} is not a label value (0..65535)"))
}

/// `{"0": "CT", "1": "T2"}` as names in index order; the indices must be 0..n-1.
fn indexed_names(v: &serde_json::Value) -> std::result::Result<Vec<String>, String> {
    let o = v.as_object().ok_or("not an object of index -> name")?;
    let mut by_index = BTreeMap::new();
    for (k, name) in o {
        let i: usize = k
            .parse()
            .map_err(|_| format!("key {k:?} is not a channel index"))?;
        let name = name
            .as_str()
            .ok_or(format!("channel {k} has no name string"))?;
        by_index.insert(i, name.to_string());
    }
    if by_index.keys().copied().ne(0..by_index.len()) {
        return Err(format!(
            "channel indices {:?} are not 0..{}",
            by_index.keys().collect::<Vec<_>>(),
            by_index.len().saturating_sub(1)
        ));
    }
    Ok(by_index.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nnunet_v2_with_regions_and_an_ignore_label() {
        let d = DatasetDescription::from_value(&json!({
            "channel_names": {"1": "T1", "0": "FLAIR", "2": "T1w", "3": "T2w"},
            "labels": {"background": 0, "whole tumor": [1, 2, 3], "tumor core": [2, 3],
                        "enhancing tumor": 3, "ignore": 4},
            "regions_class_order": [1, 2, 3],
            "numTraining": 484, "file_ending": ".nii.gz"
        }))
        .unwrap();
        assert_eq!(d.layout, "nnU-Net v2");
        assert_eq!(d.channels, ["FLAIR", "T1", "T1w", "T2w"]);
        assert_eq!(d.ignore_label, Some(4));
        assert!(d.has_regions());
        assert_eq!(
            crate::format::labels::FileLabels::of(&d)
                .values()
                .into_iter()
                .collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(
            (d.num_training, d.file_ending.as_deref()),
            (Some(484), Some(".nii.gz"))
        );
    }

    #[test]
    fn regions_keep_the_file_order_and_must_agree_with_regions_class_order() {
        let read = |labels: serde_json::Value, order: serde_json::Value| {
            let d = DatasetDescription::from_value(&json!({
                "channel_names": {"0": "T1"}, "labels": labels, "regions_class_order": order
            }))?;
            d.check_regions().map(|()| d)
        };
        // Enhancing first in the file: the file's order is the regions' order.
        let d = read(
            json!({"background": 0, "enhancing": [3], "core": [2, 3], "whole": [1, 2, 3]}),
            json!([3, 2, 1]),
        );
        // Labels 2 and 3 are last held by "whole", written as 1: they would not come back.
        assert!(d
            .unwrap_err()
            .contains("label 2 would be written back as 1"));
        let d = read(
            json!({"background": 0, "whole": [1, 2, 3], "core": [2, 3], "enhancing": [3]}),
            json!([1, 2, 3]),
        )
        .unwrap();
        let names: Vec<&str> = d.labels.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["background", "whole", "core", "enhancing"]);
        assert_eq!(d.regions_class_order.as_deref(), Some(&[1, 2, 3][..]));
        let err = |labels, order| read(labels, order).unwrap_err();
        let brats = json!({"background": 0, "whole": [1, 2, 3], "core": [2, 3], "enhancing": [3]});
        assert!(err(brats.clone(), json!([1, 2])).contains("2 values for 3 regions"));
        assert!(
            err(json!({"background": 0, "a": [], "b": [1, 2]}), json!([1]))
                .contains("region \"a\" lists no label")
        );
        assert!(err(
            json!({"background": 0, "a": [0, 1], "b": [1, 2]}),
            json!([1, 2])
        )
        .contains("holds 0"));
        let none = DatasetDescription::from_value(&json!({"labels": brats}))
            .unwrap()
            .check_regions()
            .unwrap_err();
        assert!(none.contains("no regions_class_order"), "{none}");
    }

    #[test]
    fn msd_layout_reads_values_to_names_and_training_pairs() {
        let d = DatasetDescription::from_value(&json!({
            "name": "Prostate", "modality": {"0": "T2", "1": "ADC"},
            "labels": {"0": "background", "1": "PZ", "2": "TZ"},
            "numTraining": 1, "numTest": 0,
            "training": [{"image": "./imagesTr/prostate_00.nii.gz",
                          "label": "./labelsTr/prostate_00.nii.gz"}],
            "test": []
        }))
        .unwrap();
        assert_eq!(d.layout, "Medical Segmentation Decathlon");
        assert_eq!(d.channels, ["T2", "ADC"]);
        let names: Vec<(&str, Vec<u16>)> = d
            .labels
            .iter()
            .map(|c| (c.name.as_str(), c.values.clone()))
            .collect();
        assert_eq!(
            names,
            [("background", vec![0]), ("PZ", vec![1]), ("TZ", vec![2])]
        );
        assert_eq!(d.training.len(), 1);
    }

    #[test]
    fn what_cannot_be_right_is_refused_by_field() {
        let err = |v: serde_json::Value| DatasetDescription::from_value(&v).unwrap_err();
        assert!(err(json!({"labels": {"vessel": 1}})).contains("background"));
        assert!(err(json!({"labels": {"background": 0, "a": 1, "b": 1}})).contains("twice"));
        assert!(err(json!({"labels": {"background": 0, "a": 70000}})).contains("70000"));
        assert!(err(json!({"labels": {"background": 0, "a": 2, "ignore": 1}})).contains("ignore"));
        assert!(err(
            json!({"channel_names": {"0": "CT", "2": "PET"}, "labels": {"background": 0}})
        )
        .contains("channel_names"));
        assert!(err(json!({"file_ending": 3, "labels": {"background": 0}})).contains("file_ending"));
        assert!(err(json!([1, 2])).contains("object"));
        assert!(err(json!({"channel_names": {"0": "CT"}})).contains("labels"));
        assert!(
            err(json!({"channel_names": {}, "labels": {"background": 0, "a": 1}}))
                .contains("channel_names is empty")
        );
        let many: serde_json::Map<String, serde_json::Value> =
            (0..5000).map(|v| (format!("c{v}"), json!(v))).collect();
        assert!(err(json!({"labels": many})).contains("5000 classes"));
    }

    #[test]
    fn the_synthetic_datasets_own_file_reads() {
        let text = include_str!("../../data/vessels/dataset.json");
        let d = DatasetDescription::from_value(&serde_json::from_str(text).unwrap()).unwrap();
        assert_eq!(d.channels, ["two-photon"]);
        assert_eq!(
            crate::format::labels::FileLabels::of(&d)
                .values()
                .into_iter()
                .collect::<Vec<_>>(),
            [0, 1]
        );
    }
}
