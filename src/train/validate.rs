//! Validation: sliding-window inference ([`crate::infer::sliding`]) over whole cached volumes,
//! Dice and centreline Dice per class. Each slab of final rows is compared with the label rows
//! read from the cache and dropped, so a volume of any size validates in the memory of one slab;
//! for clDice the predicted classes and the label go to scratch files meanwhile, whose skeletons
//! are then thinned block by block ([`crate::evaluate::centreline`]).

use std::path::Path;

use candle_core::Device;

use super::classes::{ClassMap, IGNORE};
use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::evaluate::centreline::scratch::ScratchLabels;
use crate::evaluate::centreline::{centreline_counts, CentrelineCounts, ClassMask};
use crate::infer::sliding::{Flavour, Predictor};
use crate::model::unet::UNet;

/// Dice of one validation pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValidationResult {
    /// Mean over cases of each foreground class's Dice (classes 1..C, or each region); NaN when
    /// a class is in no case's label nor prediction.
    pub dice_per_class: Vec<f64>,
    /// Mean of the defined per-class values.
    pub mean_dice: f64,
    /// Each case's mean foreground Dice.
    pub dice_per_case: Vec<(String, f64)>,
    /// Mean over cases of each foreground class's clDice (empty when not measured).
    pub cldice_per_class: Vec<f64>,
    /// Mean of the defined per-class clDice values (NaN when not measured).
    pub mean_cldice: f64,
}

/// Confusion counts of one case per scored set (a class, or a region's classes).
#[derive(Clone, Debug, Default)]
struct Counts {
    /// Per class index, the scored sets it is in.
    member: Vec<Vec<bool>>,
    tp: Vec<u64>,
    fp: Vec<u64>,
    fn_: Vec<u64>,
}

impl Counts {
    /// Counts of `sets` (each a list of class indices) over `classes` classes.
    fn new(sets: &[Vec<u16>], classes: usize) -> Self {
        let member = (0..classes)
            .map(|c| sets.iter().map(|s| s.contains(&(c as u16))).collect())
            .collect();
        Counts {
            member,
            tp: vec![0; sets.len()],
            fp: vec![0; sets.len()],
            fn_: vec![0; sets.len()],
        }
    }

    fn add(&mut self, pred: u16, truth: u16) {
        let none = Vec::new();
        let p = self.member.get(pred as usize).unwrap_or(&none);
        let t = self.member.get(truth as usize).unwrap_or(&none);
        for s in 0..self.tp.len() {
            match (p.get(s) == Some(&true), t.get(s) == Some(&true)) {
                (true, true) => self.tp[s] += 1,
                (true, false) => self.fp[s] += 1,
                (false, true) => self.fn_[s] += 1,
                (false, false) => {}
            }
        }
    }

    /// Dice of set s; None when the set is in neither label nor prediction.
    fn dice(&self, s: usize) -> Option<f64> {
        let d = 2 * self.tp[s] + self.fp[s] + self.fn_[s];
        (d > 0).then(|| 2.0 * self.tp[s] as f64 / d as f64)
    }
}

/// What validation scores, as class indices: each foreground class, or each region.
fn scored_sets(classes: &ClassMap) -> Vec<Vec<u16>> {
    match classes.region_classes() {
        [] => (1..classes.len() as u16).map(|c| vec![c]).collect(),
        regions => regions.to_vec(),
    }
}

/// Sliding-window predictor settings.
pub struct SlidingWindow<'a> {
    /// The network.
    pub model: &'a UNet,
    /// Where it runs.
    pub device: &'a Device,
    /// Window size (z, y, x).
    pub patch: [usize; 3],
    /// Overlap of neighbouring windows (fraction of the window).
    pub overlap: f64,
    /// Windows per forward pass.
    pub batch: usize,
    /// Label-file values to classes; ignore-label voxels are left out of Dice, and are
    /// background on both sides for clDice.
    pub classes: &'a ClassMap,
    /// Where the scratch files of clDice go; `None`: no clDice.
    pub cldice_scratch: Option<&'a Path>,
}

/// The scratch volumes of one case's clDice: predicted classes and label classes.
struct Centrelines {
    pred: ScratchLabels,
    truth: ScratchLabels,
}

