//! The training objective: what a batch's outputs are scored by. Dice + cross-entropy at every
//! supervised resolution (nnU-Net's 1/2^level weights), then the terms their weights switch
//! on, at full resolution: Skeleton Recall, clDice, boundary and surface. It maps the batch's
//! labels to classes, builds each term's target, sums the weighted terms into one tensor for
//! `backward`, and keeps each term's value for the metrics line and the finiteness check.

use candle_core::{Device, Tensor};

use super::{
    bce_dice, boundary, cldice, dice_ce_masked, ignore_mask, one_hot, predicted_distance_squared,
    region_targets, skeleton_recall, surface_weighted, LossParts,
};
use crate::error::{Error, Result};
use crate::model::config::UNetConfig;
use crate::train::classes::{ClassMap, IGNORE};
use crate::train::config::LossWeights;
use crate::train::deep_supervision::downsample_labels;
use crate::train::loader::Batch;

/// One supervised output of the network: its resolution level, its weight in the Dice + CE
/// sum, and its total stride from full resolution.
struct Level {
    level: usize,
    weight: f64,
    stride: [usize; 3],
}

/// The loss of a run: the terms' weights, the network's supervised outputs, the mapping of
/// label values to classes, the patch size, and the device targets are built on.
pub struct LossObjective {
    weights: LossWeights,
    levels: Vec<Level>,
    classes: ClassMap,
    patch: [usize; 3],
    device: Device,
}

/// A batch's loss: the weighted total with its graph, and each term's unweighted value (0 for
/// a term that is off, or that found nothing to score in the batch).
pub struct LossValue {
    /// The weighted sum of the terms, for `backward`.
    pub total: Tensor,
    /// Cross-entropy, weighted over the supervised levels.
    pub ce: f64,
    /// One minus the mean foreground soft Dice, weighted over the supervised levels.
    pub dice: f64,
    /// Skeleton Recall's loss.
    pub skeleton_recall: f64,
    /// clDice's loss.
    pub cldice: f64,
    /// The boundary loss.
    pub boundary: f64,
    /// The surface loss.
    pub surface: f64,
    weights: LossWeights,
}

/// clDice, boundary and surface terms that are switched on, unweighted.
struct ExtraTerms {
    cldice: Option<Tensor>,
    boundary: Option<Tensor>,
    surface: Option<Tensor>,
}

fn scalar(t: &Option<Tensor>) -> Result<f64> {
    Ok(match t {
        Some(t) => t.to_scalar::<f32>()? as f64,
        None => 0.0,
    })
}

impl LossObjective {
    /// The objective of a network with `network`'s supervised outputs, trained on patches of
    /// `patch` (z, y, x) whose label values `classes` maps to classes.
    pub fn new(
        weights: &LossWeights,
        network: &UNetConfig,
        classes: &ClassMap,
        patch: [usize; 3],
        device: &Device,
    ) -> Self {
        let levels = network
            .supervised_levels()
            .into_iter()
            .zip(network.level_weights())
            .map(|(level, weight)| Level {
                level,
                weight,
                stride: network.level_stride(level),
            })
            .collect();
        LossObjective {
            weights: weights.clone(),
            levels,
            classes: classes.clone(),
            patch,
            device: device.clone(),
        }
    }

    /// The loss of `outputs` (the network's, full resolution first) on `batch`'s targets (its
    /// image is not read). Check the values with [`LossValue::ensure_finite`] before
    /// `backward`.
    pub fn evaluate(&self, outputs: &[Tensor], batch: Batch) -> Result<LossValue> {
        let (n, c, patch, dev) = (
            batch.batch_size,
            self.classes.len(),
            self.patch,
            &self.device,
        );
        let mut label = batch.label;
        self.classes.map(&mut label)?;
        let mut parts = self.supervised(outputs, &label, n)?;
        let mut srec = 0.0;
        let w = self.weights.skeleton_recall;
        if w > 0.0 {
            let mut skeleton = batch.skeleton;
            self.classes.map(&mut skeleton)?;
            let target = one_hot(&skeleton, n, c, patch, dev)?;
            if let Some(t) = skeleton_recall(&outputs[0], &target)? {
                srec = t.to_scalar::<f32>()? as f64;
                parts.total = (parts.total + (t * w)?)?;
            }
        }
        let terms = self.extra_terms(
            &outputs[0],
            &label,
            batch.centreline,
            batch.distance,
            &batch.spacing,
            n,
        )?;
        for (term, weight) in [
            (&terms.cldice, self.weights.cldice),
            (&terms.boundary, self.weights.boundary),
            (&terms.surface, self.weights.surface),
        ] {
            if let Some(t) = term {
                parts.total = (parts.total + (t * weight)?)?;
            }
        }
        Ok(LossValue {
            total: parts.total,
            ce: parts.ce,
            dice: parts.dice_loss,
            skeleton_recall: srec,
            cldice: scalar(&terms.cldice)?,
            boundary: scalar(&terms.boundary)?,
            surface: scalar(&terms.surface)?,
            weights: self.weights.clone(),
        })
    }

