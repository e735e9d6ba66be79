//! The distance terms: boundary loss (probabilities times the label's signed distance) and the
//! surface loss (squared error weighted by the label's and the prediction's squared distances).

use candle_core::Tensor;
use rayon::prelude::*;

use crate::error::{Error, Result};

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
    if let Some(loss) = crate::train::surface_fused::surface_fused(logits, target, weight)? {
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
