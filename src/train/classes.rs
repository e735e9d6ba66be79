//! The run's classes: which label-file values the network's outputs stand for. Labels need not
//! be consecutive (BraTS's 0, 1, 2, 4): the values found are mapped to classes 0..K in value
//! order, background first, and the mapping is recorded with the run. A dataset.json names the
//! classes and may give an ignore label: its voxels are left out of the loss and of Dice
//! (nnU-Net's semantics).

use crate::error::{Error, Result};
use crate::format::dataset_json::DatasetDescription;
use crate::format::labels::Labels;
pub use crate::format::run::ClassInfo;

/// A label voxel that no class stands for (the ignore label) after [`ClassMap::map`].
pub const IGNORE: u16 = u16::MAX;

/// Most output classes (background included) a run accepts: beyond that a label value is
/// almost surely an instance id, not a class.
pub const MAX_CLASSES: usize = 64;

/// Label-file values to output classes.
#[derive(Clone, Debug)]
pub struct ClassMap {
    classes: Vec<ClassInfo>,
    /// What the heads stand for, in label-file values, and the ignore label.
    labels: Labels,
    /// Value -> class index, or [`IGNORE`]; values no class stands for map to `None`.
    table: Vec<Option<u16>>,
    /// A region dataset's regions as class indices.
    region_classes: Vec<Vec<u16>>,
}