    /// Dice + CE of every supervised output against its target, weighted by level (nnU-Net's
    /// 1/2^level, normalized); without deep supervision, of the full-resolution output alone.
    /// Regions: BCE + Dice of each region's sigmoid, targets formed from the labels after
    /// they are downsampled, as nnU-Net forms them.
    fn supervised(&self, outputs: &[Tensor], label: &[u16], n: usize) -> Result<LossParts> {
        let (patch, classes, dev) = (self.patch, self.classes.len(), &self.device);
        let mut sum: Option<LossParts> = None;
        for (logits, l) in outputs.iter().zip(&self.levels) {
            let w = l.weight;
            let pooled;
            let (lab, size) = if l.level == 0 {
                (label, patch)
            } else {
                pooled = downsample_labels(label, n, patch, l.stride);
                (&pooled.0[..], pooled.1)
            };
            let p = match self.classes.region_classes() {
                [] => {
                    let target = one_hot(lab, n, classes, size, dev)?;
                    let mask = ignore_mask(lab, n, size, dev)?;
                    dice_ce_masked(logits, &target, mask.as_ref())?
                }
                regions => {
                    let (target, mask) = region_targets(lab, n, regions, Some(IGNORE), size, dev)?;
                    bce_dice(logits, &target, mask.as_ref())?
                }
            };
            sum = Some(match sum {
                None => LossParts {
                    total: (p.total * w)?,
                    ce: p.ce * w,
                    dice_loss: p.dice_loss * w,
                },
                Some(s) => LossParts {
                    total: (s.total + (p.total * w)?)?,
                    ce: s.ce + p.ce * w,
                    dice_loss: s.dice_loss + p.dice_loss * w,
                },
            });
        }
        sum.ok_or_else(|| Error::Train("the network has no output".into()))
    }

    /// clDice, boundary and surface terms at full resolution (`label` already mapped to
    /// classes; the centreline is mapped here).
    fn extra_terms(
        &self,
        logits: &Tensor,
        label: &[u16],
        mut centreline: Vec<u16>,
        distance: Vec<f32>,
        spacing: &[[f64; 3]],
        n: usize,
    ) -> Result<ExtraTerms> {
        let (w, c, patch, dev) = (&self.weights, self.classes.len(), self.patch, &self.device);
        let mut out = ExtraTerms {
            cldice: None,
            boundary: None,
            surface: None,
        };
        if w.cldice <= 0.0 && !w.needs_distance() {
            return Ok(out);
        }
        let target = one_hot(label, n, c, patch, dev)?;
        if w.cldice > 0.0 {
            self.classes.map(&mut centreline)?;
            let skel = one_hot(&centreline, n, c, patch, dev)?;
            out.cldice = Some(cldice(logits, &target, &skel)?);
        }
        if w.needs_distance() {
            let shape = (n, c - 1, patch[0], patch[1], patch[2]);
            if w.surface > 0.0 {
                // The weight d_g^2 + d_p^2 made here, beside the prediction's distances,
                // rather than as two more full-size tensor operations.
                let mut weight = predicted_distance_squared(logits, spacing)?;
                weight
                    .iter_mut()
                    .zip(&distance)
                    .for_each(|(p, g)| *p += g * g);
                let weight = Tensor::from_vec(weight, shape, dev)?;
                out.surface = Some(surface_weighted(logits, &target, &weight)?);
            }
            if w.boundary > 0.0 {
                let d = Tensor::from_vec(distance, shape, dev)?;
                out.boundary = Some(boundary(logits, &d)?);
            }
        }
        Ok(out)
    }
}

impl LossValue {
    /// An error naming every term when one is not finite (`step`: the optimizer steps done):
    /// the weights have diverged, and a run cannot recover from that.
    pub fn ensure_finite(&self, step: u64) -> Result<()> {
        let (srec, cl, bd, sf) = (
            self.skeleton_recall,
            self.cldice,
            self.boundary,
            self.surface,
        );
        if !(self.ce.is_finite()
            && self.dice.is_finite()
            && srec.is_finite()
            && cl.is_finite()
            && bd.is_finite()
            && sf.is_finite())
        {
            return Err(Error::Train(format!(
                "step {step}: the loss is not finite (ce {}, dice {}, skeleton recall {srec}, cldice {cl}, boundary {bd}, surface {sf}); start a new run (--out) with a lower --lr",
                self.ce, self.dice
            )));
        }
        Ok(())
    }

    /// The weighted total as scalars, in two parts: clDice, boundary and surface, then
    /// Dice + CE and Skeleton Recall (the metrics line adds each part divided by the
    /// accumulation count, in this order, so its sums keep their bits).
    pub fn weighted(&self) -> [f64; 2] {
        let w = &self.weights;
        [
            w.cldice * self.cldice + w.boundary * self.boundary + w.surface * self.surface,
            self.ce + self.dice + w.skeleton_recall * self.skeleton_recall,
        ]
    }
}
