//! Group (or instance) normalization fused with LeakyReLU, with a hand-written backward.
//!
//! candle's composed GroupNorm + leaky_relu makes ~15 full-size temporaries forward and slow
//! strided reductions backward. On the CPU this is one custom op: every (sample, group) slab is
//! contiguous in NCDHW, so one rayon task per slab computes its statistics and writes its output
//! (forward), or its input gradient and per-channel partial sums (backward). Each slab is
//! reduced by one task in a fixed order and the per-sample partials of the parameter gradients
//! are summed afterwards in sample order, so results do not depend on the thread count.
//! Mean and inverse standard deviation are recomputed in backward instead of being stored.

use std::sync::Mutex;

use candle_core::{bail, CpuStorage, CustomOp3, DType, InplaceOp3, Layout, Result, Shape, Tensor};
use candle_nn::GroupNorm;
use half::bf16;
use rayon::prelude::*;

use super::stored::Stored;

mod slab;
use slab::{wide, Slab};

/// Sizes of one application: x is (N, C, spatial...) with `groups` groups of channels.
#[derive(Clone, Copy, Debug)]
struct NormGeom {
    batch: usize,
    channels: usize,
    groups: usize,
    /// Voxels per channel (D * H * W).
    voxels: usize,
}

impl NormGeom {
    fn new(x: &[usize], w: &[usize], b: &[usize], groups: usize) -> Result<Self> {
        let &[batch, channels, d, h, wd] = x else {
            bail!("group_norm_leaky_relu: expected x (N, C, D, H, W), got {x:?}")
        };
        if w != [channels] || b != [channels] {
            bail!("group_norm_leaky_relu: weight {w:?} and bias {b:?} must be ({channels},)");
        }
        if groups == 0 || !channels.is_multiple_of(groups) {
            bail!("group_norm_leaky_relu: {groups} groups must divide {channels} channels");
        }
        Ok(NormGeom {
            batch,
            channels,
            groups,
            voxels: d * h * wd,
        })
    }

    fn channels_per_group(&self) -> usize {
        self.channels / self.groups
    }

    /// Elements of one (sample, group) slab: the count M the statistics are taken over.
    fn slab(&self) -> usize {
        self.channels_per_group() * self.voxels
    }

    fn numel(&self) -> usize {
        self.batch * self.channels * self.voxels
    }

    #[cfg(feature = "cuda")]
    fn sizes(&self) -> super::cuda::launch::NormSizes {
        super::cuda::launch::NormSizes {
            batch: self.batch,
            channels: self.channels,
            groups: self.groups,
            voxels: self.voxels,
        }
    }
}

pub(crate) fn contiguous_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        bail!("{what}: only f32 tensors are supported")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("{what}: argument must be contiguous"),
    }
}

/// [`contiguous_f32`] of an argument an in-place op writes.
pub(crate) fn contiguous_f32_mut<'a>(
    s: &'a mut CpuStorage,
    l: &Layout,
    what: &str,
) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(data) = s else {
        bail!("{what}: only f32 tensors are supported")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut data[a..b]),
        None => bail!("{what}: argument must be contiguous"),
    }
}

/// Forward custom op on (x, weight, bias), all contiguous f32.
pub(super) struct GroupNormLeakyRelu {
    groups: usize,
    eps: f64,
    slope: f32,
}

/// Backward custom op on (x, dy, [weight | bias]). On the CPU its output is dx (x's type) and
/// the parameter gradients (f32) come back in `params`; on CUDA the output is the flat
/// [dx | dweight | dbias].
struct GroupNormLeakyReluGrad {
    groups: usize,
    eps: f64,
    slope: f32,
    params: Mutex<Option<(Vec<f32>, Vec<f32>)>>,
}

impl GroupNormLeakyRelu {
    pub(super) fn new(groups: usize, eps: f64, slope: f64) -> Self {
        GroupNormLeakyRelu {
            groups,
            eps,
            slope: slope as f32,
        }
    }

