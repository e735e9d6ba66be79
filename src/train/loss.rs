//! Dice + cross-entropy, nnU-Net's segmentation loss, for binary and multi-class labels.
//!
//! Both terms use a softmax over the class channel (a binary task has two channels,
//! background and foreground, as in nnU-Net), built from `log_softmax` so gradients flow
//! (candle's fused `softmax_last_dim` passes none). The Dice term is the soft Dice of each
//! foreground class over the whole batch (nnU-Net's batch Dice), smoothed so empty classes give
//! neither NaN nor a gradient explosion: loss = CE + (1 - mean foreground Dice). Voxels of the
//! ignore label ([`IGNORE`] after class mapping) count in neither term (nnU-Net's semantics).

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::classes::IGNORE;
use crate::error::{Error, Result};

/// The two terms and their sum, as scalars (the sum still has its graph for `backward`).
pub struct LossParts {
    pub total: Tensor,
    pub ce: f64,
    pub dice_loss: f64,
}

/// Smoothing of the soft Dice (nnU-Net uses 1e-5).
const SMOOTH: f64 = 1e-5;

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
    let sum_dims = |x: &Tensor| -> Result<Tensor> {
        // (N, C-1, D, H, W) -> (C-1,)
        Ok(x.transpose(0, 1)?.flatten_from(1)?.sum(1)?)
    };
    let inter = sum_dims(&p.mul(&t)?)?;
    let denom = (sum_dims(&p)? + sum_dims(&t)?)?;
    let dice = ((inter * 2.0)? + SMOOTH)?.div(&(denom + SMOOTH)?)?;
    let dice_loss = (1.0 - dice.mean_all()?)?;
    let total = (&ce + &dice_loss)?;
    Ok(LossParts {
        ce: ce.to_scalar::<f32>()? as f64,
        dice_loss: dice_loss.to_scalar::<f32>()? as f64,
        total,
    })
}

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

/// Boundary loss (Kervadec et al. 2019): the mean over batch, foreground classes and voxels of
/// each class's probability times its signed distance (negative inside), so probability mass
/// is pulled inside the boundary. `distance` is (N, C - 1, D, H, W), one map per foreground
/// class, in the cache's unit.
pub fn boundary(logits: &Tensor, distance: &Tensor) -> Result<Tensor> {
    let c = logits.dim(1)?;
    let p = candle_nn::ops::log_softmax(logits, 1)?
        .exp()?
        .narrow(1, 1, c - 1)?;
    if p.dims() != distance.dims() {
        return Err(Error::Train(format!(
            "boundary: probabilities {:?} and distances {:?} differ in shape",
            p.dims(),
            distance.dims()
        )));
    }
    Ok(p.mul(distance)?.mean_all()?)
}

/// The surface loss's prediction side: per patch and foreground class, the unsigned distance
/// of every voxel to the boundary of the thresholded prediction (`argmax == class`), squared;
/// 0 for a class the patch's prediction does not hold or fills. Computed in the training step
/// (never in loader workers), about 17 bytes a voxel of one patch at a time.
pub fn predicted_distance_squared(logits: &Tensor, spacing_zyx: &[[f64; 3]]) -> Result<Vec<f32>> {
    let (n, c) = (logits.dim(0)?, logits.dim(1)?);
    let spatial = [logits.dim(2)?, logits.dim(3)?, logits.dim(4)?];
    let v: usize = spatial.iter().product();
    let arg: Vec<u32> = logits.argmax(1)?.flatten_all()?.to_vec1::<u32>()?;
    if spacing_zyx.len() < n {
        return Err(Error::Train(format!(
            "surface: {} spacings for {n} patches",
            spacing_zyx.len()
        )));
    }
    // One task per (patch, class), each written to its own slice: same result on any thread
    // count, and the trainer's threads are idle here anyway.
    let mut out = vec![0f32; n * (c - 1) * v];
    out.par_chunks_mut(v.max(1))
        .enumerate()
        .for_each(|(task, dst)| {
            let (b, k) = (task / (c - 1), task % (c - 1) + 1);
            let a = &arg[b * v..(b + 1) * v];
            let inside: Vec<bool> = a.iter().map(|&x| x as usize == k).collect();
            let d = crate::prep::derived::edt::signed_distance(&inside, spatial, spacing_zyx[b]);
            dst.iter_mut().zip(&d).for_each(|(o, x)| *o = x * x);
        });
    Ok(out)
}

