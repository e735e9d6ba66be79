//! Dice + cross-entropy, nnU-Net's segmentation loss, for binary and multi-class labels.
//!
//! Both terms use a softmax over the class channel (a binary task has two channels,
//! background and foreground, as in nnU-Net), built from `log_softmax` so gradients flow
//! (candle's fused `softmax_last_dim` passes none). The Dice term is the soft Dice of each
//! foreground class over the whole batch (nnU-Net's batch Dice), smoothed so empty classes give
//! neither NaN nor a gradient explosion: loss = CE + (1 - mean foreground Dice). Voxels of the
//! ignore label ([`IGNORE`] after class mapping) count in neither term (nnU-Net's semantics).

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::train::classes::IGNORE;

/// The two terms and their sum, as scalars (the sum still has its graph for `backward`).
pub struct LossParts {
    /// Cross-entropy plus Dice loss, with its graph.
    pub total: Tensor,
    /// Cross-entropy over the labelled voxels.
    pub ce: f64,
    /// One minus the mean foreground soft Dice.
    pub dice_loss: f64,
}

/// Smoothing of the soft Dice (nnU-Net uses 1e-5).
pub(super) const SMOOTH: f64 = 1e-5;

/// One-hot (N, C, D, H, W) float tensor of integer labels laid out (N, D, H, W); an
/// [`IGNORE`] voxel is all zeros (see [`ignore_mask`]).
pub fn one_hot(
    labels: &[u16],
    n: usize,
    classes: usize,
    spatial: [usize; 3],
    dev: &Device,
) -> Result<Tensor> {
    let v: usize = spatial.iter().product();
    if labels.len() != n * v {
        return Err(Error::Train(format!(
            "labels: {} values for {n} patches of {spatial:?}",
            labels.len()
        )));
    }
    let mut out = vec![0f32; n * classes * v];
    for b in 0..n {
        for (i, &l) in labels[b * v..(b + 1) * v].iter().enumerate() {
            if l == IGNORE {
                continue;
            }
            let l = l as usize;
            if l >= classes {
                return Err(Error::Train(format!(
                    "label value {l} found, but the network has {classes} classes (0..{}); the cache's labels and the model disagree",
                    classes - 1
                )));
            }
            out[(b * classes + l) * v + i] = 1.0;
        }
    }
    Ok(Tensor::from_vec(
        out,
        (n, classes, spatial[0], spatial[1], spatial[2]),
        dev,
    )?)
}

/// (N, 1, D, H, W): 1 where a voxel is labelled, 0 where it holds the ignore label; `None` when
/// no voxel is ignored (the loss then needs no mask).
pub fn ignore_mask(
    labels: &[u16],
    n: usize,
    spatial: [usize; 3],
    dev: &Device,
) -> Result<Option<Tensor>> {
    if !labels.contains(&IGNORE) {
        return Ok(None);
    }
    let m: Vec<f32> = labels.iter().map(|&l| (l != IGNORE) as u8 as f32).collect();
    Ok(Some(Tensor::from_vec(
        m,
        (n, 1, spatial[0], spatial[1], spatial[2]),
        dev,
    )?))
}

/// One minus the mean over channels of the soft Dice of `p` against `t` (both (N, K, D, H, W)),
/// each channel summed over batch and space (nnU-Net's batch Dice), smoothed by [`SMOOTH`].
pub(super) fn batch_dice_loss(p: &Tensor, t: &Tensor) -> Result<Tensor> {
    // (N, K, D, H, W) -> (K,)
    let sum_dims =
        |x: &Tensor| -> Result<Tensor> { Ok(x.transpose(0, 1)?.flatten_from(1)?.sum(1)?) };
    let inter = sum_dims(&p.mul(t)?)?;
    let denom = (sum_dims(p)? + sum_dims(t)?)?;
    let dice = ((inter * 2.0)? + SMOOTH)?.div(&(denom + SMOOTH)?)?;
    Ok((1.0 - dice.mean_all()?)?)
}

/// Dice + CE of `logits` (N, C, D, H, W) against a one-hot target of the same shape.
pub fn dice_ce(logits: &Tensor, target: &Tensor) -> Result<LossParts> {
    dice_ce_masked(logits, target, None)
}

/// [`dice_ce`] leaving out the voxels where `mask` (N, 1, D, H, W) is 0: cross-entropy is
/// averaged over the labelled voxels, and the predicted probabilities there are zeroed before
/// the Dice sums, so an ignored voxel has no gradient.
pub fn dice_ce_masked(
    logits: &Tensor,
    target: &Tensor,
    mask: Option<&Tensor>,
) -> Result<LossParts> {
    if logits.dims() != target.dims() || logits.rank() != 5 {
        return Err(Error::Train(format!(
            "loss: logits {:?} and target {:?} must both be (N, C, D, H, W)",
            logits.dims(),
            target.dims()
        )));
    }
    let (n, c, d, h, w) = logits.dims5()?;
    let voxels = match mask {
        Some(m) => (m.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?).max(1.0),
        None => (n * d * h * w) as f64,
    };
    let log_p = candle_nn::ops::log_softmax(logits, 1)?;
    // The target is zero at ignored voxels, so they add nothing to the cross-entropy.
    let ce = ((log_p.mul(target)?.sum_all()? * (-1.0 / voxels))?).to_dtype(DType::F32)?;

    // Soft Dice per foreground class over batch and space.
    let p = log_p.exp()?;
    let p = match mask {
        Some(m) => p.broadcast_mul(m)?,
        None => p,
    };
    let p = p.narrow(1, 1, c - 1)?;
    let t = target.narrow(1, 1, c - 1)?;
    let dice_loss = batch_dice_loss(&p, &t)?;
    let total = (&ce + &dice_loss)?;
    Ok(LossParts {
        ce: ce.to_scalar::<f32>()? as f64,
        dice_loss: dice_loss.to_scalar::<f32>()? as f64,
        total,
    })
}
