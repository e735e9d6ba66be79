//! What a model's outputs and a segmentation's values mean: classes (one softmax) or regions
//! (one sigmoid each, written in `regions_class_order`), and the ignore label. One type for
//! training, prediction (ours and nnU-Net's) and evaluation, as nnU-Net's `LabelManager` is;
//! run.json, dataset.json and the probabilities' attributes keep their own fields and are read
//! into it, so no caller matches on classes versus regions by hand.

use serde::{Deserialize, Serialize};

use super::dataset_json::{check_region_labels, DatasetDescription, LabelClass};

/// One output class of a run: the label-file value it stands for and its name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassInfo {
    /// The value label files hold for it.
    pub value: u16,
    /// Its name (from dataset.json, else "class V").
    pub name: String,
}

/// What the heads are.
#[derive(Clone, Debug, PartialEq)]
enum Heads {
    /// Softmax; head k is class k, background (value 0) first.
    Classes(Vec<ClassInfo>),
    /// One sigmoid per region; a voxel gets `order[k]` where region k passes 0.5, later
    /// regions written over earlier ones.
    Regions {
        regions: Vec<LabelClass>,
        order: Vec<u16>,
    },
}

/// What a dataset's label files hold, as its dataset.json says: the structures scored
/// (classes, one value each, or regions), background left out, and the ignore label. What a
/// build checks files against, inspection counts and evaluation scores; a model's outputs
/// ([`Labels`]) add the order regions are written in.
#[derive(Clone, Debug, PartialEq)]
pub struct FileLabels {
    scored: Vec<LabelClass>,
    ignore: Option<u16>,
}

impl FileLabels {
    /// A dataset.json's labels. Its reader has checked them (regions hold only foreground
    /// values), so no `regions_class_order` is needed: reading files writes nothing.
    pub fn of(d: &DatasetDescription) -> FileLabels {
        let scored = d.labels.iter().filter(|c| c.values != [0]).cloned();
        FileLabels {
            scored: scored.collect(),
            ignore: d.ignore_label,
        }
    }

    /// The structures scored, background left out, in the file's order.
    pub fn scored(&self) -> &[LabelClass] {
        &self.scored
    }

    /// The value left out of every count and score, if any.
    pub fn ignore(&self) -> Option<u16> {
        self.ignore
    }

    /// Every value a label file may hold: background, each structure's values, the ignore label.
    pub fn values(&self) -> std::collections::BTreeSet<u16> {
        let mut v: std::collections::BTreeSet<u16> = self.foreground_values().into_iter().collect();
        v.insert(0);
        v.extend(self.ignore);
        v
    }

    /// The foreground values, each once, ascending, the ignore label left out: one channel
    /// each when a segmentation is a cascade's input.
    pub fn foreground_values(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self
            .scored
            .iter()
            .flat_map(|c| c.values.iter().copied())
            .collect();
        v.retain(|&x| x != 0 && Some(x) != self.ignore);
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Classes or regions, in output order, and the ignore label.
#[derive(Clone, Debug, PartialEq)]
pub struct Labels {
    heads: Heads,
    ignore: Option<u16>,
}

impl Labels {
    /// Classes in output order: at least one, no value twice, the ignore label none of them.
    pub fn of_classes(classes: Vec<ClassInfo>, ignore: Option<u16>) -> Result<Labels, String> {
        let values: Vec<u16> = classes.iter().map(|c| c.value).collect();
        if values.is_empty() {
            return Err("no class".into());
        }
        let mut sorted = values.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("classes: label values {values:?} repeat a value"));
        }
        if let Some(i) = ignore.filter(|i| values.contains(i)) {
            return Err(format!("ignore_label {i} is also a class"));
        }
        Ok(Labels::unchecked_classes(classes, ignore))
    }

    /// Classes 0..n named "class V": runs recorded before their classes were.
    pub fn consecutive(n: usize, ignore: Option<u16>) -> Labels {
        let classes = (0..n.min(1 << 16) as u32)
            .map(|v| ClassInfo {
                value: v as u16,
                name: format!("class {v}"),
            })
            .collect();
        Labels::unchecked_classes(classes, ignore)
    }

    /// Regions in output order and the label value each is written as: at least one, each a
    /// non-empty set of foreground labels (a region holding 0 covers every voxel), one order
    /// value per region, the ignore label in none.
    pub fn of_regions(
        regions: Vec<LabelClass>,
        order: Vec<u16>,
        ignore: Option<u16>,
    ) -> Result<Labels, String> {
        if regions.is_empty() {
            return Err("no region".into());
        }
        check_region_labels(&regions)?;
        if order.len() != regions.len() {
            return Err(format!(
                "regions_class_order has {} values for {} regions",
                order.len(),
                regions.len()
            ));
        }
        if let Some(i) = ignore.filter(|i| regions.iter().any(|r| r.values.contains(i))) {
            return Err(format!("ignore_label {i} is in a region"));
        }
        Ok(Labels::unchecked_regions(regions, order, ignore))
    }