impl ClassMap {
    /// The classes of a dataset from the label values its cases hold (`present`) and its
    /// dataset.json, if any (which names them, may add classes no case holds yet, and gives the
    /// ignore label). `where_` names the dataset in errors.
    pub fn new(
        present: &std::collections::BTreeSet<u16>,
        described: Option<&DatasetDescription>,
        where_: &str,
    ) -> Result<Self> {
        let ignore = described.and_then(|d| d.ignore_label);
        let mut classes: Vec<ClassInfo> = match described {
            Some(d) => {
                if d.has_regions() {
                    return Self::of_regions(present, d, where_);
                }
                d.labels
                    .iter()
                    .map(|c| ClassInfo {
                        value: c.values[0],
                        name: c.name.clone(),
                    })
                    .collect()
            }
            None => present
                .iter()
                .filter(|&&v| Some(v) != ignore)
                .map(|&v| ClassInfo {
                    value: v,
                    name: if v == 0 {
                        "background".into()
                    } else {
                        format!("class {v}")
                    },
                })
                .collect(),
        };
        classes.sort_by_key(|c| c.value);
        if classes.first().is_none_or(|c| c.value != 0) {
            classes.insert(
                0,
                ClassInfo {
                    value: 0,
                    name: "background".into(),
                },
            );
        }
        // A dataset.json that declares nothing to learn is a mistake, not a binary task whose
        // "class 1" would be its ignore label or a value it never names.
        if classes.len() < 2 && described.is_some() {
            return Err(Error::Config(format!(
                "{where_}: dataset.json declares no class to learn, only background{}: add the foreground labels",
                ignore.map(|i| format!(" and the ignore label {i}")).unwrap_or_default()
            )));
        }
        // Labels without a dataset.json: a binary network at least.
        if classes.len() < 2 {
            classes.push(ClassInfo {
                value: 1,
                name: "class 1".into(),
            });
        }
        if classes.len() > MAX_CLASSES {
            return Err(Error::Config(format!(
                "{where_}: {} label values ({}...); the trainer takes at most {MAX_CLASSES} classes (an instance map, or an ignore label not declared in dataset.json?)",
                classes.len(),
                classes.iter().take(8).map(|c| c.value.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        let labels = Labels::of_classes(classes.clone(), ignore)
            .map_err(|e| Error::Config(format!("{where_}: {e}")))?;
        Self::with_table(classes, labels, present, where_)
    }

    /// A region dataset's map: the label values its regions hold are the classes labels map
    /// to, and the network has one sigmoid output per region.
    fn of_regions(
        present: &std::collections::BTreeSet<u16>,
        d: &DatasetDescription,
        where_: &str,
    ) -> Result<Self> {
        let labels = Labels::from_description(d)
            .map_err(|e| Error::Config(format!("{where_}: dataset.json: {e}")))?;
        let mut values: Vec<u16> = labels.foreground_values();
        values.insert(0, 0);
        let classes = values
            .into_iter()
            .map(|v| ClassInfo {
                value: v,
                name: match v {
                    0 => "background".into(),
                    v => format!("label {v}"),
                },
            })
            .collect();
        Self::with_table(classes, labels, present, where_)
    }

    fn with_table(
        classes: Vec<ClassInfo>,
        labels: Labels,
        present: &std::collections::BTreeSet<u16>,
        where_: &str,
    ) -> Result<Self> {
        let mut table = vec![None; 1 << 16];
        for (i, c) in classes.iter().enumerate() {
            table[c.value as usize] = Some(i as u16);
        }
        if let Some(i) = labels.ignore() {
            table[i as usize] = Some(IGNORE);
        }
        let region_classes = labels
            .regions()
            .iter()
            .map(|r| r.values.iter().filter_map(|&v| table[v as usize]).collect())
            .collect();
        let map = ClassMap {
            classes,
            labels,
            table,
            region_classes,
        };
        if let Some(v) = present.iter().find(|&&v| map.table[v as usize].is_none()) {
            let what = match map.labels.is_regions() {
                false => "classes",
                true => "regions' labels",
            };
            return Err(Error::Config(format!(
                "{where_}: label value {v} is in the cache but not among dataset.json's {what}"
            )));
        }
        Ok(map)
    }

    /// Each region's classes (indices into [`Self::classes`]), as [`Self::map`] maps labels.
    pub fn region_classes(&self) -> &[Vec<u16>] {
        &self.region_classes
    }

    /// What the outputs stand for, in label-file values (regions written in the dataset's
    /// `regions_class_order`), and the ignore label.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// Names of what is scored, in output order: the classes after background, or the
    /// regions.
    pub fn scored_names(&self) -> Vec<String> {
        match self.labels.is_regions() {
            false => self.foreground_names(),
            true => self.labels.head_names(),
        }
    }

    /// Output classes, background first.
    pub fn classes(&self) -> &[ClassInfo] {
        &self.classes
    }

    /// Names of the classes after background, in output order (as Dice lists them).
    pub fn foreground_names(&self) -> Vec<String> {
        self.classes[1..].iter().map(|c| c.name.clone()).collect()
    }

    /// Number of output classes.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Never: there are at least two classes.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// Label-file values to class indices in place; the ignore label becomes [`IGNORE`]. A
    /// value no class stands for is an error (the cache changed under the run).
    pub fn map(&self, labels: &mut [u16]) -> Result<()> {
        for l in labels.iter_mut() {
            match self.table[*l as usize] {
                Some(c) => *l = c,
                None => {
                    return Err(Error::Train(format!(
                        "label value {l} is not one of the run's classes ({})",
                        self.classes
                            .iter()
                            .map(|c| c.value.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )))
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn values_that_skip_are_mapped_in_order() {
        let present: BTreeSet<u16> = [0, 1, 2, 4].into();
        let m = ClassMap::new(&present, None, "d").unwrap();
        assert_eq!(m.len(), 4);
        let mut l = vec![0, 4, 2, 1, 4];
        m.map(&mut l).unwrap();
        assert_eq!(l, [0, 3, 2, 1, 3]);
        assert!(m.map(&mut [3]).is_err());
    }

    #[test]
    fn dataset_json_names_classes_and_gives_the_ignore_label() {
        let d = DatasetDescription::from_value(&serde_json::json!({
            "labels": {"background": 0, "vessel": 1, "wall": 3, "ignore": 9}
        }))
        .unwrap();
        let present: BTreeSet<u16> = [0, 1, 9].into();
        let m = ClassMap::new(&present, Some(&d), "d").unwrap();
        let names: Vec<&str> = m.classes().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["background", "vessel", "wall"]);
        let mut l = vec![9, 3, 1, 0];
        m.map(&mut l).unwrap();
        assert_eq!(l, [IGNORE, 2, 1, 0]);
        assert_eq!(m.labels().ignore(), Some(9));
        let region = DatasetDescription::from_value(&serde_json::json!({
            "labels": {"background": 0, "tumour": [1, 2], "core": 2},
            "regions_class_order": [1, 2]
        }))
        .unwrap();
        let m = ClassMap::new(&[0, 1, 2].into(), Some(&region), "d").unwrap();
        assert_eq!((m.len(), m.labels().heads()), (3, 2));
        assert_eq!(m.region_classes(), [vec![1, 2], vec![2]]);
        let o = m.labels();
        assert_eq!(o.label(&[0.9, 0.2]), 1);
        assert_eq!(o.label(&[0.9, 0.7]), 2);
        assert_eq!(o.label(&[0.1, 0.2]), 0);
        let e = ClassMap::new(&[0, 1, 5].into(), Some(&region), "d")
            .unwrap_err()
            .to_string();
        assert!(e.contains("5") && e.contains("regions"), "{e}");
    }

    #[test]
    fn only_background_still_makes_a_binary_network() {
        let m = ClassMap::new(&[0].into(), None, "d").unwrap();
        assert_eq!(m.len(), 2);
    }

    /// dataset.json with background and the ignore label only: nothing to learn, named.
    #[test]
    fn a_dataset_json_without_a_class_to_learn_is_refused() {
        let d = DatasetDescription::from_value(&serde_json::json!({
            "labels": {"background": 0, "ignore": 1}
        }))
        .unwrap();
        let e = ClassMap::new(&[0, 1].into(), Some(&d), "dataset \"x\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no class to learn") && e.contains("ignore label 1"),
            "{e}"
        );
    }
}
