//! The surface loss as one CPU custom op: `mean((p - g)^2 W)` over the foreground classes,
//! with `p = softmax(logits)`, `g` the one-hot target and `W = d_g^2 + d_p^2` (no gradient).
//!
//! Composed from candle ops it made about ten full-size temporaries forward and as many
//! gradients backward (+211 MiB RSS and +10% step time on the issue-13 benchmark). Here the
//! forward pass computes each voxel's softmax on the fly and keeps nothing; the backward pass
//! writes the logits' gradient directly:
//! `dL/dz_j = p_j (a_j - sum_k p_k a_k)` with `a_k = 2 (p_k - g_k) W_k / M` for the foreground
//! classes and `a_0 = 0`. Sums run over fixed blocks of voxels in order, so results do not
//! depend on the thread count.

use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::ops::norm::contiguous_f32;

/// Voxels per block of the parallel passes (a fixed split: deterministic sums).
const BLOCK: usize = 4096;

/// Sizes: logits (N, C, V...), target (N, C, V...), weight (N, C - 1, V...).
fn sizes(l: &Layout, t: &Layout, w: &Layout) -> Result<(usize, usize, usize)> {
    let d = l.dims();
    if d.len() < 3 || t.dims() != d {
        bail!("surface: logits {d:?} and target {:?} must match", t.dims());
    }
    let (n, c) = (d[0], d[1]);
    let mut wd = d.to_vec();
    wd[1] = c.saturating_sub(1);
    if c < 2 || w.dims() != wd.as_slice() {
        bail!("surface: weights {:?}, expected {wd:?}", w.dims());
    }
    Ok((n, c, d[2..].iter().product()))
}

/// The three arguments' data and sizes.
struct Args<'a> {
    z: &'a [f32],
    g: &'a [f32],
    w: &'a [f32],
    n: usize,
    c: usize,
    v: usize,
}

fn args<'a>(
    (s1, l1): (&'a CpuStorage, &Layout),
    (s2, l2): (&'a CpuStorage, &Layout),
    (s3, l3): (&'a CpuStorage, &Layout),
    what: &str,
) -> Result<Args<'a>> {
    let (n, c, v) = sizes(l1, l2, l3)?;
    Ok(Args {
        z: contiguous_f32(s1, l1, what)?,
        g: contiguous_f32(s2, l2, what)?,
        w: contiguous_f32(s3, l3, what)?,
        n,
        c,
        v,
    })
}

/// Softmax over the classes of voxel `i` of sample `b` into `p`.
#[inline]
fn softmax_at(z: &[f32], b: usize, c: usize, v: usize, i: usize, p: &mut [f64]) {
    let at = |k: usize| z[(b * c + k) * v + i] as f64;
    let m = (0..c).map(at).fold(f64::NEG_INFINITY, f64::max);
    let mut s = 0.0;
    for (k, pk) in p.iter_mut().enumerate().take(c) {
        *pk = (at(k) - m).exp();
        s += *pk;
    }
    p.iter_mut().take(c).for_each(|pk| *pk /= s);
}

/// Blocks of (sample, voxel range), in order.
fn blocks(n: usize, v: usize) -> Vec<(usize, usize, usize)> {
    (0..n)
        .flat_map(|b| {
            (0..v)
                .step_by(BLOCK)
                .map(move |s| (b, s, (s + BLOCK).min(v)))
        })
        .collect()
}

struct SurfaceLoss;

/// The logits' gradient of [`SurfaceLoss`] for an upstream gradient of 1.
struct SurfaceLossGrad;

impl CustomOp3 for SurfaceLoss {
    fn name(&self) -> &'static str {
        "surface-loss"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let Args { z, g, w, n, c, v } = args((s1, l1), (s2, l2), (s3, l3), self.name())?;
        let partial: Vec<f64> = blocks(n, v)
            .par_iter()
            .map(|&(b, s, e)| {
                let mut p = vec![0f64; c];
                let mut acc = 0f64;
                for i in s..e {
                    softmax_at(z, b, c, v, i, &mut p);
                    for k in 1..c {
                        let d = p[k] - g[(b * c + k) * v + i] as f64;
                        acc += d * d * w[(b * (c - 1) + k - 1) * v + i] as f64;
                    }
                }
                acc
            })
            .collect();
        let m = (n * (c - 1) * v).max(1) as f64;
        let loss = partial.iter().sum::<f64>() / m;
        Ok((CpuStorage::F32(vec![loss as f32]), Shape::from(())))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        target: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d = logits.apply_op3_no_bwd(target, weight, &SurfaceLossGrad)?;
        Ok((Some(d.broadcast_mul(grad)?), None, None))
    }
}

impl CustomOp3 for SurfaceLossGrad {
    fn name(&self) -> &'static str {
        "surface-loss-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let Args { z, g, w, n, c, v } = args((s1, l1), (s2, l2), (s3, l3), self.name())?;
        let m = (n * (c - 1) * v).max(1) as f64;
        let mut out = vec![0f32; n * c * v];
        // Each block writes its own voxels of every class: collect per block, then scatter.
        let parts: Vec<Vec<f32>> = blocks(n, v)
            .par_iter()
            .map(|&(b, s, e)| {
                let (mut p, mut a) = (vec![0f64; c], vec![0f64; c]);
                let mut local = vec![0f32; c * (e - s)];
                for i in s..e {
                    softmax_at(z, b, c, v, i, &mut p);
                    a[0] = 0.0;
                    for k in 1..c {
                        let wk = w[(b * (c - 1) + k - 1) * v + i] as f64;
                        a[k] = 2.0 * (p[k] - g[(b * c + k) * v + i] as f64) * wk / m;
                    }
                    let pa: f64 = (0..c).map(|k| p[k] * a[k]).sum();
                    for j in 0..c {
                        local[j * (e - s) + i - s] = (p[j] * (a[j] - pa)) as f32;
                    }
                }
                local
            })
            .collect();
        for (&(b, s, e), local) in blocks(n, v).iter().zip(&parts) {
            for j in 0..c {
                let dst = &mut out[(b * c + j) * v + s..(b * c + j) * v + e];
                dst.copy_from_slice(&local[j * (e - s)..(j + 1) * (e - s)]);
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `mean((softmax(logits)[1..] - target[1..])^2 * weight)` as one op (CPU, f32, contiguous);
/// `None` where it does not apply (another device or type), for the caller's composed form.
pub fn surface_fused(logits: &Tensor, target: &Tensor, weight: &Tensor) -> Result<Option<Tensor>> {
    let cpu_f32 = [logits, target, weight]
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == candle_core::DType::F32);
    if !cpu_f32 {
        return Ok(None);
    }
    let weight = weight.detach();
    let target = target.detach();
    Ok(Some(logits.contiguous()?.apply_op3(
        &target.contiguous()?,
        &weight.contiguous()?,
        SurfaceLoss,
    )?))
}