    /// A dataset.json's labels: its classes by value, or its regions in the file's order (all
    /// of them but background) with the rules of [`DatasetDescription::check_regions`].
    pub fn from_description(d: &DatasetDescription) -> Result<Labels, String> {
        if d.has_regions() {
            d.check_regions()?;
            let regions = d.labels.iter().filter(|c| c.values != [0]).cloned();
            let order = d.regions_class_order.clone().unwrap_or_default();
            return Labels::of_regions(regions.collect(), order, d.ignore_label);
        }
        let classes = d.labels.iter().map(|c| ClassInfo {
            value: c.values.first().copied().unwrap_or(0),
            name: c.name.clone(),
        });
        Labels::of_classes(classes.collect(), d.ignore_label)
    }

    /// Without the checks: for records checked when read (run.json) or made from checked
    /// labels. Every method copes with what they may lack (lengths that differ, no head).
    pub(crate) fn unchecked_classes(classes: Vec<ClassInfo>, ignore: Option<u16>) -> Labels {
        Labels {
            heads: Heads::Classes(classes),
            ignore,
        }
    }

    /// [`Self::of_regions`] without the checks, as [`Self::unchecked_classes`].
    pub(crate) fn unchecked_regions(
        regions: Vec<LabelClass>,
        order: Vec<u16>,
        ignore: Option<u16>,
    ) -> Labels {
        Labels {
            heads: Heads::Regions { regions, order },
            ignore,
        }
    }

    /// Whether the heads are sigmoids over regions rather than a softmax over classes.
    pub fn is_regions(&self) -> bool {
        matches!(self.heads, Heads::Regions { .. })
    }

    /// The label value left out of loss and Dice and never predicted, if any.
    pub fn ignore(&self) -> Option<u16> {
        self.ignore
    }

    /// Whether two models' outputs mean the same (their ignore labels aside: never predicted).
    pub fn same_outputs(&self, other: &Labels) -> bool {
        self.heads == other.heads
    }

    /// Network output channels.
    pub fn heads(&self) -> usize {
        match &self.heads {
            Heads::Classes(c) => c.len(),
            Heads::Regions { regions, .. } => regions.len(),
        }
    }

    /// The classes in output order (empty for regions).
    pub fn classes(&self) -> &[ClassInfo] {
        match &self.heads {
            Heads::Classes(c) => c,
            Heads::Regions { .. } => &[],
        }
    }

    /// The regions in output order (empty for classes).
    pub fn regions(&self) -> &[LabelClass] {
        match &self.heads {
            Heads::Classes(_) => &[],
            Heads::Regions { regions, .. } => regions,
        }
    }

    /// The label value each region is written as (empty for classes).
    pub fn regions_class_order(&self) -> &[u16] {
        match &self.heads {
            Heads::Classes(_) => &[],
            Heads::Regions { order, .. } => order,
        }
    }

    /// The label value each head is written as: its class's, or its region's order value.
    pub fn head_values(&self) -> Vec<u16> {
        match &self.heads {
            Heads::Classes(c) => c.iter().map(|c| c.value).collect(),
            Heads::Regions { order, .. } => order.clone(),
        }
    }

    /// Each head's name.
    pub fn head_names(&self) -> Vec<String> {
        match &self.heads {
            Heads::Classes(c) => c.iter().map(|c| c.name.clone()).collect(),
            Heads::Regions { regions, .. } => regions.iter().map(|r| r.name.clone()).collect(),
        }
    }