    /// The output of `x` (shape `dims`, contiguous) on the CPU, in x's type.
    pub(super) fn forward_cpu(
        &self,
        x: Stored,
        dims: &[usize],
        w: &[f32],
        b: &[f32],
    ) -> Result<CpuStorage> {
        let g = NormGeom::new(dims, &[w.len()], &[b.len()], self.groups)?;
        let x = match x {
            Stored::F32(x) => x,
            // bf16 activations: each slab widened, normalized as f32, rounded once.
            Stored::Bf16(x) => {
                let mut y = vec![bf16::ZERO; g.numel()];
                if g.numel() > 0 {
                    y.par_chunks_mut(g.slab())
                        .zip(x.par_chunks(g.slab()))
                        .enumerate()
                        .for_each(|(i, (ys, xs))| {
                            wide::normalize_bf16(&self.slab(&g, i, w, b), xs, ys)
                        });
                }
                return Ok(CpuStorage::BF16(y));
            }
        };
        let mut y = vec![0f32; g.numel()];
        if g.numel() > 0 {
            y.par_chunks_mut(g.slab())
                .zip(x.par_chunks(g.slab()))
                .enumerate()
                .for_each(|(i, (ys, xs))| {
                    let slab = self.slab(&g, i, w, b);
                    wide::normalize(&slab, xs, ys)
                });
        }
        Ok(CpuStorage::F32(y))
    }

    /// The gradients (x, weight, bias) from the output's gradient `dy`.
    pub(super) fn backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        // The activation's branch is recomputed from x (same f32 formula as forward, so the
        // same sign), which unlike the result also works for a negative slope.
        let c = w.elem_count();
        let params = Tensor::cat(&[w, b], 0)?;
        let grad = GroupNormLeakyReluGrad {
            groups: self.groups,
            eps: self.eps,
            slope: self.slope,
            params: Mutex::new(None),
        };
        let out = x.apply_op3_no_bwd(&dy.contiguous()?, &params, &grad)?;
        let slot = grad
            .params
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned".into()))?;
        if let Some((dw, db)) = slot.as_ref() {
            let dev = w.device();
            let dw = Tensor::from_slice(dw, c, dev)?;
            let db = Tensor::from_slice(db, c, dev)?;
            return Ok((out, dw, db));
        }
        // CUDA: the flat [dx | dw | db].
        let n = x.elem_count();
        let dx = out.narrow(0, 0, n)?.reshape(x.shape())?;
        Ok((dx, out.narrow(0, n, c)?, out.narrow(0, n + c, c)?))
    }

    /// Slab `i`'s parameters.
    fn slab<'a>(&self, g: &NormGeom, i: usize, w: &'a [f32], b: &'a [f32]) -> Slab<'a> {
        Slab::of(g, i, (w, b), self.eps, self.slope)
    }
}