/// Surface loss (the distance-transform Hausdorff loss of Karimi and Salcudean 2019, alpha 2,
/// as MONAI's `HausdorffDTLoss`): mean over batch, foreground classes and voxels of
/// `(p - g)^2 (d_g^2 + d_p^2)`, with `d_g` the cached distance to the label's boundary and
/// `d_p` the distance to the thresholded prediction's (`predicted_sq`, no gradient).
/// `distance` is the cached signed distance, (N, C - 1, D, H, W).
pub fn surface(
    logits: &Tensor,
    target: &Tensor,
    distance: &Tensor,
    predicted_sq: &Tensor,
) -> Result<Tensor> {
    surface_weighted(logits, target, &(distance.sqr()? + predicted_sq)?)
}

/// [`surface`] given its weight `d_g^2 + d_p^2`, (N, C - 1, D, H, W): the fused CPU op, else
/// the composed form.
pub fn surface_weighted(logits: &Tensor, target: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if let Some(loss) = super::surface_fused::surface_fused(logits, target, weight)? {
        return Ok(loss);
    }
    surface_composed(logits, target, weight)
}

/// The surface loss from candle's ops (any device), given `weight = d_g^2 + d_p^2`.
pub fn surface_composed(logits: &Tensor, target: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let c = logits.dim(1)?;
    let p = candle_nn::ops::log_softmax(logits, 1)?
        .exp()?
        .narrow(1, 1, c - 1)?;
    let g = target.narrow(1, 1, c - 1)?;
    let err = (p - g)?.sqr()?;
    Ok(err.mul(weight)?.mean_all()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_recall_matches_the_formula_and_its_gradient_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let spatial = [1, 2, 3];
        // Two patches, three classes; skeleton voxels of class 1 and 2 in places.
        let sk_labels: Vec<u16> = vec![0, 1, 1, 0, 2, 0, 1, 0, 0, 0, 2, 2];
        let target = one_hot(&sk_labels, 2, 3, spatial, &dev)?;
        let base: Vec<f32> = (0..36)
            .map(|i| ((i * 7) % 11) as f32 * 0.37 - 1.6)
            .collect();
        let loss_at = |v: &[f32]| -> Result<f64> {
            let x = Tensor::from_vec(v.to_vec(), (2, 3, 1, 2, 3), &dev)?;
            Ok(skeleton_recall(&x, &target)?
                .expect("a skeleton")
                .to_scalar::<f32>()? as f64)
        };
        // The formula by hand: softmax per voxel, recall per class over the batch.
        let mut inter = [0f64; 3];
        let mut total = [0f64; 3];
        for b in 0..2 {
            for v in 0..6 {
                let z: Vec<f64> = (0..3).map(|c| base[(b * 3 + c) * 6 + v] as f64).collect();
                let m = z.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = z.iter().map(|a| (a - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let k = sk_labels[b * 6 + v] as usize;
                if k > 0 {
                    inter[k] += e[k] / sum;
                    total[k] += 1.0;
                }
            }
        }
        let want = 1.0
            - ((inter[1] + SMOOTH) / (total[1] + SMOOTH)
                + (inter[2] + SMOOTH) / (total[2] + SMOOTH))
                / 2.0;
        let got = loss_at(&base)?;
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        // Gradient against central differences.
        let x = candle_core::Var::from_vec(base.clone(), (2, 3, 1, 2, 3), &dev)?;
        let l = skeleton_recall(x.as_tensor(), &target)?.expect("a skeleton");
        let g = l.backward()?;
        let g = g
            .get(x.as_tensor())
            .expect("gradient")
            .flatten_all()?
            .to_vec1::<f32>()?;
        for k in [0, 5, 7, 13, 22, 35] {
            let h = 1e-2f32;
            let (mut up, mut down) = (base.clone(), base.clone());
            up[k] += h;
            down[k] -= h;
            let fd = (loss_at(&up)? - loss_at(&down)?) / (2.0 * h as f64);
            assert!(
                (fd - g[k] as f64).abs() < 2e-3,
                "logit {k}: {fd} vs {}",
                g[k]
            );
        }
        // No skeleton voxel: no term.
        let none = one_hot(&[0; 12], 2, 3, spatial, &dev)?;
        let x = Tensor::from_vec(base, (2, 3, 1, 2, 3), &dev)?;
        assert!(skeleton_recall(&x, &none)?.is_none());
        Ok(())
    }

    #[test]
    fn perfect_prediction_has_tiny_loss_and_wrong_has_large() -> Result<()> {
        let dev = Device::Cpu;
        let labels: Vec<u16> = (0..2 * 8).map(|i| (i % 3 == 0) as u16).collect();
        let t = one_hot(&labels, 2, 2, [1, 2, 4], &dev)?;
        let good = ((&t * 40.0)? - 20.0)?;
        let bad = ((&t * -40.0)? + 20.0)?;
        let g = dice_ce(&good, &t)?;
        let b = dice_ce(&bad, &t)?;
        assert!(
            g.ce < 1e-6 && g.dice_loss < 1e-5,
            "{} {}",
            g.ce,
            g.dice_loss
        );
        assert!(b.ce > 19.0 && b.dice_loss > 0.99);
        Ok(())
    }

    #[test]
    fn uniform_logits_give_log_c_cross_entropy_and_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let labels = vec![0u16, 1, 2, 1, 0, 2, 2, 1];
        let t = one_hot(&labels, 1, 3, [2, 2, 2], &dev)?;
        let x = candle_core::Var::zeros((1, 3, 2, 2, 2), DType::F32, &dev)?;
        let l = dice_ce(x.as_tensor(), &t)?;
        assert!((l.ce - 3f64.ln()).abs() < 1e-6);
        let grads = l.total.backward()?;
        let g = grads.get(x.as_tensor()).expect("gradient");
        // The gradient raises the logit of each voxel's own class.
        let gv = g.flatten_all()?.to_vec1::<f32>()?;
        let tv = t.flatten_all()?.to_vec1::<f32>()?;
        for (gi, ti) in gv.iter().zip(&tv) {
            assert!(if *ti > 0.5 { *gi < 0.0 } else { *gi > 0.0 });
        }
        Ok(())
    }

    #[test]
    fn labels_beyond_the_classes_are_an_error() {
        let e = one_hot(&[0, 3], 1, 2, [1, 1, 2], &Device::Cpu).expect_err("error");
        assert!(e.to_string().contains("label value 3"), "{e}");
    }

    #[test]
    fn ignored_voxels_change_neither_the_loss_nor_get_a_gradient() -> Result<()> {
        let dev = Device::Cpu;
        // Two patches of 2x2x4; every third voxel ignored.
        let labels: Vec<u16> = (0..32)
            .map(|i| if i % 3 == 0 { IGNORE } else { (i % 2) as u16 })
            .collect();
        let t = one_hot(&labels, 2, 2, [2, 2, 4], &dev)?;
        let m = ignore_mask(&labels, 2, [2, 2, 4], &dev)?.expect("a mask");
        let base: Vec<f32> = (0..64).map(|i| ((i * 7) % 5) as f32 * 0.3 - 0.6).collect();
        let loss_of = |v: Vec<f32>| -> Result<(f64, Vec<f32>)> {
            let x = candle_core::Var::from_vec(v, (2, 2, 2, 2, 4), &dev)?;
            let l = dice_ce_masked(x.as_tensor(), &t, Some(&m))?;
            let g = l.total.backward()?;
            let g = g
                .get(x.as_tensor())
                .expect("gradient")
                .flatten_all()?
                .to_vec1::<f32>()?;
            Ok((l.ce + l.dice_loss, g))
        };
        let (l0, g0) = loss_of(base.clone())?;
        // Scramble the logits of ignored voxels only: the loss stays where it was.
        let mut moved = base.clone();
        for (k, v) in moved.iter_mut().enumerate() {
            let (b, i) = (k / 32, k % 16);
            if labels[b * 16 + i] == IGNORE {
                *v += 5.0 * (k as f32).sin();
            }
        }
        let (l1, _) = loss_of(moved)?;
        assert!((l0 - l1).abs() < 1e-6, "{l0} vs {l1}");
        for (k, g) in g0.iter().enumerate() {
            let (b, i) = (k / 32, k % 16);
            if labels[b * 16 + i] == IGNORE {
                assert_eq!(*g, 0.0, "gradient at ignored voxel {k}");
            }
        }
        assert!(g0.iter().any(|g| *g != 0.0));
        Ok(())
    }

    /// A gradient checked against central differences at a few elements.
    fn check_gradient(
        f: &dyn Fn(&Tensor) -> Result<Tensor>,
        base: &[f32],
        shape: (usize, usize, usize, usize, usize),
    ) -> Result<()> {
        let dev = Device::Cpu;
        let var = candle_core::Var::from_vec(base.to_vec(), shape, &dev)?;
        let loss = f(var.as_tensor())?;
        let grads = loss.backward()?;
        let g = grads
            .get(var.as_tensor())
            .expect("a gradient")
            .flatten_all()?
            .to_vec1::<f32>()?;
        let at = |v: &[f32]| -> Result<f64> {
            let x = Tensor::from_vec(v.to_vec(), shape, &dev)?;
            Ok(f(&x)?.to_scalar::<f32>()? as f64)
        };
        let h = 1e-2f32;
        let f0 = at(base)?;
        let mut checked = 0;
        for k in (0..base.len()).step_by(7) {
            let (mut up, mut down) = (base.to_vec(), base.to_vec());
            up[k] += h;
            down[k] -= h;
            let (fu, fdn) = (at(&up)?, at(&down)?);
            // A min/max kink within h (pooling): the one-sided slopes differ; no derivative.
            let (right, left) = ((fu - f0) / h as f64, (f0 - fdn) / h as f64);
            if (right - left).abs() > 1e-3 + 0.05 * right.abs().max(left.abs()) {
                continue;
            }
            checked += 1;
            let fd = (fu - fdn) / (2.0 * h as f64);
            assert!(
                (fd - g[k] as f64).abs() <= 2e-3 + 0.02 * fd.abs(),
                "element {k}: backward {} vs central difference {fd}",
                g[k]
            );
        }
        assert!(
            checked * 2 >= base.len().div_ceil(7),
            "{checked} smooth elements"
        );
        Ok(())
    }

    /// Softmax over channels of a (N, C, V) f32 buffer, in f64.
    fn softmax(v: &[f32], n: usize, c: usize) -> Vec<f64> {
        let vox = v.len() / (n * c);
        let mut out = vec![0f64; v.len()];
        for b in 0..n {
            for i in 0..vox {
                let z: Vec<f64> = (0..c).map(|k| v[(b * c + k) * vox + i] as f64).collect();
                let m = z.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = z.iter().map(|a| (a - m).exp()).collect();
                let s: f64 = e.iter().sum();
                for k in 0..c {
                    out[(b * c + k) * vox + i] = e[k] / s;
                }
            }
        }
        out
    }

    /// MONAI's soft skeleton transcribed on one (D, H, W) volume: pools over the in-bounds
    /// neighbours (max_pool3d's -inf padding).
    fn soft_skel_ref(x: &[f64], s: [usize; 3], iters: usize) -> Vec<f64> {
        let idx = |z: usize, y: usize, w: usize| (z * s[1] + y) * s[2] + w;
        let pool = |x: &[f64], r: [usize; 3], max: bool| -> Vec<f64> {
            let mut out = vec![0f64; x.len()];
            for z in 0..s[0] {
                for y in 0..s[1] {
                    for w in 0..s[2] {
                        let mut best = if max { f64::MIN } else { f64::MAX };
                        for dz in z.saturating_sub(r[0])..=(z + r[0]).min(s[0] - 1) {
                            for dy in y.saturating_sub(r[1])..=(y + r[1]).min(s[1] - 1) {
                                for dw in w.saturating_sub(r[2])..=(w + r[2]).min(s[2] - 1) {
                                    let v = x[idx(dz, dy, dw)];
                                    best = if max { best.max(v) } else { best.min(v) };
                                }
                            }
                        }
                        out[idx(z, y, w)] = best;
                    }
                }
            }
            out
        };
        let erode = |x: &[f64]| -> Vec<f64> {
            let (a, b, c) = (
                pool(x, [1, 0, 0], false),
                pool(x, [0, 1, 0], false),
                pool(x, [0, 0, 1], false),
            );
            (0..x.len()).map(|i| a[i].min(b[i]).min(c[i])).collect()
        };
        let open = |x: &[f64]| pool(&erode(x), [1, 1, 1], true);
        let relu = |v: f64| v.max(0.0);
        let mut img = x.to_vec();
        let o = open(&img);
        let mut skel: Vec<f64> = (0..x.len()).map(|i| relu(img[i] - o[i])).collect();
        for _ in 0..iters {
            img = erode(&img);
            let o = open(&img);
            for i in 0..x.len() {
                let delta = relu(img[i] - o[i]);
                skel[i] += relu(delta - skel[i] * delta);
            }
        }
        skel
    }

    fn test_logits(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 37 + 11) % 23) as f32 * 0.21 - 2.3)
            .collect()
    }

    #[test]
    fn cldice_matches_monai_transcribed_and_its_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let (n, c, s) = (2, 3, [3, 4, 5]);
        let vox: usize = s.iter().product();
        let labels: Vec<u16> = (0..n * vox).map(|i| ((i * 5) % 7 % 3) as u16).collect();
        let target = one_hot(&labels, n, c, s, &dev)?;
        let base = test_logits(n * c * vox);
        // The target side as MONAI computes it: the soft skeleton of the one-hot target.
        let t = target.flatten_all()?.to_vec1::<f32>()?;
        let t64: Vec<f64> = t.iter().map(|&v| v as f64).collect();
        let mut tskel = vec![0f64; t.len()];
        for bc in 0..n * c {
            let sk = soft_skel_ref(&t64[bc * vox..(bc + 1) * vox], s, CLDICE_ITERATIONS);
            tskel[bc * vox..(bc + 1) * vox].copy_from_slice(&sk);
        }
        let tskel_t = Tensor::from_vec(
            tskel.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            (n, c, s[0], s[1], s[2]),
            &dev,
        )?;
        // Ours builds the same soft skeleton of the target.
        let ours_tskel = soft_skeleton(&target, CLDICE_ITERATIONS)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        for (a, b) in ours_tskel.iter().zip(&tskel) {
            assert!((*a as f64 - b).abs() < 1e-6);
        }
        // The loss by hand.
        let p = softmax(&base, n, c);
        let mut pskel = vec![0f64; p.len()];
        for bc in 0..n * c {
            let sk = soft_skel_ref(&p[bc * vox..(bc + 1) * vox], s, CLDICE_ITERATIONS);
            pskel[bc * vox..(bc + 1) * vox].copy_from_slice(&sk);
        }
        let fg = |i: usize| !(i / vox).is_multiple_of(c);
        let sum = |f: &dyn Fn(usize) -> f64| (0..p.len()).filter(|&i| fg(i)).map(f).sum::<f64>();
        let tprec = (sum(&|i| pskel[i] * t64[i]) + 1.0) / (sum(&|i| pskel[i]) + 1.0);
        let tsens = (sum(&|i| tskel[i] * p[i]) + 1.0) / (sum(&|i| tskel[i]) + 1.0);
        let want = 1.0 - 2.0 * tprec * tsens / (tprec + tsens);
        let x = Tensor::from_vec(base.clone(), (n, c, s[0], s[1], s[2]), &dev)?;
        let got = cldice(&x, &target, &tskel_t)?.to_scalar::<f32>()? as f64;
        assert!((got - want).abs() < 1e-5, "cldice {got} vs {want}");
        check_gradient(
            &|x| cldice(x, &target, &tskel_t),
            &base,
            (n, c, s[0], s[1], s[2]),
        )
    }

    #[test]
    fn boundary_and_surface_match_their_formulas_and_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let (n, c, s) = (2, 3, [2, 3, 4]);
        let vox: usize = s.iter().product();
        let labels: Vec<u16> = (0..n * vox).map(|i| ((i * 3) % 5 % 3) as u16).collect();
        let target = one_hot(&labels, n, c, s, &dev)?;
        let base = test_logits(n * c * vox);
        let shape = (n, c - 1, s[0], s[1], s[2]);
        let dist: Vec<f32> = (0..n * (c - 1) * vox)
            .map(|i| ((i * 13) % 9) as f32 * 0.5 - 2.0)
            .collect();
        let d = Tensor::from_vec(dist.clone(), shape, &dev)?;
        let pred_sq: Vec<f32> = (0..n * (c - 1) * vox)
            .map(|i| ((i * 7) % 5) as f32)
            .collect();
        let ps = Tensor::from_vec(pred_sq.clone(), shape, &dev)?;
        let p = softmax(&base, n, c);
        let t = target.flatten_all()?.to_vec1::<f32>()?;
        let (mut b_sum, mut s_sum) = (0f64, 0f64);
        for b in 0..n {
            for k in 1..c {
                for i in 0..vox {
                    let pi = p[(b * c + k) * vox + i];
                    let gi = t[(b * c + k) * vox + i] as f64;
                    let j = (b * (c - 1) + k - 1) * vox + i;
                    b_sum += pi * dist[j] as f64;
                    let w = (dist[j] as f64).powi(2) + pred_sq[j] as f64;
                    s_sum += (pi - gi).powi(2) * w;
                }
            }
        }
        let count = (n * (c - 1) * vox) as f64;
        let x = Tensor::from_vec(base.clone(), (n, c, s[0], s[1], s[2]), &dev)?;
        let got_b = boundary(&x, &d)?.to_scalar::<f32>()? as f64;
        let got_s = surface(&x, &target, &d, &ps)?.to_scalar::<f32>()? as f64;
        assert!((got_b - b_sum / count).abs() < 1e-5, "{got_b}");
        assert!((got_s - s_sum / count).abs() < 1e-4, "{got_s}");
        let full = (n, c, s[0], s[1], s[2]);
        check_gradient(&|x| boundary(x, &d), &base, full)?;
        check_gradient(&|x| surface(x, &target, &d, &ps), &base, full)
    }

    /// The fused op against the composed form on larger random data: loss and gradients.
    #[test]
    fn fused_surface_equals_the_composed_form() -> Result<()> {
        let dev = Device::Cpu;
        let (n, c, s) = (2, 3, [5, 40, 41]);
        let vox: usize = s.iter().product();
        let mut rng = crate::util::rng::Rng::new(21);
        let labels: Vec<u16> = (0..n * vox)
            .map(|_| (rng.uniform() * 3.0) as u16 % 3)
            .collect();
        let target = one_hot(&labels, n, c, s, &dev)?;
        let z: Vec<f32> = (0..n * c * vox)
            .map(|_| 2.0 * rng.normal() as f32)
            .collect();
        let w: Vec<f32> = (0..n * (c - 1) * vox)
            .map(|_| (rng.uniform() * 30.0) as f32)
            .collect();
        let w = Tensor::from_vec(w, (n, c - 1, s[0], s[1], s[2]), &dev)?;
        let x = candle_core::Var::from_vec(z, (n, c, s[0], s[1], s[2]), &dev)?;
        let fused = super::super::surface_fused::surface_fused(x.as_tensor(), &target, &w)?
            .expect("cpu f32");
        let composed = surface_composed(x.as_tensor(), &target, &w)?;
        let (a, b) = (fused.to_scalar::<f32>()?, composed.to_scalar::<f32>()?);
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        let ga = fused.backward()?.get(x.as_tensor()).unwrap().clone();
        let gb = composed.backward()?.get(x.as_tensor()).unwrap().clone();
        let scale = gb.abs()?.max_all()?.to_scalar::<f32>()?;
        let diff = (&ga - &gb)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(
            diff <= 1e-4 * scale,
            "gradient differs by {diff} (scale {scale})"
        );
        // A weighted term: the upstream gradient scales the fused op's gradient.
        let weighted = (super::super::surface_fused::surface_fused(x.as_tensor(), &target, &w)?
            .expect("cpu f32")
            * 0.25)?;
        let gw = weighted.backward()?.get(x.as_tensor()).unwrap().clone();
        let diff = (gw - (&ga * 0.25)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff <= 1e-6 * scale, "weighted gradient differs by {diff}");
        Ok(())
    }

    #[test]
    fn predicted_distance_is_the_thresholded_predictions_distance() -> Result<()> {
        let dev = Device::Cpu;
        // One patch, two classes, a 1x1x5 row: class 1 wins at x = 1 and 2.
        let logits = vec![1.0f32, -1.0, -1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0];
        let x = Tensor::from_vec(logits, (1, 2, 1, 1, 5), &dev)?;
        let d = predicted_distance_squared(&x, &[[1.0, 1.0, 2.0]])?;
        // Signed distance (spacing 2 along x): 2, -2, -2, 2, 4; squared.
        assert_eq!(d, vec![4.0, 4.0, 4.0, 4.0, 16.0]);
        Ok(())
    }
}