    /// The label value of one voxel from its heads' probabilities (softmax or sigmoid): the
    /// class of the largest (the first of equal maxima, as argmax), or the last region in
    /// order whose probability passes 0.5 (background where none does).
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
        match &self.heads {
            Heads::Classes(c) => {
                // Strictly greater: on a tie the lower class wins, as argmax does.
                if p > *best {
                    *best = p;
                    *label = c.get(head).map_or(0, |c| c.value);
                }
            }
            Heads::Regions { order, .. } => {
                if p > 0.5 {
                    *label = order.get(head).copied().unwrap_or(0);
                }
            }
        }
    }

    /// The probabilities of one voxel from its heads' logits into `p`, as nnU-Net's
    /// `apply_inference_nonlin`: a float32 softmax over classes, or each region's sigmoid.
    pub fn probabilities_of_logits(&self, logits: &[f32], p: &mut [f32]) {
        match &self.heads {
            Heads::Classes(_) => {
                let max = logits.iter().copied().fold(f32::MIN, f32::max);
                let mut sum = 0f32;
                for (o, x) in p.iter_mut().zip(logits) {
                    *o = (x - max).exp();
                    sum += *o;
                }
                p.iter_mut().for_each(|o| *o /= sum);
            }
            Heads::Regions { .. } => {
                for (o, x) in p.iter_mut().zip(logits) {
                    *o = sigmoid(*x);
                }
            }
        }
    }

    /// The label value of one voxel from its heads' logits, as nnU-Net's
    /// `convert_logits_to_segmentation`: numpy's argmax over classes (the first of equal
    /// maxima, from head 0), or [`Self::label`] of the regions' sigmoids.
    pub fn label_of_logits(&self, logits: &[f32]) -> u16 {
        match &self.heads {
            Heads::Classes(c) => {
                let mut best = 0;
                for (i, x) in logits.iter().enumerate() {
                    if *x > logits[best] {
                        best = i;
                    }
                }
                c.get(best).map_or(0, |c| c.value)
            }
            Heads::Regions { .. } => {
                let (mut best, mut label) = (f32::NEG_INFINITY, 0);
                for (head, x) in logits.iter().enumerate() {
                    self.vote(head, sigmoid(*x), &mut best, &mut label);
                }
                label
            }
        }
    }

    /// The heads' probabilities of a voxel outside the predicted box: all background for
    /// classes (first head 1), no region.
    pub fn background_probabilities(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.heads()];
        if let (Heads::Classes(_), Some(first)) = (&self.heads, v.first_mut()) {
            *first = 1.0;
        }
        v
    }

    /// What is scored, background left out: each class but value 0 (as a one-value set), or
    /// each region.
    pub fn foreground(&self) -> Vec<LabelClass> {
        match &self.heads {
            Heads::Classes(c) => c
                .iter()
                .filter(|c| c.value != 0)
                .map(|c| LabelClass {
                    name: c.name.clone(),
                    values: vec![c.value],
                })
                .collect(),
            Heads::Regions { regions, .. } => regions.clone(),
        }
    }

    /// Every foreground label value, ascending: the classes', or those the regions hold.
    pub fn foreground_values(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self
            .foreground()
            .into_iter()
            .flat_map(|c| c.values)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every foreground value a filter of a segmentation may name, ascending: the classes', or
    /// the regions' labels and the values they are written as.
    pub fn segmentation_values(&self) -> Vec<u16> {
        let mut v = self.foreground_values();
        v.extend(self.regions_class_order().iter().filter(|&&v| v != 0));
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The largest label value a segmentation holds.
    pub fn max_value(&self) -> u16 {
        self.head_values().into_iter().max().unwrap_or(0)
    }

    /// "3 classes, label values [0, 1, 2]" or "3 regions 1+2+3, 2+3, 3 written as [1, 2, 3]",
    /// for messages.
    pub fn describe(&self) -> String {
        match &self.heads {
            Heads::Classes(c) => {
                let values: Vec<u16> = c.iter().map(|c| c.value).collect();
                format!("{} classes, label values {values:?}", values.len())
            }
            Heads::Regions { regions, order } => {
                let sets: Vec<String> = regions.iter().map(|r| plus(&r.values)).collect();
                format!(
                    "{} regions {} written as {order:?}",
                    sets.len(),
                    sets.join(", ")
                )
            }
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// "1+2+3".
fn plus(values: &[u16]) -> String {
    let v: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    v.join("+")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(value: u16, name: &str) -> ClassInfo {
        ClassInfo {
            value,
            name: name.into(),
        }
    }

    fn region(name: &str, values: &[u16]) -> LabelClass {
        LabelClass {
            name: name.into(),
            values: values.to_vec(),
        }
    }

    #[test]
    fn a_datasets_files_hold_background_its_structures_and_the_ignore_label() {
        let json = |v: serde_json::Value| DatasetDescription::from_value(&v).unwrap();
        let brats = json(serde_json::json!({
            "channel_names": {"0": "T1"},
            "labels": {"background": 0, "whole tumor": [1, 2, 3], "tumor core": [2, 3],
                       "enhancing tumor": 3, "ignore": 4},
            "regions_class_order": [1, 2, 3], "file_ending": ".nii.gz"
        }));
        let l = FileLabels::of(&brats);
        assert_eq!(l.values().into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert_eq!(l.foreground_values(), [1, 2, 3]);
        assert_eq!(l.ignore(), Some(4));
        assert_eq!(l.scored().len(), 3);
        assert_eq!(l.scored()[0], region("whole tumor", &[1, 2, 3]));
        // Classes with a gap: the values as declared, nothing invented between them.
        let gap = json(serde_json::json!({
            "channel_names": {"0": "CT"},
            "labels": {"background": 0, "liver": 1, "tumour": 5},
            "file_ending": ".nii.gz"
        }));
        let l = FileLabels::of(&gap);
        assert_eq!(l.values().into_iter().collect::<Vec<_>>(), [0, 1, 5]);
        assert_eq!((l.foreground_values(), l.ignore()), (vec![1, 5], None));
    }

    fn brats() -> Labels {
        let regions = vec![
            region("whole", &[1, 2, 3]),
            region("core", &[2, 3]),
            region("enhancing", &[3]),
        ];
        Labels::of_regions(regions, vec![1, 2, 3], Some(4)).unwrap()
    }

    #[test]
    fn classes_take_the_argmax_and_regions_the_last_over_a_half() {
        let c = vec![class(0, "background"), class(2, "a"), class(5, "b")];
        let l = Labels::of_classes(c, Some(9)).unwrap();
        assert!(!l.is_regions());
        assert_eq!((l.heads(), l.ignore(), l.max_value()), (3, Some(9), 5));
        assert_eq!(l.label(&[0.2, 0.5, 0.3]), 2);
        // Equal maxima: the first, as argmax.
        assert_eq!(l.label(&[0.4, 0.2, 0.4]), 0);
        assert_eq!(l.label_of_logits(&[1.0, 3.0, 3.0]), 2);
        assert_eq!(l.foreground_values(), [2, 5]);
        assert_eq!(l.background_probabilities(), [1.0, 0.0, 0.0]);
        assert_eq!(l.describe(), "3 classes, label values [0, 2, 5]");

        let r = brats();
        assert!(r.is_regions());
        assert_eq!((r.heads(), r.ignore()), (3, Some(4)));
        assert_eq!(r.label(&[0.9, 0.2, 0.7]), 3);
        assert_eq!(r.label(&[0.9, 0.6, 0.1]), 2);
        assert_eq!(r.label(&[0.5, 0.1, 0.1]), 0);
        assert_eq!(r.label_of_logits(&[2.0, -1.0, -1.0]), 1);
        assert_eq!(r.foreground().len(), 3);
        assert_eq!(r.foreground_values(), [1, 2, 3]);
        assert_eq!(r.background_probabilities(), [0.0; 3]);
        assert_eq!(r.describe(), "3 regions 1+2+3, 2+3, 3 written as [1, 2, 3]");
        let mut p = [0.0; 3];
        r.probabilities_of_logits(&[0.0, 0.0, 0.0], &mut p);
        assert_eq!(p, [0.5; 3]);
        l.probabilities_of_logits(&[0.0, 0.0, 0.0], &mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_region_holding_background_or_the_ignore_label_is_refused() {
        let e = Labels::of_regions(vec![region("all", &[0, 1])], vec![1], None).unwrap_err();
        assert!(e.contains("holds 0"), "{e}");
        let e = Labels::of_regions(vec![region("none", &[])], vec![1], None).unwrap_err();
        assert!(e.contains("no label value"), "{e}");
        let e = Labels::of_regions(vec![region("a", &[1])], vec![1, 2], None).unwrap_err();
        assert!(e.contains("2 values for 1 regions"), "{e}");
        let e = Labels::of_regions(vec![region("a", &[1, 2])], vec![1], Some(2)).unwrap_err();
        assert!(e.contains("ignore_label 2"), "{e}");
        let e = Labels::of_classes(vec![class(0, "b"), class(1, "a")], Some(1)).unwrap_err();
        assert!(e.contains("also a class"), "{e}");
        let e = Labels::of_classes(vec![class(1, "b"), class(1, "a")], None).unwrap_err();
        assert!(e.contains("repeat"), "{e}");
    }

    #[test]
    fn a_dataset_json_reads_as_classes_or_regions() {
        let d = DatasetDescription::from_value(&serde_json::json!({
            "labels": {"background": 0, "whole": [1, 2], "core": 2, "ignore": 3},
            "regions_class_order": [1, 2]
        }))
        .unwrap();
        let l = Labels::from_description(&d).unwrap();
        assert_eq!(l.regions()[0].values, [1, 2]);
        assert_eq!(
            (l.regions_class_order(), l.ignore()),
            (&[1, 2][..], Some(3))
        );
        let d = DatasetDescription::from_value(&serde_json::json!({
            "labels": {"background": 0, "a": 1}
        }))
        .unwrap();
        let l = Labels::from_description(&d).unwrap();
        assert_eq!(l.head_names(), ["background", "a"]);
        assert_eq!(Labels::consecutive(3, None).head_values(), [0, 1, 2]);
    }
}
