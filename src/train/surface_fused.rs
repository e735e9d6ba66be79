//! The surface loss as one CPU custom op: `mean((p - g)^2 W)` over the foreground classes,
//! with `p = softmax(logits)`, `g` the one-hot target and `W = d_g^2 + d_p^2` (no gradient).
//!
//! Composed from candle ops it made about ten full-size temporaries forward and as many
//! gradients backward (+211 MiB RSS and +10% step time on the issue-13 benchmark). Here the
//! forward pass computes each voxel's softmax on the fly and keeps nothing; the backward pass
//! writes the logits' gradient directly:
//! `dL/dz_j = p_j (a_j - sum_k p_k a_k)` with `a_k = 2 (p_k - g_k) W_k / M` for the foreground
//! classes and `a_0 = 0`. Sums run over fixed blocks of voxels in order, so results do not
//! depend on the thread count. Within a block the softmax runs class by class over the
//! block's voxels in f32 with a polynomial `exp` ([`crate::util::fastmath`]), loops the
//! compiler vectorizes (libm's f64 `exp` per voxel and class was most of this op's time).

use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::model::ops::norm::contiguous_f32;
use crate::util::fastmath;

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

/// Softmax over the classes of voxels `s..e` of sample `b` into `p` (class-major: class `k`
/// at `p[k * (e - s)..]`); `m` and `sum` are scratch of at least `e - s` values.
fn softmax_block(
    z: &[f32],
    (b, c, v): (usize, usize, usize),
    (s, e): (usize, usize),
    p: &mut [f32],
    m: &mut [f32],
    sum: &mut [f32],
) {
    let l = e - s;
    let zk = |k: usize| &z[(b * c + k) * v + s..(b * c + k) * v + e];
    let (m, sum) = (&mut m[..l], &mut sum[..l]);
    m.copy_from_slice(zk(0));
    for k in 1..c {
        for (mi, &x) in m.iter_mut().zip(zk(k)) {
            *mi = mi.max(x);
        }
    }
    sum.fill(0.0);
    for k in 0..c {
        let pk = &mut p[k * l..(k + 1) * l];
        for ((pi, &x), (&mi, si)) in pk.iter_mut().zip(zk(k)).zip(m.iter().zip(sum.iter_mut())) {
            *pi = fastmath::exp(x - mi);
            *si += *pi;
        }
    }
    for si in sum.iter_mut() {
        *si = 1.0 / *si;
    }
    for k in 0..c {
        for (pi, &r) in p[k * l..(k + 1) * l].iter_mut().zip(sum.iter()) {
            *pi *= r;
        }
    }
}

/// Scratch of one block: probabilities (classes x block), and two rows.
struct Scratch {
    p: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
}

impl Scratch {
    fn new(c: usize) -> Self {
        Scratch {
            p: vec![0.0; c * BLOCK],
            m: vec![0.0; BLOCK],
            sum: vec![0.0; BLOCK],
        }
    }
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

/// The logits' gradient of [`SurfaceLoss`] for an upstream gradient of `scale`.
struct SurfaceLossGrad {
    scale: f64,
}

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
            .map_init(
                || Scratch::new(c),
                |sc, &(b, s, e)| {
                    let l = e - s;
                    softmax_block(z, (b, c, v), (s, e), &mut sc.p, &mut sc.m, &mut sc.sum);
                    // Eight running sums, so the loop vectorizes; f64 for the total.
                    let mut lanes = [0f64; 8];
                    for k in 1..c {
                        let gk = &g[(b * c + k) * v + s..(b * c + k) * v + e];
                        let wk = &w[(b * (c - 1) + k - 1) * v + s..(b * (c - 1) + k - 1) * v + e];
                        let pk = &sc.p[k * l..(k + 1) * l];
                        for (i, ((&pi, &gi), &wi)) in pk.iter().zip(gk).zip(wk).enumerate() {
                            let d = pi - gi;
                            lanes[i % 8] += (d * d * wi) as f64;
                        }
                    }
                    lanes.iter().sum::<f64>()
                },
            )
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
        // The upstream gradient is the loss's weight (a scalar): applied inside the gradient
        // op instead of as one more full-size multiplication.
        let scale = grad.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?;
        let d = logits.apply_op3_no_bwd(target, weight, &SurfaceLossGrad { scale })?;
        Ok((Some(d), None, None))
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
        let coef = (2.0 * self.scale / m) as f32;
        let mut out = vec![0f32; n * c * v];
        // Each block writes its voxels of every class: one slice per class and block.
        let per_plane = v.div_ceil(BLOCK);
        let mut slices: Vec<Vec<&mut [f32]>> =
            (0..n * per_plane).map(|_| Vec::with_capacity(c)).collect();
        for (plane, data) in out.chunks_mut(v.max(1)).enumerate() {
            let b = plane / c;
            for (k, part) in data.chunks_mut(BLOCK).enumerate() {
                slices[b * per_plane + k].push(part);
            }
        }
        blocks(n, v)
            .into_par_iter()
            .zip(slices.into_par_iter())
            .for_each_init(
                || (Scratch::new(c), vec![0f32; BLOCK]),
                |(sc, pa), ((b, s, e), mut dst)| {
                    let l = e - s;
                    softmax_block(z, (b, c, v), (s, e), &mut sc.p, &mut sc.m, &mut sc.sum);
                    // a_k = coef (p_k - g_k) W_k for the foreground classes, held in the
                    // output until the last pass; pa = sum_k p_k a_k.
                    let pa = &mut pa[..l];
                    pa.fill(0.0);
                    for k in 1..c {
                        let gk = &g[(b * c + k) * v + s..(b * c + k) * v + e];
                        let wk = &w[(b * (c - 1) + k - 1) * v + s..(b * (c - 1) + k - 1) * v + e];
                        let pk = &sc.p[k * l..(k + 1) * l];
                        let ak = &mut dst[k][..l];
                        for (((a, &pi), &gi), (&wi, t)) in ak
                            .iter_mut()
                            .zip(pk)
                            .zip(gk)
                            .zip(wk.iter().zip(pa.iter_mut()))
                        {
                            *a = coef * (pi - gi) * wi;
                            *t += pi * *a;
                        }
                    }
                    // d_j = p_j (a_j - pa), a_0 = 0.
                    for (d, (&pi, &t)) in dst[0].iter_mut().zip(sc.p[..l].iter().zip(pa.iter())) {
                        *d = -pi * t;
                    }
                    for (k, dk) in dst.iter_mut().enumerate().skip(1) {
                        let pk = &sc.p[k * l..(k + 1) * l];
                        for (d, (&pi, &t)) in dk.iter_mut().zip(pk.iter().zip(pa.iter())) {
                            *d = pi * (*d - t);
                        }
                    }
                },
            );
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