impl CustomOp3 for GroupNormLeakyRelu {
    fn name(&self) -> &'static str {
        "group-norm-leaky-relu"
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
        let what = "group_norm_leaky_relu";
        let (w, b) = (contiguous_f32(s2, l2, what)?, contiguous_f32(s3, l3, what)?);
        let numel = l1.shape().elem_count();
        let y = self.forward_cpu(Stored::of(s1, l1, numel, what)?, l1.dims(), w, b)?;
        Ok((y, Shape::from(l1.dims())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{launch, view, with_element};
        use candle_core::backend::BackendStorage;
        let what = "group_norm_leaky_relu";
        let g = NormGeom::new(l1.dims(), l2.dims(), l3.dims(), self.groups)?;
        let dev = &s1.device;
        let y = with_element!(s1.dtype(), what, T => {
            let (x, w, b) = (
                view::<T>(s1, l1, what)?,
                view::<T>(s2, l2, what)?,
                view::<T>(s3, l3, what)?,
            );
            let y = launch::norm_forward(dev, &x, &w, &b, g.sizes(), self.eps, self.slope)?;
            candle_core::CudaStorage::wrap_cuda_slice(y, dev.clone())
        });
        Ok((y, Shape::from(l1.dims())))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = self.backward(x, w, b, dy)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

impl CustomOp3 for GroupNormLeakyReluGrad {
    fn name(&self) -> &'static str {
        "group-norm-leaky-relu-grad"
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
        let what = "group_norm_leaky_relu backward";
        let c = l1.dims().get(1).copied().unwrap_or(0);
        let g = NormGeom::new(l1.dims(), &[c], &[c], self.groups)?;
        if l2.dims() != l1.dims() || l3.dims() != [2 * c] {
            bail!(
                "{what}: dy {:?} / params {:?} do not match x",
                l2.dims(),
                l3.dims()
            );
        }
        let (cg, n) = (g.channels_per_group(), g.numel());
        let x = Stored::of(s1, l1, n, what)?;
        let dy = Stored::of(s2, l2, n, what)?;
        if x.is_bf16() != dy.is_bf16() {
            bail!("{what}: x and dy must have one type");
        }
        let (w, b) = contiguous_f32(s3, l3, what)?.split_at(c);
        // Per (sample, channel) partial sums of dz and dz * xhat: the bias and weight gradients.
        let mut partials = vec![(0f64, 0f64); g.batch * c];
        let dx = match (x, dy) {
            (Stored::F32(x), Stored::F32(dy)) => {
                let mut dx = vec![0f32; n];
                if n > 0 {
                    dx.par_chunks_mut(g.slab())
                        .zip(x.par_chunks(g.slab()).zip(dy.par_chunks(g.slab())))
                        .zip(partials.par_chunks_mut(cg))
                        .enumerate()
                        .for_each(|(i, ((dxs, (xs, dys)), part))| {
                            let slab = Slab::of(&g, i, (w, b), self.eps, self.slope);
                            wide::gradient(&slab, (xs, dys), dxs, part)
                        });
                }
                CpuStorage::F32(dx)
            }
            // bf16: x and dy widened a chunk at a time, the gradient computed as f32, rounded
            // once.
            (Stored::Bf16(x), Stored::Bf16(dy)) => {
                let mut dx = vec![bf16::ZERO; n];
                if n > 0 {
                    dx.par_chunks_mut(g.slab())
                        .zip(x.par_chunks(g.slab()).zip(dy.par_chunks(g.slab())))
                        .zip(partials.par_chunks_mut(cg))
                        .enumerate()
                        .for_each(|(i, ((dxs, (xs, dys)), part))| {
                            let slab = Slab::of(&g, i, (w, b), self.eps, self.slope);
                            wide::gradient_bf16(&slab, (xs, dys), dxs, part)
                        });
                }
                CpuStorage::BF16(dx)
            }
            _ => bail!("{what}: x and dy must have one type"),
        };
        // Parameter gradients: sum the per-sample partials in sample order (deterministic).
        let (mut dw, mut db) = (vec![0f32; c], vec![0f32; c]);
        for ch in 0..c {
            let (mut sb, mut sw) = (0f64, 0f64);
            for s in 0..g.batch {
                let (pb, pw) = partials[s * c + ch];
                sb += pb;
                sw += pw;
            }
            dw[ch] = sw as f32;
            db[ch] = sb as f32;
        }
        *self
            .params
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned".into()))? = Some((dw, db));
        Ok((dx, Shape::from(l1.dims())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{launch, view, with_element};
        use candle_core::backend::BackendStorage;
        let what = "group_norm_leaky_relu backward";
        let c = l1.dims().get(1).copied().unwrap_or(0);
        let g = NormGeom::new(l1.dims(), &[c], &[c], self.groups)?;
        if l2.dims() != l1.dims() || l3.dims() != [2 * c] {
            bail!(
                "{what}: dy {:?} / params {:?} do not match x",
                l2.dims(),
                l3.dims()
            );
        }
        let dev = &s1.device;
        let out = with_element!(s1.dtype(), what, T => {
            let (x, dy) = (view::<T>(s1, l1, what)?, view::<T>(s2, l2, what)?);
            let params = view::<T>(s3, l3, what)?;
            let (w, b) = (params.slice(0..c), params.slice(c..2 * c));
            let sizes = g.sizes();
            let out = launch::norm_backward(dev, &x, &dy, &w, &b, sizes, self.eps, self.slope)?;
            candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
        });
        Ok((out, Shape::from(vec![g.numel() + 2 * c])))
    }
}

/// `y = LeakyReLU(slope)((x - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c])`, statistics
/// over each (sample, group of channels) across the group's channels and all voxels (biased
/// variance, as PyTorch GroupNorm / InstanceNorm). x: (N, C, D, H, W) f32 contiguous or not;
/// weight, bias: (C,). groups == C is InstanceNorm. slope 0.01 in the U-Net; slope 1.0 means
/// no activation.
pub fn group_norm_leaky_relu(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f64,
    slope: f64,
) -> Result<Tensor> {
    let bf16_activations = super::stored::cpu_bf16_with_f32(x, &[weight, bias]);
    if !bf16_activations
        && !super::native(&[x, weight, bias])
        && super::widened_bf16(&[x, weight, bias])
    {
        return super::in_f32(&[x, weight, bias], |t| {
            group_norm_leaky_relu(&t[0], &t[1], &t[2], groups, eps, slope)
        });
    }
    if !bf16_activations && !super::native(&[x, weight, bias]) {
        return group_norm_leaky_relu_generic(x, weight, bias, groups, eps, slope);
    }
    NormGeom::new(x.dims(), weight.dims(), bias.dims(), groups)?;
    let op = GroupNormLeakyRelu {
        groups,
        eps,
        slope: slope as f32,
    };
    x.contiguous()?
        .apply_op3(&weight.contiguous()?, &bias.contiguous()?, op)
}

/// [`group_norm_leaky_relu`] for a pass that records no graph, consuming `x`: on the CPU in f32
/// the result is written over `x`'s own storage (each slab's statistics are taken before it is
/// overwritten), elsewhere, or when an argument is tracked for gradients, it is the same as
/// [`group_norm_leaky_relu`]. The values are the same bit for bit. `x` must not be shared:
/// callers pass the fresh output of the previous op.
pub fn group_norm_leaky_relu_owned(
    x: Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f64,
    slope: f64,
) -> Result<Tensor> {
    let ts = [&x, weight, bias];
    let in_place = ts
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && !t.track_op())
        && x.is_contiguous();
    if !in_place {
        return group_norm_leaky_relu(&x, weight, bias, groups, eps, slope);
    }
    NormGeom::new(x.dims(), weight.dims(), bias.dims(), groups)?;
    let op = GroupNormLeakyReluInPlace(GroupNormLeakyRelu {
        groups,
        eps,
        slope: slope as f32,
    });
    x.inplace_op3(&weight.contiguous()?, &bias.contiguous()?, &op)?;
    Ok(x)
}

/// The forward op writing over its input.
struct GroupNormLeakyReluInPlace(GroupNormLeakyRelu);

impl InplaceOp3 for GroupNormLeakyReluInPlace {
    fn name(&self) -> &'static str {
        "group-norm-leaky-relu-in-place"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let what = "group_norm_leaky_relu_owned";
        let g = NormGeom::new(l1.dims(), l2.dims(), l3.dims(), self.0.groups)?;
        let (w, b) = (contiguous_f32(s2, l2, what)?, contiguous_f32(s3, l3, what)?);
        let data = contiguous_f32_mut(s1, l1, what)?;
        if g.numel() > 0 {
            data.par_chunks_mut(g.slab())
                .enumerate()
                .for_each(|(i, s)| wide::normalize_in_place(&self.0.slab(&g, i, w, b), s));
        }
        Ok(())
    }
}

/// The same function composed from candle's built-in ops (any device): candle_nn's GroupNorm,
/// then LeakyReLU as max(z, 0) + slope * min(z, 0).
pub fn group_norm_leaky_relu_generic(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f64,
    slope: f64,
) -> Result<Tensor> {
    let g = NormGeom::new(x.dims(), weight.dims(), bias.dims(), groups)?;
    let norm = GroupNorm::new(weight.clone(), bias.clone(), g.channels, groups, eps)?;
    let z = candle_core::Module::forward(&norm, x)?;
    if slope == 1.0 {
        return Ok(z);
    }
    let zeros = z.zeros_like()?;
    z.maximum(&zeros)? + (z.minimum(&zeros)? * slope)?
}