impl SlidingWindow<'_> {
    /// Predict one cached case and count agreement with its label, slab by slab; with clDice,
    /// per foreground class its skeleton counts.
    fn case_counts<S: PatchSource>(&self, entry: &S) -> Result<(Counts, Vec<CentrelineCounts>)> {
        let heads = self.model.config().num_classes;
        let sets = scored_sets(self.classes);
        let outputs = self.classes.labels();
        let shape = entry.shape_zyx();
        let plane = shape[1] * shape[2];
        let mut counts = Counts::new(&sets, self.classes.len());
        let scratch = match self.cldice_scratch {
            Some(dir) => Some(Centrelines {
                pred: ScratchLabels::create(dir, shape)?,
                truth: ScratchLabels::create(dir, shape)?,
            }),
            None => None,
        };
        let predictor = Predictor {
            model: self.model,
            device: self.device,
            patch: self.patch,
            overlap: self.overlap,
            batch: self.batch,
            mirror_axes: Vec::new(),
            on_windows: None,
            flavour: Flavour::ours(outputs.is_regions()),
        };
        predictor.predict(entry, &mut |z0, rows, probs| {
            let mut truth = vec![0u16; rows * plane];
            entry.read_label([z0 as i64, 0, 0], [rows, shape[1], shape[2]], &mut truth)?;
            self.classes.map(&mut truth)?;
            // Label values, then class indices as the truth's.
            let mut pred: Vec<u16> = probs
                .chunks_exact(heads)
                .map(|p| outputs.label(p))
                .collect();
            self.classes.map(&mut pred)?;
            for (p, t) in pred.iter_mut().zip(truth.iter_mut()) {
                if *t == IGNORE {
                    (*p, *t) = (0, 0);
                } else {
                    counts.add(*p, *t);
                }
            }
            if let Some(s) = &scratch {
                s.pred.write_planes(z0, &pred)?;
                s.truth.write_planes(z0, &truth)?;
            }
            Ok(())
        })?;
        let Some(s) = scratch else {
            return Ok((counts, Vec::new()));
        };
        let mut centrelines = vec![CentrelineCounts::default(); sets.len()];
        for (set, out) in sets.iter().zip(centrelines.iter_mut()) {
            let member = move |v: u16| set.contains(&v);
            let mask = |labels| ClassMask {
                labels,
                member: &member,
            };
            *out = centreline_counts(&mask(&s.pred), &mask(&s.truth), shape)?;
        }
        Ok((counts, centrelines))
    }

    /// Validate on cases (id, entry): mean Dice per foreground class and per case.
    pub fn run<S: PatchSource>(&self, cases: &[(String, S)]) -> Result<ValidationResult> {
        if !(0.0..1.0).contains(&self.overlap) {
            return Err(Error::Config(format!(
                "sliding-window overlap must be in 0..1, got {}",
                self.overlap
            )));
        }
        let scored = scored_sets(self.classes).len();
        let mut per_class: Vec<Vec<f64>> = vec![Vec::new(); scored];
        let mut cl_per_class: Vec<Vec<f64>> = vec![Vec::new(); scored];
        let mut per_case = Vec::with_capacity(cases.len());
        for (id, entry) in cases {
            if !entry.has_label() {
                return Err(Error::case(id, "validation case has no label"));
            }
            let (counts, centrelines) = self.case_counts(entry)?;
            for (c, list) in cl_per_class.iter_mut().enumerate() {
                if let Some(v) = centrelines.get(c).map(|x| x.cldice()) {
                    if !v.is_nan() {
                        list.push(v);
                    }
                }
            }
            let mut case_dice = Vec::new();
            for (c, list) in per_class.iter_mut().enumerate() {
                if let Some(d) = counts.dice(c) {
                    list.push(d);
                    case_dice.push(d);
                }
            }
            per_case.push((id.clone(), mean(&case_dice)));
        }
        let dice_per_class: Vec<f64> = per_class.iter().map(|l| mean(l)).collect();
        let cldice_per_class: Vec<f64> = match self.cldice_scratch {
            Some(_) => cl_per_class.iter().map(|l| mean(l)).collect(),
            None => Vec::new(),
        };
        Ok(ValidationResult {
            mean_dice: mean_defined(&dice_per_class),
            mean_cldice: mean_defined(&cldice_per_class),
            dice_per_class,
            dice_per_case: per_case,
            cldice_per_class,
        })
    }
}

fn mean_defined(v: &[f64]) -> f64 {
    let defined: Vec<f64> = v.iter().copied().filter(|d| !d.is_nan()).collect();
    mean(&defined)
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dice_counts() {
        let mut c = Counts::new(&[vec![1]], 2);
        for (p, t) in [(1, 1), (1, 0), (0, 1), (0, 0), (1, 1)] {
            c.add(p, t);
        }
        // tp 2, fp 1, fn 1 -> 4/6
        assert!((c.dice(0).unwrap() - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(Counts::new(&[vec![1]], 2).dice(0), None);
    }

    /// Regions overlap: one voxel counts in every region its classes are in.
    #[test]
    fn region_counts_overlap() {
        // Classes 0..4; regions {1,2,3} and {3}.
        let mut c = Counts::new(&[vec![1, 2, 3], vec![3]], 4);
        for (p, t) in [(3, 3), (2, 3), (1, 0), (0, 2)] {
            c.add(p, t);
        }
        // Whole: tp 2 (3/3, 2/3), fp 1 (1/0), fn 1 (0/2): 4/6. Core {3}: tp 1, fn 1: 2/3.
        assert!((c.dice(0).unwrap() - 4.0 / 6.0).abs() < 1e-12);
        assert!((c.dice(1).unwrap() - 2.0 / 3.0).abs() < 1e-12);
    }
}
