//! The skeleton terms: Skeleton Recall (the tubed skeleton's recall by the prediction) and
//! clDice (soft skeletons of prediction and label, each inside the other), with the soft
//! morphology clDice's skeleton is made of.

use candle_core::Tensor;

use super::dice_ce::SMOOTH;
use crate::error::{Error, Result};

/// Skeleton Recall (Kirchhoff et al., 2024): one minus the soft recall of each foreground
/// class's tubed skeleton by the predicted probabilities, over the batch, averaged over the
/// classes that have skeleton voxels: `1 - mean_c (sum p_c s_c + smooth) / (sum s_c + smooth)`.
/// `skeleton` is a one-hot (N, C, D, H, W) target like [`one_hot`]'s (background channel
/// unused). `None` when no class has a skeleton voxel in the batch.
pub fn skeleton_recall(logits: &Tensor, skeleton: &Tensor) -> Result<Option<Tensor>> {
    if logits.dims() != skeleton.dims() || logits.rank() != 5 {
        return Err(Error::Train(format!(
            "skeleton recall: logits {:?} and skeleton {:?} must both be (N, C, D, H, W)",
            logits.dims(),
            skeleton.dims()
        )));
    }
    let c = logits.dim(1)?;
    let p = candle_nn::ops::log_softmax(logits, 1)?
        .exp()?
        .narrow(1, 1, c - 1)?;
    let s = skeleton.narrow(1, 1, c - 1)?;
    let per_class =
        |x: &Tensor| -> Result<Tensor> { Ok(x.transpose(0, 1)?.flatten_from(1)?.sum(1)?) };
    let per_class_total = per_class(&s)?;
    let sums = per_class_total.to_vec1::<f32>()?;
    let present: Vec<u32> = (0..sums.len() as u32)
        .filter(|&k| sums[k as usize] > 0.0)
        .collect();
    if present.is_empty() {
        return Ok(None);
    }
    let idx = Tensor::new(present.as_slice(), logits.device())?;
    let inter = per_class(&p.mul(&s)?)?.index_select(&idx, 0)?;
    let total = per_class_total.index_select(&idx, 0)?;
    let recall = ((inter + SMOOTH)? / (total + SMOOTH)?)?;
    Ok(Some((1.0 - recall.mean_all()?)?))
}

/// Iterations of the soft skeleton (MONAI's `SoftclDiceLoss` default).
pub const CLDICE_ITERATIONS: usize = 3;
/// Smoothing of clDice's two ratios (MONAI's default).
const CLDICE_SMOOTH: f64 = 1.0;

/// Max (or min) over each voxel and its two neighbours along `axis`; the edges repeat their
/// own value, which for a max or a min is the same as padding with -inf or +inf.
fn extreme3(x: &Tensor, axis: usize, max: bool) -> Result<Tensor> {
    let l = x.dim(axis)?;
    if l == 1 {
        return Ok(x.clone());
    }
    let prev = Tensor::cat(&[&x.narrow(axis, 0, 1)?, &x.narrow(axis, 0, l - 1)?], axis)?;
    let next = Tensor::cat(
        &[&x.narrow(axis, 1, l - 1)?, &x.narrow(axis, l - 1, 1)?],
        axis,
    )?;
    Ok(if max {
        x.maximum(&prev)?.maximum(&next)?
    } else {
        x.minimum(&prev)?.minimum(&next)?
    })
}

/// Soft erosion of (N, C, D, H, W): the minimum over the 6-neighbour cross (three 3-voxel
/// minima, one per axis, as MONAI's `soft_erode`).
fn soft_erode(x: &Tensor) -> Result<Tensor> {
    Ok(extreme3(x, 2, false)?
        .minimum(&extreme3(x, 3, false)?)?
        .minimum(&extreme3(x, 4, false)?)?)
}

/// Soft dilation: the maximum over the 3x3x3 cube (separable).
fn soft_dilate(x: &Tensor) -> Result<Tensor> {
    extreme3(&extreme3(&extreme3(x, 2, true)?, 3, true)?, 4, true)
}

/// Soft skeleton of probabilities (Shit et al. 2021): what each erosion step removes that an
/// opening would not restore, accumulated.
pub fn soft_skeleton(x: &Tensor, iterations: usize) -> Result<Tensor> {
    let open = |t: &Tensor| -> Result<Tensor> { soft_dilate(&soft_erode(t)?) };
    let mut img = x.clone();
    let mut skel = (&img - open(&img)?)?.relu()?;
    for _ in 0..iterations {
        img = soft_erode(&img)?;
        let delta = (&img - open(&img)?)?.relu()?;
        skel = (&skel + (&delta - skel.mul(&delta)?)?.relu()?)?;
    }
    Ok(skel)
}

/// clDice loss: `1 - 2 Tprec Tsens / (Tprec + Tsens)` with Tprec the soft skeleton of the
/// prediction inside the target and Tsens the target's skeleton inside the prediction, summed
/// over the batch and the foreground classes (MONAI's `SoftclDiceLoss`, smoothing 1).
/// `target` is the one-hot label and `target_skeleton` the one-hot skeleton of the label (the
/// cached hard skeleton, or [`soft_skeleton`] of the target as MONAI does).
pub fn cldice(logits: &Tensor, target: &Tensor, target_skeleton: &Tensor) -> Result<Tensor> {
    if logits.dims() != target.dims() || logits.dims() != target_skeleton.dims() {
        return Err(Error::Train(format!(
            "cldice: logits {:?}, target {:?} and skeleton {:?} must have one shape",
            logits.dims(),
            target.dims(),
            target_skeleton.dims()
        )));
    }
    let c = logits.dim(1)?;
    let p = candle_nn::ops::log_softmax(logits, 1)?.exp()?;
    let skel_pred = soft_skeleton(&p, CLDICE_ITERATIONS)?.narrow(1, 1, c - 1)?;
    let fg = |t: &Tensor| t.narrow(1, 1, c - 1);
    let (p, t, st) = (fg(&p)?, fg(target)?, fg(target_skeleton)?);
    let tprec = ((skel_pred.mul(&t)?.sum_all()? + CLDICE_SMOOTH)?
        / (skel_pred.sum_all()? + CLDICE_SMOOTH)?)?;
    let tsens = ((st.mul(&p)?.sum_all()? + CLDICE_SMOOTH)? / (st.sum_all()? + CLDICE_SMOOTH)?)?;
    let ratio = ((tprec.mul(&tsens)? * 2.0)? / (&tprec + &tsens)?)?;
    Ok((1.0 - ratio)?)
}
